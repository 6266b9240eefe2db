"""A task that does its work each time it is woken: the shape of the controller and the topic reconciler, which
both react to changes of the cluster view.

Wakes that come while the work runs fold into one more run (an `asyncio.Event`, not a queue: the work reads the
current view, so one run sees every change before it). The work may ask to run again after a pause (etcd
unreachable, a store error) so a lasting fault is retried, not spun on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable


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
            again_after = await self._work()
            if again_after is not None:
                await asyncio.sleep(again_after)  # (the fault the work met: try again then, not in a busy loop)
                self._wake.set()
