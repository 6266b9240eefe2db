"""Broker services that act on stored logs over time: retention, compaction, the disk guard.

Each owns one background coroutine through `BackgroundTask`: started once, cancelled and awaited at stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class BackgroundTask:
    """A service's single background loop: `start(factory)` runs it once; `stop()` cancels it and waits."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._task: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self, factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if self._task is None:
            self._task = asyncio.create_task(factory(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
