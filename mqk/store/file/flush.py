"""Flushing the CommitLog to disk: `async` (periodic, RocketMQ's FlushRealTimeService) and `sync` with group commit
(RocketMQ's GroupCommitService).

Every flush (msync of the CommitLog range not yet durable, fdatasync where msync is unavailable: MappedFile.flush)
runs in one dedicated worker thread, never on the event loop, and flushes are serialized there.

- `sync`: an append calls `await wait_flushed(end)`; the service runs one flush for everyone waiting at that moment,
  then wakes every waiter whose data it covered. Writers arriving during a flush ride the next one, so N concurrent
  producers cost about one fsync per round trip, not N.
- `async`: every `flush_interval_ms`, flush if at least `flush_min_pages` pages are dirty, and flush whatever is
  dirty at least every `thorough_interval_ms` (RocketMQ's flushPhysicQueueThoroughInterval), so a trickle of
  small writes is not left unflushed forever.

A flush failure (EIO, ENOSPC) fails the waiting appends with StorageError and is logged; the service keeps running.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time

from mqk.config import FLUSH_SYNC, StoreConfig
from mqk.errors import StorageError
from mqk.store.file.commitlog import CommitLog

log = logging.getLogger(__name__)
PAGE = 4096


class FlushService:
    def __init__(self, commitlog: CommitLog, config: StoreConfig, *, thorough_interval_ms: int = 10_000) -> None:
        self.clog = commitlog
        self.sync = config.flush_mode == FLUSH_SYNC
        self.interval = config.flush_interval_ms / 1000
        self.min_bytes = config.flush_min_pages * PAGE
        self.thorough = thorough_interval_ms / 1000
        #: the CommitLog offset known durable
        self.flushed = commitlog.max_offset
        self.flush_count = 0
        self.flush_seconds = 0.0  #: wall time spent in flushes (fsync latency as the appends see it)
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mqk-flush")
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run_sync() if self.sync else self._run_async())

    async def flush(self) -> int:
        """Flush everything written so far (off the loop); returns the durable offset."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        flushed = await loop.run_in_executor(self.executor, self.clog.flush)
        self.flush_seconds += time.perf_counter() - t0
        self.flush_count += 1
        self.flushed = max(self.flushed, flushed)
        return self.flushed

    def wait_flushed(self, target: int) -> asyncio.Future[None]:
        """A future done once CommitLog bytes below `target` are durable (sync mode: group commit)."""
        fut = asyncio.get_running_loop().create_future()
        if self.flushed >= target:
            fut.set_result(None)
            return fut
        if self._stopping:
            fut.set_exception(StorageError("the store is closing"))
            return fut
        self._waiters.append((target, fut))
        self._wake.set()
        return fut

    async def _run_sync(self) -> None:
        wake = self._wake
        while True:
            await wake.wait()
            wake.clear()
            if not self._waiters:
                if self._stopping:
                    return
                continue
            waiting, self._waiters = self._waiters, []
            try:
                flushed = await self.flush()
            except OSError as exc:
                log.error("CommitLog flush failed: %s", exc)
                for _, fut in waiting:
                    if not fut.done():
                        fut.set_exception(StorageError(f"flush failed: {exc}"))
                continue
            for target, fut in waiting:
                if fut.done():
                    continue
                if target <= flushed:
                    fut.set_result(None)
                else:  # written after the flush began: the next round covers it
                    self._waiters.append((target, fut))
            if self._waiters:
                wake.set()

    async def _run_async(self) -> None:
        last_flush = time.monotonic()
        while not self._stopping:
            await asyncio.sleep(self.interval)
            dirty = self.clog.max_offset - self.flushed
            if dirty <= 0:
                continue
            now = time.monotonic()
            if dirty >= self.min_bytes or now - last_flush >= self.thorough:
                try:
                    await self.flush()
                except OSError as exc:
                    log.error("CommitLog flush failed: %s", exc)
                last_flush = now

    async def stop(self) -> None:
        """Final flush, wake every waiter, stop the task."""
        self._stopping = True
        try:
            await self.flush()
        finally:
            for target, fut in self._waiters:
                if not fut.done():
                    if target <= self.flushed:
                        fut.set_result(None)
                    else:
                        fut.set_exception(StorageError("the store closed before the data was flushed"))
            self._waiters = []
            if self._task is not None:
                self._task.cancel()
                try:
                    await self._task
                except asyncio.CancelledError:
                    pass
                except Exception:
                    log.exception("flush service failed")
            self.executor.shutdown(wait=True)
