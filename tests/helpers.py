"""Helpers the test suites share (plain functions and classes; the shared fixtures are in tests/conftest.py).

Test modules import them by name (`from helpers import wait_until`): setup.cfg puts tests/ on pytest's
`pythonpath`, and compat/ uses them the same way. No test module imports another test module.

What lives here:
- waiting: `wait_until` / `wait_until_async`, the one place that polls, for conditions outside the test's control
  (a real client's rebalance, a subprocess, a worker thread); `queue_reaches`, which waits for an append through
  the store's data listener instead. Time the broker itself measures is moved with a `FakeClock`, never waited for;
- record batches: builders (the recbatch twin, kafka-python's own producer-side builder, snappy in both framings)
  and an independent decoder;
- the storage engines under test: `store_config`, `new_engine`, `Harness` (an engine plus restart);
- Kafka request bodies for the raw client (`produce_body`, `fetch_body`) and `values_of`;
- `OffsetsOnly` (the group-offset part of a store) and `subscription` (consumer-protocol metadata);
- `cached_pages` (mincore over a MappedFile);
- `WatchedKeys` (a prefix of etcd followed by a watch) and `commitlog_bytes` (a file engine's CommitLog);
- replicated clusters: a group of three brokers, its topics, its in-sync set and leader as clients see them, a
  producer recording where each acknowledgement landed, and reading everything back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import inspect
import os
import sys
import threading
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Self

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from mqk._fast import load, twin
from mqk.cluster_local import LocalCluster, free_port
from mqk.config import StoreConfig
from mqk.meta import EtcdClient, Record
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient
from mqk.store.adapter import GroupOffset, StorageAdapter

with warnings.catch_warnings():
    # kafka-python 3 reads its JSON schemas with importlib.resources' deprecated legacy API at import time; the
    # warning is attributed to importlib, so setup.cfg's `kafka.*` filter does not catch it.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

rb = twin("recbatch")

# --- waiting ------------------------------------------------------------------------------------------------------

#: how often `wait_until` looks again; short against every timeout given, long enough not to steal the CPU
#: from what is being waited for
POLL_SECONDS = 0.02


class _Deadline:
    def __init__(self, timeout: float, what: str) -> None:
        self.end = time.monotonic() + timeout
        self.timeout = timeout
        self.what = what

    def check(self) -> None:
        if time.monotonic() >= self.end:
            raise AssertionError(f"timed out after {self.timeout} s waiting for {self.what}")


#: `make test` runs the suite on two pytest-xdist workers (--dist loadgroup). Tests that start a cluster of several
#: brokers with etcd, and kill, pause or fail them over, carry this mark: they all go to one worker, one at a time,
#: so two such tests never share the machine's two cores (their leases and replication would then run on less than
#: one core each); the other worker runs everything else meanwhile.
CLUSTER_TESTS = pytest.mark.xdist_group("clusters")


def measure_only_this_process() -> None:
    """Under `make test` pytest and each of its pytest-xdist workers are measured from their start
    (COVERAGE_PROCESS_START starts coverage through the .pth file coverage installs, so mqk's own pytest plugin is
    measured from its import). A worker drops the variable here, so the brokers and clients its tests start are not
    measured (tracing would slow the brokers down); pytest itself keeps it for the workers it starts. Both
    conftests call this."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COVERAGE_PROCESS_START", None)


def save_coverage() -> None:
    """Write this process's coverage data now, if it is measured: an xdist worker ends without running its exit
    handlers, where coverage would save it. Both conftests call this when the session ends."""
    import coverage

    measured = coverage.Coverage.current()
    if measured is not None:
        measured.stop()
        measured.save()


