"""Kafka transactions (exactly-once) with real clients against mqk, on Kafka 4.x semantics.

confluent-kafka (librdkafka) carries most of it: commits and aborts interleaved over 3 topics x 4 partitions read
back read_committed (only the committed records, in order, at the offsets they were written at) and read_uncommitted
(aborted records too; control records never reach the application, yet each takes an offset); a consume-transform-
produce step whose `send_offsets_to_transaction` moves the group's committed offsets on commit only; fencing by a
second producer of the same transactional.id (fatal for the first, its open transaction aborted); the broker aborting
a transaction left open past its `transaction.timeout.ms` (the last stable offset held until then); a broker killed
-9 with transactions open, just committed, just aborted and committing (each all or nothing after the restart, the
open ones resolved by re-initialisation or timeout); a transaction timeout above the broker's maximum refused; and an
exactly-once loop (an app process killed -9 five times, the broker once) whose output holds each input record once.

aiokafka, kafkajs (compat/js/kafkajs_transactions.js) and kafka-python write transactions read by another client's
read_committed consumer, and aiokafka and kafkajs read confluent-kafka's transactions read_committed.

Every read ends at a known last record (a sentinel, or the last committed transaction), so what came before it is
final: a read never waits for "nothing more" and every wait has a deadline. Brokers with settings of their own
(the abort-check interval, the maximum transaction timeout) are started by the test that needs them, stopped by it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from compat_helpers import create_topic, end_offsets, hostport, run_node, unique
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from helpers import wait_until

from mqk.cluster_local import free_port
from mqk.testing import BrokerProcess

pytestmark = pytest.mark.timeout(120)

END = b"END"


def take_until_end(got: dict[int, list[bytes]], ended: set[int], partition: int, value: bytes) -> None:
    """Record a value read from a partition; END marks the partition's last record (nothing may follow it)."""
    assert partition not in ended, f"{value!r} after the last record"
    if value == END:
        ended.add(partition)
    else:
        got[partition].append(value)


#: the broker's abort check runs this often in the brokers of the timeout tests (Kafka's default is 10 s)
CHECK_INTERVAL_MS = 200
#: the broker-side maximum of transaction.timeout.ms in test_a_transaction_timeout_above_the_maximum_is_refused
MAX_TIMEOUT_MS = 60000


# --------------------------------------------------------------------------------------------------------------
# helpers


def address_of(bootstrap: str) -> tuple[str, int]:
    host, port = bootstrap.rsplit(":", 1)
    return host, int(port)


def stable_offsets(bootstrap: str, topic: str, partitions: Sequence[int] = (0,)) -> list[int]:
    """The partitions' last stable offsets: ListOffsets latest with isolation_level 1 (read_committed), over a plain
    connection (-1 for a partition answered with an error)."""
    from mqk.protocol.kafka.api import ApiKey
    from mqk.server.kafka.rawclient import RawKafkaClient

    async def ask() -> list[int]:
        async with await RawKafkaClient.connect(*address_of(bootstrap)) as client:
            answer = await client.call(
                ApiKey.LIST_OFFSETS,
                7,
                {
                    "replica_id": -1,
                    "isolation_level": 1,
                    "topics": [
                        {"name": topic, "partitions": [{"partition_index": p, "timestamp": -1} for p in partitions]}
                    ],
                },
            )
        return [p["offset"] if p["error_code"] == 0 else -1 for p in answer["topics"][0]["partitions"]]

    return asyncio.run(ask())


def high_watermarks(bootstrap: str, topic: str, partitions: Sequence[int] = (0,)) -> list[int]:
    return end_offsets(address_of(bootstrap), topic, tuple(partitions))


class Txn:
    """A confluent-kafka transactional producer (init_transactions done) that keeps the offset of each value it
    wrote (from its delivery reports) and every delivery error."""

    def __init__(self, bootstrap: str, txn_id: str | None = None, **conf: Any) -> None:
        self.txn_id = txn_id or unique("txn")
        self.offsets: dict[bytes, tuple[str, int, int]] = {}
        self.errors: list[Any] = []
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": self.txn_id,
                "linger.ms": 5,
                "reconnect.backoff.ms": 100,
                "reconnect.backoff.max.ms": 500,
                "retry.backoff.ms": 100,
                **conf,
            }
        )
        self.producer.init_transactions(20)

    def _report(self, err: Any, msg: Any) -> None:
        if err:
            self.errors.append(err)
        else:
            self.offsets[msg.value()] = (msg.topic(), msg.partition(), msg.offset())

    def write(self, records: Sequence[tuple[str, int, bytes]]) -> None:
        """begin_transaction, produce, and flush: the records are on the broker's log, the transaction open."""
        self.producer.begin_transaction()
        for topic, partition, value in records:
            self.producer.produce(topic, value, partition=partition, on_delivery=self._report)
        assert self.producer.flush(20) == 0, "records not delivered in 20 s"
        assert not self.errors, self.errors[:5]

    def run(self, records: Sequence[tuple[str, int, bytes]], commit: bool) -> None:
        """One whole transaction. An aborted one is flushed first, so its records are on the log (librdkafka purges
        what it has not sent yet when it aborts): read_committed must hide them, not just never get them."""
        self.write(records)
        if commit:
            self.producer.commit_transaction(20)
        else:
            self.producer.abort_transaction(20)
        assert not self.errors, self.errors[:5]


