"""Compacted topics as real Kafka clients see them (kafka-python and confluent-kafka against an in-process broker):
keyless records refused with INVALID_RECORD, consumers reading from offset 0 during and after compaction end with
every key's latest value (tombstones as None until delete.retention.ms), offsets only grow and skip removed ranges,
and a consumer positioned inside a removed range moves on to the next existing offset."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings

import pytest
from confluent_kafka import Consumer, TopicPartition

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka
    from kafka.errors import InvalidRecordError

from mqk.config import TopicConfig

pytestmark = pytest.mark.filterwarnings("ignore:(open|read)_text is deprecated:DeprecationWarning")

TOPIC = "compacted-clients"
KEYS = 500
ROUNDS = 8


def _setup(engine_broker) -> dict[bytes, bytes | None]:
    engine_broker.call(
        engine_broker.store.create_topic(
            TOPIC,
            1,
            TopicConfig({"cleanup.policy": "compact", "segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01"}),
        )
    )
    refused = kafka.KafkaProducer(bootstrap_servers=engine_broker.bootstrap)
    try:  # kafka-python treats INVALID_RECORD as fatal for the producer: a producer of its own
        with pytest.raises(InvalidRecordError):
            refused.send(TOPIC, value=b"no key").get(10)
    finally:
        refused.close(5)
    producer = kafka.KafkaProducer(bootstrap_servers=engine_broker.bootstrap, linger_ms=5, batch_size=16384)
    latest: dict[bytes, bytes | None] = {}
    try:
        for r in range(ROUNDS):
            for k in range(KEYS):
                key = b"key-%04d" % k
                value = None if (r == ROUNDS - 1 and k % 10 == 0) else b"value-%d-%d" % (k, r)
                producer.send(TOPIC, key=key, value=value)
                latest[key] = value
            producer.flush(10)
    finally:
        producer.close(5)
    return latest


def _kafka_python_read(bootstrap: str, end: int) -> list[tuple[int, bytes, bytes | None]]:
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=200,
        fetch_max_bytes=64 * 1024,
        max_partition_fetch_bytes=16 * 1024,
    )
    tp = kafka.TopicPartition(TOPIC, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    out = []
    deadline = time.monotonic() + 60
    try:
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for records in consumer.poll(500).values():
                out.extend((r.offset, r.key, r.value) for r in records)
    finally:
        consumer.close()
    return out


def _confluent_read(bootstrap: str, end: int, start: int = 0) -> list[tuple[int, bytes, bytes | None]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "compaction-reader",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    out: list = []
    try:
        consumer.assign([TopicPartition(TOPIC, 0, start)])
        deadline = time.monotonic() + 60
        while (not out or out[-1][0] < end - 1) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return out


def _check(records: list[tuple[int, bytes, bytes | None]], latest: dict[bytes, bytes | None]) -> None:
    offsets = [o for o, _, _ in records]
    assert offsets == sorted(set(offsets)), "offsets must only grow"
    seen = {}
    for _, key, value in records:
        seen[key] = value
    assert seen == latest


def test_consumers_see_latest_values_during_and_after_compaction(engine_broker) -> None:
    latest = _setup(engine_broker)
    end = engine_broker.store.end_offset(TOPIC, 0)
    assert end == KEYS * ROUNDS

    # a kafka-python consumer reads from 0 while the cleaner runs beside it
    during: list = []
    reader = threading.Thread(target=lambda: during.extend(_kafka_python_read(engine_broker.bootstrap, end)))
    reader.start()
    report = asyncio.run_coroutine_threadsafe(engine_broker.runtime.compaction.run_once(), engine_broker.loop).result(
        60
    )
    reader.join(90)
    assert not reader.is_alive()
    stats = report.cleaned[(TOPIC, 0)]
    assert stats.records_removed > KEYS * (ROUNDS - 3)
    _check(during, latest)

    # after: both clients see far fewer records, gaps in the offsets, every key's latest value
    after_kp = _kafka_python_read(engine_broker.bootstrap, end)
    after_ck = _confluent_read(engine_broker.bootstrap, end)
    assert [o for o, _, _ in after_kp] == [o for o, _, _ in after_ck]
    assert len(after_kp) < KEYS * 3
    _check(after_kp, latest)
    _check(after_ck, latest)
    tombstones = [k for _, k, v in after_ck if v is None]
    assert len(set(tombstones)) == KEYS // 10  # still there: delete.retention.ms (1 day) has not passed

    # a consumer positioned inside a removed range moves to the next existing offset
    offsets = [o for o, _, _ in after_ck]
    removed = sorted(set(range(end)) - set(offsets))
    inside = removed[len(removed) // 2]
    moved = _confluent_read(engine_broker.bootstrap, end, start=inside)
    assert moved[0][0] == min(o for o in offsets if o > inside)


def test_idempotent_producer_goes_on_after_compaction(engine_broker) -> None:
    """An idempotent producer's batches keep their producer id, epoch and sequence through compaction (emptied
    last batches stay), so the same producer keeps producing without sequence errors afterwards."""
    from confluent_kafka import Producer

    topic = "compacted-idempotent"
    engine_broker.call(
        engine_broker.store.create_topic(
            topic,
            1,
            TopicConfig({"cleanup.policy": "compact", "segment.bytes": "1", "min.cleanable.dirty.ratio": "0.01"}),
        )
    )
    producer = Producer({"bootstrap.servers": engine_broker.bootstrap, "enable.idempotence": True, "linger.ms": 0})
    errors: list = []

    def produce_round(r: int) -> None:
        for k in range(50):
            producer.produce(
                topic, key=b"k%d" % k, value=b"%d" % r, on_delivery=lambda err, msg: errors.append(err) if err else None
            )
        assert producer.flush(15) == 0

    for r in range(4):
        produce_round(r)
    report = engine_broker.call(engine_broker.runtime.compaction.run_once())
    assert report.cleaned[(topic, 0)].records_removed > 0
    for r in range(4, 6):
        produce_round(r)
    assert errors == []
    got = _confluent_read_topic(engine_broker.bootstrap, topic, engine_broker.store.end_offset(topic, 0))
    assert {k: v for _, k, v in got} == {b"k%d" % k: b"5" for k in range(50)}


def _confluent_read_topic(bootstrap: str, topic: str, end: int) -> list[tuple[int, bytes, bytes | None]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "idempotent-reader",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    out: list = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while (not out or out[-1][0] < end - 1) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return out
