"""Delayed delivery across kill -9 of a real broker process (file store): every delayed message acknowledged
before the kill is delivered once after the restart, not before its time, never twice."""
from __future__ import annotations

import asyncio
import time

import pytest

from mqk.client import MessageQueue, Producer, PullConsumer
from mqk.testing import BrokerProcess


def _ns(broker: BrokerProcess) -> str:
    assert broker.namesrv_address is not None
    return f"{broker.namesrv_address[0]}:{broker.namesrv_address[1]}"


async def _collect(ns: str, topic: str, queues: int, expect: int, timeout: float) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    async with PullConsumer(ns, "crash-check") as consumer:
        offsets = [0] * queues
        while time.monotonic() < deadline:
            for q in range(queues):
                result = await consumer.pull(MessageQueue(topic, "mqk-broker-a", q), offsets[q], 256)
                got += [m.body for m in result.messages]
                offsets[q] = result.next_offset
            if len(got) >= expect:
                await asyncio.sleep(1.0)  # anything more now would be a duplicate
                for q in range(queues):
                    result = await consumer.pull(MessageQueue(topic, "mqk-broker-a", q), offsets[q], 256)
                    got += [m.body for m in result.messages]
                return got
            await asyncio.sleep(0.1)
    return got


@pytest.mark.slow
@pytest.mark.parametrize("kill_during_delivery", [False, True])
async def test_delayed_messages_survive_kill_9(tmp_path, kill_during_delivery: bool) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        n = 400
        async with Producer(_ns(broker)) as producer:
            due = int(time.time() * 1000) + (2500 if kill_during_delivery else 1500)
            for i in range(n):
                await producer.send("crashy", b"%d" % i, deliver_at_ms=due)
            await producer.send("crashy", b"plain")
        if kill_during_delivery:
            # let delivery start, then kill in the middle of it (some delivered, some not, maybe an intent open)
            while int(time.time() * 1000) < due:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.02)
        broker.kill()
        broker.start()
        got = await _collect(_ns(broker), "crashy", 1, n + 1, timeout=30)
        assert sorted(got) == sorted([b"%d" % i for i in range(n)] + [b"plain"])  # each once
        assert int(time.time() * 1000) >= due
    finally:
        broker.stop()
