"""A cluster on one machine, for real: etcd and `mqk serve --cluster` processes (mqk.cluster_local, the `mqk_cluster`
fixture and `mqk cluster local`), checked through what the brokers register in etcd.

Registrations are followed through an etcd watch (`Registrations`), so every wait ends on the change it waits for;
each is bounded. Every process is stopped by pid (the fixtures' teardown, or the test's own `finally`).
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest
from helpers import CLUSTER_TESTS, WatchedKeys

from mqk.broker.cluster.model import BrokerRecord
from mqk.cluster_local import BrokerStartError, LocalCluster, free_port
from mqk.meta import Record, parse_endpoints

pytestmark = CLUSTER_TESTS

#: the brokers' lease TTL (BrokerConfig.cluster_session_timeout_ms): a dead or paused broker's key goes after it
SESSION_TIMEOUT_S = 6
#: how long a wait for a lease to expire may take: the session timeout, and room for a machine busy with other tests
EXPIRY_WAIT_S = SESSION_TIMEOUT_S + 24
#: how long a wait for a process (a broker's start, a registration) may take
PROCESS_WAIT_S = 60


class Registrations(WatchedKeys):
    """The `brokers/` keys of one cluster."""

    def __init__(self, etcd_url: str, cluster_id: str) -> None:
        super().__init__(parse_endpoints(etcd_url), f"/mqk/{cluster_id}/brokers/")

    @property
    def nodes(self) -> dict[int, Record]:
        return {int(name): record for name, record in self.records.items()}

    async def registered(
        self,
        predicate: Callable[[dict[int, Record]], object],
        what: str,
        timeout: float = PROCESS_WAIT_S,  # noqa: ASYNC109 - a bound that fails the test with `what`, not a cancel
    ) -> dict[int, Record]:
        """Wait until `predicate` holds for the registrations (node id -> record); those registrations."""
        await self.until(lambda keys: predicate(self.nodes), what, timeout)
        return self.nodes


def listeners_of(cluster: LocalCluster, node_id: int) -> dict[str, str]:
    """What broker `node_id` printed on its ready line, as the listeners it must have registered."""
    b = cluster.broker(node_id)
    assert b.kafka and b.native and b.namesrv and b.replication and b.admin
    named = (
        ("kafka", b.kafka),
        ("native", b.native),
        ("namesrv", b.namesrv),
        ("replication", b.replication),
        ("admin", b.admin),  # (a console hands a group's offset reset to the coordinator's)
    )
    return {name: f"{h}:{p}" for name, (h, p) in named}


def pid_alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone: it runs no more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_three_brokers_register_with_their_addresses(mqk_cluster: LocalCluster) -> None:
    assert mqk_cluster.node_ids == [0, 1, 2]
    assert mqk_cluster.bootstrap == ",".join(b.bootstrap for b in mqk_cluster.brokers)
    assert len(set(mqk_cluster.pids.values())) == 3 and all(map(pid_alive, mqk_cluster.pids.values()))
    async with Registrations(mqk_cluster.etcd_url, mqk_cluster.cluster_id) as regs:
        records = await regs.registered(lambda r: len(r) == 3, "three registrations")
    assert sorted(records) == [0, 1, 2]
    for node, record in records.items():
        broker = BrokerRecord.decode(record.value)
        assert broker.node_id == node
        assert broker.group == f"group-{node}"
        assert broker.listeners == listeners_of(mqk_cluster, node)
        assert record.lease != 0  # under a lease: gone when the broker is
    assert len({r.lease for r in records.values()}) == 3
    # every address is on loopback and every listener answers
    for b in mqk_cluster.brokers:
        for address in (b.kafka, b.native, b.namesrv):
            assert address is not None and address[0] == "127.0.0.1"
            socket.create_connection(address, timeout=5).close()


async def test_killed_broker_loses_its_registration_and_gets_it_back_on_restart(mqk_cluster: LocalCluster) -> None:
    async with Registrations(mqk_cluster.etcd_url, mqk_cluster.cluster_id) as regs:
        before = await regs.registered(lambda r: len(r) == 3, "three registrations")
        old_pid = mqk_cluster.broker(1).pid
        old_ports = listeners_of(mqk_cluster, 1)

        mqk_cluster.kill(1)
        assert not pid_alive(old_pid)
        after = await regs.registered(lambda r: 1 not in r, "the killed broker's key to expire", EXPIRY_WAIT_S)
        # the others were left alone: the same keys, under the same leases, never rewritten
        assert sorted(after) == [0, 2]
        for node in (0, 2):
            assert after[node].lease == before[node].lease
            assert after[node].mod_revision == before[node].mod_revision

        restarted = mqk_cluster.restart(1)
        assert restarted.pid != old_pid and pid_alive(restarted.pid)
        # its old ports again, where they were free (a test beside this one may have taken one meanwhile)
        new_ports = listeners_of(mqk_cluster, 1)
        kept = set(old_ports) - restarted.moved
        assert kept and {n: new_ports[n] for n in kept} == {n: old_ports[n] for n in kept}
        again = await regs.registered(lambda r: 1 in r, "the restarted broker's registration")
        assert again[1].lease != before[1].lease
        assert BrokerRecord.decode(again[1].value).listeners == new_ports
        assert sorted(again) == [0, 1, 2]


async def test_paused_broker_loses_its_registration_and_registers_again_after_resume(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = mqk_cluster_factory(2)
    async with Registrations(cluster.etcd_url, cluster.cluster_id) as regs:
        before = await regs.registered(lambda r: len(r) == 2, "two registrations")
        pid = cluster.broker(1).pid

        cluster.pause(1)
        try:
            await regs.registered(lambda r: 1 not in r, "the paused broker's lease to expire", EXPIRY_WAIT_S)
            assert 0 in regs.nodes
        finally:
            cluster.resume(1)

        # the same process (never restarted) finds its lease gone and registers under a new one
        again = await regs.registered(
            lambda r: 1 in r and r[1].lease != before[1].lease, "the resumed broker to register again", EXPIRY_WAIT_S
        )
        assert cluster.broker(1).pid == pid and pid_alive(pid)
        assert BrokerRecord.decode(again[1].value).listeners == listeners_of(cluster, 1)
        assert again[0].lease == before[0].lease


def test_broker_without_etcd_exits_with_code_3_and_says_why(tmp_path: Path) -> None:
    dead = f"etcd://127.0.0.1:{free_port()}"  # nothing listens there
    proc = subprocess.run(
        [
            sys.executable, "-m", "mqk", "serve",
            "--cluster", dead,
            "--node-id", "0",
            "--data-dir", str(tmp_path / "data"),
            "--kafka-listen", "127.0.0.1:0",
            "--native-listen", "127.0.0.1:0",
            "--namesrv-listen", "127.0.0.1:0",
            "--admin-listen", "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=PROCESS_WAIT_S,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert "mqk ready" not in proc.stdout
    assert "cannot join cluster" in proc.stderr and "etcd unreachable" in proc.stderr
    assert dead.removeprefix("etcd://") in proc.stderr

    # LocalCluster says the same, with the exit code, and leaves nothing running
    cluster = LocalCluster(tmp_path / "cluster", 1, etcd=dead)
    with pytest.raises(BrokerStartError) as failed:
        cluster.start()
    assert failed.value.returncode == 3 and failed.value.node_id == 0
    assert "exited with code 3" in str(failed.value) and "etcd unreachable" in str(failed.value)
    assert not cluster.broker(0).running


def test_restart_takes_a_new_port_when_its_old_one_is_taken(mqk_cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = mqk_cluster_factory(1)
    old = cluster.broker(0).kafka
    assert old is not None
    cluster.stop_broker(0)  # a clean stop revokes its lease: the restart need not wait for it to expire
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(old)
        squatter.listen()
        restarted = cluster.restart(0)
    assert restarted.kafka is not None and restarted.kafka != old
    socket.create_connection(restarted.kafka, timeout=5).close()


# --- mqk cluster local --------------------------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    """Pids of the live child processes of `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def read_lines(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


async def test_cluster_local_command_prints_its_brokers_and_stops_them_on_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen(  # noqa: ASYNC220 - it is started once and read by a thread; nothing waits on it here
        [sys.executable, "-m", "mqk", "cluster", "local", "--brokers", "2", "--data-dir", str(tmp_path / "cl")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=read_lines, args=(proc.stdout, lines), daemon=True).start()
    children: list[int] = []
    try:
        out: list[str] = []
        while not out or not out[-1].startswith("bootstrap="):
            line = await asyncio.to_thread(lines.get, timeout=PROCESS_WAIT_S)
            assert line is not None, f"mqk cluster local ended early: {out}\n{proc.stderr.read()}"
            out.append(line)
        assert out[0].startswith("etcd=etcd://127.0.0.1:") and " cluster-id=" in out[0]
        etcd_url, cluster_id = out[0].removeprefix("etcd=").split(" cluster-id=")
        brokers = [line.split() for line in out[1:-1]]
        assert [b[:2] for b in brokers] == [["broker", "0"], ["broker", "1"]]
        listeners = {int(b[1]): dict(item.split("=", 1) for item in b[2:]) for b in brokers}
        assert all(sorted(ls) == ["admin", "kafka", "namesrv", "native", "replication"] for ls in listeners.values())
        # the admin listener (HTTP: metrics, health, the console) is registered for the peers' consoles (a group's
        # offset reset goes to its coordinator's); clients are never told of it (Metadata names Kafka listeners)
        assert all(ls["admin"].startswith("127.0.0.1:") for ls in listeners.values())
        assert out[-1] == "bootstrap=" + ",".join(listeners[n]["kafka"] for n in (0, 1))

        children = children_of(proc.pid)
        assert len(children) == 3  # etcd and two brokers
        async with Registrations(etcd_url, cluster_id) as regs:
            records = await regs.registered(lambda r: len(r) == 2, "both brokers' registrations")
        assert {n: BrokerRecord.decode(r.value).listeners for n, r in records.items()} == listeners

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, PROCESS_WAIT_S) == 0
        assert not [pid for pid in children if pid_alive(pid)]
        for ls in listeners.values():
            host, port = ls["kafka"].rsplit(":", 1)
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((host, int(port)), timeout=5).close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in children:  # only if the command left them behind (the test has failed then)
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.stdout.close()
        proc.stderr.close()


def test_cluster_local_command_without_etcd_says_how_to_install_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mqk", "cluster", "local", "--brokers", "1", "--data-dir", str(tmp_path / "cl")],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(tmp_path / "empty")},
        timeout=PROCESS_WAIT_S,
    )
    assert proc.returncode == 2
    assert "etcd" in proc.stderr and "apt-get install -y etcd-server" in proc.stderr
    assert proc.stdout == ""
