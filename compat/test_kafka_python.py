"""kafka-python 3 against mqk: codecs, headers, groups, restart, admin, timestamps, idempotence.

kafka-python frames snappy the xerial way (its default `xerial_compatible=True`), so its snappy round trip is the
compat suite's check of that framing; the other clients send raw snappy.
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from compat_helpers import (
    HEARTBEAT_MS,
    SESSION_TIMEOUT_MS,
    ThreadMember,
    assert_stored_with,
    create_topic,
    hostport,
    run_group_scenario,
    unique,
)
from helpers import wait_until
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions
from kafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    RebalanceInProgressError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from kafka.structs import OffsetAndMetadata

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(autouse=True)
def _collect_failed_connect_sockets() -> Iterator[None]:
    """kafka-python 3.0.12 drops (without closing) the sockets of connection attempts refused while the broker
    restarts; collect them here, where that is expected, instead of letting their ResourceWarning land in
    whichever later test the garbage collector happens to run in."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


def read_partition(
    bootstrap: str, topic: str, partition: int, start: int, count: int, timeout: float = 20
) -> list[Any]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=200).values():
                out.extend(recs)
        return out
    finally:
        consumer.close()


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c or "none")
def test_keys_headers_and_codec_round_trip(bootstrap: str, topic: str, codec: str | None) -> None:
    # One batch for all of them (linger_ms=500; flush() sends at once): kafka-python sends a batch uncompressed when
    # compressing does not shrink it, as a batch of the first record or two alone is, which its sender thread sends
    # after 5 ms when the thread adding the rest is held up that long on a loaded machine.
    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=500, acks=1)
    sent = []
    for i in range(25):
        key = f"key-{i}".encode()
        value = (f"kafka-python {i} " * (i + 1)).encode()
        headers = [("idx", str(i).encode()), ("codec", (codec or "none").encode())]
        sent.append((key, value, headers))
        producer.send(topic, value=value, key=key, headers=headers, partition=0)
    producer.send(topic, value=None, key=b"tombstone", partition=0)
    sent.append((b"tombstone", None, []))
    producer.flush(20)
    producer.close()

    assert_stored_with(bootstrap, topic, codec, xerial=True if codec == "snappy" else None)
    got = read_partition(bootstrap, topic, 0, 0, len(sent))
    assert [r.offset for r in got] == list(range(len(sent)))
    for (key, value, headers), rec in zip(sent, got):
        assert rec.key == key
        assert rec.value == value
        assert list(rec.headers) == headers


def test_consumer_group_join_and_leave_no_loss_no_duplicates(bootstrap: str, topic: str, group: str) -> None:
    create_topic(bootstrap, topic, 6)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=2, acks="all")

    def produce(start: int, count: int) -> None:
        for v in range(start, start + count):
            producer.send(topic, value=str(v).encode(), partition=v % 6)
        producer.flush(20)

    def setup() -> KafkaConsumer:
        return KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
        )

    def poll_once(c: KafkaConsumer) -> list[int]:
        values = [int(r.value) for recs in c.poll(timeout_ms=200).values() for r in recs]
        if values:
            try:
                c.commit()
            except (CommitFailedError, RebalanceInProgressError, IllegalGenerationError):
                return []  # not processed: the partition's next owner resumes from the last commit
        return values

    try:
        run_group_scenario(
            produce,
            lambda name: ThreadMember(name, setup, poll_once, lambda c: c.close(), lambda c: len(c.assignment())),
        )
    finally:
        producer.close()


def test_commit_with_metadata_and_resume_after_restart(file_broker: Any, topic: str, group: str) -> None:
    bootstrap = hostport(file_broker.bootstrap)
    create_topic(bootstrap, topic, 1)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for i in range(60):
        producer.send(topic, value=str(i).encode(), partition=0)
    producer.flush(20)
    producer.close()

    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
    )
    consumer.assign([tp])
    consumer.commit({tp: OffsetAndMetadata(25, "kp-25", -1)})
    consumer.close()

    file_broker.stop()
    file_broker.restart()
    bootstrap = hostport(file_broker.bootstrap)

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    try:
        consumer.assign([tp])
        committed = consumer.committed(tp, metadata=True)
        assert committed.offset == 25 and committed.metadata == "kp-25"
        got: list[int] = []
        deadline = time.monotonic() + 20
        while len(got) < 35 and time.monotonic() < deadline:
            got += [r.offset for recs in consumer.poll(timeout_ms=200).values() for r in recs]
        assert got == list(range(25, 60))
    finally:
        consumer.close()


