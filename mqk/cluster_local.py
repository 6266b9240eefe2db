"""A cluster on one machine: an etcd member and N `mqk serve --cluster` processes, all on loopback.

Owns the processes it starts and nothing else: `EtcdProcess` runs the `etcd` binary (Debian's `etcd-server`) on free
loopback ports with its own data directory; `LocalCluster` runs that etcd (or uses one given by URL) and one
`python -m mqk serve --cluster ...` child per broker, each with its own node id, broker group (`group-<node id>`),
data directory and port-0 listeners, and reads each broker's ready line for its addresses. It can kill -9, restart,
pause (SIGSTOP) and resume (SIGCONT) one broker, stop its etcd and start it again on the same ports and data, and
stops everything it started by pid, each wait bounded, SIGKILL as the last resort. `mqk cluster local` (mqk.cli) and
the `mqk_cluster` pytest fixture (mqk.testing) are built on it.

It must not reach into a broker: what a broker does in the cluster is mqk.broker.cluster's; this module only starts
processes and reads what they print. Every address it binds or hands out is on 127.0.0.1.

A cluster's data directory holds `cluster.json` (the cluster id, etcd's ports and each broker's last ports), the etcd
data (`etcd/`), each broker's data (`broker-<node id>/`) and their logs (`*.log`). A LocalCluster started again on the
same directory is the same cluster: same cluster id, same etcd data (a broker's store keeps only the topics its
cluster has, so a new cluster id over an old store would delete them) and, where still free, the same ports.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from mqk.meta import EtcdClient, MetaUnavailable, parse_endpoints

LOOPBACK = "127.0.0.1"

#: the line `mqk serve` prints once it has joined its cluster and listens (mqk.cli)
READY = re.compile(r"mqk ready kafka=(\S+):(\d+) native=(\S+):(\d+) namesrv=(\S+):(\d+)")
#: the listeners a ready line names after the three above, when the broker has them
OPTIONAL_LISTENERS = ("replication", "admin")


def ready_listener(line: str, name: str) -> Address | None:
    """The `name=HOST:PORT` address a ready line gives, if it gives one."""
    m = re.search(rf" {name}=(\S+):(\d+)", line)
    return (m.group(1), int(m.group(2))) if m else None


#: a named Kafka listener's pair in the ready line: `kafka.NAME=HOST:PORT`
NAMED_LISTENER = re.compile(r" kafka\.([^=\s]+)=(\S+):(\d+)")

ETCD_INSTALL_HINT = "Debian/Ubuntu: sudo apt-get install -y etcd-server"

#: called from a watcher thread when a process this module started exits without being told to:
#: (what, exit code), what = "etcd" or "broker <node id>"
ExitCallback = Callable[[str, int], None]

Address = tuple[str, int]


class LocalClusterError(RuntimeError):
    """A process of the local cluster could not be started."""


class EtcdNotFound(LocalClusterError):
    """No `etcd` binary on PATH."""


class EtcdStartError(LocalClusterError):
    """etcd exited or did not answer in time; the message ends with its log's tail."""


class BrokerStartError(LocalClusterError):
    """A broker exited or printed no ready line in time; the message ends with its stderr's tail."""

    def __init__(self, message: str, node_id: int, returncode: int | None, stderr: str) -> None:
        super().__init__(message)
        self.node_id = node_id
        #: the broker's exit code, None when it was killed for printing no ready line in time
        self.returncode = returncode
        self.stderr = stderr


# --- small process helpers ------------------------------------------------------------------------------------


