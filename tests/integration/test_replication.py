"""Replication and failover, for real: one broker group of three `mqk serve --cluster` processes on loopback, etcd,
confluent-kafka clients, and faults injected with SIGKILL, SIGSTOP/SIGCONT and a TCP proxy on the replication link.

- the kill loop: an idempotent acks=all producer writes unique values to a topic of RF 3 with min.insync.replicas=2
  while its partitions' master is killed again and again; every acknowledged value is read back exactly once, at
  the offset it was acknowledged at, and a consumer that read during the loop saw nothing another read contradicts
  (no two values at one offset: nobody read past the high watermark);
- a paused master: SIGSTOP past its lease, a new master takes over, SIGCONT: it steps down, and writes it took
  with acks=1 after it lost its lease are cut from its log (its CommitLog is the new master's prefix again);
- replicas killed under load: writes go on while the in-sync set keeps min.insync.replicas; with too few, acks=all
  is refused NOT_ENOUGH_REPLICAS while acks=1 goes on; restarted, the replicas catch up and rejoin the set;
- a slow, then cut replication link (a proxy in front of every broker's replication listener): the replica leaves
  the in-sync set and rejoins it; nothing acknowledged is lost.

Every wait is bounded; the fixtures stop every process (by pid) and etcd.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from helpers import (
    CLUSTER_TESTS,
    CONFIG,
    LAG_MS,
    SETTLE_S,
    AckedProducer,
    Proxy,
    assert_every_ack_read_once,
    commitlog_bytes,
    create_topic,
    in_sync,
    leader,
    partition_sizes,
    produce_one,
    read_all,
    three_replicas,
    wait_until,
)

from mqk.cluster_local import LocalCluster, free_port
from mqk.config import StoreConfig
from mqk.store.file.engine import FileEngine
from mqk.testing import TEST_CLUSTER_STORE

pytestmark = [pytest.mark.timeout(300), CLUSTER_TESTS]

# --- the kill loop ------------------------------------------------------------------------------------------------


KILLS = 10


def test_killing_the_master_again_and_again_loses_no_acknowledged_record(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = three_replicas(mqk_cluster_factory)
    create_topic(cluster, "loop")
    rng = random.Random(25)
    failovers: list[float] = []
    during: dict[tuple[int, int], bytes] = {}
    reading = threading.Event()

    def read_during() -> None:
        consumer = Consumer(
            {"bootstrap.servers": cluster.bootstrap, "group.id": "during", "auto.offset.reset": "earliest"}
        )
        consumer.subscribe(["loop"])
        try:
            while not reading.is_set():
                msg = consumer.poll(0.1)
                if msg is not None and not msg.error():
                    during[(msg.partition(), msg.offset())] = msg.value()
        finally:
            consumer.close()

    reader = threading.Thread(target=read_during, daemon=True)
    reader.start()
    with AckedProducer(cluster, "loop") as producer:
        wait_until(lambda: len(producer.acked) > 500, SETTLE_S, "the first acknowledgements")
        settled = time.monotonic()
        for _ in range(KILLS):
            # a random moment of the load: after a random number of writes acknowledged since the last failover
            wanted = rng.randint(300, 3000)
            wait_until(lambda s=settled, n=wanted: producer.acks_after(s) >= n, SETTLE_S, f"{wanted} acknowledgements")
            master = leader(cluster, "loop")
            killed_at = time.monotonic()
            cluster.kill(master)
            wait_until(
                lambda t=killed_at, m=master: producer.acks_after(t) > 0 and leader(cluster, "loop") != m,
                SETTLE_S,
                "an acknowledged write on a new master",
            )
            failovers.append(min(t for t in producer.ack_times if t > killed_at) - killed_at)
            settled = time.monotonic()
            cluster.restart(master)
            wait_until(lambda: len(in_sync(cluster, "loop")) == 3, SETTLE_S, "the restarted broker back in sync")
    reading.set()
    reader.join(30)
    assert not producer.failed, producer.failed[:3]
    seen = read_all(cluster, "loop", len(producer.acked), "after")
    assert_every_ack_read_once(producer.acked, seen)
    contradicted = [(at, v) for at, v in during.items() if seen.get(at) != v]
    assert not contradicted, f"read during the loop, then gone or changed: {contradicted[:3]}"
    failovers.sort()
    print(
        f"kill loop: {len(producer.acked)} records acknowledged, {KILLS} failovers, kill to first acknowledged "
        f"write p50 {failovers[len(failovers) // 2]:.2f} s, max {failovers[-1]:.2f} s"
    )


# --- a consumer across a failover ---------------------------------------------------------------------------------


def test_a_consumer_goes_on_across_a_failover_without_resetting_its_position(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    """What a master appends carries its epoch (partitionLeaderEpoch, as Kafka's leader stamps it); after the master
    is killed the consumer asks the new one where that epoch ended (OffsetForLeaderEpoch, KIP-320), is told no
    truncation happened, and reads on from its position: every offset once, none read again from the beginning."""
    cluster = three_replicas(mqk_cluster_factory)
    create_topic(cluster, "across", partitions=1)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True})

    def produce(values: range) -> None:
        for v in values:
            producer.produce("across", value=str(v).encode(), partition=0)
        assert producer.flush(30) == 0

    produce(range(200))
    # assigned, not subscribed: its position lives only in the client, so only the log's epochs decide it
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "across",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    offsets: list[int] = []
    epochs: set[int | None] = set()

    def consume_until(count: int) -> None:
        def step() -> bool:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                offsets.append(msg.offset())
                epochs.add(msg.leader_epoch())
            return len(offsets) >= count

        wait_until(step, SETTLE_S, f"{count} records read")

    try:
        consumer.assign([TopicPartition("across", 0, 0)])
        consume_until(200)
        (first_epoch,) = epochs
        assert first_epoch is not None and first_epoch >= 1, "what the master appended carries its epoch"
        cluster.kill(leader(cluster, "across"))
        wait_until(lambda: produce_one(cluster, "across", "all") is None, SETTLE_S, "a write on the new master")
        produce(range(200, 400))
        consume_until(401)  # (a reset to the beginning would re-read offset 0 on before offset 400)
    finally:
        consumer.close()
    assert offsets == list(range(401)), "each offset read once, in order, across the failover"
    assert max(e for e in epochs if e is not None) > first_epoch


def test_records_deleted_on_the_master_stay_deleted_after_a_failover(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    """DeleteRecords moves the partition's log start on its master, which tells its replicas (LOG_STARTS): once the
    master is killed, the new one's log starts there too (the deleted records do not come back)."""
    cluster = three_replicas(mqk_cluster_factory)
    create_topic(cluster, "deleted", partitions=1)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 0})
    for v in range(100):
        producer.produce("deleted", value=str(v).encode(), partition=0)
        producer.flush(10)  # one batch per record: a log start at 40 leaves 40 batches behind it
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    (future,) = admin.delete_records([TopicPartition("deleted", 0, 40)]).values()
    assert future.result(30).low_watermark == 40
    master = leader(cluster, "deleted")
    wait_until(
        lambda: len({partition_sizes(cluster, b.node_id, "deleted", [0])[0] for b in cluster.brokers}) == 1,
        SETTLE_S,
        "every replica's log to start where the master's does",
    )
    cluster.kill(master)
    wait_until(lambda: produce_one(cluster, "deleted", "all") is None, SETTLE_S, "a write on the new master")
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "deleted", "enable.auto.commit": False})
    try:
        low, _high = consumer.get_watermark_offsets(TopicPartition("deleted", 0), timeout=10)
    finally:
        consumer.close()
    assert low == 40


