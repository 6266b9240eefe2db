"""Replication on one machine: what RF 3 with acks=all costs against RF 1 with acks=1, the replication lag under
that load, and failover times over a kill loop.

    python bench/replication_perf.py                         # 3 rounds each way, then 10 kills
    python bench/replication_perf.py --rounds 1 --num-records 500000 --kills 5

1. Throughput: two clusters of three `mqk serve --cluster` processes (etcd on loopback, mqk.cluster_local): one
   with three broker groups of one broker (RF 1: a topic's partitions spread over three masters, nothing copied),
   one with one group of three (RF 3: one master, two replicas holding every byte). The same confluent-kafka
   producer (bench/producer_perf.py: kafka-producer-perf-test's line) writes `--num-records` records of
   `--record-size` bytes to a `--partitions` topic of each, acks=1 on RF 1 and acks=all with
   min.insync.replicas=2 on RF 3; rounds alternate. The summary gives RF 3's records/s as a share of RF 1's
   (goal: at least 50 %) and the master's replication lag p99 under that load, from its /metrics (the time from an
   append to the last in-sync replica's ack; goal: at most 100 ms).
2. Failover: on the RF 3 cluster an idempotent acks=all producer writes while the master is killed (SIGKILL)
   `--kills` times; each time is from the kill to the first write acknowledged after it (by the new master), with
   the brokers' session timeout `--session-ms`. Printed as p50, p99 and max (goal: p99 at most 5 s).

Needs the `etcd` binary (Debian's etcd-server) and `mqk[cluster]`.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import perfutil
import producer_perf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mqk.cluster_local import LocalCluster

LAG = re.compile(r"^mqk_replication_lag_p99_ms(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


def cluster(root: Path, group_size: int, session_ms: int) -> LocalCluster:
    config = {
        "cluster_session_timeout_ms": session_ms,
        "store": {"commitlog_segment_bytes": 256 << 20},
    }
    return LocalCluster(root, 3, group_size=group_size, config=config).start()


def create(c: LocalCluster, topic: str, partitions: int, rf: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    conf = {"min.insync.replicas": "2"} if rf == 3 else {}
    for future in admin.create_topics([NewTopic(topic, partitions, rf, config=conf)]).values():
        future.result(30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # every replica in sync before the clock starts
        md = admin.list_topics(topic, timeout=10).topics[topic].partitions
        if len(md) == partitions and all(p.leader >= 0 and len(p.isrs) == rf for p in md.values()):
            return
        time.sleep(0.1)  # (a benchmark polls the metadata it waits for)
    raise TimeoutError(f"{topic}: replicas not in sync after 60 s")


def lag_p99_ms(c: LocalCluster) -> float:
    """The largest replication lag p99 any broker's /metrics reports (the master's; replicas report 0)."""
    worst = 0.0
    for b in c.brokers:
        if b.admin is None or not b.running:
            continue
        with urllib.request.urlopen(f"http://{b.admin[0]}:{b.admin[1]}/metrics", timeout=10) as r:
            text = r.read().decode()
        for m in LAG.finditer(text):
            worst = max(worst, float(m.group(1)))
    return worst


def cpu(c: LocalCluster) -> float:
    return sum(perfutil.proc_cpu_seconds(b.pid) for b in c.brokers if b.running)


def throughput(args: argparse.Namespace, root: Path) -> None:
    rf1 = cluster(root / "rf1", 1, args.session_ms)
    rf3 = cluster(root / "rf3", 3, args.session_ms)
    try:
        create(rf1, "perf", args.partitions, 1)
        create(rf3, "perf", args.partitions, 3)
        results: dict[str, list[dict[str, Any]]] = {"rf1": [], "rf3": []}
        lags = []
        for r in range(args.rounds):
            for name, c, acks in (("rf1", rf1, "1"), ("rf3", rf3, "all")):
                before = cpu(c)
                result = producer_perf.run(
                    c.bootstrap,
                    "perf",
                    args.num_records,
                    args.record_size,
                    producer_props={"acks": acks, "linger.ms": "5"},
                    partitions=args.partitions,
                    sample_every=10,
                    quiet=True,
                )
                used = cpu(c) - before
                results[name].append(result)
                extra = ""
                if name == "rf3":
                    lags.append(lag_p99_ms(c))
                    extra = f", replication lag p99 {lags[-1]:.1f} ms"
                print(
                    f"round {r + 1} {name} acks={acks}: {producer_perf.final_line(result)} "
                    f"brokers {used / result['records'] * 1e6:.2f} CPU s per million records{extra}",
                    flush=True,
                )
        one = statistics.median(r["records_per_s"] for r in results["rf1"])
        three = statistics.median(r["records_per_s"] for r in results["rf3"])
        print(
            f"summary: RF 1 acks=1 {one:.0f} records/s, RF 3 acks=all {three:.0f} records/s (medians of "
            f"{args.rounds}): {100 * three / one:.0f} % (goal >= 50 %); replication lag p99 "
            f"{max(lags):.1f} ms at worst (goal <= 100 ms)",
            flush=True,
        )
    finally:
        rf1.stop()
        rf3.stop()


def failover(args: argparse.Namespace, root: Path) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    c = cluster(root / "kills", 3, args.session_ms)
    try:
        create(c, "loop", 3, 3)
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        producer = Producer(
            {
                "bootstrap.servers": c.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": 120_000,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        acks: list[float] = []
        stop = threading.Event()

        def acked(err: Any, _msg: Any) -> None:
            if err is None:
                acks.append(time.monotonic())

        def write() -> None:
            n = 0
            while not stop.is_set():
                try:
                    producer.produce("loop", b"%d" % n, on_delivery=acked)
                    n += 1
                except BufferError:
                    producer.poll(0.05)
                    continue
                if n % 20 == 0:
                    producer.poll(0.01)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        times = []
        for _ in range(args.kills):
            time.sleep(1.0)
            master = admin.list_topics("loop", timeout=10).topics["loop"].partitions[0].leader
            killed = time.monotonic()
            c.kill(master)
            while not any(t > killed for t in acks[-1000:]):
                if time.monotonic() - killed > 60:
                    raise TimeoutError("no write acknowledged within 60 s of a kill")
                time.sleep(0.01)  # (the producer thread records the acks)
            times.append(min(t for t in acks if t > killed) - killed)
            print(f"kill {len(times)}: node {master}, first acknowledged write {times[-1]:.2f} s later", flush=True)
            c.restart(master)
        stop.set()
        writer.join(10)
        producer.flush(60)
        times.sort()
        print(
            f"failover over {len(times)} kills (session timeout {args.session_ms} ms): "
            f"p50 {perfutil.percentile(times, 50):.2f} s, p99 {perfutil.percentile(times, 99):.2f} s, "
            f"max {times[-1]:.2f} s (goal p99 <= 5 s)",
            flush=True,
        )
    finally:
        c.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-records", type=int, default=1_000_000)
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--session-ms", type=int, default=3000, help="the brokers' lease TTL (cluster_session_timeout_ms)")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-failover", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mqk-repl-bench-") as tmp:
        if not args.skip_throughput:
            throughput(args, Path(tmp))
        if not args.skip_failover:
            failover(args, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