def serialize_ast_parse() -> None:
    """Keep `ast.parse` calls from interleaving (both conftests call this; calling it again does nothing).

    CPython 3.11 keeps the AST converter's recursion depth in state that every conversion shares (gh-106905, fixed
    in later releases). A second conversion that starts before the first ends, in another thread or in a finalizer
    the collector runs in the middle of it (3.11's traceback module parses the failing line for its carets, so any
    traceback formatted then is one), leaves the first with `SystemError: AST constructor recursion depth
    mismatch`. CI met it in pytest's reporting of a failed test: an INTERNALERROR, which ended the session before the
    summary of what failed. Here a parse holds a lock and runs with the collector off, so nothing else converts
    until it is done. (I could not make the clash happen on demand: this guards the one seen.)"""
    import ast
    import gc

    if sys.version_info[:2] != (3, 11) or getattr(ast.parse, "_mqk_serialized", False):
        return
    parse = ast.parse
    lock = threading.RLock()

    def serialized(*args: Any, **kwargs: Any) -> Any:
        with lock:
            collecting = gc.isenabled()
            gc.disable()
            try:
                return parse(*args, **kwargs)
            finally:
                if collecting:
                    gc.enable()

    serialized._mqk_serialized = True  # type: ignore[attr-defined]
    ast.parse = serialized  # type: ignore[assignment]


def wait_until(condition: Callable[[], Any], timeout: float = 10.0, what: str = "the condition") -> Any:
    """Block until `condition()` is truthy and return its value; fail the test after `timeout` seconds.

    For conditions that change outside this thread with no event to wait on: a real client in its own threads or
    process, a subprocess, the broker's loop thread. Never for time the broker measures (move a FakeClock)."""
    deadline = _Deadline(timeout, what)
    while True:
        value = condition()
        if value:
            return value
        deadline.check()
        time.sleep(POLL_SECONDS)  # the one synchronous poll of the suite: nothing to wait on but the condition


async def wait_until_async(condition: Callable[[], Any], timeout: float = 10.0, what: str = "the condition") -> Any:  # noqa: ASYNC109 - the failure names what was awaited
    """`wait_until` for a coroutine: the event loop keeps running while it waits (the condition usually depends
    on it, and on a worker thread or a socket peer it serves). `condition` may return an awaitable (a question
    asked over the network again each time: another process's answer); its result is what is tested."""
    deadline = _Deadline(timeout, what)
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        deadline.check()
        await asyncio.sleep(POLL_SECONDS)  # the one asynchronous poll of the suite (see wait_until)


async def queue_reaches(store: Any, topic: str, queue: int, end: int, timeout: float = 10.0) -> None:  # noqa: ASYNC109 - the failure names what was awaited
    """Return once `topic`/`queue` ends at `end` or later. Woken by the store's data listener (which engines may
    call from their writer thread), so no polling; fails after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    reached: asyncio.Future[None] = loop.create_future()
    listening = [True]  # the store has no remove_listener: the listener goes quiet instead

    def done() -> None:
        if not reached.done():
            reached.set_result(None)

    def listener(grown: str, queue_ends: Sequence[tuple[int, int]]) -> None:
        if listening[0] and grown == topic and any(q == queue and e >= end for q, e in queue_ends):
            with contextlib.suppress(RuntimeError):  # the test's loop is gone: nobody waits any more
                loop.call_soon_threadsafe(done)

    store.add_listener(listener)
    try:
        if store.end_offset(topic, queue) < end:
            try:
                await asyncio.wait_for(reached, timeout)
            except TimeoutError:
                raise AssertionError(
                    f"{topic}/{queue} ends at {store.end_offset(topic, queue)}, not {end}, after {timeout} s"
                ) from None
    finally:
        listening[0] = False


# --- record batches -----------------------------------------------------------------------------------------------


def twin_batch(
    values: Sequence[bytes],
    base_timestamp: int = 1_000,
    ts_step: int = 1,
    timestamps: Sequence[int] | None = None,
    keys: Sequence[bytes | None] | None = None,
) -> bytearray:
    """An uncompressed batch built with the recbatch twin; record i has value values[i] and timestamp
    timestamps[i] (or base_timestamp + i * ts_step)."""
    if timestamps is None:
        timestamps = [base_timestamp + i * ts_step for i in range(len(values))]
    base_ts = timestamps[0]
    records = b"".join(
        rb.encode_record(i, ts - base_ts, None if keys is None else keys[i], value, [("h", b"x")])
        for i, (ts, value) in enumerate(zip(timestamps, values))
    )
    return rb.build_batch(0, base_ts, max(timestamps), records, len(values), len(values) - 1)


def kafka_python_batch(values: Sequence[bytes], timestamps: Sequence[int], compression: int = 0) -> bytes:
    """A batch built by kafka-python's own producer-side builder (compression: 0 none, 1 gzip, 2 snappy, 3 lz4,
    4 zstd)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i, (value, ts) in enumerate(zip(values, timestamps)):
        builder.append(i, timestamp=ts, key=b"key-%d" % i, value=value, headers=[])
    return bytes(builder.build())