# --- a paused master ----------------------------------------------------------------------------------------------


def test_a_paused_master_steps_down_and_its_writes_after_losing_the_lease_are_cut(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = three_replicas(mqk_cluster_factory)
    create_topic(cluster, "paused", partitions=1)
    with AckedProducer(cluster, "paused") as before:
        wait_until(lambda: len(before.acked) > 200, SETTLE_S, "acknowledged writes")
    old = leader(cluster, "paused")
    # a client that knows only the old master and never retries, acks=1: what it is told was written after the
    # lease was lost must not survive
    stale = Producer(
        {
            "bootstrap.servers": cluster.broker(old).bootstrap,
            "acks": 1,
            "enable.idempotence": False,
            "retries": 0,
            "message.timeout.ms": 20_000,
            "topic.metadata.refresh.interval.ms": 600_000,
        }
    )
    stale.produce("paused", value=b"warm-up", partition=0)
    stale.flush(10)
    late: list[bytes] = []
    cluster.pause(old)
    try:
        wait_until(lambda: leader_seen_by_others(cluster, old, "paused") not in (-1, old), SETTLE_S, "a new master")
        for i in range(200):  # queued in its socket while it sleeps: served, or refused, as it wakes
            stale.produce(
                "paused",
                value=b"late%d" % i,
                partition=0,
                on_delivery=lambda err, msg: late.append(msg.value()) if err is None else None,
            )
        stale.poll(0.5)
    finally:
        cluster.resume(old)
    stale.flush(30)
    new = leader_seen_by_others(cluster, old, "paused")
    assert new not in (-1, old)
    with AckedProducer(cluster, "paused") as after:
        wait_until(lambda: len(after.acked) > 200, SETTLE_S, "writes on the new master")
    wait_until(lambda: in_sync(cluster, "paused") == [0, 1, 2], SETTLE_S, "the old master back in sync")
    seen = read_all(cluster, "paused", len(before.acked) + len(after.acked), "check")
    assert_every_ack_read_once({**before.acked, **after.acked}, seen)
    survived = [v for v in late if v in set(seen.values())]
    assert not survived, f"writes the old master took after losing its lease survived: {survived[:3]}"
    cut = "diverged from master epoch" in cluster.broker(old).stderr()
    print(f"paused master: {len(late)} late writes acknowledged by it; its log was cut: {cut}")
    assert cut or not late, "the old master acknowledged late writes but never cut its log"
    cluster.stop()
    # its CommitLog is the new master's, byte for byte
    logs = {n: commitlog(cluster.broker(n).data_dir) for n in (old, new)}
    assert logs[old] and logs[old] == logs[new]


def commitlog(data_dir: Path, store: dict[str, Any] = TEST_CLUSTER_STORE) -> bytes:
    """A stopped broker's whole CommitLog, as recovery finds it (`store`: the settings it ran with)."""

    async def read() -> bytes:
        config = StoreConfig(data_dir=data_dir, **store)
        engine = FileEngine(config, data_dir)
        await engine.start()
        try:
            return commitlog_bytes(engine)
        finally:
            await engine.close()

    return asyncio.run(read())


def leader_seen_by_others(cluster: LocalCluster, exclude: int, topic: str) -> int:
    bootstrap = ",".join(b.bootstrap for b in cluster.brokers if b.node_id != exclude)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        return admin.list_topics(topic, timeout=5).topics[topic].partitions[0].leader
    except KafkaException:
        return -1


# --- replicas killed under load -----------------------------------------------------------------------------------


def test_writes_go_on_while_min_insync_replicas_hold_and_replicas_catch_up_after_restart(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = three_replicas(mqk_cluster_factory)
    create_topic(cluster, "shrink", partitions=2)
    master = leader(cluster, "shrink")
    replicas = [n for n in cluster.node_ids if n != master]
    with AckedProducer(cluster, "shrink") as producer:
        wait_until(lambda: len(producer.acked) > 200, SETTLE_S, "acknowledged writes")
        cluster.kill(replicas[0])
        wait_until(lambda: in_sync(cluster, "shrink") == sorted([master, replicas[1]]), SETTLE_S, "the set shrunk")
        shrunk_at = time.monotonic()
        wait_until(lambda: producer.acks_after(shrunk_at) > 200, SETTLE_S, "acks=all writes with two in sync")
    assert not producer.failed, producer.failed[:3]
    cluster.kill(replicas[1])
    wait_until(lambda: in_sync(cluster, "shrink") == [master], SETTLE_S, "the master alone in sync")
    refused = produce_one(cluster, "shrink", acks="all")
    assert refused is not None and refused.code() == KafkaError.NOT_ENOUGH_REPLICAS, refused
    assert produce_one(cluster, "shrink", acks="1") is None
    for node in replicas:
        cluster.restart(node)
    wait_until(lambda: len(in_sync(cluster, "shrink")) == 3, SETTLE_S, "both replicas caught up and back in sync")
    assert produce_one(cluster, "shrink", acks="all") is None
    seen = read_all(cluster, "shrink", len(producer.acked), "shrink")
    assert_every_ack_read_once(producer.acked, seen)


# --- a slow and a cut replication link ----------------------------------------------------------------------------


def test_a_slow_then_cut_replication_link_takes_the_replicas_out_of_sync_and_back(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    # every broker listens for replicas on a port of its own and advertises a proxy in front of it, so whichever
    # is master, its replicas come through a proxy the test holds
    ports = {n: free_port() for n in range(3)}
    proxies = {n: Proxy(("127.0.0.1", ports[n])) for n in range(3)}
    try:
        cluster = three_replicas(
            mqk_cluster_factory,
            broker_args={
                n: ["--replication-listen", f"127.0.0.1:{ports[n]}",
                    "--advertise", f"replication=127.0.0.1:{proxies[n].port}"]
                for n in range(3)
            },
        )  # fmt: skip
        create_topic(cluster, "slow", partitions=1, min_insync=1)
        master = leader(cluster, "slow")
        proxy = proxies[master]
        with AckedProducer(cluster, "slow") as producer:
            wait_until(lambda: len(producer.acked) > 200, SETTLE_S, "acknowledged writes")
            proxy.delay = LAG_MS / 1000 * 2  # every replica falls behind past replica.lag.time.max.ms
            wait_until(lambda: in_sync(cluster, "slow") == [master], SETTLE_S, "the slow replicas out of sync")
            alone_at = time.monotonic()
            wait_until(lambda: producer.acks_after(alone_at) > 100, SETTLE_S, "writes acknowledged by the master")
            proxy.delay = 0.0
            refused = proxy.refused
            proxy.cut()  # and the links dropped: the replicas connect again once it heals
            # the links stay down while both replicas try again and meet the cut
            wait_until(lambda: proxy.refused >= refused + 2, SETTLE_S, "the replicas' reconnects refused")
            proxy.heal()
            wait_until(lambda: len(in_sync(cluster, "slow")) == 3, SETTLE_S, "the replicas back in sync")
        assert not producer.failed, producer.failed[:3]
        seen = read_all(cluster, "slow", len(producer.acked), "slow")
        assert_every_ack_read_once(producer.acked, seen)
    finally:
        for p in proxies.values():
            p.close()


# --- a replica left behind the master's oldest segment ------------------------------------------------------------


def segments(data_dir: Path) -> list[int]:
    """The start offsets of a broker's CommitLog segments, as their file names give them."""
    return sorted(int(p.name) for p in (data_dir / "commitlog").iterdir() if p.name.isdigit())


def test_a_replica_whose_log_ends_before_the_masters_oldest_segment_starts_over_from_there(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    """A replica down while the master's reclaim deleted every segment it still had (file_reserved_time_ms, short
    here) cannot catch up from its end. Kafka's follower then truncates fully and starts at the leader's log start;
    so does an mqk replica: the master tells it to start over at its oldest segment, the replica empties its log and
    copies the master's from there, rejoins the in-sync set, and ends with the master's bytes and offsets."""
    segment = 1 << 20
    store = {**TEST_CLUSTER_STORE, "commitlog_segment_bytes": segment, "file_reserved_time_ms": 1000}
    cluster = mqk_cluster_factory(
        3, group_size=3, config={**CONFIG, "store": store, "log_retention_check_interval_ms": 200}
    )
    create_topic(cluster, "behind", partitions=1)
    master = leader(cluster, "behind")
    left = next(n for n in cluster.node_ids if n != master)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})

    def write(count: int) -> None:
        failed: list[Any] = []
        for i in range(count):
            producer.produce("behind", value=b"%06d" % i + b"x" * 1000, partition=0,
                             on_delivery=lambda err, _m: err is not None and failed.append(err))  # fmt: skip
            producer.poll(0)
        assert producer.flush(60) == 0 and not failed, failed[:3]

    write(500)
    cluster.kill(left)
    left_dir = cluster.broker(left).data_dir
    left_end = segments(left_dir)[-1] + segment  # its log ends within its last segment
    master_dir = cluster.broker(master).data_dir
    # the master writes on past the replica's segments (1,000 records of 1 KiB fill one), then reclaims them
    write(1000 * (len(segments(master_dir)) + 2))
    wait_until(lambda: segments(master_dir)[0] >= left_end, SETTLE_S, "the master reclaiming the replica's segments")
    cluster.restart(left)
    wait_until(lambda: len(in_sync(cluster, "behind")) == 3, SETTLE_S, "the replica back in sync")
    write(200)
    wait_until(lambda: len(in_sync(cluster, "behind")) == 3, SETTLE_S, "all three in sync after more writes")
    producer.flush(10)
    cluster.stop()
    left_log, master_log = commitlog(left_dir, store), commitlog(master_dir, store)
    left_start, master_start = segments(left_dir)[0], segments(master_dir)[0]
    assert left_start > left_end - segment, (left_start, left_end)  # it did start over, past its old log
    # the bytes both still hold are the same, at the same offsets, and both end at the same place
    common = max(left_start, master_start)
    assert left_log[common - left_start :] == master_log[common - master_start :]
    assert left_start + len(left_log) == master_start + len(master_log)
