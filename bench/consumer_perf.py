"""Consumer throughput against a Kafka-protocol broker, with confluent-kafka; the arguments and the output follow
Kafka's kafka-consumer-perf-test:

    python bench/consumer_perf.py --topic perf --messages 1000000 --start-broker --produce-first 1000000

prints `start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms,
fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec` and one line of figures. The consumer joins a fresh group (so the
rebalance time is measured as Kafka's tool does) and reads from the earliest offset. `--produce-first N` fills the
topic before measuring (for a broker started by `--start-broker`); with a started broker its CPU seconds during
the consume phase are printed too. `run()` is the same measurement as a function (used by kafka_suite.py).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from datetime import datetime
from typing import Any

import perfutil


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S:%f")[:-3]


def run(
    bootstrap: str,
    topic: str,
    messages: int,
    group: str | None = None,
    timeout_s: float = 10.0,
    consumer_props: dict[str, str] | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    from confluent_kafka import Consumer, KafkaException, Message

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group or f"perf-consumer-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "fetch.max.bytes": 52_428_800,
        "max.partition.fetch.bytes": 10_485_760,
        "queued.max.messages.kbytes": 1_048_576,
        "queued.min.messages": 1_000_000,
    }
    conf.update(consumer_props or {})
    consumer = Consumer(conf)
    assigned_at: list[float] = []
    consumer.subscribe([topic], on_assign=lambda c, parts: assigned_at.append(time.time()))

    start = time.time()
    count = 0
    nbytes = 0
    last_data = time.monotonic()
    first_fetch: float | None = None
    try:
        while count < messages:
            batch = consumer.consume(num_messages=10_000, timeout=0.5)
            if not batch:
                if time.monotonic() - last_data > timeout_s:
                    break
                continue
            if first_fetch is None:
                first_fetch = time.time()
            last_data = time.monotonic()
            # map() keeps the per-record work in C; a Python loop here would be the bottleneck.
            if any(map(Message.error, batch)):
                raise KafkaException(next(m.error() for m in batch if m.error() is not None))
            nbytes += sum(map(len, batch))
            count += len(batch)
        end = time.time()
    finally:
        consumer.close()

    elapsed = max(end - start, 1e-9)
    rebalance_ms = ((assigned_at[0] if assigned_at else start) - start) * 1000.0
    fetch_s = max(elapsed - rebalance_ms / 1000.0, 1e-9)
    mb = nbytes / 1048576
    result = {
        "start": start,
        "end": end,
        "mb": mb,
        "mb_per_s": mb / elapsed,
        "messages": count,
        "messages_per_s": count / elapsed,
        "rebalance_ms": rebalance_ms,
        "fetch_ms": fetch_s * 1000.0,
        "fetch_mb_per_s": mb / fetch_s,
        "fetch_messages_per_s": count / fetch_s,
    }
    if not quiet:
        print(
            "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
            "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"
        )
        print(
            f"{_stamp(start)}, {_stamp(end)}, {mb:.4f}, {result['mb_per_s']:.4f}, {count}, "
            f"{result['messages_per_s']:.4f}, {rebalance_ms:.0f}, {fetch_s * 1000:.0f}, "
            f"{result['fetch_mb_per_s']:.4f}, {result['fetch_messages_per_s']:.4f}",
            flush=True,
        )
    if count < messages:
        print(
            f"WARNING: exiting before consuming the expected number of messages: timeout ({timeout_s:.0f} s) "
            f"exceeded; consumed {count} of {messages}",
            file=sys.stderr,
        )
    return result


def run_raw(
    bootstrap: str, topic: str, messages: int, timeout_s: float = 10.0, partition_max_bytes: int = 10 << 20
) -> dict[str, Any]:
    """The broker's own fetch capacity, without a client library's per-record cost: one connection sends Fetch v12
    for every partition of `topic`, one request in flight as a consumer keeps it, and counts records from each
    batch's header after checking its CRC (recbatch.scan_batches, compiled), never decoding a record. This is
    what the broker can serve; `run` is what confluent-kafka's Python consumer can take.

    Each answer is read into one receive buffer, sized for the largest answer and written before the clock starts,
    and decoded in place, so no answer allocates. (Answers are megabytes. Through asyncio's stream reader each would
    pass through fresh buffers of its size, and whether those come from heap the process already touched or from
    new pages faulted in one by one depends on what the process allocated before, not on the broker.)"""
    import socket

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    from mqk._fast import load
    from mqk.protocol.kafka.api import ApiKey
    from mqk.protocol.kafka.codec import decode_response_frame, encode_request

    recbatch = load("recbatch")
    perfutil.load_codecs(ApiKey.FETCH)  # the Metadata call below loads its own before the clock starts
    host, port = bootstrap.rsplit(":", 1)
    buf = bytearray(1 << 16)
    correlation_id = 0

    def call(sock: socket.socket, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        """Send one request and read its answer into `buf`; the answer's bytes fields are views of `buf`, valid
        until the next call."""
        nonlocal buf, correlation_id
        correlation_id += 1
        sock.sendall(b"".join(encode_request(api_key, version, correlation_id, "mqk-raw-consumer", body)))
        _recv_exactly(sock, memoryview(buf)[:4])
        size = int.from_bytes(buf[:4], "big")
        if size > len(buf):
            buf = bytearray(size)
        frame = memoryview(buf)[:size]
        _recv_exactly(sock, frame)
        got, answer = decode_response_frame(api_key, version, frame)
        if got != correlation_id:
            raise AssertionError(f"response to correlation id {got}, expected {correlation_id}")
        return answer

    with socket.create_connection((host, int(port)), timeout=timeout_s + 1) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        meta = call(
            sock,
            ApiKey.METADATA,
            12,
            {
                "topics": [{"topic_id": bytes(16), "name": topic}],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
            },
        )
        offsets = {p["partition_index"]: 0 for p in meta["topics"][0]["partitions"]}
        # room for the largest answer the Fetch allows (its max_bytes, or every partition's limit) and its headers,
        # written once so that its pages are in memory before the clock starts
        buf = bytearray(b"\0") * (min(perfutil.FETCH_MAX_BYTES, partition_max_bytes * len(offsets)) + (1 << 16))
        count = nbytes = 0
        start = time.time()  # from the first Fetch sent (metadata excluded) to the last answered
        last_data = time.monotonic()
        while count < messages and time.monotonic() - last_data < timeout_s:
            resp = call(sock, ApiKey.FETCH, 12, perfutil.fetch_v12(topic, offsets, 500, partition_max_bytes))
            for part in resp["responses"][0]["partitions"]:
                records = part["records"]
                if part["error_code"] or not records:
                    continue
                batches = recbatch.scan_batches(records, True)
                count += sum(b[4] for b in batches)
                nbytes += len(records)
                pos, _size, last_delta = batches[-1][:3]
                offsets[part["partition_index"]] = int.from_bytes(records[pos : pos + 8], "big") + last_delta + 1
                last_data = time.monotonic()
        end = time.time()
    elapsed = max(end - start, 1e-9)
    return {
        "messages": count,
        "mb": nbytes / 1048576,
        "messages_per_s": count / elapsed,
        "mb_per_s": nbytes / 1048576 / elapsed,
        "start": start,
        "end": end,
    }


def _recv_exactly(sock: Any, view: memoryview) -> None:
    """Fill `view` from `sock`."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            raise ConnectionError("the broker closed the connection")
        got += n


