"""State a master needs comes from its log, not from side files. Twice: a one-broker cluster (real etcd, a real
`mqk serve --cluster` process) is killed with -9, its side files (the offsets journal, the `state/` documents) are
deleted, and it starts again with only its log; and a broker group of three loses its master to kill -9 and the
replica elected in its place, which has only the log it replicated, takes over. Committed offsets
(confluent-kafka, kafka-python, RocketMQ), delayed messages (delivered once: the one delivered before the kill not
again, the pending one after it), idempotent dedup (a retried batch is answered with its first offsets, not
appended twice), and a RocketMQ POP group's record states (acknowledged messages never again, held ones back with
their attempt counted) with a subscription group config (consumption disabled) all come back; a replica refuses
POP (its master serves it); the offsets are `__consumer_offsets` records in Kafka's layout, as Kafka's tools
read them.

Every wait is bounded; each process is stopped by the fixtures' teardown.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import CLUSTER_TESTS, in_sync, produce_body, wait_until, wait_until_async

from mqk.broker.cluster import java_string_hash
from mqk.client import ClientError, MessageQueue, PopConsumer, PoppedMessage, Producer, PullConsumer
from mqk.client.remoting import RemotingConnection
from mqk.cluster_local import LocalCluster
from mqk.errors import OutOfOrderSequenceNumberError
from mqk.protocol.kafka.api import ApiKey
from mqk.protocol.kafka.offset_records import OFFSETS_TOPIC, OffsetKey, OffsetValue, decode_key, decode_value
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.server.kafka.rawclient import RawKafkaClient, make_batch

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # (kafka-python's schema loading, see tests/helpers.py)
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpPartition
    from kafka.structs import OffsetAndMetadata

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = CLUSTER_TESTS

OFFSETS_PARTITIONS = 4
#: a short lease, so the restarted broker need not wait long for its killed predecessor's registration to go
CONFIG = f"cluster_session_timeout_ms = 2000\noffsets_topic_num_partitions = {OFFSETS_PARTITIONS}\n"
GROUP = "group-0"  # the broker group (RocketMQ broker name) of node 0
WAIT_S = 60


def offsets_partition(group: str) -> int:
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % OFFSETS_PARTITIONS


def namesrv(cluster: LocalCluster, node_id: int) -> str:
    address = cluster.broker(node_id).namesrv
    assert address is not None
    return f"{address[0]}:{address[1]}"


def create_topics(bootstrap: str, topics: dict[str, int], replication_factor: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, n, replication_factor) for name, n in topics.items()], request_timeout=WAIT_S
    )
    for future in futures.values():
        future.result(WAIT_S)


def confluent_consumer(bootstrap: str, group: str) -> confluent_kafka.Consumer:
    return confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, "enable.partition.eof": True}
    )


def confluent_commit(bootstrap: str) -> None:
    consumer = confluent_consumer(bootstrap, "g-confluent")
    try:
        consumer.commit(offsets=[confluent_kafka.TopicPartition("orders", 0, 7)], asynchronous=False)
    finally:
        consumer.close()


def confluent_committed(bootstrap: str) -> int | None:
    """The group's committed offset, or None while no broker coordinates the group yet: right after a failover
    the new master may answer NOT_COORDINATOR until it holds the offsets partition, and librdkafka's committed()
    hands that retriable error to the application instead of asking again."""
    consumer = confluent_consumer(bootstrap, "g-confluent")
    try:
        (tp,) = consumer.committed([confluent_kafka.TopicPartition("orders", 0)], timeout=WAIT_S)
        return int(tp.offset)
    except confluent_kafka.KafkaException as exc:
        if exc.args[0].code() in (
            confluent_kafka.KafkaError.NOT_COORDINATOR,
            confluent_kafka.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        ):
            return None
        raise
    finally:
        consumer.close()


def kafka_python_consumer(bootstrap: str) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=bootstrap, group_id="g-kafka-python", enable_auto_commit=False, request_timeout_ms=30_000
    )


def kafka_python_commit(bootstrap: str) -> None:
    consumer = kafka_python_consumer(bootstrap)
    try:
        consumer.commit({KpPartition("orders", 1): OffsetAndMetadata(3, "kp-meta", -1)})
    finally:
        consumer.close()


def kafka_python_committed(bootstrap: str) -> Any:
    consumer = kafka_python_consumer(bootstrap)
    try:
        return consumer.committed(KpPartition("orders", 1), metadata=True)
    finally:
        consumer.close()


def offsets_records(bootstrap: str, partition: int) -> list[tuple[OffsetKey | None, OffsetValue | None]]:
    """What a Kafka client reading `__consumer_offsets` sees in `partition`, decoded by Kafka's layout."""
    consumer = confluent_consumer(bootstrap, "g-reader")
    out: list[tuple[OffsetKey | None, OffsetValue | None]] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(OFFSETS_TOPIC, partition, 0)])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(f"reading {OFFSETS_TOPIC}: {msg.error()}")
            key, value = msg.key(), msg.value()
            out.append((decode_key(key), None if value is None else decode_value(value)))
        raise AssertionError(f"timed out reading {OFFSETS_TOPIC}-{partition}")
    finally:
        consumer.close()


