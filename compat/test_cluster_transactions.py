"""Kafka transactions in a cluster of three brokers (three broker groups, etcd on loopback), with confluent-kafka.

A transaction's partitions are spread over the three groups, and its coordinator (the leader of its id's
`__consumer_offsets` partition) is one of them: the markers of the other groups' partitions are written by their
masters when the coordinator's decision reaches them (mqk.broker.cluster.txn_partitions).

- commits and aborts interleaved over 2 topics x 6 partitions: a read_committed consumer reads exactly the
  committed records, in order, and a read_uncommitted one the aborted ones too;
- a consume-transform-produce loop whose consumer group is coordinated by another broker than its transactional
  id: `send_offsets_to_transaction` moves the group's offsets on commit only, and the output holds each input once;
- kill -9 of a broker whose partitions a transaction writes, after the coordinator decided: its restarted master
  writes the markers, the coordinator's EndTxn completes, and read_committed consumers see the whole transaction;
- fencing: a second producer of the same transactional id fences the first, whose open transaction is aborted in
  every group; so does `mqk transactions abort`, which (like `list` and `describe`) finds the id's coordinator
  from any broker.

aiokafka, kafkajs and kafka-python transactional producers (commit and abort) across the three groups, read by
confluent-kafka read_committed.

Every read ends at a known last record (a committed END in each partition), and every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from compat_helpers import run_node, unique
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from helpers import CLUSTER_TESTS, wait_until, wait_until_async

from mqk.cluster_local import EtcdProcess, LocalCluster
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient
from mqk.testing import TEST_CLUSTER_STORE

pytestmark = [pytest.mark.timeout(240), CLUSTER_TESTS]

END = b"END"
PARTITIONS = 6


@pytest.fixture(scope="module")
def cluster(mqk_etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three brokers, each its own group, for the module (on the session's etcd), stopped by pid at its end."""
    data_dir = tmp_path_factory.mktemp("cluster-txn")
    started = LocalCluster(data_dir, 3, etcd=mqk_etcd.url, config={"store": TEST_CLUSTER_STORE}).start()
    try:
        yield started
    finally:
        started.stop()


def create_topics(bootstrap: str, *names: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, partitions, 1) for n in names], operation_timeout=15)
    for future in futures.values():
        future.result(30)


def leaders(bootstrap: str, topic: str) -> set[int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def listed() -> dict[int, Any] | None:
        parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
        return parts if len(parts) == PARTITIONS and all(p.leader >= 0 for p in parts.values()) else None

    found = wait_until(listed, 30, "every partition has a leader")
    return {p.leader for p in found.values()}


def coordinator(cluster: LocalCluster, key: str, key_type: int) -> int:
    """The node FindCoordinator names for a group (key type 0) or transactional id (1)."""
    host, port = cluster.brokers[0].kafka

    async def ask() -> int:
        client = await RawKafkaClient.connect(host, port)

        async def found() -> dict[str, Any] | None:
            body = await client.call(ApiKey.FIND_COORDINATOR, 3, {"key": key, "key_type": key_type})
            return body if body["error_code"] == 0 else None

        try:
            # (asked again while the offsets topic that places coordinators is being created)
            return int((await wait_until_async(found, 10, f"a coordinator for {key!r}"))["node_id"])
        finally:
            await client.close()

    return asyncio.run(ask())


def transactional_producer(bootstrap: str, transactional_id: str, **extra: Any) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 60000,
            "linger.ms": 5,
            **extra,
        }
    )
    producer.init_transactions(30)
    return producer