def _topic_configs(result: Any, topic: str) -> dict[str, Any]:
    if isinstance(result, dict):
        for by_name in result.values():
            if isinstance(by_name, dict) and topic in by_name:
                return by_name[topic]
    raise AssertionError(f"no configs for {topic} in {result!r}"[:2000])


def test_admin_topics_and_configs(bootstrap: str, topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics(
            {topic: {"num_partitions": 2, "replication_factor": 1, "configs": {"retention.ms": "1234567"}}}
        )
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics({topic: {"num_partitions": 2, "replication_factor": 1}})
        assert topic in admin.list_topics()
        described = [t for t in admin.describe_topics([topic]) if t["name"] == topic]
        assert len(described) == 1 and len(described[0]["partitions"]) == 2

        resource = ConfigResource(ConfigResourceType.TOPIC, topic)
        configs = _topic_configs(admin.describe_configs([resource], config_filter="all"), topic)
        assert configs["retention.ms"]["value"] == "1234567"
        assert configs["cleanup.policy"]["value"] == "delete"
        assert "segment.bytes" in configs and "max.message.bytes" in configs

        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs={"retention.ms": "999"})])
        configs = _topic_configs(admin.describe_configs([resource], config_filter="all"), topic)
        assert configs["retention.ms"]["value"] == "999"

        admin.create_partitions({topic: NewPartitions(total_count=4)})
        wait_until(lambda: len(admin.describe_topics([topic])[0]["partitions"]) == 4, 10, "4 partitions")

        admin.delete_topics([topic])
        wait_until(lambda: topic not in admin.list_topics(), 10, "the topic to be gone")
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_topics([topic])
    finally:
        admin.close()


def test_offsets_for_times_and_end_offsets(bootstrap: str, topic: str) -> None:
    base = int(time.time() * 1000) - 50_000
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    for i in range(8):
        producer.send(topic, value=str(i).encode(), partition=0, timestamp_ms=base + i * 1000)
        producer.flush(10)  # one batch per record
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tp = TopicPartition(topic, 0)
        found = consumer.offsets_for_times({tp: base + 2500})
        assert found[tp].offset == 3 and found[tp].timestamp == base + 3000
        assert consumer.offsets_for_times({tp: base + 60_000})[tp] is None
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 8}
    finally:
        consumer.close()


def test_idempotent_producer_across_restart(file_broker: Any, topic: str) -> None:
    bootstrap = hostport(file_broker.bootstrap)
    create_topic(bootstrap, topic, 1)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        retries=20,
        retry_backoff_ms=200,
        reconnect_backoff_ms=100,
        reconnect_backoff_max_ms=500,
        request_timeout_ms=10000,
    )
    futures = [producer.send(topic, value=str(i).encode(), partition=0) for i in range(40)]
    producer.flush(20)
    file_broker.stop()
    file_broker.restart()
    assert hostport(file_broker.bootstrap) == bootstrap
    futures += [producer.send(topic, value=str(i).encode(), partition=0) for i in range(40, 80)]
    producer.flush(40)
    offsets = [f.get(timeout=5).offset for f in futures]
    producer.close()
    assert offsets == list(range(80))
    got = read_partition(bootstrap, topic, 0, 0, 80)
    assert [int(r.value) for r in got] == list(range(80))
    # every send was acknowledged and the producer is closed: the log's end is final, and nothing is stored twice
    watcher = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        assert watcher.end_offsets([TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): 80}
    finally:
        watcher.close()


def test_metadata_auto_create(bootstrap: str) -> None:
    name = unique("kp-auto")
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    meta = producer.send(name, b"hello").get(timeout=15)
    producer.close()
    assert meta.topic == name and meta.partition == 0 and meta.offset == 0
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        assert name in consumer.topics()
        assert consumer.partitions_for_topic(name) == {0}
    finally:
        consumer.close()
