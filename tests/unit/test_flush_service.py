"""FlushService against a stand-in CommitLog: in sync mode the flusher thread flushes back to back while writes
keep coming, wakes exactly the waiters a flush covered, takes a flush done elsewhere (a checkpoint) as its own,
and fails only the waiters a failed flush left undurable; in both modes it drops the page cache of flushed bytes
behind the kept tail (`commitlog_cache_bytes`), a flush's worth at a time."""

from __future__ import annotations

import asyncio
import threading

import pytest
from helpers import wait_until_async

from mqk.config import StoreConfig
from mqk.errors import StorageError
from mqk.store.file.flush import FlushService
from mqk.store.file.mapped_file import CACHE_DROP_CHUNK


class FakeLog:
    """max_offset = bytes written; flush() makes them durable, optionally waiting for a gate or failing."""

    def __init__(self) -> None:
        self.max_offset = 0
        self.min_offset = 0
        #: (start, upto, budget) of every drop_cache_below call
        self.drops: list[tuple[int, int, int]] = []
        self.durable = 0
        self.flushes: list[int] = []
        self.gate: threading.Event | None = None
        self.fail: OSError | None = None
        #: set when a flush has read its target (and is about to wait at the gate, if there is one)
        self.entered = threading.Event()

    def flush(self) -> int:
        target = self.max_offset
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail is not None:
            raise self.fail
        self.flushes.append(target)
        self.durable = target
        return target

    def drop_point(self, offset: int) -> int:
        return max(offset, self.min_offset)

    def drop_cache_below(self, start: int, upto: int, budget: int) -> int:
        assert upto <= self.durable, "only flushed bytes may be dropped"
        self.drops.append((start, upto, budget))
        return min(upto, start + budget)


@pytest.fixture
async def service():
    log = FakeLog()
    svc = FlushService(log, StoreConfig(flush_mode="sync"))
    svc.start()
    yield svc, log
    if log.gate is not None:
        log.gate.set()
    log.fail = None
    await svc.stop()


async def test_writes_during_a_flush_ride_the_next_one(service) -> None:
    svc, log = service
    log.gate = threading.Event()
    log.max_offset = 100
    first = svc.wait_flushed(100)
    assert await asyncio.to_thread(log.entered.wait, 10)  # the flusher is inside flush(100), held at the gate
    waiters = []
    for end in (200, 300, 400):
        log.max_offset = end
        waiters.append(svc.wait_flushed(end))
    assert not first.done()
    log.gate.set()
    await asyncio.wait_for(asyncio.gather(first, *waiters), 5)
    assert log.flushes == [100, 400]  # one flush for the three that arrived meanwhile
    assert svc.flushed == 400


async def test_a_flush_done_elsewhere_wakes_the_waiters_it_covers(service) -> None:
    svc, log = service
    log.gate = threading.Event()  # the flusher thread stays stuck in its flush
    log.max_offset = 500
    covered, beyond = svc.wait_flushed(300), svc.wait_flushed(500)
    assert await asyncio.to_thread(log.entered.wait, 10)
    threading.Thread(target=svc.note_flushed, args=(300,)).start()  # a checkpoint's flush, from its thread
    await asyncio.wait_for(covered, 5)
    assert not beyond.done() and svc.flushed == 300
    log.gate.set()
    await asyncio.wait_for(beyond, 5)


async def test_a_failed_flush_fails_its_waiters_and_the_next_write_flushes_again(service) -> None:
    svc, log = service
    log.fail = OSError(5, "Input/output error")
    log.max_offset = 100
    with pytest.raises(StorageError):
        await asyncio.wait_for(svc.wait_flushed(100), 5)
    assert svc.flushed == 0
    log.fail = None
    log.max_offset = 150
    await asyncio.wait_for(svc.wait_flushed(150), 5)
    assert svc.flushed == 150 and log.flushes == [150]


async def test_sync_flusher_drops_the_cache_of_flushed_bytes_behind_the_kept_tail() -> None:
    log = FakeLog()
    log.max_offset = 1000  # written before this start: left to the kernel
    svc = FlushService(log, StoreConfig(flush_mode="sync", commitlog_cache_bytes=300))
    assert svc.cache_from == 700
    svc.start()
    try:
        log.max_offset = 1100
        await asyncio.wait_for(svc.wait_flushed(1100), 5)
        # the flush covered 100 bytes (1000 -> 1100): it may drop that much and a chunk more, up to 300 behind
        await wait_until_async(lambda: log.drops)
        assert log.drops == [(700, 800, 100 + CACHE_DROP_CHUNK)]
        log.max_offset = 1150
        await asyncio.wait_for(svc.wait_flushed(1150), 5)
        await wait_until_async(lambda: len(log.drops) == 2)
        assert log.drops[1] == (800, 850, 50 + CACHE_DROP_CHUNK) and svc.cache_from == 850
    finally:
        await svc.stop()


@pytest.mark.parametrize("mode", ["async", "sync"])
@pytest.mark.parametrize("keep", [0, 10_000])
async def test_nothing_is_dropped_with_a_zero_cache_setting_or_inside_the_kept_tail(mode, keep) -> None:
    log = FakeLog()
    svc = FlushService(log, StoreConfig(flush_mode=mode, commitlog_cache_bytes=keep))
    svc.start()
    try:
        log.max_offset = 5000
        await svc.flush()
        assert log.flushes and svc.flushed == 5000
    finally:
        await svc.stop()
    assert log.drops == []


async def test_async_flush_drops_behind_the_kept_tail_a_flush_at_a_time() -> None:
    log = FakeLog()
    svc = FlushService(log, StoreConfig(flush_mode="async", commitlog_cache_bytes=100))
    svc.start()
    try:
        log.max_offset = 1000
        await svc.flush()  # 1,000 bytes flushed: up to 900 may go, 1,000 + a chunk allowed
        assert log.drops == [(0, 900, 1000 + CACHE_DROP_CHUNK)] and svc.cache_from == 900
        await svc.flush()  # nothing new flushed, nothing new to drop
        assert len(log.drops) == 1
    finally:
        await svc.stop()


async def test_async_kick_flushes_before_the_interval_and_only_with_drops_on() -> None:
    log = FakeLog()
    svc = FlushService(log, StoreConfig(flush_mode="async", flush_interval_ms=60_000))
    assert svc.kick_bytes < float("inf")
    svc.start()
    try:
        log.max_offset = int(svc.kick_bytes)
        svc.kick()
        await wait_until_async(lambda: log.flushes == [log.max_offset])  # not a minute later
        assert svc.flushed == log.max_offset
    finally:
        await svc.stop()
    for settings in ({"flush_mode": "async", "commitlog_cache_bytes": 0}, {"flush_mode": "sync"}):
        assert FlushService(FakeLog(), StoreConfig(**settings)).kick_bytes == float("inf")
