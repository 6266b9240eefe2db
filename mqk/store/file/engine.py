"""FileEngine: the RocketMQ-style file store behind the StorageAdapter seam.

Owns everything under its root directory:
  commitlog/                 one CommitLog for every topic and queue (commitlog.py)
  consumequeue/<topic>/<q>/  one ConsumeQueue per shard (consumequeue.py)
  queues.json                which shards exist, each topic's creation point in the CommitLog, log start offsets
                             (shards.py)
  offsets/                   committed group offsets (mqk.store.offsets.FileOffsetStore)
  index/                     the key index for read_by_key, with its own checkpoint (index.py)
  compaction/                compacted shards' prefixes (compactlog.py)
  checkpoint, abort          recovery bookkeeping (checkpoint.py)

This module is the façade: it builds the parts and routes the StorageAdapter calls to the one that owns each job,
as Kafka splits its log layer:
  queue_table.py / shards.py   every queue's positions in one flat table; the shards and queues.json
  append.py                    the one append pipeline: plan, write, publish (the only place positions move)
  reader.py                    reads by offset, tags, key, CommitLog address and timestamp
  recovery.py                  what a start does before anything is served
  checkpoint.py                the ConsumeQueue flush policy and the checkpoint
  flush.py                     the CommitLog's flusher (async and sync flush, group commit, page-cache drops)
  reclaim.py / compactlog.py   space reclaim and compaction, through `reclaim` and `replace_range`

Decisions: each batch of an append is its own CommitLog entry and ConsumeQueue unit, and its offset span is
last_offset_delta + 1 (so compacted batches keep their offsets). A topic re-created under an old name starts at
offset 0; entries of the old incarnation are told apart by the CommitLog offset at which the topic was created.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mqk.config import StoreConfig, TopicConfig
from mqk.errors import InvalidShardName, NotMaster, OffsetOutOfRange
from mqk.store.adapter import (
    AppendResult,
    Buffer,
    GroupOffset,
    ReadResult,
    StorageAdapter,
    StoredBatch,
    check_shard_count,
)
from mqk.store.file import compactlog, reclaim, replica
from mqk.store.file.append import AppendPipeline, FaultHook, StoreStats
from mqk.store.file.checkpoint import AbortMarker, Checkpoint, CheckpointService
from mqk.store.file.commitlog import CommitLog
from mqk.store.file.compactlog import CompactLog, open_compacted
from mqk.store.file.consumequeue import ConsumeQueue
from mqk.store.file.dispatch import ReputMessageService
from mqk.store.file.flush import FlushService
from mqk.store.file.index import IndexService
from mqk.store.file.queue_table import QueueTable
from mqk.store.file.reader import LogReader
from mqk.store.file.recovery import Recovery
from mqk.store.file.shards import Shard, ShardRegistry
from mqk.store.offsets import FileOffsetStore

time_ns = time.time_ns
log = logging.getLogger(__name__)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class FileEngine(StorageAdapter):
    name = "file"
    rewrite_copies_prefix = True

    def __init__(self, config: StoreConfig, root: Path) -> None:
        super().__init__()
        self.config = config
        self.root = Path(root)
        self.clog = CommitLog(self.root / "commitlog", config.commitlog_segment_bytes)
        self.dispatcher = ReputMessageService()
        #: the key index (index/), filled by a dispatch hook; rebuilds its own tail at start
        self.index = IndexService(self.root / "index")
        index_hook = self.index.dispatch  # (one bound method object: the pipeline knows it by identity)
        self.dispatcher.hooks.append(index_hook)
        self.table = QueueTable()
        self.registry = ShardRegistry(self.root, self.table, config.cq_units_per_file)
        self.checkpoint = Checkpoint(self.root / "checkpoint")
        self.abort = AbortMarker(self.root / "abort")
        dirty: set[ConsumeQueue] = set()
        self.appender = AppendPipeline(
            self.clog,
            self.registry,
            self.table,
            self.dispatcher,
            self.index,
            index_hook,
            dirty,
            self.listeners,
            self._notify,
        )
        self.stats: StoreStats = self.appender.stats
        #: compacted shards' prefixes (compactlog.py), shared with the reader
        self._compacted: dict[tuple[str, int], CompactLog] = {}
        self.reader = LogReader(self.clog, self.registry, self.index, self._compacted)
        self.checkpoints = CheckpointService(
            config, self.checkpoint, self.clog, self.registry, self.dispatcher, self.index, dirty, _now_ms
        )
        self.recovery = Recovery(self.clog, self.registry, self.dispatcher, self.checkpoint, self.abort, _now_ms)
        self.flusher: FlushService | None = None
        #: the replica's writer: the master's CommitLog bytes in, at the same offsets
        self.replica_log = replica.ReplicaLog(self)
        self.offsets: FileOffsetStore | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._closed = False
        self._sync = config.flush_mode == "sync"

    # --- life cycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "consumequeue").mkdir(exist_ok=True)
        await asyncio.to_thread(self.recovery.run)
        await asyncio.to_thread(self.index.recover, self.clog, self.registry.shards)
        self._compacted.update(await asyncio.to_thread(open_compacted, self.root, list(self.registry.shards)))
        self.offsets = FileOffsetStore(self.root / "offsets")
        self.flusher = self.reader.flusher = self.checkpoints.flusher = FlushService(self.clog, self.config)
        self.flusher.start()
        self._tasks.append(asyncio.get_running_loop().create_task(self.checkpoints.run()))
        self._started = True
        self.appender.running = self.appender.refusal is None

    async def close(self) -> None:
        self.appender.running = False
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
            assert self.flusher is not None
            await self.flusher.stop()
            await self.checkpoints.checkpoint_now(flush_all=True)
            if self.offsets is not None:
                await self.offsets.close()
        finally:
            self.checkpoints.close()
            self.reader.close()
            self.registry.close()
            for compacted in self._compacted.values():
                compacted.close()
            self.index.close()
            self.clog.close()
        self.abort.remove()

    # --- replication (replica.py) ----------------------------------------------------------------------------

    def set_writable(self, writable: bool) -> None:
        """Take local appends (a master, a broker on its own) or refuse them with NotMaster (a replica: its
        CommitLog takes only its master's bytes, through `replica_log`)."""
        self.appender.refusal = None if writable else NotMaster("this broker is a replica: it takes no appends")
        self.appender.running = writable and self._started and not self._closed

    @property
    def writable(self) -> bool:
        return self.appender.refusal is None

    @property
    def log_end(self) -> int:
        """The CommitLog's end: where the next entry goes."""
        return self.clog.max_offset

    @property
    def log_start(self) -> int:
        return self.clog.min_offset

    def read_log(self, offset: int, max_bytes: int) -> bytes:
        """The CommitLog's bytes from `offset` (replica.read_log)."""
        return replica.read_log(self, offset, max_bytes)

    def committed_end(self, topic: str, queue: int, commit: int, end: int) -> int:
        """The queue's offset below which every entry lies below CommitLog offset `commit` (`end`: its end offset,
        the answer when everything does); a reader on a replicated group stops there (the high watermark)."""
        shard = self.registry.shards.get((topic, queue))
        if shard is None:
            return end
        return min(end, shard.cq.offset_at_phys(commit))

    def truncate_log(self, end: int) -> int:
        """Cut the CommitLog and what is built on it back to `end` (replica.truncate_log); blocking."""
        return replica.truncate_log(self, end)

    def restart_log(self, start: int, queue_starts: dict[tuple[str, int], int]) -> int:
        """Empty the CommitLog to copy the master's from `start` (replica.restart_log); blocking."""
        return replica.restart_log(self, start, queue_starts)

    def adopt_queue_starts(self, queue_starts: dict[tuple[str, int], int]) -> None:
        """An empty replica copying its master's log from a later start: where its queues start
        (replica.adopt_queue_starts); blocking."""
        replica.adopt_queue_starts(self, queue_starts)

    def log_starts(self) -> list[tuple[str, int, int]]:
        """(topic, queue, log start) of every queue whose log start is above 0: what a master tells its replicas,
        whose queues must start where its own do (DeleteRecords and retention move them here alone)."""
        return [(s.topic, s.queue, s.log_start) for s in self.registry.shards.values() if s.log_start > 0]

    async def adopt_log_starts(self, starts: Sequence[tuple[str, int, int]]) -> None:
        """A replica: move each queue's log start up to its master's (no further than the queue's end here: what
        it has not received yet, it will receive from its master with the next starts)."""
        registry = self.registry
        moved = False
        for topic, queue, start in starts:
            shard = registry.shards.get((topic, queue))
            if shard is None:
                continue
            target = min(start, shard.cq.end_offset)
            if target > shard.log_start:
                registry.set_log_start(shard, target)
                moved = True
        if moved:
            await registry.save_meta()

    def queue_starts_at(self, phys: int) -> list[tuple[str, int, int]]:
        """(topic, queue, the first offset whose entry does not end at or before CommitLog offset `phys`) of every
        queue: where each queue of a replica that copies this log from `phys` starts."""
        return [(s.topic, s.queue, s.cq.offset_at_phys(phys)) for s in self.registry.shards.values()]

    @property
    def running(self) -> bool:
        """Started and not closed: appends are accepted."""
        return self.appender.running

    @property
    def recovery_report(self) -> dict[str, Any]:
        return self.recovery.report

    async def checkpoint_now(self, flush_all: bool = False) -> None:
        """Flush the ConsumeQueues that are due and the CommitLog, then record the safe offset (checkpoint.py)."""
        await self.checkpoints.checkpoint_now(flush_all)

    # --- shards ---------------------------------------------------------------------------------------------

    async def create_shards(self, topic: str, queue_count: int, config: TopicConfig) -> None:
        check_shard_count(queue_count)
        if not topic or len(topic.encode()) > 0xFFFF or "/" in topic or topic in (".", ".."):
            raise InvalidShardName(f"topic name {topic!r} cannot name a directory")
        _meta, changed = self.registry.add_topic(topic, queue_count, self.clog.max_offset)
        changed = replica.start_pending_queues(self, topic) or changed
        # the store's start names every topic it recovered again: that writes nothing (it may be a full disk)
        if changed or not self.registry.meta_path.exists():
            await self.registry.save_meta()
        await self.index.configure(topic, config)

    async def update_config(self, topic: str, config: TopicConfig) -> None:
        await self.index.configure(topic, config)  # index.keys

    async def delete_shards(self, topic: str) -> None:
        for shard in self.registry.drop_topic(topic):
            self.appender.dirty.discard(shard.cq)
            compacted = self._compacted.pop((topic, shard.queue), None)
            if compacted is not None:
                compacted.close()
        await self.registry.save_meta()
        await asyncio.to_thread(shutil.rmtree, self.root / "consumequeue" / topic, True)
        await asyncio.to_thread(shutil.rmtree, self.root / "compaction" / topic, True)

    def list_shards(self) -> dict[str, int]:
        return self.registry.queue_counts()

    # --- append ---------------------------------------------------------------------------------------------

    async def append(
        self,
        topic: str,
        queue: int,
        batches: Sequence[Buffer],
        *,
        tags_code: int = 0,
        keys: Sequence[bytes] = (),
        log_append_time: bool = False,
    ) -> AppendResult:
        now = time_ns()  # the store timestamp and the latency's start: one clock read
        answers, last = self.appender.append(topic, [(queue, batches)], tags_code, keys, log_append_time, now)
        result = answers[0]
        if result.__class__ is not AppendResult:
            raise result  # type: ignore[misc]  # (an Exception: the entry's error)
        flusher = self.flusher
        assert flusher is not None
        if self._sync:
            await flusher.wait_flushed(last)
        elif last - flusher.flushed >= flusher.kick_bytes:
            flusher.kick()
        self.stats.record(time_ns() - now)
        return result

    async def append_many(
        self, topic: str, entries: Sequence[tuple[int, Sequence[Buffer]]], *, log_append_time: bool = False
    ) -> list[AppendResult | Exception]:
        """See StorageAdapter.append_many: every entry goes through the one pipeline (runs of entries written with
        one pwritev each), then one sync-flush wait covers them all."""
        now = time_ns()  # one store timestamp for the whole call
        out, last = self.appender.append(topic, entries, 0, (), log_append_time, now)
        flusher = self.flusher
        if last >= 0 and flusher is not None:  # (nothing written: maybe not started)
            if self._sync:
                try:
                    await flusher.wait_flushed(last)
                except Exception as exc:  # noqa: BLE001 - nothing written here is known durable
                    out = [exc if result.__class__ is AppendResult else result for result in out]
            elif last - flusher.flushed >= flusher.kick_bytes:
                flusher.kick()
        self.stats.record(time_ns() - now, len(entries))
        return out

    @property
    def fault(self) -> FaultHook | None:
        """Test hook: called between the append pipeline's steps (append.STAGE_*)."""
        return self.appender.fault

    @fault.setter
    def fault(self, hook: FaultHook | None) -> None:
        self.appender.fault = hook

    # --- reads ----------------------------------------------------------------------------------------------

    async def read(self, topic: str, queue: int, offset: int, max_bytes: int) -> ReadResult:
        return await self.reader.read(topic, queue, offset, max_bytes)

    async def read_by_tags(
        self, topic: str, queue: int, offset: int, tags_codes: Iterable[int], max_batches: int
    ) -> ReadResult:
        return await self.reader.read_by_tags(topic, queue, offset, tags_codes, max_batches)

    async def read_by_key(
        self, topic: str, key: bytes, max_count: int, begin_ms: int = 0, end_ms: int = 1 << 62
    ) -> list[tuple[int, StoredBatch]]:
        return await self.reader.read_by_key(topic, key, max_count, begin_ms, end_ms)

    async def read_at(self, physical_offset: int) -> tuple[str, int, StoredBatch] | None:
        return await self.reader.read_at(physical_offset)

    async def offset_for_timestamp(self, topic: str, queue: int, timestamp: int) -> tuple[int, int] | None:
        return await self.reader.offset_for_timestamp(topic, queue, timestamp)

    async def max_timestamp(self, topic: str, queue: int) -> tuple[int, int] | None:
        return await self.reader.max_timestamp(topic, queue)

    async def range_bytes(self, topic: str, queue: int, start: int, end: int) -> int:
        return self.reader.range_bytes(topic, queue, start, end)

    def log_start_offset(self, topic: str, queue: int) -> int:
        return self.registry.get(topic, queue).log_start

    def end_offset(self, topic: str, queue: int) -> int:
        return self.registry.get(topic, queue).cq.end_offset

    def offset_bounds_many(self, topic: str, queues: Sequence[int]) -> list[tuple[int, int] | None]:
        shards = self.registry.by_topic.get(topic, ())
        count = len(shards)
        bounds: list[tuple[int, int] | None] = []
        for queue in queues:
            shard = shards[queue] if 0 <= queue < count else None
            bounds.append(None if shard is None else (shard.log_start, shard.cq.end_offset))
        return bounds

    # --- log life cycle -------------------------------------------------------------------------------------

    async def delete_before(self, topic: str, queue: int, offset: int) -> int:
        shard = self.registry.get(topic, queue)
        end = shard.cq.end_offset
        if offset > end or offset < 0:
            raise OffsetOutOfRange(offset, shard.log_start, end)
        if offset <= shard.log_start:
            return shard.log_start
        self.registry.set_log_start(shard, offset)
        await self.registry.save_meta()
        return shard.log_start

    async def replace_range(self, topic: str, queue: int, start: int, end: int, batches: Sequence[Buffer]) -> None:
        """Compaction's rewrite: into the shard's own compaction log (compactlog.py), never the shared CommitLog."""
        await compactlog.replace_range(
            self._compacted, self.root, self.registry.get(topic, queue), self.read, start, end, batches
        )

    async def reclaim(
        self, now_ms: int, reserved_ms: int | None = None, pins: dict[tuple[str, int], int] | None = None
    ) -> int:
        """Delete the CommitLog segments and ConsumeQueue files no shard needs any more (reclaim.py)."""
        if not self.running:
            return 0
        if reserved_ms is None:
            reserved_ms = self.config.file_reserved_time_ms
        return await reclaim.reclaim(
            self.clog, self.registry.shards.values(), self._compacted, self.delete_before, now_ms, reserved_ms, pins
        )

    # --- group offsets --------------------------------------------------------------------------------------

    def _offsets(self) -> FileOffsetStore:
        if self.offsets is None:
            raise RuntimeError("the file store's offsets are opened at start")
        return self.offsets

    async def commit_offsets(self, group: str, offsets: dict[tuple[str, int], GroupOffset]) -> None:
        await self._offsets().commit_offsets(group, offsets)

    def fetch_offsets(self, group: str) -> dict[tuple[str, int], GroupOffset]:
        return self._offsets().fetch_offsets(group)

    async def delete_offsets(self, group: str, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        await self._offsets().delete_offsets(group, partitions)

    def list_offset_groups(self) -> list[str]:
        return self._offsets().list_offset_groups()


__all__ = ["FileEngine", "Shard", "StoreStats"]
