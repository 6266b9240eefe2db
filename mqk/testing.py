"""Test a Kafka (or RocketMQ) application against a real mqk broker, without Docker or a JVM.

Installed as a pytest plugin (entry point `mqk`), so after `pip install mqk` these fixtures exist in every test run:

- `mqk_broker`: a started in-process `BrokerRuntime` on free loopback ports with a memory store (function scope);
- `mqk_file_broker`: the same with a file store in the test's tmp_path;
- `mqk_bootstrap`: the Kafka bootstrap address of `mqk_broker`, "127.0.0.1:PORT";
- `mqk_fake_clock`: a `FakeClock` (time moves only when the test says so);
- `mqk_clock`: the clock the two broker fixtures run on, the system clock by default. A module (or conftest) that
  wants its brokers on fake time overrides it: `@pytest.fixture` `def mqk_clock(mqk_fake_clock): return
  mqk_fake_clock`; the test then moves the broker's time with `mqk_broker.advance(seconds)` (group session and
  rebalance timeouts, delayed delivery, retention / compaction / disk-guard passes, producer-id expiry).

Cluster mode (etcd plus broker processes; needs the `etcd` binary, Debian's `etcd-server`, and `mqk[cluster]`):

- `mqk_cluster`: a started `mqk.cluster_local.LocalCluster` of 3 `mqk serve --cluster` processes on loopback (node ids
  0, 1, 2 in broker groups `group-0`..`group-2`, small file stores in the test's tmp_path: `cluster_store_args`),
  stopped by pid after the test. It gives `.bootstrap` ("H:P,H:P,H:P"), `.etcd_url`, `.cluster_id` (unique per
  cluster, so clusters share one etcd without seeing each other: keys under `/mqk/<cluster-id>/`), `.node_ids`,
  `.pids`, `.brokers` (each with `.node_id`, `.group`, `.pid`, `.kafka` / `.native` / `.namesrv` addresses,
  `.bootstrap`, `.data_dir`, `.stderr()`) and the fault helpers `.kill(node_id)` (kill -9), `.restart(node_id)`
  (same node id, data directory and, when free, ports; it returns once the broker is ready), `.pause(node_id)`
  (SIGSTOP) and `.resume(node_id)` (SIGCONT);
- `mqk_cluster_factory`: `mqk_cluster_factory(brokers=3, *, cluster_id=None, etcd=None, own_etcd=False,
  extra_args=())` starts another such cluster (stopped after the test); by default its brokers use the session's
  etcd, `own_etcd=True` gives it an etcd of its own (for tests that stop it: `.stop_etcd()`, then `.restart_etcd()`
  on the same ports and data), `etcd="etcd://H:P"` one that runs elsewhere;
- `mqk_etcd`: the session's `mqk.cluster_local.EtcdProcess` (`.url`, `.endpoints`, `.pid`), started on first use.

The in-process broker runs its own event loop in a background thread, so both synchronous clients
(confluent-kafka, kafka-python) and asyncio tests can use it. `BrokerProcess` runs `python -m mqk serve` as a
child process instead, for tests that restart or kill -9 the broker (it runs on the system clock). Both give the
bound address of each named Kafka listener (`--listener NAME=PROTOCOL://HOST:PORT`) as `.listeners[NAME]`.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from mqk.clock import SYSTEM_CLOCK, Clock, FakeClock
from mqk.cluster_local import NAMED_LISTENER, EtcdProcess, LocalCluster
from mqk.config import BrokerConfig, StoreConfig

_READY = re.compile(r"mqk ready kafka=(\S+):(\d+) native=(\S+):(\d+) namesrv=(\S+):(\d+)")
_READY_ADMIN = re.compile(r" admin=(\S+):(\d+)")
_ANY_PORT = ("127.0.0.1", 0)


def broker_config(storage: str = "memory", data_dir: Path | None = None, **store: Any) -> BrokerConfig:
    """A config with every listener on a free loopback port."""
    return BrokerConfig(
        kafka_listen=_ANY_PORT,
        native_listen=_ANY_PORT,
        namesrv_listen=_ANY_PORT,
        admin_listen=_ANY_PORT,
        store=StoreConfig(storage=storage, data_dir=data_dir or Path("mqk-data"), **store),
    )


class ThreadedBroker:
    """A BrokerRuntime running on its own event loop in a daemon thread, on `clock` (the system clock by default)."""

    def __init__(self, config: BrokerConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        from mqk.runtime import BrokerRuntime  # (here: a pytest session that only loads the plugin stays cheap)

        self.config = config
        self.clock = clock
        self.runtime = BrokerRuntime(config, clock=clock)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="mqk-broker", daemon=True)

    def start(self) -> ThreadedBroker:
        self._thread.start()
        self.call(self.runtime.start())
        return self

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine on the broker's loop and wait for its result."""
        fut: Future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def advance(self, seconds: float) -> None:
        """Move the broker's FakeClock forward (on the broker's loop) and return once what fell due has run (see
        `FakeClock.advance`)."""
        if not isinstance(self.clock, FakeClock):
            raise TypeError("advance() needs a broker started with a FakeClock (override the mqk_clock fixture)")
        self.call(self.clock.advance(seconds))

    def stop(self) -> None:
        try:
            self.call(self.runtime.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()

    @property
    def store(self) -> Any:
        return self.runtime.store

    @property
    def bootstrap(self) -> str:
        return self.runtime.bootstrap

    @property
    def kafka_address(self) -> tuple[str, int]:
        address = self.runtime.kafka_address
        assert address is not None, "the broker is not started"
        return address

    @property
    def native_address(self) -> tuple[str, int]:
        address = self.runtime.native_address
        assert address is not None, "the broker is not started"
        return address

    @property
    def namesrv_address(self) -> tuple[str, int]:
        address = self.runtime.namesrv_address
        assert address is not None, "the broker is not started"
        return address

    @property
    def admin_address(self) -> tuple[str, int] | None:
        return self.runtime.admin_address

    @property
    def listeners(self) -> dict[str, tuple[str, int]]:
        """Named Kafka listener -> its bound address."""
        return self.runtime.kafka_listeners


class BrokerProcess:
    """`python -m mqk serve` in a child process with port-0 listeners; for restart and kill -9 tests."""

    def __init__(
        self, data_dir: Path | str, storage: str = "file", extra_args: Sequence[str] = (), timeout: float = 30.0
    ) -> None:
        self.data_dir = Path(data_dir)
        self.storage = storage
        self.extra_args = list(extra_args)
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.kafka_address: tuple[str, int] | None = None
        self.native_address: tuple[str, int] | None = None
        self.namesrv_address: tuple[str, int] | None = None
        self.admin_address: tuple[str, int] | None = None
        #: named Kafka listener -> its bound address (the ready line's `kafka.NAME=` pairs)
        self.listeners: dict[str, tuple[str, int]] = {}
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.broker.log"

    @property
    def bootstrap(self) -> str:
        assert self.kafka_address is not None, "broker not started"
        return f"{self.kafka_address[0]}:{self.kafka_address[1]}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> BrokerProcess:
        cmd = [
            sys.executable, "-m", "mqk", "serve",
            "--data-dir", str(self.data_dir),
            "--storage", self.storage,
            "--kafka-listen", "127.0.0.1:0",
            "--native-listen", "127.0.0.1:0",
            "--namesrv-listen", "127.0.0.1:0",
            "--admin-listen", "127.0.0.1:0",
            *self.extra_args,
        ]  # fmt: skip
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        deadline = time.monotonic() + self.timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = _READY.search(line)
            if m:
                g = m.groups()
                self.kafka_address = (g[0], int(g[1]))
                self.native_address = (g[2], int(g[3]))
                self.namesrv_address = (g[4], int(g[5]))
                admin = _READY_ADMIN.search(line)
                self.admin_address = (admin.group(1), int(admin.group(2))) if admin else None
                self.listeners = {name: (host, int(port)) for name, host, port in NAMED_LISTENER.findall(line)}
                return self
        self.kill()
        raise RuntimeError(f"broker did not become ready; log: {self.log_path}\n{self.log_text()[-4000:]}")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no flush, no clean-up; the next start must recover."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._close_pipe()

    def stop(self) -> int:
        """SIGTERM and wait: a clean stop. Returns the exit code."""
        code = 0
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(self.timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait(10)
        elif self.proc:
            code = self.proc.returncode
        self._close_pipe()
        return code

    def restart(self, kill: bool = False) -> BrokerProcess:
        self.kill() if kill else self.stop()
        return self.start()

    def cpu_seconds(self) -> float:
        """User + system CPU seconds used so far by the broker process (from /proc)."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def _close_pipe(self) -> None:
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def mqk_fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def mqk_clock() -> Clock:
    """The clock of `mqk_broker` / `mqk_file_broker`; override it with `mqk_fake_clock` to drive their time."""
    return SYSTEM_CLOCK


@pytest.fixture
def mqk_broker(mqk_clock: Clock) -> Iterator[ThreadedBroker]:
    broker = ThreadedBroker(broker_config("memory"), clock=mqk_clock).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def mqk_file_broker(tmp_path: Path, mqk_clock: Clock) -> Iterator[ThreadedBroker]:
    broker = ThreadedBroker(
        broker_config("file", tmp_path / "data", commitlog_segment_bytes=16 << 20), clock=mqk_clock
    ).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def mqk_bootstrap(mqk_broker: ThreadedBroker) -> str:
    return mqk_broker.bootstrap


# --- cluster mode -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def mqk_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """One etcd member for the session's clusters (each under its own cluster id), stopped by pid at the end."""
    etcd = EtcdProcess(tmp_path_factory.mktemp("mqk-etcd") / "etcd").start()
    try:
        yield etcd
    finally:
        etcd.stop()


#: the file store of a test cluster's brokers: small CommitLog segments and ConsumeQueue files (as mqk_file_broker's).
#: Tests write little, and the defaults (1 GiB segments, 300,000-unit queue files per partition) would have each
#: broker claim over a gigabyte of disk
TEST_SEGMENT_BYTES = 16 << 20
TEST_CLUSTER_STORE = {"commitlog_segment_bytes": TEST_SEGMENT_BYTES, "cq_units_per_file": 10_000}


@pytest.fixture
def mqk_cluster_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    started: list[LocalCluster] = []

    def start(
        brokers: int = 3,
        *,
        cluster_id: str | None = None,
        etcd: str | None = None,
        own_etcd: bool = False,
        extra_args: Sequence[str] = (),
        group_size: int = 1,
        config: Mapping[str, Any] | None = None,
        broker_args: Mapping[int, Sequence[str]] | None = None,
    ) -> LocalCluster:
        if etcd is None and not own_etcd:
            etcd = request.getfixturevalue("mqk_etcd").url
        data_dir = tmp_path / f"mqk-cluster-{len(started)}"
        cluster = LocalCluster(
            data_dir,
            brokers,
            etcd=etcd,
            cluster_id=cluster_id,
            extra_args=extra_args,
            group_size=group_size,
            config={"store": TEST_CLUSTER_STORE, **(config or {})},
            broker_args=broker_args,
        )
        started.append(cluster)
        return cluster.start()

    try:
        yield start
    finally:
        for cluster in reversed(started):
            cluster.stop()


@pytest.fixture
def mqk_cluster(mqk_cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return mqk_cluster_factory()
