"""A task that does its work each time it is woken: the shape of the controller and the topic reconciler, which
both react to changes of the cluster view.

Wakes that come while the work runs fold into one more run (an `asyncio.Event`, not a queue: the work reads the
current view, so one run sees every change before it). The work may ask to run again after a pause (etcd
unreachable, a store error) so a lasting fault is retried, not spun on; a run that raises is logged and tried again
a second later, so no exception ends the task while the broker lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("mqk.cluster")

#: how soon a run that raised is tried again
FAILED_RUN_RETRY_S = 1.0


class WokenTask:
    def __init__(self, name: str, work: Callable[[], Awaitable[float | None]]) -> None:
        """`work` runs once per wake; a number it returns is the seconds after which it runs again unwoken."""
        self.name = name
        self._work = work
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                again_after = await self._work()
            except Exception:  # a bug in one run must not end the task for the broker's life: logged, run again
                log.exception("%s: a run failed; trying again in %g s", self.name, FAILED_RUN_RETRY_S)
                again_after = FAILED_RUN_RETRY_S
            if again_after is not None:
                await asyncio.sleep(again_after)  # (the fault the work met: try again then, not in a busy loop)
                self._wake.set()