def records_of(data: bytes | bytearray | memoryview) -> list[tuple[int, int, bytes | None]]:
    """(offset, timestamp, value) of every record in a stored batch, decoded independently by kafka-python."""
    batch = DefaultRecordBatch(bytes(data))
    assert batch.validate_crc(), "stored batch has a bad CRC"
    return [(r.offset, r.timestamp, r.value) for r in batch]


def header_of(data: bytes | bytearray | memoryview) -> tuple:
    return rb.parse_header(bytes(data), 0)


def snappy_twin_batch(values: Sequence[bytes], timestamps: Sequence[int], xerial: bool = False) -> bytes:
    """A snappy-compressed batch (kafka-python needs python-snappy for that; cramjam is what we have), raw or in
    the xerial framing the Java client writes."""
    import cramjam

    base_ts = timestamps[0]
    records = b"".join(
        rb.encode_record(i, ts - base_ts, b"key-%d" % i, value, [])
        for i, (ts, value) in enumerate(zip(timestamps, values))
    )
    block = bytes(cramjam.snappy.compress_raw(records))
    if xerial:
        half = len(records) // 2  # two chunks, to exercise the chunk walk
        chunks = [bytes(cramjam.snappy.compress_raw(part)) for part in (records[:half], records[half:])]
        block = b"\x82SNAPPY\x00" + (1).to_bytes(4, "big") * 2 + b"".join(len(c).to_bytes(4, "big") + c for c in chunks)
    return bytes(rb.build_batch(0, base_ts, max(timestamps), block, len(values), len(values) - 1, attributes=2))


# --- the engines under test ---------------------------------------------------------------------------------------

ENGINE_NAMES = ["memory", "rocksdb", "file"]
#: the scenario suite's file engine runs with tiny CommitLog segments (and 16-unit ConsumeQueue files) so ordinary
#: tests cross segment and file boundaries
SMALL_SEGMENT = 4096


def store_config(engine: str, data_dir: Path, **changes: object) -> StoreConfig:
    base = StoreConfig(
        data_dir=data_dir,
        storage=engine,
        commitlog_segment_bytes=SMALL_SEGMENT,
        cq_units_per_file=16,
        flush_interval_ms=20,
        checkpoint_interval_ms=50,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]  # changes are StoreConfig fields


def new_engine(engine: str, config: StoreConfig) -> StorageAdapter:
    if engine == "memory":
        from mqk.store.memory import MemoryEngine

        return MemoryEngine()
    if engine == "rocksdb":
        from mqk.store.rocksdb import RocksEngine

        return RocksEngine(config, config.data_dir)
    from mqk.store.file.engine import FileEngine

    return FileEngine(config, config.data_dir)


