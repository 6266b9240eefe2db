"""The file engine's side of CommitLog replication: the master's bytes read out (`read_log`), a replica's copy
written at the same physical offsets and dispatched (`ReplicaLog`), a diverged log cut back (`truncate_log`), and a
log its master has left behind started over at the master's log start (`restart_log`).

A replica's CommitLog is a byte-for-byte prefix of its master's: entries keep the physical offsets, queue offsets
and CRCs the master gave them, so a replica that becomes master serves the same offsets, and a client's position
means the same record on every broker of the group. Nothing else appends to a replica's CommitLog (the engine
refuses local appends while it is one: `FileEngine.set_writable`).

`ReplicaLog` takes the byte stream in whatever pieces the transport brings (`receive`): it writes only whole
entries, holds the incomplete tail of a piece until the rest arrives, and checks each entry as recovery does
(size, magic, CRC, the physical offset it claims). A BLANK (the unused end of a segment) is written as its head
and ends the segment: the master's bytes after it are zeros nobody reads, so they are skipped, not held. Whole
entries are dispatched as recovery replays them (ConsumeQueue units, the key index, the engine's data listeners),
so readers on the replica and a later promotion see the same queues as on the master.

An entry of a topic this replica does not hold yet (the metadata that creates it travels through etcd, the bytes
through the replication link, and either may come first) stops the write before it: `receive` answers the
shards it needs, the caller creates them (or decides they are gone), and calls `receive` again with nothing new.
A topic created on the replica that way starts at the entry's own physical offset, so recovery's rule (entries
below a topic's creation point are an older incarnation's) holds on the replica too.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from mqk._fast import load
from mqk.errors import Corrupt, OutOfBounds

if TYPE_CHECKING:
    from mqk.store.file.append import AppendPipeline
    from mqk.store.file.checkpoint import Checkpoint
    from mqk.store.file.commitlog import CommitLog
    from mqk.store.file.dispatch import ReputMessageService
    from mqk.store.file.flush import FlushService
    from mqk.store.file.index import IndexService
    from mqk.store.file.shards import Shard, ShardRegistry

clentry = load("clentry")
log = logging.getLogger(__name__)

_SIZE_MAGIC = struct.Struct(">iI")
MAGIC_MESSAGE = clentry.MAGIC_MESSAGE
MAGIC_BLANK = clentry.MAGIC_BLANK
BLANK_MIN = clentry.BLANK_MIN_SIZE
KIND_MESSAGE = 1


class FileEngine(Protocol):
    """The parts of the file engine (engine.py) replication works on."""

    clog: CommitLog
    registry: ShardRegistry
    dispatcher: ReputMessageService
    index: IndexService
    appender: AppendPipeline
    checkpoint: Checkpoint
    flusher: FlushService | None

    def _notify(self, topic: str, queue_ends: Sequence[tuple[int, int]]) -> None: ...


class Received(NamedTuple):
    """What `ReplicaLog.receive` did: the CommitLog end after it (what the replica holds), and the shards it needs
    created before it can write on (empty when it wrote everything whole it had)."""

    end: int
    missing: list[tuple[str, int]]


def read_log(engine: FileEngine, offset: int, max_bytes: int) -> bytes:
    """Up to `max_bytes` of the master's CommitLog from `offset`, never past the segment holding it nor past the
    written end (b"" when `offset` is the end). OutOfBounds when `offset` is below the oldest segment or past the
    end. A copy: the segment may be unmapped (reclaimed) while the bytes wait in a transport's buffer."""
    clog = engine.clog
    end = clog.max_offset
    if offset == end:
        return b""
    if offset < clog.min_offset or offset > end:
        raise OutOfBounds(f"CommitLog offset {offset} outside [{clog.min_offset}, {end}]")
    mf = clog.mfq.find(offset)
    pos = offset - mf.start_offset
    n = min(max_bytes, mf.wrote - pos)
    return bytes(mf.buf[pos : pos + n])


