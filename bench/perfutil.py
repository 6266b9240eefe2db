"""Shared plumbing for the perf tools in bench/: starting a broker subprocess to measure, reading its CPU time,
percentiles, and `key=value` property lists (the Kafka perf tools' `--producer-props` style).

The tools import this as a sibling module (`python bench/producer_perf.py` puts bench/ on sys.path); it also puts
the repository root on sys.path so `mqk` imports without an install.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_props(items: Sequence[str] | None) -> dict[str, str]:
    props: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"expected key=value, got {item!r}")
        props[key] = value
    return props


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values) - 1, max(0, round(p / 100.0 * len(sorted_values) + 0.5) - 1))
    return float(sorted_values[rank])


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc/<pid>/stat (fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _set_affinity(pid: int, cpus: set[int]) -> None:
    """Every thread of process `pid` (a new thread inherits its creator's set) may run on `cpus` only."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """A measuring client's loop without the cyclic garbage collector (reference counting still frees what it
    drops). A consumer taking hundreds of thousands of records/s keeps each poll's messages alive across young
    collections, so they reach the old generation and set off full collections of the whole interpreter: pauses in
    which it reads nothing, charged to every record waiting behind them as if the broker were late (bench/README.md
    has the figures)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_codecs(*api_keys: int) -> None:
    """Load the generated Kafka codec of each API in `api_keys` now. The codec imports an API's module the first
    time one of its messages passes (compiling a large generated module); a wire-level client calls this before
    its clock starts (or before it tells the producer it is ready), so that cost is the client's start-up,
    not fetch time or latency charged to the broker."""
    # imported here, as BrokerProcess is below: the confluent-kafka-only tools never load mqk's codec
    from mqk.protocol.kafka.messages import module_for

    for api_key in api_keys:
        module_for(api_key)


@contextlib.contextmanager
def pinned(broker_pid: int) -> Iterator[bool]:
    """Run this process (the client, with its library's threads) on the first CPU and the broker on the last,
    then give both every CPU back. Yields False, pinning nothing, on a machine with one CPU. With a core each, a
    run whose client core is 100% busy while the broker's is not measures the client, whatever the broker does."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        yield False
        return
    _set_affinity(os.getpid(), {cpus[0]})
    _set_affinity(broker_pid, {cpus[-1]})
    try:
        yield True
    finally:
        _set_affinity(os.getpid(), set(cpus))
        _set_affinity(broker_pid, set(cpus))


class Broker:
    """An mqk broker subprocess started for a measurement (mqk.testing.BrokerProcess), or nothing when the tool
    targets an existing `--bootstrap`."""

    def __init__(self, storage: str = "file", data_dir: str | None = None, extra_args: Sequence[str] = ()) -> None:
        from mqk.testing import BrokerProcess

        self._tmp = None
        if data_dir is None:
            # `dd` comparisons write next to the store (kafka_suite.py), so both measure the same disk.
            self._tmp = tempfile.TemporaryDirectory(prefix="mqk-bench-")
            data_dir = self._tmp.name
        self.data_dir = Path(data_dir)
        self.process = BrokerProcess(self.data_dir / "data", storage=storage, extra_args=tuple(extra_args))
        self.process.start()

    @property
    def bootstrap(self) -> str:
        return self.process.bootstrap

    @property
    def namesrv(self) -> str:
        host, port = self.process.namesrv_address
        return f"{host}:{port}"

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.process.proc.pid)

    def settle(self, quiet_s: float = 0.5, timeout_s: float = 30.0) -> None:
        """Wait until the broker is idle (background flush / dispatch of an earlier phase done), so the next
        phase's CPU figure is its own."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            c0 = self.cpu_seconds()
            time.sleep(quiet_s)
            if self.cpu_seconds() - c0 < 0.02 * quiet_s / 0.5:
                return

    def close(self) -> None:
        try:
            self.process.stop()
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def add_broker_args(parser: Any) -> None:
    parser.add_argument(
        "--bootstrap", "--bootstrap-server", dest="bootstrap", help="an already running broker (host:port)"
    )
    parser.add_argument(
        "--start-broker",
        action="store_true",
        help="start an mqk broker subprocess for this run and report its CPU time",
    )
    parser.add_argument(
        "--storage",
        default="file",
        choices=("file", "memory", "rocksdb"),
        help="storage engine of the started broker (default file)",
    )
    parser.add_argument("--data-dir", help="data directory of the started broker (default: a temporary one)")


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create the topic if it does not exist (auto-creation would give it one partition)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic]
    try:
        fut.result(30)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
            raise


def delete_topic(bootstrap: str, topic: str) -> None:
    """Delete the topic (its queues' files and descriptors go with it)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the answer: it owns the request
    admin.delete_topics([topic])[topic].result(30)


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    """The latest offset of each of the topic's partitions (one ListOffsets request)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)})
    return [fut.result(30).offset for _tp, fut in sorted(futures.items(), key=lambda item: item[0].partition)]


#: the max_bytes of fetch_v12's requests (Kafka's fetch.max.bytes default)
FETCH_MAX_BYTES = 52_428_800


def fetch_v12(
    topic: str, offsets: dict[int, int], max_wait_ms: int, partition_max_bytes: int = FETCH_MAX_BYTES
) -> dict:
    """The body of a wire-level consumer's Fetch v12 (no session, read-uncommitted) for `offsets` {partition:
    offset} of one topic."""
    return {
        "replica_id": -1,
        "max_wait_ms": max_wait_ms,
        "min_bytes": 1,
        "max_bytes": FETCH_MAX_BYTES,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "forgotten_topics_data": [],
        "rack_id": "",
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": p,
                        "current_leader_epoch": -1,
                        "fetch_offset": o,
                        "log_start_offset": -1,
                        "partition_max_bytes": partition_max_bytes,
                    }
                    for p, o in offsets.items()
                ],
            }
        ],
    }