def raw_line(raw: dict[str, Any], broker_cpu_s: float | None = None) -> str:
    line = (
        f"raw fetch (wire-level consumer, CRC checked, records counted from batch headers): {raw['messages']} "
        f"records, {raw['messages_per_s']:,.0f} records/sec, {raw['mb_per_s']:.1f} MB/sec"
    )
    return line if broker_cpu_s is None else f"{line}, broker cpu {broker_cpu_s:.2f} s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topic", required=True)
    p.add_argument("--messages", type=int, required=True, help="records to consume")
    p.add_argument("--group", help="consumer group (default: a fresh one)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds without data before giving up")
    p.add_argument("--consumer-props", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--produce-first", type=int, default=0, metavar="N", help="produce N records before consuming")
    p.add_argument("--record-size", type=int, default=100, help="record size for --produce-first")
    p.add_argument(
        "--raw",
        action="store_true",
        help="also measure the broker's fetch capacity with a wire-level consumer (run_raw)",
    )
    perfutil.add_broker_args(p)
    args = p.parse_args(argv)

    broker = perfutil.Broker(args.storage, args.data_dir) if args.start_broker else None
    try:
        bootstrap = broker.bootstrap if broker else args.bootstrap
        if not bootstrap:
            p.error("give --bootstrap or --start-broker")
        if args.produce_first:
            import producer_perf

            r = producer_perf.run(
                bootstrap,
                args.topic,
                args.produce_first,
                args.record_size,
                producer_props={"acks": "1"},
                sample_every=1000,
                quiet=True,
            )
            print(f"produced {args.produce_first} records first ({r['records_per_s']:.0f} records/sec)")
        if broker:
            broker.settle()
        cpu0 = broker.cpu_seconds() if broker else 0.0
        result = run(
            bootstrap, args.topic, args.messages, args.group, args.timeout, perfutil.parse_props(args.consumer_props)
        )
        if broker:
            cpu = broker.cpu_seconds() - cpu0
            print(
                f"broker cpu: {cpu:.2f} s for {result['messages']} records, "
                f"{cpu / max(result['messages'], 1) * 1e6:.2f} s per million records",
                flush=True,
            )
        if args.raw:
            cpu0 = broker.cpu_seconds() if broker else 0.0
            raw = run_raw(bootstrap, args.topic, args.messages, args.timeout)
            print(raw_line(raw, broker.cpu_seconds() - cpu0 if broker else None), flush=True)
    finally:
        if broker:
            broker.close()
    return 0 if result["messages"] >= args.messages else 1


if __name__ == "__main__":
    sys.exit(main())
