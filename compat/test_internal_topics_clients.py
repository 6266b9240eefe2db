"""The broker's internal topics against real Kafka clients: the poison record of issue 26 (`kcat -P -t
__mqk_timer`) is refused by kcat, confluent-kafka and kafka-python alike, nothing of theirs reaches the timer topic,
its deletion is refused, and delayed delivery keeps working after the attempts."""

from __future__ import annotations

import subprocess
import time

import pytest
from compat_helpers import create_topic, stored_batches

pytestmark = pytest.mark.timeout(60)

TIMER_TOPIC = "__mqk_timer"


def test_kcat_cannot_produce_the_poison_record(kcat: str, bootstrap: str) -> None:
    before = stored_batches(bootstrap, TIMER_TOPIC)  # (delayed messages of other tests may wait there)
    proc = subprocess.run(
        [kcat, "-b", bootstrap, "-P", "-t", TIMER_TOPIC, "-X", "message.send.max.retries=0"],
        input="poison\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert "invalid topic" in proc.stderr.lower(), proc.stderr[-2000:]
    assert stored_batches(bootstrap, TIMER_TOPIC) == before


def test_confluent_kafka_is_refused_and_delivery_goes_on(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Consumer, KafkaError, Producer

    create_topic(bootstrap, topic)
    before = stored_batches(bootstrap, TIMER_TOPIC)
    producer = Producer({"bootstrap.servers": bootstrap, "message.send.max.retries": 0})
    errors: list[KafkaError | None] = []
    producer.produce(TIMER_TOPIC, b"poison", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(15)
    assert errors and errors[0] is not None and errors[0].code() == KafkaError.TOPIC_EXCEPTION
    assert stored_batches(bootstrap, TIMER_TOPIC) == before
    # the timer still delivers: a delayed record arrives (no time measured, only that it does)
    due = str(int(time.time() * 1000) + 300).encode()
    producer.produce(topic, b"delayed", headers=[("mqk-deliver-at", due)])
    assert producer.flush(15) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-g", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        got = None
        while got is None and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got = msg.value()
        assert got == b"delayed"
    finally:
        consumer.close()


def test_kafka_python_cannot_produce_to_or_delete_the_timer_topic(bootstrap: str) -> None:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient
    from kafka.errors import InvalidTopicError, TopicAuthorizationFailedError

    before = stored_batches(bootstrap, TIMER_TOPIC)
    producer = KafkaProducer(bootstrap_servers=bootstrap, retries=0)
    try:
        # kafka-python declines, before sending, a topic Metadata marks internal (ValueError: no partition for it);
        # had it sent, the broker's answer would be INVALID_TOPIC_EXCEPTION
        with pytest.raises((InvalidTopicError, ValueError), match=r"__mqk_timer|Invalid"):
            producer.send(TIMER_TOPIC, b"poison", partition=0).get(timeout=15)
    finally:
        producer.close()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            admin.delete_topics([TIMER_TOPIC])
        assert TIMER_TOPIC in admin.list_topics()
    finally:
        admin.close()
    assert stored_batches(bootstrap, TIMER_TOPIC) == before