def read_to_end(
    bootstrap: str, topics: list[str], isolation: str, ends: int, timeout: float = 60
) -> dict[tuple[str, int], list[bytes]]:
    """Every value per partition up to its END record, read with `isolation`; `ends` partitions end with END."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    got: dict[tuple[str, int], list[bytes]] = collections.defaultdict(list)
    ended: set[tuple[str, int]] = set()
    consumer.subscribe(topics)

    def step() -> bool:
        for m in consumer.consume(500, 0.2):
            if m.error():
                raise KafkaException(m.error())
            tp = (m.topic(), m.partition())
            assert tp not in ended, f"{m.value()!r} read after END in {tp}"
            if m.value() == END:
                ended.add(tp)
            else:
                got[tp].append(m.value())
        return len(ended) == ends

    try:
        wait_until(step, timeout, f"END read in {ends} partitions")
    finally:
        consumer.close()
    return got


def end_everywhere(producer: Producer, topics: list[str], partitions: int = PARTITIONS) -> None:
    """One committed transaction writing END to every partition: what readers stop at."""
    producer.begin_transaction()
    for topic in topics:
        for p in range(partitions):
            producer.produce(topic, END, partition=p)
    producer.commit_transaction(30)


def test_commits_and_aborts_across_groups(cluster: LocalCluster) -> None:
    b0, b1, _b2 = (b.bootstrap for b in cluster.brokers)
    topics = [unique("txa"), unique("txb")]
    create_topics(b1, *topics)
    assert leaders(b0, topics[0]) | leaders(b0, topics[1]) == set(cluster.node_ids)
    producer = transactional_producer(b0, unique("tx-id"))
    expected: dict[tuple[str, int], list[bytes]] = collections.defaultdict(list)
    written: dict[tuple[str, int], list[bytes]] = collections.defaultdict(list)
    for n in range(8):
        commit = n % 2 == 0
        producer.begin_transaction()
        for topic in topics:
            for p in range(PARTITIONS):
                for k in range(3):
                    value = f"{n}-{topic[-6:]}-{p}-{k}".encode()
                    producer.produce(topic, value, partition=p)
                    written[(topic, p)].append(value)
                    if commit:
                        expected[(topic, p)].append(value)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)  # (librdkafka's abort drops what it has not sent yet)
            producer.abort_transaction(30)
    end_everywhere(producer, topics)
    producer.flush(10)
    for bootstrap in (b0, b1):
        assert read_to_end(bootstrap, topics, "read_committed", 2 * PARTITIONS) == expected
    assert read_to_end(b0, topics, "read_uncommitted", 2 * PARTITIONS) == written


def ids_coordinated_apart(cluster: LocalCluster) -> tuple[str, str]:
    """A transactional id and a group id whose coordinators are different brokers."""
    for _ in range(50):
        transactional_id, group = unique("eos-id"), unique("eos-group")
        if coordinator(cluster, transactional_id, 1) != coordinator(cluster, group, 0):
            return transactional_id, group
    raise AssertionError("no pair of ids coordinated apart in 50 tries")


def test_offsets_of_a_group_coordinated_elsewhere_move_on_commit_only(cluster: LocalCluster) -> None:
    b0, b1, b2 = (b.bootstrap for b in cluster.brokers)
    source, sink = unique("eos-in"), unique("eos-out")
    create_topics(b0, source, sink)
    plain = Producer({"bootstrap.servers": b1})
    total = 300
    for i in range(total):
        plain.produce(source, str(i).encode(), partition=i % PARTITIONS)
    plain.flush(30)
    transactional_id, group = ids_coordinated_apart(cluster)
    producer = transactional_producer(b2, transactional_id)
    consumer = Consumer(
        {
            "bootstrap.servers": b1,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([source])
    copied = 0
    aborted_once = False
    try:

        def step() -> bool:
            nonlocal copied, aborted_once
            batch = [m for m in consumer.consume(50, 0.3) if not m.error()]
            if not batch:
                return copied >= total
            producer.begin_transaction()
            for m in batch:
                producer.produce(sink, m.value(), partition=m.partition())
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
            )
            if not aborted_once:
                # the first batch is aborted: its offsets must not move, and the consumer reads it again
                aborted_once = True
                producer.abort_transaction(30)
                committed = consumer.committed([TopicPartition(source, p) for p in range(PARTITIONS)], 10)
                assert all(tp.offset < 0 for tp in committed), committed
                for tp in consumer.assignment():
                    consumer.seek(TopicPartition(tp.topic, tp.partition, max(0, _first_offset(batch, tp))))
                return False
            producer.commit_transaction(30)
            copied += len(batch)
            return copied >= total

        wait_until(step, 120, f"{total} records copied")
        committed = consumer.committed([TopicPartition(source, p) for p in range(PARTITIONS)], 10)
        assert sum(tp.offset for tp in committed) == total
    finally:
        consumer.close()
    end_everywhere(producer, [sink])
    out = read_to_end(b0, [sink], "read_committed", PARTITIONS)
    values = sorted(int(v) for vs in out.values() for v in vs)
    assert values == list(range(total))


def _first_offset(batch: list[Any], tp: TopicPartition) -> int:
    offsets = [m.offset() for m in batch if m.topic() == tp.topic and m.partition() == tp.partition]
    return min(offsets) if offsets else tp.offset


def test_a_second_producer_fences_the_first_in_every_group(cluster: LocalCluster) -> None:
    b0, b1, b2 = (b.bootstrap for b in cluster.brokers)
    topic = unique("fence")
    create_topics(b0, topic)
    transactional_id = unique("fence-id")
    first = transactional_producer(b1, transactional_id)
    first.begin_transaction()
    for p in range(PARTITIONS):
        first.produce(topic, b"zombie", partition=p)
    first.flush(30)
    second = transactional_producer(b2, transactional_id)
    first.produce(topic, b"late", partition=0)
    with pytest.raises(KafkaException) as raised:
        first.commit_transaction(30)
    assert raised.value.args[0].fatal() or raised.value.args[0].code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    )
    end_everywhere(second, [topic])
    got = read_to_end(b0, [topic], "read_committed", PARTITIONS)
    assert all(not values for values in got.values()), got


def commit_retrying(producer: Producer, timeout: float) -> None:
    """commit_transaction, again while librdkafka says the error is retriable (a broker was down), up to `timeout`."""

    def attempt() -> bool:
        try:
            producer.commit_transaction(10)
        except KafkaException as exc:
            if exc.args[0].retriable():
                return False
            raise
        return True

    wait_until(attempt, timeout, "the transaction committed")


def committed_transaction_survives(cluster: LocalCluster, victim_is_coordinator: bool) -> None:
    b0 = cluster.brokers[0].bootstrap
    topic = unique("txkill")
    create_topics(b0, topic)
    transactional_id = unique("txkill-id")
    coordinator_node = coordinator(cluster, transactional_id, 1)
    victim = coordinator_node if victim_is_coordinator else next(n for n in cluster.node_ids if n != coordinator_node)
    survivor = next(b.bootstrap for b in cluster.brokers if b.node_id not in (victim, coordinator_node))
    producer = transactional_producer(survivor, transactional_id)
    producer.begin_transaction()
    for p in range(PARTITIONS):
        for k in range(5):
            producer.produce(topic, f"{p}-{k}".encode(), partition=p)
    producer.flush(30)
    cluster.kill(victim)
    failure: list[BaseException] = []

    def commit() -> None:
        try:
            commit_retrying(producer, 150)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failure.append(exc)

    done = threading.Thread(target=commit, daemon=True)
    done.start()
    cluster.restart(victim)
    done.join(160)
    assert not done.is_alive() and not failure, failure
    end_everywhere(producer, [topic])
    got = read_to_end(b0, [topic], "read_committed", PARTITIONS)
    assert got == {(topic, p): [f"{p}-{k}".encode() for k in range(5)] for p in range(PARTITIONS)}


def test_a_partition_leader_killed_before_the_commit_writes_its_markers_after_its_restart(
    cluster: LocalCluster,
) -> None:
    committed_transaction_survives(cluster, victim_is_coordinator=False)


def test_a_coordinator_killed_mid_transaction_commits_it_after_its_restart(cluster: LocalCluster) -> None:
    committed_transaction_survives(cluster, victim_is_coordinator=True)


def mqk_cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "mqk", *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_cli_finds_lists_and_aborts_a_transaction_on_its_coordinator(cluster: LocalCluster) -> None:
    topic = unique("txcli")
    transactional_id = unique("txcli-id")
    coordinator_node = coordinator(cluster, transactional_id, 1)
    # the command starts from a broker that does not coordinate the id
    bootstrap = next(b.bootstrap for b in cluster.brokers if b.node_id != coordinator_node).split(",")[0]
    create_topics(bootstrap, topic)
    stuck = transactional_producer(bootstrap, transactional_id)
    stuck.begin_transaction()
    for p in range(PARTITIONS):
        stuck.produce(topic, b"stuck", partition=p)
    stuck.flush(30)
    listed = json.loads(mqk_cli("transactions", "list", "--json", "--bootstrap", bootstrap))
    # (asked of every broker: only the coordinator lists it)
    assert [r["transaction_state"] for r in listed if r["transactional_id"] == transactional_id] == ["Ongoing"]
    described = json.loads(
        mqk_cli("transactions", "describe", "--transactional-id", transactional_id, "--json", "--bootstrap", bootstrap)
    )
    assert described["transaction_state"] == "Ongoing"
    assert described["topics"] == [{"topic": topic, "partitions": list(range(PARTITIONS))}]
    out = mqk_cli("transactions", "abort", "--transactional-id", transactional_id, "--bootstrap", bootstrap)
    assert "aborted the transaction under way" in out
    # every group wrote its ABORT marker: read_committed readers pass the stuck records, up to the END after them
    ender = transactional_producer(bootstrap, unique("txcli-end"))
    end_everywhere(ender, [topic])
    got = read_to_end(bootstrap, [topic], "read_committed", PARTITIONS)
    assert all(not values for values in got.values()), got
    with pytest.raises(KafkaException):
        stuck.commit_transaction(10)


def test_a_failover_keeps_an_open_transaction_and_its_new_master_writes_the_markers(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    """Two groups of two brokers. A transaction is open on partitions of both when the master of the group that
    does not coordinate it is killed: its replica takes over knowing where the transaction begins in each partition
    (the last stable offset stays there, records written after it wait behind it), and writes the markers when the
    transaction commits."""
    cluster = mqk_cluster_factory(4, group_size=2, config=REPLICATED)
    bootstrap = cluster.bootstrap
    topic = unique("txfail")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 4, 2, config={"min.insync.replicas": "2"})])[topic].result(30)
    transactional_id = unique("txfail-id")
    coordinator_node = coordinator(cluster, transactional_id, 1)
    coordinating_group = cluster.broker(coordinator_node).group
    partitions = wait_until(lambda: _led_partitions(bootstrap, topic, 4), 60, "every partition has a leader")
    victim = next(n for n in set(partitions.values()) if cluster.broker(n).group != coordinating_group)
    victims_partitions = sorted(p for p, n in partitions.items() if n == victim)
    assert victims_partitions and len(victims_partitions) < 4

    plain = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})

    def write_plain(value: bytes) -> None:
        for p in range(4):
            plain.produce(topic, value, partition=p)
        assert plain.flush(30) == 0

    write_plain(b"before")
    producer = transactional_producer(bootstrap, transactional_id, acks="all")
    producer.begin_transaction()
    for p in range(4):
        producer.produce(topic, b"txn", partition=p)
    producer.flush(30)
    write_plain(b"after")

    def stable_ends() -> list[int] | None:
        """Each partition's last stable offset (a read_committed consumer's high watermark), asked by a new client
        of the live brokers (one made before a kill would keep asking the dead leader it knew)."""
        live = ",".join(b.bootstrap for b in cluster.brokers if b.running)
        reader = Consumer({"bootstrap.servers": live, "group.id": unique("lso"), "isolation.level": "read_committed"})
        try:
            return [reader.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] for p in range(4)]
        except KafkaException:
            return None  # (a partition without a leader yet)
        finally:
            reader.close()

    # the transaction's first record is at offset 1 of each partition: read_committed readers stop there
    assert stable_ends() == [1, 1, 1, 1]
    cluster.kill(victim)

    def led_by_survivors() -> bool:
        leaders = _led_partitions(bootstrap, topic, 4, live_only=cluster)
        return leaders is not None and victim not in leaders.values()

    wait_until(led_by_survivors, 60, "the killed master's partitions led by its replica")
    # the new master knows where the transaction begins in its partitions: the stable offsets stay there
    assert wait_until(stable_ends, 60, "the last stable offsets") == [1, 1, 1, 1]
    commit_retrying(producer, 90)
    wait_until(lambda: stable_ends() == [4, 4, 4, 4], 60, "the markers in every partition")
    got = read_to_end_of(bootstrap, topic, 4, count=3)
    assert got == {p: [b"before", b"txn", b"after"] for p in range(4)}


#: replicated groups: a dead master's lease ends after 3 s
REPLICATED = {"cluster_session_timeout_ms": 3000, "replica_lag_time_max_ms": 3000, "store": TEST_CLUSTER_STORE}


def _led_partitions(
    bootstrap: str, topic: str, count: int, live_only: LocalCluster | None = None
) -> dict[int, int] | None:
    """partition -> leader, once every partition has one (None before)."""
    if live_only is not None:
        bootstrap = ",".join(b.bootstrap for b in live_only.brokers if b.running)
    try:
        parts = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics[topic].partitions
    except KafkaException:
        return None
    if len(parts) != count or any(meta.leader < 0 for meta in parts.values()):
        return None
    return {p: meta.leader for p, meta in parts.items()}


def read_to_end_of(bootstrap: str, topic: str, partitions: int, count: int) -> dict[int, list[bytes]]:
    """`count` records of each partition, read_committed from the start."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    got: dict[int, list[bytes]] = {p: [] for p in range(partitions)}

    def step() -> bool:
        for m in consumer.consume(100, 0.2):
            if not m.error():
                got[m.partition()].append(m.value())
        return all(len(v) >= count for v in got.values())

    try:
        wait_until(step, 60, f"{count} records in each partition")
    finally:
        consumer.close()
    return got


