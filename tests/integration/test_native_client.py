"""mqk.client end to end against NativeServer + NameServer + TimerService on a memory store, in-process:
push consumers sharing a group, retry via send-back, dead-letter, delayed delivery, oneway sends.

The broker side runs on a FakeClock (`mqk_fake_clock`): a delayed or retried message is released by moving it, not
by waiting for it. The clients run on real time (their rebalances and long polls are real-world events)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from helpers import wait_until_async

from mqk.client import Message, MessageExt, MessageQueue, Producer, PullConsumer, PushConsumer, allocate_averagely
from mqk.clock import SYSTEM_CLOCK, Clock, FakeClock
from mqk.config import BrokerConfig, StoreConfig
from mqk.server.native.namesrv import NameServer
from mqk.server.native.server import NativeServer
from mqk.store.manager import StoreManager
from mqk.timer import TIMER_TOPIC, TimerService


@contextlib.asynccontextmanager
async def remoting_broker(clock: Clock) -> AsyncIterator[tuple[str, StoreManager]]:
    """A RocketMQ broker role, its name server and a timer on a memory store, all on `clock`."""
    config = BrokerConfig(
        native_listen=("127.0.0.1", 0), namesrv_listen=("127.0.0.1", 0), store=StoreConfig(storage="memory")
    )
    store = StoreManager(config.store)
    await store.start()
    timer = await TimerService(config, store, clock=clock).start()
    broker = NativeServer(config, store, clock=clock)
    namesrv = NameServer(config, store, await broker.start())
    host, port = await namesrv.start()
    try:
        yield f"{host}:{port}", store
    finally:
        await namesrv.stop()
        await broker.stop()
        await timer.stop()
        await store.close()


@pytest.fixture
async def ns(mqk_fake_clock: FakeClock):
    async with remoting_broker(mqk_fake_clock) as parts:
        yield parts


@pytest.fixture
async def ns_real_time():
    """For clients that wait on the broker's own long polls and idle timeouts (the CLI helpers)."""
    async with remoting_broker(SYSTEM_CLOCK) as parts:
        yield parts


def test_average_allocation_matches_rocketmq() -> None:
    queues = [MessageQueue("t", "b", i) for i in range(5)]
    shares = {c: [q.queue_id for q in allocate_averagely(queues, ["c1", "c2", "c3"], c)] for c in ("c1", "c2", "c3")}
    assert shares == {"c1": [0, 1], "c2": [2, 3], "c3": [4]}
    assert [q.queue_id for q in allocate_averagely(queues[:2], ["a", "b", "c"], "c")] == []
    assert allocate_averagely(queues, ["a"], "stranger") == []


async def test_push_consumers_share_queues_without_loss_or_duplicates(ns) -> None:
    namesrv, store = ns
    await store.create_topic("shared", 4)
    seen: list[tuple[str, bytes]] = []

    def handler_for(name: str):
        async def handle(msg: MessageExt) -> bool:
            seen.append((name, msg.body))
            return True

        return handle

    c1 = await PushConsumer(namesrv, "grp", "shared", handler_for("c1"), rebalance_interval=0.5, suspend_ms=500).start()
    c2 = await PushConsumer(namesrv, "grp", "shared", handler_for("c2"), rebalance_interval=0.5, suspend_ms=500).start()
    try:
        await wait_until_async(
            lambda: len(c1.assigned) + len(c2.assigned) == 4 + 1 and c1.assigned and c2.assigned,
            what="rebalance to split the queues",
        )
        main = {mq for mq in c1.assigned + c2.assigned if mq.topic == "shared"}
        assert len(main) == 4 and not set(c1.assigned) & set(c2.assigned)
        async with Producer(namesrv) as producer:
            for i in range(40):
                await producer.send("shared", b"m%d" % i, tags="t")
            # then one last message per queue: a queue's messages are delivered in order, so once every last one
            # is in, anything delivered twice before it has been seen too
            for queue in range(4):
                await producer.send("shared", b"last-%d" % queue, tags="t", queue_id=queue)
        await wait_until_async(
            lambda: len({body for _, body in seen if body.startswith(b"last-")}) == 4,
            what="all 40 messages and the 4 last ones",
        )
        bodies = sorted(body for _, body in seen if not body.startswith(b"last-"))
        assert bodies == sorted(b"m%d" % i for i in range(40))  # each exactly once
        assert {name for name, _ in seen} == {"c1", "c2"}
    finally:
        await c1.stop()
        await c2.stop()
    committed = store.fetch_offsets("grp")
    assert sum(o.offset for (topic, _), o in committed.items() if topic == "shared") == 40 + 4