def produce_plain(bootstrap: str, records: Sequence[tuple[str, int, bytes]]) -> None:
    """Non-transactional records (acks=all), flushed."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    errors: list[Any] = []
    for topic, partition, value in records:
        producer.produce(topic, value, partition=partition, on_delivery=lambda err, _m: err and errors.append(err))
        if len(producer) > 50_000:
            producer.poll(0.1)
    assert producer.flush(60) == 0, "plain records not delivered in 60 s"
    assert not errors, errors[:5]


Read = dict[tuple[str, int], list[tuple[int, bytes]]]


def read_until(
    bootstrap: str,
    partitions: Sequence[tuple[str, int]],
    isolation: str,
    last: Callable[[bytes], bool] = lambda v: v == END,
    timeout: float = 30,
) -> Read:
    """Read each (topic, partition) from its beginning with confluent-kafka at `isolation` until a record for
    which `last(value)` holds; returns each partition's (offset, value) before it. Nothing may follow that record."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("txn-read"),
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "fetch.wait.max.ms": 100,
        }
    )
    seen: Read = {tp: [] for tp in partitions}
    ended: set[tuple[str, int]] = set()
    try:
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in partitions])
        deadline = time.monotonic() + timeout
        while len(ended) < len(partitions) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=0.2):
                assert msg.error() is None, msg.error()
                key = (msg.topic(), msg.partition())
                assert key not in ended, f"{isolation}: {msg.value()!r} at {msg.offset()} after the last record"
                if last(msg.value()):
                    ended.add(key)
                else:
                    seen[key].append((msg.offset(), msg.value()))
    finally:
        consumer.close()
    missing = sorted(set(partitions) - ended)
    assert not missing, (
        f"{isolation}: the last record never came on {missing} within {timeout} s; read so far: "
        f"{ {f'{t}-{p}': [v for _o, v in seen[(t, p)]][-5:] for t, p in missing} }"
    )
    return seen


def values(read: Read) -> dict[tuple[str, int], list[bytes]]:
    return {tp: [v for _o, v in recs] for tp, recs in read.items()}


def broker_settings(directory: Path, settings: str, storage: str) -> tuple[str, ...]:
    """Write a broker TOML file (top-level `settings`, and the file_broker fixture's small store for a file store)
    and return the arguments that pass it, with every listener on a fixed free port so a restart comes back on the
    same addresses (as the file_broker fixture does)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "broker.toml"
    store = "[store]\ncommitlog_segment_bytes = 16777216\ncq_units_per_file = 10000\n" if storage == "file" else ""
    config.write_text(settings + "\n" + store)
    ports = [free_port() for _ in range(4)]
    return (
        "--config", str(config),
        "--kafka-listen", f"127.0.0.1:{ports[0]}",
        "--native-listen", f"127.0.0.1:{ports[1]}",
        "--namesrv-listen", f"127.0.0.1:{ports[2]}",
        "--admin-listen", f"127.0.0.1:{ports[3]}",
    )  # fmt: skip


@contextlib.contextmanager
def own_broker(directory: Path, settings: str, storage: str = "memory") -> Iterator[BrokerProcess]:
    """A `mqk serve` of the test's own with `settings` in its config file; stopped (killed if it will not stop)."""
    broker = BrokerProcess(
        directory / "data", storage=storage, extra_args=broker_settings(directory, settings, storage)
    )
    broker.start()
    try:
        yield broker
    finally:
        try:
            broker.stop()
        except Exception:  # noqa: BLE001 - teardown must not mask the test's own failure
            broker.kill()


def log_tail(broker: Any, lines: int = 40) -> str:
    return "\n".join(broker.log_text().splitlines()[-lines:])


