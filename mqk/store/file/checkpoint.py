"""The file engine's checkpoint, abort marker and ConsumeQueue flush policy (RocketMQ's StoreCheckpoint, `abort`
file and FlushConsumeQueueService).

`checkpoint` holds, behind a CRC, the CommitLog offset below which every entry is durable AND dispatched into
ConsumeQueue units that are durable too (`safe_offset`), and when that was true. Recovery replays the CommitLog
from there. It is rewritten atomically (fsutil: temp file, fsync, rename, fsync dir), so a crash leaves the old one
or the new one. A missing or unreadable checkpoint means "replay from the start of the oldest segment kept".

`abort` exists while the engine runs; a clean stop removes it after everything is flushed. Finding it at start
means the last run did not stop cleanly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqk._fast.crc import crc32c
from mqk.errors import StorageError
from mqk.store.fsutil import atomic_write_bytes, fsync_dir, syncfs

if TYPE_CHECKING:
    from mqk.config import StoreConfig
    from mqk.store.file.commitlog import CommitLog
    from mqk.store.file.consumequeue import ConsumeQueue
    from mqk.store.file.dispatch import ReputMessageService
    from mqk.store.file.flush import FlushService
    from mqk.store.file.index import IndexService
    from mqk.store.file.shards import ShardRegistry

log = logging.getLogger(__name__)

_FORMAT = struct.Struct(">IqqqI")  # version, safe_offset, flushed_offset, timestamp_ms, crc32c of the rest
VERSION = 1


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.safe_offset = 0
        self.flushed_offset = 0
        self.timestamp = 0
        self.loaded = False

    def load(self) -> bool:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return False
        if len(data) != _FORMAT.size:
            log.error("checkpoint %s has %d bytes, expected %d; ignoring it", self.path, len(data), _FORMAT.size)
            return False
        version, safe, flushed, ts, crc = _FORMAT.unpack(data)
        if crc != crc32c(data[:-4]) or version != VERSION or safe < 0 or flushed < 0:
            log.error("checkpoint %s fails its check; ignoring it", self.path)
            return False
        self.safe_offset, self.flushed_offset, self.timestamp = safe, flushed, ts
        self.loaded = True
        return True

    @staticmethod
    def encode(safe_offset: int, flushed_offset: int, timestamp: int) -> bytes:
        head = _FORMAT.pack(VERSION, safe_offset, flushed_offset, timestamp, 0)[:-4]
        return head + struct.pack(">I", crc32c(head))

    def store(self, safe_offset: int, flushed_offset: int, timestamp: int) -> None:
        """Blocking (fsync): run off the event loop."""
        atomic_write_bytes(self.path, self.encode(safe_offset, flushed_offset, timestamp))
        self.safe_offset, self.flushed_offset, self.timestamp = safe_offset, flushed_offset, timestamp


class AbortMarker:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def exists(self) -> bool:
        return self.path.exists()

    def create(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(fd)
        fsync_dir(self.path.parent)

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.path.parent)


#: a checkpoint flushing at least this many ConsumeQueues of one filesystem syncs the filesystem once (syncfs)
SYNCFS_MIN_QUEUES = 32


class CheckpointService:
    """The flush policy of ConsumeQueues and the checkpoint (RocketMQ's FlushConsumeQueueService + StoreCheckpoint).

    Every `checkpoint_interval_ms`: flush the ConsumeQueues that are due and the CommitLog, then record the safe
    offset (below it every entry is durable and so are its units). A queue is due with `cq_flush_least_pages`
    unflushed pages or once its oldest unflushed unit is `cq_flush_max_delay_ms` old (RocketMQ's least-pages rule: a
    thousand queues with a unit or two each must not cost a thousand msyncs, and journal commits, every second); the
    rest keep the safe offset at their oldest unflushed unit. Blocking work runs in one thread of its own."""

    def __init__(
        self,
        config: StoreConfig,
        checkpoint: Checkpoint,
        clog: CommitLog,
        registry: ShardRegistry,
        dispatcher: ReputMessageService,
        index: IndexService,
        dirty: set[ConsumeQueue],
        now_ms: Callable[[], int],
    ) -> None:
        self.config = config
        self.checkpoint = checkpoint
        self.clog = clog
        self.registry = registry
        self.dispatcher = dispatcher
        self.index = index
        #: ConsumeQueues with unflushed units (filled by the append pipeline's publish; changed in place here)
        self.dirty = dirty
        self._now_ms = now_ms
        self.flusher: FlushService | None = None
        self._io = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mqk-checkpoint")

    async def run(self) -> None:
        """The periodic pass (a task of the engine's)."""
        interval = self.config.checkpoint_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.checkpoint_now()
            except (OSError, StorageError) as exc:
                log.error("file store checkpoint failed: %s", exc)

    def close(self) -> None:
        self._io.shutdown(wait=True)

    async def checkpoint_now(self, flush_all: bool = False) -> None:
        """One pass (see the class docstring). `flush_all` flushes every queue, due or not (close, and tests that
        need it now)."""
        # taken on the loop thread, where appends happen: every unit of an entry below `safe` is in a queue
        # flushed now (or by an earlier checkpoint)
        safe = self.dispatcher.dispatched
        if flush_all:
            due = [shard.cq for shard in self.registry.shards.values()]
            waiting: set[ConsumeQueue] = set()
        else:
            least_bytes = self.config.cq_flush_least_pages * 4096
            oldest_ms = self._now_ms() - self.config.cq_flush_max_delay_ms
            due = []
            waiting = set()
            for cq in self.dirty:
                if cq.slot < 0:
                    continue  # closed (its topic deleted)
                if cq.dirty_since_ms <= oldest_ms or cq.mfq.dirty_bytes() >= least_bytes:
                    due.append(cq)
                else:
                    waiting.add(cq)
                    if cq.dirty_since_phys < safe:
                        safe = cq.dirty_since_phys
        marks = [(cq, cq.dirty_since_phys, cq.dirty_since_ms) for cq in due]
        for cq in due:
            cq.dirty_since_phys = -1  # a unit written from here on marks the queue dirty again
        self.dirty.clear()
        self.dirty.update(waiting)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._io, self._flush_and_store, safe, due)
        except BaseException:
            # not known flushed: the queues stay dirty since their oldest unflushed unit, for the next checkpoint
            for cq, since_phys, since_ms in marks:
                if cq.slot < 0:
                    continue
                if since_phys >= 0 and (cq.dirty_since_phys < 0 or since_phys < cq.dirty_since_phys):
                    cq.dirty_since_phys, cq.dirty_since_ms = since_phys, since_ms
                if cq.dirty_since_phys >= 0:
                    self.dirty.add(cq)
            raise
        # on the loop, where the index is written; every entry dispatched so far was shown to the index's hook or
        # had nothing for it (AppendPipeline.hooks_for)
        snap = self.index.snapshot(self.clog.min_offset, self.dispatcher.dispatched)
        await loop.run_in_executor(self._io, self.index.store_checkpoint, snap)

    def _flush_and_store(self, safe: int, dirty: list[ConsumeQueue]) -> None:
        flush_queues(dirty)
        flushed = self.clog.flush()
        if self.flusher is not None:
            self.flusher.note_flushed(flushed)
        self.checkpoint.store(min(safe, flushed), flushed, self._now_ms())


def flush_queues(queues: list[ConsumeQueue]) -> None:
    """Make the queues' units durable (blocking). An fdatasync per file costs a journal commit each; from
    SYNCFS_MIN_QUEUES queues on one filesystem, one syncfs(2) covers them all. A queue whose files are on another
    filesystem, or a platform without syncfs, gets its own fdatasync."""
    by_device: dict[int, list[tuple[ConsumeQueue, tuple[Any, Any]]]] = {}
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
            try:
                cq.flush()
            except ValueError:  # closed meanwhile (its topic deleted): nothing left to make durable
                continue
