"""Test a Kafka (or RocketMQ) application against a real mqk broker, without Docker or a JVM.

Installed as a pytest plugin (entry point `mqk`), so after `pip install mqk` these fixtures exist in every test run:

- `mqk_broker`: a started in-process broker (`ThreadedBroker`) on free loopback ports with a memory store
  (function scope: a fresh one per test);
- `mqk_file_broker`: the same with a file store in the test's tmp_path;
- `mqk_bootstrap`: the Kafka bootstrap address of `mqk_broker`, "127.0.0.1:PORT";
- `mqk_session_broker` / `mqk_session_bootstrap`: one broker for the whole session (session scope, on the system
  clock), started when a test first asks for it and stopped at the end; tests that share it see each other's
  topics and groups unless marked `@pytest.mark.mqk_reset`;
- `mqk_fake_clock`: a `FakeClock` (time moves only when the test says so);
- `mqk_clock`: the clock the two function-scoped broker fixtures run on, the system clock by default. A module (or
  conftest) that wants its brokers on fake time overrides it: `@pytest.fixture` `def mqk_clock(mqk_fake_clock):
  return mqk_fake_clock`; the test then moves the broker's time with `mqk_broker.advance(seconds)` (group session
  and rebalance timeouts, delayed delivery, retention / compaction / disk-guard passes, producer-id expiry);
- `mqk_options`: the plugin's options below (a `PluginOptions`, session scope; a conftest may override it).

Options, each an ini key (`[pytest]` / `[tool.pytest.ini_options]`) and a command-line flag, the flag winning;
they set fields of the brokers' BrokerConfig, so the broker acts on each:

- `mqk_partitions` / `--mqk-partitions N` (1): partitions of an auto-created topic (`num_partitions`);
- `mqk_auto_create_topics` / `--mqk-auto-create-topics BOOL` (true): `auto_create_topics`;
- `mqk_storage` / `--mqk-storage memory|file|rocksdb` (memory): the store of `mqk_broker` and `mqk_session_broker`,
  the file and rocksdb ones in the tmp dir of the test or of the session (`mqk_file_broker` keeps a file store);
- `mqk_flush` / `--mqk-flush async|sync` (async): the file store's flush mode (sync: a write is answered once it
  is fsynced); the memory engine has nothing to flush.

Partitions, auto-creation and the flush mode apply to every broker the plugin starts, a cluster's too (whose
brokers keep a file store). A value that is not one stops the run with a usage error; options that are not their
defaults are shown in the run's header.

Marker `@pytest.mark.mqk_reset` (on a test, a class, or a module's `pytestmark`): before the test, and before its
function-scoped fixtures, `mqk_session_broker` is emptied (`ThreadedBroker.reset`, also callable directly): every
topic but the internal ones and every consumer group with its committed offsets are deleted, Kafka's and
RocketMQ's alike, through the broker's own topic registry and group coordinator. Fixtures of a wider scope that
create topics on the session broker see them deleted by the next marked test.

Cluster mode (etcd plus broker processes; needs the `etcd` binary, Debian's `etcd-server`, and `mqk[cluster]`):

- `mqk_cluster`: a started `mqk.cluster_local.LocalCluster` of 3 `mqk serve --cluster` processes on loopback (node ids
  0, 1, 2 in broker groups `group-0`..`group-2`, small file stores in the test's tmp_path: `TEST_CLUSTER_STORE`),
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
import dataclasses
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
from typing import TYPE_CHECKING, Any

import pytest

from mqk.clock import SYSTEM_CLOCK, Clock, FakeClock
from mqk.cluster_local import NAMED_LISTENER, EtcdProcess, LocalCluster
from mqk.config import ENGINES, FLUSH_ASYNC, FLUSH_SYNC, BrokerConfig, StoreConfig

if TYPE_CHECKING:
    from mqk.runtime import BrokerRuntime

_READY = re.compile(r"mqk ready kafka=(\S+):(\d+) native=(\S+):(\d+) namesrv=(\S+):(\d+)")
_READY_ADMIN = re.compile(r" admin=(\S+):(\d+)")
_READY_GRPC = re.compile(r" grpc=(\S+):(\d+)")
_ANY_PORT = ("127.0.0.1", 0)

#: the file store of the test brokers the plugin puts in a tmp dir (a cluster's, and the session broker's and
#: `mqk_broker`'s when the options ask for a file store): small CommitLog segments and ConsumeQueue files. Tests
#: write little, and the defaults (1 GiB segments, 300,000-unit queue files per partition) would have each broker
#: claim over a gigabyte of disk
TEST_SEGMENT_BYTES = 16 << 20
TEST_CLUSTER_STORE: dict[str, Any] = {"commitlog_segment_bytes": TEST_SEGMENT_BYTES, "cq_units_per_file": 10_000}

#: the marker that empties the session broker before a test
RESET_MARKER = "mqk_reset"
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def broker_config(storage: str = "memory", data_dir: Path | None = None, **store: Any) -> BrokerConfig:
    """A config with every listener on a free loopback port."""
    return BrokerConfig(
        kafka_listen=_ANY_PORT,
        native_listen=_ANY_PORT,
        namesrv_listen=_ANY_PORT,
        admin_listen=_ANY_PORT,
        store=StoreConfig(storage=storage, data_dir=data_dir or Path("mqk-data"), **store),
    )


@dataclasses.dataclass(frozen=True)
class PluginOptions:
    """The plugin's options (ini keys `mqk_*`, command-line flags `--mqk-*`), each a BrokerConfig field the
    broker acts on. The defaults are the fixtures' behaviour without options."""

    #: `num_partitions`: the partitions of a topic created by auto-creation
    partitions: int = 1
    #: `auto_create_topics`: whether Metadata / Produce / a RocketMQ send create a missing topic
    auto_create_topics: bool = True
    #: `StoreConfig.storage` of `mqk_broker` and `mqk_session_broker`: memory, file or rocksdb (the last two in a
    #: tmp dir of the test or of the session)
    storage: str = "memory"
    #: `StoreConfig.flush_mode`: async, or sync (a write is answered once fsynced); the memory engine has nothing
    #: to flush
    flush: str = FLUSH_ASYNC

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"mqk_partitions must be at least 1, not {self.partitions}")
        if self.storage not in ENGINES:
            raise ValueError(f"mqk_storage must be one of {', '.join(ENGINES)}, not {self.storage!r}")
        if self.flush not in (FLUSH_ASYNC, FLUSH_SYNC):
            raise ValueError(f"mqk_flush must be {FLUSH_ASYNC} or {FLUSH_SYNC}, not {self.flush!r}")

    @classmethod
    def from_pytest(cls, config: pytest.Config) -> PluginOptions:
        """The command line's value of each option, else the ini file's, else the default. ValueError for a
        value that is not one."""

        def value(name: str) -> str:
            given = config.getoption(name)
            return str(given if given is not None else config.getini(name)).strip()

        partitions = value("mqk_partitions")
        if not partitions.isdigit():
            raise ValueError(f"mqk_partitions must be a positive integer, not {partitions!r}")
        auto_create = value("mqk_auto_create_topics").lower()
        if auto_create not in _TRUE + _FALSE:
            raise ValueError(f"mqk_auto_create_topics must be true or false, not {auto_create!r}")
        return cls(int(partitions), auto_create in _TRUE, value("mqk_storage"), value("mqk_flush"))

    def broker_config(self, storage: str | None = None, data_dir: Path | None = None, **store: Any) -> BrokerConfig:
        """`broker_config(...)` with these options applied; `storage` None takes the option's, a `flush_mode` in
        `store` wins over the option's."""
        config = broker_config(storage or self.storage, data_dir, **{"flush_mode": self.flush, **store})
        return dataclasses.replace(config, num_partitions=self.partitions, auto_create_topics=self.auto_create_topics)

    def cluster_config(self) -> dict[str, Any]:
        """The settings a test cluster's brokers get (`LocalCluster(config=...)`): the small file store, and each
        option that is not its default (a cluster's brokers always keep a file store)."""
        store: dict[str, Any] = dict(TEST_CLUSTER_STORE)
        settings: dict[str, Any] = {"store": store}
        default = PluginOptions()
        if self.flush != default.flush:
            store["flush_mode"] = self.flush
        if self.partitions != default.partitions:
            settings["num_partitions"] = self.partitions
        if self.auto_create_topics != default.auto_create_topics:
            settings["auto_create_topics"] = self.auto_create_topics
        return settings

    def __str__(self) -> str:
        auto_create = str(self.auto_create_topics).lower()
        return (
            f"partitions={self.partitions} auto_create_topics={auto_create} storage={self.storage} flush={self.flush}"
        )


