"""Connection limits of a broker's listeners (Kafka's `max.connections`, `max.connections.per.ip` and
`connections.max.idle.ms`), shared by every listener: the Kafka ones, the RocketMQ broker listener and the name
server (mqk.server.native.remoting), so the totals count every protocol's connections together.

- Admission: a connection past `max_connections` (all Kafka listeners together) or past `max_connections_per_ip`
  (from its address) is closed as soon as it is accepted, with one log line; the connections already open go on
  undisturbed. On a TLS listener a connection is counted once its handshake is done (the handshake has its own
  deadline, `tls.handshake_timeout_ms`).
- Idleness: a connection that has neither sent nor been sent a byte for `connections_max_idle_ms`, with no request
  of its own waiting for an answer, is closed (Kafka's default: 10 minutes). Connections do not read a clock per
  read: each counts its reads and writes (`activity`), and a sweep every quarter of the limit (at most every 30 s)
  notes which counts have not moved since the last; one whose count stood still for the limit is idle. A
  connection is thus closed between the limit and the limit plus one sweep after its last byte.

Nothing here knows a protocol: a connection is anything with `activity`, `busy` and `close`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from mqk.clock import Clock

log = logging.getLogger("mqk.limits")

#: the longest pause between two idleness sweeps
MAX_SWEEP_S = 30.0


class Limited(Protocol):
    """What the idleness sweep needs of a connection."""

    #: grows with every read and write
    activity: int

    @property
    def busy(self) -> bool:
        """Whether a request of its own waits for an answer (a long poll is not idleness)."""
        ...

    def close(self, reason: str, level: int = logging.WARNING) -> None: ...


class ConnectionLimits:
    def __init__(self, max_connections: int, max_per_ip: int, max_idle_ms: int, clock: Clock) -> None:
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.max_idle_s = max_idle_ms / 1000
        self.clock = clock
        self.total = 0
        self._by_host: dict[str, int] = {}
        #: id(connection) -> (its activity count when last seen to move, when)
        self._seen: dict[int, tuple[int, float]] = {}
        #: connections refused at accept (for /metrics and tests)
        self.refused = 0
        #: connections closed for idleness
        self.idle_closed = 0

    def admit(self, host: str) -> str | None:
        """Count a new connection from `host`, or say why it is refused (it is then not counted)."""
        if self.total >= self.max_connections:
            self.refused += 1
            return f"max_connections ({self.max_connections}) reached"
        count = self._by_host.get(host, 0)
        if count >= self.max_per_ip:
            self.refused += 1
            return f"max_connections_per_ip ({self.max_per_ip}) reached for {host}"
        self._by_host[host] = count + 1
        self.total += 1
        return None

    def release(self, host: str, connection: object) -> None:
        """An admitted connection from `host` ended."""
        self.total -= 1
        count = self._by_host.get(host, 0) - 1
        if count > 0:
            self._by_host[host] = count
        else:
            self._by_host.pop(host, None)
        self._seen.pop(id(connection), None)

    def connections_from(self, host: str) -> int:
        return self._by_host.get(host, 0)

    @property
    def sweep_interval_s(self) -> float:
        return max(0.01, min(self.max_idle_s / 4, MAX_SWEEP_S))

    def sweep(self, connections: Iterable[Limited]) -> None:
        """Close the connections idle for the limit (see the module docstring)."""
        now = self.clock.monotonic()
        seen = self._seen
        for conn in list(connections):
            key = id(conn)
            last = seen.get(key)
            if last is None or last[0] != conn.activity or conn.busy:
                seen[key] = (conn.activity, now)
            elif now - last[1] >= self.max_idle_s:
                seen[key] = (conn.activity, now)  # (it leaves the set once its transport is gone)
                self.idle_closed += 1
                conn.close(
                    f"idle for more than connections_max_idle_ms ({self.max_idle_s * 1000:.0f} ms)", logging.INFO
                )

    async def run_sweeps(self, connections: Callable[[], Iterable[Limited]]) -> None:
        """Sweep every `sweep_interval_s` until cancelled."""
        while True:
            await self.clock.sleep(self.sweep_interval_s)
            try:
                self.sweep(connections())
            except Exception:  # a sweep bug must not end the sweeps (nor the broker)
                log.exception("connection idleness sweep failed")
                await asyncio.sleep(0)
