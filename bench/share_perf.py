"""Share groups (KIP-932) against a classic consumer group on the same topic, with confluent-kafka, and how soon a
record whose lock ran out is delivered again:

    python bench/share_perf.py --num-records 300000 --members 3

Lines, Kafka perf-test style, each with the broker's CPU seconds for the phase:
- `classic`: `--members` classic consumers (one group, auto commit) read every record of a `--partitions`
  topic of 100 B records; records/s over the whole run, and, as kafka-consumer-perf-test splits its rebalance time
  from its fetch time, the time until the group's first record (its join) and the rate from then on.
- `share`: `--members` ShareConsumers (one share group, implicit acknowledgement: every record a poll returned is
  accepted with the next poll) read every record of the same topic; the same figures, and the ratios to `classic`
  (whole run, and from the first record on: the steady one, since a group's join takes anything from a few ms to
  seconds and is most of a run of this size).
- `redelivery`: a member acquires `--redeliver` records and never acknowledges them; another member of the group
  receives them again once their lock (the group's `share.record.lock.duration.ms`, set to `--lock-ms` with the
  admin client) has run out. Per record: the time from its lock's end (the first member's receipt + lock) to its
  second delivery; p50 / p99 / max. The first member's receipt follows the broker's acquisition, so these figures
  run a little short by the fetch's return trip.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from collections.abc import Callable

import perfutil
from confluent_kafka import Consumer, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType


def _produce(bootstrap: str, topic: str, count: int, size: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 10000})
    value = b"v" * size
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def _set_group(bootstrap: str, group: str, **settings: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in settings.items()]
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    admin.incremental_alter_configs([resource])[resource].result(timeout=15)


def _run_members(
    count: int, members: int, read: Callable[[threading.Event, list[int], int], None]
) -> tuple[float, float]:
    """Run `members` threads of `read(stop, counts, index)` until they have read `count` records: (elapsed s, s
    until the first record was read, to 10 ms)."""
    stop = threading.Event()
    counts = [0] * members
    threads = [threading.Thread(target=read, args=(stop, counts, i)) for i in range(members)]
    started = time.perf_counter()
    first = None
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while (read_so_far := sum(counts)) < count:
        assert time.monotonic() < deadline, f"read {read_so_far} of {count}"
        if first is None and read_so_far:
            first = time.perf_counter() - started
        time.sleep(0.01)
    elapsed = time.perf_counter() - started
    stop.set()
    for t in threads:
        t.join(60)
    return elapsed, elapsed if first is None else first


def _classic(bootstrap: str, topic: str, count: int, members: int) -> tuple[float, float]:
    group = f"classic-{uuid.uuid4().hex[:8]}"

    def read(stop: threading.Event, counts: list[int], index: int) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 50,
            }
        )
        consumer.subscribe([topic])
        try:
            while not stop.is_set():
                for msg in consumer.consume(1000, 0.1):
                    if not msg.error():
                        counts[index] += 1
        finally:
            consumer.close()

    return _run_members(count, members, read)


def _share(bootstrap: str, topic: str, count: int, members: int) -> tuple[float, float]:
    group = f"share-{uuid.uuid4().hex[:8]}"
    _set_group(bootstrap, group, **{"share.auto.offset.reset": "earliest"})

    def read(stop: threading.Event, counts: list[int], index: int) -> None:
        consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
        consumer.subscribe([topic])
        try:
            while not stop.is_set():
                for msg in consumer.poll(0.1) or []:
                    if not msg.error():
                        counts[index] += 1
            consumer.commit_sync()
        finally:
            consumer.close()

    return _run_members(count, members, read)


def _redelivery(bootstrap: str, topic: str, records: int, lock_ms: int) -> list[float]:
    group = f"redeliver-{uuid.uuid4().hex[:8]}"
    _set_group(
        bootstrap, group, **{"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": str(lock_ms)}
    )
    holder = ShareConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit"}
    )
    holder.subscribe([topic])
    held: dict[tuple[int, int], float] = {}
    deadline = time.monotonic() + 60
    try:
        while not held:
            assert time.monotonic() < deadline, "the holder acquired nothing"
            got = [m for m in holder.poll(0.2) or [] if not m.error()]
            now = time.monotonic()
            for m in got[:records]:
                held[(m.partition(), m.offset())] = now
        # (the holder polls no more: its records stay acquired until their lock runs out)
        other = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
        other.subscribe([topic])
        lateness: list[float] = []
        try:
            while len(lateness) < len(held):
                assert time.monotonic() < deadline + lock_ms / 1000, f"{len(lateness)} of {len(held)} redelivered"
                for m in other.poll(0.05) or []:
                    acquired = held.get((m.partition(), m.offset()))
                    if not m.error() and acquired is not None:
                        lateness.append((time.monotonic() - acquired) * 1000 - lock_ms)
            other.commit_sync()
        finally:
            other.close()
    finally:
        holder.close()
    return sorted(lateness)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-records", type=int, default=300_000)
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--members", type=int, default=3)
    p.add_argument("--redeliver", type=int, default=500)
    p.add_argument("--lock-ms", type=int, default=2000)
    p.add_argument("--storage", default="file", choices=("file", "memory", "rocksdb"))
    args = p.parse_args()
    with perfutil.Broker(args.storage) as broker:
        bootstrap = broker.bootstrap
        topic = f"share-perf-{uuid.uuid4().hex[:8]}"
        perfutil.create_topic(bootstrap, topic, args.partitions)
        _produce(bootstrap, topic, args.num_records, args.record_size, args.partitions)
        results: dict[str, tuple[float, float]] = {}
        for name, run in (("classic", _classic), ("share", _share)):
            broker.settle()
            cpu0 = broker.cpu_seconds()
            elapsed, joined = run(bootstrap, topic, args.num_records, args.members)
            cpu = broker.cpu_seconds() - cpu0
            rate = args.num_records / elapsed
            fetch_rate = args.num_records / max(elapsed - joined, 1e-3)
            results[name] = (rate, fetch_rate)
            extra = ""
            if name == "share":
                classic, classic_fetch = results["classic"]
                extra = f", {rate / classic * 100:.0f} % of classic ({fetch_rate / classic_fetch * 100:.0f} % fetching)"
            print(
                f"{name}: {args.num_records} records in {elapsed:.2f} s, {rate:.1f} records/sec "
                f"({rate * args.record_size / 1048576:.2f} MB/sec), first record after {joined * 1000:.0f} ms, "
                f"{fetch_rate:.1f} records/sec fetching from then on, {args.members} members{extra}, "
                f"broker cpu {cpu:.2f} s ({cpu / args.num_records * 1e6:.2f} us/record)"
            )
        # (one partition, so both members of the redelivery group fetch it: with more partitions than members each
        # member would have partitions of its own, and the holder's records would wait for the holder)
        single = f"{topic}-1"
        perfutil.create_topic(bootstrap, single, 1)
        _produce(bootstrap, single, args.redeliver, args.record_size, 1)
        broker.settle()
        lateness = _redelivery(bootstrap, single, args.redeliver, args.lock_ms)
        print(
            f"redelivery: {len(lateness)} records past a {args.lock_ms} ms lock, delivered again "
            f"p50 {perfutil.percentile(lateness, 50):.0f} ms, p99 {perfutil.percentile(lateness, 99):.0f} ms, "
            f"max {lateness[-1]:.0f} ms after the lock's end"
        )


if __name__ == "__main__":
    main()
