"""The wake-up hub: long polls (Kafka Fetch, RocketMQ pull) sleep here until their partitions grow.

The store calls `notify(topic, queue_ends)` (registered with `StoreManager.add_listener`) whenever records become
visible, with a (queue, end offset) pair per queue that grew. A long poll that found too little sleeps on one
future until any of its partitions grows or its timeout (on the broker's clock) runs out.

Cost on the append path: with nobody waiting, a notify is one truth test. A wait on a few partitions of a topic
registers the future under each (topic, queue), and a notify wakes and forgets the waiters of the queues it names.
A wait on many partitions of one topic (a Kafka consumer assigned a large topic, which names every partition in
every Fetch) registers once for the topic with the set of its partitions, so each wait does not cost a thousand
registrations and removals; a notify for that topic tests the queues it names against the set.

A notify may come from another thread (an engine that publishes from a writer thread): it is then handed to the
event loop the hub was bound to (`bind`), since futures may only be completed on their own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Sequence

from mqk.clock import SYSTEM_CLOCK, Clock

#: a wait on at least this many partitions of one topic registers once for the topic
WIDE = 32


class WakeupHub:
    __slots__ = ("_clock", "_loop", "_thread", "_waiting", "_wide")

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        #: (topic, queue) -> the futures of the narrow waits on it
        self._waiting: dict[tuple[str, int], list[asyncio.Future[object]]] = {}
        #: topic -> the wide waits on it: (future, its queues)
        self._wide: dict[str, list[tuple[asyncio.Future[object], frozenset[int]]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the waits run on: a notify from any other thread is handed to it."""
        self._loop, self._thread = loop, threading.get_ident()

    def notify(self, topic: str, queue_ends: Sequence[tuple[int, int]]) -> None:
        """The store's data listener: wake the waits on any queue of `topic` in `queue_ends`."""
        if not (self._waiting or self._wide):
            return
        loop = self._loop
        if loop is not None and threading.get_ident() != self._thread:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
                loop.call_soon_threadsafe(self._wake, topic, tuple(queue_ends))
            return
        self._wake(topic, queue_ends)

    def _wake(self, topic: str, queue_ends: Sequence[tuple[int, int]]) -> None:
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

    async def wait(self, partitions: Iterable[tuple[str, int]], seconds: float) -> bool:
        """Sleep until new data on any of `partitions` or for `seconds` on the hub's clock; True if woken by data."""
        if seconds <= 0:
            return False
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        by_topic: dict[str, list[int]] = {}
        for topic, queue in partitions:
            by_topic.setdefault(topic, []).append(queue)
        keys: list[tuple[str, int]] = []
        wide: list[tuple[str, tuple[asyncio.Future[object], frozenset[int]]]] = []
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
        handle = self._clock.call_later(seconds, _set_if_pending, future, False)
        try:
            return (await future) is None  # None: woken by data; False: timed out
        finally:
            handle.cancel()
            for key in keys:
                futures = self._waiting.get(key)
                if futures is not None:
                    if future in futures:  # (not after a notify or wake_all took the list)
                        futures.remove(future)
                    if not futures:
                        del self._waiting[key]
            for topic, entry in wide:
                entries = self._wide.get(topic)
                if entries is not None and entry in entries:  # (not after wake_all)
                    entries.remove(entry)
                    if not entries:
                        del self._wide[topic]

    def waiting_on(self, topic: str, queue: int) -> bool:
        """Whether a long poll waits for `queue` of `topic` to grow (operators' and tests' view)."""
        if (topic, queue) in self._waiting:
            return True
        return any(queue in queues for _future, queues in self._wide.get(topic, ()))

    def wake_all(self) -> None:
        """Release every wait (a front door stopping; a woken long poll finds its connection closing)."""
        waiting, self._waiting = self._waiting, {}
        wide, self._wide = self._wide, {}
        futures = [f for fs in waiting.values() for f in fs] + [f for entries in wide.values() for f, _q in entries]
        for future in futures:
            if not future.done():
                future.set_result(None)


def _set_if_pending(future: asyncio.Future[object], value: object) -> None:
    if not future.done():
        future.set_result(value)