def bounded(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    """Run a blocking client call that takes no timeout of its own (kafka-python's transactions) in a thread, and
    fail the test if it has not returned within `timeout` s."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = exc

    worker = threading.Thread(target=run, name=f"bounded {what}", daemon=True)
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), f"{what} did not return within {timeout} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


# --------------------------------------------------------------------------------------------------------------
# 1. commits and aborts interleaved across topics and partitions


def test_read_committed_sees_exactly_the_committed_transactions_across_topics(bootstrap: str) -> None:
    topics = [unique("txn-multi") for _ in range(3)]
    for t in topics:
        create_topic(bootstrap, t, 4)
    partitions = [(t, p) for t in topics for p in range(4)]
    outcomes = [True, False, True, True, False, True, False, False, True]  # commit / abort, in order
    txn = Txn(bootstrap)
    committed: dict[tuple[str, int], list[bytes]] = {tp: [] for tp in partitions}
    written: dict[tuple[str, int], list[bytes]] = {tp: [] for tp in partitions}
    markers = collections.Counter[tuple[str, int]]()
    for i, commit in enumerate(outcomes):
        # each transaction writes to 8 of the 12 partitions, a different 8 each time
        touched = [tp for n, tp in enumerate(partitions) if (n + i) % 3 != 0]
        records = [(t, p, f"txn{i}-{t}-{p}-{j}".encode()) for t, p in touched for j in range(3)]
        txn.run(records, commit)
        for t, p, v in records:
            written[(t, p)].append(v)
            if commit:
                committed[(t, p)].append(v)
        markers.update(touched)
    txn.run([(t, p, END) for t, p in partitions], commit=True)  # the last committed transaction ends the reads
    markers.update(partitions)

    read_committed = read_until(bootstrap, partitions, "read_committed")
    read_uncommitted = read_until(bootstrap, partitions, "read_uncommitted")
    assert values(read_committed) == committed
    assert values(read_uncommitted) == written
    for tp in partitions:
        # a committed record is read at the offset it was written at, whatever the isolation level
        assert set(read_committed[tp]) <= set(read_uncommitted[tp]), tp
        assert [o for o, _v in read_uncommitted[tp]] == sorted(o for o, _v in read_uncommitted[tp]), tp
    # Each transaction wrote one control record (its commit or abort marker) to each partition it touched: each
    # takes an offset, none is returned to the application.
    for t in topics:
        ends = high_watermarks(bootstrap, t, range(4))
        expected = [len(written[(t, p)]) + 1 + markers[(t, p)] for p in range(4)]
        assert ends == expected, f"{t}: end offsets {ends}, expected records + END + one marker a transaction"
        assert stable_offsets(bootstrap, t, range(4)) == ends, "nothing is open: the last stable offset is the end"


# --------------------------------------------------------------------------------------------------------------
# 2. consume-transform-produce: the group's offsets move with the transaction


def test_send_offsets_to_transaction_moves_group_offsets_on_commit_only(bootstrap: str) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions

    src, dst, group = unique("ctp-in"), unique("ctp-out"), unique("ctp-group")
    create_topic(bootstrap, src, 2)
    create_topic(bootstrap, dst, 2)
    produce_plain(bootstrap, [(src, i % 2, f"in-{i}".encode()) for i in range(60)])
    txn = Txn(bootstrap)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
        }
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tps = [TopicPartition(src, 0), TopicPartition(src, 1)]
    nothing = {0: -1001, 1: -1001}  # OFFSET_INVALID: no committed offset
    positions: dict[int, int] = {}  # the next offset to process, per partition consumed from

    def group_offsets() -> dict[int, int]:
        """The group's committed offsets as OffsetFetch without require_stable answers them: an open
        transaction's offsets are not among them."""
        listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, tps)])[group].result(15)
        return {tp.partition: tp.offset for tp in listed.topic_partitions}

    def take(n: int) -> list[Any]:
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=n - len(got), timeout=0.2):
                assert msg.error() is None, msg.error()
                got.append(msg)
                positions[msg.partition()] = msg.offset() + 1
        assert len(got) == n, f"consumed {len(got)} of {n} records in 30 s"
        return got

    def transform(msgs: list[Any], commit: bool) -> tuple[dict[int, int], dict[int, int]]:
        """Produce each record transformed, send the positions with the transaction, commit or abort. Returns the
        offsets sent and the group's offsets seen while the transaction was open (after they were sent)."""
        txn.producer.begin_transaction()
        for m in msgs:
            txn.producer.produce(dst, b"out-" + m.value(), partition=m.partition(), on_delivery=txn._report)
        assert txn.producer.flush(20) == 0
        sent = dict(positions)
        offsets = [TopicPartition(src, p, o) for p, o in sent.items()]
        txn.producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 20)
        pending = group_offsets()
        if commit:
            txn.producer.commit_transaction(20)
        else:
            txn.producer.abort_transaction(20)
        assert not txn.errors, txn.errors[:5]
        return sent, pending

    try:
        consumer.subscribe([src])
        first = take(20)
        after_first, pending = transform(first, commit=True)
        assert sum(after_first.values()) == 20, after_first
        assert pending == nothing, "the offsets were committed before the transaction"
        assert group_offsets() == {**nothing, **after_first}

        second = take(20)
        after_second, pending = transform(second, commit=False)
        assert sum(after_second.values()) == 40, after_second
        assert pending == {**nothing, **after_first}, "the offsets moved before the transaction ended"
        assert group_offsets() == {**nothing, **after_first}, "an aborted transaction's offsets were committed"

        # The application rewinds to the committed offsets and does the work again, in a committed transaction.
        rewound = {p: after_first.get(p, 0) for p in (0, 1)}
        for p, offset in rewound.items():
            consumer.seek(TopicPartition(src, p, offset))
        positions.clear()
        positions.update(after_first)
        again = take(20)
        for p in (0, 1):
            offsets = [m.offset() for m in again if m.partition() == p]
            assert not offsets or offsets[0] == rewound[p], (p, offsets, rewound)
        after_again, pending = transform(again, commit=True)
        assert pending == {**nothing, **after_first}
        assert group_offsets() == {**nothing, **after_again}
        # read_committed, so with require_stable: the consumer's own view of the group's offsets
        assert {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=15)} == {**nothing, **after_again}
    finally:
        consumer.close()

    produce_plain(bootstrap, [(dst, 0, END), (dst, 1, END)])
    out = values(read_until(bootstrap, [(dst, 0), (dst, 1)], "read_committed"))
    produced = collections.Counter(v for vs in out.values() for v in vs)
    expected = collections.Counter(b"out-" + m.value() for m in first + again)
    assert produced == expected, "the committed output is not each consumed record transformed once"
    everything = values(read_until(bootstrap, [(dst, 0), (dst, 1)], "read_uncommitted"))
    assert sum(map(len, everything.values())) == 60, "the aborted transaction's output was not on the log"


