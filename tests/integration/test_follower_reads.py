"""A replica's readers wake when what they wait for is committed, not at their long poll's end: a Fetch v11 from a
consumer (which a replica serves, KIP-392) waiting on the replica with a 60-second max wait is answered with a
record once that record is written with acks=all and the replica hears its master's commit offset pass it. A
replica first gets a record's bytes and only then the commit offset that covers it, so a reader woken by the
bytes alone finds nothing readable yet and waits again; it must be woken again by the commit. `mqk serve`
processes, etcd and mqk's raw Kafka client on loopback; every wait is bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from helpers import CLUSTER_TESTS, CONFIG, SETTLE_S, fetch_body, in_sync, leader, values_of, wait_until

from mqk.cluster_local import LocalCluster
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient

pytestmark = [pytest.mark.timeout(180), CLUSTER_TESTS]

#: longer than the test waits for the answer: an answer in time was woken, not timed out
MAX_WAIT_MS = 60_000
ANSWER_WITHIN_S = 30


def test_a_fetch_waiting_on_a_replica_is_answered_once_the_record_is_committed(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = mqk_cluster_factory(2, group_size=2, config=CONFIG)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futures = admin.create_topics([NewTopic("waited", 1, 2, config={"min.insync.replicas": "2"})])
    futures["waited"].result(30)
    wait_until(lambda: len(in_sync(cluster, "waited")) == 2, SETTLE_S, "both brokers in sync")
    replica = next(b for b in cluster.brokers if b.node_id != leader(cluster, "waited"))
    host, port = replica.bootstrap.rsplit(":", 1)

    async def fetch_while_a_record_is_written() -> list[bytes]:
        async with await RawKafkaClient.connect(host, int(port)) as client:
            body = {**fetch_body("waited", 0, max_wait_ms=MAX_WAIT_MS, min_bytes=1), "rack_id": "any"}
            waiting = asyncio.ensure_future(client.call(ApiKey.FETCH, 11, body))
            producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 0})
            producer.produce("waited", value=b"committed")
            assert await asyncio.to_thread(producer.flush, 30) == 0
            answer = await asyncio.wait_for(waiting, ANSWER_WITHIN_S)
        partition = answer["responses"][0]["partitions"][0]
        assert partition["error_code"] == 0, partition
        return values_of(partition["records"])

    assert asyncio.run(fetch_while_a_record_is_written()) == [b"committed"]
