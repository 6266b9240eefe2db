"""Moving a partition to another broker group (AlterPartitionReassignments) on one machine: how fast the copy goes,
and how long producers of the partition wait while it switches groups.

    python bench/move_perf.py                                  # 300,000 records of 1 KiB, groups of 2
    python bench/move_perf.py --num-records 1000000 --group-size 1

Two broker groups of `--group-size` brokers each (`mqk serve --cluster` processes and etcd on loopback,
mqk.cluster_local). A topic of 2 partitions, replication factor the group size; `--num-records` records of
`--record-size` bytes are written to partition 0 with acks=all (the same run's baseline: how fast the cluster took
them). Then, while a producer keeps writing to that partition (acks=all, idempotent, about 2,000 records/s),
partition 0 is moved to the other group; printed:
- the move: from AlterPartitionReassignments to the partition's leader in the other group, and the copy's rate;
- the producer's longest wait: the largest gap between two acknowledgements during the move (the seal, the copy
  of the rest, the switch, and the client finding the new leader);
- every acknowledged value read back from the new group, once, at its offset (else the run fails).

Needs the `etcd` binary (Debian's etcd-server) and `mqk[cluster]`.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaTopicPartition

from mqk.cluster_local import LocalCluster

TOPIC = "move-perf"


def wait(condition: Callable[[], object], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)  # (a poll: the cluster's state is only known by asking)


def leader_and_replicas(c: LocalCluster) -> tuple[int, list[int]]:
    md = AdminClient({"bootstrap.servers": c.bootstrap}).list_topics(TOPIC, timeout=10)
    p = md.topics[TOPIC].partitions[0]
    return p.leader, sorted(p.replicas)


def fill(c: LocalCluster, count: int, size: int) -> float:
    """Write `count` records to partition 0 with acks=all; the seconds it took."""
    producer = Producer(
        {"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1 << 20,
         "queue.buffering.max.kbytes": 1 << 20}
    )  # fmt: skip
    value = b"x" * size
    started = time.monotonic()
    for _ in range(count):
        while True:
            try:
                producer.produce(TOPIC, value=value, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(300):
        raise SystemExit("the fill did not finish")
    return time.monotonic() - started


class Load:
    """An idempotent acks=all producer writing unique values to partition 0 in a thread, about 2,000 a second."""

    def __init__(self, c: LocalCluster) -> None:
        self.producer = Producer(
            {"bootstrap.servers": c.bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 2,
             "topic.metadata.refresh.interval.ms": 1000}
        )  # fmt: skip
        self.acked: dict[bytes, int] = {}
        self.ack_times: list[float] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failed += 1
            return
        self.acked[msg.value()] = msg.offset()
        self.ack_times.append(time.monotonic())

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            self.producer.produce(TOPIC, value=b"load-%09d" % n, partition=0, on_delivery=self._delivered)
            n += 1
            if n % 20 == 0:
                self.producer.poll(0.01)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.producer.flush(120)

    def longest_gap(self, start: float, end: float) -> float:
        times = [t for t in self.ack_times if start <= t <= end + 5]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def read_back(c: LocalCluster, expect: dict[bytes, int], total: int) -> None:
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "move-perf-check", "fetch.max.bytes": 1 << 26})
    consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
    at: dict[int, bytes] = {}
    deadline = time.monotonic() + 300
    try:
        while len(at) < total and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                if not msg.error():
                    at[msg.offset()] = msg.value()
    finally:
        consumer.close()
    wrong = [v for v, offset in expect.items() if at.get(offset) != v]
    if len(at) < total or wrong:
        raise SystemExit(
            f"read back {len(at)} of {total} records; {len(wrong)} acknowledged values not at their offset"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-records", type=int, default=300_000)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--group-size", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mqk-move-perf-") as tmp:
        config = {"store": {"commitlog_segment_bytes": 256 << 20}}
        c = LocalCluster(Path(tmp), 2 * args.group_size, group_size=args.group_size, config=config).start()
        try:
            admin = AdminClient({"bootstrap.servers": c.bootstrap})
            topic = NewTopic(TOPIC, 2, args.group_size, config={"min.insync.replicas": str(args.group_size)})
            for future in admin.create_topics([topic]).values():
                future.result(30)
            wait(lambda: leader_and_replicas(c)[0] >= 0, 60, "a leader")
            took = fill(c, args.num_records, args.record_size)
            mb = args.num_records * args.record_size / (1 << 20)
            print(
                f"{args.num_records} records written (acks=all, RF {args.group_size}), "
                f"{args.num_records / took:.1f} records/sec ({mb / took:.2f} MB/sec): the same run's baseline"
            )
            _leader, replicas = leader_and_replicas(c)
            target = sorted({b.node_id for b in c.brokers} - set(replicas))
            load = Load(c)
            load.start()
            wait(lambda: len(load.acked) >= 1000, 60, "the load's first acknowledgements")
            kafka_admin = KafkaAdminClient(bootstrap_servers=c.bootstrap)
            started = time.monotonic()
            kafka_admin.alter_partition_reassignments({KafkaTopicPartition(TOPIC, 0): target})
            wait(lambda: leader_and_replicas(c)[1] == target, 300, "the move")
            moved = time.monotonic() - started
            wait(lambda: load.ack_times[-1] > started + moved, 60, "an acknowledgement after the move")
            gap = load.longest_gap(started, started + moved)
            load.stop()
            kafka_admin.close()
            total = args.num_records + len(load.acked)
            print(
                f"moved {total} records ({mb:.1f} MB and the load's) in {moved:.2f} s "
                f"({mb / moved:.2f} MB/sec copied), the producer's longest wait {gap * 1000:.0f} ms, "
                f"{load.failed} failed sends"
            )
            read_back(c, load.acked, total)
            print(f"read back: {total} records, every acknowledged value at its offset")
        finally:
            c.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
