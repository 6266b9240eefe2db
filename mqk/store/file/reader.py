"""The file engine's reads: by offset, by tags, by key, by CommitLog address, by timestamp.

Readers look only at published positions (a queue's end offset and its files' write positions, queue_table.py), so
they never see a unit whose entry is not in place. They hand out zero-copy views into the CommitLog mapping. Below
a compacted shard's `upto` the shard's compaction log answers (compactlog.py).

Pages the flusher dropped (FlushService.cache_from) are read back in one reader thread before views of them are
touched: a page fault per page on the event loop would stall every connection on disk reads.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import struct
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from typing import TYPE_CHECKING

from mqk.errors import OffsetOutOfRange, OutOfBounds, UnknownShard
from mqk.store.adapter import ReadResult, StoredBatch
from mqk.store.batches import first_record_at_or_after, max_retained_timestamp
from mqk.store.file.consumequeue import UNIT, ConsumeQueue
from mqk.store.file.index import live_entry

if TYPE_CHECKING:
    from mqk.store.file.commitlog import CommitLog
    from mqk.store.file.compactlog import CompactLog
    from mqk.store.file.flush import FlushService
    from mqk.store.file.index import IndexService
    from mqk.store.file.shards import Shard, ShardRegistry

_I64 = struct.Struct(">q")
#: batches from the one the timestamp search lands on that it reads back off the loop if their pages were dropped
#: (the search reads on past a batch whose own max timestamp is below the target, rarely far)
TIMESTAMP_FAULT_IN_UNITS = 8
#: `read` with a `max_bytes` below this is a lookup of one batch: its dropped pages are read back without read-ahead
POINT_READ_BYTES = 4096
#: units per step of max_timestamp's walk over a whole queue (when the record holding the maximum was deleted):
#: between steps the loop serves others, and each step's dropped entries are read back in the reader thread
MAX_TIMESTAMP_WALK_UNITS = 1024

#: a ConsumeQueue unit as cqunit unpacks it: (phys, size, count, tags, store_ts, running max ts, base offset)
Unit = tuple[int, int, int, int, int, int, int]


def units_from(cq: ConsumeQueue, index: int) -> Iterator[Unit]:
    """Yield unit tuples from `index` to the published end, walking each mapped file directly."""
    unpack = cq._unpack
    files = cq.mfq.files
    at = index * UNIT
    i = bisect.bisect_right(cq.mfq._starts, at) - 1
    if i < 0:
        i, at = 0, files[0].start_offset if files else 0
    while i < len(files):
        mf = files[i]
        pos = at - mf.start_offset
        buf = mf.buf
        wrote = mf.wrote
        while pos + UNIT <= wrote:
            yield unpack(buf, pos)
            pos += UNIT
        i += 1
        if i < len(files):
            at = files[i].start_offset


class LogReader:
    def __init__(
        self,
        clog: CommitLog,
        registry: ShardRegistry,
        index: IndexService,
        compacted: dict[tuple[str, int], CompactLog],
    ) -> None:
        self.clog = clog
        self.registry = registry
        self.index = index
        #: compacted shards' prefixes: reads below their `upto` are served from there
        self.compacted = compacted
        #: set once the engine's flusher runs (it says which pages it dropped)
        self.flusher: FlushService | None = None
        #: one thread reading dropped CommitLog bytes back into the page cache for readers
        self._reader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mqk-fault-in")

    def close(self) -> None:
        self._reader.shutdown(wait=True)

    # --- the page cache --------------------------------------------------------------------------------------

    async def stored(self, shard: Shard, units: list[Unit], ahead: bool = True) -> list[StoredBatch]:
        """The stored batches of ConsumeQueue `units` (in CommitLog order), as views of the CommitLog; read back
        first when the first of them lies where the flusher dropped the page cache (with the kernel asked to read
        on past them unless `ahead` is false). A segment deleted meanwhile (retention) ends the list where its first
        entry would have been."""
        flusher = self.flusher
        if flusher is None or units[0][0] >= flusher.cache_from:  # (no await on the hot path: cached)
            return [self._batch(shard, unit) for unit in units]
        await self._read_back(units, ahead)
        out = []
        for unit in units:
            try:
                out.append(self._batch(shard, unit))
            except OutOfBounds:
                break
        return out

    async def _read_back(self, units: list[Unit], ahead: bool = True) -> None:
        await asyncio.get_running_loop().run_in_executor(
            self._reader, self.clog.fault_in, [(unit[0], unit[1]) for unit in units], ahead
        )

    async def _fault_in_at(self, offsets: Iterable[int]) -> None:
        """The same for entries known by where they start (a client's message id, the key index's hits). Any offset
        may be stale; the caller's own checks, made after this, decide what is an entry."""
        flusher = self.flusher
        if flusher is None:
            return
        dropped = sorted(phys for phys in offsets if phys < flusher.cache_from)
        if dropped:
            await asyncio.get_running_loop().run_in_executor(self._reader, self.clog.fault_in_at, dropped)

    def _batch(self, shard: Shard, unit: Unit) -> StoredBatch:
        phys, size, count, tags, store_ts, _running_max, base = unit
        data = self.clog.body_view(phys, size, len(shard.topic_b))
        return StoredBatch(base, count, data, store_ts, _I64.unpack_from(data, 35)[0], tags, phys)

    # --- reads ----------------------------------------------------------------------------------------------

    async def read(self, topic: str, queue: int, offset: int, max_bytes: int) -> ReadResult:
        shard = self.registry.get(topic, queue)
        cq = shard.cq
        start, end = shard.log_start, cq.end_offset
        if offset < start or offset > end:
            raise OffsetOutOfRange(offset, start, end)
        batches: list[StoredBatch] = []
        if offset == end:
            return ReadResult(batches, start, end)
        total = 0
        if self.compacted:
            compacted = self.compacted.get((topic, queue))
            if compacted is not None and offset < compacted.upto:  # a compacted prefix answers below its upto
                batches = compacted.read(offset, max_bytes)
                total = sum(len(b.data) for b in batches)
                offset = compacted.upto
                if total >= max_bytes or offset >= end:
                    return ReadResult(batches, start, end)
        fixed = shard.fixed
        units: list[Unit] = []
        for unit in units_from(cq, cq.search_offset(offset)):
            n = unit[1] - fixed
            if (batches or units) and total + n > max_bytes:
                break
            units.append(unit)
            total += n
            if total >= max_bytes:
                break
        if units:
            # a read asking for less than a page wants one batch (the timer's payload loads, a message looked up
            # by offset): reading ahead past it would fill the disk queue with pages nobody reads
            batches.extend(await self.stored(shard, units, ahead=max_bytes >= POINT_READ_BYTES))
        return ReadResult(batches, start, end)

    def range_bytes(self, topic: str, queue: int, start: int, end: int) -> int:
        """StorageAdapter.range_bytes from the index alone: the compacted prefix's entry sizes, then the
        ConsumeQueue units' (each unit's CommitLog entry less its header); no record byte is read."""
        shard = self.registry.get(topic, queue)
        total = 0
        compacted = self.compacted.get((topic, queue)) if self.compacted else None
        if compacted is not None and start < compacted.upto:
            bases, sizes = compacted.bases, compacted.sizes
            for i in range(compacted.index_of(start), len(bases)):
                if bases[i] >= end or bases[i] >= compacted.upto:
                    break
                total += sizes[i]
            start = compacted.upto
        if start >= end:
            return total
        cq = shard.cq
        fixed = shard.fixed
        for unit in units_from(cq, cq.search_offset(start)):
            if unit[6] >= end:
                break
            total += unit[1] - fixed
        return total

    async def read_by_tags(
        self, topic: str, queue: int, offset: int, tags_codes: Iterable[int], max_batches: int
    ) -> ReadResult:
        """Filters on the ConsumeQueue's tags codes: non-matching batches are never read from the CommitLog."""
        shard = self.registry.get(topic, queue)
        cq = shard.cq
        start, end = shard.log_start, cq.end_offset
        if offset < start or offset > end:
            raise OffsetOutOfRange(offset, start, end)
        wanted = set(tags_codes)
        batches: list[StoredBatch] = []
        if offset == end or max_batches <= 0 or not wanted:
            return ReadResult(batches, start, end)
        compacted = self.compacted.get((topic, queue)) if self.compacted else None
        if compacted is not None and offset < compacted.upto:
            batches = compacted.read(offset, 1 << 62, wanted, max_batches)
            offset = compacted.upto
        units: list[Unit] = []
        for unit in units_from(cq, cq.search_offset(offset)):
            if len(batches) + len(units) >= max_batches:
                break
            if unit[3] in wanted:
                units.append(unit)
        if units:
            batches.extend(await self.stored(shard, units))
        return ReadResult(batches, start, end)

    async def read_by_key(
        self, topic: str, key: bytes, max_count: int, begin_ms: int = 0, end_ms: int = 1 << 62
    ) -> list[tuple[int, StoredBatch]]:
        """Through the key index (index.py), each hit checked against its CommitLog entry; newest first. The
        first `max_count` hits are read back off the loop first if their pages were dropped (_fault_in_at)."""
        if topic not in self.registry.topics:
            raise UnknownShard(f"unknown topic {topic!r}")
        first = list(islice(self.index.candidates(topic, key, begin_ms, end_ms), max(0, max_count)))
        await self._fault_in_at(first)
        candidates: Iterable[int] = first
        if len(first) == max_count:
            # past those, a new walk of the index (it may have grown meanwhile), taken only if some hit fails its
            # check; fewer than max_count hits were all the index had
            taken = set(first)
            candidates = chain(
                first, (phys for phys in self.index.candidates(topic, key, begin_ms, end_ms) if phys not in taken)
            )
        return self.index.find(self.clog, self.registry.shards, topic, key, max_count, begin_ms, end_ms, candidates)

    async def read_at(self, physical_offset: int) -> tuple[str, int, StoredBatch] | None:
        """The CommitLog entry at `physical_offset`, CRC checked, if it is still served (index.live_entry: the
        same rules the key index applies to its hits). Below a shard's compacted prefix the entry is not what
        readers get any more (the compaction log is), so it does not count either."""
        await self._fault_in_at((physical_offset,))
        found = live_entry(self.clog, self.registry.shards, physical_offset, verify=True)
        if found is None or not self.compacted:
            return found
        compacted = self.compacted.get((found[0], found[1]))
        if compacted is not None and found[2].base_offset < compacted.upto:
            return None
        return found

    # --- timestamps -------------------------------------------------------------------------------------------

    async def offset_for_timestamp(self, topic: str, queue: int, timestamp: int) -> tuple[int, int] | None:
        """Bisect the ConsumeQueue's running max timestamps, then find the record inside the batch (decoding,
        and decompressing if needed, only that one batch; the same resolution as the other engines). The
        batches the search most likely reads are read back off the loop first if their pages were dropped."""
        shard = self.registry.get(topic, queue)
        found, first = self._timestamp_start(shard, timestamp)
        if first < 0:
            return found
        units: list[Unit] = []
        flusher = self.flusher
        if flusher is not None:
            units = list(islice(units_from(shard.cq, first), TIMESTAMP_FAULT_IN_UNITS))
            if units and units[0][0] < flusher.cache_from:
                await self._read_back(units)
                # the queue may have moved while the pages were read back: search it as it is now
                return self._offset_for_timestamp(shard, timestamp)
        return self._scan_for_timestamp(shard, timestamp, first, units)

    def _offset_for_timestamp(self, shard: Shard, timestamp: int) -> tuple[int, int] | None:
        found, first = self._timestamp_start(shard, timestamp)
        return found if first < 0 else self._scan_for_timestamp(shard, timestamp, first, [])

    def _timestamp_start(self, shard: Shard, timestamp: int) -> tuple[tuple[int, int] | None, int]:
        """(the answer, -1) when the lookup is decided before the queue's units are read (an empty queue, or the
        compacted prefix holds the record); else (None, the index of the first unit the scan reads)."""
        cq = shard.cq
        end = cq.end_offset
        floor = shard.log_start
        if floor >= end:
            return None, -1
        compacted = self.compacted.get((shard.topic, shard.queue)) if self.compacted else None
        if compacted is not None and floor < compacted.upto:  # below upto the compacted prefix answers
            found = compacted.offset_for_timestamp(timestamp, floor)
            if found is not None:
                return found, -1
            floor = compacted.upto
            if floor >= end:
                return None, -1
        return None, max(cq.search_timestamp(timestamp), cq.search_offset(floor))

    def _scan_for_timestamp(
        self, shard: Shard, timestamp: int, first: int, units: list[Unit]
    ) -> tuple[int, int] | None:
        """The first record at or after `timestamp` in the units from index `first` (`units`: those already
        read from there, which the scan takes before reading on)."""
        view = self.clog.body_view
        tlen = len(shard.topic_b)
        log_start = shard.log_start
        for unit in chain(units, units_from(shard.cq, first + len(units))):
            data = view(unit[0], unit[1], tlen)
            # the unit holds the running max; the batch's own max says whether it can hold a match
            if _I64.unpack_from(data, 35)[0] < timestamp:
                continue
            found = first_record_at_or_after(data, timestamp, log_start)
            if found is not None:
                return found
        return None

    async def max_timestamp(self, topic: str, queue: int) -> tuple[int, int] | None:
        """The first record carrying the queue's largest timestamp (its last unit's running max)."""
        shard = self.registry.get(topic, queue)
        cq = shard.cq
        if shard.log_start >= cq.end_offset or len(cq) == 0:
            return None
        found = await self.offset_for_timestamp(topic, queue, cq.unit(cq.max_unit - 1)[5])
        if found is not None:
            return found
        # the record holding the maximum lies before the log start: the largest among what remains
        best = None
        if (topic, queue) in self.compacted:  # part of it lives in the compacted prefix: walk through read()
            offset = shard.log_start
            while offset < cq.end_offset:
                result = await self.read(topic, queue, offset, 1 << 20)
                if not result.batches:
                    break
                best = max_retained_timestamp(result.batches, shard.log_start, best)
                offset = result.batches[-1].next_offset
                await asyncio.sleep(0)  # (as below)
            return best
        index = cq.search_offset(shard.log_start)
        while True:
            units = list(islice(units_from(cq, index), MAX_TIMESTAMP_WALK_UNITS))
            if not units:
                return best
            index += len(units)
            batches = await self.stored(shard, units)  # (dropped pages read back off the loop)
            await asyncio.sleep(0)  # a long queue: the walk must not hold the loop from end to end
            if self.registry.shards.get((topic, queue)) is not shard:
                raise UnknownShard(f"{topic}-{queue} was deleted during the lookup")
            best = max_retained_timestamp(batches, shard.log_start, best)  # (the log start as it is now)


__all__ = ["LogReader", "Unit", "units_from"]
