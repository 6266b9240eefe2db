"""The file engine's one append pipeline: plan, write, publish.

Every append, of one batch or of one batch to each of a thousand partitions, takes the same three steps:
1. **plan**: the kernel (`clentry.AppendRun.plan`) stages a run of entries: their CommitLog heads side by side in
   its buffer, their ConsumeQueue units past each queue's published end in the queues' mappings (invisible to
   readers, who stop at the published end). It reads and moves nothing but the queue table's rows (queue_table.py).
2. **write**: the run's bytes go into the CommitLog segment with pwritev (`AppendRun.write`).
3. **publish** (`_publish`, the one function where positions move): the segment's write position, the queue
   table's rows (`AppendRun.publish`), the dispatched offset and the dispatch hooks (the key index), in that order.
   Nothing is published before its bytes are in place: a failed write abandons the run (every entry of it gets the
   error) and the next run overwrites the same bytes. The listeners that wake long polls hear once per append
   call, after its last publish, of every queue that grew (a Produce into a thousand partitions: one call each).

When the kernel stops before an entry it says why (`RunStop`), and this module does what the stop asks, then plans
again from that entry: roll the CommitLog segment (a BLANK fills the rest of the old one), make room in the queue's
ConsumeQueue file, split a buffer holding several batches (`split_batches`), or answer the entry with its error.
An entry is appended whole (one run) unless it cannot be: more batches than a run holds, more bytes than a
segment, or more units than the rest of a ConsumeQueue file; then its batches are appended one after the other.

Appends run on the event loop thread and never suspend between plan and publish.
"""

from __future__ import annotations

import bisect
import enum
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mqk._fast import load
from mqk.errors import Corrupt, InvalidRecord, StorageError, UnknownShard
from mqk.store.adapter import AppendResult, Buffer
from mqk.store.file.commitlog import FIXED, CommitLog
from mqk.store.file.dispatch import DispatchHook, run_hooks
from mqk.store.file.mapped_file import MappedFile, storage_error

if TYPE_CHECKING:
    from mqk.store.file.consumequeue import ConsumeQueue
    from mqk.store.file.dispatch import ReputMessageService
    from mqk.store.file.index import IndexService
    from mqk.store.file.queue_table import QueueTable
    from mqk.store.file.shards import ShardRegistry

recbatch = load("recbatch")
clentry = load("clentry")
log = logging.getLogger(__name__)

BATCH_HEADER = recbatch.HEADER_SIZE
#: batches one run stages at most (its heads are kept between appends: topic length x this many bytes)
RUN_CAPACITY = 4096
#: AppendResult is a NamedTuple: built with tuple.__new__, a third of the cost of its Python-level __new__
_new_tuple = tuple.__new__

Entry = tuple[int, Sequence[Buffer]]
Answer = AppendResult | Exception
_NONE_REFUSED: dict[int, Exception] = {}  # (read-only)


class RunStop(enum.IntEnum):
    """Why the kernel stopped planning before an entry (clentry.STOP_*)."""

    END = clentry.STOP_END
    FULL = clentry.STOP_FULL
    SEGMENT = clentry.STOP_SEGMENT
    UNIT_ROOM = clentry.STOP_UNIT_ROOM
    NO_SHARD = clentry.STOP_NO_SHARD
    BATCH = clentry.STOP_BATCH
    SHAPE = clentry.STOP_SHAPE


#: the pipeline's fault-injection points (tests): called with the stage just reached, on the run about to go on
FaultHook = Callable[[str], None]
STAGE_PLANNED = "planned"  #: staged, nothing written
STAGE_WRITTEN = "written"  #: the run's bytes are in the segment, nothing published


