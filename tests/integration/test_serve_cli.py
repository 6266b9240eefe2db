"""The contracts outside tests rely on: the ready line, port 0, SIGTERM exits 0 and leaves a clean data dir."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from mqk.testing import BrokerProcess


def _connectable(addr: tuple[str, int]) -> bool:
    with socket.create_connection(addr, timeout=5):
        return True


@pytest.mark.parametrize("storage", ["file", "memory", "rocksdb"])
def test_serve_prints_ready_line_and_stops_cleanly(tmp_path, storage):
    broker = BrokerProcess(tmp_path / "data", storage=storage).start()
    try:
        for addr in (broker.kafka_address, broker.native_address, broker.namesrv_address):
            assert addr[0] == "127.0.0.1" and addr[1] > 0
            assert _connectable(addr)
        assert len({broker.kafka_address, broker.native_address, broker.namesrv_address}) == 3
    finally:
        code = broker.stop()
    assert code == 0, broker.log_text()
    assert not (tmp_path / "data" / "abort").exists()


def test_python_dash_m_is_the_same_program():
    out = subprocess.run([sys.executable, "-m", "mqk", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("mqk ")


def test_bad_flag_is_refused_with_a_message(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "mqk", "serve", "--kafka-listen", "nonsense", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0
    assert "HOST:PORT" in out.stderr


def test_serve_moves_what_recovery_built_out_of_the_gcs_reach(tmp_path):
    """`mqk serve` freezes its start-up objects (gc.freeze), so a full collection does not walk every recovered
    partition's objects: the count it logs grows with the partitions it recovered."""
    import re

    def frozen_after_start() -> int:
        broker = BrokerProcess(tmp_path / "data").start()
        try:
            if not (tmp_path / "made").exists():
                made = subprocess.run([sys.executable, "-m", "mqk", "topics", "create", "many", "--partitions", "300",
                                       "--bootstrap", broker.bootstrap], capture_output=True, text=True, timeout=60)
                assert made.returncode == 0, made.stderr
                (tmp_path / "made").touch()
        finally:
            assert broker.stop() == 0, broker.log_text()
        counts = re.findall(r"moved out of the cyclic GC's reach: (\d+)", broker.log_text())
        assert counts, broker.log_text()
        return int(counts[-1])

    empty = frozen_after_start()  # creates the topic after its start-up
    recovered = frozen_after_start()  # starts with 300 partitions to recover
    assert recovered - empty > 300 * 5
