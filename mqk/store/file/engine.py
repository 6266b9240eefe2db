"""FileEngine: the RocketMQ-style file store behind the StorageAdapter seam.

Owns everything under its root directory:
  commitlog/                 one CommitLog for every topic and queue (commitlog.py)
  consumequeue/<topic>/<q>/  one ConsumeQueue per shard (consumequeue.py)
  queues.json                which shards exist, each topic's creation point in the CommitLog, log start offsets
  offsets/                   committed group offsets (mqk.store.offsets.FileOffsetStore)
  index/                     the key index for read_by_key, with its own checkpoint (index.py)
  checkpoint, abort          recovery bookkeeping (checkpoint.py)

Append path, all on the event loop and without suspending (except the sync-flush wait): validate the batch header,
build the entry's head (its CRC computed over head and batch), dispatch its ConsumeQueue unit and write head and
batch into the CommitLog with one pwritev, all in one kernel call (`clentry.put_entry`: one copy of the batch, by the
kernel), then publish. That is the common case (one batch, room in the current segment and ConsumeQueue file);
anything else takes the general path, which writes the same bytes. Entries written together (the partitions of an
append_many, the batches of one append) have their heads built side by side and take one pwritev for the lot
(`clentry.write_entries`) before any of them is published. Listeners hear of the new end offsets once per append
call. Reads hand out zero-copy views into the mapping.

Recovery runs at every start, from the older of the checkpoint's safe offset and the start of the last three
segments: ConsumeQueues are cut back to units below that point, entries are scanned forward with CRC checks and
re-dispatched, and the CommitLog is cut at the first bad entry (logged with its position; everything before it is
served). A ConsumeQueue found missing units for entries before the scan start (a damaged tail) is rebuilt from the
CommitLog from its last intact unit on.

Decisions: each batch of an append is its own CommitLog entry and ConsumeQueue unit, and its offset span is
last_offset_delta + 1 (so compacted batches keep their offsets). A topic re-created under an old name starts at
offset 0; entries of the old incarnation are told apart by the CommitLog offset at which the topic was created.
"""
from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import logging
import os
import shutil
import struct
import time
from collections.abc import Iterable, Sequence
from itertools import chain, islice
from pathlib import Path

from mqk._fast import load
from mqk.config import StoreConfig, TopicConfig
from mqk.errors import (
    Corrupt,
    InvalidRecord,
    OffsetOutOfRange,
    OutOfBounds,
    StorageError,
    UnknownShard,
)
from mqk.store.adapter import AppendResult, Buffer, GroupOffset, ReadResult, StorageAdapter, StoredBatch
from mqk.store.file.checkpoint import AbortMarker, Checkpoint
from mqk.store.file.commitlog import BLANK_MIN, FIXED, CommitLog
from mqk.store.file.compactlog import CompactLog, open_compacted
from mqk.store.file.consumequeue import UNIT, ConsumeQueue
from mqk.store.file.dispatch import ReputMessageService, run_hooks
from mqk.store.file.flush import FlushService
from mqk.store.file.index import IndexService, live_entry
from mqk.store.file.mapped_file import MappedFile, MappedFileQueue, storage_error
from mqk.store.fsutil import atomic_write_json, read_json, syncfs

# record-level timestamp resolution shared with the memory engine (decoding and decompression of one batch)
from mqk.store.memory import first_record_at_or_after, max_retained_timestamp

recbatch = load("recbatch")
clentry = load("clentry")
parse_header = recbatch.parse_header
put_entry = clentry.put_entry
append_run = clentry.append_run
write_entries = clentry.write_entries
time_ns = time.time_ns
log = logging.getLogger(__name__)

_I64 = struct.Struct(">q")
BATCH_HEADER = recbatch.HEADER_SIZE
#: segments always re-verified at start (RocketMQ's recoverNormally checks the last three files)
RECOVER_SEGMENTS = 3
#: a checkpoint flushing at least this many ConsumeQueues of one filesystem syncs the filesystem once (syncfs)
SYNCFS_MIN_QUEUES = 32
#: head slots the engine keeps between writes of several entries (_staging_for)
STAGING_KEPT = 4096
#: batches from the one the timestamp search lands on that it reads back off the loop if their pages were dropped
#: (the search reads on past a batch whose own max timestamp is below the target, rarely far)
TIMESTAMP_FAULT_IN_UNITS = 8
#: units per step of max_timestamp's walk over a whole queue (when the record holding the maximum was deleted):
#: between steps the loop serves others, and each step's dropped entries are read back in the reader thread
MAX_TIMESTAMP_WALK_UNITS = 1024


class Shard:
    """One topic-queue: its ConsumeQueue and logical log start."""

    __slots__ = ("cq", "created_phys", "fixed", "log_start", "queue", "topic", "topic_b")

    def __init__(self, topic: str, queue: int, cq: ConsumeQueue, created_phys: int, log_start: int = 0) -> None:
        self.topic = topic
        self.topic_b = topic.encode()
        self.queue = queue
        self.cq = cq
        self.log_start = log_start
        self.created_phys = created_phys
        self.fixed = FIXED + len(self.topic_b)  # bytes of entry header before the batch


# append_run walks each partition's shard -> ConsumeQueue -> file chain; told the classes, the compiled kernel
# prefetches those objects a window of partitions at a time (a Produce into 1,000 partitions finds none cached)
clentry.plan_prefetch(Shard, ConsumeQueue, MappedFileQueue, MappedFile)


class StoreStats:
    """Put-message counters (RocketMQ's StoreStatsService, minus the rolling windows)."""

    #: latency bucket upper bounds in microseconds; the last bucket is everything above
    BOUNDS_US = (10, 50, 100, 500, 1_000, 5_000, 10_000, 50_000, 100_000, 500_000)

    def __init__(self, engine: FileEngine) -> None:
        self._engine = engine
        self.puts = 0  #: append calls that succeeded
        self.put_batches = 0
        self.put_bytes = 0
        self.put_failures = 0
        self.latency_buckets = [0] * (len(self.BOUNDS_US) + 1)
        self.max_latency_ns = 0

    def record(self, latency_ns: int, count: int = 1) -> None:
        """Count `count` puts that each took `latency_ns` (wall-clock time, the clock the store timestamps come
        from: one clock read per append serves both; a clock stepped back during an append counts it as fast)."""
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
        return self._engine.clog.max_offset - max(self._engine.dispatcher.dispatched, self._engine.clog.min_offset)

    def as_dict(self) -> dict:
        return {
            "puts": self.puts, "put_batches": self.put_batches, "put_bytes": self.put_bytes,
            "put_failures": self.put_failures, "max_latency_us": self.max_latency_us,
            "latency_us": {(f"<={b}" if i < len(self.BOUNDS_US) else f">{self.BOUNDS_US[-1]}"): n
                           for i, (b, n) in enumerate(zip(self.BOUNDS_US + (self.BOUNDS_US[-1],),
                                                          self.latency_buckets))},
            "dispatch_lag": self.dispatch_lag,
        }