class ReplicaLog:
    """One replica's writer (see the module docstring)."""

    def __init__(self, engine: FileEngine) -> None:
        self.engine = engine
        #: the physical offset the next byte of the stream must have
        self._next = -1
        #: the stream's bytes before `_next` not written yet (an entry still arriving, or one waiting for its
        #: topic); they start at `_next - len(_carry)`
        self._carry = bytearray()
        #: stream bytes below this offset are a BLANK's zeros (the rest of a segment): dropped as they arrive
        self._skip_to = -1
        #: test hook: called with (offset, size) before each write into the CommitLog
        self.before_write: Callable[[int, int], None] | None = None

    @property
    def end(self) -> int:
        """The CommitLog end: every byte below it is written (and, but for entries of shards that will never
        exist here, dispatched)."""
        return self.engine.clog.max_offset

    def reset(self, start: int | None = None) -> None:
        """Start a new stream at `end` (at every (re)connection: a partial entry of the last one is forgotten), or
        at `start` when this CommitLog is still empty (a new replica of a master whose oldest segments are gone)."""
        self._carry.clear()
        self._skip_to = -1
        self._next = start if start is not None and self.end == 0 else self.end

    def receive(self, phys: int, data: bytes | memoryview) -> Received:
        """Take the master's bytes at `phys` (which must continue the stream: Corrupt otherwise), write and dispatch
        every whole entry they complete, and hold the rest. Corrupt for bytes that are not a valid entry stream
        (the caller drops the link and starts again from `end`); StorageError when the disk refuses them."""
        if self._next < 0:
            self.reset()
        if phys != self._next:
            raise Corrupt(f"replication stream at {phys}, expected {self._next}", phys)
        self._next += len(data)
        if self._skip_to > phys:
            data = data[min(len(data), self._skip_to - phys) :]
        if data:
            self._carry += data
        return self._drain()

    def _drain(self) -> Received:
        engine = self.engine
        clog = engine.clog
        carry = self._carry
        registry = engine.registry
        grown: dict[str, dict[int, int]] = {}
        missing: list[tuple[str, int]] = []
        base = self._next - len(carry)  # the stream offset of carry[0]
        pos = 0
        try:
            while len(carry) - pos >= 8:
                at = base + pos
                size, magic = _SIZE_MAGIC.unpack_from(carry, pos)
                segment_end = self._segment_end(at)
                if magic == MAGIC_BLANK:
                    if size < BLANK_MIN or at + size != segment_end:
                        raise Corrupt(f"BLANK of {size} bytes does not end its segment", at)
                    self._write(at, bytes(carry[pos : pos + 8]), fill_to=segment_end)
                    skip = min(size, len(carry) - pos)  # the zeros already here; the rest dropped on arrival
                    self._skip_to = segment_end
                    pos += skip
                    continue
                if magic != MAGIC_MESSAGE or size < clentry.FIXED_HEADER_SIZE or at + size > segment_end:
                    raise Corrupt(f"not an entry (size {size}, magic {magic:#x})", at)
                if len(carry) - pos < size:
                    break
                entry = clentry.read_entry(carry, pos, pos + size, True)
                if entry[0] != KIND_MESSAGE or entry[5] != at:
                    raise Corrupt(f"entry claims physical offset {entry[5]}", at)
                topic, queue = entry[10], entry[2]
                shard = registry.shards.get((topic, queue))
                if shard is None:
                    missing.append((topic, queue))
                    break
                self._write(at, memoryview(carry)[pos : pos + size])
                if at >= shard.created_phys:
                    mf = clog.mfq.find(at)
                    rel = at - mf.start_offset
                    # (read_entry's body position counts from the start of `carry`, not of this entry)
                    body_at = rel + entry[11] - pos
                    end = self._dispatch(shard, at, entry, mf.buf[body_at : rel + size])
                    if end is not None:
                        grown.setdefault(topic, {})[queue] = end
                else:
                    engine.dispatcher.dispatched = at + size
                pos += size
        finally:
            if pos:
                del carry[:pos]
            for topic, ends in grown.items():
                engine._notify(topic, list(ends.items()))
        return Received(clog.max_offset, missing)

    def skip_entry(self) -> None:
        """Write the entry `receive` stopped at without dispatching it: the caller found that its shard will not
        exist here (its topic was deleted before this replica created it)."""
        carry = self._carry
        if len(carry) < 8:
            return
        size = _SIZE_MAGIC.unpack_from(carry, 0)[0]
        if size < clentry.FIXED_HEADER_SIZE or len(carry) < size:
            return
        entry = clentry.read_entry(carry, 0, size, True)
        at = self._next - len(carry)
        self._write(at, memoryview(carry)[:size])
        del carry[:size]
        self.engine.dispatcher.dispatched = at + size
        log.info("replica: entry at %d of %s-%d written, not dispatched (no such shard here)", at, entry[10], entry[2])

    def _segment_end(self, at: int) -> int:
        """Where the segment holding `at` ends: the current one's end, or a new one's starting at `at`."""
        current = self.engine.clog.current
        if current is not None and current.start_offset <= at < current.end_offset:
            return current.end_offset
        return at + self.engine.clog.segment_bytes

    def _write(self, at: int, data: bytes | memoryview, fill_to: int = -1) -> None:
        clog = self.engine.clog
        mfq = clog.mfq
        mf = clog.current
        if mf is None or mf.is_full():
            mf = mfq.roll(at)
        if mf.wrote_offset != at:
            raise Corrupt(f"replica CommitLog ends at {mf.wrote_offset}, the stream is at {at}", at)
        if self.before_write is not None:
            self.before_write(at, len(data))
        mf.write(mf.wrote, data)
        mf.advance(len(data) if fill_to < 0 else fill_to - at)

    def _dispatch(self, shard: Shard, at: int, entry: tuple[Any, ...], body: memoryview) -> int | None:
        engine = self.engine
        size, queue_offset, count, store_ts, max_ts, tags_code = (
            entry[1],
            entry[4],
            entry[6],
            entry[7],
            entry[8],
            entry[9],
        )
        cq = shard.cq
        if queue_offset < cq.end_offset:
            log.error(
                "replica: %s-%d entry at %d has offset %d below the queue end %d; not dispatched",
                shard.topic,
                shard.queue,
                at,
                queue_offset,
                cq.end_offset,
            )
            engine.dispatcher.dispatched = at + size
            return None
        if queue_offset > cq.end_offset:
            if len(cq) == 0:
                # the master deleted what came before (retention) before this replica held it
                engine.registry.set_log_start(shard, queue_offset)
                engine.registry.save_meta_now()  # (recovery would take the old log start from the metadata)
                cq.end_offset = queue_offset
            else:
                log.error(
                    "replica: %s-%d has a gap at offsets %d..%d (entry at %d)",
                    shard.topic,
                    shard.queue,
                    cq.end_offset,
                    queue_offset - 1,
                    at,
                )
        engine.dispatcher.dispatch(shard, at, size, count, tags_code, store_ts, max_ts, queue_offset, None, body)
        engine.appender.dirty.add(cq)
        grown: int = queue_offset + count
        return grown


