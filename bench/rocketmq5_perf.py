"""Throughput of the RocketMQ 5 gRPC front door (`--grpc-listen`) with the official RocketMQ 5 Python SDK
(`rocketmq-python-client`), against a broker this tool starts:

    python bench/rocketmq5_perf.py --messages 20000 --size 100 --concurrency 64

Three lines, Kafka perf-test style, each with the broker's CPU seconds for the phase:
- `send`: `send_async` with at most `--concurrency` sends in flight; records/s, MB/s, p50/p99 ms per send.
- `receive+ack`: a SimpleConsumer receiving batches of 32 and acknowledging each message (from `--concurrency`
  threads) until every message sent was received once.
- `send-sync`: `--sync-messages` sends one after another (the latency of one send, end to end).

The SDK runs its gRPC calls on one event-loop thread of its own and converts every message in Python, so on a
small machine the client, not the broker, sets these figures: compare the broker CPU per record with the remoting
and Kafka lines (bench/native_perf.py, bench/kafka_suite.py), not the rates.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

import perfutil


def _line(name: str, count: int, elapsed: float, size: int, cpu: float, extra: str = "") -> str:
    rate = count / max(elapsed, 1e-9)
    return (
        f"{name}: {count} records in {elapsed:.2f} s, {rate:.1f} records/sec ({rate * size / 1048576:.2f} MB/sec)"
        f"{extra}, broker cpu {cpu:.2f} s ({cpu / max(count, 1) * 1e6:.1f} us/record)"
    )


def _send(endpoint: str, topic: str, count: int, size: int, concurrency: int) -> tuple[float, list[float]]:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    producer = Producer(ClientConfiguration(endpoint, Credentials()), (topic,))
    producer.startup()
    slots = threading.Semaphore(concurrency)
    latencies: list[float] = []
    failures: list[BaseException] = []
    done = threading.Event()
    left = [count]
    lock = threading.Lock()
    try:
        started = time.perf_counter()
        for _ in range(count):
            slots.acquire()
            msg = Message()
            msg.topic = topic
            msg.body = b"r" * size
            t0 = time.perf_counter()

            def finished(future: Future, t0: float = t0) -> None:
                error = future.exception()
                with lock:
                    if error is not None:
                        failures.append(error)
                    latencies.append((time.perf_counter() - t0) * 1000)
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()
                slots.release()

            producer.send_async(msg).add_done_callback(finished)
        assert done.wait(300), "sends did not finish"
        elapsed = time.perf_counter() - started
    finally:
        producer.shutdown()
    if failures:
        raise SystemExit(f"{len(failures)} sends failed, e.g. {failures[0]!r}")
    return elapsed, sorted(latencies)


def _send_sync(endpoint: str, topic: str, count: int, size: int) -> tuple[float, list[float]]:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    producer = Producer(ClientConfiguration(endpoint, Credentials()), (topic,))
    producer.startup()
    latencies = []
    try:
        started = time.perf_counter()
        for _ in range(count):
            msg = Message()
            msg.topic = topic
            msg.body = b"s" * size
            t0 = time.perf_counter()
            producer.send(msg)
            latencies.append((time.perf_counter() - t0) * 1000)
        elapsed = time.perf_counter() - started
    finally:
        producer.shutdown()
    return elapsed, sorted(latencies)


def _receive(endpoint: str, topic: str, count: int, concurrency: int) -> tuple[float, int]:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(
        ClientConfiguration(endpoint, Credentials()), f"bench-{uuid.uuid4().hex[:8]}", {topic: FilterExpression()}, 2
    )
    consumer.startup()
    seen: set[str] = set()
    # (acknowledged from a pool of threads: the SDK's ack_async returns no future to wait on)
    pool = ThreadPoolExecutor(concurrency)
    try:
        started = time.perf_counter()
        deadline = time.monotonic() + 300
        acks = []
        while len(seen) < count:
            assert time.monotonic() < deadline, f"received {len(seen)} of {count}"
            for msg in consumer.receive(32, 60):
                seen.add(msg.message_id)
                acks.append(pool.submit(consumer.ack, msg))
        for ack in acks:  # every acknowledgement answered
            ack.result(60)
        elapsed = time.perf_counter() - started
    finally:
        pool.shutdown()
        consumer.shutdown()
    return elapsed, len(seen)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--sync-messages", type=int, default=2_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--storage", default="file", choices=("file", "memory", "rocksdb"))
    args = p.parse_args()
    with perfutil.Broker(args.storage, extra_args=("--grpc-listen", "127.0.0.1:0")) as broker:
        address = broker.process.grpc_address
        assert address is not None, "the broker printed no grpc= address"
        endpoint = f"{address[0]}:{address[1]}"
        topic = f"r5-{uuid.uuid4().hex[:8]}"

        broker.settle()
        cpu0 = broker.cpu_seconds()
        elapsed, lat = _send(endpoint, topic, args.messages, args.size, args.concurrency)
        cpu = broker.cpu_seconds() - cpu0
        extra = f", p50 {perfutil.percentile(lat, 50):.2f} ms, p99 {perfutil.percentile(lat, 99):.2f} ms"
        print(_line("send", args.messages, elapsed, args.size, cpu, extra + f" (concurrency {args.concurrency})"))

        broker.settle()
        cpu0 = broker.cpu_seconds()
        elapsed, got = _receive(endpoint, topic, args.messages, args.concurrency)
        cpu = broker.cpu_seconds() - cpu0
        print(_line("receive+ack", got, elapsed, args.size, cpu, " (batches of 32)"))

        broker.settle()
        cpu0 = broker.cpu_seconds()
        elapsed, lat = _send_sync(endpoint, f"{topic}-sync", args.sync_messages, args.size)
        cpu = broker.cpu_seconds() - cpu0
        extra = f", p50 {perfutil.percentile(lat, 50):.2f} ms, p99 {perfutil.percentile(lat, 99):.2f} ms"
        print(_line("send-sync", args.sync_messages, elapsed, args.size, cpu, extra))


if __name__ == "__main__":
    main()
