"""Wake-ups for long-polling Fetch requests.

The store calls `notify(topic, queue_ends)` (registered with `StoreManager.add_listener`) whenever records become
visible, with a (queue, end offset) pair per partition that grew. A Fetch that found fewer than `min_bytes`
registers one future on every partition it reads and sleeps until any of them is resolved or its `max_wait_ms`
runs out. Each notify wakes and forgets every waiter of the partitions it names, so the cost of an append with
nobody waiting is one truth test.
"""
from __future__ import annotations

import asyncio
from typing import Iterable, Sequence


class DataWaiters:
    def __init__(self) -> None:
        self._waiting: dict[tuple[str, int], list[asyncio.Future]] = {}

    def notify(self, topic: str, queue_ends: Sequence[tuple[int, int]]) -> None:
        waiting = self._waiting
        if not waiting:
            return
        for queue, _end in queue_ends:
            futures = waiting.pop((topic, queue), None)
            if futures:
                for future in futures:
                    if not future.done():
                        future.set_result(None)

    async def wait(self, partitions: Iterable[tuple[str, int]], timeout: float) -> bool:
        """Sleep until new data on any of `partitions` or `timeout` seconds; True if woken by data."""
        if timeout <= 0:
            return False
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        keys = list(partitions)
        for key in keys:
            self._waiting.setdefault(key, []).append(future)
        handle = loop.call_later(timeout, _set_if_pending, future, False)
        try:
            return (await future) is None  # None: woken by data; False: timed out
        finally:
            handle.cancel()
            for key in keys:
                futures = self._waiting.get(key)
                if futures is not None:
                    try:
                        futures.remove(future)
                    except ValueError:
                        pass
                    if not futures:
                        del self._waiting[key]

    def wake_all(self) -> None:
        """Release every waiter (broker stopping)."""
        waiting, self._waiting = self._waiting, {}
        for futures in waiting.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)


def _set_if_pending(future: asyncio.Future, value: object) -> None:
    if not future.done():
        future.set_result(value)
