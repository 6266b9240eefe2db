"""Kafka transactions across broker groups: a cluster of three brokers (three groups, etcd on loopback) against
the same producer on idempotent, non-transactional writes, in the same run:

    python bench/cluster_txn_perf.py --num-records 300000 --rounds 3

- throughput: 100 B records round-robin over a 3-partition topic whose partitions are spread over the three groups,
  from an idempotent producer (acks=all) and from transactional ones committing every 1,000 and every 10,000
  records (each transaction writes to every group, so each commit waits for two other groups' markers through
  etcd). Kafka perf-test lines, with the brokers' CPU seconds per million records.
- commit latency: `--commits` transactions of one record per partition, one after the other; the time of
  commit_transaction (EndTxn: the Prepare record, the other groups' markers through etcd, the Complete record)
  as p50 / p99 / max, on the three-group topic and on a one-partition topic led by the transaction's coordinator
  (no other group: no etcd on the way).

The client runs beside the brokers on the same cores: compare the lines of one run, not runs. Needs the `etcd`
binary (Debian's etcd-server).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

import perfutil
import txn_perf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mqk.cluster_local import LocalCluster

RECORD_SIZE = txn_perf.RECORD_SIZE
PARTITIONS = 3


def commit_latencies(bootstrap: str, topic: str, partitions: int, transactional_id: str, commits: int) -> list[float]:
    """Seconds of each commit_transaction of `commits` one-record-per-partition transactions."""
    producer = txn_perf.make_producer(bootstrap, transactional_id)
    took = []
    for _ in range(commits):
        producer.begin_transaction()
        for p in range(partitions):
            txn_perf.send(producer, topic, b"x" * RECORD_SIZE, p)
        producer.flush(30)
        t0 = time.perf_counter()
        producer.commit_transaction(30)
        took.append(time.perf_counter() - t0)
    return sorted(took)


def leaders_of(bootstrap: str, name: str) -> set[int]:
    from confluent_kafka.admin import AdminClient

    parts = AdminClient({"bootstrap.servers": bootstrap}).list_topics(name, timeout=10).topics[name].partitions
    return {p.leader for p in parts.values()}


def coordinated_by(bootstrap: str, node: int) -> str:
    """A transactional id whose coordinator is `node`."""
    import asyncio

    from mqk.protocol.kafka.api import ApiKey
    from mqk.server.kafka.rawclient import RawKafkaClient

    host, port = bootstrap.split(",")[0].rsplit(":", 1)

    async def find() -> str:
        client = await RawKafkaClient.connect(host, int(port))
        try:
            while True:
                key = f"perf-{uuid.uuid4().hex[:8]}"
                body = await client.call(ApiKey.FIND_COORDINATOR, 3, {"key": key, "key_type": 1})
                if body["error_code"] == 0 and body["node_id"] == node:
                    return key
        finally:
            await client.close()

    return asyncio.run(find())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commits", type=int, default=200)
    args = parser.parse_args(argv)
    modes = txn_perf.MODES
    rates: dict[str, list[float]] = {name: [] for name, _ in modes}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", 3).start()
        try:
            warm = f"warm-{uuid.uuid4().hex[:6]}"
            perfutil.create_topic(cluster.bootstrap, warm, PARTITIONS)
            assert len(leaders_of(cluster.bootstrap, warm)) == 3, "the partitions are not spread over the groups"
            txn_perf.produce(cluster.bootstrap, warm, 20_000, 1000, PARTITIONS)
            for rnd in range(args.rounds):
                for name, per_txn in modes if rnd % 2 == 0 else list(reversed(modes)):
                    topic = f"ctxn-{uuid.uuid4().hex[:8]}"
                    perfutil.create_topic(cluster.bootstrap, topic, PARTITIONS)
                    cpu0 = sum(perfutil.proc_cpu_seconds(pid) for pid in cluster.pids.values())
                    rate = txn_perf.produce(cluster.bootstrap, topic, args.num_records, per_txn, PARTITIONS)[
                        "records_per_s"
                    ]
                    cpu = sum(perfutil.proc_cpu_seconds(pid) for pid in cluster.pids.values()) - cpu0
                    print(
                        f"{name}: {args.num_records} records sent, {rate:.1f} records/sec "
                        f"({rate * RECORD_SIZE / 1048576:.2f} MB/sec); brokers' cpu "
                        f"{cpu / args.num_records * 1e6:.2f} s per million records",
                        flush=True,
                    )
                    rates[name].append(rate)
            for label, partitions in (("three groups", PARTITIONS), ("the coordinator's group only", 1)):
                topic = f"clat-{uuid.uuid4().hex[:8]}"
                perfutil.create_topic(cluster.bootstrap, topic, partitions)
                (leader,) = leaders_of(cluster.bootstrap, topic) if partitions == 1 else {cluster.node_ids[0]}
                transactional_id = coordinated_by(cluster.bootstrap, leader)
                took = commit_latencies(cluster.bootstrap, topic, partitions, transactional_id, args.commits)
                print(
                    f"commit latency, partitions in {label}: p50 {perfutil.percentile(took, 50) * 1000:.1f} ms, "
                    f"p99 {perfutil.percentile(took, 99) * 1000:.1f} ms, max {took[-1] * 1000:.1f} ms "
                    f"({args.commits} commits)",
                    flush=True,
                )
        finally:
            cluster.stop()
    txn_perf.print_produce_medians(rates)
    return 0


if __name__ == "__main__":
    sys.exit(main())