class StoreStats:
    """Put-message counters (RocketMQ's StoreStatsService, minus the rolling windows). What was published is
    counted by the append kernel itself (AppendRun.published_*): the hot path pays no Python for it."""

    #: latency bucket upper bounds in microseconds; the last bucket is everything above
    BOUNDS_US = (10, 50, 100, 500, 1_000, 5_000, 10_000, 50_000, 100_000, 500_000)

    def __init__(self, pipeline: AppendPipeline) -> None:
        self._pipeline = pipeline
        self.put_failures = 0
        self.latency_buckets = [0] * (len(self.BOUNDS_US) + 1)
        #: the latencies' sum (ns, each append's latency times its puts): a histogram's sum for /metrics
        self.latency_sum_ns = 0
        self.max_latency_ns = 0

    @property
    def puts(self) -> int:
        """Entries appended."""
        return self._pipeline.run.published_entries

    @property
    def put_batches(self) -> int:
        return self._pipeline.run.published_batches

    @property
    def put_bytes(self) -> int:
        """CommitLog bytes appended."""
        return self._pipeline.run.published_bytes

    def record(self, latency_ns: int, count: int = 1) -> None:
        """Count `count` puts that each took `latency_ns` (wall-clock time, the clock the store timestamps come
        from: one clock read per append serves both; a clock stepped back during an append counts it as fast)."""
        self.latency_sum_ns += latency_ns * count
        if latency_ns <= _FIRST_BOUND_NS and latency_ns <= self.max_latency_ns:  # the usual async append
            self.latency_buckets[0] += count
            return
        self.latency_buckets[bisect.bisect_left(_BOUNDS_NS, latency_ns)] += count
        if latency_ns > self.max_latency_ns:
            self.max_latency_ns = latency_ns

    @property
    def max_latency_us(self) -> int:
        return self.max_latency_ns // 1000

    @property
    def dispatch_lag(self) -> int:
        """CommitLog bytes written but not yet dispatched (0 while dispatch is synchronous with the append)."""
        clog = self._pipeline.clog
        return clog.max_offset - max(self._pipeline.dispatcher.dispatched, clog.min_offset)

    def as_dict(self) -> dict[str, object]:
        labels = [f"<={b}" for b in self.BOUNDS_US] + [f">{self.BOUNDS_US[-1]}"]
        return {
            "puts": self.puts,
            "put_batches": self.put_batches,
            "put_bytes": self.put_bytes,
            "put_failures": self.put_failures,
            "max_latency_us": self.max_latency_us,
            "latency_us": dict(zip(labels, self.latency_buckets)),
            "dispatch_lag": self.dispatch_lag,
        }


_BOUNDS_NS = tuple(b * 1000 for b in StoreStats.BOUNDS_US)
_FIRST_BOUND_NS = _BOUNDS_NS[0]


