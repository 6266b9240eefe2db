"""Compaction benchmark: how fast the cleaner goes, and what it costs producers while it runs.

1. fill a compacted topic with `--records` records over `--keys` keys (default 1 M over 100 k) through the Kafka
   protocol (confluent-kafka);
2. produce to another topic while the cleaner compacts the filled one (measured only while it runs);
3. the same produce for as long again without compaction (the baseline);
4. print Kafka perf-test style lines for both runs, the cleaner's MB/s, and the throughput ratio (goal >= 70 %);
5. the offset map: 100 k key digests into a dict versus sortedcontainers.SortedDict (why the map is a dict).

The broker runs in this process (mqk.testing.ThreadedBroker) on the chosen engine (file by default, with 64 MiB
CommitLog segments; memory; rocksdb). Example: `python bench/compaction_bench.py --records 1000000 --keys 100000`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer

from mqk.config import TopicConfig
from mqk.services.compaction import MAP_ENTRY_BYTES, key_digest
from mqk.testing import ThreadedBroker, broker_config


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, round(p / 100 * len(values) + 0.5) - 1))]


def perf_line(n: int, seconds: float, nbytes: int, latencies_ms: list[float]) -> str:
    lat = sorted(latencies_ms)
    avg = sum(lat) / len(lat) if lat else 0.0
    return (
        f"{n} records sent, {n / seconds:.1f} records/sec ({nbytes / seconds / 1e6:.2f} MB/sec), "
        f"{avg:.2f} ms avg latency, {lat[-1] if lat else 0:.2f} ms max latency, "
        f"{percentile(lat, 50):.0f} ms 50th, {percentile(lat, 95):.0f} ms 95th, "
        f"{percentile(lat, 99):.0f} ms 99th, {percentile(lat, 99.9):.0f} ms 99.9th."
    )


def produce(bootstrap: str, topic: str, n: int, keys: int, value_size: int, until=None) -> tuple[int, float, int, list]:
    """Send up to n records (stop early once `until()` is true); returns (acked, seconds, bytes, latencies ms)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "batch.size": 256 * 1024,
            "enable.idempotence": False,
            "queue.buffering.max.messages": 200_000,
            "compression.type": "none",
        }
    )
    value = b"v" * value_size
    latencies: list[float] = []
    errors = [0]

    def make_cb(sent: float):
        def cb(err, _msg) -> None:
            if err is not None:
                errors[0] += 1
            else:
                latencies.append((time.perf_counter() - sent) * 1000)

        return cb

    start = time.perf_counter()
    for i in range(n):
        if until is not None and i % 1000 == 0 and until():
            break
        while True:
            try:
                producer.produce(
                    topic, key=b"key-%08d" % (i % keys), value=value, on_delivery=make_cb(time.perf_counter())
                )
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(120)
    seconds = time.perf_counter() - start
    if errors[0]:
        print(f"  ({errors[0]} records failed)")
    return len(latencies), seconds, len(latencies) * (value_size + 12), latencies


def map_microbench(n: int) -> None:
    from sortedcontainers import SortedDict

    digests = [key_digest(b"key-%08d" % i) for i in range(n)]
    for name, factory in (("dict", dict), ("SortedDict", SortedDict)):
        m = factory()
        t0 = time.perf_counter()
        for offset, d in enumerate(digests):
            m[d] = offset
        t1 = time.perf_counter()
        hits = sum(1 for d in digests if m.get(d, -1) >= 0)
        t2 = time.perf_counter()
        print(f"offset map {name}: {n} puts {n / (t1 - t0) / 1e6:.2f} M/s, {hits} gets {n / (t2 - t1) / 1e6:.2f} M/s")
    print(
        f"offset map budget: {MAP_ENTRY_BYTES} bytes per key -> 128 MiB holds {(128 << 20) // MAP_ENTRY_BYTES:,} keys"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--storage", choices=["file", "memory", "rocksdb"], default="file")
    parser.add_argument("--duty", type=float, default=None, help="cleaner share of a busy event loop (0-1]")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        extra = {"commitlog_segment_bytes": 64 << 20} if args.storage == "file" else {}
        broker = ThreadedBroker(broker_config(args.storage, Path(tmp) / "data", **extra)).start()
        try:
            store = broker.store
            broker.call(
                store.create_topic(
                    "compact-me",
                    1,
                    TopicConfig(
                        {
                            "cleanup.policy": "compact",
                            "segment.bytes": str(1 << 20),
                            "min.cleanable.dirty.ratio": "0.01",
                        }
                    ),
                )
            )
            broker.call(store.create_topic("load", 1, TopicConfig({"retention.ms": "-1"})))
            n, s, b, lat = produce(broker.bootstrap, "compact-me", args.records, args.keys, args.value_size)
            print(f"fill: {perf_line(n, s, b, lat)}")

            if args.duty is not None:
                broker.runtime.compaction.duty = args.duty
            # the produce window is as long as the cleaning takes; the baseline window has the same length
            future = asyncio.run_coroutine_threadsafe(broker.runtime.compaction.run_once(), broker.loop)
            n, s, b, lat = produce(broker.bootstrap, "load", 1 << 40, args.keys, args.value_size, until=future.done)
            busy_rate = n / s
            report = future.result(600)
            busy_line = perf_line(n, s, b, lat)
            deadline = time.perf_counter() + s
            n, s, b, lat = produce(
                broker.bootstrap,
                "load",
                1 << 40,
                args.keys,
                args.value_size,
                until=lambda: time.perf_counter() >= deadline,
            )
            base_rate = n / s
            print(f"produce without compaction: {perf_line(n, s, b, lat)}")
            print(f"produce while compacting:   {busy_line}")
            stats = report.cleaned.get(("compact-me", 0))
            if stats is None:
                print(f"compaction did not run: {report.skipped}")
            else:
                print(
                    f"compaction: {stats.batches_read} batches, {stats.bytes_read / 1e6:.1f} MB read in "
                    f"{stats.seconds:.2f} s = {stats.mb_per_sec:.2f} MB/sec; {stats.records_kept} records kept, "
                    f"{stats.records_removed} removed"
                )
            print(f"produce throughput while compacting: {busy_rate / base_rate:.0%} of the run without (goal >= 70%)")
        finally:
            broker.stop()
    map_microbench(args.keys)


if __name__ == "__main__":
    main()
