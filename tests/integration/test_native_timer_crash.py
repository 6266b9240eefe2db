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


async def _collect_until(ns: str, topic: str, last: bytes, timeout: float) -> list[bytes]:  # noqa: ASYNC109 - one deadline for the whole collection
    """Every message of `topic`'s queue 0, in order, up to and including `last` (long polls: no sleeping)."""
    got: list[bytes] = []
    mq = MessageQueue(topic, "mqk-broker-a", 0)
    async with PullConsumer(ns, "crash-check") as consumer, asyncio.timeout(timeout):
        offset = 0
        while last not in got:
            result = await consumer.pull(mq, offset, 256, suspend_ms=5000)
            got += [m.body for m in result.messages]
            offset = result.next_offset
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
            # kill as soon as delivery has started (some delivered, some maybe not, an intent maybe open): a long
            # poll past "plain" returns with the first delivered message
            async with PullConsumer(_ns(broker), "crash-watch") as watcher:
                started = await watcher.pull(MessageQueue("crashy", "mqk-broker-a", 0), 1, 1, suspend_ms=30_000)
                assert started.messages, "delivery did not start"
        broker.kill()
        broker.start()
        # one more, due after every other: the timer delivers in due order, so once it is in, every delivery that
        # will ever happen of the earlier ones (a duplicate too) has happened
        async with Producer(_ns(broker)) as producer:
            await producer.send("crashy", b"last", deliver_at_ms=max(due, int(time.time() * 1000)) + 200)
        got = await _collect_until(_ns(broker), "crashy", b"last", timeout=60)
        assert got[-1] == b"last"
        assert sorted(got[:-1]) == sorted([b"%d" % i for i in range(n)] + [b"plain"])  # each once
        assert int(time.time() * 1000) >= due
    finally:
        broker.stop()