class AppendPipeline:
    """The plan → write → publish loop over a list of entries of one topic (see the module docstring)."""

    def __init__(
        self,
        clog: CommitLog,
        registry: ShardRegistry,
        table: QueueTable,
        dispatcher: ReputMessageService,
        index: IndexService,
        index_hook: object,
        dirty: set[ConsumeQueue],
        listeners: list[Callable[[str, Sequence[tuple[int, int]]], None]],
        notify: Callable[[str, Sequence[tuple[int, int]]], None],
    ) -> None:
        self.clog = clog
        self.registry = registry
        self.table = table
        self.dispatcher = dispatcher
        self.index = index
        self.stats = StoreStats(self)
        #: ConsumeQueues with units not yet flushed (the checkpoint's to-do list)
        self.dirty = dirty
        #: the engine's data listeners (the list itself: it changes as listeners come and go) and how to call them
        self._listeners = listeners
        self._notify = notify
        #: the index's hook as registered (the bound method object in `dispatcher.hooks`; see hooks_for)
        self._index_hook = index_hook
        self.run = clentry.AppendRun(RUN_CAPACITY)
        #: the slots a publish marked dirty (kept between calls: usually it stays empty)
        self._dirtied: list[int] = []
        #: appends are accepted (the engine started, is not closed, and takes local appends)
        self.running = False
        #: why appends are refused while the engine runs (a replica's CommitLog takes only its master's bytes)
        self.refusal: Exception | None = None
        #: test hook: called between the pipeline's steps (STAGE_*)
        self.fault: FaultHook | None = None

    # --- the loop ----------------------------------------------------------------------------------------------

    def append(
        self,
        topic: str,
        entries: Sequence[Entry],
        tags_code: int,
        keys: Sequence[bytes],
        log_append_time: bool,
        now_ns: int,
    ) -> tuple[list[Answer], int]:
        """Append `entries` of `topic` stamped with wall-clock time `now_ns`: an answer per entry (its result or
        its error) and the CommitLog offset past the last entry written (-1: none)."""
        # The hot path: a Produce is one call of this; kept flat on purpose (each lookup and call shows).
        route = self.registry.routes.get(topic)
        if route is None or not self.running:
            error = (
                (self.refusal or StorageError("the file store is not running"))
                if not self.running
                else UnknownShard(f"unknown shard {topic}-{entries[0][0] if entries else 0}")
            )
            return [error] * len(entries), -1
        slot_map, topic_b = route
        store_ts = now_ns // 1_000_000
        work: list[Entry] = entries if entries.__class__ is list else list(entries)
        #: entries answered before planning (a LogAppendTime batch that does not validate): index -> its error
        refused: dict[int, Exception] = _NONE_REFUSED
        if log_append_time:
            work, refused = _stamped(work, store_ts)
        hooks: Sequence[DispatchHook] = self.dispatcher.hooks  # (hooks_for, inlined)
        if hooks and not (
            keys or len(hooks) > 1 or hooks[0] is not self._index_hook or topic in self.index.keyed_topics
        ):
            hooks = ()
        out: list[Answer] = []
        grown: list[tuple[int, int]] = []  # (queue, new end) per entry published, for the listeners
        last = -1
        #: (entry, stop) re-planned after a BATCH or SHAPE stop: the same stop again is that entry's answer
        retried: set[tuple[int, int]] | None = None
        run = self.run
        table = self.table
        files = self.clog.mfq.files
        count = len(work)
        i = 0
        fault = self.fault
        while i < count:
            mf = files[-1] if files else self.clog.mfq.roll(0)
            try:
                # step 1, plan; and step 2, the run's bytes into the segment, in the same call unless a fault hook
                # must run in between
                planned = run.plan(
                    table.rows,
                    slot_map,
                    table.unit_bufs,
                    work,
                    i,
                    topic_b,
                    store_ts,
                    tags_code,
                    mf.start_offset,
                    mf.wrote,
                    mf.file_size,
                    -1 if fault is not None else mf.fd,
                )
                if fault is not None and planned:
                    fault(STAGE_PLANNED)
                    run.write(mf.fd)
                    fault(STAGE_WRITTEN)
            except OSError as exc:  # each entry of the run answered with the error, nothing published
                planned = run.entries
                self._abandon(mf, planned, out, exc)
            except BaseException:
                run.abandon(table.rows)
                raise
            else:
                if planned:
                    last = self._publish(topic, mf, work, out, grown, hooks, keys)
            if planned:
                i += planned
                if i >= count:
                    break
            stop = run.stop
            if stop == clentry.STOP_FULL and planned:
                continue  # the next run takes it
            if work is entries:
                work = list(entries)  # (the caller's list is never changed)
            if retried is None:
                retried = set()
            try:
                answer = self._unblock(topic, work, i, stop, retried, refused, tags_code, keys, now_ns)
            except (StorageError, Corrupt) as exc:  # (StorageFull making room: that entry's answer)
                answer = exc
            files = self.clog.mfq.files  # (a roll replaces the list)
            if answer is None:
                continue  # unblocked: plan again from entry i
            if isinstance(answer, tuple):  # appended in pieces: (its answer, the CommitLog end it reached)
                out.append(answer[0])
                last = max(last, answer[1])
            else:
                out.append(answer)
            i += 1
        if grown and self._listeners:
            self._notify(topic, grown)
        return out, last

    def _unblock(
        self,
        topic: str,
        work: list[Entry],
        i: int,
        stop: int,
        retried: set[tuple[int, int]],
        refused: dict[int, Exception],
        tags_code: int,
        keys: Sequence[bytes],
        now_ns: int,
    ) -> Exception | tuple[Answer, int] | None:
        """Do what the kernel's `stop` before entry `i` asks. None: plan again from `i` (`work[i]` may have been
        replaced); else entry i's answer (with the CommitLog end it reached, when it was appended in pieces)."""
        if i in refused:
            return refused[i]
        queue, batches = _shape(work[i])
        if stop == clentry.STOP_SHAPE:
            if queue is None or (i, stop) in retried:
                return InvalidRecord(f"an append entry is a (queue id, [record batch, ...]) pair, not {work[i]!r:.80}")
            retried.add((i, stop))
            work[i] = (queue, batches)
            return None
        assert queue is not None  # (the kernel got past the entry's shape: only a SHAPE stop has no queue id)
        if stop == clentry.STOP_NO_SHARD:
            return UnknownShard(f"unknown shard {topic}-{queue}")
        if stop == clentry.STOP_BATCH:
            if (i, stop) in retried:
                return InvalidRecord("record batch not accepted (magic, length, offset delta or record count)")
            parts = split_batches(batches)  # InvalidRecord says what is wrong
            retried.add((i, stop))
            work[i] = (queue, parts)
            return None
        size = sum(FIXED + len(topic.encode()) + len(body) for body in batches)
        if stop == clentry.STOP_SEGMENT:
            if len(batches) > 1:  # its batches fill this segment and go on in the next, as single ones would
                return self._in_pieces(topic, queue, batches, tags_code, keys, now_ns)
            self.clog.roll_for(size)  # (MessageTooLarge if no segment can hold it)
            return None
        if stop == clentry.STOP_UNIT_ROOM:
            shard = self.registry.get(topic, queue)
            if shard.cq.make_room(len(batches)):
                return None
            return self._in_pieces(topic, queue, batches, tags_code, keys, now_ns)
        if stop == clentry.STOP_FULL:  # more batches than a run holds
            return self._in_pieces(topic, queue, batches, tags_code, keys, now_ns)
        raise AssertionError(f"AppendRun stopped with an unknown reason {stop}")

    def _in_pieces(
        self, topic: str, queue: int, batches: Sequence[Buffer], tags_code: int, keys: Sequence[bytes], now_ns: int
    ) -> tuple[Answer, int]:
        """An entry that cannot be one run, appended one batch at a time (every batch was checked first, so only a
        write can fail halfway: the batches before it stay appended, as a log's earlier entries do)."""
        for body in batches:
            if not clentry.acceptable_batch(body):
                return InvalidRecord("record batch not accepted (magic, length, offset delta or record count)"), -1
        answers, end = self.append(topic, [(queue, [body]) for body in batches], tags_code, keys, False, now_ns)
        for answer in answers:
            if not isinstance(answer, AppendResult):
                return answer, end
        first, final = answers[0], answers[-1]
        assert isinstance(first, AppendResult) and isinstance(final, AppendResult)
        return _new_tuple(
            AppendResult,
            (
                first.base_offset,
                final.last_offset,
                final.log_append_time,
                final.log_start_offset,
                first.physical_offset,
            ),
        ), end

    # --- write and publish -------------------------------------------------------------------------------------

    def _abandon(self, mf: MappedFile, planned: int, out: list[Answer], exc: OSError) -> None:
        """A failed write: the run is abandoned, each of its entries answered with the error."""
        run = self.run
        run.abandon(self.table.rows)
        error = storage_error(exc, mf.path, run.end_pos - run.pos)
        out.extend([error] * planned)
        self.stats.put_failures += planned
        log.error("CommitLog write at %d failed: %s", mf.start_offset + run.pos, error)

    def _publish(
        self,
        topic: str,
        mf: MappedFile,
        work: list[Entry],
        out: list[Answer],
        grown: list[tuple[int, int]],
        hooks: Sequence[DispatchHook],
        keys: Sequence[bytes],
    ) -> int:
        """Step 3, the one place positions move: the run is in the segment; make it visible. Returns the CommitLog
        offset past it."""
        run = self.run
        described = [run.batch(k) for k in range(run.batches)] if hooks else ()
        mf.wrote = mf.committed = run.end_pos  # the CommitLog: its bytes are in place
        dirtied = self._dirtied
        run.publish(self.table.rows, out, grown, dirtied, AppendResult)  # the queues (and the put statistics)
        last = self.dispatcher.dispatched = mf.start_offset + run.end_pos
        if dirtied:
            queue_at = self.registry.queue_at
            self.dirty.update(queue_at[slot] for slot in dirtied)
            dirtied.clear()
        if described:
            store_ts = run.store_timestamp
            for entry, index, queue, base, span, phys, size in described:
                run_hooks(hooks, topic, queue, base, span, phys, size, store_ts, keys, work[entry][1][index])
        return last

    def hooks_for(self, topic: str, keys: Sequence[bytes]) -> Sequence[DispatchHook]:
        """The dispatch hooks an append must call. When the key index's hook is the only one, it has nothing to
        do for an entry without keys of a topic that does not index Kafka record keys: it is skipped, and its
        checkpoint counts everything dispatched as considered (IndexService.snapshot). Any other hook sees every
        entry."""
        hooks = self.dispatcher.hooks
        if hooks and (keys or len(hooks) > 1 or hooks[0] is not self._index_hook or topic in self.index.keyed_topics):
            return hooks
        return ()


