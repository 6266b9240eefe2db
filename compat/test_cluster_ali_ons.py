"""ali-ons (RocketMQ 4.x remoting) against a 3-broker cluster: its producer and push consumer learn the cluster's
broker groups from any broker's name server and spread over the groups a topic's queues live on; what they send
is what a Kafka consumer of the same topic reads. A consumer group's offsets of a queue that moves to another broker
group go with it. With slave reads on, a push consumer far behind is sent to its group's replica, which serves its
pulls, and every message reaches it once."""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from compat_helpers import NodeProcess, create_topic, records_served, run_node, unique
from helpers import CLUSTER_TESTS, CONFIG, SETTLE_S, in_sync, leader, leaders_seen_by, wait_until

from mqk.cluster_local import LocalCluster

pytestmark = [pytest.mark.timeout(120), CLUSTER_TESTS]


def namesrv_of(cluster: Any, node: int) -> str:
    host, port = cluster.broker(node).namesrv
    return f"{host}:{port}"


def known_everywhere(cluster: Any, topic: str, holds: Callable[[dict[int, int]], bool]) -> None:
    """Wait until `holds(partition -> leader)` for the topic in every broker's own Metadata: the broker that answered
    a change (a creation, the end of a move) had it in its view; each other broker, and its name server, learns it
    by its own etcd watch a moment later."""
    wait_until(
        lambda: all(holds(leaders_seen_by(b.kafka, topic)) for b in cluster.brokers),
        SETTLE_S,
        f"every broker's Metadata to show the change to {topic}",
    )


def test_ali_ons_sends_and_consumes_over_every_group(mqk_cluster: Any) -> None:
    topic = unique("ons-cluster")
    create_topic(mqk_cluster.bootstrap, topic, 6)  # the controller spreads 6 partitions over the 3 groups
    known_everywhere(mqk_cluster, topic, lambda leaders: len(leaders) == 6)
    count = 30
    messages = [{"topic": topic, "tags": "T", "keys": [f"k{i}"], "body": f"cluster body {i}"} for i in range(count)]
    sent = run_node("ons.js", namesrv_of(mqk_cluster, 0), "produce", json.dumps({"messages": messages}), timeout=60)
    results = sent["result"]
    assert [r["sendStatus"] for r in results] == ["SEND_OK"] * count, results
    per_group = collections.Counter(r["brokerName"] for r in results)
    assert set(per_group) == {"group-0", "group-1", "group-2"}, per_group  # every group took messages
    # queue offsets go on per (group, queue), each from 0: the groups are separate brokers to the client
    offsets: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    for r in results:
        offsets[(r["brokerName"], r["queueId"])].append(r["queueOffset"])
    assert all(seen == list(range(len(seen))) for seen in offsets.values()), offsets

    consumer = NodeProcess(
        "ons.js", namesrv_of(mqk_cluster, 1), "consume", json.dumps({"topic": topic, "group": unique("ons-g")})
    )
    try:
        wait_until(
            lambda: len({e["body"] for e in consumer.of("msg")}) >= count,
            60,
            f"every message to reach the consumer ({consumer.diagnostics()})",
        )
        bodies = collections.Counter(e["body"] for e in consumer.of("msg"))
        assert set(bodies) == {m["body"] for m in messages}
        assert all(n == 1 for n in bodies.values()), bodies  # none delivered twice
        # the consumer owns the topic's 6 queues: 2 on each of the 3 groups
        wait_until(
            lambda: bool(consumer.of("assign")) and len(consumer.of("assign")[-1]["queues"]) == 6,
            20,
            f"the consumer to own the 6 queues ({consumer.of('assign')})",
        )
    finally:
        consumer.close()

    # the same records, read by a Kafka consumer of the topic (a RocketMQ queue is a Kafka partition)
    from confluent_kafka import Consumer

    kafka = Consumer(
        {"bootstrap.servers": mqk_cluster.bootstrap, "group.id": unique("k"), "auto.offset.reset": "earliest"}
    )
    try:
        kafka.subscribe([topic])
        read: set[bytes] = set()
        deadline = time.monotonic() + 30
        while len(read) < count and time.monotonic() < deadline:
            msg = kafka.poll(1.0)
            if msg is not None and not msg.error():
                read.add(msg.value())
        assert read == {m["body"].encode() for m in messages}
    finally:
        kafka.close()