# --------------------------------------------------------------------------------------------------------------
# 3. fencing


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, 2)
    txn_id = unique("fenced")
    first = Txn(bootstrap, txn_id)
    first.run([(topic, 0, b"before-0"), (topic, 1, b"before-1")], commit=True)
    first.write([(topic, 0, b"first-open")])  # open, its record on the log

    second = Txn(bootstrap, txn_id)  # init_transactions: the first is fenced, its open transaction aborted

    # The first producer goes on: a partition its transaction has not touched yet, then commit.
    first.producer.produce(topic, b"first-after", partition=1, on_delivery=first._report)
    with pytest.raises(KafkaException) as raised:
        first.producer.commit_transaction(20)
    err = raised.value.args[0]
    assert err.fatal() or err.code() == KafkaError._FENCED, f"not a fatal error: {err!r}"

    second.run([(topic, 0, b"second-0"), (topic, 1, b"second-1")], commit=True)
    is_last = lambda v: v.startswith(b"second-")
    committed = values(read_until(bootstrap, [(topic, 0), (topic, 1)], "read_committed", is_last))
    assert committed == {(topic, 0): [b"before-0"], (topic, 1): [b"before-1"]}
    uncommitted = values(read_until(bootstrap, [(topic, 0), (topic, 1)], "read_uncommitted", is_last))
    assert b"first-open" in uncommitted[(topic, 0)], "the fenced transaction's record was never on the log"


# --------------------------------------------------------------------------------------------------------------
# 4. exactly once under kill -9

N_RECORDS = 100_000
EOS_PARTITIONS = 4
EOS_BATCH = 1000

#: The exactly-once application: read_committed from `src` (partitions assigned, offsets from the group's committed
#: ones, which a read_committed consumer asks with require_stable), each record to the same partition of `dst` in a
#: transaction with the consumed offsets, about EOS_BATCH records a transaction; any error ends it (non-zero), and
#: the test starts it again. It prints its progress (records consumed) at three moments of each transaction:
#: "produced" (half the records produced and flushed: on the log, the transaction open), "committing" (the offsets
#: sent with the transaction, not committed) and "committed". At the moments the test names in its last argument
#: (JSON [[moment, progress from which], ...], in order) it stops itself (SIGSTOP) right after printing, so the
#: test's kill -9 lands exactly there, not some time later.
EOS_APP = r"""
import json, os, signal, sys
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

bootstrap, src, dst, group, txn_id = sys.argv[1:6]
partitions, batch, stops = int(sys.argv[6]), int(sys.argv[7]), json.loads(sys.argv[8])
# No re-bootstrap when the (only) broker is down: librdkafka 2.16 decommissions the broker then, and a
# send_offsets_to_transaction whose group coordinator was decommissioned hangs past its timeout (librdkafka
# issues #5511 and #5456, open), as it would against a one-broker Kafka.
backoff = {"reconnect.backoff.ms": 100, "reconnect.backoff.max.ms": 500, "metadata.recovery.strategy": "none"}


def say(moment, progress):
    print(f"{moment} {progress}", flush=True)
    if stops and stops[0][0] == moment and progress >= stops[0][1]:
        stops.pop(0)
        os.kill(os.getpid(), signal.SIGSTOP)


producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5,
                     "transaction.timeout.ms": 30000, "retry.backoff.ms": 100, **backoff})
producer.init_transactions(60)  # fences an earlier instance and resolves its transaction first
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                     "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                     "fetch.wait.max.ms": 50, **backoff})
tps = [TopicPartition(src, p) for p in range(partitions)]
nxt = {tp.partition: max(tp.offset, 0) for tp in consumer.committed(tps, timeout=60)}
ends = {p: consumer.get_watermark_offsets(TopicPartition(src, p), timeout=30)[1] for p in range(partitions)}
consumer.assign([TopicPartition(src, p, nxt[p]) for p in range(partitions)])
print(f"started {sum(nxt.values())}", flush=True)
while any(nxt[p] < ends[p] for p in nxt):
    msgs = consumer.consume(num_messages=batch, timeout=1.0)
    if not msgs:
        continue
    producer.begin_transaction()
    for i, m in enumerate(msgs):
        if m.error():
            raise KafkaException(m.error())
        producer.produce(dst, m.value(), key=m.key(), partition=m.partition())
        nxt[m.partition()] = m.offset() + 1
        if i == len(msgs) // 2:
            if producer.flush(60):
                raise RuntimeError("records not delivered in 60 s")
            say("produced", sum(nxt.values()))
    offsets = [TopicPartition(src, p, o) for p, o in nxt.items()]
    producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 60)
    say("committing", sum(nxt.values()))
    producer.commit_transaction(60)
    say("committed", sum(nxt.values()))
consumer.close()
print(f"done {sum(nxt.values())}", flush=True)
"""


