"""Space reclaim for the file engine: delete CommitLog segments and ConsumeQueue files nothing needs any more.

The CommitLog is shared by every topic, so a topic's retention only moves that shard's log start offset (a number
in queues.json); the bytes stay until no shard needs the segment. This module owns the rule that frees them
(RocketMQ's CleanCommitLogService and CleanConsumeQueueService, decided by what is live instead of by file age):

- a CommitLog segment is deleted when every byte of it lies below the first *live* unit of every shard (the unit
  holding the shard's log start offset), i.e. no ConsumeQueue unit a reader can still reach points into it. Pending
  timer messages are live units of the timer topic, whose log start never passes the timer's delivered floor
  (the retention service passes that floor as a pin), so they keep their segments;
- `reserved_ms` (StoreConfig.file_reserved_time_ms, RocketMQ's fileReservedTime) bounds how long anything lives:
  head segments last written longer ago than that are deleted anyway, and every shard still pointing into them
  first moves its log start past them (never past its pin: a pinned shard holds the segment, logged);
- ConsumeQueue files whose units all lie below the log start are deleted in the same pass.

Never deleted: the last segment / file of a log (the write position lives there), and a file not yet known durable
(flushed < wrote; the flush and checkpoint threads may still touch it; the next pass gets it). Segments are taken out
of the queue's list on the event loop (where appends and reads run) and only then closed and unlinked in a thread;
a reader still holding a zero-copy view keeps the mapping alive (MappedFile.close tolerates exported views), so the
space returns once the last view is dropped. Recovery copes with a missing head: it scans from the first segment
present, and units below a log start are never read.

The key index (when the engine has one) answers lookups by CommitLog offset and must skip offsets below
`clog.min_offset`; this module does not rewrite it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from mqk.store.file.consumequeue import UNIT

if TYPE_CHECKING:
    from mqk.store.file.commitlog import CommitLog
    from mqk.store.file.compactlog import CompactLog
    from mqk.store.file.mapped_file import MappedFile, MappedFileQueue
    from mqk.store.file.shards import Shard

#: how reclaim moves a shard's log start (the engine's delete_before: metadata saved before it returns)
MoveLogStart = Callable[[str, int, int], Awaitable[int]]

log = logging.getLogger(__name__)


def _disk_bytes(mf: MappedFile) -> int:
    try:
        return os.stat(mf.path).st_blocks * 512
    except OSError:
        return 0


def _first_live_unit(shard: Shard, compacted: CompactLog | None) -> int:
    """Index of the unit holding the shard's log start (or, for a compacted shard, its compacted prefix's end:
    the units below it are served from the compaction log), or the queue's max unit when nothing is readable."""
    cq = shard.cq
    floor = shard.log_start
    if compacted is not None:
        floor = max(floor, compacted.upto)
    if floor >= cq.end_offset or len(cq) == 0:
        return cq.max_unit
    return max(cq.search_offset(floor), cq.min_unit)


def _first_unit_at_phys(shard: Shard, lo: int, phys: int) -> int:
    """Index of the first unit from `lo` whose entry starts at or after CommitLog offset `phys` (units are in
    CommitLog order within a queue, so bisect)."""
    cq = shard.cq
    hi = cq.max_unit
    while lo < hi:
        mid = (lo + hi) >> 1
        if cq.unit(mid)[0] < phys:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _take_head(mfq: MappedFileQueue, upto: int) -> list[MappedFile]:
    """Remove from `mfq` the head files that end at or before logical offset `upto` and are durable; never the
    last file. Returns them (the caller destroys them)."""
    taken = []
    while len(mfq.files) > 1:
        mf = mfq.files[0]
        if mf.end_offset > upto or mf.flushed < mf.wrote:
            break
        with mfq._lock:
            mfq.files.pop(0)
            mfq._starts.pop(0)
        taken.append(mf)
    return taken


def _destroy(files: list[MappedFile]) -> int:
    freed = 0
    for mf in files:
        freed += _disk_bytes(mf)
        mf.destroy()
    return freed


async def reclaim(
    clog: CommitLog,
    shards: Iterable[Shard],
    compacted: dict[tuple[str, int], CompactLog],
    move_log_start: MoveLogStart,
    now_ms: int,
    reserved_ms: int,
    pins: dict[tuple[str, int], int] | None = None,
) -> int:
    """One reclaim pass over the CommitLog `clog` and `shards` (`compacted`: their compacted prefixes); returns the
    bytes of disk given back (as counted by the files' allocated blocks)."""
    pins = pins or {}
    files = clog.mfq.files
    shards = list(shards)

    # 1. fileReservedTime: the head segments (never the last) last written before now - reserved_ms
    forced = clog.min_offset
    if reserved_ms >= 0 and len(files) > 1:
        deadline = now_ms - reserved_ms
        for mf in files[:-1]:
            try:
                mtime_ms = int(os.stat(mf.path).st_mtime * 1000)
            except OSError:
                break
            if mtime_ms >= deadline:
                break
            forced = mf.end_offset
    if forced > clog.min_offset:
        for shard in shards:
            first = _first_live_unit(shard, compacted.get((shard.topic, shard.queue)))
            if first >= shard.cq.max_unit or shard.cq.unit(first)[0] >= forced:
                continue
            keep = _first_unit_at_phys(shard, first, forced)
            new_start = shard.cq.end_offset if keep >= shard.cq.max_unit else shard.cq.unit(keep)[6]
            pin = pins.get((shard.topic, shard.queue))
            if pin is not None and new_start > pin:
                new_start = max(pin, shard.log_start)
                log.warning(
                    "reclaim: %s-%d pins offset %d; its CommitLog segments outlive file_reserved_time",
                    shard.topic,
                    shard.queue,
                    pin,
                )
            if new_start > shard.log_start:
                log.warning(
                    "reclaim: segments before %d are older than file_reserved_time; %s-%d log start moves %d -> %d",
                    forced,
                    shard.topic,
                    shard.queue,
                    shard.log_start,
                    new_start,
                )
                await move_log_start(shard.topic, shard.queue, new_start)

    # 2. the lowest CommitLog offset any shard can still read
    needed = clog.max_offset
    cq_cuts: list[tuple[Shard, int]] = []
    for shard in shards:
        first = _first_live_unit(shard, compacted.get((shard.topic, shard.queue)))
        cq_cuts.append((shard, first))
        if first < shard.cq.max_unit:
            needed = min(needed, shard.cq.unit(first)[0])

    # 3. take the dead files out on the loop; close and unlink them in a thread
    dead = _take_head(clog.mfq, needed)
    for shard, first in cq_cuts:
        dead.extend(_take_head(shard.cq.mfq, first * UNIT))
    if not dead:
        return 0
    freed = await asyncio.to_thread(_destroy, dead)
    log.info("reclaim: deleted %d files, %d bytes; CommitLog now starts at %d", len(dead), freed, clog.min_offset)
    return freed


__all__ = ["reclaim"]