async def test_aiokafka_transactions_across_groups(cluster: LocalCluster) -> None:
    from aiokafka import AIOKafkaProducer

    bootstrap = cluster.brokers[1].bootstrap
    topic = unique("aiotx")
    await asyncio.to_thread(create_topics, bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("aio-id"), linger_ms=5)
    await asyncio.wait_for(producer.start(), 30)
    expected: dict[tuple[str, int], list[bytes]] = {(topic, p): [] for p in range(PARTITIONS)}
    try:
        for i, commit in enumerate([True, False, True, False, True]):
            await producer.begin_transaction()
            batch = [(p, b"aio%d-%d" % (i, p)) for p in range(PARTITIONS)]
            # each send awaited: the aborted records are on the log before the EndTxn
            await asyncio.gather(*[await producer.send(topic, v, partition=p) for p, v in batch])
            if commit:
                await asyncio.wait_for(producer.commit_transaction(), 30)
                for p, v in batch:
                    expected[(topic, p)].append(v)
            else:
                await asyncio.wait_for(producer.abort_transaction(), 30)
        async with producer.transaction():
            await asyncio.gather(*[await producer.send(topic, END, partition=p) for p in range(PARTITIONS)])
    finally:
        await producer.stop()
    got = await asyncio.to_thread(read_to_end, cluster.brokers[2].bootstrap, [topic], "read_committed", PARTITIONS)
    assert got == expected


