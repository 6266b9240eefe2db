"""What Kafka transactions cost, measured with confluent-kafka against one broker, everything in the same run:

    python bench/txn_perf.py --num-records 300000 --rounds 3

- produce: 100 B records from an idempotent producer (acks=all, not transactional) beside a transactional one that
  commits every 1,000 and every 10,000 records (the goal: at least 70 % of the idempotent throughput at 10,000
  records per transaction). The order of the three alternates from round to round. Each phase prints Kafka's
  perf-test line and the broker's CPU seconds per million records.
- consume: one log written by a transactional producer, transactions of 1,000 records, every tenth aborted (10 %
  of the records), read to its end by a read_uncommitted and a read_committed consumer (the goal: read_committed
  at least 80 % of read_uncommitted's speed). Speeds are log offsets covered per second (both read the same log to
  the same end; read_committed hands the application 10 % fewer records).

The client runs beside the broker on the same cores, so figures move from run to run: compare the phases of one
run, not runs. `--start-broker` is implied (a file-store broker in a temporary directory).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from typing import Any

import perfutil
import producer_perf

RECORD_SIZE = 100
#: the produce phases: name, records per transaction (None: idempotent, not transactional)
MODES: list[tuple[str, int | None]] = [
    ("idempotent", None),
    ("transactional, 1,000 per commit", 1000),
    ("transactional, 10,000 per commit", 10000),
]


def send(producer: Any, topic: str, payload: bytes, partition: int = 0) -> None:
    """One record to `partition`; a full local queue is served (delivery reports) until it takes it."""
    while True:
        try:
            producer.produce(topic, payload, partition=partition)
            return
        except BufferError:
            producer.poll(0.005)


def make_producer(bootstrap: str, transactional_id: str | None) -> Any:
    """An idempotent producer (acks=all), transactional with `transactional_id` (initialised) unless None."""
    from confluent_kafka import Producer

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 2_000_000,
        "enable.idempotence": True,
        "acks": "all",
    }
    if transactional_id is not None:
        conf["transactional.id"] = transactional_id
    producer = Producer(conf)
    if transactional_id is not None:
        producer.init_transactions(30)
    return producer


def produce(bootstrap: str, topic: str, n: int, per_txn: int | None, partitions: int = 1) -> dict[str, Any]:
    """`n` records (round-robin over `partitions`), idempotent (per_txn None) or in transactions of `per_txn`
    records."""
    producer = make_producer(bootstrap, None if per_txn is None else f"perf-{uuid.uuid4().hex[:8]}")
    payload = producer_perf.make_payload(RECORD_SIZE)
    start = time.monotonic()
    for i in range(n):
        if per_txn is not None and i % per_txn == 0:
            producer.begin_transaction()
        send(producer, topic, payload, i % partitions)
        if per_txn is not None and (i + 1) % per_txn == 0:
            producer.commit_transaction(60)
    if per_txn is not None and n % per_txn:
        producer.commit_transaction(60)
    left = producer.flush(60)
    elapsed = time.monotonic() - start
    if left:
        raise RuntimeError(f"{left} records not delivered")
    return {"records": n, "elapsed_s": elapsed, "records_per_s": n / elapsed}


def write_aborted_log(bootstrap: str, topic: str, n: int, per_txn: int = 1000, abort_every: int = 10) -> int:
    """A log of transactions of `per_txn` records, every `abort_every`-th aborted; returns the records committed."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "transactional.id": f"perf-log-{uuid.uuid4().hex[:8]}",
        }
    )
    payload = producer_perf.make_payload(RECORD_SIZE)
    producer.init_transactions(30)
    committed = 0
    for t in range(n // per_txn):
        producer.begin_transaction()
        for _ in range(per_txn):
            send(producer, topic, payload)
        if t % abort_every == abort_every - 1:
            producer.flush(60)  # (abort_transaction drops what is not sent yet: these are written, then aborted)
            producer.abort_transaction(60)
        else:
            producer.commit_transaction(60)
            committed += per_txn
    return committed


def consume(bootstrap: str, topic: str, isolation: str, end: int) -> dict[str, Any]:
    """Read partition 0 from the start until the consumer's position reaches `end`."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"perf-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "fetch.max.bytes": 50 * 1048576,
            "max.partition.fetch.bytes": 10 * 1048576,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    records = 0
    start = time.monotonic()
    deadline = start + 300
    try:
        while time.monotonic() < deadline:
            batch = consumer.consume(10000, 0.5)
            records += sum(1 for m in batch if m.error() is None)
            if consumer.position([TopicPartition(topic, 0)])[0].offset >= end:
                break
        elapsed = time.monotonic() - start
    finally:
        consumer.close()
    return {"records": records, "elapsed_s": elapsed, "offsets_per_s": end / elapsed}


def produce_line(name: str, r: dict[str, Any], cpu_s: float) -> str:
    n = r["records"]
    return (
        f"{name}: {n} records sent, {r['records_per_s']:.1f} records/sec "
        f"({r['records_per_s'] * RECORD_SIZE / 1048576:.2f} MB/sec); broker cpu {cpu_s:.2f} s, "
        f"{cpu_s / n * 1e6:.2f} s per million records"
    )


def print_produce_medians(rates: dict[str, list[float]]) -> None:
    base = statistics.median(rates["idempotent"])
    print("medians:")
    for name, _ in MODES:
        m = statistics.median(rates[name])
        print(f"  {name}: {m:.1f} records/sec ({m / base * 100:.0f} % of idempotent)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-records", type=int, default=300_000)
    parser.add_argument("--consume-records", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storage", default="file", choices=("file", "memory", "rocksdb"))
    args = parser.parse_args(argv)

    modes = MODES
    rates: dict[str, list[float]] = {name: [] for name, _ in modes}
    consumed: dict[str, list[float]] = {"read_uncommitted": [], "read_committed": []}
    with perfutil.Broker(storage=args.storage) as broker:
        # warm-up (not counted): the broker's first connections and codecs, the client library's start
        warm = f"txn-warm-{uuid.uuid4().hex[:8]}"
        perfutil.create_topic(broker.bootstrap, warm, 1)
        produce(broker.bootstrap, warm, 20_000, None)
        produce(broker.bootstrap, warm, 20_000, 1000)
        for rnd in range(args.rounds):
            order = modes if rnd % 2 == 0 else list(reversed(modes))
            for name, per_txn in order:
                topic = f"txn-perf-{uuid.uuid4().hex[:8]}"
                perfutil.create_topic(broker.bootstrap, topic, 1)
                broker.settle()
                c0 = broker.cpu_seconds()
                r = produce(broker.bootstrap, topic, args.num_records, per_txn)
                print(produce_line(name, r, broker.cpu_seconds() - c0), flush=True)
                rates[name].append(r["records_per_s"])
                perfutil.delete_topic(broker.bootstrap, topic)
        topic = f"txn-log-{uuid.uuid4().hex[:8]}"
        perfutil.create_topic(broker.bootstrap, topic, 1)
        committed = write_aborted_log(broker.bootstrap, topic, args.consume_records)
        end = perfutil.end_offsets(broker.bootstrap, topic, 1)[0]
        print(f"log: {end} offsets, {committed} committed records, 10 % of the records aborted", flush=True)
        for rnd in range(args.rounds):
            isolations = ["read_uncommitted", "read_committed"]
            for isolation in isolations if rnd % 2 == 0 else reversed(isolations):
                broker.settle()
                c0 = broker.cpu_seconds()
                r = consume(broker.bootstrap, topic, isolation, end)
                cpu = broker.cpu_seconds() - c0
                print(
                    f"{isolation}: {r['records']} records consumed, {r['offsets_per_s']:.1f} offsets/sec "
                    f"({r['offsets_per_s'] * RECORD_SIZE / 1048576:.2f} MB/sec of log) in {r['elapsed_s']:.2f} s; "
                    f"broker cpu {cpu:.2f} s",
                    flush=True,
                )
                consumed[isolation].append(r["offsets_per_s"])
    print_produce_medians(rates)
    uncommitted = statistics.median(consumed["read_uncommitted"])
    committed_rate = statistics.median(consumed["read_committed"])
    print(f"  read_uncommitted: {uncommitted:.1f} offsets/sec")
    share = committed_rate / uncommitted * 100
    print(f"  read_committed: {committed_rate:.1f} offsets/sec ({share:.0f} % of read_uncommitted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
