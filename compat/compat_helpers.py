"""Helpers shared by the compat tests: unique names, topic creation, the node script runner and the consumer-group
rebalance scenario every Kafka client runs the same way.

A helper module, not a test module: compat's tests import it by name (compat/ is on sys.path under pytest's default
import mode), and it takes what the whole suite shares (`wait_until`, the one poller) from tests/helpers.py.
compat/conftest.py keeps compat's own fixtures (the broker subprocesses).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException
from helpers import wait_until

COMPAT_DIR = Path(__file__).resolve().parent
JS_DIR = COMPAT_DIR / "js"
#: the npm packages the scripts require: `make compat-deps` installs them beside the virtualenv's own packages (outside
#: the source tree, which holds only this project's files), and node finds them through NODE_PATH
NODE_MODULES = Path(sys.prefix) / "node" / "node_modules"

# Short group timings keep rebalances in the low seconds (the broker's minimum session timeout is 6000 ms).
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 1000

_counter = itertools.count()


def hostport(address: Any) -> str:
    """BrokerProcess addresses may be "host:port" strings or (host, port) tuples; clients want the string."""
    if isinstance(address, str):
        return address
    host, port = address[0], address[1]
    return f"{host}:{port}"


def end_offsets(kafka_address: tuple[str, int], topic: str, partitions: tuple[int, ...] = (0,)) -> list[int]:
    """The partitions' end offsets, asked over a plain connection to `kafka_address` (-1 for a partition the broker
    answers with an error: no such topic). Blocks; callable from async tests too (its own loop)."""
    import asyncio

    from mqk.protocol.kafka.api import ApiKey
    from mqk.server.kafka.rawclient import RawKafkaClient

    async def ask() -> list[int]:
        async with await RawKafkaClient.connect(*kafka_address) as client:
            answer = await client.call(
                ApiKey.LIST_OFFSETS,
                7,
                {
                    "replica_id": -1,
                    "isolation_level": 0,
                    "topics": [
                        {"name": topic, "partitions": [{"partition_index": p, "timestamp": -1} for p in partitions]}
                    ],
                },
            )
        return [p["offset"] if p["error_code"] == 0 else -1 for p in answer["topics"][0]["partitions"]]

    return asyncio.run(ask())


def unique(prefix: str = "t") -> str:
    """Topic / group names unique across the session and across runs (the shared broker outlives tests)."""
    return f"{prefix}-{os.getpid()}-{next(_counter)}-{uuid.uuid4().hex[:6]}"


def records_served(cluster: Any, node: int, topic: str) -> int:
    """What the broker's /metrics count as served to consumers of `topic`, over its partitions."""
    host, port = cluster.broker(node).admin
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    pattern = re.compile(rf'^mqk_partition_records_out_total\{{[^}}]*topic="{re.escape(topic)}"[^}}]*\}} (\S+)$', re.M)
    return sum(int(float(value)) for value in pattern.findall(text))


def create_topic(
    bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None, replication_factor: int = 1
) -> None:
    """Create a topic with confluent-kafka's admin client and wait for the answer."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=config or {})],
        operation_timeout=10,
    )
    futures[name].result(timeout=15)


def produce_numbered(bootstrap: str, topic: str, partitions: int, count: int, start: int = 0) -> None:
    """Produce the values start .. start+count-1 (as decimal text), value i to partition i % partitions."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(start, start + count):
        producer.produce(topic, b"%d" % i, partition=i % partitions)
    assert producer.flush(30) == 0


#: the codes of a commit a rebalance refused (classic and KIP-848 groups)
REBALANCE_CODES = (
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.STALE_MEMBER_EPOCH,
)


def consume_and_commit(consumer: Any, count: int = 100) -> list[int]:
    """One consume of up to `count` numbered records (confluent-kafka), committed; none when a rebalance refuses
    the commit: they were not processed, and the partition's next owner (maybe this member) resumes from the last
    commit and counts them then."""
    values = []
    for m in consumer.consume(num_messages=count, timeout=0.2):
        if m.error():
            raise KafkaException(m.error())
        values.append(int(m.value()))
    if values:
        try:
            consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() not in REBALANCE_CODES:
                raise
            return []
    return values


