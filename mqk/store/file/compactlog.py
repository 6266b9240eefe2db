"""The compaction log of one compacted shard of the file engine (RocketMQ 5 keeps compacted topics in their own log).

The CommitLog is shared by every topic, so a compacted topic's cleaned data cannot be rewritten in place without
copying other topics' bytes. Instead each compacted shard owns `compaction/<topic>/<queue>/`:

    MANIFEST            {"gen": N, "upto": U}: the live generation and the offset below which it answers
    <N 20 digits>.log   entries: store_ts i64 | tags_code i64 | size i32 | the record batch v2 (base offset set)

Below `upto` the engine serves the shard from here (`read`, `read_by_tags`, `offset_for_timestamp`); from `upto` on
it serves the ConsumeQueue as before. The ConsumeQueue units below `upto` are dead: reclaim counts a shard's first
live unit from max(log start, upto), so the CommitLog segments they pointed at can go.

Crash safety: a rewrite writes generation N+1 completely and fsyncs it, then replaces MANIFEST atomically
(write-then-rename + fsync), then removes generation N. `load` trusts only MANIFEST and deletes every other
generation file, so a restart finds the old files or the new ones, never a mix. A MANIFEST naming a missing or
damaged generation is an error for the operator (logged), and the shard is then served from its ConsumeQueue.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import mmap
import os
import struct
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from mqk._fast import load
from mqk.errors import Corrupt, InvalidRecord
from mqk.store.adapter import ReadResult, StoredBatch
from mqk.store.batches import first_record_at_or_after
from mqk.store.fsutil import atomic_write_json, fsync_dir, read_json

recbatch = load("recbatch")
log = logging.getLogger(__name__)

ENTRY = struct.Struct(">qqi")  # store ts, tags code, batch size
MANIFEST = "MANIFEST"


def _gen_name(gen: int) -> str:
    return f"{gen:020d}.log"


class CompactLog:
    """The live generation of one shard's compacted prefix, mapped read-only, with its batch index in memory."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.gen = -1
        self.upto = 0  #: offsets below this are answered from here
        self._mm: mmap.mmap | None = None
        self._buf: memoryview | None = None
        self.bases: list[int] = []
        self.spans: list[int] = []
        self.positions: list[int] = []
        self.sizes: list[int] = []
        self.store_ts: list[int] = []
        self.tags: list[int] = []
        self.max_ts: list[int] = []  #: each batch's own max timestamp
        self.running: list[int] = []  #: running max timestamp (monotone: bisect for time lookups)

    # --- loading --------------------------------------------------------------------------------------

    @classmethod
    def open(cls, directory: Path) -> CompactLog | None:
        """The compacted prefix under `directory`, or None if the shard was never compacted."""
        directory = Path(directory)
        try:
            doc = read_json(directory / MANIFEST)
        except Corrupt as exc:
            log.error("%s: %s; serving the shard from its ConsumeQueue", directory, exc)
            return None
        if doc is None:
            return None
        clog = cls(directory)
        try:
            clog._map(int(doc["gen"]), int(doc["upto"]))
        except (KeyError, TypeError, ValueError, OSError, Corrupt) as exc:
            log.error(
                "%s: compaction generation unusable (%s); serving the shard from its ConsumeQueue", directory, exc
            )
            clog.close()
            return None
        for p in directory.iterdir():  # leftovers of a rewrite that crashed before or after its MANIFEST switch
            if (p.name.endswith(".log") and p.name != _gen_name(clog.gen)) or (
                p.name.startswith(".") and p.name.endswith(".tmp")
            ):
                p.unlink(missing_ok=True)
        return clog

    def _map(self, gen: int, upto: int) -> None:
        path = self.dir / _gen_name(gen)
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else None
        finally:
            os.close(fd)
        buf = memoryview(mm) if mm is not None else memoryview(b"")
        fields = ("bases", "spans", "positions", "sizes", "store_ts", "tags", "max_ts", "running")
        index: dict[str, list[int]] = {k: [] for k in fields}
        pos = 0
        running = -(1 << 63)
        while pos < len(buf):
            if pos + ENTRY.size > len(buf):
                raise Corrupt(f"{path.name}: truncated entry header", pos)
            store_ts, tags, n = ENTRY.unpack_from(buf, pos)
            body = pos + ENTRY.size
            if n < recbatch.HEADER_SIZE or body + n > len(buf):
                raise Corrupt(f"{path.name}: entry of {n} bytes does not fit", pos)
            header = recbatch.parse_header(buf, body)
            running = max(running, header[8])
            for key, value in (
                ("bases", header[0]),
                ("spans", header[6] + 1),
                ("positions", body),
                ("sizes", n),
                ("store_ts", store_ts),
                ("tags", tags),
                ("max_ts", header[8]),
                ("running", running),
            ):
                index[key].append(value)
            pos = body + n
        self._release()
        self._mm, self._buf, self.gen, self.upto = mm, buf, gen, upto
        for key, values in index.items():
            setattr(self, key, values)

    # --- reading --------------------------------------------------------------------------------------

    def _batch(self, i: int) -> StoredBatch:
        assert self._buf is not None
        pos, n = self.positions[i], self.sizes[i]
        return StoredBatch(
            self.bases[i], self.spans[i], self._buf[pos : pos + n], self.store_ts[i], self.max_ts[i], self.tags[i], -1
        )

    def index_of(self, offset: int) -> int:
        """Index of the batch holding `offset`, or of the next one after a gap."""
        i = bisect.bisect_right(self.bases, offset) - 1
        if i < 0:
            return 0
        return i if self.bases[i] + self.spans[i] > offset else i + 1

    def read(
        self, offset: int, max_bytes: int, tags: set[int] | None = None, max_batches: int = 1 << 30
    ) -> list[StoredBatch]:
        out: list[StoredBatch] = []
        total = 0
        for i in range(self.index_of(offset), len(self.bases)):
            if tags is not None and self.tags[i] not in tags:
                continue
            if out and total + self.sizes[i] > max_bytes:
                break
            out.append(self._batch(i))
            total += self.sizes[i]
            if total >= max_bytes or len(out) >= max_batches:
                break
        return out

    def offset_for_timestamp(self, timestamp: int, log_start: int) -> tuple[int, int] | None:
        first = max(bisect.bisect_left(self.running, timestamp), self.index_of(log_start))
        for i in range(first, len(self.bases)):
            if self.max_ts[i] >= timestamp:
                found = first_record_at_or_after(self._batch(i).data, timestamp, log_start)
                if found is not None:
                    return found
        return None

    # --- rewriting ------------------------------------------------------------------------------------

    def plan(
        self, start: int, end: int, batches: Sequence[Any], old: dict[int, tuple[int, int, int]]
    ) -> list[tuple[int, int, Any]]:
        """The entries of the next generation: this one's below `start` and from `end` on, `batches` between.
        `old` maps each replaced batch's base offset to (span, store ts, tags code)."""
        entries: list[tuple[int, int, Any]] = []
        for i in range(len(self.bases)):
            if self.bases[i] < start:
                entries.append((self.store_ts[i], self.tags[i], self._batch(i).data))
        for data in batches:
            header = recbatch.parse_header(data, 0)
            prev = old.get(header[0])
            if prev is None or prev[0] != header[6] + 1:
                raise InvalidRecord(
                    f"replacement batch at {header[0]} does not match a stored batch in [{start}, {end}) of {self.dir}"
                )
            entries.append((prev[1], prev[2], data))
        for i in range(len(self.bases)):
            if self.bases[i] >= end:
                entries.append((self.store_ts[i], self.tags[i], self._batch(i).data))
        return entries

    def write_next(self, entries: Iterable[tuple[int, int, Any]], upto: int) -> int:
        """Blocking: write the next generation and switch MANIFEST to it. Returns its number."""
        self.dir.mkdir(parents=True, exist_ok=True)
        gen = self.gen + 1
        path = self.dir / _gen_name(gen)
        with open(path, "wb") as f:
            for store_ts, tags, data in entries:
                f.write(ENTRY.pack(store_ts, tags, len(data)))
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.dir)
        atomic_write_json(self.dir / MANIFEST, {"gen": gen, "upto": upto})
        return gen

    def switch(self, gen: int, upto: int) -> None:
        """Map the generation just written and drop the old one (readers holding views keep its mapping)."""
        old = self.gen
        self._map(gen, upto)
        if old >= 0:
            (self.dir / _gen_name(old)).unlink(missing_ok=True)

    # --- life cycle -----------------------------------------------------------------------------------

    def _release(self) -> None:
        if self._buf is not None:
            with contextlib.suppress(BufferError):
                self._buf.release()
        if self._mm is not None:
            # views handed to readers keep the old mapping alive until they are dropped
            with contextlib.suppress(BufferError):
                self._mm.close()
        self._mm = self._buf = None

    def close(self) -> None:
        self._release()


