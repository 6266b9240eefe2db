"""End-to-end latency (producer send to consumer receipt) at a fixed rate, with confluent-kafka:

    python bench/e2e_latency.py --topic e2e --rate 20000 --duration 10 --record-size 100 --start-broker

A producer sends `rate` records per second for `duration` seconds, each carrying its send time; a consumer in a
separate process (so the two do not share a GIL) reads them as they land and computes receipt - send on the
same clock. Prints `N records at R records/sec: avg A ms, p50 X ms, p95 ms, p99 Y ms, p99.9 ms, max Z ms`.
The producer uses linger.ms=0 and acks=1 unless `--producer-props` says otherwise; the consumer long-polls with
fetch.wait.max.ms=100 (`--fetch-wait-ms`) and fetch.min.bytes=1, so a record is returned as soon as it is stored.
Both consumers below read without the cyclic GC (`perfutil.no_cyclic_gc`): its full collections pause the
consumer, not the broker, and would be charged to the records waiting behind them.
`run()` is the same measurement as a function (used by kafka_suite.py).

`--raw` measures the broker's own share instead, without a client library's per-record cost: a wire-level producer
(one asyncio connection, acks=1, requests pipelined) sends every millisecond one batch holding that millisecond's
records, its first record's key carrying the send time, and a wire-level consumer in another process long-polls
Fetch and charges every record of a batch with receipt - send (`run_raw()`).
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
#: the record the consumer sends itself before the measurement, to know its fetcher is live
_READY_MARKER = b"e2e-latency: consumer ready"


def _consume(
    bootstrap: str, topic: str, expected: int, ready: Any, results: Any, timeout_s: float, fetch_wait_ms: int
) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "e2e-latency",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": fetch_wait_ms,
            "fetch.min.bytes": 1,
            "fetch.error.backoff.ms": 10,
        }
    )
    # The producer starts once this consumer's fetcher is live at the partition's end: it starts at the end
    # offset, and a marker record sent now has come back. (position() stays unset until a record is consumed,
    # so it cannot tell; a partition EOF event would, but enabling those costs an event per caught-up fetch.)
    _low, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.assign([TopicPartition(topic, 0, end)])
    marker = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    marker.produce(topic, _READY_MARKER, partition=0)
    marker.flush(10)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        m = consumer.poll(0.1)
        if m is not None and m.error() is None and m.value() == _READY_MARKER:
            break
    ready.set()
    latencies: list[float] = []
    first_ns = last_ns = 0
    last = time.monotonic()
    with perfutil.no_cyclic_gc():
        while len(latencies) < expected and time.monotonic() - last < timeout_s:
            # poll() returns as soon as one record is there (consume(n, timeout) would wait for n records or the
            # timeout, adding up to that timeout to every latency); then take what else is already buffered.
            first = consumer.poll(0.05)
            now = time.time_ns()
            batch = [first, *consumer.consume(num_messages=1000, timeout=0)] if first is not None else []
            if batch:
                last = time.monotonic()
                first_ns = first_ns or now
                last_ns = now
            for m in batch:
                if m.error() is None:
                    latencies.append((now - _TS.unpack_from(m.value())[0]) / 1e6)
    consumer.close()
    results.put((latencies, (last_ns - first_ns) / 1e9))


def run(
    bootstrap: str,
    topic: str,
    rate: float,
    duration_s: float,
    record_size: int = 100,
    producer_props: dict[str, str] | None = None,
    quiet: bool = False,
    fetch_wait_ms: int = 100,
    records: int | None = None,
) -> dict[str, Any]:
    """`rate` records/s for `duration_s`; or, with rate=inf, `records` records sent as fast as the producer can
    while the consumer reads them: the pipeline's maximum is then the lower of `rate` (sent) and
    `received_rate` (taken in by the consumer)."""
    from confluent_kafka import Producer

    total = records if rate == float("inf") else int(rate * duration_s)
    if not total:
        raise ValueError("give a finite rate, or records with rate=inf")
    ctx = mp.get_context("spawn")
    ready, results = ctx.Event(), ctx.Queue()
    consumer = ctx.Process(
        target=_consume, args=(bootstrap, topic, total, ready, results, 10.0, fetch_wait_ms), daemon=True
    )
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
        "records": total,
        "received": len(latencies),
        "rate": total / sent_s,
        # what the consumer took in per second, first to last receipt (the pipeline's rate when unpaced)
        "received_rate": len(latencies) / receive_s if receive_s > 0 else float("inf"),
        "avg_ms": sum(latencies) / len(latencies),
        "p50_ms": perfutil.percentile(latencies, 50),
        "p95_ms": perfutil.percentile(latencies, 95),
        "p99_ms": perfutil.percentile(latencies, 99),
        "p999_ms": perfutil.percentile(latencies, 99.9),
        "max_ms": latencies[-1],
    }
    if not quiet:
        print(
            f"{r['received']} of {total} records at {r['rate']:.0f} records/sec: avg {r['avg_ms']:.2f} ms, "
            f"p50 {r['p50_ms']:.2f} ms, p95 {r['p95_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
            f"p99.9 {r['p999_ms']:.2f} ms, max {r['max_ms']:.2f} ms",
            flush=True,
        )
    return r


def _raw_consume(
    bootstrap: str, topic: str, expected: int, ready: Any, results: Any, timeout_s: float, fetch_wait_ms: int
) -> None:
    import asyncio

    from mqk._fast import load
    from mqk.protocol.kafka.api import ApiKey
    from mqk.server.kafka.rawclient import RawKafkaClient

    scan = load("recbatch").scan_batches
    perfutil.load_codecs(ApiKey.FETCH)  # before `ready`: the producer's clock starts then
    host, port = bootstrap.rsplit(":", 1)

    async def consume() -> tuple[list[tuple[float, int]], float]:
        client = await RawKafkaClient.connect(host, int(port), "mqk-e2e-raw-consumer")
        offset = 0
        samples: list[tuple[float, int]] = []  # (latency ms, records it applies to)
        got = 0
        first_ns = last_ns = 0
        ready.set()
        last = time.monotonic()
        while got < expected and time.monotonic() - last < timeout_s:
            resp = await client.call(
                ApiKey.FETCH, 12, perfutil.fetch_v12(topic, {0: offset}, fetch_wait_ms), timeout=timeout_s + 1
            )
            now = time.time_ns()
            part = resp["responses"][0]["partitions"][0]
            records = part["records"]
            if part["error_code"] or not records:
                continue
            last = time.monotonic()
            first_ns = first_ns or now
            last_ns = now
            for pos, _size, last_delta, _ts, count, *_ in scan(records, True):
                samples.append(((now - _sent_ns(records, pos)) / 1e6, count))
                got += count
                offset = int.from_bytes(records[pos : pos + 8], "big") + last_delta + 1
        await client.close()
        return samples, (last_ns - first_ns) / 1e9

    with perfutil.no_cyclic_gc():
        results.put(asyncio.run(consume()))


def _varint_end(buf, pos: int) -> int:
    while buf[pos] & 0x80:
        pos += 1
    return pos + 1


def _key_pos(batch, pos: int = 0) -> int:
    """Where the key of the first record of the batch at `pos` starts (record layout: length, attributes,
    timestamp delta, offset delta, key length, key; each a varint but the attributes byte)."""
    p = _varint_end(batch, pos + 61) + 1
    p = _varint_end(batch, _varint_end(batch, p))
    return _varint_end(batch, p)


def _sent_ns(batch, pos: int) -> int:
    """The send time the wire-level producer put in the key of the batch's first record."""
    return _TS.unpack_from(batch, _key_pos(batch, pos))[0]