def _ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for port-0 binds and outgoing connections' local ports (Linux's default when unreadable)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A loopback TCP port nobody listens on now, chosen below the kernel's ephemeral range: a port handed out by a
    port-0 bind (a broker's other listeners, a test's proxy, an outgoing connection's local end) can then never take
    it between this call and its use. Another caller of this function still may: callers that bind it later retry or
    fall back to port 0."""
    low, _ = _ephemeral_port_range()
    first = max(1024, low - 12000)
    for _ in range(200):
        port = random.randrange(first, low)
        if port_is_free(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # that band is full: take the kernel's pick
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Whether a listener could bind 127.0.0.1:`port` now (with SO_REUSEADDR, as asyncio's servers and etcd bind, so
    a port whose last connections linger in TIME_WAIT counts as free)."""
    if not 0 < port < 65536:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def to_toml(settings: Mapping[str, Any]) -> str:
    """BrokerConfig settings as TOML: scalars (str, int, float, bool) and lists of them at the top, one level of
    tables (`store`)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)  # (a JSON string is a TOML basic string)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"cannot write {v!r} as a TOML value")

    lines = [f"{k} = {value(v)}" for k, v in settings.items() if not isinstance(v, Mapping)]
    for table, items in settings.items():
        if isinstance(items, Mapping):
            lines.append(f"[{table}]")
            lines.extend(f"{k} = {value(v)}" for k, v in items.items())
    return "\n".join(lines) + "\n"


def _tail(path: Path, limit: int = 4000, start: int = 0) -> str:
    """The last `limit` bytes of the log at `path` from `start` on (what one run of a process wrote to it)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(start, f.tell() - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _end(proc: subprocess.Popen[Any], timeout: float) -> int:
    """SIGTERM `proc` (by its pid, through Popen), wait up to `timeout` s, then SIGKILL it; its exit code."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGCONT)  # a paused process would keep SIGTERM pending forever
            proc.terminate()
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    return _kill(proc)


def _kill(proc: subprocess.Popen[Any], timeout: float = 10.0) -> int:
    if proc.poll() is None:
        proc.kill()
    return proc.wait(timeout)


def _child_env() -> dict[str, str]:
    # etcd reads its whole configuration from ETCD_* variables too: one set for some other etcd would change this one
    return {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}


def _run_sync(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run a coroutine to completion from synchronous code, also when the caller is itself inside a running event
    loop (an async test that starts a cluster): then on a fresh loop in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mqk-cluster-local") as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def _watch_exit(proc: subprocess.Popen[Any], what: str, expected: Callable[[], bool], on_exit: ExitCallback) -> None:
    def wait() -> None:
        code = proc.wait()
        if not expected():
            on_exit(what, code)

    threading.Thread(target=wait, name=f"mqk-watch-{what}", daemon=True).start()


# --- etcd -----------------------------------------------------------------------------------------------------


class EtcdProcess:
    """One etcd member on loopback: `data_dir` holds its data, `<data_dir>.log` its log.

    `client_port` / `peer_port` are used when free (a restarted local cluster keeps its etcd URL), otherwise free
    ones are picked."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        binary: str = "etcd",
        client_port: int = 0,
        peer_port: int = 0,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        on_exit: ExitCallback | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.binary = binary
        self.client_port = client_port
        self.peer_port = peer_port
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.on_exit = on_exit
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0
        self._last_probe_error = ""
        self._expect_exit = False

    @property
    def url(self) -> str:
        return f"etcd://{LOOPBACK}:{self.client_port}"

    def log_tail(self, limit: int = 6000) -> str:
        """The tail of etcd's log since its last start."""
        return _tail(self.log_path, limit, self._log_start)

    @property
    def endpoints(self) -> list[Address]:
        return [(LOOPBACK, self.client_port)]

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise LocalClusterError("etcd is not started")
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> EtcdProcess:
        """Start etcd and return once it answers a read (it has a leader); EtcdNotFound, EtcdStartError."""
        return self._start(keep_ports=False)

    def restart(self) -> EtcdProcess:
        """Stop etcd if it runs, then start it again on the same data directory and the same ports, so the URL its
        clients hold stays good (they reconnect by themselves); EtcdStartError if a port was taken meanwhile."""
        self.stop()
        return self._start(keep_ports=True)

    def _start(self, *, keep_ports: bool) -> EtcdProcess:
        if self.running:
            raise LocalClusterError(f"etcd runs already (pid {self.pid})")
        if importlib.util.find_spec("aetcd") is None:  # (its readiness is asked through the etcd client)
            raise LocalClusterError("cluster mode needs the etcd client: pip install 'mqk[cluster]' (it brings aetcd)")
        path = shutil.which(self.binary)
        if path is None:
            raise EtcdNotFound(
                f"the etcd binary ({self.binary!r}) is not on PATH: install it ({ETCD_INSTALL_HINT}) "
                "or give a running etcd by its URL (etcd://HOST:PORT)"
            )
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(mode=0o700, exist_ok=True)  # (etcd warns about a data directory others can read)
        deadline = time.monotonic() + self.start_timeout
        self._expect_exit = True  # an exit while starting is raised here, not reported as a crash
        # a port picked free may be taken before etcd binds it: then etcd exits at once and is started again on
        # other ports
        for attempt in range(1 if keep_ports else 3):
            if not keep_ports:
                if attempt or not port_is_free(self.client_port):
                    self.client_port = free_port()
                if attempt or not port_is_free(self.peer_port):
                    self.peer_port = free_port()
                while self.peer_port == self.client_port:
                    self.peer_port = free_port()
            self._spawn(path)
            if self._wait_ready(deadline):
                self._expect_exit = False
                return self
            assert self.proc is not None
            code = self.proc.poll()
            log = _tail(self.log_path, start=self._log_start)
            if code is None or "address already in use" not in log or keep_ports or time.monotonic() >= deadline:
                _kill(self.proc)
                what = (
                    f"exited with code {code}"
                    if code is not None
                    else f"did not answer in {self.start_timeout} s ({self._last_probe_error or 'no answer'})"
                )
                raise EtcdStartError(f"etcd at {self.url} {what}; its log ({self.log_path}):\n{log}")
        raise EtcdStartError(f"etcd found no free ports to listen on; its log ({self.log_path}):\n{log}")

    def _spawn(self, path: str) -> None:
        peer = f"http://{LOOPBACK}:{self.peer_port}"
        client = f"http://{LOOPBACK}:{self.client_port}"
        name = "mqk-local"
        cmd = [
            path,
            "--name", name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{name}={peer}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"mqk-{uuid.uuid4().hex[:12]}",
            "--logger", "zap",
            "--log-level", "warn",
        ]  # fmt: skip
        self._log_start = _log_size(self.log_path)
        with open(self.log_path, "ab") as log:
            # its own session: a Ctrl-C in the terminal reaches the tool, which stops the brokers before their etcd
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=_child_env(), start_new_session=True
            )
        if self.on_exit is not None:
            _watch_exit(self.proc, "etcd", lambda: self._expect_exit, self.on_exit)

    def _wait_ready(self, deadline: float) -> bool:
        """Until `deadline`: whether etcd answers a linearizable read (False at once if it exits)."""
        proc = self.proc
        assert proc is not None

        async def probe() -> bool:
            while proc.poll() is None and time.monotonic() < deadline:
                client = EtcdClient(self.endpoints, timeout=1.0)
                try:
                    await client.connect()
                    await client.get("/mqk-local-probe")
                    return True
                except MetaUnavailable as exc:
                    self._last_probe_error = str(exc)
                    await asyncio.sleep(0.05)  # etcd gives no other sign of readiness to wait on
                finally:
                    await client.close()
            return False

        return bool(_run_sync(probe))

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after `stop_timeout` s; etcd's exit code (None if it was never started)."""
        if self.proc is None:
            return None
        self._expect_exit = True
        return _end(self.proc, self.stop_timeout)

    def kill(self) -> None:
        """SIGKILL."""
        if self.proc is not None:
            self._expect_exit = True
            _kill(self.proc)

    def __enter__(self) -> EtcdProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- brokers --------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class LocalBroker:
    """One `mqk serve --cluster` child process of a LocalCluster; its addresses are those of its last ready line."""

    node_id: int
    group: str
    data_dir: Path
    log_path: Path
    kafka: Address | None = None
    native: Address | None = None
    namesrv: Address | None = None
    #: where its group's replicas pull from while it is master
    replication: Address | None = None
    #: the admin HTTP listener (metrics, health)
    admin: Address | None = None
    #: the RocketMQ 5 gRPC listener, when the broker was started with one (`--grpc-listen`)
    grpc: Address | None = None
    proc: subprocess.Popen[str] | None = None
    paused: bool = False
    #: an exit of the process now is not reported as a crash: it is starting (an exit is raised then) or being
    #: stopped or killed on purpose
    expect_exit: bool = False
    #: where this run's part of the log starts (the log is appended to across restarts)
    log_start: int = 0
    #: the ready line's match, handed from the stdout reader to the waiter (None: stdout ended without one)
    ready_lines: queue.Queue[re.Match[str] | None] = field(default_factory=queue.Queue, repr=False)
    #: the listeners whose previous port someone else held when this run started (they listen on a new one)
    moved: set[str] = field(default_factory=set)
    #: named Kafka listener -> its address (the ready line's `kafka.NAME=` pairs)
    listeners: dict[str, Address] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise LocalClusterError(f"broker {self.node_id} is not started")
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def bootstrap(self) -> str:
        if self.kafka is None:
            raise LocalClusterError(f"broker {self.node_id} has not started")
        return f"{self.kafka[0]}:{self.kafka[1]}"

    def describe(self) -> str:
        """`broker NODE kafka=H:P native=H:P namesrv=H:P replication=H:P admin=H:P`."""

        def fmt(addr: Address | None) -> str:
            return f"{addr[0]}:{addr[1]}" if addr else "-"

        return (
            f"broker {self.node_id} kafka={fmt(self.kafka)} native={fmt(self.native)} namesrv={fmt(self.namesrv)} "
            f"replication={fmt(self.replication)} admin={fmt(self.admin)}"
        )

    def stderr(self) -> str:
        """The tail of what the broker's current (or last) run wrote to stderr (its log file)."""
        return _tail(self.log_path, start=self.log_start)


class LocalCluster:
    """etcd (started here, or the one at `etcd`: "etcd://HOST:PORT[,...]") and `brokers` broker processes, node ids
    0..brokers-1, everything under `data_dir`. The cluster id is `cluster_id`, else the one a previous LocalCluster
    left in `data_dir`, else a new unique one."""

    def __init__(
        self,
        data_dir: Path | str,
        brokers: int = 3,
        *,
        etcd: str | None = None,
        cluster_id: str | None = None,
        etcd_binary: str = "etcd",
        extra_args: Sequence[str] = (),
        group_size: int = 1,
        config: Mapping[str, Any] | None = None,
        broker_args: Mapping[int, Sequence[str]] | None = None,
        ready_timeout: float = 60.0,
        stop_timeout: float = 15.0,
        on_exit: ExitCallback | None = None,
    ) -> None:
        if brokers < 1:
            raise ValueError(f"a cluster needs at least one broker, not {brokers}")
        if etcd is not None:
            parse_endpoints(etcd)  # ValueError now rather than N brokers failing on it
        self.data_dir = Path(data_dir)
        self.state_path = self.data_dir / "cluster.json"
        state = self._load_state()
        self.cluster_id: str = cluster_id or state.get("cluster_id") or f"local-{uuid.uuid4().hex[:12]}"
        if "/" in self.cluster_id or not self.cluster_id:
            raise ValueError(f"cluster id {self.cluster_id!r} must be non-empty and contain no '/'")
        self.extra_args = list(extra_args)
        #: BrokerConfig settings every broker gets (a TOML file passed with --config), e.g.
        #: {"cluster_session_timeout_ms": 3000, "store": {"commitlog_segment_bytes": 1 << 26}}
        self.config = dict(config or {})
        #: flags one broker gets after the others (node id -> flags): a later flag wins over an earlier one
        self.broker_args = {int(n): list(a) for n, a in (broker_args or {}).items()}
        #: how long a broker may take to print its ready line; a restarted broker waits there for the lease of its
        #: previous incarnation to expire (the session timeout), so this is well above it
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.on_exit = on_exit
        self.etcd_process: EtcdProcess | None = None
        if etcd is None:
            ports = state.get("etcd") or {}
            self.etcd_process = EtcdProcess(
                self.data_dir / "etcd",
                binary=etcd_binary,
                client_port=int(ports.get("client", 0)),
                peer_port=int(ports.get("peer", 0)),
                on_exit=on_exit,
            )
        self._etcd_url = etcd
        if group_size < 1:
            raise ValueError(f"a broker group has at least one broker, not {group_size}")
        #: brokers per group: node i serves group-(i // group_size), so with 3 brokers and a group size of 3 one
        #: group of three replicates every partition three times
        self.group_size = group_size
        self.brokers = [
            LocalBroker(i, f"group-{i // group_size}", self.data_dir / f"broker-{i}", self.data_dir / f"broker-{i}.log")
            for i in range(brokers)
        ]
        #: the ports each broker listened on last (tried again at its next start, when free)
        self._last_ports: dict[int, dict[str, int]] = {
            int(node): {k: int(v) for k, v in ports.items()} for node, ports in (state.get("brokers") or {}).items()
        }

    # --- what tests and the CLI read ---------------------------------------------------------------------------

    @property
    def etcd_url(self) -> str:
        if self._etcd_url is not None:
            return self._etcd_url
        assert self.etcd_process is not None
        return self.etcd_process.url

    @property
    def etcd_endpoints(self) -> list[Address]:
        return parse_endpoints(self.etcd_url)

    @property
    def bootstrap(self) -> str:
        """Every broker's Kafka address, "H:P,H:P,..."."""
        return ",".join(b.bootstrap for b in self.brokers)

    @property
    def node_ids(self) -> list[int]:
        return [b.node_id for b in self.brokers]

    @property
    def pids(self) -> dict[int, int]:
        """node id -> pid of each broker process started (running or not)."""
        return {b.node_id: b.pid for b in self.brokers if b.proc is not None}

    def logs_tail(self, limit: int = 12_000) -> str:
        """The tail of each broker's log of its current (or last) run, and of etcd's when this cluster started it:
        what a failed test shows."""
        parts = [
            f"--- broker {b.node_id} ({b.log_path}) ---\n{_tail(b.log_path, limit, b.log_start)}" for b in self.brokers
        ]
        if self.etcd_process is not None:
            parts.append(f"--- etcd ({self.etcd_process.log_path}) ---\n{self.etcd_process.log_tail(limit)}")
        return "\n".join(parts)

    def broker(self, node_id: int) -> LocalBroker:
        for b in self.brokers:
            if b.node_id == node_id:
                return b
        raise KeyError(f"no broker {node_id} in this cluster (node ids {self.node_ids})")

    # --- life cycle ---------------------------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        """Start etcd (unless given) and every broker; return once each has printed its ready line. On failure,
        whatever was started is stopped and the error (EtcdNotFound, EtcdStartError, BrokerStartError) raised."""
        if any(b.running for b in self.brokers):
            raise LocalClusterError(f"cluster {self.cluster_id} runs already")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.etcd_process is not None:
                self.etcd_process.start()
            # spawned together, then waited for: their start-ups overlap
            for b in self.brokers:
                self._spawn(b)
            deadline = time.monotonic() + self.ready_timeout
            for b in self.brokers:
                self._wait_ready(b, deadline)
        except BaseException:
            self.stop()
            raise
        self._save_state()
        return self

    def stop(self) -> None:
        """Stop every broker (SIGTERM, then SIGKILL after `stop_timeout` s), then etcd if it was started here."""
        running = [b for b in self.brokers if b.proc is not None and b.proc.poll() is None]
        for b in running:
            assert b.proc is not None
            b.expect_exit = True
            b.proc.send_signal(signal.SIGCONT)  # a paused broker would keep SIGTERM pending forever
            b.paused = False
            b.proc.terminate()
        deadline = time.monotonic() + self.stop_timeout
        for b in running:
            assert b.proc is not None
            try:
                b.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill(b.proc)
        if self.etcd_process is not None:
            self.etcd_process.stop()

    def stop_etcd(self) -> int | None:
        """Stop the etcd this cluster started (SIGTERM; its data stays): the brokers run on without their meta
        service. Its exit code. LocalClusterError for a cluster on an etcd given by URL."""
        return self._own_etcd().stop()

    def restart_etcd(self) -> None:
        """Start this cluster's etcd again on its data directory and ports (after `stop_etcd`, or to bounce it);
        returns once it answers."""
        self._own_etcd().restart()

    def _own_etcd(self) -> EtcdProcess:
        if self.etcd_process is None:
            raise LocalClusterError(f"cluster {self.cluster_id} uses an etcd it did not start ({self.etcd_url})")
        return self.etcd_process

    def kill(self, node_id: int) -> None:
        """kill -9 one broker: no flush, no lease revoked; its registration goes when its lease expires."""
        b = self.broker(node_id)
        if b.proc is not None:
            b.expect_exit = True
            _kill(b.proc)
            b.paused = False

    def stop_broker(self, node_id: int) -> int | None:
        """Stop one broker cleanly (SIGTERM: it revokes its lease); its exit code."""
        b = self.broker(node_id)
        if b.proc is None:
            return None
        b.expect_exit = True
        b.paused = False
        return _end(b.proc, self.stop_timeout)

    def restart(self, node_id: int) -> LocalBroker:
        """Start one broker again (stopped first if it runs): same node id, group and data directory, and its
        previous ports where they are free. Returns once it has printed its ready line."""
        b = self.broker(node_id)
        if b.running:
            self.stop_broker(node_id)
        self._spawn(b)
        self._wait_ready(b, time.monotonic() + self.ready_timeout)
        self._save_state()
        return b

    def pause(self, node_id: int) -> None:
        """SIGSTOP: the broker stops answering anyone, etcd included (its lease expires after the session
        timeout)."""
        b = self.broker(node_id)
        if not b.running:
            raise LocalClusterError(f"broker {node_id} is not running")
        assert b.proc is not None
        b.proc.send_signal(signal.SIGSTOP)
        b.paused = True

    def resume(self, node_id: int) -> None:
        """SIGCONT."""
        b = self.broker(node_id)
        if not b.running:
            raise LocalClusterError(f"broker {node_id} is not running")
        assert b.proc is not None
        b.proc.send_signal(signal.SIGCONT)
        b.paused = False

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- one broker ---------------------------------------------------------------------------------------------

    def _spawn(self, b: LocalBroker) -> None:
        last = self._last_ports.get(b.node_id, {})
        b.moved = set()

        def listen(name: str) -> str:
            port = last.get(name, 0)
            if port and not port_is_free(port):
                b.moved.add(name)
                port = 0
            return f"{LOOPBACK}:{port}"

        cmd = [
            sys.executable, "-m", "mqk", "serve",
            "--cluster", self.etcd_url,
            "--cluster-id", self.cluster_id,
            "--node-id", str(b.node_id),
            "--broker-group", b.group,
            "--data-dir", str(b.data_dir),
            "--kafka-listen", listen("kafka"),
            "--native-listen", listen("native"),
            "--namesrv-listen", listen("namesrv"),
            "--replication-listen", listen("replication"),
            "--admin-listen", listen("admin"),
            *(["--config", str(self._config_file())] if self.config else []),
            *self.extra_args,
            *self.broker_args.get(b.node_id, ()),
        ]  # fmt: skip
        b.kafka = b.native = b.namesrv = b.replication = b.admin = b.grpc = None
        b.expect_exit = True
        b.paused = False
        b.ready_lines = queue.Queue()
        b.log_start = _log_size(b.log_path)
        with open(b.log_path, "ab") as log:
            # its own session: a Ctrl-C in the terminal reaches the tool, which stops the brokers before their etcd
            b.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=_child_env(),
                start_new_session=True,
            )
        assert b.proc.stdout is not None
        reader = threading.Thread(
            target=self._read_stdout, args=(b, b.proc, b.proc.stdout, b.ready_lines), name=f"mqk-broker-{b.node_id}"
        )
        reader.daemon = True
        reader.start()

    def _config_file(self) -> Path:
        path = self.data_dir / "brokers.toml"
        path.write_text(to_toml(self.config))
        return path

    def _read_stdout(
        self,
        b: LocalBroker,
        proc: subprocess.Popen[str],
        stdout: IO[str],
        lines: queue.Queue[re.Match[str] | None],
    ) -> None:
        """The broker's stdout to its end: the ready line is handed to `_wait_ready`, the rest read and dropped so
        the pipe never fills. At its end the broker has exited (reported unless it was stopped on purpose)."""
        try:
            for line in stdout:
                m = READY.search(line)
                if m:
                    lines.put(m)
        finally:
            stdout.close()
            lines.put(None)
        code = proc.wait()
        if self.on_exit is not None and not b.expect_exit and b.proc is proc:
            self.on_exit(f"broker {b.node_id}", code)

    def _wait_ready(self, b: LocalBroker, deadline: float) -> None:
        assert b.proc is not None
        try:
            m = b.ready_lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            b.expect_exit = True
            _kill(b.proc)
            raise BrokerStartError(
                f"broker {b.node_id} printed no ready line in {self.ready_timeout} s; its stderr ({b.log_path}):\n"
                f"{b.stderr()}",
                b.node_id,
                None,
                b.stderr(),
            ) from None
        if m is None:
            try:
                code = b.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:  # it closed its stdout but lives on: not a broker to keep
                b.expect_exit = True
                code = _kill(b.proc)
            raise BrokerStartError(
                f"broker {b.node_id} exited with code {code} before it was ready; its stderr ({b.log_path}):\n"
                f"{b.stderr()}",
                b.node_id,
                code,
                b.stderr(),
            )
        b.expect_exit = False
        g = m.groups()
        b.kafka, b.native, b.namesrv = (g[0], int(g[1])), (g[2], int(g[3])), (g[4], int(g[5]))
        b.listeners = {name: (host, int(port)) for name, host, port in NAMED_LISTENER.findall(m.string)}
        self._last_ports[b.node_id] = {"kafka": int(g[1]), "native": int(g[3]), "namesrv": int(g[5])}
        b.replication = ready_listener(m.string, "replication")
        b.admin = ready_listener(m.string, "admin")
        b.grpc = ready_listener(m.string, "grpc")
        for name in OPTIONAL_LISTENERS:
            address = getattr(b, name)
            if address is not None:
                self._last_ports[b.node_id][name] = address[1]

    # --- cluster.json -------------------------------------------------------------------------------------------

    def _load_state(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise LocalClusterError(
                f"{self.state_path}: unreadable ({exc}); move it away to start a new cluster"
            ) from None
        return doc if isinstance(doc, dict) else {}

    def _save_state(self) -> None:
        doc: dict[str, Any] = {
            "cluster_id": self.cluster_id,
            "brokers": {str(node): ports for node, ports in sorted(self._last_ports.items())},
        }
        if self.etcd_process is not None:
            doc["etcd"] = {"client": self.etcd_process.client_port, "peer": self.etcd_process.peer_port}
        tmp = self.state_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.state_path)


__all__ = [
    "READY",
    "BrokerStartError",
    "EtcdNotFound",
    "EtcdProcess",
    "EtcdStartError",
    "LocalBroker",
    "LocalCluster",
    "LocalClusterError",
    "free_port",
    "port_is_free",
]
