"""RocketMQ access keys: each user's plain secret key, which RocketMQ's plain-ACL signature needs.

This store is separate from the SCRAM users (mqk.broker.security.users) on purpose: SCRAM keeps only salted
credentials, but a RocketMQ signature is an HMAC keyed with the secret itself, so verifying one needs the secret in
plain form. Only RocketMQ clients use it; a user with only a SCRAM credential cannot sign RocketMQ requests, and an
access key's secret is not a Kafka password. An access key NAME acts as the principal `User:NAME`, so the same ACLs
apply to both protocols.

Where they live: `<data-dir>/security/rocketmq-access-keys.json` ({"access_keys": {NAME: {"secret": SECRET}}}),
written atomically, mode 0600 in a directory only the broker's OS user may enter. `mqk users add-rocketmq` and
friends edit that file (mqk.cli_admin); a running broker reads it again when it changes (a lookup of an unknown key
checks at once, so a key added just now works on its first request; other changes show within RELOAD_INTERVAL_S).
A memory-store broker reads the same file under its data directory.

In cluster mode the keys are the cluster's, as SCRAM users, ACLs and quotas are: one etcd key per access key
(`rocketmq-keys/<quoted name>`, {"secret": SECRET}), followed through every broker's view of the cluster, so a key
added once (`mqk users add-rocketmq NAME --cluster etcd://...`) signs requests to any broker. A cluster broker's own
file is then not used (a start with keys in it says so in the log).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from mqk import errors as E
from mqk.broker.security.users import write_private
from mqk.store.fsutil import read_json

if TYPE_CHECKING:
    from mqk.broker.cluster import ClusterMember

log = logging.getLogger("mqk.security")

FILE = "rocketmq-access-keys.json"
RELOAD_INTERVAL_S = 1.0


def access_keys_path(data_dir: Path) -> Path:
    return data_dir / "security" / FILE


def read_access_keys(path: Path) -> dict[str, str]:
    """Access key -> secret from the file (empty when there is none); Corrupt if it is not what mqk writes."""
    doc = read_json(path)
    if doc is None:
        return {}
    keys = doc.get("access_keys") if isinstance(doc, dict) else None
    if not isinstance(keys, dict):
        raise E.Corrupt(f"{path}: no access_keys object")
    out: dict[str, str] = {}
    for name, entry in keys.items():
        secret = entry.get("secret") if isinstance(entry, dict) else None
        if not isinstance(secret, str) or not secret:
            raise E.Corrupt(f"{path}: access key {name!r} has no secret")
        out[str(name)] = secret
    return out


def write_access_keys(path: Path, keys: dict[str, str]) -> None:
    doc: dict[str, Any] = {"access_keys": {name: {"secret": keys[name]} for name in sorted(keys)}}
    write_private(path, doc)


def cluster_key_tail(name: str) -> str:
    """An access key's key under the cluster's `rocketmq-keys/` prefix: its name percent-encoded (any name is one
    key)."""
    return quote(name, safe="")


def encode_cluster_value(secret: str) -> bytes:
    return json.dumps({"secret": secret}).encode()


def decode_cluster_keys(values: dict[str, bytes]) -> dict[str, str]:
    """Access key -> secret from the cluster's `rocketmq-keys/` values (by tail); a value mqk did not write is
    logged and skipped."""
    out: dict[str, str] = {}
    for tail, value in values.items():
        try:
            secret = json.loads(value)["secret"]
        except (ValueError, KeyError, TypeError) as exc:
            log.error("rocketmq access keys: cluster key %s skipped: %s", tail, exc)
            continue
        if not isinstance(secret, str) or not secret:
            log.error("rocketmq access keys: cluster key %s skipped: no secret", tail)
            continue
        out[unquote(tail)] = secret
    return out


class AccessKeys:
    def __init__(self, data_dir: Path | None) -> None:
        self._path = None if data_dir is None else access_keys_path(data_dir)
        self._keys: dict[str, str] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._checked = 0.0
        #: cluster mode: the membership whose etcd keys hold the access keys (`attach_cluster`), and the generation
        #: of its table last read
        self._cluster: ClusterMember | None = None
        self._seen: tuple[object, int] | None = None

    def attach_cluster(self, cluster: ClusterMember) -> None:
        """Cluster mode: the access keys are the cluster's (in etcd) from now on, read from the view's table."""
        if self._keys:
            log.warning(
                "rocketmq access keys: the %d kept in %s are not the cluster's and are not used "
                "(add them with `mqk users add-rocketmq NAME --cluster etcd://...`)",
                len(self._keys),
                self._path,
            )
        self._cluster = cluster
        self._keys = {}
        self._follow_cluster()

    def _follow_cluster(self) -> None:
        assert self._cluster is not None
        table = self._cluster.table(self._cluster.keys.rocketmq_keys)
        seen = table.generation()
        if seen != self._seen:
            self._seen = seen
            self._keys = decode_cluster_keys(table.values)

    def load(self) -> None:
        """Read the file now; Corrupt if it cannot be trusted (at start-up: the broker does not start)."""
        if self._path is None:
            return
        stamp = self._file_stamp()
        self._keys = read_access_keys(self._path)
        self._stamp = stamp
        self._checked = time.monotonic()
        if self._keys:
            log.info("rocketmq access keys: %d loaded from %s", len(self._keys), self._path)

    def secret(self, access_key: str) -> str | None:
        """The secret of `access_key`, or None for an unknown key."""
        if self._cluster is not None:
            self._follow_cluster()
            return self._keys.get(access_key)
        now = time.monotonic()
        secret = self._keys.get(access_key)
        if secret is None or now - self._checked >= RELOAD_INTERVAL_S:
            self._checked = now
            self._reload_if_changed()
            secret = self._keys.get(access_key)
        return secret

    def set(self, access_key: str, secret: str) -> None:
        """Add or replace a key (tests and embedded brokers; the CLI edits the file)."""
        keys = dict(self._keys)
        keys[access_key] = secret
        self._store(keys)

    def delete(self, access_key: str) -> None:
        keys = dict(self._keys)
        keys.pop(access_key, None)
        self._store(keys)

    def names(self) -> list[str]:
        if self._cluster is not None:
            self._follow_cluster()
        return sorted(self._keys)

    def _store(self, keys: dict[str, str]) -> None:
        if self._cluster is not None:
            raise RuntimeError("cluster mode: the access keys are the cluster's (mqk users add-rocketmq --cluster)")
        if self._path is not None:
            write_access_keys(self._path, keys)
            self._stamp = self._file_stamp()
        self._keys = keys

    def _file_stamp(self) -> tuple[int, int, int] | None:
        assert self._path is not None
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            return None
        # the inode too: an atomic rewrite is a new file even when it has the old one's size and time stamp
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _reload_if_changed(self) -> None:
        if self._path is None:
            return
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return
        try:
            keys = read_access_keys(self._path)
        except (E.Corrupt, OSError) as exc:  # keep serving with the keys last read; say why the new ones are not
            log.error("rocketmq access keys: %s not reloaded: %s", self._path, exc)
            self._stamp = stamp
            return
        self._keys = keys
        self._stamp = stamp
        log.info("rocketmq access keys: %d reloaded from %s", len(keys), self._path)
