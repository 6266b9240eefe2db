"""The disk guard over both protocols, without a small filesystem: with disk_max_used_ratio at 0 every disk is "full".
A Kafka producer gets KAFKA_STORAGE_ERROR, a RocketMQ producer SERVICE_NOT_AVAILABLE with the reason in its remark,
fetches and pulls go on, and once the ratio allows it again appends resume by themselves. The broker runs on a
FakeClock: the guard's periodic check is released by moving it."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from helpers import wait_until

from mqk.client.base import MessageQueue
from mqk.client.consumer import PullConsumer
from mqk.client.producer import Producer as NativeProducer
from mqk.client.remoting import ClientError
from mqk.clock import Clock, FakeClock
from mqk.config import TopicConfig
from mqk.protocol.native.codes import ResponseCode

TOPIC = "guarded"


@pytest.fixture
def mqk_clock(mqk_fake_clock: FakeClock) -> Clock:
    return mqk_fake_clock


def _kafka_send(bootstrap: str, value: bytes) -> int | None:
    """The error code of one produce, or None when it was stored."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "retries": 0,
            "linger.ms": 0,
            "enable.idempotence": False,
            "message.timeout.ms": 10000,
        }
    )
    out: list = []
    producer.produce(TOPIC, key=b"k", value=value, on_delivery=lambda err, msg: out.append(err))
    producer.flush(15)
    assert out, "produce neither succeeded nor failed"
    return None if out[0] is None else out[0].code()


def _periodic_check(broker) -> None:
    """Move the broker's clock to the guard's next periodic check and wait for that check (its measurement runs in
    a worker thread) to finish."""
    guard = broker.runtime.diskguard
    before = guard.checks
    broker.advance(guard.interval_ms / 1000)
    wait_until(lambda: guard.checks > before, 10, "the guard's periodic check")


def test_guard_refuses_both_protocols_keeps_reads_and_resumes(mqk_file_broker) -> None:
    broker = mqk_file_broker
    guard = broker.runtime.diskguard
    broker.call(broker.store.create_topic(TOPIC, 1, TopicConfig()))
    assert _kafka_send(broker.bootstrap, b"before") is None

    guard.max_ratio = 0.0
    _periodic_check(broker)
    assert guard.full
    assert _kafka_send(broker.bootstrap, b"refused") == KafkaError.KAFKA_STORAGE_ERROR

    async def native_send() -> tuple[int, str]:
        producer = NativeProducer(broker.namesrv_address, "guard-producer")
        try:
            await producer.send(TOPIC, b"refused too", queue_id=0)
        except ClientError as exc:
            return exc.code, str(exc)
        finally:
            await producer.stop()
        return 0, ""

    code, remark = asyncio.run(native_send())
    assert code == ResponseCode.SERVICE_NOT_AVAILABLE, (code, remark)
    assert "disk" in remark

    # reads go on: Kafka fetch and remoting pull both return what was stored before
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "guard-reader", "auto.offset.reset": "earliest"}
    )
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        msg = None
        deadline = time.monotonic() + 15
        while msg is None and time.monotonic() < deadline:
            got = consumer.poll(0.5)
            if got is not None and got.error() is None:
                msg = got
        assert msg is not None and msg.value() == b"before"
    finally:
        consumer.close()

    async def native_pull() -> int:
        client = PullConsumer(broker.namesrv_address, "guard-puller")
        try:
            result = await client.pull(MessageQueue(TOPIC, broker.config.broker_name, 0), 0)
            return len(result.messages)
        finally:
            await client.stop()

    assert asyncio.run(native_pull()) == 1
    assert broker.store.end_offset(TOPIC, 0) == 1  # nothing refused was stored

    guard.max_ratio = 0.999
    _periodic_check(broker)
    assert not guard.full
    assert _kafka_send(broker.bootstrap, b"after") is None
    assert broker.store.end_offset(TOPIC, 0) == 2
    assert guard.refused >= 2