@dataclasses.dataclass(frozen=True)
class Reset:
    """What `ThreadedBroker.reset` deleted."""

    topics: tuple[str, ...]
    groups: tuple[str, ...]


async def reset_state(runtime: BrokerRuntime) -> Reset:
    """Delete every topic but the internal ones (mqk.broker.internal: the timer's, the transactions', the offsets
    topic) and every consumer group with its committed offsets, Kafka's and RocketMQ's alike, through the broker's
    own parts, as DeleteGroups and DeleteTopics do. Run on the broker's loop.

    A group that still has members loses them first (the group coordinator's `unload`: a member waiting in
    JoinGroup or SyncGroup is answered NOT_COORDINATOR, one heart-beating later learns it is unknown, and a client
    still running joins again from scratch). Delayed messages already waiting in the timer stay there; one whose
    topic is gone when it falls due is dropped (mqk.timer). ACLs, quotas and SCRAM users are not topics or groups
    and stay."""
    # (here: a pytest run that only loads the plugin does not import the broker)
    from mqk.broker.internal import is_internal
    from mqk.errors import GroupIdNotFoundError

    broker, kafka, store = runtime.broker, runtime.kafka, runtime.store
    if broker is None or kafka is None or store is None:
        raise RuntimeError("the broker is not started")
    if runtime.cluster is not None:
        raise RuntimeError("reset empties a broker on its own; a cluster's topics are its controller's")
    coordinator = kafka.groups
    groups = coordinator.group_ids()
    coordinator.unload()
    for group_id in groups:
        code = await coordinator.delete_group(group_id)
        if code not in (0, GroupIdNotFoundError.code):  # (not found: a group that had members and no offsets)
            raise RuntimeError(f"deleting group {group_id!r} failed with Kafka error code {code}")
    topics = sorted(name for name in store.topics() if not is_internal(name))
    for name in topics:
        await broker.topics.delete(name)
        kafka.producers.forget_topic(name)
        if kafka.ctx.transactions is not None:
            kafka.ctx.transactions.forget_topic(name)
        await coordinator.forget_topic(name)
    return Reset(tuple(topics), tuple(groups))


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

    def reset(self) -> Reset:
        """Delete every topic but the internal ones and every consumer group with its committed offsets (see
        `reset_state`); returns what went. What `@pytest.mark.mqk_reset` does to `mqk_session_broker`."""
        result: Reset = self.call(reset_state(self.runtime))
        return result

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
    def grpc_address(self) -> tuple[str, int] | None:
        """The RocketMQ 5 gRPC listener's address (a config with `grpc_listen`), else None."""
        return self.runtime.grpc_address

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
        #: the RocketMQ 5 gRPC listener's address (`--grpc-listen` among extra_args), else None
        self.grpc_address: tuple[str, int] | None = None
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
            # (the RocketMQ 5 listener only when asked for: its default port would clash between brokers)
            *(() if "--grpc-listen" in self.extra_args else ("--grpc-listen", "off")),
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
                grpc = _READY_GRPC.search(line)
                self.grpc_address = (grpc.group(1), int(grpc.group(2))) if grpc else None
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


