"""The kill loop with other producers than librdkafka: kafka-python (acks=all, idempotent) and ali-ons (RocketMQ
remoting against a SYNC_MASTER), each writing to a topic of one broker group of three while its master is killed
(SIGKILL) again and again. Whatever either was told is written is there afterwards, read by a Kafka consumer: a
RocketMQ queue is a Kafka partition. (tests/integration/test_replication.py runs the loop with confluent-kafka,
ten kills, and checks offsets and what consumers saw during it.)"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from typing import Any

import pytest
from compat_helpers import NodeProcess
from helpers import CLUSTER_TESTS, wait_until

pytestmark = [pytest.mark.timeout(300), CLUSTER_TESTS]

#: kills per loop: kafka-python fails over in seconds; ali-ons waits for its next route refresh (up to ~30 s a kill),
#: so its loop kills fewer times to keep the suite's time bounded
KILLS = 5
ONS_KILLS = 3
CONFIG = {"cluster_session_timeout_ms": 3000, "replica_lag_time_max_ms": 3000}
SETTLE_S = 60


def replicated_cluster(factory: Any) -> Any:
    return factory(3, group_size=3, config=CONFIG)


def create_rf3(cluster: Any, topic: str, partitions: int = 3) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 3, config={"min.insync.replicas": "2"})]).values():
        future.result(30)
    wait_until(lambda: len(isr(cluster, topic)) == 3, SETTLE_S, "three replicas in sync")


def describe(cluster: Any, topic: str) -> Any:
    from confluent_kafka.admin import AdminClient

    live = ",".join(b.bootstrap for b in cluster.brokers if b.running)
    return AdminClient({"bootstrap.servers": live}).list_topics(topic, timeout=10).topics[topic].partitions[0]


def isr(cluster: Any, topic: str) -> list[int]:
    try:
        return sorted(describe(cluster, topic).isrs)
    except Exception:  # noqa: BLE001 - no answer yet (a broker restarting): not in sync
        return []


def kill_loop(
    cluster: Any, topic: str, acks_after: Any, rng: random.Random, load: tuple[int, int], kills: int = KILLS
) -> list[float]:
    """Kill the master `kills` times, each time at a random moment of the load (after a random number, in `load`,
    of writes acknowledged since the last failover: `acks_after(monotonic moment)` counts them); wait for a write
    acknowledged by a new master, restart the killed broker and wait for it to be back in sync. The failover
    times."""
    times = []
    settled = time.monotonic()
    for _ in range(kills):
        wanted = rng.randint(*load)
        wait_until(lambda s=settled, n=wanted: acks_after(s) >= n, SETTLE_S, f"{wanted} acknowledged writes")
        master = describe(cluster, topic).leader
        killed = time.monotonic()
        cluster.kill(master)
        wait_until(lambda t=killed: acks_after(t) > 0, SETTLE_S, "a write acknowledged after the kill")
        settled = time.monotonic()
        times.append(time.monotonic() - killed)
        cluster.restart(master)
        wait_until(lambda: len(isr(cluster, topic)) == 3, SETTLE_S, "the killed broker back in sync")
    return times


def read_values(cluster: Any, topic: str, expect: set[bytes]) -> list[bytes]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    missing = set(expect)
    deadline = time.monotonic() + SETTLE_S
    try:
        while time.monotonic() < deadline and missing:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                values.append(msg.value())
                missing.discard(msg.value())
    finally:
        consumer.close()
    return values


def test_kafka_python_idempotent_acks_all_loses_nothing_over_a_kill_loop(mqk_cluster_factory: Any) -> None:
    from kafka import KafkaProducer

    cluster = replicated_cluster(mqk_cluster_factory)
    topic = "kp-loop"
    create_rf3(cluster, topic)
    producer = KafkaProducer(
        bootstrap_servers=cluster.bootstrap.split(","),
        acks="all",
        enable_idempotence=True,
        linger_ms=2,
        retries=1_000_000,
        delivery_timeout_ms=120_000,
        request_timeout_ms=10_000,
        metadata_max_age_ms=1000,
        reconnect_backoff_max_ms=500,
    )
    acked: dict[bytes, float] = {}
    failed: list[BaseException] = []
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            value = b"kp-%08d" % n
            future = producer.send(topic, value)
            future.add_callback(lambda _md, v=value: acked.__setitem__(v, time.monotonic()))
            future.add_errback(failed.append)
            n += 1
            time.sleep(0.001)  # pacing the writer: load to fail over under, not a flood to read back

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        wait_until(lambda: len(acked) > 200, SETTLE_S, "the first acknowledgements")
        times = kill_loop(
            cluster, topic, lambda t: sum(1 for when in list(acked.values()) if when > t), random.Random(3), (200, 1500)
        )
    finally:
        stop.set()
        writer.join(30)
        producer.flush(60)
        producer.close(10)
    assert not failed, failed[:3]
    values = read_values(cluster, topic, set(acked))
    lost = set(acked) - set(values)
    assert not lost, f"{len(lost)} acknowledged values lost, e.g. {sorted(lost)[:3]}"
    assert len(values) == len(set(values)), "an idempotent producer's value was stored twice"
    print(f"kafka-python kill loop: {len(acked)} acknowledged, failovers {', '.join(f'{t:.1f}' for t in times)} s")


def test_ali_ons_sync_master_loses_no_send_ok_message_over_a_kill_loop(mqk_cluster_factory: Any) -> None:
    cluster = replicated_cluster(mqk_cluster_factory)
    topic = "ons-loop"
    create_rf3(cluster, topic)
    # the name servers of the two brokers that are not the master: the producer learns the routes from them
    master = describe(cluster, topic).leader
    namesrv = ";".join(f"{b.namesrv[0]}:{b.namesrv[1]}" for b in cluster.brokers if b.node_id != master)
    producer = NodeProcess("ons.js", namesrv, "produce-loop", json.dumps({"topic": topic, "prefix": "ons"}))
    try:
        wait_until(lambda: len(producer.of("sent")) > 100, SETTLE_S, f"SEND_OK results ({producer.diagnostics()})")
        times = kill_loop(cluster, topic, lambda t: acks_after(producer, t), random.Random(5), (10, 100), ONS_KILLS)
    finally:
        producer.close()
    sent = producer.of("sent")
    ok = {e["body"].encode() for e in sent if e["sendStatus"] == "SEND_OK"}
    assert len(ok) > 100
    values = read_values(cluster, topic, ok)
    lost = ok - set(values)
    assert not lost, f"{len(lost)} SEND_OK messages lost, e.g. {sorted(lost)[:3]}"
    print(
        f"ali-ons kill loop: {len(ok)} SEND_OK, {len(producer.of('error'))} send errors retried, failovers "
        f"{', '.join(f'{t:.1f}' for t in times)} s"
    )


def acks_after(producer: NodeProcess, monotonic_moment: float) -> int:
    """How many SEND_OKs the node producer reported after `monotonic_moment` (its events carry wall time)."""
    wall_moment = time.time() - (time.monotonic() - monotonic_moment)
    return sum(1 for e in producer.of("sent") if e["at"] / 1000 > wall_moment and e["sendStatus"] == "SEND_OK")
