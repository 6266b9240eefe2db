"""End-to-end latency (producer send to consumer receipt) at a fixed rate, with confluent-kafka:

    python bench/e2e_latency.py --topic e2e --rate 20000 --duration 10 --record-size 100 --start-broker

A producer sends `rate` records per second for `duration` seconds, each carrying its send time; a consumer in a
separate process (so the two do not share a GIL) reads them as they land and computes receipt - send on the
same clock. Prints `N records at R records/sec: avg A ms, p50 X ms, p95 ms, p99 Y ms, p99.9 ms, max Z ms`.
The producer uses linger.ms=0 and acks=1 unless `--producer-props` says otherwise; the consumer long-polls with
fetch.wait.max.ms=100 (`--fetch-wait-ms`) and fetch.min.bytes=1, so a record is returned as soon as it is stored.
`run()` is the same measurement as a function (used by kafka_suite.py).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import struct
import sys
import time
from typing import Any

import perfutil

_TS = struct.Struct(">q")


def _consume(bootstrap: str, topic: str, expected: int, ready: Any, results: Any, timeout_s: float,
             fetch_wait_ms: int) -> None:
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "e2e-latency", "enable.auto.commit": False,
        "fetch.wait.max.ms": fetch_wait_ms, "fetch.min.bytes": 1, "fetch.error.backoff.ms": 10,
    })
    consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
    # Poll until the assignment is live (position resolved) before telling the producer to start.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        consumer.consume(num_messages=1, timeout=0.1)
        pos = consumer.position([TopicPartition(topic, 0)])[0].offset
        if pos >= 0:
            break
    ready.set()
    latencies: list[float] = []
    first_ns = last_ns = 0
    last = time.monotonic()
    while len(latencies) < expected and time.monotonic() - last < timeout_s:
        # poll() returns as soon as one record is there (consume(n, timeout) would wait for n records or the
        # timeout, adding up to that timeout to every latency); then take what else is already buffered.
        first = consumer.poll(0.05)
        now = time.time_ns()
        batch = [first] + consumer.consume(num_messages=1000, timeout=0) if first is not None else []
        if batch:
            last = time.monotonic()
            first_ns = first_ns or now
            last_ns = now
        for m in batch:
            if m.error() is None:
                latencies.append((now - _TS.unpack_from(m.value())[0]) / 1e6)
    consumer.close()
    results.put((latencies, (last_ns - first_ns) / 1e9))


def run(bootstrap: str, topic: str, rate: float, duration_s: float, record_size: int = 100,
        producer_props: dict[str, str] | None = None, quiet: bool = False, fetch_wait_ms: int = 100,
        records: int | None = None) -> dict[str, Any]:
    """`rate` records/s for `duration_s`; or, with rate=inf, `records` records sent as fast as the producer can
    while the consumer reads them: the pipeline's maximum is then the lower of `rate` (sent) and
    `received_rate` (taken in by the consumer)."""
    from confluent_kafka import Producer

    total = records if rate == float("inf") else int(rate * duration_s)
    if not total:
        raise ValueError("give a finite rate, or records with rate=inf")
    ctx = mp.get_context("spawn")
    ready, results = ctx.Event(), ctx.Queue()
    consumer = ctx.Process(target=_consume, args=(bootstrap, topic, total, ready, results, 10.0, fetch_wait_ms),
                           daemon=True)
    consumer.start()
    if not ready.wait(30):
        consumer.terminate()
        raise RuntimeError("the consumer did not get its assignment within 30 s")

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "1"}
    conf.update(producer_props or {})
    producer = Producer(conf)
    pad = b"x" * max(0, record_size - _TS.size)
    start = time.monotonic()
    for i in range(total):
        ahead = start + i / rate - time.monotonic()
        if ahead > 0.0005:
            time.sleep(ahead)
        producer.produce(topic, _TS.pack(time.time_ns()) + pad, partition=0)
        producer.poll(0)
    producer.flush(30)
    sent_s = time.monotonic() - start
    latencies, receive_s = results.get(timeout=60)
    latencies.sort()
    consumer.join(10)
    if not latencies:
        raise RuntimeError("the consumer received nothing")
    r = {
        "records": total, "received": len(latencies), "rate": total / sent_s,
        # what the consumer took in per second, first to last receipt (the pipeline's rate when unpaced)
        "received_rate": len(latencies) / receive_s if receive_s > 0 else float("inf"),
        "avg_ms": sum(latencies) / len(latencies),
        "p50_ms": perfutil.percentile(latencies, 50), "p95_ms": perfutil.percentile(latencies, 95),
        "p99_ms": perfutil.percentile(latencies, 99), "p999_ms": perfutil.percentile(latencies, 99.9),
        "max_ms": latencies[-1],
    }
    if not quiet:
        print(f"{r['received']} of {total} records at {r['rate']:.0f} records/sec: avg {r['avg_ms']:.2f} ms, "
              f"p50 {r['p50_ms']:.2f} ms, p95 {r['p95_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
              f"p99.9 {r['p999_ms']:.2f} ms, max {r['max_ms']:.2f} ms", flush=True)
    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topic", required=True)
    p.add_argument("--rate", type=float, default=1000, help="records per second")
    p.add_argument("--duration", type=float, default=10, help="seconds of sending")
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--producer-props", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--fetch-wait-ms", type=int, default=100,
                   help="consumer fetch.wait.max.ms: the broker's long poll must answer sooner when data lands")
    perfutil.add_broker_args(p)
    args = p.parse_args(argv)
    broker = perfutil.Broker(args.storage, args.data_dir) if args.start_broker else None
    try:
        bootstrap = broker.bootstrap if broker else args.bootstrap
        if not bootstrap:
            p.error("give --bootstrap or --start-broker")
        perfutil.create_topic(bootstrap, args.topic, 1)
        r = run(bootstrap, args.topic, args.rate, args.duration, args.record_size,
                perfutil.parse_props(args.producer_props), fetch_wait_ms=args.fetch_wait_ms)
    finally:
        if broker:
            broker.close()
    return 0 if r["received"] == r["records"] else 1


if __name__ == "__main__":
    sys.exit(main())