# --- the plugin's options and marker -------------------------------------------------------------------------

_OPTIONS = pytest.StashKey[PluginOptions]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mqk", "mqk broker fixtures (mqk.testing)")
    default = PluginOptions()
    flags: list[tuple[str, dict[str, Any], str, str]] = [
        ("partitions", {"metavar": "N"}, str(default.partitions), "partitions of an auto-created topic"),
        (
            "auto_create_topics",
            {"metavar": "BOOL"},
            str(default.auto_create_topics).lower(),
            "whether the broker creates a missing topic when a client uses it (true or false)",
        ),
        ("storage", {"choices": ENGINES}, default.storage, "store of mqk_broker and mqk_session_broker"),
        ("flush", {"choices": (FLUSH_ASYNC, FLUSH_SYNC)}, default.flush, "flush mode of a file store"),
    ]
    for name, kwargs, value, help_text in flags:
        dest = f"mqk_{name}"
        group.addoption(
            f"--mqk-{name.replace('_', '-')}", dest=dest, default=None, help=f"{help_text} (ini {dest})", **kwargs
        )
        parser.addini(dest, f"mqk: {help_text} (default {value})", type="string", default=value)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{RESET_MARKER}: delete every topic (but the internal ones) and every consumer group of the session's "
        "mqk broker (mqk_session_broker) before the test",
    )
    try:
        config.stash[_OPTIONS] = PluginOptions.from_pytest(config)
    except ValueError as exc:
        raise pytest.UsageError(f"mqk plugin: {exc}") from None


#: set on a test item whose call phase failed: the cluster fixture then shows its processes' logs
_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]  # (pluggy's result object)
    if report.when == "call" and report.failed:
        item.stash[_CALL_FAILED] = True


def pytest_report_header(config: pytest.Config) -> str | None:
    options = config.stash.get(_OPTIONS, None)
    if options is None or options == PluginOptions():
        return None  # (nothing to say in the header of every project that has mqk installed)
    return f"mqk: {options}"