class PartitionOwners:
    """Who owns each partition of a group's topic, as its confluent-kafka members' own rebalance callbacks say
    (incremental assign and revoke: the cooperative classic protocol and KIP-848's). A partition assigned to one
    member while another still owns it is recorded as an overlap; each member's revocations are kept in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner: dict[int, str] = {}
        self.overlaps: list[tuple[int, str, str]] = []
        self.revoked: dict[str, list[list[int]]] = {}

    def callbacks(self, name: str) -> dict[str, Callable[..., None]]:
        """The subscribe() callbacks of the member called `name`."""

        def on_assign(consumer: Any, partitions: list[Any]) -> None:
            with self.lock:
                for tp in partitions:
                    holder = self.owner.get(tp.partition)
                    if holder is not None and holder != name:
                        self.overlaps.append((tp.partition, holder, name))
                    self.owner[tp.partition] = name
            consumer.incremental_assign(partitions)

        def on_revoke(consumer: Any, partitions: list[Any]) -> None:
            with self.lock:
                self.revoked.setdefault(name, []).append(sorted(tp.partition for tp in partitions))
                for tp in partitions:
                    if self.owner.get(tp.partition) == name:
                        del self.owner[tp.partition]
            consumer.incremental_unassign(partitions)

        return {"on_assign": on_assign, "on_revoke": on_revoke, "on_lost": on_revoke}

    def of(self, name: str) -> list[int]:
        with self.lock:
            return sorted(p for p, n in self.owner.items() if n == name)


class ChildClient:
    """A client script run in a child process (`python -c script args...`) that prints each value it reads on a
    line of its own; `kill9()` waits for its first line, kills it with SIGKILL and gives every line it printed.
    As a context manager it never leaves the child running."""

    def __init__(self, script: str, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True)

    def kill9(self) -> list[str]:
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()  # it has read something (the calling test's timeout bounds this read)
        self.proc.kill()
        self.proc.wait(10)
        return [line.strip() for line in [first, *self.proc.stdout] if line.strip()]

    def __enter__(self) -> ChildClient:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


#: the compression codec ids of a record batch's attributes (bits 0-2)
CODEC_IDS = {None: 0, "none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
XERIAL_MAGIC = b"\x82SNAPPY\x00"


def stored_batches(bootstrap: str, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
    """(codec id, first 8 bytes of the records section) of each record batch the broker serves for the
    partition, read with a wire-level Fetch: what a client sent, as the broker keeps and serves it (the clients'
    own consumers would decompress it out of sight). Blocks; callable from async tests too (own thread and loop)."""
    import asyncio
    import concurrent.futures

    from mqk._fast import load
    from mqk.protocol.kafka.api import ApiKey
    from mqk.server.kafka.rawclient import RawKafkaClient

    host, port = bootstrap.rsplit(":", 1)
    fetch = {
        "replica_id": -1,
        "max_wait_ms": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 24,
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
                        "partition": partition,
                        "current_leader_epoch": -1,
                        "fetch_offset": 0,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 24,
                    }
                ],
            }
        ],
    }

    async def records() -> bytes:
        async with await RawKafkaClient.connect(host, int(port), "compat-stored-batches") as client:
            answer = await client.call(ApiKey.FETCH, 12, fetch)
        part = answer["responses"][0]["partitions"][0]
        assert part["error_code"] == 0, part
        return bytes(part["records"] or b"")

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        data = pool.submit(asyncio.run, records()).result(timeout=30)
    recbatch = load("recbatch")
    out = []
    for pos, _size, *_ in recbatch.scan_batches(data):  # CRCs checked too
        records_at = pos + recbatch.HEADER_SIZE
        out.append((recbatch.parse_header(data, pos)[5] & 0x7, data[records_at : records_at + 8]))
    return out


def assert_stored_with(
    bootstrap: str, topic: str, codec: str | None, partition: int = 0, *, xerial: bool | None = None
) -> None:
    """Every batch of the partition is served with the codec the client compressed it with (and, for snappy
    with `xerial` given, in that framing): the broker stores what it was sent and never recompresses."""
    batches = stored_batches(bootstrap, topic, partition)
    assert batches, f"no batches served for {topic}-{partition}"
    assert {codec_id for codec_id, _ in batches} == {CODEC_IDS[codec]}, batches
    if xerial is not None:
        assert [start == XERIAL_MAGIC for _, start in batches] == [xerial] * len(batches), batches


def node_command(script: str, *args: str) -> list[str]:
    """The command line that runs compat/js/<script> with `args` (run it with `cwd=JS_DIR, env=node_env()`)."""
    node = shutil.which("node")
    assert node, "node is not installed"
    assert NODE_MODULES.is_dir(), f"run `make compat-deps` first (it installs the npm packages in {NODE_MODULES})"
    return [node, str(JS_DIR / script), *args]


def node_env() -> dict[str, str]:
    """This process's environment, with NODE_PATH naming the installed npm packages."""
    return {**os.environ, "NODE_PATH": str(NODE_MODULES)}


