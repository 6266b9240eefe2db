"""Flushing the CommitLog to disk: `async` (periodic, RocketMQ's FlushRealTimeService) and `sync` with group commit
(RocketMQ's GroupCommitService).

- `sync`: an append calls `wait_flushed(end)` and waits on the future it returns. A dedicated flusher thread
  flushes whatever has been written since the last flush, and keeps going flush after flush for as long as
  writes keep arriving; after each flush it wakes every waiter the flush covered. Writers arriving during a
  flush ride the next one, so N concurrent producers cost about one flush per round trip, not N, and the event
  loop appends the next group while the disk syncs this one (the two overlap instead of taking turns).
- `async`: every `flush_interval_ms`, flush if at least `flush_min_pages` pages are dirty, and flush whatever is
  dirty at least every `thorough_interval_ms` (RocketMQ's flushPhysicQueueThoroughInterval), so a trickle of
  small writes is not left unflushed forever; and flush at once when an append leaves ASYNC_KICK_BYTES unflushed
  (`kick`), so that behind a fast producer the page cache is dropped as it writes, not half a second later.
  These flushes, and `flush()` in either mode, run in a one-thread executor, never on the event loop.

A flush failure (EIO, ENOSPC) fails the appends waiting for it with StorageError and is logged; the service keeps
running, and the next write tries again.

After each flush, in the same thread, the page cache of flushed CommitLog bytes more than `commitlog_cache_bytes`
behind the end of the log is dropped (`_drop_behind`), a flush's worth at a time. The kernel would keep every
page until memory runs short; dropping them keeps the broker's page cache at its most recent bytes, and the
pages it frees are the ones the next writes get. On a VM whose free memory goes back to the host (a virtio
balloon reporting free pages), a page that was never used or was given back costs a host-side fault when written,
and a growing page cache always takes such pages; pages the drop just freed do not (bench/README.md and
docs/decisions.md have the figures). Readers of older bytes fault them back in from the file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from mqk.config import FLUSH_SYNC, StoreConfig
from mqk.errors import StorageError
from mqk.store.file.commitlog import CommitLog
from mqk.store.file.mapped_file import CACHE_DROP_CHUNK

log = logging.getLogger(__name__)
_T = TypeVar("_T")
PAGE = 4096
#: async mode, with page cache drops on: unflushed bytes that start a flush before `flush_interval_ms` is up, so
#: that behind a fast producer a whole interval's writes do not go into new page cache before any may be dropped
ASYNC_KICK_BYTES = 64 << 20


class FlushService:
    def __init__(self, commitlog: CommitLog, config: StoreConfig, *, thorough_interval_ms: int = 10_000) -> None:
        self.clog = commitlog
        self.sync = config.flush_mode == FLUSH_SYNC
        self.interval = config.flush_interval_ms / 1000
        self.min_bytes = config.flush_min_pages * PAGE
        self.thorough = thorough_interval_ms / 1000
        #: the CommitLog offset known durable (as the event loop has been told)
        self.flushed = commitlog.max_offset
        self.flush_count = 0
        self.flush_seconds = 0.0  #: wall time spent in flushes (fsync latency as the appends see it)
        #: bytes at the end of the log whose pages stay cached once flushed (0: leave every page to the kernel)
        self.cache_keep = config.commitlog_cache_bytes
        #: the CommitLog offset below which the page cache was dropped (what was written before this start is
        #: left to the kernel)
        self.cache_from = commitlog.drop_point(commitlog.max_offset - self.cache_keep)
        #: async mode: the unflushed bytes at which an append calls `kick` (never when nothing is dropped)
        self.kick_bytes = ASYNC_KICK_BYTES if self.cache_keep > 0 and not self.sync else float("inf")
        self._kicked = asyncio.Event()
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mqk-flush")
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        #: set by the loop when a write wants flushing; the sync flusher thread sleeps on it
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.sync:
            self._thread = threading.Thread(target=self._sync_flusher, name="mqk-flush-sync", daemon=True)
            self._thread.start()
        else:
            self._task = self._loop.create_task(self._run_async())

    async def flush(self) -> int:
        """Flush everything written so far (off the loop); returns the durable offset."""
        loop = asyncio.get_running_loop()
        flushed = await loop.run_in_executor(self.executor, self._flush_and_drop)
        self._flushed_to(flushed)
        return self.flushed

    def _flush_and_drop(self) -> int:
        """A flush from the loop (`flush`), then, in async mode, the page cache it lets go (in sync mode the
        flusher thread drops it, and only it, so one thread moves `cache_from`)."""
        before = self.flushed
        flushed = self._timed_flush()
        if not self.sync:
            self._drop_behind(flushed, flushed - before)
        return flushed

    def _drop_behind(self, flushed: int, just_flushed: int) -> None:
        """In the flusher's thread: drop the page cache of flushed bytes more than `cache_keep` behind the end of
        the log, at most what the last flush covered and a chunk more (so the work follows the writes and a
        backlog is worked off a chunk per flush)."""
        if self.cache_keep <= 0:
            return
        upto = min(flushed, self.clog.max_offset - self.cache_keep)
        if upto > self.cache_from:
            budget = max(just_flushed, 0) + CACHE_DROP_CHUNK
            self.cache_from = self.clog.drop_cache_below(self.cache_from, upto, budget)

    def _timed_flush(self) -> int:
        t0 = time.perf_counter()
        flushed = self.clog.flush()
        self.flush_seconds += time.perf_counter() - t0
        self.flush_count += 1
        return flushed

    def kick(self) -> None:
        """Async mode, on the loop: an append left `kick_bytes` unflushed; flush now rather than at the next
        interval."""
        self._kicked.set()

    def wait_flushed(self, target: int) -> asyncio.Future[None]:
        """A future done once CommitLog bytes below `target` are durable (sync mode: group commit)."""
        assert self._loop is not None, "the flush service is not started"
        fut = self._loop.create_future()
        if self.flushed >= target:
            fut.set_result(None)
            return fut
        if self._stopping:
            fut.set_exception(StorageError("the store is closing"))
            return fut
        self._waiters.append((target, fut))
        if not self._kick.is_set():
            self._kick.set()
        return fut

    # --- sync: the flusher thread -------------------------------------------------------------------------

    def _sync_flusher(self) -> None:
        """Flush while there is something written and not yet flushed, then sleep until kicked. The kick is
        cleared before the write position is read, so a write that lands after that read kicks again."""
        durable = self.flushed
        kick = self._kick
        while True:
            kick.wait()
            kick.clear()
            if self._stopping:
                return
            while self.clog.max_offset > durable:
                before = durable
                try:
                    durable = max(durable, self._timed_flush())
                except OSError as exc:
                    log.error("CommitLog flush failed: %s", exc)
                    self._call_loop(self._fail_waiters, exc)
                    break
                self._call_loop(self._flushed_to, durable)
                self._drop_behind(durable, durable - before)  # after the waiters were told
                if self._stopping:
                    return

    def note_flushed(self, flushed: int) -> None:
        """From any thread: CommitLog bytes below `flushed` were made durable by someone else (a checkpoint)."""
        self._call_loop(self._flushed_to, flushed)

    def _call_loop(self, fn: Callable[[_T], None], arg: _T) -> None:
        assert self._loop is not None, "the flush service is not started"
        with contextlib.suppress(RuntimeError):  # the loop closed under a store that was not stopped: nobody waits
            self._loop.call_soon_threadsafe(fn, arg)

    def _flushed_to(self, flushed: int) -> None:
        """On the loop: record the durable offset and wake every waiter it covers."""
        if flushed <= self.flushed:
            return
        self.flushed = flushed
        waiters = self._waiters
        if not waiters:
            return
        keep = []
        for target, fut in waiters:
            if target <= flushed:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((target, fut))
        self._waiters = keep

    def _fail_waiters(self, exc: OSError) -> None:
        """On the loop: a flush failed; every append waiting for bytes it did not make durable fails."""
        waiters, self._waiters = self._waiters, []
        for target, fut in waiters:
            if fut.done():
                continue
            if target <= self.flushed:
                fut.set_result(None)
            else:
                fut.set_exception(StorageError(f"flush failed: {exc}"))

    # --- async --------------------------------------------------------------------------------------------

    async def _run_async(self) -> None:
        last_flush = time.monotonic()
        kicked = self._kicked
        while not self._stopping:
            if not kicked.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(kicked.wait(), self.interval)
            kicked.clear()
            dirty = self.clog.max_offset - self.flushed
            if dirty <= 0:
                continue
            now = time.monotonic()
            if dirty >= self.min_bytes or now - last_flush >= self.thorough or dirty >= self.kick_bytes:
                try:
                    await self.flush()
                except OSError as exc:
                    log.error("CommitLog flush failed: %s", exc)
                last_flush = now

    async def stop(self) -> None:
        """Stop the flusher, flush everything once more, wake every waiter."""
        self._stopping = True
        if self._thread is not None:
            self._kick.set()
            await asyncio.to_thread(self._thread.join)
            self._thread = None
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
