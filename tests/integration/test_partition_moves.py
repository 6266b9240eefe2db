"""Moving a partition to another broker group (AlterPartitionReassignments), for real: `mqk serve --cluster`
processes on loopback, etcd, kafka-python's admin client and `mqk partitions`, confluent-kafka producers and
consumers, and a fault injected with SIGSTOP/SIGCONT.

- under acks=all load, with a consumer reading all along: the partition's log start was moved by DeleteRecords and
  its source group's master is paused while the move copies (the source group fails over mid-move); the
  reassignment is listed while it is under way, then completes; every acknowledged record is read back once, at the
  offset it was acknowledged at, from the new group; the reading consumer never went back (its position was not
  taken for a truncation when the leader changed); the leader epoch went up; the old group's copy is deleted while
  its other partition stays;
- the target group's master killed (SIGKILL) while it copies: its group's other member copies on and the move ends;
- what is refused: replicas from two groups, part of a group, unknown brokers, a cancel with nothing to cancel; a
  log start moved by DeleteRecords moves along; a move back into a group that deleted the partition's records is
  cancelled while the source holds older ones, and goes once they are deleted; a transactional partition keeps
  its aborted transaction skipped; a transaction open in the partition holds the move until it commits, and its
  records, written before and after the move was asked for, are committed in the new group.

Every wait is bounded; the fixtures stop every process (by pid) and etcd.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from helpers import (
    CLUSTER_TESTS,
    CONFIG,
    SETTLE_S,
    AckedProducer,
    assert_every_ack_read_once,
    describe,
    partition_sizes,
    read_all,
    wait_until,
)
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import InvalidReplicationAssignmentError, KafkaError, NoReassignmentInProgressError

from mqk.cluster_local import LocalCluster
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient

pytestmark = [pytest.mark.timeout(300), CLUSTER_TESTS]


def mqk_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqk", *args], capture_output=True, text=True, timeout=120, check=False
    )


def two_groups_of_two(factory: Callable[..., LocalCluster]) -> LocalCluster:
    """Four brokers: group-0 (nodes 0, 1) and group-1 (nodes 2, 3)."""
    return factory(4, group_size=2, config=CONFIG)


def create(cluster: LocalCluster, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, partitions, 2, config={"min.insync.replicas": "2"})], operation_timeout=30
    )
    for future in futures.values():
        future.result(30)
    wait_until(
        lambda: all(len(p.isrs) == 2 for p in describe(cluster, name).values()), SETTLE_S, "both replicas in sync"
    )


def leader_epoch(cluster: LocalCluster, topic: str, partition: int) -> int:
    """The partition's leader epoch in Metadata."""

    async def ask() -> int:
        host, port = cluster.bootstrap.split(",")[0].rsplit(":", 1)
        async with await RawKafkaClient.connect(host, int(port)) as client:
            meta = await client.call(ApiKey.METADATA, 12, {"topics": [{"name": topic}]})
        parts = {p["partition_index"]: p for p in meta["topics"][0]["partitions"]}
        return int(parts[partition]["leader_epoch"])

    return asyncio.run(ask())


