"""The broker's users: each user's SCRAM credentials (one per mechanism), the one store every SASL mechanism and
every front door checks passwords against.

Only what SCRAM needs is kept: salt, iteration count, StoredKey and ServerKey (mqk.broker.security.scram); never a
password, nor the salted password a client sends to set one. A user is one JSON object:

    {"SCRAM-SHA-256": {"salt": B64, "stored_key": B64, "server_key": B64, "iterations": N}, "SCRAM-SHA-512": {...}}

Where they live:
- a broker on its own: `<data-dir>/security/scram-credentials.json` ({"users": {NAME: user}}), replaced atomically
  after every change, in a directory only the broker's OS user may enter; a memory-store broker keeps them in memory
  (nothing of it survives a restart, its topics neither);
- cluster mode: `/mqk/<cluster-id>/users/<name>` in etcd, one key per user (mqk.broker.cluster), so every broker of
  the cluster sees the same users: reads come from the broker's cached view (kept current by its watch), a change is a
  compare-and-set on the user's key and returns once this broker's view shows it. A broker's local file is not read
  in cluster mode.

A lookup never waits: it reads memory (a cluster user's value is decoded once per revision).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqk import errors as E
from mqk.broker.security.scram import MECHANISMS, ScramCredential, ScramMechanism
from mqk.store.fsutil import atomic_write_json, read_json
from mqk.store.manager import StoreManager

# typing only: cluster mode's modules (etcd client, controller, replication) load with --cluster alone (start-up)
if TYPE_CHECKING:
    from mqk.broker.cluster import ClusterMember

log = logging.getLogger("mqk.security")

FILE = "scram-credentials.json"
#: a user's credentials: mechanism name -> credential
UserCredentials = dict[str, ScramCredential]
#: (mechanism, the new credential or None to delete it)
Change = tuple[ScramMechanism, ScramCredential | None]


def encode_user(credentials: Mapping[str, ScramCredential]) -> dict[str, Any]:
    return {
        name: {
            "salt": base64.b64encode(c.salt).decode(),
            "stored_key": base64.b64encode(c.stored_key).decode(),
            "server_key": base64.b64encode(c.server_key).decode(),
            "iterations": c.iterations,
        }
        for name, c in sorted(credentials.items())
    }


def decode_user(doc: Any, what: str) -> UserCredentials:
    """A user's credentials from its JSON object; Corrupt if it is not what mqk writes."""
    if not isinstance(doc, dict):
        raise E.Corrupt(f"{what}: not a JSON object")
    out: UserCredentials = {}
    for name, fields in doc.items():
        mechanism = MECHANISMS.get(name)
        if mechanism is None or not isinstance(fields, dict):
            raise E.Corrupt(f"{what}: unknown mechanism {name!r}")
        try:
            salt, stored, server = (
                base64.b64decode(fields[k], validate=True) for k in ("salt", "stored_key", "server_key")
            )
            iterations = fields["iterations"]
        except (KeyError, TypeError, binascii.Error, ValueError):
            raise E.Corrupt(f"{what}: {name} credential is incomplete") from None
        if not isinstance(iterations, int) or len(stored) != mechanism.digest_size or len(server) != len(stored):
            raise E.Corrupt(f"{what}: {name} credential is malformed")
        out[name] = ScramCredential(salt, stored, server, iterations)
    return out


def apply_changes(user: str, current: Mapping[str, ScramCredential], changes: Iterable[Change]) -> UserCredentials:
    """The user's credentials after `changes`; ResourceNotFoundError for deleting one the user does not have."""
    out = dict(current)
    for mechanism, credential in changes:
        if credential is not None:
            out[mechanism.name] = credential
        elif out.pop(mechanism.name, None) is None:
            raise E.ResourceNotFoundError(f"user {user!r} has no {mechanism.name} credential to delete")
    return out


