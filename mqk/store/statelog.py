"""Small JSON state documents of the broker's services, kept in one of two places behind one face (`StateDocs`):

- `SideStateDocs(store)`: the store's side files (`StoreManager.load_state` / `save_state`: atomic + fsync). What a
  broker on its own uses;
- `LogStateDocs(store, topic)`: the records of an internal, compacted, one-queue topic of the log: a save appends
  one record (key = the document's name, value = its JSON) and a load answers the last record of that name. What a
  cluster broker uses, so a replica that becomes master finds the document its master last saved in the log it
  replicated (side files are the replica's own, stale or empty). Compaction keeps the last record per name.
  A service with many documents (the Kafka transaction coordinator: one per transactional id) saves several in one
  batch (`save_many`: they land together or not at all; None forgets a name with a tombstone) and reads every
  document back at start (`load_all`).

Why no fsync or replication wait per save in the log: the log orders a save with the appends around it, and every
copy of the log (after a crash, on a replica) is a prefix of it. A service that saves its intent before acting on
it (the timer) therefore finds, in any copy, either the intent and whatever of its acts made it, or neither.

Loading reads the last record first (the usual case: one read); only when that is not a document of the name
asked for (another name was saved last, or the record is malformed) does it read the topic from its start, keeping
the last good document and logging each malformed one it skips.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from mqk._fast import load
from mqk.config import TopicConfig
from mqk.errors import Corrupt, ShardExists
from mqk.protocol.kafka.records import batch_records
from mqk.store.adapter import store_time_ms
from mqk.store.manager import StoreManager

recbatch = load("recbatch")
log = logging.getLogger("mqk.state")

#: bytes read per step when a load has to scan the topic
_READ_BYTES = 4 << 20


class StateDocs(Protocol):
    async def load(self, name: str) -> dict[str, Any] | None:
        """The document last saved under `name`, or None."""
        ...

    async def save(self, name: str, doc: dict[str, Any]) -> None:
        """Replace the document `name`; saves of one name land in call order."""
        ...


class SideStateDocs:
    """The store's side files (`data_dir/state/<name>.json`)."""

    def __init__(self, store: StoreManager) -> None:
        self.store = store

    async def load(self, name: str) -> dict[str, Any] | None:
        return self.store.load_state(name)

    async def save(self, name: str, doc: dict[str, Any]) -> None:
        await self.store.save_state(name, doc)


class LogStateDocs:
    """Documents as the records of `topic` (queue 0), created by `prepare` with `cleanup.policy=compact`."""

    def __init__(self, store: StoreManager, topic: str) -> None:
        self.store = store
        self.topic = topic
        #: records skipped by loads because they were no document (for stats and tests)
        self.skipped = 0

    async def prepare(self) -> None:
        """Create the topic if this broker has none (every broker of a group, so replicated records find it)."""
        if self.store.topic(self.topic) is None:
            with contextlib.suppress(ShardExists):
                await self.store.create_topic(self.topic, 1, TopicConfig({"cleanup.policy": "compact"}))

    async def save(self, name: str, doc: dict[str, Any]) -> None:
        await self.save_many({name: doc})

    async def save_many(self, docs: Mapping[str, dict[str, Any] | None]) -> None:
        """Save several documents in one batch (one append: all of them or none); None forgets a name (a
        tombstone, which compaction removes in time)."""
        records = bytearray()
        for i, (name, doc) in enumerate(docs.items()):
            # (json's TypeError comes now, before anything is appended)
            data = None if doc is None else json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
            records += recbatch.encode_record(i, 0, name.encode(), data, [])
        now = store_time_ms()
        batch = recbatch.build_batch(0, now, now, bytes(records), len(docs), len(docs) - 1)
        await self.store.append(self.topic, 0, [batch], delay_headers=False)

    async def load_all(self) -> dict[str, dict[str, Any]]:
        """Every document the topic holds now, by name (a name whose last record is a tombstone is absent)."""
        docs: dict[str, dict[str, Any]] = {}
        if self.store.topic(self.topic) is None:
            return docs
        offset, end = self.store.offset_bounds(self.topic, 0)
        while offset < end:
            result = await self.store.read(self.topic, 0, offset, _READ_BYTES)
            if not result.batches:
                break
            for _offset, key, doc in self._documents(result.batches, quiet=False, tombstones=True):
                name = key.decode(errors="replace")
                if doc is None:
                    docs.pop(name, None)
                else:
                    docs[name] = doc
            offset = result.next_offset
        return docs

    async def load(self, name: str) -> dict[str, Any] | None:
        if self.store.topic(self.topic) is None:
            return None
        start, end = self.store.offset_bounds(self.topic, 0)
        if end <= start:
            return None
        last = await self.store.read(self.topic, 0, end - 1, 1)
        found = self._last_of(name, last.batches, quiet=True)
        if found is not None:
            return found[1]
        doc = None
        offset = start
        while offset < end:
            result = await self.store.read(self.topic, 0, offset, _READ_BYTES)
            if not result.batches:
                break
            found = self._last_of(name, result.batches, quiet=False)
            if found is not None:
                doc = found[1]
            offset = result.next_offset
        return doc

    def _last_of(self, name: str, batches: list[Any], *, quiet: bool) -> tuple[int, dict[str, Any]] | None:
        """(offset, document) of the last good record of `name` in `batches`; malformed ones are logged and
        counted unless `quiet` (the first look at the last record: the scan that follows reports them)."""
        key = name.encode()
        found = None
        for offset, _key, doc in self._documents(batches, quiet=quiet, key=key):
            if doc is not None:
                found = (offset, doc)
        return found

    def _documents(
        self, batches: list[Any], *, quiet: bool, key: bytes | None = None, tombstones: bool = False
    ) -> Iterator[tuple[int, bytes, dict[str, Any] | None]]:
        """(offset, key, document) of the good records of `batches` (those of `key` only, when given), a
        tombstone as None when `tombstones` (else it is malformed, as any record that is not a JSON object:
        logged and counted unless `quiet`)."""
        for batch in batches:
            base = batch.base_offset
            try:
                records = batch_records(batch.data)
            except Corrupt as exc:
                self._skip(quiet, f"batch at offset {base}: {exc}")
                continue
            for _attributes, _ts, delta, record_key, value, _headers in records:
                if record_key is None or (key is not None and record_key != key):
                    continue
                if value is None and tombstones:
                    yield base + delta, bytes(record_key), None
                    continue
                try:
                    doc = json.loads(value) if value is not None else None
                except ValueError as exc:
                    self._skip(quiet, f"record at offset {base + delta}: not JSON ({exc})")
                    continue
                if not isinstance(doc, dict):
                    self._skip(quiet, f"record at offset {base + delta}: not a JSON object")
                    continue
                yield base + delta, bytes(record_key), doc

    def _skip(self, quiet: bool, why: str) -> None:
        if not quiet:
            self.skipped += 1
            log.warning("state: %s in %s skipped", why, self.topic)


__all__ = ["LogStateDocs", "SideStateDocs", "StateDocs"]
