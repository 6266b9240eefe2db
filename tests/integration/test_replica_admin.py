"""Replica administration with real clients: ElectLeaders (kafka-python, confluent-kafka, `mqk partitions
elect-leaders`), DescribeProducers (kafka-python, `mqk producers describe`), List/AlterPartitionReassignments
(kafka-python, `mqk partitions`).

- a broker on its own: every partition is led by its only replica (ELECTION_NOT_NEEDED), an idempotent producer
  shows up with its last sequence, no reassignment is in progress, and moving a partition elsewhere is refused
  INVALID_REPLICA_ASSIGNMENT;
- a group of three `mqk serve --cluster` processes: the preferred member (the lowest node id) is killed, another
  member takes over, the preferred one comes back and catches up; a PREFERRED election hands the mastership back to
  it under acks=all load, and every acknowledged record is read back once;
- an UNCLEAN election: the group's only in-sync member is gone, the other members are back but not in sync; the
  election makes one of them master.

Every wait is bounded; the fixtures stop every process (by pid) and etcd.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from confluent_kafka import ElectionType, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from helpers import (
    CLUSTER_TESTS,
    SETTLE_S,
    AckedProducer,
    assert_every_ack_read_once,
    create_topic,
    describe,
    in_sync,
    leader,
    produce_one,
    read_all,
    three_replicas,
    wait_until,
)
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import InvalidReplicationAssignmentError, NotLeaderForPartitionError

from mqk.cluster_local import LocalCluster
from mqk.testing import ThreadedBroker

pytestmark = [pytest.mark.timeout(300), CLUSTER_TESTS]

ELECTION_NOT_NEEDED = 84


def mqk_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqk", *args], capture_output=True, text=True, timeout=120, check=False
    )


def idempotent_writes(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    errors: list[KafkaError] = []
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i, partition=0, on_delivery=lambda e, _m: e and errors.append(e))
        producer.flush(10)  # one batch per record: the last sequence is count - 1
    assert not errors, errors


# --- a broker on its own ------------------------------------------------------------------------------------------


def test_a_broker_on_its_own_answers_elections_producers_and_reassignments(mqk_broker: ThreadedBroker) -> None:
    bootstrap = mqk_broker.bootstrap
    idempotent_writes(bootstrap, "solo", 5)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        election = admin.elect_leaders(0, {"solo": [0]})
        codes = [p.error_code for r in election.replica_election_results for p in r.partition_result]
        assert codes == [ELECTION_NOT_NEEDED]
        states = admin.describe_producers([KafkaTopicPartition("solo", 0)])
        (producer,) = states[KafkaTopicPartition("solo", 0)].active_producers
        assert producer.producer_id >= 0 and producer.producer_epoch == 0 and producer.last_sequence == 4
        assert producer.coordinator_epoch == -1 and producer.current_transaction_start_offset == -1
        assert admin.list_partition_reassignments() == {}
        moved = admin.alter_partition_reassignments({KafkaTopicPartition("solo", 0): [mqk_broker.config.node_id + 1]})
        assert moved == {KafkaTopicPartition("solo", 0): InvalidReplicationAssignmentError}
        kept = admin.alter_partition_reassignments({KafkaTopicPartition("solo", 0): [mqk_broker.config.node_id]})
        assert kept == {KafkaTopicPartition("solo", 0): None}
    finally:
        admin.close()
    out = mqk_cli("producers", "describe", "--topic", "solo", "--json", "--bootstrap", bootstrap)
    assert out.returncode == 0, out.stderr
    assert [(p["partition"], p["last_sequence"]) for p in json.loads(out.stdout)] == [(0, 4)]
    out = mqk_cli("partitions", "reassignments", "--bootstrap", bootstrap)
    assert out.returncode == 0 and "no partition reassignment in progress" in out.stdout, out
    out = mqk_cli(
        "partitions", "reassign", "--topic", "solo", "--partition", "0", "--replicas", "7", "--bootstrap", bootstrap
    )
    assert out.returncode == 1 and "InvalidReplicaAssignmentError" in out.stderr, out


# --- a group of three -------------------------------------------------------------------------------------------


def elect(cluster: LocalCluster, kind: ElectionType, topic: str, partition: int = 0) -> KafkaError | None:
    """One election through confluent-kafka's AdminClient; the partition's error (None: elected)."""
    admin = AdminClient({"bootstrap.servers": ",".join(b.bootstrap for b in cluster.brokers if b.running)})
    future = admin.elect_leaders(kind, [TopicPartition(topic, partition)])  # (2.16.1 fails on any keyword)
    results = future.result(120)
    error = results[TopicPartition(topic, partition)]
    return error.args[0] if isinstance(error, Exception) else error


def test_a_preferred_election_hands_the_group_back_to_its_first_member_under_acks_all_load(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = three_replicas(mqk_cluster_factory)
    preferred = min(cluster.node_ids)
    create_topic(cluster, "prefer", partitions=2)
    with AckedProducer(cluster, "prefer") as producer:
        wait_until(lambda: len(producer.acked) > 100, SETTLE_S, "acknowledged writes")
        cluster.kill(preferred)  # (the master or not: either way it comes back as a replica that must catch up)
        wait_until(lambda: leader(cluster, "prefer") not in (-1, preferred), SETTLE_S, "another master")
        killed_at = time.monotonic()
        wait_until(lambda: producer.acks_after(killed_at) > 100, SETTLE_S, "acks=all writes without it")
        cluster.restart(preferred)
        wait_until(lambda: len(in_sync(cluster, "prefer")) == 3, SETTLE_S, "the preferred member back in sync")
        before = leader(cluster, "prefer")
        assert before != preferred
        assert elect(cluster, ElectionType.PREFERRED, "prefer") is None
        wait_until(
            lambda: {p.leader for p in describe(cluster, "prefer").values()} == {preferred},
            SETTLE_S,
            "both partitions led by the preferred member",
        )
        moved_at = time.monotonic()
        wait_until(lambda: producer.acks_after(moved_at) > 100, SETTLE_S, "acks=all writes on the preferred member")
        again = elect(cluster, ElectionType.PREFERRED, "prefer", 1)
        assert again is not None and again.code() == KafkaError.ELECTION_NOT_NEEDED, again
    assert not producer.failed, producer.failed[:3]
    # the new master rebuilt the producer's state from its log: the producer is there, on the leader only
    admin = KafkaAdminClient(bootstrap_servers=[b.bootstrap for b in cluster.brokers])
    try:
        tp = KafkaTopicPartition("prefer", 0)
        (state,) = admin.describe_producers([tp])[tp].active_producers
        assert state.producer_id >= 0 and state.last_sequence >= 0
        with pytest.raises(NotLeaderForPartitionError):
            admin.describe_producers([tp], broker_id=max(cluster.node_ids))
    finally:
        admin.close()
    assert produce_one(cluster, "prefer", acks="all") is None
    out = mqk_cli(
        "partitions",
        "elect-leaders",
        "--type",
        "preferred",
        "--topic",
        "prefer",
        "--bootstrap",
        cluster.brokers[0].bootstrap,
    )
    assert out.returncode == 0 and "prefer[0]\telection not needed" in out.stdout, out
    seen = read_all(cluster, "prefer", len(producer.acked), "prefer")
    assert_every_ack_read_once(producer.acked, seen)


def test_an_unclean_election_makes_a_member_out_of_sync_master_only_when_asked(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = three_replicas(mqk_cluster_factory)
    create_topic(cluster, "unclean", partitions=1, min_insync=1)
    master = leader(cluster, "unclean")
    others = [n for n in cluster.node_ids if n != master]
    for node in others:
        cluster.kill(node)
    wait_until(lambda: in_sync(cluster, "unclean") == [master], SETTLE_S, "the master alone in sync")
    assert produce_one(cluster, "unclean", acks="all") is None
    cluster.kill(master)
    for node in others:
        cluster.restart(node)
    # the dead master's key goes with its lease; outside the in-sync set, the others do not take over
    wait_until(lambda: leader(cluster, "unclean") == -1, SETTLE_S, "the dead master's lease gone")
    refused = elect(cluster, ElectionType.PREFERRED, "unclean")
    assert refused is not None and refused.code() == KafkaError.PREFERRED_LEADER_NOT_AVAILABLE, refused
    assert elect(cluster, ElectionType.UNCLEAN, "unclean") is None
    wait_until(lambda: leader(cluster, "unclean") in others, SETTLE_S, "a member out of sync elected")
    again = elect(cluster, ElectionType.UNCLEAN, "unclean")
    assert again is not None and again.code() == KafkaError.ELECTION_NOT_NEEDED, again
    # Metadata names the elected member once the election is in etcd; the member itself takes the mastership when
    # its own watch brings it the record (and answers NOT_LEADER_OR_FOLLOWER until then), and the producer may ask
    # a broker whose view is a moment behind: a write (one attempt, no retries) is tried until one is acknowledged
    wait_until(lambda: produce_one(cluster, "unclean", acks="all") is None, SETTLE_S, "a write on the elected master")
