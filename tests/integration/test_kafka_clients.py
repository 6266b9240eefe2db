"""Real Kafka clients (kafka-python, aiokafka) against the mqk Kafka server on a free port, in process.

kafka-python is synchronous, so its broker runs on an event loop in a background thread; aiokafka shares the
test's own loop with the broker."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import uuid
import warnings

import pytest
from helpers import wait_until, wait_until_async

from mqk.config import BrokerConfig, StoreConfig
from mqk.server.kafka.server import KafkaServer
from mqk.store.manager import StoreManager

# kafka-python 3 reads its bundled specs through importlib.resources' legacy API; the DeprecationWarning that
# raises is attributed to importlib, so the setup.cfg filter for kafka.* does not catch it. Import it quietly once.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka
    import kafka.admin

pytestmark = pytest.mark.filterwarnings("ignore:(open|read)_text is deprecated:DeprecationWarning")


def config(**overrides) -> BrokerConfig:
    return BrokerConfig(
        kafka_listen=("127.0.0.1", 0),
        store=StoreConfig(storage="memory"),
        group_min_session_timeout_ms=100,
        **overrides,
    )


class ThreadedKafka:
    def __init__(self, **overrides) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.store = StoreManager(config().store)
        self.server = KafkaServer(config(**overrides), self.store)
        self.call(self.store.start())
        host, port = self.call(self.server.start())
        self.bootstrap = f"{host}:{port}"

    def call(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.call(self.server.stop())
        self.call(self.store.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def kafka(request):
    broker = ThreadedKafka(**getattr(request, "param", {}))
    yield broker
    # kafka-python 3.0.12 drops, without closing, the sockets of connection attempts refused once the broker is
    # gone, and its IO threads can outlive close() briefly: let them finish before the broker stops, and collect
    # any such socket here instead of in a later test
    deadline = time.monotonic() + 5
    for thread in threading.enumerate():
        if thread.name.startswith("kafka"):
            thread.join(max(0.0, deadline - time.monotonic()))
    broker.stop()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


# --- kafka-python ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "gzip", "lz4", "zstd"])  # (no snappy library for kafka-python)
def test_kafka_python_produce_consume_keys_headers_compression(kafka, compression):
    from kafka import KafkaConsumer, KafkaProducer

    topic = topic_name()
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, compression_type=compression, linger_ms=5)
    sent = []
    for i in range(200):
        key, value = f"k{i % 7}".encode(), f"value-{i}".encode() * 3
        producer.send(topic, key=key, value=value, headers=[("h", str(i).encode())])
        sent.append((key, value, [("h", str(i).encode())]))
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(
        topic, bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    got = []
    deadline = time.time() + 20
    while len(got) < len(sent) and time.time() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            got += [(m.key, m.value, list(m.headers)) for m in records]
    consumer.close()
    assert got == sent
    batch_codec = {None: 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[compression]
    stored = kafka.call(kafka.store.read(topic, 0, 0, 1 << 20))
    codecs = [(bytes(b.data)[22] & 0x07, b.record_count) for b in stored.batches]
    # kafka-python sends a batch uncompressed when compressing does not make it smaller (a record or two); the
    # stored batches are as sent, and every batch of a few records or more shrinks
    assert all(codec in (batch_codec, 0) for codec, _ in codecs), codecs
    assert all(codec == batch_codec for codec, count in codecs if count >= 10), codecs
    assert any(count >= 10 for _, count in codecs), codecs


# The first JoinGroup waits group.initial.rebalance.delay.ms (Kafka's default is 3 s; mqk's, like the
# server.properties Kafka ships, 0), so the leader already has the topic's metadata when it assigns. Without the
# delay a lone leader assigns nothing ("no partition metadata"), rejoins as soon as the metadata lands, and
# kafka-python 3.0.12 has a race there: if poll()'s timeout expires while that rejoin is in flight, the next
# poll() sees no reason to rejoin (the leader's assignment snapshot already matches the metadata) and never
# completes the join, so its heartbeats stay disabled and the broker expels it when its session expires. Client
# debug logs of failing runs showed exactly that: SyncGroup answered, no "Enabling heartbeat" after it.
@pytest.mark.parametrize("kafka", [{"group_initial_rebalance_delay_ms": 500}], indirect=True)
def test_kafka_python_group_of_two_splits_partitions_and_resumes_from_commits(kafka):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient

    topic = topic_name()
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    admin.create_topics({topic: {"num_partitions": 4, "replication_factor": 1}})
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)

    def consumer():
        return KafkaConsumer(
            topic,
            bootstrap_servers=kafka.bootstrap,
            group_id="grp",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=200,
            consumer_timeout_ms=200,
        )

    # each member polls in its own thread: a kafka-python poll() blocks while its JoinGroup is parked, so one
    # thread polling both members would stall every rebalance until a session timeout
    seen: dict[str, list[int]] = {"a": [], "b": []}
    stop = threading.Event()

    def run(name, c):
        while not stop.is_set():
            for records in c.poll(timeout_ms=100).values():
                seen[name] += [int(r.value) for r in records]

    # b joins once a is stable, as a scaled-out service does
    a = consumer()
    threads = [threading.Thread(target=run, args=("a", a))]
    threads[0].start()
    try:
        wait_until(a.assignment, 30, "a to be assigned partitions")
        b = consumer()
        threads.append(threading.Thread(target=run, args=("b", b)))
        threads[1].start()
        wait_until(lambda: a.assignment() and b.assignment(), 30, "a and b to split the partitions")
        for i in range(400):
            producer.send(topic, value=str(i).encode(), partition=i % 4)
        producer.flush()
        wait_until(lambda: len(seen["a"]) + len(seen["b"]) >= 400, 30, "400 records consumed")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert sorted(seen["a"] + seen["b"]) == list(range(400))  # nothing lost, nothing twice
    assert seen["a"] and seen["b"] and not (a.assignment() & b.assignment())
    a.commit()
    b.commit()
    assert {"group_id": "grp", "protocol_type": "consumer", "group_state": "Stable", "group_type": "classic"} in (
        admin.list_groups()
    )
    described = admin.describe_groups(["grp"])["grp"]
    assert described["group_state"] == "Stable" and len(described["members"]) == 2
    assigned = sorted(
        p for m in described["members"] for t in m["member_assignment"]["assigned_partitions"] for p in t["partitions"]
    )
    assert assigned == [0, 1, 2, 3]
    a.close()
    b.close()
    # more data, then a new member of the group resumes exactly after the committed offsets
    for i in range(400, 440):
        producer.send(topic, value=str(i).encode(), partition=i % 4)
    producer.flush()
    producer.close()
    c = consumer()
    rest = []
    deadline = time.time() + 20
    while len(rest) < 40 and time.time() < deadline:
        for records in c.poll(timeout_ms=200).values():
            rest += [int(r.value) for r in records]
    c.close()
    assert sorted(rest) == list(range(400, 440))
    offsets = admin.list_group_offsets({"grp": None})["grp"]
    assert sum(o.offset for o in offsets.values()) == 400
    admin.close()


def test_kafka_python_admin_topics_configs_and_offsets_for_times(kafka):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewPartitions
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    topic = topic_name()
    admin.create_topics({topic: {"num_partitions": 2, "replication_factor": 1, "configs": {"retention.ms": "12345"}}})
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topics({topic: {"num_partitions": 2, "replication_factor": 1}})
    assert topic in admin.list_topics()
    resource = ConfigResource(ConfigResourceType.TOPIC, topic)

    def configs():
        return admin.describe_configs([resource], config_filter="all")["topic"][topic]

    described = configs()
    assert described["retention.ms"]["value"] == "12345"
    assert described["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert described["cleanup.policy"]["value"] == "delete"
    assert described["cleanup.policy"]["config_source"] == "DEFAULT_CONFIG"
    admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs={"retention.ms": "999"})])
    assert configs()["retention.ms"]["value"] == "999"
    admin.create_partitions({topic: NewPartitions(total_count=3)})
    assert kafka.store.topic(topic).queue_count == 3

    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    base = 1_700_000_000_000
    for i in range(10):
        producer.send(topic, value=b"v", partition=0, timestamp_ms=base + i * 1000)
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap)
    tp = TopicPartition(topic, 0)
    found = consumer.offsets_for_times({tp: base + 4500})[tp]
    assert (found.offset, found.timestamp) == (5, base + 5000)
    assert consumer.offsets_for_times({tp: base + 99_000})[tp] is None
    assert consumer.beginning_offsets([tp])[tp] == 0 and consumer.end_offsets([tp])[tp] == 10
    consumer.close()
    admin.delete_topics([topic])
    assert kafka.store.topic(topic) is None
    admin.close()


# --- aiokafka ----------------------------------------------------------------------------------------------


@pytest.fixture
async def inloop_kafka():
    cfg = config()
    store = StoreManager(cfg.store)
    await store.start()
    server = KafkaServer(cfg, store)
    host, port = await server.start()
    server.bootstrap = f"{host}:{port}"
    yield server
    await server.stop()
    await store.close()


async def test_aiokafka_idempotent_produce_and_group_consume(inloop_kafka):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = topic_name()
    producer = AIOKafkaProducer(
        bootstrap_servers=inloop_kafka.bootstrap, enable_idempotence=True, compression_type="snappy"
    )
    await producer.start()
    try:
        for i in range(100):
            await producer.send(topic, key=b"k", value=str(i).encode())
        meta = await producer.send_and_wait(topic, value=b"last")
        assert meta.offset == 100
    finally:
        await producer.stop()
    stored = await inloop_kafka.store.read(topic, 0, 0, 1 << 20)
    from mqk._fast import load

    header = load("recbatch").parse_header(bytes(stored.batches[0].data), 0)
    assert header[9] >= 0 and header[11] == 0  # producer id set, first sequence 0

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=inloop_kafka.bootstrap,
        group_id="ag",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        got = []
        async with asyncio.timeout(20):
            while len(got) < 101:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    got += [r.value for r in records]
        assert got == [str(i).encode() for i in range(100)] + [b"last"]
        await consumer.commit()
    finally:
        await consumer.stop()
    committed = inloop_kafka.store.fetch_offsets("ag")
    assert committed[(topic, 0)].offset == 101


async def test_aiokafka_slow_consumer_does_not_stall_producer(inloop_kafka):
    """A consumer that never reads its socket while a producer keeps going on another connection."""
    from aiokafka import AIOKafkaProducer

    from mqk.protocol.kafka.api import ApiKey
    from mqk.server.kafka.rawclient import RawKafkaClient

    topic = topic_name()
    producer = AIOKafkaProducer(bootstrap_servers=inloop_kafka.bootstrap, linger_ms=2)
    await producer.start()
    value = b"x" * 10_000
    for _ in range(200):
        await producer.send(topic, value=value)
    await producer.flush()
    slow = await RawKafkaClient.connect(*inloop_kafka.bootstrap.split(":"))
    fetch = {
        "replica_id": -1,
        "max_wait_ms": 0,
        "min_bytes": 0,
        "max_bytes": 50 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "forgotten_topics_data": [],
        "rack_id": "",
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": 0,
                        "current_leader_epoch": -1,
                        "fetch_offset": 0,
                        "log_start_offset": -1,
                        "partition_max_bytes": 50 << 20,
                    }
                ],
            }
        ],
    }
    for _ in range(100):  # ~200 MB of responses nobody reads
        slow.send(ApiKey.FETCH, 12, fetch)
    started = time.monotonic()
    for _ in range(200):
        await producer.send(topic, value=b"y")
    await producer.flush()
    assert time.monotonic() - started < 10
    await producer.stop()
    assert inloop_kafka.store.end_offset(topic, 0) == 400
    await slow.close()


async def test_aiokafka_static_member_restart_keeps_assignment_without_rebalance(inloop_kafka):
    from aiokafka import AIOKafkaConsumer

    topic = topic_name()
    await inloop_kafka.store.create_topic(topic, 2)
    seen = []
    for _ in range(2):
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=inloop_kafka.bootstrap,
            group_id="static",
            group_instance_id="instance-1",
            session_timeout_ms=10000,
        )
        await consumer.start()
        try:
            await wait_until_async(consumer.assignment, 15, "the static member's assignment")
            group = inloop_kafka.groups.groups["static"]
            seen.append(
                (sorted(tp.partition for tp in consumer.assignment()), group.generation_id, list(group.members))
            )
        finally:
            await consumer.stop()  # a static member leaves no LeaveGroup: its place waits for it
    (parts1, gen1, members1), (parts2, gen2, members2) = seen
    assert parts1 == parts2 == [0, 1]
    assert gen1 == gen2  # the restarted instance got its assignment back without a rebalance
    assert members1 != members2 and all(m.startswith("instance-1-") for m in members1 + members2)