class Users:
    def __init__(self, store: StoreManager) -> None:
        self._path: Path | None = store.config.data_dir / "security" / FILE if store.persistent else None
        self._local: dict[str, UserCredentials] = {}
        self._cluster: ClusterMember | None = None
        #: cluster mode: name -> (the revision decoded, its credentials)
        self._decoded: dict[str, tuple[int, UserCredentials]] = {}
        self._write_lock = asyncio.Lock()

    def load(self) -> None:
        """Read the local file (a broker on its own); Corrupt if it cannot be trusted."""
        if self._path is None:
            return
        doc = read_json(self._path)
        if doc is None:
            return
        users = doc.get("users") if isinstance(doc, dict) else None
        if not isinstance(users, dict):
            raise E.Corrupt(f"{self._path}: no users object")
        self._local = {name: decode_user(creds, f"{self._path}: user {name!r}") for name, creds in users.items()}
        log.info("users: %d loaded from %s", len(self._local), self._path)

    def attach_cluster(self, cluster: ClusterMember) -> None:
        """Cluster mode: the users are the cluster's (in etcd) from now on."""
        self._cluster = cluster

    # --- reading ----------------------------------------------------------------------------------------

    def get(self, user: str) -> UserCredentials:
        """The user's credentials by mechanism name (empty for an unknown user)."""
        cluster = self._cluster
        if cluster is None:
            return self._local.get(user, {})
        entry = cluster.users().get(user)
        if entry is None:
            return {}
        revision, value = entry
        cached = self._decoded.get(user)
        if cached is not None and cached[0] == revision:
            return cached[1]
        try:
            credentials = decode_user(json.loads(value), f"cluster user {user!r}")
        except (E.Corrupt, ValueError) as exc:
            log.error("users: %s skipped: %s", user, exc)
            credentials = {}
        self._decoded[user] = (revision, credentials)
        return credentials

    def credential(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return self.get(user).get(mechanism.name)

    def names(self) -> list[str]:
        cluster = self._cluster
        return sorted(cluster.users() if cluster is not None else self._local)

    # --- changing ---------------------------------------------------------------------------------------

    async def alter(self, user: str, changes: list[Change]) -> None:
        """Apply one user's changes together (all or none). ResourceNotFoundError for deleting a credential the user
        does not have; MetaUnavailable / RequestTimedOutError in cluster mode when etcd cannot take it now."""
        if self._cluster is not None:
            await self._alter_cluster(self._cluster, user, changes)
            return
        async with self._write_lock:
            updated = apply_changes(user, self._local.get(user, {}), changes)
            users = dict(self._local)
            if updated:
                users[user] = updated
            else:
                users.pop(user, None)
            if self._path is not None:
                doc = {"users": {name: encode_user(creds) for name, creds in sorted(users.items())}}
                await asyncio.to_thread(write_private, self._path, doc)
            self._local = users

    async def _alter_cluster(self, cluster: ClusterMember, user: str, changes: list[Change]) -> None:
        for _attempt in range(16):
            revision, _value = cluster.users().get(user, (0, b""))
            current = self.get(user) if revision else {}
            updated = apply_changes(user, current, changes)
            if not updated and not revision:
                return  # nothing to store, nothing stored
            payload = json.dumps(encode_user(updated), sort_keys=True).encode() if updated else None
            if await cluster.write_user(user, payload, revision):
                return
            # another broker changed the user meanwhile: wait for the view to show it, then apply to that
            await cluster.view.wait_until(_user_moved(user, revision), 1.0)
        raise E.RequestTimedOutError(f"user {user!r} kept changing under this request; try again")


def _user_moved(user: str, revision: int) -> Callable[[Any], bool]:
    """A view condition: user `user`'s key is no longer at `revision`."""
    return lambda state: state.users.get(user, (0, b""))[0] != revision


def write_private(path: Path, doc: Any) -> None:
    """Write the credentials file in a directory only this OS user may enter (they are password equivalents for an
    offline guess), then the file itself private too."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    atomic_write_json(path, doc)
    os.chmod(path, 0o600)