class Reader:
    """A consumer reading every partition in a thread all along; each partition's offsets must only go up. Its
    partitions are assigned, not subscribed: its positions live in the client alone, so only the brokers' answers
    (a leader epoch taken for a truncation, an offset out of range) could send it back."""

    def __init__(self, cluster: LocalCluster, topic: str, partitions: int) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "group.id": "all-along",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        self.last: dict[int, int] = {}
        self.backwards: list[tuple[int, int, int]] = []
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self.consumer.poll(0.1)
            if msg is None or msg.error():
                continue
            previous = self.last.get(msg.partition(), -1)
            if msg.offset() <= previous:
                self.backwards.append((msg.partition(), previous, msg.offset()))
            self.last[msg.partition()] = msg.offset()
            self.count += 1
        self.consumer.close()

    def __enter__(self) -> Reader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def test_a_partition_moves_to_another_group_under_load_through_a_failover_and_loses_nothing(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = two_groups_of_two(mqk_cluster_factory)
    create(cluster, "moving", 4)
    placed = describe(cluster, "moving")
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    controller = admin.describe_cluster()["controller_id"]
    # the partition to move: one led by the master of the group that is not the controller's (so that pausing
    # that master leaves the controller answering)
    source_master = next(
        b.node_id
        for b in cluster.brokers
        if b.node_id // 2 != controller // 2 and b.node_id in {p.leader for p in placed.values()}
    )
    moving = min(p for p, meta in placed.items() if meta.leader == source_master)
    staying = [p for p, meta in placed.items() if meta.leader == source_master and p != moving]
    target = sorted({0, 1, 2, 3} - set(placed[moving].replicas))
    epoch_before = leader_epoch(cluster, "moving", moving)
    with Reader(cluster, "moving", 4) as reader, AckedProducer(cluster, "moving") as producer:
        wait_until(lambda: len(producer.acked) >= 500, SETTLE_S, "writes acknowledged")
        # (while a broker is paused, the admin commands go to the controller alone: `mqk` asks its --bootstrap)
        at_controller = next(b.bootstrap for b in cluster.brokers if b.node_id == controller)
        cluster.pause(source_master)
        try:
            replicas = ",".join(map(str, target))
            out = mqk_cli(
                "partitions",
                "reassign",
                "--topic",
                "moving",
                "--partition",
                str(moving),
                "--replicas",
                replicas,
                "--bootstrap",
                at_controller,
            )
            assert out.returncode == 0, out
            listed = mqk_cli("partitions", "reassignments", "--json", "--bootstrap", at_controller)
            assert listed.returncode == 0, listed
            rows = json.loads(listed.stdout)
            assert [(r["topic"], r["partition"], r["adding"], sorted(r["removing"])) for r in rows] == [
                ("moving", moving, target, sorted(placed[moving].replicas))
            ]
            wait_until(
                lambda: (
                    describe(cluster, "moving")[moving].leader not in placed[moving].replicas
                    or source_master not in describe(cluster, "moving")[moving].isrs
                ),
                SETTLE_S,
                "the source group's failover (or the move) while its master is paused",
            )
        finally:
            cluster.resume(source_master)
        wait_until(lambda: admin.list_partition_reassignments() == {}, SETTLE_S, "the move to finish")
        led_in(cluster, "moving", moving, target)
        acked_at_move = len(producer.acked)
        wait_until(lambda: len(producer.acked) >= acked_at_move + 500, SETTLE_S, "writes acknowledged after the move")
        producer.stop()
        wait_until(lambda: reader.count >= len(producer.acked) - 50, SETTLE_S, "the reader to catch up")
    assert not producer.failed, producer.failed[:3]
    assert not reader.backwards, f"the reader went back: {reader.backwards[:3]}"
    assert leader_epoch(cluster, "moving", moving) > epoch_before
    seen = read_all(cluster, "moving", len(producer.acked), "after")
    assert_every_ack_read_once(producer.acked, seen)
    # the source group deleted its copy (its reconciler does, once its own view shows the switch: the source master,
    # paused and resumed, may come to it last); its other partition is still there
    wait_until(
        lambda: partition_sizes(cluster, source_master, "moving", [moving])[moving] == 0,
        SETTLE_S,
        "the source group's copy deleted",
    )
    sizes = partition_sizes(cluster, source_master, "moving", [0, 1, 2, 3])
    assert sizes[moving] == 0
    assert all(sizes[p] > 0 for p in staying)


def test_a_move_goes_on_when_the_target_groups_master_is_killed_while_it_copies(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    """kill -9 of the copying master (the target group's; the controller too, when it is that broker) just after
    the move is recorded: the group's other member takes over as master and copies on from what it holds (what the
    killed one had replicated to it, if anything); the partition switches, and every record is read back at its
    offset from the new group."""
    cluster = two_groups_of_two(mqk_cluster_factory)
    create(cluster, "copied", 2)
    placed = describe(cluster, "copied")
    values = [b"%07d" % i + b"x" * 1000 for i in range(30_000)]  # about 30 MB: the copy takes a moment
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    for value in values:
        producer.produce("copied", value=value, partition=0)
    assert producer.flush(60) == 0
    target = sorted({0, 1, 2, 3} - set(placed[0].replicas))
    target_master = next(p.leader for p in placed.values() if p.leader in target)
    outside = next(b.bootstrap for b in cluster.brokers if b.node_id not in target)
    admin = KafkaAdminClient(bootstrap_servers=outside)
    assert admin.alter_partition_reassignments({KafkaTopicPartition("copied", 0): target}) == {
        KafkaTopicPartition("copied", 0): None
    }
    admin.close()
    cluster.kill(target_master)  # (it may be the controller too: then a new one is elected as well)

    def move_ended() -> bool:
        asked = KafkaAdminClient(bootstrap_servers=outside)  # (a new client finds the controller there is now)
        try:
            return asked.list_partition_reassignments() == {}
        except KafkaError:
            return False
        finally:
            asked.close()

    wait_until(move_ended, SETTLE_S, "the move to end on the new master")
    # the controller ends the move; a broker answering Metadata learns the group's new master by its own etcd
    # watch, which may come a moment later
    survivor = next(n for n in target if n != target_master)
    wait_until(lambda: describe(cluster, "copied")[0].leader == survivor, SETTLE_S, "Metadata to name the new master")
    got = read(cluster, "copied", 0, len(values))
    assert len(got) == len(values) and all(got[i] == v for i, v in enumerate(values))


def write(cluster: LocalCluster, topic: str, partition: int, values: range) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True})
    for i in values:
        producer.produce(topic, value=b"v%d" % i, partition=partition)
    assert producer.flush(30) == 0