def test_ali_ons_consumers_keep_their_offsets_when_a_queue_moves_to_another_group(mqk_cluster: Any) -> None:
    """A push consumer group reads a topic and closes (its offsets are committed to each queue's broker group); a
    partition with messages moves to another broker group (AlterPartitionReassignments); a new consumer of the
    group reads only what was sent after: the offsets of the moved queue came along with it."""
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KafkaTopicPartition

    topic, group = unique("ons-move"), unique("ons-move-g")
    create_topic(mqk_cluster.bootstrap, topic, 6)
    known_everywhere(mqk_cluster, topic, lambda leaders: len(leaders) == 6)

    def send(start: int) -> list[dict[str, Any]]:
        messages = [{"topic": topic, "tags": "T", "body": f"move body {i}"} for i in range(start, start + 30)]
        sent = run_node("ons.js", namesrv_of(mqk_cluster, 0), "produce", json.dumps({"messages": messages}))
        assert [r["sendStatus"] for r in sent["result"]] == ["SEND_OK"] * 30, sent["result"]
        return messages

    def read(expect: set[str]) -> collections.Counter[str]:
        consumer = NodeProcess(
            "ons.js", namesrv_of(mqk_cluster, 1), "consume", json.dumps({"topic": topic, "group": group})
        )
        try:
            wait_until(
                lambda: expect <= {e["body"] for e in consumer.of("msg")},
                60,
                f"the messages to reach the consumer ({consumer.diagnostics()})",
            )
        finally:
            consumer.close()  # (it commits its offsets as it closes)
        return collections.Counter(e["body"] for e in consumer.of("msg"))

    first = {m["body"] for m in send(0)}
    assert set(read(first)) == first
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": mqk_cluster.bootstrap}).list_topics(topic, timeout=10)
    leaders = {p: m.leader for p, m in meta.topics[topic].partitions.items()}
    target = next(n for n in sorted(set(leaders.values())) if n != leaders[0])
    admin = KafkaAdminClient(bootstrap_servers=mqk_cluster.bootstrap)
    try:
        admin.alter_partition_reassignments({KafkaTopicPartition(topic, 0): [target]})
        wait_until(lambda: admin.list_partition_reassignments() == {}, 60, "the move to end")
    finally:
        admin.close()
    # (the producer and the consumer below take the queue's route from the name servers of nodes 0 and 1)
    known_everywhere(mqk_cluster, topic, lambda leaders: leaders.get(0) == target)
    later = {m["body"] for m in send(30)}
    again = read(later)
    assert set(again) == later, f"delivered again after the move: {sorted(set(again) - later)[:5]}"


def test_a_consumer_far_behind_pulls_from_the_replica_with_slave_reads_on(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    # one group of two brokers; every consumer behind the CommitLog's end counts as far behind (ratio 0)
    settings = {**CONFIG, "native_slave_read_enable": True, "native_access_message_in_memory_max_ratio": 0}
    cluster = mqk_cluster_factory(2, group_size=2, config=settings)
    topic = unique("ons-slave-read")
    create_topic(cluster.bootstrap, topic, 2, {"min.insync.replicas": "2"}, replication_factor=2)
    wait_until(lambda: len(in_sync(cluster, topic)) == 2, SETTLE_S, "both brokers in sync")
    count = 200  # (100 a queue: more than a pull takes, 32, so the pulls after the first have messages to serve)
    messages = [{"topic": topic, "tags": "T", "keys": [f"k{i}"], "body": f"behind {i}"} for i in range(count)]
    sent = run_node("ons.js", namesrv_of(cluster, 0), "produce", json.dumps({"messages": messages}), timeout=60)
    assert [r["sendStatus"] for r in sent["result"]] == ["SEND_OK"] * count, sent["result"]
    master = leader(cluster, topic)
    replica = next(b.node_id for b in cluster.brokers if b.node_id != master)
    consumer = NodeProcess(
        "ons.js", namesrv_of(cluster, 1), "consume", json.dumps({"topic": topic, "group": unique("g")})
    )
    try:
        wait_until(
            lambda: len({e["body"] for e in consumer.of("msg")}) >= count,
            SETTLE_S,
            f"every message to reach the consumer ({consumer.diagnostics()})",
        )
        bodies = collections.Counter(e["body"] for e in consumer.of("msg"))
        assert set(bodies) == {m["body"] for m in messages}
        assert all(n == 1 for n in bodies.values()), bodies
    finally:
        consumer.close()
    # the master served the first pull of each queue, which sent the consumer to the replica for the rest
    assert records_served(cluster, replica, topic) > 0
    assert records_served(cluster, master, topic) + records_served(cluster, replica, topic) >= count
