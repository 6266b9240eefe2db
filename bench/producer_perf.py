"""Producer throughput and latency against a Kafka-protocol broker, with confluent-kafka; the arguments and the
output follow Kafka's kafka-producer-perf-test:

    python bench/producer_perf.py --topic perf --num-records 1000000 --record-size 100 --throughput -1 \
        --producer-props acks=1 linger.ms=5 --start-broker

prints a line every 5 s and, at the end,
`N records sent, X records/sec (Y MB/sec), A ms avg latency, B ms max latency, P50 ms 50th, P95 ms 95th,
P99 ms 99th, P999 ms 99.9th.` Latency is librdkafka's own per-message figure (produce() call to delivery report).
With `--start-broker` the tool runs an mqk broker subprocess for the measurement and adds its CPU seconds for
the run and per million records. `run()` is the same measurement as a function (used by kafka_suite.py).
"""

from __future__ import annotations

import argparse
import random
import string
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import perfutil

REPORT_INTERVAL_S = 5.0
SPREADS = ("round-robin", "client")


@dataclass
class _Window:
    start: float
    count: int = 0
    bytes: int = 0
    latency_sum: float = 0.0
    latency_max: float = 0.0


@dataclass
class Stats:
    """Delivery-report accounting, in the shape Kafka's perf tool prints."""

    record_size: int
    sample_every: int
    quiet: bool = False
    acked: int = 0
    errors: int = 0
    first_error: str | None = None
    latencies_ms: list[float] = field(default_factory=list)
    window: _Window = field(default_factory=lambda: _Window(time.monotonic()))

    def on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors += 1
            if self.first_error is None:
                self.first_error = str(err)
            return
        latency = msg.latency() * 1000.0
        self.acked += self.sample_every
        self.latencies_ms.append(latency)
        w = self.window
        w.count += self.sample_every
        w.latency_sum += latency
        w.latency_max = max(w.latency_max, latency)
        now = time.monotonic()
        if now - w.start >= REPORT_INTERVAL_S:
            self.print_window(now)

    def print_window(self, now: float) -> None:
        w = self.window
        elapsed = max(now - w.start, 1e-9)
        samples = max(1, w.count // self.sample_every)
        if not self.quiet:
            print(
                f"{w.count} records sent, {w.count / elapsed:.1f} records/sec "
                f"({w.count * self.record_size / elapsed / 1048576:.2f} MB/sec), "
                f"{w.latency_sum / samples:.1f} ms avg latency, {w.latency_max:.1f} ms max latency.",
                flush=True,
            )
        self.window = _Window(now)


def make_payload(size: int, seed: int = 7) -> bytes:
    rnd = random.Random(seed)
    return "".join(rnd.choice(string.ascii_letters) for _ in range(size)).encode()


def run(
    bootstrap: str,
    topic: str,
    num_records: int,
    record_size: int,
    throughput: float = -1,
    producer_props: dict[str, str] | None = None,
    partitions: int = 1,
    sample_every: int = 1,
    quiet: bool = False,
    spread: str = "round-robin",
) -> dict[str, Any]:
    """Produce `num_records` records of `record_size` bytes; returns the summary figures. With several
    partitions, `spread` "round-robin" names partition i % partitions for record i; "client" names none, so
    librdkafka's partitioner places the keyless records (its sticky partitioner: one partition at a time, switching
    every sticky.partitioning.linger.ms), as kafka-producer-perf-test's records are placed."""
    from confluent_kafka import Producer

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 2_000_000,
        "queue.buffering.max.kbytes": 2_000_000,
    }
    conf.update(producer_props or {})
    producer = Producer(conf)
    payload = make_payload(record_size)
    stats = Stats(record_size, sample_every, quiet)
    cb = stats.on_delivery
    produce, poll = producer.produce, producer.poll

    if spread not in SPREADS:
        raise ValueError(f"spread {spread!r} is not one of {SPREADS}")
    round_robin = partitions > 1 and spread == "round-robin"
    default_partition = -1 if spread == "client" else 0  # -1: unassigned, the partitioner decides
    start = time.monotonic()
    for i in range(num_records):
        partition = i % partitions if round_robin else default_partition
        while True:
            try:
                if i % sample_every == 0:
                    produce(topic, payload, partition=partition, on_delivery=cb)
                else:
                    produce(topic, payload, partition=partition)
                break
            except BufferError:  # local queue full: serve delivery reports, then retry
                poll(0.005)
        if throughput > 0:
            # Wait in poll() rather than sleep(), so delivery reports (and their latency) are served on time:
            # librdkafka measures a record's latency when its report is handed to the application.
            while True:
                ahead = (i + 1) / throughput - (time.monotonic() - start)
                if ahead <= 0:
                    break
                poll(min(ahead, 0.005))
        elif i % 1000 == 999:
            poll(0)
    remaining = producer.flush(120)
    elapsed = time.monotonic() - start
    if remaining:
        raise RuntimeError(f"{remaining} records still undelivered after 120 s")
    if stats.errors:
        raise RuntimeError(f"{stats.errors} delivery errors, first: {stats.first_error}")

    lat = sorted(stats.latencies_ms)
    rate = num_records / elapsed
    result = {
        "records": num_records,
        "elapsed_s": elapsed,
        "records_per_s": rate,
        "mb_per_s": rate * record_size / 1048576,
        "avg_ms": sum(lat) / len(lat) if lat else 0.0,
        "max_ms": lat[-1] if lat else 0.0,
        "p50_ms": perfutil.percentile(lat, 50),
        "p95_ms": perfutil.percentile(lat, 95),
        "p99_ms": perfutil.percentile(lat, 99),
        "p999_ms": perfutil.percentile(lat, 99.9),
    }
    if not quiet:
        print(final_line(result), flush=True)
    return result