def read(
    cluster: LocalCluster, topic: str, partition: int, expect: int, isolation: str = "read_uncommitted"
) -> dict[int, bytes]:
    """Offset -> value of the partition, read from its start by an assigned consumer, until `expect` records."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "reader",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    got: dict[int, bytes] = {}
    deadline = time.monotonic() + SETTLE_S
    try:
        while len(got) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                got[msg.offset()] = msg.value()
    finally:
        consumer.close()
    return got


def led_in(cluster: LocalCluster, topic: str, partition: int, group: list[int]) -> None:
    """Wait until Metadata names a member of `group` the partition's leader. A move ends when the controller
    records the switch, and the broker that answers ListPartitionReassignments has seen it; the broker answering
    Metadata learns it by its own etcd watch, which may come a moment later."""
    wait_until(
        lambda: describe(cluster, topic)[partition].leader in group,
        SETTLE_S,
        f"Metadata to name a leader of {topic}-{partition} in {group}",
    )


def move(admin: KafkaAdminClient, cluster: LocalCluster, topic: str, partition: int, target: list[int]) -> None:
    """Move the partition to `target`; return once the move has ended and Metadata names its leader there."""
    tp = KafkaTopicPartition(topic, partition)
    assert admin.alter_partition_reassignments({tp: target}) == {tp: None}
    wait_until(lambda: admin.list_partition_reassignments() == {}, SETTLE_S, "the move to end")
    led_in(cluster, topic, partition, target)


def test_refused_reassignments_a_log_start_that_moves_along_and_a_move_back(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = two_groups_of_two(mqk_cluster_factory)
    create(cluster, "stay", 4)  # (two partitions in each group: a group a partition leaves keeps the topic)
    placed = describe(cluster, "stay")
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    tp = KafkaTopicPartition("stay", 0)
    here = sorted(placed[0].replicas)
    other = sorted({0, 1, 2, 3} - set(here))
    # what is refused: replicas of two groups, part of a group, unknown brokers, duplicates; a cancel of nothing
    for replicas in ([here[0], other[0]], [other[0]], [7, 8], [other[0], other[0]]):
        assert admin.alter_partition_reassignments({tp: replicas}) == {tp: InvalidReplicationAssignmentError}
    assert admin.alter_partition_reassignments({tp: here}) == {tp: None}  # where it is: nothing to do
    assert admin.alter_partition_reassignments({tp: None}) == {tp: NoReassignmentInProgressError}
    out = mqk_cli(
        "partitions",
        "reassign",
        "--topic",
        "stay",
        "--partition",
        "0",
        "--replicas",
        f"{here[0]},{other[0]}",
        "--bootstrap",
        cluster.brokers[0].bootstrap,
    )
    assert out.returncode != 0 and "one broker group" in out.stderr, out
    assert admin.list_partition_reassignments() == {}
    assert describe(cluster, "stay")[0].leader in here
    # a partition whose log start DeleteRecords moved: the copy starts there too, every offset in its place
    write(cluster, "stay", 0, range(100))
    admin.delete_records({tp: 40})
    move(admin, cluster, "stay", 0, other)  # (and Metadata names its leader there)
    assert read(cluster, "stay", 0, 60) == {i: b"v%d" % i for i in range(40, 100)}
    # back to the group it left: that group deleted its records there, and the source still holds 40..99, so the
    # copy would lack them: cancelled, and the partition stays (nothing lost)
    tp_back = {tp: here}
    assert admin.alter_partition_reassignments(tp_back) == {tp: None}
    wait_until(lambda: admin.list_partition_reassignments() == {}, SETTLE_S, "the move back to be cancelled")
    assert describe(cluster, "stay")[0].leader in other
    assert read(cluster, "stay", 0, 60) == {i: b"v%d" % i for i in range(40, 100)}
    # once those records are deleted where the partition is, it can go back
    admin.delete_records({tp: 100})
    move(admin, cluster, "stay", 0, here)
    write(cluster, "stay", 0, range(100, 110))
    assert read(cluster, "stay", 0, 10) == {i: b"v%d" % i for i in range(100, 110)}
    # a partition with transactions moves with them: read_committed still skips the aborted one in its new group
    p = next(i for i in range(4) if i != 0 and describe(cluster, "stay")[i].leader in here)
    txn = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "mover", "linger.ms": 0})
    txn.init_transactions(30)
    for batch, commit in ((range(10), True), (range(10, 20), False), (range(20, 30), True)):
        txn.begin_transaction()
        for i in batch:
            txn.produce("stay", value=b"t%d" % i, partition=p)
        txn.flush(30)
        (txn.commit_transaction if commit else txn.abort_transaction)(30)
    move(admin, cluster, "stay", p, other)
    committed = read(cluster, "stay", p, 20, isolation="read_committed")
    assert sorted(committed.values()) == sorted(b"t%d" % i for i in [*range(10), *range(20, 30)])
    # a transaction open in a partition holds the partition's move: the source seals only between transactions, so
    # the move waits while the transaction writes on, and its records, written before and after the move was asked
    # for, are committed in the group the partition moves to
    assert describe(cluster, "stay")[0].leader in here
    txn.begin_transaction()
    for i in range(5):
        txn.produce("stay", value=b"s%d" % i, partition=0)
    txn.flush(30)
    assert admin.alter_partition_reassignments({tp: other}) == {tp: None}
    for i in range(5, 10):
        txn.produce("stay", value=b"s%d" % i, partition=0)
    txn.flush(30)
    assert tp in admin.list_partition_reassignments()  # (it cannot end while the transaction is open)
    assert describe(cluster, "stay")[0].leader in here
    txn.commit_transaction(30)
    wait_until(lambda: admin.list_partition_reassignments() == {}, SETTLE_S, "the move to end after the commit")
    led_in(cluster, "stay", 0, other)
    committed = read(cluster, "stay", 0, 20, isolation="read_committed")
    assert sorted(committed.values()) == sorted(
        [*(b"v%d" % i for i in range(100, 110)), *(b"s%d" % i for i in range(10))]
    )
