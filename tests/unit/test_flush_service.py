"""FlushService in sync mode against a stand-in CommitLog: the flusher thread flushes back to back while writes
keep coming, wakes exactly the waiters a flush covered, takes a flush done elsewhere (a checkpoint) as its own,
and fails only the waiters a failed flush left undurable."""
from __future__ import annotations

import asyncio
import threading

import pytest

from mqk.config import StoreConfig
from mqk.errors import StorageError
from mqk.store.file.flush import FlushService


class FakeLog:
    """max_offset = bytes written; flush() makes them durable, optionally waiting for a gate or failing."""

    def __init__(self) -> None:
        self.max_offset = 0
        self.durable = 0
        self.flushes: list[int] = []
        self.gate: threading.Event | None = None
        self.fail: OSError | None = None

    def flush(self) -> int:
        target = self.max_offset
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail is not None:
            raise self.fail
        self.flushes.append(target)
        self.durable = target
        return target


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
    await asyncio.sleep(0.05)  # the flusher is inside flush(100), held at the gate
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
    await asyncio.sleep(0.05)
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