def shard_dir(root: Path, topic: str, queue: int) -> Path:
    return Path(root) / "compaction" / topic / str(queue)


def open_compacted(root: Path, shards: Iterable[tuple[str, int]]) -> dict[tuple[str, int], CompactLog]:
    """Blocking, at engine start: the compacted prefixes of the shards that have one."""
    out: dict[tuple[str, int], CompactLog] = {}
    if not (Path(root) / "compaction").is_dir():
        return out
    for topic, queue in shards:
        directory = shard_dir(root, topic, queue)
        if directory.is_dir():
            clog = CompactLog.open(directory)
            if clog is not None:
                out[(topic, queue)] = clog
    return out


async def replace_range(
    compacted: dict[tuple[str, int], CompactLog],
    root: Path,
    shard: Any,
    read: Callable[[str, int, int, int], Awaitable[ReadResult]],
    start: int,
    end: int,
    batches: Sequence[Any],
) -> None:
    """FileEngine.replace_range: write `shard`'s next compacted generation (this one's batches outside [start, end),
    `batches` inside it), then serve below max(end, old upto) from it (`compacted` is the engine's map of compacted
    prefixes, `read` its read)."""
    key = (shard.topic, shard.queue)
    clog = compacted.get(key) or CompactLog(shard_dir(root, shard.topic, shard.queue))
    old: dict[int, tuple[int, int, int]] = {}
    offset = max(start, shard.log_start)
    while offset < end:
        result = await read(shard.topic, shard.queue, offset, 1 << 20)
        if not result.batches:
            break
        for batch in result.batches:
            if batch.base_offset >= end:
                break
            old[batch.base_offset] = (batch.record_count, batch.store_timestamp, batch.tags_code)
        offset = result.batches[-1].next_offset
    # batches wholly below the log start (retention, DeleteRecords) are not carried into the next generation
    log_start = shard.log_start
    entries = [e for e in clog.plan(start, end, batches, old) if _next_offset(e[2]) > log_start]
    upto = max(end, clog.upto)
    gen = await asyncio.to_thread(clog.write_next, entries, upto)
    clog.switch(gen, upto)
    compacted[key] = clog


def _next_offset(data: Any) -> int:
    header = recbatch.parse_header(data, 0)
    return header[0] + header[6] + 1


__all__ = ["CompactLog", "open_compacted", "replace_range", "shard_dir"]