@contextlib.asynccontextmanager
async def memory_kafka(**config: Any) -> AsyncIterator[Any]:
    """A KafkaServer on a memory store, on a free loopback port (BrokerConfig fields as keywords), stopped after."""
    from mqk.config import BrokerConfig
    from mqk.server.kafka.server import KafkaServer
    from mqk.store.manager import StoreManager

    broker_config = BrokerConfig(kafka_listen=("127.0.0.1", 0), store=StoreConfig(storage="memory"), **config)
    store = StoreManager(broker_config.store)
    await store.start()
    kafka = KafkaServer(broker_config, store)
    try:
        await kafka.start()
        yield kafka
    finally:
        await kafka.stop()
        await store.close()


class Harness:
    """An engine under test plus the means to restart it on the same data."""

    def __init__(self, name: str, data_dir: Path, **config_changes: object) -> None:
        self.name = name
        self.config = store_config(name, data_dir, **config_changes)
        self.engine: StorageAdapter | None = None

    @property
    def durable(self) -> bool:
        return self.name != "memory"

    async def open(self) -> StorageAdapter:
        self.engine = new_engine(self.name, self.config)
        await self.engine.start()
        return self.engine

    async def restart(self) -> StorageAdapter:
        assert self.engine is not None
        await self.engine.close()
        return await self.open()

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()
            self.engine = None


# --- Kafka request bodies for the raw client ----------------------------------------------------------------------


def produce_body(
    topic: str, batch: Any, partition: int = 0, acks: int = -1, transactional_id: str | None = None
) -> dict:
    return {
        "transactional_id": transactional_id,
        "acks": acks,
        "timeout_ms": 5000,
        "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": bytes(batch)}]}],
    }