class App:
    """One run of EOS_APP; its stdout lines go to `events` as (run, line), then (run, None) at EOF."""

    def __init__(self, script: Path, args: Sequence[str], run: int, events: queue.Queue, log: Path) -> None:
        self.run = run
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=err, text=True
            )
        self.reader = threading.Thread(target=self._read, args=(events,), daemon=True)
        self.reader.start()

    def _read(self, events: queue.Queue) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            events.put((self.run, line.strip()))
        events.put((self.run, None))

    def stopped(self) -> bool:
        """Whether the process is stopped (SIGSTOP): its state in /proc/PID/stat is T."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.mark.timeout(150)
def test_exactly_once_through_app_and_broker_kill_9(file_broker: Any, tmp_path: Path) -> None:
    """100,000 records through a read-process-write app (transactions of ~1000 records with their consumed
    offsets). The app is killed -9 five times, at each moment of a transaction: open with records on the log, with
    its offsets sent but not committed, just committed; it is started again each time (its init_transactions aborts
    what the killed one left open). The broker is killed -9 once, while the app holds a transaction open with its
    offsets sent, and started again on its data; the app then commits that transaction. The output, read_committed,
    holds each input record exactly once, in the input's order per partition, and the group's committed offsets are
    the input's ends; read_uncommitted, it also holds what the killed transactions wrote (the aborts were real)."""
    bootstrap = hostport(file_broker.bootstrap)
    src, dst, group, txn_id = unique("eos-in"), unique("eos-out"), unique("eos-group"), unique("eos-app")
    create_topic(bootstrap, src, EOS_PARTITIONS)
    create_topic(bootstrap, dst, EOS_PARTITIONS)
    inputs = {p: [b"%d" % i for i in range(p, N_RECORDS, EOS_PARTITIONS)] for p in range(EOS_PARTITIONS)}
    produce_plain(bootstrap, [(src, p, v) for p in range(EOS_PARTITIONS) for v in inputs[p]])

    script = tmp_path / "eos_app.py"
    script.write_text(EOS_APP)
    log = tmp_path / "eos_app.log"
    # (the moment, the progress from which to take it, what to kill)
    plan = [
        ("produced", 10_000, "app"),
        ("committing", 25_000, "app"),
        ("committed", 40_000, "app"),
        ("committing", 50_000, "broker"),
        ("produced", 65_000, "app"),
        ("committing", 80_000, "app"),
    ]
    events: queue.Queue = queue.Queue()
    runs = 0

    def start() -> App:
        stops = json.dumps([[moment, progress] for moment, progress, _target in plan])
        args = (bootstrap, src, dst, group, txn_id, str(EOS_PARTITIONS), str(EOS_BATCH), stops)
        return App(script, args, runs, events, log)

    app = start()
    killed: list[str] = []
    crashes = 0
    deadline = time.monotonic() + 90
    try:
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"the app did not finish in 90 s; kills so far {killed}, own exits {crashes}"
            try:
                run, line = events.get(timeout=min(remaining, 5))
            except queue.Empty:
                continue
            if run != app.run:
                continue  # the last lines of a run already killed
            if line is None:  # the app ended on its own
                code = app.proc.wait(10)
                app.kill()  # (closes its pipe)
                if code == 0:
                    break
                crashes += 1
                assert crashes <= 10, f"the app keeps failing (exit {code}); see {log}"
                runs += 1
                app = start()
                continue
            moment, progress = line.split()
            if not plan or moment != plan[0][0] or int(progress) < plan[0][1]:
                continue
            # the app stops itself right after this line
            _moment, _from, target = plan.pop(0)
            killed.append(f"{target} at {moment} {progress}")
            wait_until(app.stopped, 10, f"the app to stop at {moment} {progress}")
            if target == "broker":
                file_broker.restart(kill=True)  # same data directory, same ports
                os.kill(app.proc.pid, signal.SIGCONT)
            else:
                app.kill()
                runs += 1
                app = start()
    finally:
        app.kill()
    assert not plan, f"the app finished before every kill: done {killed}, left {plan}"

    produce_plain(bootstrap, [(dst, p, END) for p in range(EOS_PARTITIONS)])
    partitions = [(dst, p) for p in range(EOS_PARTITIONS)]
    out = values(read_until(bootstrap, partitions, "read_committed", timeout=60))
    for p in range(EOS_PARTITIONS):
        got = out[(dst, p)]
        if got != inputs[p]:
            counts = collections.Counter(got)
            duplicated = sorted(int(v) for v, n in counts.items() if n > 1)
            lost = sorted(int(v) for v in set(inputs[p]) - set(counts))
            raise AssertionError(
                f"partition {p}: {len(got)} records for {len(inputs[p])} inputs; duplicated {duplicated[:10]} "
                f"({len(duplicated)}), lost {lost[:10]} ({len(lost)}); kills {killed}, own exits {crashes}"
            )
    everything = values(read_until(bootstrap, partitions, "read_uncommitted", timeout=60))
    # each of the four kills after "produced" or "committing" left at least half a transaction on the log
    assert sum(map(len, everything.values())) >= N_RECORDS + 4 * EOS_BATCH // 2, "the killed transactions wrote nothing"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    from confluent_kafka import ConsumerGroupTopicPartitions

    request = ConsumerGroupTopicPartitions(group, [TopicPartition(src, p) for p in range(EOS_PARTITIONS)])
    listed = admin.list_consumer_group_offsets([request])[group].result(15)
    assert {tp.partition: tp.offset for tp in listed.topic_partitions} == {
        p: len(inputs[p]) for p in range(EOS_PARTITIONS)
    }


# --------------------------------------------------------------------------------------------------------------
# 5. the broker aborts a transaction left open past its timeout