def split_batches(batches: Sequence[Buffer]) -> list[Buffer]:
    """The record batches of `batches`, a buffer holding several concatenated ones cut into views of each; every
    one checked (InvalidRecord says what is wrong), so an entry is refused whole before anything is written."""
    parse = recbatch.parse_header
    out: list[Buffer] = []
    for buf in batches:
        n = len(buf)
        pos = 0
        while pos < n:
            try:
                hdr = parse(buf, pos)
            except Corrupt as exc:
                raise InvalidRecord(f"not a record batch v2: {exc}") from None
            size = hdr[1] + 12
            if size < BATCH_HEADER or size > n - pos:
                raise InvalidRecord(f"record batch length {hdr[1]} does not match the {n - pos} bytes given")
            if hdr[6] < 0 or hdr[12] < 0:
                raise InvalidRecord(f"record batch with last offset delta {hdr[6]}, count {hdr[12]}")
            out.append(buf if pos == 0 and size == n else memoryview(buf)[pos : pos + size])
            pos += size
    if not out:
        raise InvalidRecord("no record batch to append")
    return out


def _shape(entry: Any) -> tuple[int | None, list[Buffer]]:
    """(queue id, batches as a list) of an entry of any sequence shape, or (None, []) when it has none."""
    try:
        queue, batches = entry
        return int(queue), list(batches)
    except (TypeError, ValueError):
        return None, []


def _stamped(entries: list[Entry], store_ts: int) -> tuple[list[Entry], dict[int, Exception]]:
    """LogAppendTime: copies of every batch with the broker's time as their timestamp (recbatch.set_log_append_time);
    an entry that does not validate is refused (its index -> its error)."""
    out: list[Entry] = []
    refused: dict[int, Exception] = {}
    for i, entry in enumerate(entries):
        queue, batches = _shape(entry)
        try:
            if queue is None:
                raise InvalidRecord(f"an append entry is a (queue id, [record batch, ...]) pair, not {entry!r:.80}")
            stamped: list[Buffer] = []
            for body in split_batches(batches):
                copy = bytearray(body)
                recbatch.set_log_append_time(copy, 0, store_ts)
                stamped.append(copy)
        except InvalidRecord as exc:
            refused[i] = exc
            out.append((-1, ()))  # (the kernel stops here; `refused` answers)
            continue
        out.append((queue, stamped))
    return out, refused


__all__ = ["STAGE_PLANNED", "STAGE_WRITTEN", "AppendPipeline", "FaultHook", "RunStop", "StoreStats", "split_batches"]
