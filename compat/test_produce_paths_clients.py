"""Which path a real client's produce takes in the broker: a plain produce (uncompressed, not idempotent) from
confluent-kafka, kafka-python, aiokafka, kafkajs and kcat is planned by the append kernel whole
(recbatch.plan_plain_appends), so /metrics counts no partition on the Produce handler's general path; compressed and
idempotent produces go there, each counted under its own reason. The guard this gives: a change that makes the
kernel decline what clients send plain (a renamed request field, a decoder that hands over another buffer type) is
a failing test here, not a silent slow path."""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.request
from typing import Any

from compat_helpers import create_topic, run_node, unique
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from mqk.protocol.kafka.codec import Declined
from mqk.protocol.kafka.records import PlanStop

FAMILY = "mqk_kafka_produce_general_path_partitions_total"
DECLINED_FAMILY = "mqk_kafka_codec_declined_total"
RECORDS = 30
PARTITIONS = 3


def samples(broker: Any, name: str) -> list[Any]:
    """The samples of one counter on the broker's /metrics."""
    host, port = broker.admin_address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


def general_path(broker: Any) -> dict[str, int]:
    """reason -> produced partitions the broker's Produce handler took on its general path, from /metrics."""
    return {s.labels["reason"]: int(s.value) for s in samples(broker, FAMILY)}


def codec_declined(broker: Any) -> dict[tuple[str, str], int]:
    """(api, reason) -> Produce and Fetch bodies the codec kernels left to the generated codec, from /metrics."""
    return {(s.labels["api"], s.labels["reason"]): int(s.value) for s in samples(broker, DECLINED_FAMILY)}


def confluent(bootstrap: str, topic: str, **config: Any) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    for i in range(RECORDS):
        producer.produce(topic, key=b"c%d" % i, value=b"confluent %d" % i, partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def kafka_python(bootstrap: str, topic: str) -> None:
    from kafka import KafkaProducer

    # (kafka-python 3 makes its producers idempotent by default, as the Java client does)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, enable_idempotence=False)
    try:
        for f in [
            producer.send(topic, key=b"k%d" % i, value=b"kafka-python", partition=i % PARTITIONS)
            for i in range(RECORDS)
        ]:
            f.get(timeout=30)
    finally:
        producer.close()


def aiokafka(bootstrap: str, topic: str) -> None:
    from aiokafka import AIOKafkaProducer

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        await producer.start()
        try:
            for i in range(RECORDS):
                await producer.send_and_wait(topic, b"aiokafka", key=b"a%d" % i, partition=i % PARTITIONS)
        finally:
            await producer.stop()

    asyncio.run(send())


def test_plain_produces_take_the_kernel_path_and_the_others_are_counted_by_reason(mqk_broker, kcat: str) -> None:
    bootstrap = mqk_broker.bootstrap
    topic = unique("paths")
    create_topic(bootstrap, topic, PARTITIONS)
    before = general_path(mqk_broker)
    assert set(before) == {stop.name.lower() for stop in PlanStop if stop is not PlanStop.END}
    declined = codec_declined(mqk_broker)
    assert set(declined) == {(api, why.name.lower()) for api in ("Produce", "Fetch") for why in Declined}

    confluent(bootstrap, topic, **{"enable.idempotence": False, "compression.type": "none"})
    kafka_python(bootstrap, topic)
    aiokafka(bootstrap, topic)
    sent = run_node("kafkajs_client.js", bootstrap, "roundtrip", json.dumps({"topic": topic, "codec": "none", "n": 5}))
    assert all(r["errorCode"] == 0 for r in sent["result"]["sent"])
    lines = "".join(f"kcat{i}\n" for i in range(RECORDS))
    subprocess.run([kcat, "-P", "-b", bootstrap, "-t", topic, "-p", "1"], input=lines.encode(), check=True, timeout=60)
    assert general_path(mqk_broker) == before  # every one of them planned by the kernel
    # their requests and the answers (kafkajs read its records back: Fetch too) all took the codec kernels
    assert codec_declined(mqk_broker) == declined

    # (one batch a partition, linger.ms=500: librdkafka sends a batch uncompressed when gzip does not shrink it, as
    # for three of these records or fewer, which a producer thread held up under load could leave alone in a batch)
    confluent(bootstrap, topic, **{"enable.idempotence": False, "compression.type": "gzip", "linger.ms": 500})
    after_gzip = general_path(mqk_broker)
    assert after_gzip["compressed"] > before["compressed"]
    assert {k: v for k, v in after_gzip.items() if k != "compressed"} == {
        k: v for k, v in before.items() if k != "compressed"
    }

    confluent(bootstrap, topic, **{"enable.idempotence": True, "compression.type": "none"})
    after_idempotent = general_path(mqk_broker)
    assert after_idempotent["idempotent"] > after_gzip["idempotent"]
    assert {k: v for k, v in after_idempotent.items() if k != "idempotent"} == {
        k: v for k, v in after_gzip.items() if k != "idempotent"
    }