HUNG_PRODUCER = r"""
import os, sys, time
from confluent_kafka import Producer

bootstrap, topic, txn_id = sys.argv[1:4]
errors = []
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "transaction.timeout.ms": 3000,
                     "linger.ms": 0})
producer.init_transactions(20)
began = time.monotonic()  # (CLOCK_MONOTONIC: the test process reads the same clock)
producer.begin_transaction()
for i in range(10):
    producer.produce(topic, b"hung-%d" % i, partition=0, on_delivery=lambda err, msg: err and errors.append(err))
remaining = producer.flush(20)
print(f"ready {remaining} {errors} {began}", flush=True)
os._exit(0 if remaining == 0 and not errors else 2)  # no EndTxn, nothing: the transaction is left open
"""


def test_the_broker_aborts_a_transaction_left_open_past_its_timeout(tmp_path: Path, topic: str) -> None:
    settings = f"transaction_abort_timed_out_transaction_cleanup_interval_ms = {CHECK_INTERVAL_MS}"
    with own_broker(tmp_path / "broker", settings) as broker:
        bootstrap = broker.bootstrap
        create_topic(bootstrap, topic, 1)
        later = Txn(bootstrap)  # another producer, ready before the hung one starts
        hung_id = unique("hung")
        script = tmp_path / "hung.py"
        script.write_text(HUNG_PRODUCER)
        done = subprocess.run(
            [sys.executable, str(script), bootstrap, topic, hung_id], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0 and done.stdout.startswith("ready 0 []"), (done.stdout, done.stderr[-2000:])
        began = float(done.stdout.split()[-1])
        held = stable_offsets(bootstrap, topic)[0]
        end = high_watermarks(bootstrap, topic)[0]
        if time.monotonic() - began < 2.5:  # both read well inside the 3 s timeout
            assert held == 0, f"the open transaction does not hold the last stable offset: {held}"
            assert end == 10  # its ten records
        else:  # a machine slow enough that the timeout may have run out: its abort marker may follow the ten
            assert end in (10, 11), end

        later.run([(topic, 0, b"after-%d" % i) for i in range(5)], commit=True)
        # hung-0..9 at 0-9, after-0..4 at 10-14, their commit marker at 15, then the timeout's abort marker: 16 (or,
        # if the timeout ran out first, the abort marker at 10 and the rest one later): the end is 17 either way
        wait_until(
            lambda: stable_offsets(bootstrap, topic)[0] == high_watermarks(bootstrap, topic)[0] == 17,
            15,
            "the broker to abort the timed-out transaction (last stable offset = end offset = 17)",
        )
        is_last = lambda v: v == b"after-4"
        committed = values(read_until(bootstrap, [(topic, 0)], "read_committed", is_last))
        assert committed == {(topic, 0): [b"after-%d" % i for i in range(4)]}

        # The timed-out producer's id can be initialised again, and commits.
        again = Txn(bootstrap, hung_id)
        again.run([(topic, 0, END)], commit=True)
        committed = values(read_until(bootstrap, [(topic, 0)], "read_committed"))
        assert committed == {(topic, 0): [b"after-%d" % i for i in range(5)]}, log_tail(broker)


# --------------------------------------------------------------------------------------------------------------
# 6. broker kill -9 with transactions in every state


def test_broker_kill_9_leaves_each_transaction_all_or_nothing(tmp_path: Path, topic: str) -> None:
    """Before the kill: a committed, an aborted and a committed-just-before transaction; two left open (B, and C
    with a 4 s timeout); F's commit_transaction racing the kill. After the restart: B is still open (it holds the
    last stable offset) until a new producer of its id initialises, C is aborted by its timeout, F is committed on
    all three partitions or on none, and read_committed shows only the committed ones."""
    settings = f"transaction_abort_timed_out_transaction_cleanup_interval_ms = {CHECK_INTERVAL_MS}"
    with own_broker(tmp_path / "broker", settings, storage="file") as broker:
        bootstrap = broker.bootstrap
        create_topic(bootstrap, topic, 3)
        every = [0, 1, 2]

        def records(name: str, parts: Sequence[int]) -> list[tuple[str, int, bytes]]:
            return [(topic, p, f"{name}-{p}-{j}".encode()) for p in parts for j in range(3)]

        Txn(bootstrap).run(records("a", every), commit=True)
        Txn(bootstrap).run(records("e", every), commit=False)
        Txn(bootstrap).run(records("d", every), commit=True)
        b = Txn(bootstrap)
        b.write(records("b", [0, 1]))
        c = Txn(bootstrap, **{"transaction.timeout.ms": 4000})
        c.write(records("c", [1, 2]))
        f = Txn(bootstrap)
        f.write(records("f", every))
        outcome: dict[str, Any] = {}

        def commit_f() -> None:
            try:
                f.producer.commit_transaction(30)
                outcome["committed"] = True
            except KafkaException as exc:
                outcome["error"] = exc.args[0]

        committer = threading.Thread(target=commit_f, name="commit-f", daemon=True)
        committer.start()
        broker.restart(kill=True)  # same data directory and ports
        assert broker.bootstrap == bootstrap
        committer.join(40)
        assert not committer.is_alive(), "commit_transaction(30) did not return"

        # B's transaction outlived the restart, still open: it holds the last stable offset of partition 0.
        b_first = min(offset for _t, p, offset in b.offsets.values() if p == 0)
        assert stable_offsets(bootstrap, topic, [0])[0] <= b_first, "B's open transaction was lost in the restart"
        b2 = Txn(bootstrap, b.txn_id)  # aborts B's transaction
        if "committed" not in outcome:
            Txn(bootstrap, f.txn_id)  # F's commit failed on the client: a new producer resolves its transaction
        b2.run(records("b2", every), commit=True)
        wait_until(
            lambda: stable_offsets(bootstrap, topic, every) == high_watermarks(bootstrap, topic, every),
            20,
            "every open transaction to be resolved (C by its 4 s timeout)",
        )
        produce_plain(bootstrap, [(topic, p, END) for p in every])
        committed = values(read_until(bootstrap, [(topic, p) for p in every], "read_committed"))
        uncommitted = values(read_until(bootstrap, [(topic, p) for p in every], "read_uncommitted"))

        def names(vs: list[bytes]) -> list[str]:
            return [v.split(b"-")[0].decode() for v in vs]

        f_parts = [p for p in every if b"f-%d-0" % p in committed[(topic, p)]]
        assert f_parts in ([], every), f"F is committed on partitions {f_parts} only"
        if outcome.get("committed"):
            assert f_parts == every, "F's commit_transaction returned, yet F is not committed"
        f_in = ["f"] if f_parts else []
        for p in every:
            expected = ["a", "d", *f_in, "b2"]
            assert sorted(set(names(committed[(topic, p)]))) == sorted(expected), (p, committed[(topic, p)])
            assert names(committed[(topic, p)]) == [n for n in names(uncommitted[(topic, p)]) if n in expected], p
            # what was aborted (E by the client, B by re-initialisation, C by timeout) was on the log
            on_log = set(names(uncommitted[(topic, p)]))
            assert {"e"} | ({"b"} if p in (0, 1) else set()) | ({"c"} if p in (1, 2) else set()) <= on_log, on_log


# --------------------------------------------------------------------------------------------------------------
# 7. aiokafka


async def test_aiokafka_transactions_read_by_confluent_read_committed(bootstrap: str, topic: str) -> None:
    from aiokafka import AIOKafkaProducer

    await asyncio.to_thread(create_topic, bootstrap, topic, 2)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("aio-txn"), linger_ms=5)
    await asyncio.wait_for(producer.start(), 30)  # InitProducerId with the transactional id
    committed: dict[tuple[str, int], list[bytes]] = {(topic, 0): [], (topic, 1): []}
    try:
        for i, commit in enumerate([True, False, True, False]):
            await producer.begin_transaction()
            batch = [(p, b"aio%d-%d-%d" % (i, p, j)) for p in (0, 1) for j in range(3)]
            # each send awaited: the aborted records are on the log before the EndTxn
            await asyncio.gather(*[await producer.send(topic, v, partition=p) for p, v in batch])
            if commit:
                await asyncio.wait_for(producer.commit_transaction(), 20)
                for p, v in batch:
                    committed[(topic, p)].append(v)
            else:
                await asyncio.wait_for(producer.abort_transaction(), 20)
        async with producer.transaction():
            await asyncio.gather(*[await producer.send(topic, END, partition=p) for p in (0, 1)])
    finally:
        await producer.stop()
    got = await asyncio.to_thread(read_until, bootstrap, [(topic, 0), (topic, 1)], "read_committed")
    assert values(got) == committed
    everything = await asyncio.to_thread(read_until, bootstrap, [(topic, 0), (topic, 1)], "read_uncommitted")
    assert sum(map(len, everything.values())) == 24