def truncate_log(engine: FileEngine, end: int) -> int:
    """Cut the CommitLog back to `end` (an entry boundary) and everything built on the entries past it: their
    ConsumeQueue units, key-index entries, and the checkpoint if it pointed past it. Returns how many bytes went.
    Blocking (it syncs the cut); the engine must not be appending (a replica, or a master stepping down)."""
    clog = engine.clog
    old = clog.max_offset
    if end >= old:
        return 0
    if end < clog.min_offset:
        raise OutOfBounds(f"cannot cut the CommitLog to {end}, below its first segment {clog.min_offset}")
    clog.truncate(end)
    for shard in engine.registry.shards.values():
        shard.cq.truncate_to_phys(end)
        if len(shard.cq) == 0 and shard.cq.end_offset < shard.log_start:
            shard.cq.end_offset = shard.log_start
        shard.cq.flush()
    engine.index.cut_to(end)
    if engine.dispatcher.dispatched > end:
        engine.dispatcher.dispatched = end
    if engine.flusher is not None:
        engine.flusher.flushed = min(engine.flusher.flushed, end)
        engine.flusher.cache_from = min(engine.flusher.cache_from, end)
    if engine.checkpoint.safe_offset > end:
        engine.checkpoint.store(end, end, time.time_ns() // 1_000_000)
    log.warning("CommitLog cut back from %d to %d (%d bytes): it diverged from the master's", old, end, old - end)
    return old - end


def restart_log(engine: FileEngine, start: int, queue_starts: dict[tuple[str, int], int]) -> int:
    """Empty the CommitLog and everything built on it, so that the master's log is copied from `start` (its oldest
    segment) on: what a replica does when its log ends before the master's oldest segment, or diverged from it
    below there (Kafka's follower truncates fully and starts at the leader's log start). Each queue of
    `queue_starts` ((topic, queue) -> the master's first offset at or after `start`) starts over there, so a queue
    with no entry left past `start` keeps the master's numbering; other queues keep their end offsets. Returns how
    many bytes went. Blocking; the engine must not be appending (a replica).

    A crash halfway leaves a log with fewer segments or none, and ConsumeQueue units past its end, which recovery
    cuts; the link then starts the copy again."""
    clog = engine.clog
    old_start, old_end = clog.min_offset, clog.max_offset
    clog.mfq.remove_all()
    for shard in engine.registry.shards.values():
        shard.cq.truncate_units(shard.cq.min_unit)
        first = queue_starts.get((shard.topic, shard.queue))
        if first is not None:  # (exactly there, even below its old end: the master's numbering wins)
            _start_queue(engine, shard, first)
        shard.cq.flush()
    adopt_queue_starts(engine, queue_starts)
    engine.index.cut_to(0)
    engine.dispatcher.dispatched = start
    if engine.flusher is not None:
        engine.flusher.flushed = start
        engine.flusher.cache_from = start
    engine.checkpoint.store(start, start, time.time_ns() // 1_000_000)
    log.warning(
        "CommitLog [%d, %d) removed (%d bytes): it ended before the master's oldest segment; copying the master's "
        "from %d",
        old_start,
        old_end,
        old_end - old_start,
        start,
    )
    return old_end - old_start


def adopt_queue_starts(engine: FileEngine, queue_starts: dict[tuple[str, int], int]) -> None:
    """Start each empty queue of `queue_starts` ((topic, queue) -> the master's first offset at the CommitLog
    offset this replica copies from) at that offset; a queue this replica does not hold yet starts there when it is
    created (`start_pending_queues`; kept in queues.json meanwhile, so a replica restarted before the topic's
    metadata arrives still knows). A queue with no entry past that point gets none through the copy, so this is
    the only way it learns the master's numbering."""
    registry = engine.registry
    for (topic, queue), first in queue_starts.items():
        shard = registry.shards.get((topic, queue))
        if shard is None:
            registry.pending_starts[(topic, queue)] = first
        elif len(shard.cq) == 0 and shard.cq.end_offset < first:
            _start_queue(engine, shard, first)
    registry.save_meta_now()


def start_pending_queues(engine: FileEngine, topic: str) -> bool:
    """Start the just-created queues of `topic` where `adopt_queue_starts` said; whether any moved."""
    pending = engine.registry.pending_starts
    moved = False
    for shard in engine.registry.by_topic.get(topic, ()):
        if shard is None:
            continue
        first = pending.pop((topic, shard.queue), None)
        if first is not None and len(shard.cq) == 0 and shard.cq.end_offset < first:
            _start_queue(engine, shard, first)
            moved = True
    return moved


def _start_queue(engine: FileEngine, shard: Shard, first: int) -> None:
    engine.registry.set_log_start(shard, first)
    shard.cq.end_offset = first


__all__ = [
    "Received",
    "ReplicaLog",
    "adopt_queue_starts",
    "read_log",
    "restart_log",
    "start_pending_queues",
    "truncate_log",
]
