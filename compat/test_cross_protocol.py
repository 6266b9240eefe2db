"""One store, two protocols: what a RocketMQ client sends a Kafka client reads, and the other way round, at the
same offsets. The RocketMQ side is ali-ons (compat/js/ons.js) or mqk.client; the Kafka side is confluent-kafka."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from compat_helpers import NodeProcess, create_topic, run_node, unique
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from helpers import wait_until

pytestmark = pytest.mark.timeout(90)


def ons_produce(namesrv: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    results = run_node("ons.js", namesrv, "produce", json.dumps({"messages": messages}), timeout=40)["result"]
    assert [r["sendStatus"] for r in results] == ["SEND_OK"] * len(messages), results
    return results


def kafka_read(bootstrap: str, topic: str, count: int, timeout: float = 20) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("x-read"), "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=count, timeout=0.2):
                assert m.error() is None, m.error()
                out.append(m)
        return out
    finally:
        consumer.close()


def kafka_produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> list[int]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    offsets: list[int] = []
    for rec in records:
        producer.produce(
            topic, partition=0, on_delivery=lambda err, msg: offsets.append(-1 if err else msg.offset()), **rec
        )
    assert producer.flush(20) == 0
    return offsets


def test_remoting_message_is_a_kafka_record(bootstrap: str, namesrv: str, topic: str) -> None:
    create_topic(bootstrap, topic, 1)
    sent = ons_produce(
        namesrv,
        [
            {
                "topic": topic,
                "tags": "TagA",
                "keys": ["first-key", "second-key"],
                "body": f"from remoting {i}",
                "props": {"color": "red", "n": str(i)},
            }
            for i in range(3)
        ],
    )
    got = kafka_read(bootstrap, topic, 3)
    assert [m.offset() for m in got] == [r["queueOffset"] for r in sent] == [0, 1, 2]
    for i, m in enumerate(got):
        assert m.key() == b"first-key"
        assert m.value() == f"from remoting {i}".encode()
        headers = dict(m.headers() or [])
        assert headers.get("color") == b"red" and headers.get("n") == str(i).encode()
        assert headers.get("TAGS") == b"TagA"
        assert headers.get("KEYS") == b"first-key second-key"


def test_kafka_record_pulled_over_remoting(bootstrap: str, namesrv: str, topic: str) -> None:
    create_topic(bootstrap, topic, 1)
    offsets = kafka_produce(
        bootstrap,
        topic,
        [
            {
                "key": f"kk{i}".encode(),
                "value": f"from kafka {i}".encode(),
                "headers": [("color", b"blue"), ("trace", f"t{i}".encode())],
            }
            for i in range(3)
        ],
    )
    assert offsets == [0, 1, 2]
    consumer = NodeProcess("ons.js", namesrv, "consume", json.dumps({"topic": topic, "group": unique("x-pull")}))
    try:
        wait_until(lambda: len(consumer.of("msg")) >= 3, 30, f"3 messages ({consumer.diagnostics()})")
        got = sorted(consumer.of("msg"), key=lambda m: m["queueOffset"])
    finally:
        consumer.close()
    assert [m["queueOffset"] for m in got] == [0, 1, 2]
    for i, m in enumerate(got):
        assert m["body"] == f"from kafka {i}"
        assert m["topic"] == topic and m["queueId"] == 0
        assert m["props"]["color"] == "blue" and m["props"]["trace"] == f"t{i}"
        assert m["keys"] == f"kk{i}"  # a Kafka key reads back as KEYS


def test_offsets_agree_when_both_protocols_write(bootstrap: str, namesrv: str, topic: str) -> None:
    create_topic(bootstrap, topic, 1)
    assert kafka_produce(bootstrap, topic, [{"value": b"k0"}, {"value": b"k1"}]) == [0, 1]
    sent = ons_produce(namesrv, [{"topic": topic, "tags": "M", "body": body} for body in ("r2", "r3")])
    assert [r["queueOffset"] for r in sent] == [2, 3]
    assert kafka_produce(bootstrap, topic, [{"value": b"k4"}]) == [4]
    got = kafka_read(bootstrap, topic, 5)
    assert [(m.offset(), m.value()) for m in got] == [(0, b"k0"), (1, b"k1"), (2, b"r2"), (3, b"r3"), (4, b"k4")]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("x-wm")})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 5)
    finally:
        consumer.close()


# The same two directions with mqk's own native client (mqk.client) on the RocketMQ side.


async def test_native_client_message_read_by_kafka_client(bootstrap: str, namesrv: str, topic: str) -> None:
    from mqk.client import Message, Producer

    create_topic(bootstrap, topic, 1)
    async with Producer(namesrv, group=unique("x-native-prod")) as producer:
        single = await producer.send(
            Message(topic, b"native one", tags="T1", keys=["nk1", "nk2"], properties={"origin": "mqk.client"})
        )
        batch = await producer.send_batch(
            [Message(topic, f"native batch {i}".encode(), keys=[f"b{i}"]) for i in range(3)], queue_id=0
        )
    assert single.queue_offset == 0 and batch.queue_offset == 1
    got = await asyncio.to_thread(kafka_read, bootstrap, topic, 4)
    assert [m.offset() for m in got] == [0, 1, 2, 3]
    assert (got[0].key(), got[0].value()) == (b"nk1", b"native one")
    headers = dict(got[0].headers() or [])
    assert headers.get("origin") == b"mqk.client" and headers.get("TAGS") == b"T1"
    assert [(m.key(), m.value()) for m in got[1:]] == [
        (f"b{i}".encode(), f"native batch {i}".encode()) for i in range(3)
    ]


async def test_kafka_record_pulled_by_native_client(bootstrap: str, namesrv: str, topic: str) -> None:
    from mqk.client import PullConsumer

    create_topic(bootstrap, topic, 1)
    offsets = await asyncio.to_thread(
        kafka_produce,
        bootstrap,
        topic,
        [{"key": b"kafka-key", "value": f"kafka {i}".encode(), "headers": [("h", f"v{i}".encode())]} for i in range(4)],
    )
    assert offsets == [0, 1, 2, 3]
    async with PullConsumer(namesrv, group=unique("x-native-pull")) as consumer:
        (mq,) = await consumer.queues(topic)
        assert await consumer.max_offset(mq) == 4
        result = await consumer.pull(mq, 1, max_nums=32)
    assert [m.queue_offset for m in result.messages] == [1, 2, 3]
    assert result.next_offset == 4
    for i, m in zip(range(1, 4), result.messages):
        assert m.body == f"kafka {i}".encode()
        assert m.properties["h"] == f"v{i}"
        assert m.keys == ["kafka-key"]


def test_kafka_producer_delayed_delivery_headers(bootstrap: str, topic: str) -> None:
    """The timer serves Kafka producers too: `mqk-delay-ms` (ms from now) and `mqk-deliver-at` (epoch ms)."""
    create_topic(bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    # the reader is assigned before the records are sent: its start (connection, metadata, the partition's first
    # offset) runs while they are produced, not after them, where a slow machine could stretch the lateness of
    # "now" past its 1.4 s
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("x-delay"), "fetch.wait.max.ms": 100})
    arrivals: dict[bytes, tuple[float, Any]] = {}
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        sent_at = time.time() * 1000
        producer.produce(
            topic,
            key=b"later",
            value=b"in 1.5 s",
            partition=0,
            headers=[("mqk-delay-ms", b"1500"), ("trace", b"t-delay")],
        )
        producer.flush(10)
        producer.produce(
            topic,
            key=b"at",
            value=b"at +2.5 s",
            partition=0,
            headers=[("mqk-deliver-at", str(int(sent_at) + 2500).encode())],
        )
        producer.flush(10)
        producer.produce(topic, key=b"now", value=b"now", partition=0)
        assert producer.flush(10) == 0

        deadline = time.monotonic() + 15
        while len(arrivals) < 3 and time.monotonic() < deadline:
            m = consumer.poll(0.05)
            if m is not None and m.error() is None:
                arrivals[m.key()] = (time.time() * 1000, m)
    finally:
        consumer.close()
    assert set(arrivals) == {b"later", b"at", b"now"}, sorted(arrivals)
    lateness = {k.decode(): t - sent_at for k, (t, _) in arrivals.items()}
    assert lateness["now"] < 1400, lateness
    assert 1400 <= lateness["later"] <= 1500 + 2500, lateness
    assert 2400 <= lateness["at"] <= 2500 + 2500, lateness
    later = arrivals[b"later"][1]
    assert later.value() == b"in 1.5 s" and ("trace", b"t-delay") in (later.headers() or [])
    # injected when due, so after the record sent without a delay
    assert arrivals[b"now"][1].offset() < later.offset() < arrivals[b"at"][1].offset()
