"""ali-ons (RocketMQ 4.x remoting) against a 3-broker cluster: its producer and push consumer learn the cluster's
broker groups from any broker's name server and spread over the groups a topic's queues live on; what they send
is what a Kafka consumer of the same topic reads."""

from __future__ import annotations

import collections
import json
import time
from typing import Any

import pytest
from compat_helpers import NodeProcess, create_topic, run_node, unique
from helpers import CLUSTER_TESTS, wait_until

pytestmark = [pytest.mark.timeout(120), CLUSTER_TESTS]


def namesrv_of(cluster: Any, node: int) -> str:
    host, port = cluster.broker(node).namesrv
    return f"{host}:{port}"


def test_ali_ons_sends_and_consumes_over_every_group(mqk_cluster: Any) -> None:
    topic = unique("ons-cluster")
    create_topic(mqk_cluster.bootstrap, topic, 6)  # the controller spreads 6 partitions over the 3 groups
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