async def collect_until(ns: str, topic: str, last: bytes) -> list[bytes]:
    """Every message of `topic`'s queue 0, in order, up to and including `last` (long polls: no sleeping)."""
    got: list[bytes] = []
    async with PullConsumer(ns, "delay-check") as consumer, asyncio.timeout(WAIT_S):
        offset = 0
        while last not in got:
            result = await consumer.pull(MessageQueue(topic, GROUP, 0), offset, 256, suspend_ms=5000)
            got += [m.body for m in result.messages]
            offset = result.next_offset
    return got


#: the topic a RocketMQ POP group reads, the group, and one whose subscription config disables its consumption
POPPED, POP_GROUP, PAUSED_GROUP = "popped", "g-pop", "g-paused"
TOPICS = {"orders": 2, "later": 1, POPPED: 1}


async def pop_until_none(ns: str, group: str) -> list[PoppedMessage]:
    """Everything the POP group is handed out of POPPED now, each held ten minutes (long polls: no sleeping)."""
    out: list[PoppedMessage] = []
    async with PopConsumer(ns, group) as consumer, asyncio.timeout(WAIT_S):
        while got := await consumer.pop(POPPED, invisible_ms=600_000, poll_ms=1000):
            out += got
    return out


async def remoting_call(address: tuple[str, int], code: int, body: bytes | None = None) -> RemotingCommand:
    conn = RemotingConnection(address)
    await conn.connect()
    try:
        return await conn.invoke(RemotingCommand(code=code, body=body), timeout=WAIT_S)
    finally:
        await conn.close()


async def write_pop_state(ns: str, native: tuple[str, int]) -> None:
    """Six messages for the POP group: three acknowledged, three held; and a group paused by its config."""
    async with Producer(ns) as producer:
        for i in range(6):
            await producer.send(POPPED, b"p%d" % i)
    held = await pop_until_none(ns, POP_GROUP)
    assert sorted(p.message.body for p in held) == [b"p%d" % i for i in range(6)]
    async with PopConsumer(ns, POP_GROUP) as consumer:
        for popped in sorted(held, key=lambda p: p.message.body)[:3]:
            await consumer.ack(popped)
    body = json.dumps({"groupName": PAUSED_GROUP, "consumeEnable": False}).encode()
    configured = await remoting_call(native, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body)
    assert configured.code == ResponseCode.SUCCESS, configured.remark


async def check_pop_state(ns: str) -> None:
    """What `write_pop_state` wrote, from the master after the takeover: the held three come back (attempt 2),
    the acknowledged three never; the paused group still is."""
    again = await pop_until_none(ns, POP_GROUP)
    assert sorted((p.message.body, p.attempt) for p in again) == [(b"p3", 2), (b"p4", 2), (b"p5", 2)]
    async with PopConsumer(ns, PAUSED_GROUP) as paused:
        with pytest.raises(ClientError) as refused:
            await paused.pop(POPPED)
    assert refused.value.code == ResponseCode.NO_PERMISSION