def fetch_body(
    topic: str, offset: int, partition: int = 0, max_wait_ms: int = 0, min_bytes: int = 0, max_bytes: int = 1 << 20
) -> dict:
    return {
        "replica_id": -1,
        "max_wait_ms": max_wait_ms,
        "min_bytes": min_bytes,
        "max_bytes": max_bytes,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": partition,
                        "current_leader_epoch": -1,
                        "fetch_offset": offset,
                        "log_start_offset": -1,
                        "partition_max_bytes": max_bytes,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


def raw_records(records: Any) -> bytes:
    if records is None:
        return b""
    return b"".join(bytes(r) for r in records) if isinstance(records, (list, tuple)) else bytes(records)


def values_of(records: Any) -> list[bytes]:
    """The values of every record in a Fetch answer's `records` (bytes or a list of views), in order."""
    recbatch = load("recbatch")
    data = raw_records(records)
    out = []
    for pos, size, *_ in recbatch.scan_batches(data):
        h = recbatch.parse_header(data, pos)
        out += [r[4] for r in recbatch.decode_records(data[pos + 61 : pos + size], h[12])]
    return out


def committed_values(partition: dict[str, Any]) -> list[bytes]:
    """The values a read_committed client takes from a Fetch answer's partition, by the rule Kafka's consumers
    follow: a producer named in `aborted_transactions` is aborting from its first offset on, and its transactional
    batches are dropped until its ABORT marker (control batches are never returned)."""
    recbatch = load("recbatch")
    data = raw_records(partition["records"])
    pending = sorted((a["first_offset"], a["producer_id"]) for a in partition["aborted_transactions"] or ())
    aborting: set[int] = set()
    out = []
    for pos, size, *_ in recbatch.scan_batches(data):
        h = recbatch.parse_header(data, pos)
        records = recbatch.decode_records(data[pos + 61 : pos + size], h[12])
        while pending and pending[0][0] <= h[0] + h[6]:
            aborting.add(pending.pop(0)[1])
        if h[5] & 0x20:  # a control batch: an ABORT marker (key type 0) ends its producer's aborted transaction
            if records and records[0][3] is not None and records[0][3][2:4] == b"\x00\x00":
                aborting.discard(h[9])
            continue
        if h[5] & 0x10 and h[9] in aborting:
            continue
        out += [r[4] for r in records]
    return out


# --- groups -------------------------------------------------------------------------------------------------------


class OffsetsOnly:
    """The four group-offset methods of the StoreManager, kept in a dict (what the group coordinator needs)."""

    def __init__(self) -> None:
        self.data: dict[str, dict[tuple[str, int], GroupOffset]] = {}

    async def commit_offsets(self, group: str, offsets: dict[tuple[str, int], GroupOffset]) -> None:
        self.data.setdefault(group, {}).update(offsets)

    def fetch_offsets(self, group: str) -> dict[tuple[str, int], GroupOffset]:
        return dict(self.data.get(group, {}))

    async def delete_offsets(self, group: str, partitions: list[tuple[str, int]] | None = None) -> None:
        if partitions is None:
            self.data.pop(group, None)
        else:
            for tp in partitions:
                self.data.get(group, {}).pop(tp, None)

    def list_offset_groups(self) -> list[str]:
        return [g for g, o in self.data.items() if o]


def subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0 bytes for `topics` (no user data)."""
    import struct

    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


# --- the file store's mappings ------------------------------------------------------------------------------------


def cached_pages(mf: Any) -> list[bool]:
    """Which pages of MappedFile `mf` are in the page cache (mincore over its mapping)."""
    from mqk.store.file.mapped_file import PAGE

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    pages = (mf.file_size + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * pages)()
    window = (ctypes.c_char * mf.file_size).from_buffer(mf.mm)
    try:
        assert libc.mincore(ctypes.addressof(window), mf.file_size, vec) == 0, os.strerror(ctypes.get_errno())
    finally:
        del window  # the buffer export would keep the mapping from closing
    return [bool(v & 1) for v in vec]


# --- replicated clusters ------------------------------------------------------------------------------------------
# one broker group of three `mqk serve --cluster` processes (mqk_cluster_factory), confluent-kafka as the client

#: the brokers' lease TTL: how long a dead or paused master keeps its group
SESSION_MS = 3000
#: replica.lag.time.max.ms: how long a replica that stopped catching up stays in sync
LAG_MS = 3000
CONFIG = {"cluster_session_timeout_ms": SESSION_MS, "replica_lag_time_max_ms": LAG_MS}
#: how long a failover or a rejoin may take on a machine busy with other tests
SETTLE_S = 60


def three_replicas(factory: Callable[..., LocalCluster], **kwargs: Any) -> LocalCluster:
    return factory(3, group_size=3, config=CONFIG, **kwargs)


def create_topic(cluster: LocalCluster, name: str, partitions: int = 3, min_insync: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, partitions, 3, config={"min.insync.replicas": str(min_insync)})], operation_timeout=30
    )
    for future in futures.values():
        future.result(30)
    wait_until(lambda: len(in_sync(cluster, name)) == 3, SETTLE_S, "all three replicas in sync")


def describe(cluster: LocalCluster, topic: str) -> dict[int, Any]:
    admin = AdminClient({"bootstrap.servers": ",".join(b.bootstrap for b in cluster.brokers if b.running)})
    md = admin.list_topics(topic, timeout=10)
    return dict(md.topics[topic].partitions)


def leaders_seen_by(kafka_address: tuple[str, int], topic: str) -> dict[int, int]:
    """partition -> leader node id (-1: none now) in the Metadata of the one broker at `kafka_address`, asked
    without auto-creation; {} while that broker does not know the topic. In a cluster a broker learns a change (a
    topic made, a partition moved) by its own etcd watch, a moment after the broker that made it answered: a client
    that asks one broker (its Metadata, its RocketMQ name server, its gRPC endpoint) is sure to find the change only
    once that broker's Metadata shows it. Blocks; callable from async tests too (its own loop)."""

    async def ask() -> dict[int, int]:
        async with await RawKafkaClient.connect(*kafka_address) as client:
            body = {"topics": [{"name": topic}], "allow_auto_topic_creation": False}
            (entry,) = (await client.call(ApiKey.METADATA, 12, body))["topics"]
        if entry["error_code"] != 0:
            return {}
        return {p["partition_index"]: p["leader_id"] for p in entry["partitions"]}

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # (a thread of its own: the caller may be in a loop)
        return pool.submit(asyncio.run, ask()).result(timeout=30)


def leader(cluster: LocalCluster, topic: str) -> int:
    return describe(cluster, topic)[0].leader


def in_sync(cluster: LocalCluster, topic: str) -> list[int]:
    try:
        return sorted(describe(cluster, topic)[0].isrs)
    except KafkaException:
        return []


def read_all(cluster: LocalCluster, topic: str, expect: int, group: str) -> dict[tuple[int, int], bytes]:
    """(partition, offset) -> value of everything a consumer group reads, until `expect` records or a quiet spell."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen: dict[tuple[int, int], bytes] = {}
    deadline = time.monotonic() + SETTLE_S
    quiet_until = time.monotonic() + 10
    try:
        while time.monotonic() < deadline and (len(seen) < expect or time.monotonic() < quiet_until):
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            key = (msg.partition(), msg.offset())
            assert seen.get(key, msg.value()) == msg.value(), f"two values at {key}"
            seen[key] = msg.value()
            if len(seen) >= expect:
                quiet_until = min(quiet_until, time.monotonic() + 1)
    finally:
        consumer.close()
    return seen


class AckedProducer:
    """An idempotent producer writing unique values in a thread, recording where each acknowledged value landed."""

    def __init__(self, cluster: LocalCluster, topic: str, acks: str = "all", **conf: Any) -> None:
        self.producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "acks": acks,
                "enable.idempotence": acks == "all",
                "linger.ms": 2,
                "message.timeout.ms": 120_000,
                "topic.metadata.refresh.interval.ms": 1000,
                **conf,
            }
        )
        self.topic = topic
        #: values are unique across producers: `<prefix>-<sequence>`
        self.prefix = uuid.uuid4().hex[:8].encode()
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.failed: list[KafkaError] = []
        self.ack_times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.sent = 0

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.failed.append(err)
            return
        self.acked[msg.value()] = (msg.partition(), msg.offset())
        self.ack_times.append(time.monotonic())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                value = b"%s-%08d" % (self.prefix, self.sent)
                self.producer.produce(self.topic, value=value, on_delivery=self._delivered)
                self.sent += 1
            except BufferError:
                self.producer.poll(0.05)
                continue
            if self.sent % 20 == 0:
                self.producer.poll(0.01)  # about 2,000 records a second: load, not a flood to read back

    def __enter__(self) -> AckedProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(30)
            self.producer.flush(SETTLE_S)

    def acks_after(self, moment: float) -> int:
        return sum(1 for t in self.ack_times if t > moment)


def assert_every_ack_read_once(acked: dict[bytes, tuple[int, int]], seen: dict[tuple[int, int], bytes]) -> None:
    values = list(seen.values())
    distinct = set(values)
    assert len(values) == len(distinct), "a value was stored twice"
    lost = [v for v in acked if v not in distinct]
    assert not lost, f"{len(lost)} acknowledged values lost, e.g. {lost[:3]}"
    moved = [(v, at) for v, at in acked.items() if seen.get(at) != v]
    assert not moved, f"acknowledged values not at their offsets: {moved[:3]}"


def produce_one(cluster: LocalCluster, topic: str, acks: str) -> KafkaError | None:
    """One write's error (None: acknowledged)."""
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "acks": acks, "message.timeout.ms": 5000, "retries": 0}
    )
    errors: list[KafkaError | None] = []
    value = b"one-%s-%f" % (acks.encode(), time.monotonic())
    producer.produce(topic, value=value, partition=0, on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(15)
    assert errors, "no delivery report"
    return errors[0]


def partition_sizes(cluster: LocalCluster, node: int, topic: str, partitions: Sequence[int]) -> dict[int, int]:
    """Partition -> its size in broker `node`'s log directory (DescribeLogDirs: the bytes from its log start on),
    asked of that broker alone."""
    broker = next(b for b in cluster.brokers if b.node_id == node)
    host, port = broker.bootstrap.rsplit(":", 1)

    async def ask() -> dict[str, Any]:
        async with await RawKafkaClient.connect(host, int(port)) as client:
            body = {"topics": [{"topic": topic, "partitions": list(partitions)}]}
            return await client.call(ApiKey.DESCRIBE_LOG_DIRS, 4, body)

    resp = asyncio.run(ask())
    return {
        p["partition_index"]: p["partition_size"] for d in resp["results"] for t in d["topics"] for p in t["partitions"]
    }


def commitlog_bytes(engine: Any) -> bytes:
    """A started file engine's whole CommitLog, from its log start to its end."""
    out = bytearray()
    offset = engine.log_start
    while offset < engine.log_end:
        chunk = engine.read_log(offset, 1 << 20)
        out += chunk
        offset += len(chunk)
    return bytes(out)


# --- etcd keys, followed by a watch -------------------------------------------------------------------------------


class WatchedKeys:
    """Every key under `prefix` in etcd, by its name below the prefix, kept current by a watch (so a wait ends on
    the change it waits for, not on a poll); `deleted` keeps the revision that deleted each name last."""

    def __init__(self, endpoints: Sequence[tuple[str, int]], prefix: str) -> None:
        self.prefix = prefix
        self.meta = EtcdClient(endpoints)
        self.records: dict[str, Record] = {}
        self.deleted: dict[str, int] = {}
        self._synced = False
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.get_running_loop().create_task(self._follow())
        await self.until(lambda keys: keys._synced, f"the first listing of {self.prefix}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self.meta.close()

    async def _follow(self) -> None:
        async for event in self.meta.watch_prefix(self.prefix):
            if event.kind == "reset":
                self.records = {r.key[len(self.prefix) :]: r for r in event.records}
                self._synced = True
            elif event.kind in ("put", "delete"):
                assert event.record is not None
                name = event.record.key[len(self.prefix) :]
                if event.kind == "put":
                    self.records[name] = event.record
                else:
                    self.records.pop(name, None)
                    self.deleted[name] = event.revision
            async with self._changed:
                self._changed.notify_all()

    async def until(self, predicate: Callable[[Self], object], what: str, timeout: float = 60) -> None:  # noqa: ASYNC109 - a bound the failure names
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: predicate(self)), timeout)
            except TimeoutError:
                raise AssertionError(
                    f"timed out after {timeout} s waiting for {what}; keys now: {sorted(self.records)}"
                ) from None


