"""The log start offset seen three ways agrees after DeleteRecords and after retention: Kafka ListOffsets(earliest)
(confluent-kafka's watermarks), a Kafka fetch positioned below it (moves to it under auto.offset.reset=earliest),
and the RocketMQ remoting GET_MIN_OFFSET (mqk's native client). Runs on the memory and the file store."""

from __future__ import annotations

import asyncio
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from mqk.client.base import MessageQueue
from mqk.client.consumer import PullConsumer
from mqk.config import TopicConfig
from mqk.services.retention import RetentionService


def _produce(bootstrap: str, topic: str, n: int, timestamp: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": False})
    for i in range(n):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, timestamp=timestamp or 0)
        producer.flush(10)  # one batch per record: the log start can only move at batch ends under retention
    assert producer.flush(10) == 0


def _views(engine_broker, topic: str) -> tuple[int, int, int]:
    """(ListOffsets earliest, first offset a fetch from 0 returns, remoting min offset)."""
    consumer = Consumer(
        {
            "bootstrap.servers": engine_broker.bootstrap,
            "group.id": "lifecycle-view",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        low, _high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, 0)])  # below the log start: the reset policy moves it
        first = -1
        deadline = time.monotonic() + 15
        while first < 0 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                first = msg.offset()
    finally:
        consumer.close()

    async def native_min() -> int:
        client = PullConsumer(engine_broker.namesrv_address, "lifecycle-native")
        try:
            return await client.min_offset(MessageQueue(topic, engine_broker.config.broker_name, 0))
        finally:
            await client.stop()

    return low, first, asyncio.run(native_min())


def test_delete_records_and_retention_agree_everywhere(engine_broker) -> None:
    topic = "lifecycle-agree"
    engine_broker.call(engine_broker.store.create_topic(topic, 1, TopicConfig({"retention.ms": "-1"})))
    old = int(time.time() * 1000) - 3_600_000
    _produce(engine_broker.bootstrap, topic, 6, timestamp=old)
    _produce(engine_broker.bootstrap, topic, 4)
    assert engine_broker.store.end_offset(topic, 0) == 10

    admin = AdminClient({"bootstrap.servers": engine_broker.bootstrap})
    futures = admin.delete_records([TopicPartition(topic, 0, 3)])
    result = next(iter(futures.values())).result(10)
    assert result.low_watermark == 3
    assert _views(engine_broker, topic) == (3, 3, 3)

    # retention by time: the six old one-record batches go, the log start lands on the first young one
    engine_broker.call(engine_broker.store.alter_topic_config(topic, TopicConfig({"retention.ms": "60000"})))
    service = RetentionService(engine_broker.config, engine_broker.store)
    report = engine_broker.call(service.run_once())
    assert report.moved[(topic, 0)].new_start == 6
    assert _views(engine_broker, topic) == (6, 6, 6)

    # DeleteRecords to the high watermark (-1): everything goes, and the three views still agree
    futures = admin.delete_records([TopicPartition(topic, 0, -1)])
    assert next(iter(futures.values())).result(10).low_watermark == 10
    consumer = Consumer({"bootstrap.servers": engine_broker.bootstrap, "group.id": "lifecycle-end"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (10, 10)
    finally:
        consumer.close()
