"""Cross-protocol: RocketMQ remoting and Kafka clients on one full broker (mqk_broker: BrokerRuntime, memory
store). Offsets agree; tags/keys/properties become key/headers and back; Kafka delay headers work. The broker runs
on a FakeClock: a delayed record is released by moving it."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from mqk.client import Message, MessageQueue, Producer, PullConsumer
from mqk.clock import Clock, FakeClock
from mqk.config import TopicConfig


@pytest.fixture
def mqk_clock(mqk_fake_clock: FakeClock) -> Clock:
    return mqk_fake_clock


def _ns(broker) -> str:
    host, port = broker.namesrv_address
    return f"{host}:{port}"


async def test_native_message_read_by_kafka(mqk_broker, mqk_bootstrap) -> None:
    mqk_broker.call(mqk_broker.store.create_topic("x-native", 1))
    async with Producer(_ns(mqk_broker)) as producer:
        sent = await producer.send(
            "x-native", b"hello", tags="TagA", keys=["order-1", "order-2"], properties={"color": "blue"}
        )
    consumer = AIOKafkaConsumer(bootstrap_servers=mqk_bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition("x-native", 0)
        consumer.assign([tp])
        batch = await consumer.getmany(tp, timeout_ms=5000)
        (record,) = batch[tp]
        assert record.offset == sent.queue_offset == 0
        assert record.key == b"order-1" and record.value == b"hello"
        headers = dict(record.headers)
        assert headers["TAGS"] == b"TagA" and headers["KEYS"] == b"order-1 order-2" and headers["color"] == b"blue"
        assert headers["UNIQ_KEY"] == sent.msg_id.encode()
    finally:
        await consumer.stop()


async def test_kafka_record_pulled_over_remoting(mqk_broker, mqk_bootstrap) -> None:
    mqk_broker.call(mqk_broker.store.create_topic("x-kafka", 1))
    producer = AIOKafkaProducer(bootstrap_servers=mqk_bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(
            "x-kafka", b"from-kafka", key=b"k1", partition=0, headers=[("TAGS", b"T1"), ("trace", b"abc")]
        )
        await producer.send_and_wait("x-kafka", b"second", partition=0)
    finally:
        await producer.stop()
    async with PullConsumer(_ns(mqk_broker), "xg") as consumer:
        mq = MessageQueue("x-kafka", "mqk-broker-a", 0)
        result = await consumer.pull(mq, 0)
        first = result.messages[0]
        assert first.queue_offset == meta.offset == 0 and first.body == b"from-kafka"
        assert first.properties["trace"] == "abc" and first.keys == ["k1"] and first.tags == "T1"
        assert [m.queue_offset for m in result.messages] == [0, 1] and result.next_offset == 2
        await consumer.commit_offset(mq, 2)
    # the same committed offset is what a Kafka group of that name sees
    kc = AIOKafkaConsumer(bootstrap_servers=mqk_bootstrap, group_id="xg", enable_auto_commit=False)
    await kc.start()
    try:
        assert await kc.committed(TopicPartition("x-kafka", 0)) == 2
    finally:
        await kc.stop()


@pytest.mark.parametrize("compression", [None, "gzip"])
async def test_kafka_delay_header(mqk_broker, mqk_bootstrap, compression) -> None:
    """A Kafka record with `mqk-delay-ms` waits in the timer; one without is appended at once. Compressed, the
    produce check finds the header inside the records, and the timer's hook takes its word for it."""
    topic = f"x-delay-{compression or 'none'}"
    mqk_broker.call(mqk_broker.store.create_topic(topic, 1))
    producer = AIOKafkaProducer(bootstrap_servers=mqk_bootstrap, compression_type=compression)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"now", partition=0, headers=[("trace", b"t")])
        assert mqk_broker.store.end_offset(topic, 0) == 1
        await producer.send_and_wait(topic, b"later", partition=0, headers=[("mqk-delay-ms", b"600")])
    finally:
        await producer.stop()
    assert mqk_broker.store.end_offset(topic, 0) == 1
    mqk_broker.advance(0.599)
    assert mqk_broker.store.end_offset(topic, 0) == 1 and mqk_broker.runtime.timer.pending == 1
    mqk_broker.advance(0.001)
    assert mqk_broker.store.end_offset(topic, 0) == 2
    async with PullConsumer(_ns(mqk_broker), f"dg-{topic}") as consumer:
        got = await consumer.pull(MessageQueue(topic, "mqk-broker-a", 0), 1)
        assert [m.body for m in got.messages] == [b"later"]


async def test_a_topics_compression_type_recompresses_rocketmq_sends_too(mqk_broker, mqk_bootstrap) -> None:
    """compression.type other than `producer` holds for every append, as in Kafka: RocketMQ sends (one and a batch)
    are stored in the topic's codec, and both protocols read them back whole."""
    config = TopicConfig({"compression.type": "zstd"})
    mqk_broker.call(mqk_broker.store.create_topic("x-zstd", 1, config))
    async with Producer(_ns(mqk_broker)) as producer:
        await producer.send("x-zstd", b"one " * 50, tags="T")
        await producer.send_batch([Message("x-zstd", b"two " * 50), Message("x-zstd", b"three " * 50)], queue_id=0)
    read = mqk_broker.call(mqk_broker.store.read("x-zstd", 0, 0, 1 << 20))
    codecs = [int.from_bytes(bytes(b.data[21:23]), "big") & 0x07 for b in read.batches]
    assert codecs == [4, 4, 4], "every stored batch is zstd (codec 4)"
    consumer = AIOKafkaConsumer(bootstrap_servers=mqk_bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition("x-zstd", 0)
        consumer.assign([tp])
        got = (await consumer.getmany(tp, timeout_ms=5000))[tp]
        assert [r.value for r in got] == [b"one " * 50, b"two " * 50, b"three " * 50]
        assert dict(got[0].headers)["TAGS"] == b"T"
    finally:
        await consumer.stop()
    async with PullConsumer(_ns(mqk_broker), "zg") as pull:
        result = await pull.pull(MessageQueue("x-zstd", "mqk-broker-a", 0), 0)
        assert [m.body for m in result.messages] == [b"one " * 50, b"two " * 50, b"three " * 50]
        assert result.messages[0].tags == "T"