@pytest.fixture(scope="session")
def mqk_options(pytestconfig: pytest.Config) -> PluginOptions:
    """The plugin's options, from the command line and the ini file; a conftest may override this fixture (session
    scope) to set them in code."""
    return pytestconfig.stash[_OPTIONS]


@pytest.fixture(autouse=True)
def _mqk_reset_marker(request: pytest.FixtureRequest) -> None:
    """`@pytest.mark.mqk_reset`: the session broker is emptied before the test (and before the test's own
    function-scoped fixtures, which are set up after the autouse ones, so they may create what it needs)."""
    if request.node.get_closest_marker(RESET_MARKER) is not None:
        request.getfixturevalue("mqk_session_broker").reset()


# --- in-process brokers -------------------------------------------------------------------------------------


@pytest.fixture
def mqk_fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def mqk_clock() -> Clock:
    """The clock of `mqk_broker` / `mqk_file_broker`; override it with `mqk_fake_clock` to drive their time."""
    return SYSTEM_CLOCK


@pytest.fixture
def mqk_broker(
    request: pytest.FixtureRequest, mqk_clock: Clock, mqk_options: PluginOptions
) -> Iterator[ThreadedBroker]:
    if mqk_options.storage == "memory":
        config = mqk_options.broker_config()
    else:  # (tmp_path only then: a memory broker writes nothing; not its "data", mqk_file_broker's in one test)
        config = mqk_options.broker_config(
            data_dir=request.getfixturevalue("tmp_path") / "mqk-broker", **TEST_CLUSTER_STORE
        )
    broker = ThreadedBroker(config, clock=mqk_clock).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def mqk_file_broker(tmp_path: Path, mqk_clock: Clock, mqk_options: PluginOptions) -> Iterator[ThreadedBroker]:
    config = mqk_options.broker_config("file", tmp_path / "data", commitlog_segment_bytes=TEST_SEGMENT_BYTES)
    broker = ThreadedBroker(config, clock=mqk_clock).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def mqk_bootstrap(mqk_broker: ThreadedBroker) -> str:
    return mqk_broker.bootstrap


@pytest.fixture(scope="session")
def mqk_session_broker(
    tmp_path_factory: pytest.TempPathFactory, mqk_options: PluginOptions
) -> Iterator[ThreadedBroker]:
    """One broker for the whole test session (each xdist worker has its own), on the system clock."""
    if mqk_options.storage == "memory":
        config = mqk_options.broker_config()
    else:
        config = mqk_options.broker_config(
            data_dir=tmp_path_factory.mktemp("mqk-session") / "data", **TEST_CLUSTER_STORE
        )
    broker = ThreadedBroker(config).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def mqk_session_bootstrap(mqk_session_broker: ThreadedBroker) -> str:
    return mqk_session_broker.bootstrap


# --- cluster mode -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def mqk_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """One etcd member for the session's clusters (each under its own cluster id), stopped by pid at the end."""
    etcd = EtcdProcess(tmp_path_factory.mktemp("mqk-etcd") / "etcd").start()
    try:
        yield etcd
    finally:
        etcd.stop()


@pytest.fixture
def mqk_cluster_factory(
    request: pytest.FixtureRequest, tmp_path: Path, mqk_options: PluginOptions
) -> Iterator[Callable[..., LocalCluster]]:
    started: list[LocalCluster] = []
    #: the session's etcd, once a cluster of this test uses it
    session_etcd: list[EtcdProcess] = []

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
            session_etcd.append(request.getfixturevalue("mqk_etcd"))
            etcd = session_etcd[-1].url
        data_dir = tmp_path / f"mqk-cluster-{len(started)}"
        cluster = LocalCluster(
            data_dir,
            brokers,
            etcd=etcd,
            cluster_id=cluster_id,
            extra_args=extra_args,
            group_size=group_size,
            config={**mqk_options.cluster_config(), **(config or {})},
            broker_args=broker_args,
        )
        started.append(cluster)
        return cluster.start()

    try:
        yield start
    finally:
        if request.node.stash.get(_CALL_FAILED, False):
            # a failed cluster test says what its brokers and etcd logged (the report shows it as teardown stderr)
            for cluster in started:
                print(cluster.logs_tail(), file=sys.stderr)
            for etcd_process in session_etcd[:1]:
                print(f"--- the session's etcd ---\n{etcd_process.log_tail()}", file=sys.stderr)
        for cluster in reversed(started):
            cluster.stop()


@pytest.fixture
def mqk_cluster(mqk_cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return mqk_cluster_factory()