async def test_leaving_member_hands_its_queues_over(ns) -> None:
    namesrv, store = ns
    await store.create_topic("handover", 2)
    got: list[bytes] = []

    async def handle(msg: MessageExt) -> None:
        got.append(msg.body)

    c1 = await PushConsumer(namesrv, "hg", "handover", handle, rebalance_interval=30, suspend_ms=500).start()
    c2 = await PushConsumer(namesrv, "hg", "handover", handle, rebalance_interval=30, suspend_ms=500).start()
    try:
        # the broker's NOTIFY_CONSUMER_IDS_CHANGED (not the 30 s periodic rebalance) splits the queues
        await wait_until_async(
            lambda: (
                len([q for q in c1.assigned if q.topic == "handover"]) == 1
                and len([q for q in c2.assigned if q.topic == "handover"]) == 1
            ),
            what="split on notify",
        )
        await c2.stop()
        await wait_until_async(lambda: len([q for q in c1.assigned if q.topic == "handover"]) == 2, what="hand-over")
        async with Producer(namesrv) as producer:
            for i in range(6):
                await producer.send("handover", b"h%d" % i)
        await wait_until_async(lambda: len(got) == 6, what="all messages after the hand-over")
        assert sorted(got) == [b"h%d" % i for i in range(6)]
    finally:
        await c1.stop()


async def test_tag_subscription_and_retry_after_handler_failure(ns, mqk_fake_clock: FakeClock) -> None:
    namesrv, store = ns
    await store.create_topic("retry-me", 1)
    attempts: list[tuple[bytes, int, str]] = []

    async def handle(msg: MessageExt) -> bool:
        attempts.append((msg.body, msg.reconsume_times, msg.topic))
        if msg.body == b"fail-once" and msg.reconsume_times == 0:
            raise RuntimeError("boom")
        return True

    consumer = await PushConsumer(
        namesrv, "rg", "retry-me", handle, expression="A || B", suspend_ms=500, rebalance_interval=0.5
    ).start()
    try:
        async with Producer(namesrv) as producer:
            await producer.send("retry-me", b"fail-once", tags="A")
            await producer.send("retry-me", b"filtered-out", tags="C")
            await producer.send("retry-me", b"ok", tags="B")
        # sent back with delay level 0: the broker picks level 3 (10 s), so it waits in the timer
        await wait_until_async(
            lambda: store.topic(TIMER_TOPIC) is not None and store.end_offset(TIMER_TOPIC, 0) == 1,
            what="the failed message sent back",
        )
        await mqk_fake_clock.advance(9.999)
        assert store.topic("%RETRY%rg") is None or store.end_offset("%RETRY%rg", 0) == 0
        await mqk_fake_clock.advance(0.001)
        assert store.end_offset("%RETRY%rg", 0) == 1
        await wait_until_async(
            lambda: [a for a in attempts if a[0] == b"fail-once" and a[1] == 1], what="the retried message"
        )
        retried = [a for a in attempts if a[0] == b"fail-once"]
        assert retried[0][1] == 0 and retried[1][1] == 1
        assert retried[1][2] == "retry-me"  # handed over with its original topic
        assert b"filtered-out" not in [a[0] for a in attempts]
        assert [a[0] for a in attempts].count(b"ok") == 1
    finally:
        await consumer.stop()