async def test_aiokafka_read_committed_reads_confluent_transactions(bootstrap: str, topic: str) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTopicPartition

    def write() -> dict[int, list[bytes]]:
        create_topic(bootstrap, topic, 2)
        txn = Txn(bootstrap)
        committed: dict[int, list[bytes]] = {0: [], 1: []}
        for i, commit in enumerate([False, True, False, True, True, False]):
            records = [(topic, p, b"ck%d-%d-%d" % (i, p, j)) for p in (0, 1) for j in range(4)]
            txn.run(records, commit)
            if commit:
                for _t, p, v in records:
                    committed[p].append(v)
        txn.run([(topic, 0, END), (topic, 1, END)], commit=True)
        return committed

    committed = await asyncio.to_thread(write)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False, fetch_max_wait_ms=100
    )
    await consumer.start()
    got: dict[int, list[bytes]] = {0: [], 1: []}
    ended: set[int] = set()
    try:
        tps = [AioTopicPartition(topic, 0), AioTopicPartition(topic, 1)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + 30
        while len(ended) < 2 and time.monotonic() < deadline:
            for tp, recs in (await consumer.getmany(timeout_ms=200)).items():
                for rec in recs:
                    take_until_end(got, ended, tp.partition, rec.value)
    finally:
        await consumer.stop()
    assert ended == {0, 1}, f"the last committed transaction never came (read: {got})"
    assert got == committed


# --------------------------------------------------------------------------------------------------------------
# 8. kafkajs


def kafkajs(bootstrap: str, command: str, timeout: float = 60, **options: Any) -> Any:
    return run_node("kafkajs_transactions.js", bootstrap, command, json.dumps(options), timeout=timeout)["result"]


def test_kafkajs_transactions_read_by_confluent_read_committed(bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, 2)
    plan = [
        {"commit": commit, "messages": [{"partition": p, "value": f"js{i}-{p}-{j}"} for p in (0, 1) for j in range(3)]}
        for i, commit in enumerate([True, False, False, True, True, False])
    ]
    plan.append({"commit": True, "messages": [{"partition": p, "value": END.decode()} for p in (0, 1)]})
    sent = kafkajs(bootstrap, "produce", topic=topic, transactionalId=unique("js-txn"), transactions=plan)["sent"]
    assert all(r["errorCode"] == 0 for t in sent for r in t), sent
    expected = {
        (topic, p): [
            m["value"].encode() for t in plan[:-1] if t["commit"] for m in t["messages"] if m["partition"] == p
        ]
        for p in (0, 1)
    }
    assert values(read_until(bootstrap, [(topic, 0), (topic, 1)], "read_committed")) == expected
    everything = values(read_until(bootstrap, [(topic, 0), (topic, 1)], "read_uncommitted"))
    assert sum(map(len, everything.values())) == 6 * 6, "the aborted transactions' records were not on the log"


def test_kafkajs_read_committed_reads_confluent_transactions(bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, 2)
    txn = Txn(bootstrap)
    committed: dict[int, list[str]] = {0: [], 1: []}
    written: dict[int, list[str]] = {0: [], 1: []}
    for i, commit in enumerate([True, False, True, False, False, True]):
        records = [(topic, p, b"cj%d-%d-%d" % (i, p, j)) for p in (0, 1) for j in range(3)]
        txn.run(records, commit)
        for _t, p, v in records:
            written[p].append(v.decode())
            if commit:
                committed[p].append(v.decode())
    txn.run([(topic, 0, END), (topic, 1, END)], commit=True)

    def by_partition(got: list[dict[str, Any]]) -> dict[int, list[str]]:
        out: dict[int, list[tuple[int, str]]] = {0: [], 1: []}
        for m in got:
            if m["value"] != END.decode():
                out[m["partition"]].append((m["offset"], m["value"]))
        return {p: [v for _o, v in sorted(recs)] for p, recs in out.items()}

    common = {"topic": topic, "partitions": 2, "sentinel": END.decode()}
    got = kafkajs(bootstrap, "consume", readUncommitted=False, **common)["got"]
    assert by_partition(got) == committed
    got = kafkajs(bootstrap, "consume", readUncommitted=True, **common)["got"]
    assert by_partition(got) == written


# --------------------------------------------------------------------------------------------------------------
# 9. kafka-python


def test_kafka_python_transactions_read_committed(bootstrap: str, topic: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KpTopicPartition

    create_topic(bootstrap, topic, 2)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=unique("kp-txn"), linger_ms=5, max_block_ms=20000
    )
    committed: dict[int, list[bytes]] = {0: [], 1: []}
    try:
        bounded(producer.init_transactions, 30, "init_transactions")
        for i, commit in enumerate([True, False, True, False, True]):
            producer.begin_transaction()
            batch = [(p, b"kp%d-%d-%d" % (i, p, j)) for p in (0, 1) for j in range(3)]
            futures = [producer.send(topic, v, partition=p) for p, v in batch]
            bounded(lambda fs=futures: [f.get(timeout=20) for f in fs], 30, "the records' delivery")
            bounded(producer.commit_transaction if commit else producer.abort_transaction, 30, "the end of a txn")
            if commit:
                for p, v in batch:
                    committed[p].append(v)
        producer.begin_transaction()
        for p in (0, 1):
            producer.send(topic, END, partition=p)
        bounded(producer.commit_transaction, 30, "the last commit")
    finally:
        producer.close(timeout=10)

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False, fetch_max_wait_ms=100
    )
    got: dict[int, list[bytes]] = {0: [], 1: []}
    ended: set[int] = set()
    try:
        tps = [KpTopicPartition(topic, 0), KpTopicPartition(topic, 1)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + 30
        while len(ended) < 2 and time.monotonic() < deadline:
            for tp, recs in consumer.poll(timeout_ms=200).items():
                for rec in recs:
                    take_until_end(got, ended, tp.partition, rec.value)
    finally:
        consumer.close()
    assert ended == {0, 1}, f"the last committed transaction never came (read: {got})"
    assert got == committed
    everything = values(read_until(bootstrap, [(topic, 0), (topic, 1)], "read_uncommitted"))
    assert sum(map(len, everything.values())) == 30, "the aborted transactions' records were not on the log"


# --------------------------------------------------------------------------------------------------------------
# 10. the broker's maximum transaction timeout


def test_a_transaction_timeout_above_the_maximum_is_refused(tmp_path: Path, topic: str) -> None:
    with own_broker(tmp_path / "broker", f"transaction_max_timeout_ms = {MAX_TIMEOUT_MS}") as broker:
        bootstrap = broker.bootstrap
        with pytest.raises(KafkaException) as raised:
            Txn(bootstrap, **{"transaction.timeout.ms": MAX_TIMEOUT_MS * 2})
        assert raised.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT, raised.value.args[0]
        # the maximum itself is allowed
        create_topic(bootstrap, topic, 1)
        at_max = Txn(bootstrap, **{"transaction.timeout.ms": MAX_TIMEOUT_MS})
        at_max.run([(topic, 0, END)], commit=True)
        assert values(read_until(bootstrap, [(topic, 0)], "read_committed")) == {(topic, 0): []}
