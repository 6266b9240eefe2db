"""Ingest and consume with kcat: librdkafka's C client with no Python in the client's path, so a client that can
push what the broker takes (confluent-kafka's Python layer adds client CPU per record on each side):

    python bench/kcat_perf.py --topic perf --num-records 3000000 --record-size 100 --start-broker

Produce: kcat -P reads the records from a file (one value per line, written before the clock starts) and exits once
every record is acknowledged; the topic's end offsets are checked to have grown by the count. Consume: kcat -C
reads the same records from the earliest offset with the legacy (group-less) consumer, prints one newline per
record and exits after the count; the newlines are counted. Each prints a kafka-producer-perf-test or
kafka-consumer-perf-test style line with kcat's CPU (all its threads) per record, and with a started broker the
broker's CPU per million records. `produce()` and `consume()` are the same measurements as functions (used by
kafka_suite.py). Needs `kcat` on PATH (`make compat-deps` installs it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import perfutil

KCAT = "kcat"


def _run_kcat(args: Sequence[str], stdin: Any = None, stdout: Any = subprocess.DEVNULL) -> tuple[float, float, bytes]:
    """Run kcat to its end: (wall seconds, its CPU seconds over all threads, what it printed when `stdout` is a
    pipe). A failed run raises with kcat's own complaint."""
    start = time.perf_counter()
    proc = subprocess.Popen([KCAT, *args], stdin=stdin, stdout=stdout, stderr=subprocess.PIPE)
    # stderr is drained beside stdout, so kcat never blocks on a full pipe we are not reading
    errors: list[bytes] = []
    drain = threading.Thread(target=lambda: errors.append(proc.stderr.read()))  # type: ignore[union-attr]
    drain.start()
    out = proc.stdout.read() if proc.stdout is not None else b""
    drain.join()
    err = errors[0]
    # os.wait4 rather than proc.wait: it also gives kcat's CPU time, summed over its threads
    _pid, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"kcat {' '.join(args)} exited with {proc.returncode}: {err.decode(errors='replace')}")
    return elapsed, usage.ru_utime + usage.ru_stime, out