def run_raw(
    bootstrap: str,
    topic: str,
    rate: float,
    duration_s: float,
    record_size: int = 100,
    quiet: bool = False,
    fetch_wait_ms: int = 100,
    max_batch: int = 1000,
) -> dict[str, Any]:
    """Wire-level producer and consumer (see the module docstring). `rate` records/s for `duration_s`; with
    rate=inf the producer sends `max_batch`-record batches as fast as the broker acknowledges them (five requests
    in flight) for `duration_s`, which measures the pipeline's maximum."""
    import asyncio

    from crc32c import crc32c

    from mqk.protocol.kafka.api import ApiKey
    from mqk.server.kafka.rawclient import RawKafkaClient, make_batch

    perfutil.load_codecs(ApiKey.PRODUCE)  # now, not at the first send: the first batch already carries its send time
    unpaced = rate == float("inf")
    total = int(rate * duration_s) if not unpaced else None
    ctx = mp.get_context("spawn")
    ready, results = ctx.Event(), ctx.Queue()
    expected = total if total is not None else 1 << 62
    consumer = ctx.Process(
        target=_raw_consume, args=(bootstrap, topic, expected, ready, results, 3.0, fetch_wait_ms), daemon=True
    )
    consumer.start()
    if not ready.wait(30):
        consumer.terminate()
        raise RuntimeError("the wire-level consumer did not start within 30 s")
    value = b"x" * max(0, record_size - _TS.size)
    templates: dict[int, tuple[bytearray, int]] = {}

    def batch_of(n: int) -> bytearray:
        """An n-record batch whose first key is now (templates built once per size; CRC redone per send)."""
        if n not in templates:
            b = make_batch([value] * n, keys=[bytes(8)] * n)
            templates[n] = (b, _key_pos(b))
        b, at = templates[n]
        ts = time.time_ns()
        _TS.pack_into(b, at, ts)
        struct.pack_into(">qq", b, 27, ts // 1_000_000, ts // 1_000_000 + n - 1)  # first / max timestamp
        struct.pack_into(">I", b, 17, crc32c(memoryview(b)[21:]))
        return b

    host, port = bootstrap.rsplit(":", 1)

    async def produce() -> tuple[int, float]:
        client = await RawKafkaClient.connect(host, int(port), "mqk-e2e-raw-producer")
        window = asyncio.Semaphore(5 if unpaced else 1 << 30)  # requests in flight
        outstanding = 0
        done_sending = asyncio.Event()

        async def read_answers() -> None:  # one reader: responses come back in order on the one connection
            nonlocal outstanding
            while outstanding or not done_sending.is_set():
                if not outstanding:
                    await asyncio.sleep(0.0005)
                    continue
                _, resp = await client.receive(30)
                outstanding -= 1
                window.release()
                err = resp["responses"][0]["partition_responses"][0]["error_code"]
                if err:
                    raise RuntimeError(f"produce failed with error {err}")

        reader = asyncio.ensure_future(read_answers())
        sent = 0
        start = time.monotonic()
        tick, step, owed = 0.001, 0, 0.0
        while time.monotonic() - start < duration_s and not reader.done():
            if unpaced:
                n = max_batch
            else:
                owed += rate * tick
                n = int(owed)
                owed -= n
            if n:
                await window.acquire()
                client.send(
                    ApiKey.PRODUCE,
                    9,
                    {
                        "transactional_id": None,
                        "acks": 1,
                        "timeout_ms": 30000,
                        "topic_data": [
                            {"name": topic, "partition_data": [{"index": 0, "records": bytes(batch_of(n))}]}
                        ],
                    },
                )
                outstanding += 1
                sent += n
            if unpaced:
                await asyncio.sleep(0)
            else:
                step += 1
                ahead = start + step * tick - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
        sent_s = time.monotonic() - start
        done_sending.set()
        await reader
        await client.close()
        return sent, sent_s

    sent, sent_s = asyncio.run(produce())
    samples, receive_s = results.get(timeout=60)
    consumer.join(10)
    received = sum(c for _, c in samples)
    if not received:
        raise RuntimeError("the wire-level consumer received nothing")
    samples.sort()
    r = {
        "records": sent,
        "received": received,
        "rate": sent / sent_s,
        "received_rate": received / receive_s if receive_s > 0 else float("inf"),
        "p50_ms": _weighted(samples, received, 50),
        "p99_ms": _weighted(samples, received, 99),
        "p999_ms": _weighted(samples, received, 99.9),
        "max_ms": samples[-1][0],
        "avg_ms": sum(lat * c for lat, c in samples) / received,
    }
    if not quiet:
        print(
            f"{received} of {sent} records at {r['rate']:.0f} records/sec (wire-level): avg {r['avg_ms']:.2f} ms, "
            f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, p99.9 {r['p999_ms']:.2f} ms, "
            f"max {r['max_ms']:.2f} ms",
            flush=True,
        )
    return r


def _weighted(samples: list[tuple[float, int]], total: int, p: float) -> float:
    """Nearest-rank percentile of sorted (value, weight) pairs."""
    rank = max(1, round(p / 100.0 * total + 0.5))
    seen = 0
    for value, weight in samples:
        seen += weight
        if seen >= rank:
            return value
    return samples[-1][0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topic", required=True)
    p.add_argument("--rate", type=float, default=1000, help="records per second")
    p.add_argument("--duration", type=float, default=10, help="seconds of sending")
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--producer-props", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--fetch-wait-ms",
        type=int,
        default=100,
        help="consumer fetch.wait.max.ms: the broker's long poll must answer sooner when data lands",
    )
    p.add_argument(
        "--raw",
        action="store_true",
        help="wire-level producer and consumer: the broker's share of the latency (run_raw)",
    )
    perfutil.add_broker_args(p)
    args = p.parse_args(argv)
    broker = perfutil.Broker(args.storage, args.data_dir) if args.start_broker else None
    try:
        bootstrap = broker.bootstrap if broker else args.bootstrap
        if not bootstrap:
            p.error("give --bootstrap or --start-broker")
        perfutil.create_topic(bootstrap, args.topic, 1)
        if args.raw:
            r = run_raw(
                bootstrap, args.topic, args.rate, args.duration, args.record_size, fetch_wait_ms=args.fetch_wait_ms
            )
        else:
            r = run(
                bootstrap,
                args.topic,
                args.rate,
                args.duration,
                args.record_size,
                perfutil.parse_props(args.producer_props),
                fetch_wait_ms=args.fetch_wait_ms,
            )
    finally:
        if broker:
            broker.close()
    return 0 if r["received"] == r["records"] else 1


if __name__ == "__main__":
    sys.exit(main())
