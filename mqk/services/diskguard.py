"""DiskGuard: refuse appends while the data dir's filesystem is fuller than `StoreConfig.disk_max_used_ratio`.

RocketMQ's diskMaxUsedSpaceRatio idea, for every persistent engine. Every `disk_check_interval_ms` the guard
measures the filesystem holding `data_dir` (statvfs, in a thread). Above the ratio:
- a put hook, first in `store.hooks` while the disk is full (and absent otherwise, so appends on a healthy disk
  pay nothing for it), refuses every append with `mqk.errors.StorageFull`, which the Kafka server answers with
  KAFKA_STORAGE_ERROR and the remoting server with SERVICE_NOT_AVAILABLE (remark: the reason);
- retention runs at once (the RetentionService passed in, else a private one), so expired data and the CommitLog
  segments nothing needs go now rather than at the next periodic check;
- reads, fetches, offset commits and admin calls go on.
Below the ratio again, appends are accepted by themselves. The guard never deletes unexpired data (Kafka keeps what
retention keeps; RocketMQ's forced cleaning of unexpired files is deliberately not copied): an operator frees space
with DeleteRecords / lower retention, and the guard notices.

This is the early refusal. A real ENOSPC (another process filled the disk, or a ratio of 1.0) is handled by the file
engine: its files are fully allocated at creation, so ENOSPC surfaces as StorageFull before any byte of an append
is written (the write position does not move; the tail stays clean for recovery). A memory default store touches no
disk, so the guard then does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from mqk.clock import SYSTEM_CLOCK, Clock
from mqk.config import BrokerConfig
from mqk.errors import StorageFull
from mqk.services import BackgroundTask
from mqk.services.retention import RetentionService
from mqk.store.adapter import PutContext

log = logging.getLogger("mqk.diskguard")

#: while the disk stays full, retention runs again after this long
RETRY_SECONDS = 2.0


def used_ratio(path: Path) -> float:
    """Share of the filesystem holding `path` in use, as `df`'s Use% counts it: used / (used + available to us).

    Not 1 - available / total: on a filesystem whose blocks are partly reserved for root, or shared with
    something that hides part of its size (overlay and container disks), that reads e.g. 88 % where df says 71 %,
    and the broker would refuse writes on a disk with tens of gigabytes free."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    used = st.f_blocks - st.f_bfree
    if used + st.f_bavail <= 0:
        return 0.0
    return used / (used + st.f_bavail)


class DiskGuard:
    def __init__(self, config: BrokerConfig, store: Any, retention: Any = None, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.store = store
        self.clock = clock  #: paces the periodic measurement and the retention retries while the disk stays full
        self.max_ratio = config.store.disk_max_used_ratio
        self.interval_ms = config.store.disk_check_interval_ms
        self.path = Path(config.store.data_dir)
        self.retention = retention
        self.full = False
        self.ratio = 0.0
        self.refused = 0  #: appends refused since start
        self.checks = 0  #: checks completed since start (periodic or called), with the retention they ran
        self._loop_task = BackgroundTask("mqk-diskguard")
        self._last_pass = 0.0
        self._guarding = False  #: between start and stop: the hook is in store.hooks while the disk is full

    async def start(self) -> DiskGuard:
        if not getattr(self.store, "persistent", True) or self._loop_task.running:
            return self
        self._guarding = True
        await self.check()
        self._loop_task.start(self._loop)
        return self

    async def stop(self) -> None:
        self._guarding = False
        self._place_hook(False)
        await self._loop_task.stop()

    def _place_hook(self, refusing: bool) -> None:
        hooks = self.store.hooks
        if refusing and self.hook not in hooks:
            hooks.insert(0, self.hook)  # first: refuse before any hook reroutes or records anything
        elif not refusing and self.hook in hooks:
            hooks.remove(self.hook)

    def hook(self, ctx: PutContext) -> None:
        if self.full:
            self.refused += 1
            raise StorageFull(
                f"disk {self.ratio:.1%} used, above disk_max_used_ratio {self.max_ratio:.0%}: "
                f"appends to {ctx.topic} refused until space is freed"
            )

    async def _loop(self) -> None:
        while True:
            await self.clock.sleep(self.interval_ms / 1000)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:  # keep guarding; a failed measurement keeps the last state
                log.exception("disk guard check failed")

    async def check(self) -> bool:
        """Measure now; returns whether appends are refused."""
        self.ratio = await asyncio.to_thread(used_ratio, self.path)
        full = self.ratio > self.max_ratio
        if full and not self.full:
            log.error(
                "disk %.1f%% used (limit %.0f%%): refusing appends, running retention now",
                self.ratio * 100,
                self.max_ratio * 100,
            )
        elif self.full and not full:
            log.warning("disk %.1f%% used: accepting appends again", self.ratio * 100)
        was_full, self.full = self.full, full
        self._place_hook(full and self._guarding)
        # retention at once when the disk fills, then at most every RETRY_SECONDS while it stays full (a pass
        # walks every topic; one that frees nothing should not run every second)
        if full and (not was_full or self.clock.monotonic() - self._last_pass >= RETRY_SECONDS):
            self._last_pass = self.clock.monotonic()
            await self._free_space()
        self.checks += 1
        return self.full

    async def _free_space(self) -> None:
        retention = self.retention
        if retention is None:
            retention = self.retention = RetentionService(self.config, self.store, clock=self.clock)
        report = await retention.run_once()
        if report.freed_bytes:
            self.ratio = await asyncio.to_thread(used_ratio, self.path)
            self.full = self.ratio > self.max_ratio
            self._place_hook(self.full and self._guarding)
            log.warning("retention freed %d bytes; disk %.1f%% used", report.freed_bytes, self.ratio * 100)


__all__ = ["DiskGuard", "used_ratio"]
