"""segment.ms on a quiet compacted topic, with confluent-kafka as producer and consumer: nothing is cleaned while
every record sits in the active segment, however long the topic stays quiet; the first append more than segment.ms
after the segment's first batch rolls it (Kafka's roll rule), and the next cleaner pass removes the overwritten
records. The broker runs in-process on a FakeClock (the records carry the clock's time as their CreateTime), so no
test waits for segment.ms to pass."""

from __future__ import annotations

import time

import pytest
from compat_helpers import unique
from confluent_kafka import Consumer, Producer, TopicPartition

from mqk.clock import FakeClock
from mqk.config import TopicConfig


@pytest.fixture
def mqk_clock(mqk_fake_clock: FakeClock) -> FakeClock:
    return mqk_fake_clock


def _read_all(bootstrap: str, topic: str, end: int) -> list[tuple[int, bytes | None, bytes | None]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("roll"), "enable.auto.commit": False})
    out: list[tuple[int, bytes | None, bytes | None]] = []
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


@pytest.mark.parametrize("which", ["mqk_broker", "mqk_file_broker"])
def test_a_quiet_compacted_topic_is_cleaned_after_the_next_append_past_segment_ms(request, which: str) -> None:
    broker = request.getfixturevalue(which)
    clock: FakeClock = broker.clock
    topic = unique("quiet-compacted")
    config = TopicConfig({"cleanup.policy": "compact", "segment.ms": "200"})
    broker.call(broker.store.create_topic(topic, 1, config))
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})

    def send(key: bytes, value: bytes) -> None:
        producer.produce(topic, key=key, value=value, timestamp=clock.time_ms())
        assert producer.flush(10) == 0

    def clean() -> str | None:
        """One cleaner pass; why the topic was skipped, None if it was cleaned."""
        report = broker.call(broker.runtime.compaction.run_once())
        assert ((topic, 0) in report.cleaned) != ((topic, 0) in report.skipped)
        return report.skipped.get((topic, 0))

    send(b"a", b"a1")
    send(b"b", b"b1")
    broker.advance(0.1)
    send(b"a", b"a2")  # 100 ms after the segment's first batch: the same segment
    assert clean() == "only the active head"
    broker.advance(3600)  # quiet for an hour: without an append nothing rolls (Kafka rolls on append)
    assert clean() == "only the active head"
    send(b"c", b"c1")  # the next append, past segment.ms: it starts a new segment, the old one is cleanable
    assert clean() is None
    assert _read_all(broker.bootstrap, topic, 4) == [(1, b"b", b"b1"), (2, b"a", b"a2"), (3, b"c", b"c1")]


def test_segment_bytes_rolls_by_size_whatever_the_time(mqk_broker) -> None:
    broker = mqk_broker
    clock: FakeClock = broker.clock
    topic = unique("small-segments")
    broker.call(broker.store.create_topic(topic, 1, TopicConfig({"cleanup.policy": "compact", "segment.bytes": "200"})))
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for value in (b"x" * 100, b"y" * 100, b"z" * 100):  # each batch fills more than half a segment: 3 segments
        producer.produce(topic, key=b"k", value=value, timestamp=clock.time_ms())
        assert producer.flush(10) == 0
    report = broker.call(broker.runtime.compaction.run_once())
    assert (topic, 0) in report.cleaned
    # the active (last) segment is never cleaned, nor mapped: "y" stays until a later roll, as in Kafka
    assert _read_all(broker.bootstrap, topic, 3) == [(1, b"k", b"y" * 100), (2, b"k", b"z" * 100)]