async def produce(client: RawKafkaClient, batch: bytearray) -> dict[str, Any]:
    resp = await client.call(ApiKey.PRODUCE, 9, produce_body("orders", batch, partition=1))
    return dict(resp["responses"][0]["partition_responses"][0])


class State:
    """The state written before the takeover, and what the checks after it need."""

    def __init__(self, batch: Callable[..., bytearray], first_offset: int, pending_due: int) -> None:
        self.batch = batch
        self.first_offset = first_offset
        self.pending_due = pending_due


def kafka_address(cluster: LocalCluster, node_id: int) -> tuple[str, int]:
    address = cluster.broker(node_id).kafka
    assert address is not None
    return address


def native_address(cluster: LocalCluster, node_id: int) -> tuple[str, int]:
    address = cluster.broker(node_id).native
    assert address is not None
    return address


async def write_state(bootstrap: str, ns: str, kafka: tuple[str, int]) -> State:
    """Committed offsets (three clients), two delayed messages (one delivered, one pending) and an idempotent
    producer's batch, all acknowledged by the broker group's master."""
    await asyncio.to_thread(confluent_commit, bootstrap)
    await asyncio.to_thread(kafka_python_commit, bootstrap)
    async with PullConsumer(ns, "g-rmq") as rmq:
        await rmq.commit_offset(MessageQueue("orders", GROUP, 0), 4)

    async with Producer(ns) as producer:
        await producer.send("later", b"early", deliver_at_ms=int(time.time() * 1000) + 300)
        assert await collect_until(ns, "later", b"early") == [b"early"]
        pending_due = int(time.time() * 1000) + 8000
        await producer.send("later", b"pending", deliver_at_ms=pending_due)

    async with await RawKafkaClient.connect(*kafka) as client:
        init = await client.call(
            ApiKey.INIT_PRODUCER_ID,
            4,
            {"transactional_id": None, "transaction_timeout_ms": 60000, "producer_id": -1, "producer_epoch": -1},
        )
        assert init["error_code"] == 0
        pid, epoch = init["producer_id"], init["producer_epoch"]

        def batch(seq: int, *values: bytes) -> bytearray:
            return make_batch(list(values), producer_id=pid, producer_epoch=epoch, base_sequence=seq)

        first = await produce(client, batch(0, b"a", b"b", b"c"))  # acks=all: every in-sync replica holds it
        assert first["error_code"] == 0
    return State(batch, first["base_offset"], pending_due)


async def check_state(state: State, bootstrap: str, ns: str, kafka: tuple[str, int]) -> None:
    """What `write_state` wrote, as the clients see it from the master after the takeover."""
    committed_now = await wait_until_async(
        lambda: asyncio.to_thread(confluent_committed, bootstrap), WAIT_S, "the group's coordinator to answer"
    )
    assert committed_now == 7
    committed = await asyncio.to_thread(kafka_python_committed, bootstrap)
    assert (committed.offset, committed.metadata) == (3, "kp-meta")
    async with PullConsumer(ns, "g-rmq") as rmq:
        assert await rmq.committed_offset(MessageQueue("orders", GROUP, 0)) == 4

    # what Kafka's tools see in the group's offsets partition
    records = await asyncio.to_thread(offsets_records, bootstrap, offsets_partition("g-confluent"))
    mine = [(k, v) for k, v in records if k is not None and k.group == "g-confluent"]
    assert mine and mine[-1][0] == OffsetKey("g-confluent", "orders", 0)
    assert mine[-1][1] is not None and mine[-1][1].offset == 7

    # the retried batch is answered with its first offsets, not appended again; the sequence goes on from there
    batch = state.batch
    async with await RawKafkaClient.connect(*kafka) as client:
        retry = await produce(client, batch(0, b"a", b"b", b"c"))
        assert (retry["error_code"], retry["base_offset"]) == (0, state.first_offset)
        gap = await produce(client, batch(5, b"z"))
        assert gap["error_code"] == OutOfOrderSequenceNumberError.code
        after = await produce(client, batch(3, b"d"))
        assert (after["error_code"], after["base_offset"]) == (0, state.first_offset + 3)

    # one more delayed message, due after the others: the timer delivers in due order, so once it is in, every
    # delivery that will ever happen of the others (a duplicate too) has happened
    async with Producer(ns) as producer:
        await producer.send("later", b"last", deliver_at_ms=max(state.pending_due, int(time.time() * 1000)) + 200)
    assert await collect_until(ns, "later", b"last") == [b"early", b"pending", b"last"]