async def test_dead_letter_after_max_reconsume_times(ns) -> None:
    namesrv, store = ns
    await store.create_topic("dlq-src", 1)
    async with Producer(namesrv) as producer:
        await producer.send("dlq-src", b"poison", tags="x")
    async with PullConsumer(namesrv, "dg") as consumer:
        mq = MessageQueue("dlq-src", "mqk-broker-a", 0)
        (msg,) = (await consumer.pull(mq, 0)).messages
        await consumer.send_back(msg, delay_level=0, max_reconsume_times=0)  # already at the maximum
        await wait_until_async(
            lambda: store.topic("%DLQ%dg") is not None and store.end_offset("%DLQ%dg", 0) == 1,
            what="the dead-letter topic",
        )
        (dead,) = (await consumer.pull(MessageQueue("%DLQ%dg", "mqk-broker-a", 0), 0)).messages
        assert dead.body == b"poison" and dead.reconsume_times == 1
        assert dead.properties["RETRY_TOPIC"] == "dlq-src" and dead.properties["ORIGIN_MESSAGE_ID"] == msg.msg_id


async def test_send_back_goes_to_retry_topic_with_growing_delay(ns, mqk_fake_clock: FakeClock) -> None:
    namesrv, store = ns
    async with Producer(namesrv) as producer:
        await producer.send("sb", b"again", tags="x")
    async with PullConsumer(namesrv, "sg") as consumer:
        (msg,) = (await consumer.pull(MessageQueue("sb", "mqk-broker-a", 0), 0)).messages
        await consumer.send_back(msg, delay_level=1)  # 1 s
        assert store.topic("%RETRY%sg") is not None and store.end_offset("%RETRY%sg", 0) == 0
        await mqk_fake_clock.advance(0.999)
        assert store.end_offset("%RETRY%sg", 0) == 0
        await mqk_fake_clock.advance(0.001)
        assert store.end_offset("%RETRY%sg", 0) == 1
        (retry,) = (await consumer.pull(MessageQueue("%RETRY%sg", "mqk-broker-a", 0), 0)).messages
        assert retry.reconsume_times == 1 and retry.properties["DELAY"] == "1" and retry.body == b"again"


async def test_delayed_send_over_remoting(ns, mqk_fake_clock: FakeClock) -> None:
    namesrv, store = ns
    clock = mqk_fake_clock
    await store.create_topic("later", 1)
    async with Producer(namesrv) as producer, PullConsumer(namesrv, "lg") as consumer:
        mq = MessageQueue("later", "mqk-broker-a", 0)
        sent_at = clock.time_ms()
        await producer.send("later", b"level1", delay_level=1)
        await producer.send("later", b"at", deliver_at_ms=sent_at + 500)
        await producer.send("later", b"now")
        first = await consumer.pull(mq, 0)
        assert [m.body for m in first.messages] == [b"now"]
        waiting = asyncio.ensure_future(consumer.pull(mq, 1, suspend_ms=3000))  # a long poll the delivery wakes
        await clock.advance(0.499)
        assert store.end_offset("later", 0) == 1
        await clock.advance(0.001)
        assert store.end_offset("later", 0) == 2
        got = await waiting
        assert [m.body for m in got.messages] == [b"at"]
        await clock.advance(0.499)
        assert store.end_offset("later", 0) == 2
        await clock.advance(0.001)
        got = await consumer.pull(mq, 2, suspend_ms=3000)
        assert [m.body for m in got.messages] == [b"level1"] and store.end_offset("later", 0) == 3


async def test_oneway_and_auto_created_topic(ns) -> None:
    namesrv, store = ns
    async with Producer(namesrv) as producer:
        await producer.send_oneway("fresh-topic", b"fire-and-forget")
        await wait_until_async(
            lambda: store.topic("fresh-topic") is not None and store.end_offset("fresh-topic", 0) == 1,
            what="oneway send",
        )
        result = await producer.send("fresh-topic", b"second")
        assert result.queue_offset == 1


async def test_push_consumer_started_before_its_topic_exists(ns) -> None:
    namesrv, _store = ns
    got: list[bytes] = []
    consumer = await PushConsumer(
        namesrv, "early", "not-yet", lambda m: got.append(m.body), rebalance_interval=0.3, suspend_ms=300
    ).start()
    try:
        async with Producer(namesrv) as producer:
            await producer.send("not-yet", b"first")  # auto-creates the topic
        await wait_until_async(lambda: got == [b"first"], what="the consumer to find the new topic")
    finally:
        await consumer.stop()


