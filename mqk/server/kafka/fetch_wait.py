"""Wake-ups for long-polling Fetch requests.

The store calls `notify(topic, queue_ends)` (registered with `StoreManager.add_listener`) whenever records become
visible, with a (queue, end offset) pair per partition that grew. A Fetch that found fewer than `min_bytes`
sleeps on one future until any of its partitions grows or its `max_wait_ms` runs out. A wait on a few
partitions of a topic registers the future under each (topic, partition), and a notify wakes and forgets the
waiters of the partitions it names: with nobody waiting an append costs one truth test. A wait on many
partitions of a topic (a consumer assigned a large topic, which sends every partition in every Fetch) registers
once for the topic with the set of its partitions, so each wait does not cost a thousand registrations and
removals; a notify for that topic tests the partitions it names against the set.
"""
from __future__ import annotations

import asyncio
from typing import Iterable, Sequence

#: a wait on at least this many partitions of one topic registers once for the topic
WIDE = 32


class DataWaiters:
    def __init__(self) -> None:
        self._waiting: dict[tuple[str, int], list[asyncio.Future]] = {}
        #: per topic, the waits on many of its partitions: (future, partitions)
        self._wide: dict[str, list[tuple[asyncio.Future, frozenset[int]]]] = {}

    def notify(self, topic: str, queue_ends: Sequence[tuple[int, int]]) -> None:
        waiting = self._waiting
        if waiting:
            for queue, _end in queue_ends:
                futures = waiting.pop((topic, queue), None)
                if futures:
                    for future in futures:
                        if not future.done():
                            future.set_result(None)
        wide = self._wide.get(topic) if self._wide else None
        if wide:
            for future, queues in wide:
                if not future.done() and any(queue in queues for queue, _end in queue_ends):
                    future.set_result(None)  # its wait() removes the entry

    async def wait(self, partitions: Iterable[tuple[str, int]], timeout: float) -> bool:
        """Sleep until new data on any of `partitions` or `timeout` seconds; True if woken by data."""
        if timeout <= 0:
            return False
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        by_topic: dict[str, list[int]] = {}
        for topic, queue in partitions:
            by_topic.setdefault(topic, []).append(queue)
        keys: list[tuple[str, int]] = []
        wide: list[tuple[str, tuple[asyncio.Future, frozenset[int]]]] = []
        for topic, queues in by_topic.items():
            if len(queues) >= WIDE:
                entry = (future, frozenset(queues))
                self._wide.setdefault(topic, []).append(entry)
                wide.append((topic, entry))
            else:
                for queue in queues:
                    key = (topic, queue)
                    self._waiting.setdefault(key, []).append(future)
                    keys.append(key)
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
            for topic, entry in wide:
                entries = self._wide.get(topic)
                if entries is not None and entry in entries:  # (not after wake_all)
                    entries.remove(entry)
                    if not entries:
                        del self._wide[topic]

    def wake_all(self) -> None:
        """Release every waiter (broker stopping)."""
        waiting, self._waiting = self._waiting, {}
        wide, self._wide = self._wide, {}
        futures = [f for fs in waiting.values() for f in fs] + [f for entries in wide.values() for f, _q in entries]
        for future in futures:
            if not future.done():
                future.set_result(None)


def _set_if_pending(future: asyncio.Future, value: object) -> None:
    if not future.done():
        future.set_result(value)
