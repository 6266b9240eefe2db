"""`mqk perf produce|consume`: measure a running broker the way Kafka's perf-test tools do, and say so in their words.

- `perf produce`: `--num-records` records of `--record-size` bytes, `--batch-size` records per record batch, one
  batch per Produce request to the topic's partitions in turn, `--in-flight` requests outstanding, optionally
  throttled to `--throughput` records/s. Every 5 s and at the end it prints kafka-producer-perf-test's lines:
  `N records sent, X records/sec (Y MB/sec), A ms avg latency, B ms max latency` (the last with the 50th, 95th,
  99th and 99.9th percentiles). A record's latency is its request's (send to answer).
- `perf consume`: fetches every partition of the topic from its start until `--messages` records arrived (or
  nothing came for `--timeout` s) and prints kafka-consumer-perf-test's header and CSV line (start and end time,
  MB and records consumed and their rates). MB counts record-batch bytes; records are counted from the batch
  headers, nothing is decompressed.

Both speak Kafka through mqk's own codec (`RawKafkaClient`) and show a progress bar on stderr when it is a terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import struct
import sys
import time
from typing import Any

from mqk.cli_admin import CommandError, _check, _kafka, list_offsets, run_command, with_kafka_connection
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import make_batch

REPORT_INTERVAL_S = 5.0
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


def _percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values) - 1, max(0, round(p / 100.0 * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


def _progress(total: int, unit: str) -> Any:
    # (tqdm is loaded by the perf verbs only)
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, unit_scale=True, file=sys.stderr, disable=None, dynamic_ncols=True)


async def _partitions(client: Any, topic: str, create: bool) -> int:
    meta = await client.call(ApiKey.METADATA, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": create})
    entry = meta["topics"][0]
    _check(entry["error_code"], f"topic {topic}")
    if not entry["partitions"]:
        raise CommandError(f"topic {topic} has no partitions yet")
    return len(entry["partitions"])


async def perf_produce(args: argparse.Namespace) -> None:
    if args.num_records < 1 or args.record_size < 0 or args.batch_size < 1 or args.in_flight < 1:
        raise CommandError("--num-records, --batch-size and --in-flight must be at least 1")
    async with await _kafka(args) as client:
        partitions = await _partitions(client, args.topic, True)
        per_batch = args.batch_size
        batch = bytes(make_batch([b"x" * args.record_size] * per_batch))
        bodies = [
            {
                "transactional_id": None,
                "acks": args.acks,
                "timeout_ms": 30000,
                "topic_data": [{"name": args.topic, "partition_data": [{"index": p, "records": batch}]}],
            }
            for p in range(partitions)
        ]
        requests = -(-args.num_records // per_batch)
        latencies: list[float] = []
        window = _Window()
        sent_at: list[float] = []
        sent = answered = 0
        start = time.perf_counter()
        with _progress(requests * per_batch, "rec") as bar:
            while answered < requests:
                while sent < requests and sent - answered < args.in_flight:
                    if args.throughput > 0:
                        due = start + sent * per_batch / args.throughput
                        delay = due - time.perf_counter()
                        if delay > 0 and sent > answered:
                            break  # answers first; the next send is not due yet
                        if delay > 0:
                            await asyncio.sleep(delay)
                    client.send(ApiKey.PRODUCE, 9, bodies[sent % partitions], expect_response=args.acks != 0)
                    sent_at.append(time.perf_counter())
                    sent += 1
                await client.writer.drain()
                if args.acks == 0:
                    latencies += [0.0] * (sent - answered)
                    bar.update((sent - answered) * per_batch)
                    answered = sent
                    continue
                _cid, body = await client.receive(60)
                for t in body["responses"]:
                    for p in t["partition_responses"]:
                        _check(p["error_code"], f"produce to {args.topic}[{p['index']}]", p.get("error_message"))
                now = time.perf_counter()
                latency_ms = (now - sent_at[answered]) * 1000
                answered += 1
                latencies.append(latency_ms)
                bar.update(per_batch)
                line = window.add(now, per_batch, per_batch * args.record_size, latency_ms)
                if line:
                    bar.write(line, file=sys.stdout)
        elapsed = time.perf_counter() - start
    records = requests * per_batch
    latencies.sort()
    rate = records / elapsed if elapsed > 0 else 0.0
    print(
        f"{records} records sent, {rate:.1f} records/sec ({rate * args.record_size / 1048576:.2f} MB/sec), "
        f"{sum(latencies) / len(latencies):.2f} ms avg latency, {latencies[-1]:.2f} ms max latency, "
        f"{_percentile(latencies, 50):.0f} ms 50th, {_percentile(latencies, 95):.0f} ms 95th, "
        f"{_percentile(latencies, 99):.0f} ms 99th, {_percentile(latencies, 99.9):.0f} ms 99.9th.",
        flush=True,
    )


class _Window:
    """kafka-producer-perf-test's periodic line over the last REPORT_INTERVAL_S."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start the next window now."""
        self.start = time.perf_counter()
        self.records = 0
        self.nbytes = 0
        self.latency_sum = 0.0
        self.latency_max = 0.0
        self.answers = 0

    def add(self, now: float, records: int, nbytes: int, latency_ms: float) -> str | None:
        self.records += records
        self.nbytes += nbytes
        self.latency_sum += latency_ms
        self.latency_max = max(self.latency_max, latency_ms)
        self.answers += 1
        elapsed = now - self.start
        if elapsed < REPORT_INTERVAL_S:
            return None
        line = (
            f"{self.records} records sent, {self.records / elapsed:.1f} records/sec "
            f"({self.nbytes / elapsed / 1048576:.2f} MB/sec), {self.latency_sum / self.answers:.1f} ms avg latency, "
            f"{self.latency_max:.1f} ms max latency."
        )
        self.reset()
        return line