def write_records(path: str, records: int, size: int) -> None:
    """`records` lines of `size` bytes each (a newline ends each): kcat -P's input, one record value per line."""
    value = (b"0123456789abcdefghijklmnopqrstuvwxyz" * (size // 36 + 1))[:size] + b"\n"
    chunk = 10_000
    with open(path, "wb") as f:
        for done in range(0, records, chunk):
            f.write(value * min(chunk, records - done))


def produce(
    bootstrap: str,
    topic: str,
    records: int,
    size: int,
    props: dict[str, str] | None = None,
    partition: int | None = 0,
    partitions: int = 1,
    input_path: str | None = None,
) -> dict[str, Any]:
    """kcat -P of `records` values of `size` bytes into `partition` of the `partitions` of `topic` (None:
    librdkafka's partitioner places them). The clock runs from kcat's start until it exits, after its last
    delivery report."""
    with tempfile.TemporaryDirectory(prefix="mqk-kcat-") as tmp:
        if input_path is None:
            input_path = os.path.join(tmp, "records.txt")
            write_records(input_path, records, size)
        before = sum(perfutil.end_offsets(bootstrap, topic, partitions))
        conf = {"acks": "1", "linger.ms": "5", **(props or {})}
        args = [
            "-P",
            "-b",
            bootstrap,
            "-t",
            topic,
            *(["-p", str(partition)] if partition is not None else []),
            *(arg for key, value in conf.items() for arg in ("-X", f"{key}={value}")),
        ]
        with open(input_path, "rb") as stdin:
            elapsed, cpu, _ = _run_kcat(args, stdin=stdin)
    written = sum(perfutil.end_offsets(bootstrap, topic, partitions)) - before
    if written != records:
        raise RuntimeError(f"kcat reported success but the topic grew by {written} records, not {records}")
    return {
        "records": records,
        "elapsed_s": elapsed,
        "records_per_s": records / elapsed,
        "mb_per_s": records * size / elapsed / 1048576,
        "client_cpu_s": cpu,
    }


def consume(bootstrap: str, topic: str, records: int, props: dict[str, str] | None = None) -> dict[str, Any]:
    """kcat -C of `records` records of `topic` from the earliest offsets, one printed newline each."""
    args = [
        "-C",
        "-b",
        bootstrap,
        "-t",
        topic,
        "-o",
        "beginning",
        "-c",
        str(records),
        "-q",
        "-f",
        "\n",
        *(arg for key, value in (props or {}).items() for arg in ("-X", f"{key}={value}")),
    ]
    elapsed, cpu, out = _run_kcat(args, stdout=subprocess.PIPE)
    count = out.count(b"\n")
    if count != records:
        raise RuntimeError(f"kcat printed {count} records, not {records}")
    return {"records": records, "elapsed_s": elapsed, "records_per_s": records / elapsed, "client_cpu_s": cpu}


def produce_line(r: dict[str, Any]) -> str:
    return (
        f"{r['records']} records sent, {r['records_per_s']:.1f} records/sec ({r['mb_per_s']:.2f} MB/sec), kcat "
        f"cpu {r['client_cpu_s'] / r['records'] * 1e6:.2f} us per record"
    )


def consume_line(r: dict[str, Any], size: int) -> str:
    mb = r["records"] * size / 1048576
    return (
        f"kcat consumed {r['records']} records ({mb:.1f} MB of values) in {r['elapsed_s']:.3f} s: "
        f"{r['records_per_s']:.1f} records/sec, {mb / r['elapsed_s']:.2f} MB/sec, kcat cpu "
        f"{r['client_cpu_s'] / r['records'] * 1e6:.2f} us per record"
    )


def with_broker_cpu(broker: perfutil.Broker | None, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`measure()` with the started broker's CPU seconds for it (settled before and after), if there is one."""
    if broker is None:
        return measure()
    broker.settle()
    cpu0 = broker.cpu_seconds()
    r = measure()
    broker.settle()
    r["broker_cpu_s"] = broker.cpu_seconds() - cpu0
    return r


def broker_note(r: dict[str, Any]) -> str:
    if "broker_cpu_s" not in r:
        return ""
    return f"broker cpu: {r['broker_cpu_s']:.2f} s, {r['broker_cpu_s'] / r['records'] * 1e6:.2f} s per million records"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topic", required=True)
    p.add_argument("--num-records", type=int, required=True)
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--producer-props", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--consumer-props", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--partitions", type=int, default=1, help="create the topic with this many partitions")
    p.add_argument(
        "--partitioner",
        action="store_true",
        help="name no partition: librdkafka's partitioner places the keyless records (default: partition 0)",
    )
    p.add_argument("--no-consume", action="store_true", help="produce only")
    perfutil.add_broker_args(p)
    args = p.parse_args(argv)
    if shutil.which(KCAT) is None:
        p.error("kcat is not on PATH (make compat-deps installs it)")

    broker = perfutil.Broker(args.storage, args.data_dir) if args.start_broker else None
    try:
        bootstrap = broker.bootstrap if broker else args.bootstrap
        if not bootstrap:
            p.error("give --bootstrap or --start-broker")
        perfutil.create_topic(bootstrap, args.topic, args.partitions)
        r = with_broker_cpu(
            broker,
            lambda: produce(
                bootstrap,
                args.topic,
                args.num_records,
                args.record_size,
                perfutil.parse_props(args.producer_props),
                None if args.partitioner else 0,
                args.partitions,
            ),
        )
        print(produce_line(r), flush=True)
        if broker:
            print(broker_note(r), flush=True)
        if not args.no_consume:
            r = with_broker_cpu(
                broker,
                lambda: consume(bootstrap, args.topic, args.num_records, perfutil.parse_props(args.consumer_props)),
            )
            print(consume_line(r, args.record_size), flush=True)
            if broker:
                print(broker_note(r), flush=True)
    finally:
        if broker:
            broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