def final_line(r: dict[str, Any]) -> str:
    return (
        f"{r['records']} records sent, {r['records_per_s']:.1f} records/sec ({r['mb_per_s']:.2f} MB/sec), "
        f"{r['avg_ms']:.2f} ms avg latency, {r['max_ms']:.2f} ms max latency, {r['p50_ms']:.0f} ms 50th, "
        f"{r['p95_ms']:.0f} ms 95th, {r['p99_ms']:.0f} ms 99th, {r['p999_ms']:.0f} ms 99.9th."
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topic", required=True)
    p.add_argument("--num-records", type=int, required=True)
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--throughput", type=float, default=-1, help="records/s ceiling; -1 = as fast as possible")
    p.add_argument("--producer-props", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--partitions", type=int, default=1, help="create the topic with this many partitions (see --spread)"
    )
    p.add_argument(
        "--spread",
        choices=SPREADS,
        default="round-robin",
        help="round-robin: record i to partition i %% partitions; client: no partition named, the "
        "client's partitioner places the keyless records (what kafka-producer-perf-test does)",
    )
    p.add_argument(
        "--latency-sample-every",
        type=int,
        default=1,
        help="delivery report (and latency sample) for every Nth record; 1 = every record",
    )
    perfutil.add_broker_args(p)
    args = p.parse_args(argv)

    props = perfutil.parse_props(args.producer_props)
    broker = perfutil.Broker(args.storage, args.data_dir) if args.start_broker else None
    try:
        bootstrap = broker.bootstrap if broker else (args.bootstrap or props.pop("bootstrap.servers", None))
        props.pop("bootstrap.servers", None)
        if not bootstrap:
            p.error("give --bootstrap, bootstrap.servers=... in --producer-props, or --start-broker")
        perfutil.create_topic(bootstrap, args.topic, args.partitions)
        if broker:
            broker.settle()
        cpu0 = broker.cpu_seconds() if broker else 0.0
        result = run(
            bootstrap,
            args.topic,
            args.num_records,
            args.record_size,
            args.throughput,
            props,
            args.partitions,
            args.latency_sample_every,
            spread=args.spread,
        )
        if broker:
            broker.settle()  # count the background flush / dispatch these records caused
            cpu = broker.cpu_seconds() - cpu0
            # CPU seconds per million records is numerically the CPU microseconds per record.
            print(
                f"broker cpu: {cpu:.2f} s for {args.num_records} records, "
                f"{cpu / args.num_records * 1e6:.2f} s per million records",
                flush=True,
            )
    finally:
        if broker:
            broker.close()
    return 0 if result["records"] == args.num_records else 1


if __name__ == "__main__":
    sys.exit(main())
