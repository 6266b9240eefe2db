"""Durable committed group offsets for engines that keep them in plain files (the file engine; anything else).

`FileOffsetStore(directory)` keeps every group's committed offsets in a dict (so `fetch_offsets` never touches the
disk) mirrored by two files in `directory`:

- `offsets.journal`: an append-only log of commits and deletes. Record = `u32 payload length | u32 CRC32C(payload) |
  payload`, payload = compact JSON `{"s": seq, "g": group, "c": [[topic, queue, offset, metadata, ts, epoch], ...]}` for
  a commit or `{"s": seq, "g": group, "d": [[topic, queue], ...] | null}` for a delete (null: the whole group).
- `offsets.snapshot`: the whole state as of record `seq`, replaced atomically (fsutil) when the journal has grown past
  its threshold; the journal is then emptied.

Durability and cost: a commit is acknowledged only after its record is written and fdatasync'ed. The write and sync
run in a worker thread, never on the event loop, and every commit that arrives while a sync is in flight rides the
next one (group commit): N concurrent commits cost one fsync. Loading replays the journal over the snapshot, skipping
records the snapshot already holds (`seq`), stops at the first torn or corrupt record (a crash mid-write) and cuts the
journal there so later appends never sit behind garbage.

Not thread-safe: one event loop owns an instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mqk._fast.crc import crc32c
from mqk.errors import Corrupt, StorageError
from mqk.store.adapter import GroupOffset
from mqk.store.fsutil import atomic_write_json, fsync_dir, read_json

log = logging.getLogger(__name__)
_RECORD_HEADER = struct.Struct(">II")
#: a record longer than this is not something we wrote: treat it as a torn/corrupt tail rather than allocating it
MAX_RECORD_BYTES = 64 << 20
SNAPSHOT_NAME = "offsets.snapshot"
JOURNAL_NAME = "offsets.journal"

Partition = tuple[str, int]


class FileOffsetStore:
    def __init__(self, path: Path, *, compact_bytes: int = 4 << 20) -> None:
        self.directory = Path(path)
        self.directory.mkdir(parents=True, exist_ok=True)
        #: the journal is folded into a snapshot once it is larger than this and than the last snapshot
        self.compact_bytes = compact_bytes
        self._groups: dict[str, dict[Partition, GroupOffset]] = {}
        self._seq = 0  # seq of the last record applied to _groups (and written to the journal)
        self._snapshot_bytes = 0
        self._pending: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._closed = False
        self.torn_tail_bytes = 0  #: bytes cut from the journal's tail at load (a crash mid-write), for stats/tests
        self._load()
        self._journal_fd = os.open(self.directory / JOURNAL_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._journal_bytes = os.fstat(self._journal_fd).st_size
        fsync_dir(self.directory)

    # --- the StorageAdapter group-offset methods ------------------------------------------------------------

    async def commit_offsets(self, group: str, offsets: dict[Partition, GroupOffset]) -> None:
        """Store `offsets` for `group`, atomically for the whole call; returns once they are on disk."""
        if not offsets:
            return
        entries = []
        for (topic, queue), value in offsets.items():
            entries.append(
                [
                    str(topic),
                    int(queue),
                    int(value.offset),
                    value.metadata or "",
                    int(value.commit_timestamp),
                    int(value.leader_epoch),
                ]
            )
        await self._submit({"g": str(group), "c": entries})

    def fetch_offsets(self, group: str) -> dict[Partition, GroupOffset]:
        return dict(self._groups.get(group, {}))

    async def delete_offsets(self, group: str, partitions: Iterable[Partition] | None = None) -> None:
        if group not in self._groups:
            return
        listed = None if partitions is None else [[str(t), int(q)] for t, q in partitions]
        await self._submit({"g": str(group), "d": listed})

    def list_offset_groups(self) -> list[str]:
        return sorted(self._groups)

    async def close(self) -> None:
        """Wait for in-flight commits, then close the journal."""
        if self._closed:
            return
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)
        self._closed = True
        os.close(self._journal_fd)

    def close_sync(self) -> None:
        """Close without an event loop (only valid when no commit is in flight, e.g. a read-only inspection)."""
        if self._pending or (self._writer is not None and not self._writer.done()):
            raise StorageError("commits in flight: use `await close()`")
        if not self._closed:
            self._closed = True
            os.close(self._journal_fd)

    # --- writing --------------------------------------------------------------------------------------------

    async def _submit(self, op: dict[str, Any]) -> None:
        if self._closed:
            raise StorageError("offset store is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((op, future))
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write_pending())
        await future

    async def _write_pending(self) -> None:
        """The single writer: drains the queue, one write + one fdatasync per round (group commit)."""
        while self._pending:
            batch, self._pending = self._pending, []
            records = []
            seq = self._seq
            for op, _future in batch:
                seq += 1
                op["s"] = seq
                payload = json.dumps(op, separators=(",", ":")).encode()
                records.append(_RECORD_HEADER.pack(len(payload), crc32c(payload)) + payload)
            data = b"".join(records)
            try:
                await asyncio.to_thread(self._append_and_sync, data)
            except BaseException as exc:
                error = exc if isinstance(exc, StorageError) else StorageError(f"offset journal write failed: {exc}")
                for _op, future in batch:
                    if not future.done():
                        future.set_exception(error)
                if not isinstance(exc, Exception):
                    raise
                continue
            self._journal_bytes += len(data)
            for op, future in batch:
                self._apply(op)
                if not future.done():
                    future.set_result(None)
            if self._journal_bytes > max(self.compact_bytes, self._snapshot_bytes):
                try:
                    await self._compact()
                except OSError as exc:  # the journal still holds everything; compaction retries next round
                    log.warning("offset snapshot in %s failed (%s); keeping the journal", self.directory, exc)

    def _append_and_sync(self, data: bytes) -> None:
        start = self._journal_bytes
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._journal_fd, view) :]
            os.fdatasync(self._journal_fd)
        except BaseException:
            # Never leave a half record in front of the next one: cut back to the last acknowledged byte.
            with contextlib.suppress(OSError):
                os.ftruncate(self._journal_fd, start)
            raise

    async def _compact(self) -> None:
        snapshot = {
            "version": 1,
            "seq": self._seq,
            "groups": {
                group: [[t, q, v.offset, v.metadata, v.commit_timestamp, v.leader_epoch] for (t, q), v in parts.items()]
                for group, parts in self._groups.items()
            },
        }
        self._snapshot_bytes = await asyncio.to_thread(self._write_snapshot_and_reset, snapshot)
        self._journal_bytes = 0

    def _write_snapshot_and_reset(self, snapshot: dict[str, Any]) -> int:
        path = self.directory / SNAPSHOT_NAME
        atomic_write_json(path, snapshot)
        # The snapshot holds every record up to `seq`; a crash before this truncate only means those records are
        # skipped at the next load.
        os.ftruncate(self._journal_fd, 0)
        os.fsync(self._journal_fd)
        return path.stat().st_size

    # --- state ----------------------------------------------------------------------------------------------

    def _apply(self, op: dict[str, Any]) -> None:
        group = op["g"]
        if "c" in op:
            parts = self._groups.setdefault(group, {})
            for topic, queue, offset, metadata, ts, epoch in op["c"]:
                parts[(topic, queue)] = GroupOffset(offset, metadata, ts, epoch)
        else:
            if op["d"] is None:
                self._groups.pop(group, None)
            else:
                parts = self._groups.get(group, {})
                for topic, queue in op["d"]:
                    parts.pop((topic, queue), None)
                if not parts:
                    self._groups.pop(group, None)
        self._seq = op["s"]

    def _load(self) -> None:
        snapshot = read_json(self.directory / SNAPSHOT_NAME)
        if snapshot is not None:
            try:
                self._seq = int(snapshot["seq"])
                for group, entries in snapshot["groups"].items():
                    self._groups[group] = {(t, q): GroupOffset(o, m, ts, e) for t, q, o, m, ts, e in entries}
            except (KeyError, TypeError, ValueError) as exc:
                raise Corrupt(f"{self.directory / SNAPSHOT_NAME}: malformed offsets snapshot ({exc})") from None
            self._snapshot_bytes = (self.directory / SNAPSHOT_NAME).stat().st_size
        journal = self.directory / JOURNAL_NAME
        try:
            raw = journal.read_bytes()
        except FileNotFoundError:
            return
        pos = 0
        while pos + _RECORD_HEADER.size <= len(raw):
            length, crc = _RECORD_HEADER.unpack_from(raw, pos)
            end = pos + _RECORD_HEADER.size + length
            if length > MAX_RECORD_BYTES or end > len(raw):
                break
            payload = raw[pos + _RECORD_HEADER.size : end]
            if crc32c(payload) != crc:
                break
            try:
                op = json.loads(payload)
                if op["s"] > self._seq:
                    self._apply(op)
            except (KeyError, TypeError, ValueError):
                break
            pos = end
        if pos < len(raw):
            self.torn_tail_bytes = len(raw) - pos
            with open(journal, "r+b") as f:
                f.truncate(pos)
                os.fsync(f.fileno())
