"""What one consumer of a topic with many partitions costs the broker at a low record rate:

    python bench/wide_consumer.py --start-broker                       # 1,000 partitions; 10, 100, 1,000 records/s
    python bench/wide_consumer.py --start-broker --partitions 100 --rates 100

A confluent-kafka consumer joins a group on a topic of `--partitions` partitions and reads until it is caught
up; then a producer sends `--rates` records/s, round-robin over the partitions, for `--seconds` each, while the
consumer reads them. A librdkafka consumer sends every assigned partition in each Fetch and, with the default
fetch.min.bytes=1, gets an answer as soon as any one of them has a record: at a low rate nearly every record
costs the broker a Fetch over all the partitions. Prints, per rate, the records consumed and the broker's CPU
(percent of one core, and CPU time per record), first with the producer alone, then with the consumer reading.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from typing import Any

import perfutil


def run(
    broker: perfutil.Broker,
    partitions: int,
    rate: float,
    seconds: float,
    topic: str | None = None,
    consumer: Any = None,
) -> dict[str, Any]:
    """`rate` records/s round-robin into `topic` for `seconds` while `consumer` (None: no consumer) reads; the
    broker's CPU for the phase and how many records the consumer got."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    broker.settle()
    stop = time.monotonic() + seconds
    sent = 0

    def produce() -> None:
        nonlocal sent
        start = time.monotonic()
        while time.monotonic() < stop:
            producer.produce(topic, b"r" * 100, partition=sent % partitions)
            sent += 1
            producer.poll(0)
            ahead = start + sent / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        producer.flush(10)

    thread = threading.Thread(target=produce)
    cpu0 = broker.cpu_seconds()
    started = time.monotonic()
    thread.start()
    consumed = 0
    while time.monotonic() < stop:
        if consumer is None:
            time.sleep(0.05)
            continue
        message = consumer.poll(0.05)
        if message is not None and message.error() is None:
            consumed += 1
    thread.join()
    elapsed = time.monotonic() - started
    cpu = broker.cpu_seconds() - cpu0
    while consumer is not None and consumed < sent:  # the last records, outside the timed phase
        message = consumer.poll(1.0)
        if message is None:
            break
        if message.error() is None:
            consumed += 1
    return {
        "rate": rate,
        "sent": sent,
        "consumed": consumed,
        "broker_busy": cpu / elapsed,
        "broker_ms_per_record": cpu / max(consumed or sent, 1) * 1000,
    }


def caught_up_consumer(bootstrap: str, topic: str, expected: int) -> Any:
    """A consumer in a fresh group, assigned every partition of `topic`, that has read the `expected` records
    already there."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"wide-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 60
    while got < expected and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            got += 1
    if got < expected:
        raise RuntimeError(f"the consumer read {got} of the {expected} records already there")
    return consumer


def line(r: dict[str, Any], partitions: int, what: str) -> str:
    return (
        f"{partitions} partitions, {r['rate']:g} records/s, {what}: {r['consumed']} of {r['sent']} records "
        f"consumed, broker {r['broker_busy']:.0%} of a core busy, {r['broker_ms_per_record']:.2f} ms broker "
        f"CPU per record"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--partitions", type=int, default=1000)
    p.add_argument("--rates", type=float, nargs="+", default=[10, 100, 1000])
    p.add_argument("--seconds", type=float, default=5.0)
    perfutil.add_broker_args(p)
    args = p.parse_args(argv)
    if not args.start_broker:
        p.error("this tool measures the broker's CPU: give --start-broker")
    with perfutil.Broker(args.storage, args.data_dir) as broker:
        topic = f"wide-{uuid.uuid4().hex[:6]}"
        perfutil.create_topic(broker.bootstrap, topic, args.partitions)
        # one record in every partition first: the consumer's first pass creates nothing later
        run(broker, args.partitions, 2000, args.partitions / 2000, topic)
        # the producer alone first (a librdkafka consumer fetches in the background whether or not it is polled)
        for rate in args.rates:
            print(
                line(run(broker, args.partitions, rate, args.seconds, topic), args.partitions, "no consumer"),
                flush=True,
            )
        consumer = caught_up_consumer(
            broker.bootstrap, topic, sum(perfutil.end_offsets(broker.bootstrap, topic, args.partitions))
        )
        try:
            for rate in args.rates:
                print(
                    line(
                        run(broker, args.partitions, rate, args.seconds, topic, consumer),
                        args.partitions,
                        "one consumer of every partition",
                    ),
                    flush=True,
                )
        finally:
            consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
