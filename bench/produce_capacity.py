"""The broker's own ingest capacity, 1 partition against many, without a client library's per-record cost:

    python bench/produce_capacity.py --start-broker                  # 1 and 1,000 partitions, 100 B records
    python bench/produce_capacity.py --start-broker --partitions 1 10 100 1000 --batch-records 10

A Python producer over mqk's codec sends Produce v9 (acks=1) requests built once up front: each carries
`--batches-per-request` record batches of `--batch-records` records of `--record-size` bytes. With 1 partition
every batch goes to partition 0; with N partitions the batches go to the partitions in turn, one batch per
partition per request, so both runs hand the broker the same batches and differ only in how many partitions
they spread over. `--in-flight` requests are kept outstanding (librdkafka's max.in.flight is 5); every answer is
decoded and checked for errors. Prints producer-perf-test style lines plus the broker's CPU per million records,
and the ratio of each run to the 1-partition run.

`--compare-metrics N` measures what the /metrics counters cost the produce path: N rounds, each starting one broker
with the counters on and one with `--no-metrics`, in alternating order, and prints every run and the medians of
the broker's CPU per million records with and without them.

confluent-kafka spreading records round-robin over 1,000 partitions pays librdkafka's per-batch cost on ~1-record
batches (bench/kafka_suite.py shows it); this tool shows what the broker itself does with many partitions.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import perfutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mqk.protocol.kafka.api import ApiKey
from mqk.protocol.kafka.codec import decode_response_frame, encode_request
from mqk.server.kafka.rawclient import make_batch

PRODUCE_VERSION = 9
_SIZE = struct.Struct(">i")


def build_requests(topic: str, partitions: int, batch: bytes, batches_per_request: int) -> list[bytearray]:
    """Enough distinct requests to visit every partition once per cycle: request r carries the batches for
    partitions r*B .. r*B+B-1 (mod partitions); with one partition all B batches go to partition 0 together."""
    if partitions == 1:
        body = {
            "transactional_id": None,
            "acks": 1,
            "timeout_ms": 30000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch * batches_per_request}]}],
        }
        return [bytearray(b"".join(encode_request(ApiKey.PRODUCE, PRODUCE_VERSION, 0, "capacity", body)))]
    per_request = min(batches_per_request, partitions)
    count = max(1, partitions // per_request)
    requests = []
    for r in range(count):
        indexes = [(r * per_request + i) % partitions for i in range(per_request)]
        body = {
            "transactional_id": None,
            "acks": 1,
            "timeout_ms": 30000,
            "topic_data": [{"name": topic, "partition_data": [{"index": i, "records": batch} for i in indexes]}],
        }
        requests.append(bytearray(b"".join(encode_request(ApiKey.PRODUCE, PRODUCE_VERSION, 0, "capacity", body))))
    return requests


async def produce(
    bootstrap: str,
    requests: list[bytearray],
    records_per_request: int,
    total_records: int,
    in_flight: int,
    check_every: int = 1,
) -> dict[str, Any]:
    """Send the requests in turn, `in_flight` at a time, until `total_records` are answered. Every `check_every`-th
    answer is decoded whole and its error codes counted; the others are matched by correlation id only (a caller
    that asks for fewer checks verifies the records landed another way: cluster_capacity.py counts end offsets)."""
    host, port = bootstrap.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    n_requests = max(1, total_records // records_per_request)
    sent = answered = errors = 0
    latencies: list[float] = []
    sent_at: dict[int, float] = {}
    start = time.perf_counter()

    def send_next() -> None:
        nonlocal sent
        frame = requests[sent % len(requests)]
        struct.pack_into(">i", frame, 8, sent)  # correlation id, after size, api key and version
        sent_at[sent] = time.perf_counter()
        writer.write(frame)
        sent += 1

    while sent < min(in_flight, n_requests):
        send_next()
    while answered < n_requests:
        (size,) = _SIZE.unpack(await reader.readexactly(4))
        frame = await reader.readexactly(size)
        if answered % check_every == 0:
            cid, body = decode_response_frame(ApiKey.PRODUCE, PRODUCE_VERSION, frame)
            errors += sum(1 for t in body["responses"] for p in t["partition_responses"] if p["error_code"])
        else:
            (cid,) = _SIZE.unpack_from(frame)  # (a response starts with its correlation id)
        latencies.append((time.perf_counter() - sent_at.pop(cid)) * 1000)
        answered += 1
        if sent < n_requests:
            send_next()
    elapsed = time.perf_counter() - start
    writer.close()
    latencies.sort()
    records = n_requests * records_per_request
    return {
        "records": records,
        "elapsed": elapsed,
        "records_per_s": records / elapsed,
        "errors": errors,
        "avg_ms": sum(latencies) / len(latencies),
        "p50_ms": perfutil.percentile(latencies, 50),
        "p99_ms": perfutil.percentile(latencies, 99),
        "max_ms": latencies[-1],
    }


def run(
    broker: perfutil.Broker,
    partitions: int,
    records: int,
    record_size: int,
    batch_records: int,
    batches_per_request: int,
    in_flight: int,
) -> dict[str, Any]:
    topic = f"capacity-{partitions}-{uuid.uuid4().hex[:6]}"
    perfutil.create_topic(broker.bootstrap, topic, partitions)
    batch = bytes(make_batch([b"v" * record_size] * batch_records))
    requests = build_requests(topic, partitions, batch, batches_per_request)
    per_request = batch_records * (batches_per_request if partitions == 1 else min(batches_per_request, partitions))
    # a first pass over every partition creates their files; the measured pass appends to existing queues
    asyncio.run(produce(broker.bootstrap, requests, per_request, per_request * len(requests), in_flight))
    broker.settle()
    cpu0 = broker.cpu_seconds()
    r = asyncio.run(produce(broker.bootstrap, requests, per_request, records, in_flight))
    broker.settle()
    r["cpu_s_per_million"] = (broker.cpu_seconds() - cpu0) / r["records"] * 1e6
    r["mb_per_s"] = r["records_per_s"] * record_size / 1048576
    # each partition holds a file descriptor: the suite's 1,000-partition runs on one broker (kafka_suite.py) would
    # otherwise add up towards the machine's open-files limit
    perfutil.delete_topic(broker.bootstrap, topic)
    return r


def line(r: dict[str, Any], partitions: int, batch_records: int, base: dict[str, Any], base_partitions: int = 1) -> str:
    """One producer-perf-test style line, with the broker's CPU and the ratio to the `base` run."""
    return (
        f"{r['records']} records sent, {r['records_per_s']:.1f} records/sec ({r['mb_per_s']:.2f} MB/sec), "
        f"{r['avg_ms']:.2f} ms avg latency, {r['max_ms']:.2f} ms max latency, {r['p50_ms']:.0f} ms 50th, "
        f"{r['p99_ms']:.0f} ms 99th.   [{partitions} partition(s), {batch_records} records per batch; broker cpu "
        f"{r['cpu_s_per_million']:.2f} s per million records; {r['records_per_s'] / base['records_per_s']:.0%} of "
        f"{base_partitions} partition(s); errors {r['errors']}]"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--partitions", type=int, nargs="+", default=[1, 1000])
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--batch-records", type=int, default=100, help="records per batch (what linger.ms gathers)")
    p.add_argument("--batches-per-request", type=int, default=100)
    p.add_argument("--in-flight", type=int, default=5)
    p.add_argument(
        "--compare-metrics",
        type=int,
        metavar="ROUNDS",
        default=0,
        help="alternate brokers with and without --no-metrics for this many rounds and compare their CPU",
    )
    perfutil.add_broker_args(p)
    args = p.parse_args(argv)
    if not args.start_broker:
        p.error("this tool measures the broker's CPU: give --start-broker")
    if args.compare_metrics:
        return compare_metrics(args)
    results = {}
    with perfutil.Broker(args.storage, args.data_dir) as broker:
        for n in args.partitions:
            r = results[n] = run(
                broker, n, args.records, args.record_size, args.batch_records, args.batches_per_request, args.in_flight
            )
            print(line(r, n, args.batch_records, results[args.partitions[0]], args.partitions[0]), flush=True)
    return 0 if all(r["errors"] == 0 for r in results.values()) else 1


def compare_metrics(args: argparse.Namespace) -> int:
    """Rounds of (counters on, counters off) brokers, the order alternating, every partition count in each."""
    cpu: dict[tuple[bool, int], list[float]] = {}
    errors = 0
    for round_no in range(args.compare_metrics):
        order = (True, False) if round_no % 2 == 0 else (False, True)
        for metrics in order:
            extra = () if metrics else ("--no-metrics",)
            with perfutil.Broker(args.storage, args.data_dir, extra_args=extra) as broker:
                base = None
                for n in args.partitions:
                    r = run(
                        broker,
                        n,
                        args.records,
                        args.record_size,
                        args.batch_records,
                        args.batches_per_request,
                        args.in_flight,
                    )
                    base = base or r
                    errors += r["errors"]
                    cpu.setdefault((metrics, n), []).append(r["cpu_s_per_million"])
                    label = "metrics on " if metrics else "metrics off"
                    print(f"round {round_no + 1} {label}: " + line(r, n, args.batch_records, base), flush=True)
    for n in args.partitions:
        on = statistics.median(cpu[(True, n)])
        off = statistics.median(cpu[(False, n)])
        print(
            f"{n} partition(s), {args.batch_records} records per batch: broker cpu per million records, median of "
            f"{args.compare_metrics}: {on:.3f} s with metrics, {off:.3f} s without ({(on - off) / off:+.1%})",
            flush=True,
        )
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
