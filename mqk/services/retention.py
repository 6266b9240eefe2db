"""RetentionService: Kafka's time and size retention for every topic on every engine, and the space reclaim after it.

Owns *when* retention runs and *which* limits apply; the engines own *how* a log start moves (`delete_before`,
driven by `StorageAdapter.expire`) and how space comes back (`reclaim`; for the file engine
`mqk.store.file.reclaim`, which frees whole CommitLog segments once no shard needs them).

Per topic, with Kafka's names, semantics and defaults (TopicConfig):
- only topics whose `cleanup.policy` includes `delete` are subject to retention (`compact` alone keeps data until
  the compactor removes it; `compact,delete` gets both);
- `retention.ms` (default 7 days): head batches whose own max timestamp is older than now - retention.ms go;
- `retention.bytes` (default -1): head batches go while the rest still holds at least retention.bytes;
- `-1` disables a limit. The log start offset moves in whole batches, so ListOffsets(earliest), Fetch's
  OFFSET_OUT_OF_RANGE and the remoting min offset (all read `log_start_offset`) agree with it at once.

Runs every `BrokerConfig.log_retention_check_interval_ms` (Kafka's log.retention.check.interval.ms) and on demand:
`await run_once()` (tests, admin) or `trigger()` (the disk guard, when the disk fills). Pending timer messages are
pinned: the internal timer topic's log start never passes the timer's delivered floor (its saved state), whatever
its retention says, and file reclaim's fileReservedTime never moves it past that either. The floor is read from the
timer's side file, or, in cluster mode where the timer keeps its state in the log, asked of `pin_source`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from mqk.clock import SYSTEM_CLOCK, Clock, wait_event
from mqk.config import BrokerConfig
from mqk.errors import StorageError, UnknownShard
from mqk.services import BackgroundTask
from mqk.store.adapter import ExpireResult

log = logging.getLogger("mqk.retention")

TIMER_TOPIC = "__mqk_timer"  # mqk.timer.service.TIMER_TOPIC (not imported: services do not depend on each other)
TIMER_STATE = "timer"


@dataclass
class RetentionReport:
    """What one pass did: per shard moves and the bytes each engine gave back."""

    moved: dict[tuple[str, int], ExpireResult] = field(default_factory=dict)
    freed: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def freed_bytes(self) -> int:
        return sum(self.freed.values())


def retention_limits(config: Any) -> tuple[int, int] | None:
    """(retention.ms, retention.bytes) of a TopicConfig, or None when its cleanup.policy has no `delete`."""
    policies = {p.strip() for p in config.get("cleanup.policy").split(",")}
    if "delete" not in policies:
        return None
    try:
        return config.get_int("retention.ms"), config.get_int("retention.bytes")
    except ValueError:
        return None


class RetentionService:
    def __init__(
        self,
        config: BrokerConfig,
        store: Any,
        *,
        clock: Clock = SYSTEM_CLOCK,
        pin_source: Callable[[], Awaitable[dict[tuple[str, int], int]]] | None = None,
    ) -> None:
        """`pin_source`: where the pins come from when not from the timer's side file (the cluster timer's
        `retention_pins`)."""
        self.config = config
        self.store = store
        self.pin_source = pin_source
        self.clock = clock  #: says when the periodic pass is due and what "now" a pass measures retention.ms from
        self.interval_ms = config.log_retention_check_interval_ms
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._loop_task = BackgroundTask("mqk-retention")
        self.passes = 0
        self.last_report: RetentionReport | None = None

    async def start(self) -> RetentionService:
        self._loop_task.start(self._loop)
        return self

    async def stop(self) -> None:
        await self._loop_task.stop()

    def trigger(self) -> None:
        """Run a pass now (from the event loop thread), without waiting for it."""
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            await wait_event(self.clock, self._wake, self.interval_ms / 1000)
            self._wake.clear()
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed pass is logged; the next one tries again
                log.exception("retention pass failed")

    def pins(self) -> dict[tuple[str, int], int]:
        """Offsets retention must not pass: the timer topic's delivered floor (pending timer messages)."""
        pins: dict[tuple[str, int], int] = {}
        if self.store.topic(TIMER_TOPIC) is not None:
            try:
                state = self.store.load_state(TIMER_STATE) or {}
                pins[(TIMER_TOPIC, 0)] = int(state.get("floor", 0))
            except (StorageError, ValueError, TypeError):
                pins[(TIMER_TOPIC, 0)] = self.store.log_start_offset(TIMER_TOPIC, 0)
        return pins

    async def run_once(self, now: int | None = None) -> RetentionReport:
        """One retention pass over every topic, then a reclaim pass on every engine."""
        async with self._lock:
            now = self.clock.time_ms() if now is None else now
            report = RetentionReport()
            pins = self.pins() if self.pin_source is None else await self.pin_source()
            for name, info in self.store.topics().items():
                limits = retention_limits(info.config)
                if limits is None or limits == (-1, -1):
                    continue
                retention_ms, retention_bytes = limits
                try:
                    engine = self.store.engine_of(name)
                except (UnknownShard, StorageError):
                    continue
                for queue in range(info.queue_count):
                    try:
                        result = await engine.expire(
                            name, queue, now, retention_ms, retention_bytes, pins.get((name, queue))
                        )
                    except UnknownShard:
                        break  # deleted while we walked
                    except StorageError as exc:
                        report.errors.append(f"{name}-{queue}: {exc}")
                        log.error("retention of %s-%d failed: %s", name, queue, exc)
                        continue
                    if result.moved:
                        report.moved[(name, queue)] = result
                        log.info(
                            "retention (%s): %s-%d log start %d -> %d",
                            result.reason,
                            name,
                            queue,
                            result.old_start,
                            result.new_start,
                        )
            for engine_name, engine in self.store.engines.items():
                try:
                    report.freed[engine_name] = await reclaim_engine(engine, now, pins)
                except (StorageError, OSError) as exc:
                    report.errors.append(f"reclaim {engine_name}: {exc}")
                    log.error("reclaim on the %s engine failed: %s", engine_name, exc)
            self.passes += 1
            self.last_report = report
            return report


async def reclaim_engine(engine: Any, now: int, pins: dict[tuple[str, int], int]) -> int:
    """The engine's reclaim pass, with its own configured reserved time (StorageAdapter.reclaim)."""
    return await engine.reclaim(now, None, pins)


__all__ = ["RetentionReport", "RetentionService", "reclaim_engine", "retention_limits"]