# --- a TCP proxy for link faults ----------------------------------------------------------------------------------


class Proxy:
    """A TCP proxy in front of one listener, in a thread of its own: `delay` holds every chunk that long before
    passing it on; `hold()` keeps every chunk (both ways) until `release()`; `cut()` drops every connection and
    refuses new ones until `heal()`."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.delay = 0.0
        self.refusing = False
        #: connections refused while cut (what a test waits on to know the other side tried again)
        self.refused = 0
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    def hold(self) -> None:
        asyncio.run_coroutine_threadsafe(self._set_flowing(False), self._loop).result(10)

    def release(self) -> None:
        asyncio.run_coroutine_threadsafe(self._set_flowing(True), self._loop).result(10)

    async def _set_flowing(self, flowing: bool) -> None:
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            self.refused += 1
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                if self.delay:
                    await asyncio.sleep(self.delay)  # the injected fault: a slow link
                await self._flowing.wait()  # (a held link)
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()
            self._writers.discard(writer)

    def cut(self) -> None:
        self.refusing = True

        def close_all() -> None:
            for w in list(self._writers):
                w.transport.abort()

        self._loop.call_soon_threadsafe(close_all)

    def heal(self) -> None:
        self.refusing = False

    async def _shutdown(self) -> None:
        """Stop listening, drop every link and end every task of the proxy's loop, so nothing is left pending."""
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        self.refusing = True
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