async def test_send_back_picks_the_right_topic_when_synthetic_ids_collide(ns) -> None:
    import zlib

    namesrv, store = ns
    seen: dict[int, str] = {}
    for i in range(100_000):  # two topic names whose 15-bit hashes agree (birthday: a few hundred tries)
        name = f"col-{i}"
        h = zlib.crc32(name.encode()) & 0x7FFF
        if h in seen:
            first, second = seen[h], name
            break
        seen[h] = name
    async with Producer(namesrv) as producer:
        await producer.send(first, b"from-first")
        await producer.send(second, b"from-second")
    async with PullConsumer(namesrv, "cgx") as consumer:
        (msg,) = (await consumer.pull(MessageQueue(second, "mqk-broker-a", 0), 0)).messages
        (other,) = (await consumer.pull(MessageQueue(first, "mqk-broker-a", 0), 0)).messages
        # the ids are the memory engine's physical offsets now (store.read_at), distinct where the synthetic ones
        # of these two topics would have collided; send-back must still pick the right message
        assert msg.commit_log_offset != other.commit_log_offset
        await consumer.send_back(msg, delay_level=-1)  # straight to the dead-letter topic
        await wait_until_async(lambda: store.topic("%DLQ%cgx") is not None and store.end_offset("%DLQ%cgx", 0) == 1)
        (dead,) = (await consumer.pull(MessageQueue("%DLQ%cgx", "mqk-broker-a", 0), 0)).messages
        assert dead.body == b"from-second"


async def test_delay_beyond_the_maximum_is_refused(ns) -> None:
    from mqk.client import ClientError
    from mqk.protocol.native.codes import ResponseCode

    namesrv, store = ns
    async with Producer(namesrv) as producer:
        far = int(time.time() * 1000) + 10 * 24 * 3600 * 1000  # the default maximum is 3 days
        with pytest.raises(ClientError) as err:
            await producer.send("too-late", b"x", deliver_at_ms=far)
        assert err.value.code == ResponseCode.MESSAGE_ILLEGAL and "timer_max_delay_ms" in str(err.value)
        assert store.end_offset("too-late", 0) == 0


async def test_concurrent_push_consumption(ns) -> None:
    namesrv, store = ns
    await store.create_topic("conc", 1)
    active, peak, got = 0, 0, []
    overlapping = asyncio.Event()

    async def handle(msg: MessageExt) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        if active > 1:
            overlapping.set()
        # the first handler holds on until a second one runs beside it: serial consumption never gets past here
        await overlapping.wait()
        got.append(msg.body)
        active -= 1

    async with Producer(namesrv) as producer:
        await producer.send_batch([Message("conc", b"c%d" % i) for i in range(20)], queue_id=0)
    consumer = await PushConsumer(namesrv, "cc", "conc", handle, concurrency=8, suspend_ms=300).start()
    try:
        await wait_until_async(lambda: len(got) == 20, what="concurrent consumption")
        assert sorted(got) == sorted(b"c%d" % i for i in range(20)) and peak > 1
        await wait_until_async(
            lambda: (
                store.fetch_offsets("cc").get(("conc", 0)) is not None
                and store.fetch_offsets("cc")[("conc", 0)].offset == 20
            ),
            what="offset commit",
        )
    finally:
        await consumer.stop()


async def test_cli_helpers_produce_and_consume(ns_real_time) -> None:
    from mqk.client.tools import consume, format_message, produce_lines

    namesrv, store = ns_real_time
    await store.create_topic("cli", 2)
    assert await produce_lines(namesrv, "cli", [b"k1:one", b"two", b"k3:three"], tags="t", key_separator=b":") == 3
    printed: list[str] = []
    got = await consume(namesrv, "cli", "cli-g", max_messages=3, out=lambda m: printed.append(format_message(m)))
    assert got == 3 and sorted(p.split("\t")[-1] for p in printed) == ["one", "three", "two"]
    assert any("\tk1\t" in p for p in printed)
    # committed: a second run of the same group sees nothing new
    assert await consume(namesrv, "cli", "cli-g", idle_timeout_s=0.2, out=lambda m: printed.append("again")) == 0