_BOUNDS_NS = tuple(b * 1000 for b in StoreStats.BOUNDS_US)
_FIRST_BOUND_NS = _BOUNDS_NS[0]
#: AppendResult is a NamedTuple (mqk.store.adapter): `append` builds it with tuple.__new__ directly, a third of
#: the cost of its Python-level __new__ (its five fields, in order, are all it has)
_new_tuple = tuple.__new__


class FileEngine(StorageAdapter):
    name = "file"

    def __init__(self, config: StoreConfig, root: Path) -> None:
        super().__init__()
        self.config = config
        self.root = Path(root)
        self.clog = CommitLog(self.root / "commitlog", config.commitlog_segment_bytes)
        #: the CommitLog's segment list, read at every append (the list object is replaced at recovery, so it is
        #: looked up through its queue each time, never cached)
        self._clog_mfq = self.clog.mfq
        self.dispatcher = ReputMessageService()
        #: the key index (index/), filled by a dispatch hook; rebuilds its own tail at start
        self.index = IndexService(self.root / "index")
        #: the index's hook as registered (the bound method object in `dispatcher.hooks`; see _hooks_for)
        self._index_hook = self.index.dispatch
        self.dispatcher.hooks.append(self._index_hook)
        self.checkpoint = Checkpoint(self.root / "checkpoint")
        self.abort = AbortMarker(self.root / "abort")
        self.stats = StoreStats(self)
        self.flusher: FlushService | None = None
        self.offsets = None  # FileOffsetStore, opened at start
        self._shards: dict[tuple[str, int], Shard] = {}
        #: the same shards by topic, indexed by queue (append_many's run looks them up without building keys)
        self._queues: dict[str, list[Shard | None]] = {}
        self._topics: dict[str, dict] = {}  # name -> {"queues": n, "created": phys, "log_start": {q: off}}
        self._dirty_cqs: set[ConsumeQueue] = set()
        #: append_many's heads, written side by side for one pwritev: (head length, buffer, a slice per entry)
        self._staging: tuple[int, bytearray, list[memoryview]] = (0, bytearray(), [])
        #: one thread reading dropped CommitLog bytes back into the page cache for readers (see _stored)
        self._reader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mqk-fault-in")
        #: one thread for ConsumeQueue flushes and checkpoint writes (the CommitLog flusher has its own)
        self._io = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mqk-checkpoint")
        self._tasks: list[asyncio.Task] = []
        self._started = False
        self._closed = False
        self._running = False  # started and not closed: appends accepted
        self._sync = config.flush_mode == "sync"
        #: compacted shards' prefixes (mqk.store.file.compactlog): reads below their `upto` are served from there
        self._compacted: dict[tuple[str, int], CompactLog] = {}
        #: what the last recovery found, for tests and operators
        self.recovery_report: dict = {}

    # --- life cycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "consumequeue").mkdir(exist_ok=True)
        await asyncio.to_thread(self._recover)
        await asyncio.to_thread(self.index.recover, self.clog, self._shards)
        self._compacted = await asyncio.to_thread(open_compacted, self.root, list(self._shards))
        from mqk.store.offsets import FileOffsetStore

        self.offsets = FileOffsetStore(self.root / "offsets")
        self.flusher = FlushService(self.clog, self.config)
        self.flusher.start()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._checkpoint_loop()))
        self._started = True
        self._running = True

    async def close(self) -> None:
        self._running = False
        if self._closed or not self._started:
            self._closed = True
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("file store background task failed")
        try:
            await self.flusher.stop()
            await self.checkpoint_now(flush_all=True)
            if self.offsets is not None:
                await self.offsets.close()
        finally:
            self._io.shutdown(wait=True)
            self._reader.shutdown(wait=True)
            for shard in self._shards.values():
                shard.cq.close()
            for compacted in self._compacted.values():
                compacted.close()
            self.index.close()
            self.clog.close()
        self.abort.remove()

    def _recover(self) -> None:
        """Blocking start-up work: load metadata, segments and queues; replay; cut torn tails."""
        abnormal = self.abort.exists()
        self.checkpoint.load()
        self._load_meta()
        self.abort.create()
        self.clog.load()
        for topic, meta in self._topics.items():
            for q in range(meta["queues"]):
                shard = self._open_shard(topic, q, meta)
                shard.cq.load()
        files = self.clog.mfq.files
        report = {"abnormal": abnormal, "scan_start": 0, "end": 0, "entries": 0, "error": None, "torn_tail": False,
                  "repaired_queues": []}
        self.recovery_report = report
        if not files:
            for shard in self._shards.values():
                shard.cq.recover(0)
                self._fix_empty(shard)
            self.clog.mfq.prepare_next()
            return
        first = files[0].start_offset
        scan_start = files[max(0, len(files) - RECOVER_SEGMENTS)].start_offset
        if not self.checkpoint.loaded:
            scan_start = first
        elif self.checkpoint.safe_offset < scan_start:
            scan_start = max(first, self.checkpoint.safe_offset)
        report["scan_start"] = scan_start
        for shard in self._shards.values():
            shard.cq.recover(scan_start)
        broken: dict[Shard, int] = {}  # shard -> CommitLog offset its rebuild starts at
        n = 0
        for phys, entry, mf in self.clog.scan(scan_start):
            n += 1
            self._replay(phys, entry, mf, broken, scan_start)
        end = self.clog.scan_end
        report["entries"] = n
        report["end"] = end
        if self.clog.scan_error is not None:
            err = self.clog.scan_error
            # a torn tail is a bad last entry with nothing but zeros after it; anything after it means damage in
            # the middle of the log (we cut there too: the entries after it cannot be trusted to line up)
            torn = not self.clog.has_data_after(end + self.clog.claimed_size(end))
            report["error"] = str(err)
            report["torn_tail"] = torn
            if torn:
                log.warning("CommitLog: torn tail at %d (%s); cutting it", end, err)
            else:
                log.error("CommitLog damaged: %s; serving everything before %d and cutting the log there", err, end)
        self.clog.truncate(end)
        # data read back after a crash may sit only in the page cache: make it durable before building on it
        last = self.clog.mfq.last
        if last is not None:
            last.flushed = 0
        self.clog.flush()
        if broken:
            self._rebuild(broken, end)
            report["repaired_queues"] = sorted(f"{s.topic}-{s.queue}" for s in broken)
        for shard in self._shards.values():
            shard.cq.truncate_to_phys(end)
            self._fix_empty(shard)
            shard.cq.flush()
        self.dispatcher.dispatched = end
        try:
            self.checkpoint.store(end, end, _now_ms())
        except OSError as exc:
            # a full disk must not keep the broker from starting: the checkpoint on disk is the previous one,
            # whose offsets are below what was just recovered and flushed (the next start scans a little more);
            # the checkpoint loop writes a new one once there is room
            log.warning("checkpoint not written at start-up (%s): the previous one stands", exc)
        self.clog.mfq.prepare_next()
        if abnormal or self.clog.scan_error is not None:
            log.warning("file store recovered (abnormal=%s): replayed %d entries from %d, log ends at %d",
                        abnormal, n, scan_start, end)

    def _replay(self, phys: int, entry: tuple, mf, broken: dict, scan_start: int, only: dict | None = None) -> None:
        (_, size, queue_id, _flags, queue_offset, _phys, record_count, store_ts, max_ts, tags_code, topic,
         body_pos) = entry
        shard = self._shards.get((topic, queue_id))
        if shard is None or phys < shard.created_phys:
            return  # a deleted topic, or an earlier incarnation of this name
        if only is not None:
            if shard not in only or phys < only[shard]:
                return
        elif shard in broken:
            return
        cq = shard.cq
        if queue_offset < cq.end_offset:
            if only is None:
                log.error("recovery: %s-%d entry at %d has offset %d below the queue end %d; skipped",
                          topic, queue_id, phys, queue_offset, cq.end_offset)
            return
        if queue_offset > cq.end_offset and only is None:
            resume = cq.last_unit_end_phys()
            if resume < scan_start:
                # units for entries before the scan start are missing (damaged queue tail): rebuild later
                broken[shard] = max(resume, shard.created_phys, self.clog.min_offset)
                log.error("ConsumeQueue %s-%d is missing offsets %d..%d; rebuilding it from the CommitLog",
                          topic, queue_id, cq.end_offset, queue_offset - 1)
                return
            log.error("recovery: %s-%d has a gap at offsets %d..%d (entry at %d)", topic, queue_id,
                      cq.end_offset, queue_offset - 1, phys)
        body = mf.buf[body_pos: phys - mf.start_offset + size]
        self.dispatcher.dispatch(shard, phys, size, record_count, tags_code, store_ts, max_ts, queue_offset, None,
                                 body)

    def _rebuild(self, broken: dict, end: int) -> None:
        for shard, start in broken.items():
            shard.cq.recover(start)
        start = min(broken.values())
        for phys, entry, mf in self.clog.scan(start):
            if phys >= end:
                break
            self._replay(phys, entry, mf, {}, start, only=broken)

    def _fix_empty(self, shard: Shard) -> None:
        """A queue without units keeps its numbering from the metadata (everything before was deleted)."""
        if len(shard.cq) == 0 and shard.cq.end_offset < shard.log_start:
            shard.cq.end_offset = shard.log_start

    # --- metadata -------------------------------------------------------------------------------------

    def _meta_path(self) -> Path:
        return self.root / "queues.json"

    def _load_meta(self) -> None:
        try:
            doc = read_json(self._meta_path())
        except Corrupt as exc:
            log.error("file store metadata unreadable (%s); rebuilding it from consumequeue/", exc)
            doc = None
        topics = (doc or {}).get("topics")
        if not isinstance(topics, dict):
            topics = self._scan_cq_dirs()
        self._topics = {}
        for name, meta in topics.items():
            try:
                self._topics[str(name)] = {
                    "queues": int(meta["queues"]),
                    "created": int(meta.get("created", 0)),
                    "log_start": {int(k): int(v) for k, v in dict(meta.get("log_start", {})).items()},
                }
            except (KeyError, TypeError, ValueError):
                log.error("file store metadata for topic %r is malformed; ignoring it", name)

    def _scan_cq_dirs(self) -> dict:
        topics = {}
        base = self.root / "consumequeue"
        if base.is_dir():
            for tdir in base.iterdir():
                queues = [int(q.name) for q in tdir.iterdir() if q.name.isdigit()] if tdir.is_dir() else []
                if queues:
                    topics[tdir.name] = {"queues": max(queues) + 1, "created": 0}
        return topics

    def _meta_doc(self) -> dict:
        out = {}
        for name, meta in self._topics.items():
            out[name] = {"queues": meta["queues"], "created": meta["created"],
                         "log_start": {str(q): s for q, s in meta["log_start"].items() if s}}
        return {"version": 1, "topics": out}

    async def _save_meta(self) -> None:
        await asyncio.to_thread(atomic_write_json, self._meta_path(), self._meta_doc())

    def _open_shard(self, topic: str, q: int, meta: dict) -> Shard:
        cq = ConsumeQueue(self.root / "consumequeue" / topic / str(q), self.config.cq_units_per_file)
        shard = Shard(topic, q, cq, meta["created"], meta["log_start"].get(q, 0))
        self._shards[(topic, q)] = shard
        queues = self._queues.setdefault(topic, [])
        queues.extend([None] * (q + 1 - len(queues)))
        queues[q] = shard
        return shard

    # --- shards ---------------------------------------------------------------------------------------

    async def create_shards(self, topic: str, queue_count: int, config: TopicConfig) -> None:
        if queue_count < 1 or queue_count > 1 << 16:
            raise StorageError(f"queue count {queue_count} outside [1, 65536]")
        if not topic or len(topic.encode()) > 0xFFFF or "/" in topic or topic in (".", ".."):
            raise StorageError(f"topic name {topic!r} cannot name a directory")
        meta = self._topics.get(topic)
        changed = meta is None or queue_count > meta["queues"]
        if meta is None:
            meta = {"queues": 0, "created": self.clog.max_offset, "log_start": {}}
            self._topics[topic] = meta
        for q in range(meta["queues"], queue_count):
            shard = self._open_shard(topic, q, meta)
            shard.cq.dir.mkdir(parents=True, exist_ok=True)
        meta["queues"] = max(meta["queues"], queue_count)
        # the store's start names every topic it recovered again: that writes nothing (it may be a full disk)
        if changed or not self._meta_path().exists():
            await self._save_meta()
        await self.index.configure(topic, config)

    async def update_config(self, topic: str, config: TopicConfig) -> None:
        await self.index.configure(topic, config)  # index.keys

    async def delete_shards(self, topic: str) -> None:
        meta = self._topics.pop(topic, None)
        if meta is None:
            raise UnknownShard(f"unknown topic {topic!r}")
        self._queues.pop(topic, None)
        for q in range(meta["queues"]):
            shard = self._shards.pop((topic, q), None)
            if shard is not None:
                self._dirty_cqs.discard(shard.cq)
                shard.cq.close()
            compacted = self._compacted.pop((topic, q), None)
            if compacted is not None:
                compacted.close()
        await self._save_meta()
        await asyncio.to_thread(shutil.rmtree, self.root / "consumequeue" / topic, True)
        await asyncio.to_thread(shutil.rmtree, self.root / "compaction" / topic, True)

    def list_shards(self) -> dict[str, int]:
        return {name: meta["queues"] for name, meta in self._topics.items()}

    def _shard(self, topic: str, queue: int) -> Shard:
        shard = self._shards.get((topic, queue))
        if shard is None:
            raise UnknownShard(f"unknown shard {topic}-{queue}")
        return shard

    # --- append ---------------------------------------------------------------------------------------

    async def append(self, topic: str, queue: int, batches: Sequence[Buffer], *, tags_code: int = 0,
                     keys: Sequence[bytes] = (), log_append_time: bool = False) -> AppendResult:
        now = time_ns()  # the store timestamp and the latency's start: one clock read
        result, last = self._put(topic, queue, batches, tags_code, keys, log_append_time, now)
        if self.listeners:
            self._notify(topic, ((queue, result.last_offset + 1),))
        flusher = self.flusher
        if self._sync:
            await flusher.wait_flushed(last)
        elif last - flusher.flushed >= flusher.kick_bytes:
            flusher.kick()
        self.stats.record(time_ns() - now)
        return result

    async def append_many(self, topic: str, entries: Sequence[tuple[int, Sequence[Buffer]]], *,
                          log_append_time: bool = False) -> list[AppendResult | Exception]:
        """See StorageAdapter.append_many: every entry is written before one sync-flush wait covers them all.
        Entries of one batch each are written side by side with one pwritev (see _put_staged) when no dispatch
        hook has to see them; the others, and every entry of a LogAppendTime append, one by one (_put)."""
        now = time_ns()  # one store timestamp for the whole call
        out: list[AppendResult | Exception] = []
        grown: list[tuple[int, int]] = []  # (queue, new end offset) per written entry, for the listeners
        if len(entries) > 1 and not log_append_time and self._running and not self._hooks_for(topic, ()):
            last = self._put_staged(topic, entries, now, out, grown)
        else:
            last = -1
            for queue, batches in entries:
                last = self._put_one_of_many(topic, queue, batches, log_append_time, now, out, grown, last)
        if grown and self.listeners:
            self._notify(topic, grown)
        flusher = self.flusher
        if self._sync and last >= 0:
            try:
                await flusher.wait_flushed(last)
            except Exception as exc:  # noqa: BLE001 - nothing written here is known durable
                out = [exc if result.__class__ is AppendResult else result for result in out]
        elif last >= 0 and last - flusher.flushed >= flusher.kick_bytes:  # (nothing written: maybe not started)
            flusher.kick()
        self.stats.record(time_ns() - now, len(entries))
        return out

    def _put_one_of_many(self, topic: str, queue: int, batches: Sequence[Buffer], log_append_time: bool,
                         now_ns: int, out: list, grown: list, last: int) -> int:
        """An entry of append_many through _put: its answer (result or exception) into `out`, its queue's new end
        into `grown`; returns the CommitLog offset past the last entry written so far."""
        try:
            result, end = self._put(topic, queue, batches, 0, (), log_append_time, now_ns)
        except Exception as exc:  # noqa: BLE001 - that entry's answer, as its own append would raise it
            out.append(exc)
            return last
        out.append(result)
        grown.append((queue, result.last_offset + 1))
        return end

    def _put_staged(self, topic: str, entries: Sequence[tuple[int, Sequence[Buffer]]], now_ns: int, out: list,
                    grown: list) -> int:
        """append_many without dispatch hooks: runs of single-batch entries, each run staged, written with one
        pwritev and published by one kernel call (`clentry.append_run`): a Produce spread over many partitions pays
        one system call and no per-entry Python, not one call per partition. An entry that cannot join a run
        (several batches, a segment to roll, a ConsumeQueue block to reserve, a batch the kernel declines, a
        queue already in the run) goes through _put. A failed write fails every entry of its run and publishes
        nothing. Returns the CommitLog offset past the last entry written."""
        shards = self._queues.get(topic)
        if shards is None or entries.__class__ is not list:
            shards, entries = [], list(entries)  # every entry through _put, which says what is wrong
        store_ts = now_ns // 1_000_000
        topic_b = topic.encode()
        heads = self._staging_for(FIXED + len(topic_b) + 8, len(entries))[0]
        mfq = self._clog_mfq
        last = -1
        i, count = 0, len(entries)
        while i < count:
            files = mfq.files
            mf = files[-1] if files else None
            ran = 0
            if mf is not None:
                pos = mf.wrote
                ran, end_pos, failure = append_run(mf.fd, mf.start_offset, pos, mf.file_size, shards, entries, i,
                                                   heads, topic_b, store_ts, out, grown, AppendResult,
                                                   self._dirty_cqs)
            if ran:
                if failure is not None:
                    size = sum(FIXED + len(topic_b) + len(entries[j][1][0]) for j in range(i, i + ran))
                    out.extend([storage_error(failure, mf.path, size)] * ran)
                else:
                    mf.wrote = mf.committed = end_pos
                    last = self.dispatcher.dispatched = mf.start_offset + end_pos
                    st = self.stats
                    st.puts += ran
                    st.put_batches += ran
                    st.put_bytes += end_pos - pos
                i += ran
            else:
                queue, batches = entries[i]
                last = self._put_one_of_many(topic, queue, batches, False, now_ns, out, grown, last)
                i += 1
        return last

    def _staging_for(self, head_len: int, count: int) -> tuple[bytearray, list[memoryview]]:
        """A buffer for `count` heads of `head_len` bytes side by side, and a view of each slot (kept between
        calls: most requests name the same topics; up to STAGING_KEPT slots, so one request naming a huge number
        of partitions does not pin its buffers)."""
        have_len, heads, slots = self._staging
        if have_len != head_len or len(slots) < count:
            size = max(count, len(slots) if have_len == head_len else 0, 64)
            heads = bytearray(head_len * size)
            whole = memoryview(heads)
            slots = [whole[i * head_len:(i + 1) * head_len] for i in range(size)]
            if size <= STAGING_KEPT:
                self._staging = (head_len, heads, slots)
        return heads, slots

    def _put(self, topic: str, queue: int, batches: Sequence[Buffer], tags_code: int, keys: Sequence[bytes],
             log_append_time: bool, now_ns: int) -> tuple[AppendResult, int]:
        """An append up to (not including) the sync-flush wait, stamped with wall-clock time `now_ns`: (its result,
        CommitLog offset past it)."""
        # The hot path: kept flat on purpose (each attribute lookup and call is a measurable share of an append).
        shard = self._shards.get((topic, queue))
        if shard is None:
            raise UnknownShard(f"unknown shard {topic}-{queue}")
        if not self._running:
            raise StorageError("the file store is not running")
        store_ts = now_ns // 1_000_000
        cq = shard.cq
        done = None
        if len(batches) == 1 and not log_append_time:
            # Fast path: one batch, room in the current CommitLog segment and in the ConsumeQueue file's reserved
            # blocks. One kernel call checks the batch header and writes the entry and its unit (nothing if the
            # batch is not exactly one valid v2 batch: the general path below then says what is wrong).
            body = batches[0]
            size = shard.fixed + len(body)
            files = self._clog_mfq.files
            mf = files[-1] if files else None
            qfiles = cq.mfq.files
            qf = qfiles[-1] if qfiles else None
            if (mf is not None and qf is not None and size + BLANK_MIN <= mf.file_size - mf.wrote
                    and qf.wrote + UNIT <= qf.reserved):
                pos = mf.wrote
                qpos = qf.wrote
                base = cq.end_offset
                first_phys = mf.start_offset + pos
                try:
                    done = put_entry(mf.fd, pos, self.clog.head, shard.topic_b, queue, base, first_phys, store_ts,
                                     tags_code, body, qf.buf, qpos, cq.max_ts)
                except OSError as exc:
                    raise storage_error(exc, mf.path, size) from None
        if done is not None:
            size, span, cq.max_ts = done
            # positions move only now that the bytes are in place: the entry, then its unit, then the queue end
            mf.wrote = mf.committed = pos + size
            qf.wrote = qf.committed = qpos + UNIT
            end = cq.end_offset = base + span
            last = first_phys + size
            nparts = 1
            nbytes = size
            hooks = self.dispatcher.hooks
            # (_hooks_for, inlined)
            if hooks and (keys or len(hooks) > 1 or hooks[0] is not self._index_hook
                          or topic in self.index.keyed_topics):
                run_hooks(hooks, topic, queue, base, span, first_phys, size, store_ts, keys, body)
        else:
            base, end, first_phys, last, nparts, nbytes = self._append_general(
                shard, batches, store_ts, tags_code, keys, log_append_time)
        self.dispatcher.dispatched = last
        if cq.dirty_since_phys < 0:  # the first unflushed unit since this queue's last flush
            cq.dirty_since_phys = first_phys
            cq.dirty_since_ms = store_ts
            self._dirty_cqs.add(cq)
        st = self.stats
        st.puts += 1
        st.put_batches += nparts
        st.put_bytes += nbytes
        return _new_tuple(AppendResult, (base, end - 1, store_ts, shard.log_start, first_phys)), last

    def _append_general(self, shard: Shard, batches: Sequence[Buffer], store_ts: int, tags_code: int,
                        keys: Sequence[bytes], log_append_time: bool) -> tuple[int, int, int, int, int, int]:
        """Any append (several batches, log-append time, a segment or ConsumeQueue file to roll or reserve):
        validate everything first, then write entry by entry. Returns (base offset, end offset, first entry's
        physical offset, CommitLog offset past the last entry, batch count, bytes written)."""
        if len(batches) == 1:
            body = batches[0]
            try:
                hdr = parse_header(body)  # single-batch fast path of _validate
            except Corrupt:
                hdr = None
            if hdr is None or hdr[1] + 12 != len(body) or hdr[6] < 0 or hdr[12] < 0:
                parts = self._validate(batches)  # the slow path says what is wrong
            else:
                parts = ((body, hdr[6] + 1, hdr[8]),)
        else:
            parts = self._validate(batches)
        clog = self.clog
        cq = shard.cq
        queue = shard.queue
        cq_files = cq.mfq.files
        # the ConsumeQueue blocks the units go to must exist before the CommitLog is written: on a full disk
        # this refuses the whole append (StorageFull) instead of leaving an entry without its unit
        need = len(parts) * UNIT
        last_cq = cq_files[-1] if cq_files else None
        if last_cq is not None and last_cq.wrote + need > last_cq.reserved:
            last_cq.ensure_reserved(min(last_cq.file_size, last_cq.wrote + need))
        if last_cq is None or last_cq.file_size - last_cq.wrote < need:
            cq.mfq.reserve_next()
        topic_b = shard.topic_b
        hooks = self._hooks_for(shard.topic, keys)
        if log_append_time:
            stamped = []
            for body, span, _max_ts in parts:
                body = bytearray(body)
                recbatch.set_log_append_time(body, 0, store_ts)
                stamped.append((body, span, store_ts))
            parts = stamped
        mf = clog.current
        if len(parts) > 1 and mf is not None:
            total = sum(FIXED + len(topic_b) + len(body) for body, _span, _max_ts in parts)
            if total + BLANK_MIN <= mf.file_size - mf.wrote:
                return self._append_run(shard, parts, mf, total, store_ts, tags_code, keys, hooks)
        base = cq.end_offset
        first_phys = -1
        nbytes = 0
        for body, span, max_ts in parts:
            offset = cq.end_offset
            phys, size, _mf, _pos = clog.put(topic_b, queue, offset, store_ts, max_ts, tags_code, 0, span, body)
            if first_phys < 0:
                first_phys = phys
            cq.put(phys, size, span, tags_code, store_ts, max_ts, offset)
            if hooks:
                run_hooks(hooks, shard.topic, queue, offset, span, phys, size, store_ts, keys, body)
            nbytes += size
        return base, cq.end_offset, first_phys, phys + size, len(parts), nbytes

    def _append_run(self, shard: Shard, parts: list[tuple[Buffer, int, int]], mf, total: int, store_ts: int,
                    tags_code: int, keys: Sequence[bytes], hooks: Sequence) -> tuple[int, int, int, int, int, int]:
        """_append_general's batches when all of them fit the current segment (and their units the queue's
        reserved blocks, which the caller made sure of): their heads side by side, one pwritev for all
        (`clentry.write_entries`), then each entry's unit and hooks in order. A failed write publishes none."""
        cq = shard.cq
        queue = shard.queue
        topic_b = shard.topic_b
        head_len = shard.fixed + 8
        heads, slots = self._staging_for(head_len, len(parts))
        pos = mf.wrote
        phys = first_phys = mf.start_offset + pos
        offset = base = cq.end_offset
        placed = []
        for i, (body, span, max_ts) in enumerate(parts):
            size = clentry.encode_head(slots[i], topic_b, queue, offset, phys, store_ts, max_ts, tags_code, 0, span,
                                       body)
            placed.append((phys, size, span, max_ts, offset))
            phys += size
            offset += span
        try:
            write_entries(mf.fd, pos, heads, head_len, [body for body, _span, _max_ts in parts])
        except OSError as exc:
            raise storage_error(exc, mf.path, total) from None
        mf.wrote = mf.committed = pos + total
        for (body, _span, _max_ts), (phys, size, span, max_ts, offset) in zip(parts, placed):
            cq.put(phys, size, span, tags_code, store_ts, max_ts, offset)
            if hooks:
                run_hooks(hooks, shard.topic, queue, offset, span, phys, size, store_ts, keys, body)
        return base, cq.end_offset, first_phys, first_phys + total, len(parts), total

    def _hooks_for(self, topic: str, keys: Sequence[bytes]) -> Sequence:
        """The dispatch hooks an append must call. When the key index's hook is the only one, it has nothing to
        do for an entry without keys of a topic that does not index Kafka record keys (a call per append, a tenth
        of a small one's cost): it is skipped, and its checkpoint counts everything dispatched as considered
        (IndexService.snapshot). Any other hook sees every entry."""
        hooks = self.dispatcher.hooks
        if hooks and (keys or len(hooks) > 1 or hooks[0] is not self._index_hook
                      or topic in self.index.keyed_topics):
            return hooks
        return ()

    @staticmethod
    def _validate(batches: Sequence[Buffer]) -> list[tuple[Buffer, int, int]]:
        """(batch, offset span, max timestamp) for every batch; a buffer may hold several concatenated batches.
        Everything is checked before anything is written, so an append is all or nothing."""
        parse = recbatch.parse_header
        out = []
        for buf in batches:
            n = len(buf)
            pos = 0
            while pos < n:
                try:
                    hdr = parse(buf, pos)
                except Corrupt as exc:
                    raise InvalidRecord(f"not a record batch v2: {exc}") from None
                size = hdr[1] + 12
                span = hdr[6] + 1
                if size < BATCH_HEADER or size > n - pos:
                    raise InvalidRecord(f"record batch length {hdr[1]} does not match the {n - pos} bytes given")
                if span <= 0 or hdr[12] < 0:
                    raise InvalidRecord(f"record batch with last offset delta {hdr[6]}, count {hdr[12]}")
                if pos == 0 and size == n:
                    out.append((buf, span, hdr[8]))
                else:
                    out.append((memoryview(buf)[pos: pos + size], span, hdr[8]))
                pos += size
        if not out:
            raise InvalidRecord("no record batch to append")
        return out

    # --- reads ----------------------------------------------------------------------------------------

    def _units_from(self, cq: ConsumeQueue, index: int):
        """Yield unit tuples from `index` to the end, walking each mapped file directly."""
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
            while pos + UNIT <= mf.wrote:
                yield unpack(buf, pos)
                pos += UNIT
            i += 1
            if i < len(files):
                at = files[i].start_offset

    async def _stored(self, shard: Shard, units: list[tuple]) -> list[StoredBatch]:
        """The stored batches of ConsumeQueue `units` (in CommitLog order), as views of the CommitLog. When the
        first of them lies where the flusher dropped the page cache (FlushService.cache_from), their entries are
        read back in a worker thread first: touching them through the mapping on the event loop would stall
        every connection on disk reads, one page fault at a time. A segment deleted meanwhile (retention) ends
        the list where its first entry would have been."""
        flusher = self.flusher
        if flusher is None or units[0][0] >= flusher.cache_from:  # (no await on the hot path: cached)
            return [self._batch(shard, unit) for unit in units]
        await self._read_back(units)
        out = []
        for unit in units:
            try:
                out.append(self._batch(shard, unit))
            except OutOfBounds:
                break
        return out

    async def _read_back(self, units: list[tuple]) -> None:
        """Read the entries of ConsumeQueue `units` (in CommitLog order) into the page cache in the reader thread
        (CommitLog.fault_in), for a caller that found the first below the flusher's drop point: its views of
        them then find their pages cached, and a segment deleted meanwhile is the caller's to notice."""
        await asyncio.get_running_loop().run_in_executor(self._reader, self.clog.fault_in,
                                                         [(unit[0], unit[1]) for unit in units])

    async def _fault_in_at(self, offsets: Iterable[int]) -> None:
        """The same for entries known by where they start (a client's message id, the key index's hits): those
        below the drop point are read back in the reader thread, their sizes read there too. Any offset may be
        stale; the caller's own checks, made after this, decide what is an entry."""
        flusher = self.flusher
        if flusher is None:
            return
        dropped = sorted(phys for phys in offsets if phys < flusher.cache_from)
        if dropped:
            await asyncio.get_running_loop().run_in_executor(self._reader, self.clog.fault_in_at, dropped)

    def _batch(self, shard: Shard, unit: tuple) -> StoredBatch:
        phys, size, count, tags, store_ts, _running_max, base = unit
        data = self.clog.body_view(phys, size, len(shard.topic_b))
        return StoredBatch(base, count, data, store_ts, _I64.unpack_from(data, 35)[0], tags, phys)

    async def read(self, topic: str, queue: int, offset: int, max_bytes: int) -> ReadResult:
        shard = self._shard(topic, queue)
        cq = shard.cq
        start, end = shard.log_start, cq.end_offset
        if offset < start or offset > end:
            raise OffsetOutOfRange(offset, start, end)
        batches: list[StoredBatch] = []
        if offset == end:
            return ReadResult(batches, start, end)
        total = 0
        if self._compacted:
            compacted = self._compacted.get((topic, queue))
            if compacted is not None and offset < compacted.upto:  # a compacted prefix answers below its upto
                batches = compacted.read(offset, max_bytes)
                total = sum(len(b.data) for b in batches)
                offset = compacted.upto
                if total >= max_bytes or offset >= end:
                    return ReadResult(batches, start, end)
        fixed = shard.fixed
        units = []
        for unit in self._units_from(cq, cq.search_offset(offset)):
            n = unit[1] - fixed
            if (batches or units) and total + n > max_bytes:
                break
            units.append(unit)
            total += n
            if total >= max_bytes:
                break
        if units:
            batches.extend(await self._stored(shard, units))
        return ReadResult(batches, start, end)

    async def read_by_tags(self, topic: str, queue: int, offset: int, tags_codes: Iterable[int],
                           max_batches: int) -> ReadResult:
        """Filters on the ConsumeQueue's tags codes: non-matching batches are never read from the CommitLog."""
        shard = self._shard(topic, queue)
        cq = shard.cq
        start, end = shard.log_start, cq.end_offset
        if offset < start or offset > end:
            raise OffsetOutOfRange(offset, start, end)
        wanted = set(tags_codes)
        batches: list[StoredBatch] = []
        if offset == end or max_batches <= 0 or not wanted:
            return ReadResult(batches, start, end)
        compacted = self._compacted.get((topic, queue)) if self._compacted else None
        if compacted is not None and offset < compacted.upto:
            batches = compacted.read(offset, 1 << 62, wanted, max_batches)
            offset = compacted.upto
        units = []
        for unit in self._units_from(cq, cq.search_offset(offset)):
            if len(batches) + len(units) >= max_batches:
                break
            if unit[3] in wanted:
                units.append(unit)
        if units:
            batches.extend(await self._stored(shard, units))
        return ReadResult(batches, start, end)

    async def read_by_key(self, topic: str, key: bytes, max_count: int, begin_ms: int = 0,
                          end_ms: int = 1 << 62) -> list[tuple[int, StoredBatch]]:
        """Through the key index (index.py), each hit checked against its CommitLog entry; newest first. The
        first `max_count` hits are read back off the loop first if their pages were dropped (_fault_in_at)."""
        if topic not in self._topics:
            raise UnknownShard(f"unknown topic {topic!r}")
        first = list(islice(self.index.candidates(topic, key, begin_ms, end_ms), max(0, max_count)))
        await self._fault_in_at(first)
        candidates: Iterable[int] = first
        if len(first) == max_count:
            # past those, a new walk of the index (it may have grown meanwhile), taken only if some hit fails its
            # check; fewer than max_count hits were all the index had
            taken = set(first)
            candidates = chain(first, (phys for phys in self.index.candidates(topic, key, begin_ms, end_ms)
                                       if phys not in taken))
        return self.index.find(self.clog, self._shards, topic, key, max_count, begin_ms, end_ms, candidates)

    async def read_at(self, physical_offset: int) -> tuple[str, int, StoredBatch] | None:
        """The CommitLog entry at `physical_offset`, CRC checked, if it is still served (index.live_entry: the
        same rules the key index applies to its hits). Below a shard's compacted prefix the entry is not what
        readers get any more (the compaction log is), so it does not count either."""
        await self._fault_in_at((physical_offset,))
        found = live_entry(self.clog, self._shards, physical_offset, verify=True)
        if found is None or not self._compacted:
            return found
        compacted = self._compacted.get((found[0], found[1]))
        if compacted is not None and found[2].base_offset < compacted.upto:
            return None
        return found

    async def delete_before(self, topic: str, queue: int, offset: int) -> int:
        shard = self._shard(topic, queue)
        end = shard.cq.end_offset
        if offset > end or offset < 0:
            raise OffsetOutOfRange(offset, shard.log_start, end)
        if offset <= shard.log_start:
            return shard.log_start
        shard.log_start = offset
        self._topics[topic]["log_start"][queue] = offset
        await self._save_meta()
        return shard.log_start

    async def replace_range(self, topic: str, queue: int, start: int, end: int, batches: Sequence[Buffer]) -> None:
        """Compaction's rewrite: into the shard's own compaction log (compactlog.py), never the shared CommitLog."""
        from mqk.store.file.compactlog import replace_range

        await replace_range(self, self._shard(topic, queue), start, end, batches)

    def log_start_offset(self, topic: str, queue: int) -> int:
        return self._shard(topic, queue).log_start

    def end_offset(self, topic: str, queue: int) -> int:
        return self._shard(topic, queue).cq.end_offset

    def offset_bounds_many(self, topic: str, queues: Sequence[int]) -> list[tuple[int, int] | None]:
        shards = self._queues.get(topic, ())
        count = len(shards)
        bounds: list[tuple[int, int] | None] = []
        for queue in queues:
            shard = shards[queue] if 0 <= queue < count else None
            bounds.append(None if shard is None else (shard.log_start, shard.cq.end_offset))
        return bounds

    async def offset_for_timestamp(self, topic: str, queue: int, timestamp: int) -> tuple[int, int] | None:
        """Bisect the ConsumeQueue's running max timestamps, then find the record inside the batch (decoding,
        and decompressing if needed, only that one batch; the same resolution as the other engines). The
        batches the search most likely reads are read back off the loop first if their pages were dropped."""
        shard = self._shard(topic, queue)
        cq = shard.cq
        flusher = self.flusher
        if flusher is not None and shard.log_start < cq.end_offset:
            # where the search below starts (but for a compacted prefix, which answers from its own log)
            first = max(cq.search_timestamp(timestamp), cq.search_offset(shard.log_start))
            units = list(islice(self._units_from(cq, first), TIMESTAMP_FAULT_IN_UNITS))
            if units and units[0][0] < flusher.cache_from:
                await self._read_back(units)
        return self._offset_for_timestamp(topic, queue, timestamp)

    def _offset_for_timestamp(self, topic: str, queue: int, timestamp: int) -> tuple[int, int] | None:
        shard = self._shard(topic, queue)
        cq = shard.cq
        if shard.log_start >= cq.end_offset:
            return None
        floor = shard.log_start
        compacted = self._compacted.get((topic, queue)) if self._compacted else None
        if compacted is not None and floor < compacted.upto:  # below upto the compacted prefix answers
            found = compacted.offset_for_timestamp(timestamp, floor)
            if found is not None:
                return found
            floor = compacted.upto
            if floor >= cq.end_offset:
                return None
        first = max(cq.search_timestamp(timestamp), cq.search_offset(floor))
        view = self.clog.body_view
        tlen = len(shard.topic_b)
        for unit in self._units_from(cq, first):
            data = view(unit[0], unit[1], tlen)
            # the unit holds the running max; the batch's own max says whether it can hold a match
            if _I64.unpack_from(data, 35)[0] < timestamp:
                continue
            found = first_record_at_or_after(data, timestamp, shard.log_start)
            if found is not None:
                return found
        return None

    async def max_timestamp(self, topic: str, queue: int) -> tuple[int, int] | None:
        """The first record carrying the queue's largest timestamp (its last unit's running max)."""
        shard = self._shard(topic, queue)
        cq = shard.cq
        if shard.log_start >= cq.end_offset or len(cq) == 0:
            return None
        found = await self.offset_for_timestamp(topic, queue, cq.unit(cq.max_unit - 1)[5])
        if found is not None:
            return found
        # the record holding the maximum lies before the log start: the largest among what remains
        best = None
        if (topic, queue) in self._compacted:  # part of it lives in the compacted prefix: walk through read()
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
            units = list(islice(self._units_from(cq, index), MAX_TIMESTAMP_WALK_UNITS))
            if not units:
                return best
            index += len(units)
            batches = await self._stored(shard, units)  # (dropped pages read back off the loop)
            await asyncio.sleep(0)  # a long queue: the walk must not hold the loop from end to end
            if self._shards.get((topic, queue)) is not shard:
                raise UnknownShard(f"{topic}-{queue} was deleted during the lookup")
            best = max_retained_timestamp(batches, shard.log_start, best)  # (the log start as it is now)

    # --- background: ConsumeQueue flush + checkpoint ---------------------------------------------------

    async def _checkpoint_loop(self) -> None:
        interval = self.config.checkpoint_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.checkpoint_now()
            except (OSError, StorageError) as exc:
                log.error("file store checkpoint failed: %s", exc)

    async def checkpoint_now(self, flush_all: bool = False) -> None:
        """Flush the ConsumeQueues that are due and the CommitLog, then record the safe offset (blocking work off
        the loop). A queue is due with `cq_flush_least_pages` unflushed pages or once its oldest unflushed unit is
        `cq_flush_max_delay_ms` old (RocketMQ's least-pages rule: a thousand queues with a unit or two each must
        not cost a thousand msyncs, and journal commits, every second); the rest keep the safe offset at their
        oldest unflushed unit. `flush_all` flushes every queue, due or not (close, and tests that need it now)."""
        # taken on the loop thread, where appends happen: every unit of an entry below `safe` is in a queue
        # flushed now (or by an earlier checkpoint)
        safe = self.dispatcher.dispatched
        if flush_all:
            due = [shard.cq for shard in self._shards.values()]
            waiting: set[ConsumeQueue] = set()
        else:
            least_bytes = self.config.cq_flush_least_pages * 4096
            oldest_ms = _now_ms() - self.config.cq_flush_max_delay_ms
            due = []
            waiting = set()
            for cq in self._dirty_cqs:
                if cq.dirty_since_ms <= oldest_ms or cq.mfq.dirty_bytes() >= least_bytes:
                    due.append(cq)
                else:
                    waiting.add(cq)
                    if cq.dirty_since_phys < safe:
                        safe = cq.dirty_since_phys
        marks = [(cq, cq.dirty_since_phys, cq.dirty_since_ms) for cq in due]
        for cq in due:
            cq.dirty_since_phys = -1  # a unit written from here on marks the queue dirty again
        self._dirty_cqs = waiting
        try:
            await asyncio.get_running_loop().run_in_executor(self._io, self._flush_and_store, safe, due)
        except BaseException:
            # not known flushed: the queues stay dirty since their oldest unflushed unit, for the next checkpoint
            for cq, since_phys, since_ms in marks:
                if since_phys >= 0 and (cq.dirty_since_phys < 0 or since_phys < cq.dirty_since_phys):
                    cq.dirty_since_phys, cq.dirty_since_ms = since_phys, since_ms
                if cq.dirty_since_phys >= 0:
                    self._dirty_cqs.add(cq)
            raise
        # on the loop, where the index is written; every entry dispatched so far was shown to the index's hook or
        # had nothing for it (_hooks_for)
        snap = self.index.snapshot(self.clog.min_offset, self.dispatcher.dispatched)
        await asyncio.get_running_loop().run_in_executor(self._io, self.index.store_checkpoint, snap)

    def _flush_and_store(self, safe: int, dirty: list[ConsumeQueue]) -> None:
        self._flush_queues(dirty)
        flushed = self.clog.flush()
        if self.flusher is not None:
            self.flusher.note_flushed(flushed)
        self.checkpoint.store(min(safe, flushed), flushed, _now_ms())

    @staticmethod
    def _flush_queues(queues: list[ConsumeQueue]) -> None:
        """Make the queues' units durable. An fdatasync per file costs a journal commit each (1,000 queues with a
        page of units each: 150-200 ms wall and 30-80 ms of the machine's CPU on ext4 here); from
        SYNCFS_MIN_QUEUES queues on one filesystem, one syncfs(2) covers them all (10-40 ms wall, 10-20 ms CPU).
        A queue whose files are on another filesystem, or a platform without syncfs, gets its own fdatasync."""
        by_device: dict[int, list[tuple[ConsumeQueue, tuple]]] = {}
        if len(queues) >= SYNCFS_MIN_QUEUES:
            for cq in queues:
                marks = cq.mfq.sync_marks()
                if not marks[0]:
                    continue  # only directories to sync: its own flush does that
                devices = {mf.device for mf, _wrote in marks[0]}
                for directory in marks[1]:  # new entries live in these directories, which must be synced too
                    try:
                        devices.add(os.stat(directory).st_dev)
                    except OSError:
                        devices.add(-1)  # gone or unreadable: left to the queue's own flush
                if len(devices) == 1:
                    by_device.setdefault(devices.pop(), []).append((cq, marks))
        synced: set[ConsumeQueue] = set()
        for group in by_device.values():
            if len(group) < SYNCFS_MIN_QUEUES:
                continue
            first_marks = group[0][1]
            try:
                # a file of this filesystem: syncfs syncs the filesystem it is on
                with first_marks[0][0][0].descriptor() as some_fd:
                    done = syncfs(some_fd)
            except OSError as exc:  # that file deleted meanwhile: each queue flushes its own below
                log.debug("syncfs through %s failed: %s", first_marks[0][0][0].path, exc)
                done = False
            if done:
                for cq, marks in group:
                    cq.mfq.note_synced(marks)
                    synced.add(cq)
        for cq in queues:
            if cq not in synced:
                cq.flush()

    # --- group offsets --------------------------------------------------------------------------------

    async def commit_offsets(self, group: str, offsets: dict[tuple[str, int], GroupOffset]) -> None:
        await self.offsets.commit_offsets(group, offsets)

    def fetch_offsets(self, group: str) -> dict[tuple[str, int], GroupOffset]:
        return self.offsets.fetch_offsets(group)

    async def delete_offsets(self, group: str, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        await self.offsets.delete_offsets(group, partitions)

    def list_offset_groups(self) -> list[str]:
        return self.offsets.list_offset_groups()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


__all__ = ["FileEngine", "Shard", "StoreStats"]