async def perf_consume(args: argparse.Namespace) -> None:
    if args.messages < 1:
        raise CommandError("--messages must be at least 1")
    records = nbytes = 0
    async with await _kafka(args) as client:
        partitions = await _partitions(client, args.topic, False)
        offsets = await list_offsets(client, args.topic, list(range(partitions)), -2)
        start_wall = time.time()
        start = time.perf_counter()
        last_data = start
        with _progress(args.messages, "rec") as bar:
            while records < args.messages and time.perf_counter() - last_data < args.timeout:
                resp = await client.call(ApiKey.FETCH, 12, _fetch_body(args.topic, offsets), timeout=60)
                got = 0
                for topic in resp["responses"]:
                    for p in topic["partitions"]:
                        _check(p["error_code"], f"fetch {args.topic}[{p['partition_index']}]")
                        data = p["records"]
                        buffers = data if isinstance(data, list) else [data] if data else []
                        for buf in buffers:
                            n, size, next_offset = _count_batches(buf)
                            got += n
                            nbytes += size
                            if next_offset > offsets[p["partition_index"]]:
                                offsets[p["partition_index"]] = next_offset
                if got:
                    records += got
                    bar.update(got)
                    last_data = time.perf_counter()
        end = time.perf_counter()
        end_wall = start_wall + (end - start)
    elapsed = max(end - start, 1e-9)
    mb = nbytes / 1048576
    print(
        "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, "
        "fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"
    )
    print(
        f"{_kafka_time(start_wall)}, {_kafka_time(end_wall)}, {mb:.4f}, {mb / elapsed:.4f}, {records}, "
        f"{records / elapsed:.4f}, 0, {elapsed * 1000:.0f}, {mb / elapsed:.4f}, {records / elapsed:.4f}",
        flush=True,
    )


def _fetch_body(topic: str, offsets: dict[int, int]) -> dict[str, Any]:
    return {
        "replica_id": -1,
        "max_wait_ms": 500,
        "min_bytes": 1,
        "max_bytes": 50 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {"partition": p, "fetch_offset": o, "partition_max_bytes": 10 << 20} for p, o in offsets.items()
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


def _count_batches(buf: Any) -> tuple[int, int, int]:
    """(records, bytes, offset after the last whole batch) of the whole record batches v2 in `buf`."""
    view = memoryview(buf)
    pos = records = 0
    next_offset = -1
    while pos + 61 <= len(view):
        (length,) = _I32.unpack_from(view, pos + 8)
        end = pos + 12 + length
        if end > len(view):
            break  # a partial batch at the end of a fetch
        (base,) = _I64.unpack_from(view, pos)
        (last_delta,) = _I32.unpack_from(view, pos + 23)
        (count,) = _I32.unpack_from(view, pos + 57)
        records += count
        next_offset = base + last_delta + 1
        pos = end
    return records, pos, next_offset


def _kafka_time(epoch_s: float) -> str:
    """kafka-consumer-perf-test's date format (yyyy-MM-dd HH:mm:ss:SSS)."""
    moment = datetime.datetime.fromtimestamp(epoch_s)
    return moment.strftime("%Y-%m-%d %H:%M:%S:") + f"{moment.microsecond // 1000:03d}"


def register(sub: argparse._SubParsersAction) -> None:
    """Add `mqk perf produce|consume` to the `mqk` parser."""
    perf = sub.add_parser("perf", help="measure a broker as Kafka's perf-test tools do")
    psub = perf.add_subparsers(dest="action", required=True)
    p = with_kafka_connection(psub.add_parser("produce", help="send records and print producer-perf-test lines"))
    p.add_argument("--topic", required=True)
    p.add_argument("--num-records", type=int, required=True)
    p.add_argument("--record-size", type=int, default=100, help="bytes per record value (default 100)")
    p.add_argument("--batch-size", type=int, default=100, help="records per record batch (default 100)")
    p.add_argument("--throughput", type=float, default=-1, help="records/s at most (default -1: no limit)")
    p.add_argument("--acks", type=int, choices=(-1, 0, 1), default=-1)
    p.add_argument("--in-flight", type=int, default=5, help="requests outstanding (default 5)")
    p.set_defaults(run=perf_produce)
    p = with_kafka_connection(psub.add_parser("consume", help="fetch records and print consumer-perf-test lines"))
    p.add_argument("--topic", required=True)
    p.add_argument("--messages", type=int, required=True, help="stop after this many records")
    p.add_argument("--timeout", type=float, default=10.0, help="stop when nothing came for this many seconds")
    p.set_defaults(run=perf_consume)
    perf.set_defaults(func=run_command)


__all__ = ["perf_consume", "perf_produce", "register"]