def test_kafkajs_transactions_across_groups(cluster: LocalCluster) -> None:
    bootstrap = cluster.brokers[2].bootstrap
    topic = unique("jstx")
    create_topics(bootstrap, topic)
    plan = [
        {"commit": commit, "messages": [{"partition": p, "value": f"js{i}-{p}"} for p in range(PARTITIONS)]}
        for i, commit in enumerate([False, True, True, False, True])
    ]
    plan.append({"commit": True, "messages": [{"partition": p, "value": END.decode()} for p in range(PARTITIONS)]})
    result = run_node(
        "kafkajs_transactions.js",
        bootstrap,
        "produce",
        json.dumps({"topic": topic, "transactionalId": unique("js-id"), "transactions": plan}),
        timeout=120,
    )["result"]
    assert all(r["errorCode"] == 0 for t in result["sent"] for r in t), result
    expected = {
        (topic, p): [
            m["value"].encode() for t in plan[:-1] if t["commit"] for m in t["messages"] if m["partition"] == p
        ]
        for p in range(PARTITIONS)
    }
    assert read_to_end(cluster.brokers[0].bootstrap, [topic], "read_committed", PARTITIONS) == expected


def test_kafka_python_transactions_across_groups(cluster: LocalCluster) -> None:
    from kafka import KafkaProducer

    bootstrap = cluster.brokers[0].bootstrap
    topic = unique("kptx")
    create_topics(bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("kp-id"), linger_ms=5)
    expected: dict[tuple[str, int], list[bytes]] = {(topic, p): [] for p in range(PARTITIONS)}
    try:
        producer.init_transactions()
        for i, commit in enumerate([True, False, True, False]):
            producer.begin_transaction()
            batch = [(p, b"kp%d-%d" % (i, p)) for p in range(PARTITIONS)]
            for future in [producer.send(topic, v, partition=p) for p, v in batch]:
                future.get(timeout=30)  # (an aborted transaction's records are on the log before its EndTxn)
            if commit:
                producer.commit_transaction()
                for p, v in batch:
                    expected[(topic, p)].append(v)
            else:
                producer.abort_transaction()
        producer.begin_transaction()
        for p in range(PARTITIONS):
            producer.send(topic, END, partition=p)
        producer.commit_transaction()
    finally:
        producer.close(timeout=10)
    assert read_to_end(cluster.brokers[1].bootstrap, [topic], "read_committed", PARTITIONS) == expected