async def test_a_master_with_only_its_log_has_offsets_timer_and_producer_state(
    mqk_cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(CONFIG)
    cluster = mqk_cluster_factory(1, extra_args=["--config", str(config)])
    broker = cluster.broker(0)
    await asyncio.to_thread(create_topics, broker.bootstrap, TOPICS)
    state = await write_state(broker.bootstrap, namesrv(cluster, 0), kafka_address(cluster, 0))
    await write_pop_state(namesrv(cluster, 0), native_address(cluster, 0))

    # kill -9; the side files go; the log (CommitLog, ConsumeQueues) stays
    cluster.kill(0)
    for side in ("offsets", "state"):
        shutil.rmtree(broker.data_dir / side, ignore_errors=True)
    assert (broker.data_dir / "commitlog").is_dir()
    cluster.restart(0)
    await check_state(state, broker.bootstrap, namesrv(cluster, 0), kafka_address(cluster, 0))
    await check_pop_state(namesrv(cluster, 0))


def master_of_orders(bootstrap: str) -> int:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics("orders", timeout=10)
    return int(md.topics["orders"].partitions[1].leader)


async def test_a_new_master_after_a_failover_has_offsets_timer_and_producer_state(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    """The same state, written to a broker group of three (everything replicated, offsets and timer state in
    internal topics), then its master killed with -9: the replica elected in its place has all of it."""
    cluster = mqk_cluster_factory(
        3,
        group_size=3,
        config={
            "cluster_session_timeout_ms": 2000,
            "replica_lag_time_max_ms": 3000,
            "offsets_topic_num_partitions": OFFSETS_PARTITIONS,
        },
    )
    await asyncio.to_thread(create_topics, cluster.bootstrap, TOPICS, 3)
    master = await asyncio.to_thread(master_of_orders, cluster.bootstrap)
    state = await write_state(cluster.bootstrap, namesrv(cluster, master), kafka_address(cluster, master))
    await write_pop_state(namesrv(cluster, master), native_address(cluster, master))
    replica = next(n for n in range(3) if n != master)
    refused = await remoting_call(native_address(cluster, replica), RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE and "served by its master" in (refused.remark or "")
    # every replica in sync at the kill (a replica that fell behind on a busy machine would leave no member to elect:
    # with unclean election off the group would rightly stay without a master)
    await asyncio.to_thread(wait_until, lambda: len(in_sync(cluster, "orders")) == 3, WAIT_S, "three in sync")

    cluster.kill(master)
    survivors = ",".join(cluster.broker(n).bootstrap for n in range(3) if n != master)

    def new_master() -> tuple[int] | None:
        """(the new master's node id,) once Metadata names one (a tuple: node 0 is a master too)."""
        try:
            leader = master_of_orders(survivors)
        except confluent_kafka.KafkaException:
            return None
        return (leader,) if leader not in (master, -1) else None

    (elected,) = await wait_until_async(lambda: asyncio.to_thread(new_master), WAIT_S, "a new master")
    await check_state(state, survivors, namesrv(cluster, elected), kafka_address(cluster, elected))
    await check_pop_state(namesrv(cluster, elected))
