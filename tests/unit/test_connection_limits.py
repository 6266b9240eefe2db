"""mqk.server.limits on its own: admission by total and by address, release, and the idleness sweep on a FakeClock
(fake connections: only their activity counts and whether they wait for an answer matter)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from mqk.cli import _serve_parser, build_config
from mqk.clock import FakeClock
from mqk.config import BrokerConfig
from mqk.server.limits import MAX_SWEEP_S, ConnectionLimits


class Conn:
    def __init__(self) -> None:
        self.activity = 0
        self.busy = False
        self.closed: str | None = None

    def close(self, reason: str, level: int = logging.WARNING) -> None:
        self.closed = reason


def test_admission_by_total_and_by_address() -> None:
    limits = ConnectionLimits(3, 2, 600_000, FakeClock())
    a1, a2 = object(), object()
    assert limits.admit("10.0.0.1") is None and limits.admit("10.0.0.1") is None
    refusal = limits.admit("10.0.0.1")
    assert refusal is not None and "max_connections_per_ip (2)" in refusal
    assert limits.admit("10.0.0.2") is None
    refusal = limits.admit("10.0.0.3")
    assert refusal is not None and "max_connections (3)" in refusal
    assert limits.refused == 2 and limits.total == 3
    limits.release("10.0.0.1", a1)
    assert limits.connections_from("10.0.0.1") == 1
    assert limits.admit("10.0.0.3") is None  # a slot freed is a slot taken
    limits.release("10.0.0.1", a2)
    assert limits.connections_from("10.0.0.1") == 0 and limits.total == 2


async def test_idle_connections_are_closed_and_busy_or_active_ones_are_not() -> None:
    clock = FakeClock()
    limits = ConnectionLimits(100, 100, 1000, clock)
    assert limits.sweep_interval_s == 0.25
    idle, active, polling = Conn(), Conn(), Conn()
    polling.busy = True
    conns = [idle, active, polling]
    limits.sweep(conns)  # first sight: every count "moved"
    for _ in range(5):  # to 1.25 s
        await clock.advance(0.25)
        active.activity += 1
        limits.sweep(conns)
    assert idle.closed is not None and "connections_max_idle_ms (1000 ms)" in idle.closed
    assert active.closed is None and polling.closed is None
    assert limits.idle_closed == 1


def test_the_sweep_interval_is_bounded() -> None:
    assert ConnectionLimits(1, 1, 600_000, FakeClock()).sweep_interval_s == MAX_SWEEP_S


def test_the_limits_come_from_the_toml_file_and_the_flags(tmp_path: Path) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text("message_max_bytes = 4194304\nmax_connections = 100\nmax_connections_per_ip = 10\n")
    config = BrokerConfig.load(toml)
    assert (config.message_max_bytes, config.max_connections, config.max_connections_per_ip) == (4194304, 100, 10)
    assert config.connections_max_idle_ms == 600_000  # Kafka's default
    parser = argparse.ArgumentParser()
    _serve_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["serve", "--config", str(toml), "--max-connections-per-ip", "3", "--connections-max-idle-ms", "5000"]
    )
    config = build_config(args)
    assert (config.max_connections, config.max_connections_per_ip, config.connections_max_idle_ms) == (100, 3, 5000)
    with pytest.raises(ValueError, match="max_connections"):
        BrokerConfig(max_connections_per_ip=0)
