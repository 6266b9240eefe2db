"""Fetching from followers (KIP-392) with confluent-kafka and kafkajs: a broker group of two, each broker in its own
rack (`mqk serve --rack`), the rack-aware replica selector on. A consumer that names the replica's rack
(`client.rack`, kafkajs' `rackId`) is sent there by the leader and reads every record from the replica; the
brokers' racks are in DescribeCluster. A read_committed consumer in the same rack reads from the leader (the last
stable offset is the master's) and sees the committed records only."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from compat_helpers import create_topic, records_served, run_node, unique
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from helpers import CLUSTER_TESTS, CONFIG, SETTLE_S, in_sync, leader, wait_until

pytestmark = [pytest.mark.timeout(180), CLUSTER_TESTS]

SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
COUNT = 300


def read(cluster: Any, topic: str, rack: str, isolation: str = "read_uncommitted", expect: int = COUNT) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": unique("rack-g"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "client.rack": rack,
            "isolation.level": isolation,
        }
    )
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + SETTLE_S
        while len(values) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
    finally:
        consumer.close()
    return values


def test_a_consumer_reads_from_the_replica_in_its_rack(mqk_cluster_factory: Any) -> None:
    cluster = mqk_cluster_factory(
        2,
        group_size=2,
        config={**CONFIG, "replica_selector_class": SELECTOR},
        broker_args={0: ["--rack", "rack-0"], 1: ["--rack", "rack-1"]},
    )
    topic = unique("follower-fetch")
    create_topic(cluster.bootstrap, topic, 2, {"min.insync.replicas": "2"}, replication_factor=2)
    wait_until(lambda: len(in_sync(cluster, topic)) == 2, SETTLE_S, "both brokers in sync")
    master = leader(cluster, topic)
    replica = 1 - master
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    expected = [b"r%d" % i for i in range(COUNT)]
    for value in expected:
        producer.produce(topic, value=value)
    assert producer.flush(30) == 0

    assert sorted(read(cluster, topic, f"rack-{replica}")) == sorted(expected)
    served_by_replica = records_served(cluster, replica, topic)
    assert served_by_replica >= COUNT  # every record came from the replica (the leader only sent the consumer on)
    options = json.dumps({"topic": topic, "count": COUNT, "rackId": f"rack-{replica}"})
    got = run_node("kafkajs_client.js", cluster.brokers[0].bootstrap, "readInRack", options, timeout=60)["result"][
        "got"
    ]
    assert sorted(m["value"].encode() for m in got) == sorted(expected)
    assert records_served(cluster, replica, topic) >= served_by_replica + COUNT  # kafkajs read them there too
    served_by_replica = records_served(cluster, replica, topic)

    # read_committed stays with the leader: the replica serves it nothing more, and it reads every committed record
    txn = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": unique("rack-txn")})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic, value=b"aborted")
    txn.flush(30)
    txn.abort_transaction(30)
    producer.produce(topic, value=b"after")
    assert producer.flush(30) == 0
    committed = read(cluster, topic, f"rack-{replica}", "read_committed", COUNT + 1)
    assert sorted(committed) == sorted([*expected, b"after"])
    assert records_served(cluster, replica, topic) == served_by_replica


def test_the_racks_are_in_describe_cluster(mqk_cluster_factory: Any) -> None:
    cluster = mqk_cluster_factory(2, group_size=2, config=CONFIG, broker_args={0: ["--rack", "a"], 1: ["--rack", "b"]})
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})  # (held: the future needs its client alive)

    def racks() -> dict[int, str | None]:
        return {node.id: node.rack for node in admin.describe_cluster().result(30).nodes}

    # (a broker's view of the others' registrations arrives by an etcd watch, just after it starts)
    wait_until(lambda: len(racks()) == 2, SETTLE_S, "both brokers in the view")
    assert racks() == {0: "a", 1: "b"}
