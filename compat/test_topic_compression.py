"""A topic's compression.type other than `producer` recompresses every batch on append, as Kafka does: created
through Kafka's admin API, written by confluent-kafka (lz4, idempotent) and kafka-python (gzip), read back whole by
both clients, and every stored batch in the topic's codec (checked on the raw Fetch bytes through mqk's raw client).
A `producer` topic keeps each producer's codec."""

from __future__ import annotations

import time
import warnings
from typing import Any

import pytest
from compat_helpers import CODEC_IDS, create_topic, stored_batches, unique
from confluent_kafka import Consumer, Producer, TopicPartition

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.filterwarnings("ignore:(open|read)_text is deprecated:DeprecationWarning"),
]
N = 40


def _write(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    """N records from confluent-kafka (lz4, idempotent) then N from kafka-python (gzip); what was sent."""
    sent = [(b"c%d" % i, b"confluent-%d-" % i * 8) for i in range(N)]
    producer = Producer(
        {"bootstrap.servers": bootstrap, "compression.type": "lz4", "enable.idempotence": True, "linger.ms": 20}
    )
    for key, value in sent:
        producer.produce(topic, key=key, value=value, partition=0)
    assert producer.flush(30) == 0
    other = kafka.KafkaProducer(bootstrap_servers=bootstrap, compression_type="gzip", linger_ms=20)
    try:
        more = [(b"k%d" % i, b"kafka-python-%d-" % i * 8) for i in range(N)]
        for key, value in more:
            other.send(topic, key=key, value=value, partition=0)
        other.flush(30)
    finally:
        other.close(5)
    return sent + more


def _confluent_read(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("ct"), "enable.auto.commit": False})
    out: list[tuple[bytes, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while len(out) < 2 * N and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=2 * N, timeout=0.2):
                assert msg.error() is None, msg.error()
                out.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return out


def _kafka_python_read(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    tp = kafka.TopicPartition(topic, 0)
    consumer.assign([tp])
    out: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + 30
    try:
        while len(out) < 2 * N and time.monotonic() < deadline:
            for records in consumer.poll(200).values():
                out.extend((r.key, r.value) for r in records)
    finally:
        consumer.close()
    return out


def _stored_codecs(broker: Any, topic: str) -> list[int]:
    """The codec of every batch the broker serves from offset 0 (raw Fetch bytes, mqk's raw client)."""
    return [codec for codec, _head in stored_batches(broker.bootstrap, topic)]


@pytest.mark.parametrize("codec", ["uncompressed", "gzip", "snappy", "lz4", "zstd"])
def test_a_topics_codec_is_what_is_stored_and_both_clients_read_it_back(shared_broker: Any, codec: str) -> None:
    topic = unique(f"codec-{codec}")
    create_topic(shared_broker.bootstrap, topic, 1, {"compression.type": codec})
    sent = _write(shared_broker.bootstrap, topic)
    codecs = _stored_codecs(shared_broker, topic)
    assert codecs and set(codecs) == {CODEC_IDS["none" if codec == "uncompressed" else codec]}
    assert _confluent_read(shared_broker.bootstrap, topic) == sent
    assert _kafka_python_read(shared_broker.bootstrap, topic) == sent


def test_a_producer_topic_keeps_each_producers_codec(shared_broker: Any) -> None:
    topic = unique("codec-producer")
    create_topic(shared_broker.bootstrap, topic, 1)
    sent = _write(shared_broker.bootstrap, topic)
    assert set(_stored_codecs(shared_broker, topic)) == {CODEC_IDS["lz4"], CODEC_IDS["gzip"]}
    assert _confluent_read(shared_broker.bootstrap, topic) == sent
