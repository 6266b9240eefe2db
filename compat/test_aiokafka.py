"""aiokafka against mqk: codecs, headers, groups, restart, admin, timestamps, idempotence."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import CommitFailedError, IllegalGenerationError, RebalanceInProgressError
from aiokafka.structs import OffsetAndMetadata
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

pytestmark = pytest.mark.timeout(90)

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


async def read_partition(
    bootstrap: str,
    topic: str,
    partition: int,
    start: int,
    count: int,
    timeout: float = 20,  # noqa: ASYNC109 - one deadline for the whole read, a test helper's
) -> list[Any]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for recs in (await consumer.getmany(timeout_ms=200)).values():
                out.extend(recs)
        return out
    finally:
        await consumer.stop()


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c or "none")
async def test_keys_headers_and_codec_round_trip(bootstrap: str, topic: str, codec: str | None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=5)
    await producer.start()
    sent = []
    try:
        futures = []
        for i in range(25):
            key, value = f"ak-{i}".encode(), (f"aiokafka {i} " * (i + 2)).encode()
            headers = [("i", str(i).encode()), ("empty", b"")]
            sent.append((key, value, headers))
            futures.append(await producer.send(topic, value=value, key=key, headers=headers, partition=0))
        metas = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    assert [m.offset for m in metas] == list(range(25))
    assert_stored_with(bootstrap, topic, codec)

    got = await read_partition(bootstrap, topic, 0, 0, len(sent))
    assert [r.offset for r in got] == list(range(len(sent)))
    for (key, value, headers), rec in zip(sent, got):
        assert (rec.key, rec.value, list(rec.headers)) == (key, value, headers)


def test_consumer_group_join_and_leave_no_loss_no_duplicates(bootstrap: str, topic: str, group: str) -> None:
    create_topic(bootstrap, topic, 6)
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})

    def produce(start: int, count: int) -> None:
        for v in range(start, start + count):
            producer.produce(topic, value=str(v).encode(), partition=v % 6)
        assert producer.flush(20) == 0

    # Each member owns an event loop in its thread; aiokafka's heartbeat task runs while getmany() waits.
    def setup() -> tuple[asyncio.AbstractEventLoop, AIOKafkaConsumer]:
        loop = asyncio.new_event_loop()

        async def make() -> AIOKafkaConsumer:
            c = AIOKafkaConsumer(
                topic,
                bootstrap_servers=bootstrap,
                group_id=group,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                session_timeout_ms=SESSION_TIMEOUT_MS,
                heartbeat_interval_ms=HEARTBEAT_MS,
            )
            await c.start()
            return c

        return loop, loop.run_until_complete(make())

    def poll_once(state: tuple[asyncio.AbstractEventLoop, AIOKafkaConsumer]) -> list[int]:
        loop, c = state

        async def once() -> list[int]:
            batches = await c.getmany(timeout_ms=200)
            values = [int(r.value) for recs in batches.values() for r in recs]
            if values:
                try:
                    await c.commit()
                except (CommitFailedError, RebalanceInProgressError, IllegalGenerationError):
                    return []  # not processed: the partition's next owner resumes from the last commit
            return values

        return loop.run_until_complete(once())

    def shutdown(state: tuple[asyncio.AbstractEventLoop, AIOKafkaConsumer]) -> None:
        loop, c = state
        try:
            loop.run_until_complete(c.stop())
        finally:
            loop.close()

    run_group_scenario(
        produce, lambda name: ThreadMember(name, setup, poll_once, shutdown, lambda s: len(s[1].assignment()))
    )


async def test_commit_and_resume_after_restart(file_broker: Any, topic: str, group: str) -> None:
    bootstrap = hostport(file_broker.bootstrap)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(50):
            await producer.send(topic, str(i).encode(), partition=0)
        await producer.flush()
    finally:
        await producer.stop()

    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.commit({tp: OffsetAndMetadata(17, "ak-17")})
    finally:
        await consumer.stop()

    await asyncio.to_thread(file_broker.stop)
    await asyncio.to_thread(file_broker.restart)
    bootstrap = hostport(file_broker.bootstrap)

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
    )
    await consumer.start()
    try:
        got: list[int] = []
        deadline = time.monotonic() + 25
        while len(got) < 33 and time.monotonic() < deadline:
            got += [r.offset for recs in (await consumer.getmany(timeout_ms=200)).values() for r in recs]
        assert got == list(range(17, 50))
        assert await consumer.committed(tp) == 17
    finally:
        await consumer.stop()


def _find_config(obj: Any, name: str) -> Any:
    """Dig a config value out of a raw DescribeConfigs response, whatever its version's field names."""
    if isinstance(obj, dict):
        names = [obj.get(k) for k in ("config_names", "name", "config_name")]
        if name in names:
            for k in ("config_value", "value"):
                if k in obj:
                    return obj[k]
        for v in obj.values():
            found = _find_config(v, name)
            if found is not None:
                return found
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            found = _find_config(v, name)
            if found is not None:
                return found
    return None


async def test_admin_create_describe_delete(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 3, 1, topic_configs={"retention.ms": "86400001"})])
        assert topic in await admin.list_topics()
        described = await admin.describe_topics([topic])
        assert len(described[0]["partitions"]) == 3
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        objs = [r.to_object() for r in responses]
        assert _find_config(objs, "retention.ms") == "86400001"
        assert _find_config(objs, "cleanup.policy") == "delete"
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {"retention.ms": "5000"})])
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        assert _find_config([r.to_object() for r in responses], "retention.ms") == "5000"
        await admin.delete_topics([topic])
        assert topic not in await admin.list_topics()  # mqk answers DeleteTopics once the topic is gone
    finally:
        await admin.close()


async def test_offsets_for_times(bootstrap: str, topic: str) -> None:
    base = int(time.time() * 1000) - 30_000
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(6):
            await producer.send_and_wait(topic, str(i).encode(), partition=0, timestamp_ms=base + i * 1000)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        found = await consumer.offsets_for_times({tp: base + 1001})
        assert found[tp].offset == 2 and found[tp].timestamp == base + 2000
        assert (await consumer.offsets_for_times({tp: base + 99_000}))[tp] is None
        assert await consumer.end_offsets([tp]) == {tp: 6}
        assert await consumer.beginning_offsets([tp]) == {tp: 0}
    finally:
        await consumer.stop()


async def test_idempotent_producer_across_restart(file_broker: Any, topic: str) -> None:
    bootstrap = hostport(file_broker.bootstrap)
    create_topic(bootstrap, topic, 1)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, retry_backoff_ms=200, request_timeout_ms=15000
    )
    await producer.start()
    try:
        first = [await producer.send_and_wait(topic, str(i).encode(), partition=0) for i in range(30)]
        await asyncio.to_thread(file_broker.stop)
        await asyncio.to_thread(file_broker.restart)
        assert hostport(file_broker.bootstrap) == bootstrap
        second = [await producer.send_and_wait(topic, str(i).encode(), partition=0) for i in range(30, 60)]
    finally:
        await producer.stop()
    assert [m.offset for m in first + second] == list(range(60))
    got = await read_partition(bootstrap, topic, 0, 0, 60)
    assert [int(r.value) for r in got] == list(range(60))


async def test_metadata_auto_create(bootstrap: str) -> None:
    name = unique("ak-auto")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(name, b"x")
        assert (meta.topic, meta.partition, meta.offset) == (name, 0, 0)
        assert await producer.partitions_for(name) == {0}
    finally:
        await producer.stop()