def txn_partitions_keys(cluster: LocalCluster) -> list[str]:
    """The `txn-partitions/` keys etcd holds for the cluster now."""
    from mqk.meta import EtcdClient, parse_endpoints

    async def listed() -> list[str]:
        client = EtcdClient(parse_endpoints(cluster.etcd_url))
        await client.connect()
        try:
            records, _revision = await client.get_prefix(f"/mqk/{cluster.cluster_id}/txn-partitions/")
            return [r.key for r in records]
        finally:
            await client.close()

    return asyncio.run(listed())


def test_a_topic_deleted_under_an_open_transaction_leaves_no_key_behind(cluster: LocalCluster) -> None:
    bootstrap = cluster.brokers[0].bootstrap
    # the deleted topic has partitions in every group, the kept one in one group: some group the transaction told
    # has only deleted partitions when it ends
    doomed, kept = unique("txdel"), unique("txkeep")
    create_topics(bootstrap, doomed)
    create_topics(bootstrap, kept, partitions=1)
    producer = transactional_producer(bootstrap, unique("txdel-id"))
    producer.begin_transaction()
    for p in range(PARTITIONS):
        producer.produce(doomed, b"v", partition=p)
    producer.produce(kept, b"v", partition=0)
    producer.flush(30)
    assert txn_partitions_keys(cluster), "the other groups were told of the transaction"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([doomed])[doomed].result(30)
    producer.commit_transaction(30)
    # every group told of the transaction was told its end, and acted on it, its deleted partitions or not
    assert txn_partitions_keys(cluster) == []
    end_everywhere(producer, [kept], partitions=1)
    assert read_to_end(bootstrap, [kept], "read_committed", 1) == {(kept, 0): [b"v"]}