def run_node(script: str, *args: str, timeout: float = 60, stdin: str | None = None) -> Any:
    """Run compat/js/<script> and return the JSON object printed on its last stdout line."""
    proc = subprocess.run(
        node_command(script, *args),
        check=False,
        cwd=JS_DIR,
        env=node_env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, (
        f"node {script} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    )
    return json.loads(lines[-1])


class NodeProcess:
    """A long-running node script that prints one JSON event per line (used for push consumers)."""

    def __init__(self, script: str, *args: str) -> None:
        import threading

        self.events: list[dict[str, Any]] = []
        self.stderr_tail: list[str] = []
        self.proc = subprocess.Popen(
            node_command(script, *args),
            cwd=JS_DIR,
            env=node_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lock = threading.Lock()
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                if line.startswith("{"):
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    with self._lock:
                        self.events.append(event)
        except ValueError:  # stream closed by close()
            pass

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        try:
            for line in self.proc.stderr:
                self.stderr_tail = ([*self.stderr_tail, line])[-40:]
        except ValueError:
            pass

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("event") == kind]

    def diagnostics(self) -> str:
        return f"exit={self.proc.poll()} stderr:\n{''.join(self.stderr_tail)}"

    def close(self, timeout: float = 10) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # the script closes its client (unregister, persist offsets) on SIGTERM
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for reader in self._readers:  # they end at EOF, having kept what the script printed while closing
            reader.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()


# --------------------------------------------------------------------------------------------------------------
# Consumer-group scenario: three members, one joins late and one leaves, no record lost or duplicated.


class GroupMember(Protocol):
    """One consumer of the group, polling in its own thread; commits synchronously after every non-empty poll,
    so a rebalance never hands another member a record this one already processed."""

    name: str
    values: list[int]
    assigned: int

    def close(self) -> None: ...


class ThreadMember:
    """Runs `poll_once() -> list[int]` (which also commits) in a thread until closed, then `shutdown()`
    (which must leave the group); `assignment()` tells how many partitions the client holds."""

    def __init__(
        self,
        name: str,
        setup: Callable[[], Any],
        poll_once: Callable[[Any], list[int]],
        shutdown: Callable[[Any], None],
        assignment: Callable[[Any], int],
    ) -> None:
        self.name = name
        self.values: list[int] = []
        #: partitions currently assigned (after the last poll)
        self.assigned = 0
        self._assignment = assignment
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._setup, self._poll_once, self._shutdown = setup, poll_once, shutdown
        self._thread = threading.Thread(target=self._run, name=f"member-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client = None
        try:
            client = self._setup()
            self._ready.set()
            while not self._stop.is_set():
                self.values.extend(self._poll_once(client))
                self.assigned = self._assignment(client)
        except BaseException as exc:  # noqa: BLE001 - reported by close()
            self.error = exc
        finally:
            self._ready.set()
            if client is not None:
                try:
                    self._shutdown(client)
                except BaseException as exc:  # noqa: BLE001 - reported by close(), after the run's own error
                    self.error = self.error or exc

    def close(self, timeout: float = 20) -> None:
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"member {self.name} did not stop within {timeout}s"
        if self.error is not None:
            raise AssertionError(f"member {self.name} failed: {self.error!r}") from self.error


#: partitions of the scenario's topic; `produce(start, count)` writes value v to partition v % PARTITIONS
PARTITIONS = 6


def run_group_scenario(
    produce: Callable[[int, int], None], new_member: Callable[[str], GroupMember], batch: int = 120, timeout: float = 45
) -> dict[str, list[int]]:
    """Topic must have 6 partitions. Values are the integers 0 .. 3*batch-1, then one last value per partition.

    a and b consume the first batch; c joins (rebalance to 3); the second batch is produced; a leaves
    (rebalance to 2); the third batch is produced, then the last values (3*batch .. 3*batch+5, one per partition).
    A partition is consumed in order, so once its last value is in, every earlier value of it that was going to
    be delivered (twice, too) has been. Every value must be consumed exactly once overall, and every member must
    have consumed something. Returns each member's values of the three batches (the last values left out).
    """
    deadline = time.monotonic() + timeout
    members: list[GroupMember] = []
    every = 3 * batch + PARTITIONS

    def total() -> list[int]:
        return [v for m in members for v in list(m.values)]

    def wait_total(n: int, what: str) -> None:
        wait_until(lambda: len(set(total())) >= n, max(1.0, deadline - time.monotonic()), what)

    try:
        produce(0, batch)
        members += [new_member("a"), new_member("b")]
        wait_total(batch // 3, "a and b to start consuming")
        members.append(new_member("c"))
        c = members[2]
        # Produce the second batch only once c owns partitions, so c is sure to take part.
        wait_until(lambda: c.assigned > 0, max(1.0, deadline - time.monotonic()), "c to be assigned partitions")
        produce(batch, batch)
        wait_total(2 * batch, "the second batch with c in the group")
        members[0].close()
        produce(2 * batch, batch)
        wait_total(3 * batch, "the third batch after a left")
        produce(3 * batch, PARTITIONS)
        wait_total(every, "the last value of every partition")
    finally:
        errors = []
        for m in members:
            try:
                m.close()
            except AssertionError as exc:
                errors.append(str(exc))
    assert not errors, errors
    seen = collections.Counter(total())
    duplicates = sorted(v for v, n in seen.items() if n > 1)
    missing = sorted(set(range(every)) - set(seen))
    assert not duplicates, f"duplicated across the rebalance: {duplicates[:20]}"
    assert not missing, f"lost: {missing[:20]}"
    by_name = {m.name: [v for v in m.values if v < 3 * batch] for m in members}
    assert all(by_name.values()), f"a member consumed nothing: { {k: len(v) for k, v in by_name.items()} }"
    return by_name
