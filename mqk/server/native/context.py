"""State the broker's remoting processors share: the store, the broker's own address, long-polling waiters,
message lookup by commit-log offset, and topic helpers (existence, auto-create, configs as RocketMQ shows them).

Lookup by commit-log offset: RocketMQ clients name a message by it (CONSUMER_SEND_MSG_BACK, VIEW_MESSAGE_BY_ID;
the message id carries it). A message's commit-log offset is its batch's physical offset plus the record's offset
delta, and `store.read_at(physical offset)` finds the batch durably on every engine (after a restart too), so the
first record of a batch (every RocketMQ-produced message: one record a batch) needs no memory here. What
`read_at` cannot name is remembered in a bounded LRU: later records of a multi-record (Kafka-produced) batch, and
messages of batches without a physical offset (compacted file batches), whose synthetic offset `resolve` can also
decode on a miss. A miss answers "not found", which RocketMQ clients handle by re-sending the message themselves.
"""
from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections import OrderedDict
from typing import Any, Iterable, Sequence

from mqk.config import BrokerConfig
from mqk.errors import ShardExists, StorageError, UnknownShard
from mqk.protocol.native.codes import (
    DLQ_GROUP_TOPIC_PREFIX,
    PERM_READ,
    PERM_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
)
from mqk.protocol.native.message import MessageExt
from mqk.protocol.native.records import batch_to_messages, synthetic_matches, synthetic_queue_offset

log = logging.getLogger("mqk.native")

#: ~150 bytes an entry: 100k recent messages cost ~15 MB
LOCATION_CACHE_SIZE = 100_000
#: RocketMQ's topic name rule widened by '.', which Kafka topic names use
TOPIC_NAME = re.compile(r"^(?!\.{1,2}$)[%|a-zA-Z0-9_.\-]{1,249}$")


def now_ms() -> int:
    return int(time.time() * 1000)


class LongPollHub:
    """Pull requests waiting for data, woken by the store's data listener (which may run on another thread)."""

    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], set[asyncio.Future]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop, self._thread = loop, threading.get_ident()

    def on_data(self, topic: str, queue_ends: Sequence[tuple[int, int]]) -> None:
        """The store's data listener: wake the pulls waiting on any queue of `topic` that grew."""
        waiters = self._waiters
        if not waiters or self._loop is None:
            return
        for queue, _end in queue_ends:
            if (topic, queue) not in waiters:
                continue
            if threading.get_ident() == self._thread:
                self._wake(topic, queue)
            else:
                try:
                    self._loop.call_soon_threadsafe(self._wake, topic, queue)
                except RuntimeError:  # loop closed: nobody is waiting any more
                    return

    def _wake(self, topic: str, queue: int) -> None:
        for fut in self._waiters.pop((topic, queue), ()):
            if not fut.done():
                fut.set_result(None)

    async def wait(self, topic: str, queue: int, timeout: float) -> None:
        """Returns when data arrives for the queue, or after `timeout` seconds."""
        assert self._loop is not None
        fut = self._loop.create_future()
        key = (topic, queue)
        self._waiters.setdefault(key, set()).add(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(fut)
                if not waiters:
                    del self._waiters[key]

    def wake_all(self) -> None:
        for key in list(self._waiters):
            self._wake(*key)


class BrokerContext:
    def __init__(self, config: BrokerConfig, store: Any) -> None:
        self.config = config
        self.store = store
        self.host: tuple[str, int] = config.native_listen
        self.long_poll = LongPollHub()
        self._locations: OrderedDict[int, tuple[str, int, int]] = OrderedDict()
        self._topic_locks: dict[str, asyncio.Lock] = {}

    # --- message locations -------------------------------------------------------------------------------

    def remember(self, commit_offset: int, topic: str, queue: int, offset: int) -> None:
        locations = self._locations
        locations[commit_offset] = (topic, queue, offset)
        locations.move_to_end(commit_offset)
        if len(locations) > LOCATION_CACHE_SIZE:
            locations.popitem(last=False)

    async def resolve(self, commit_offset: int, topics: Iterable[str] | None = None) -> MessageExt | None:
        """The message a commit-log offset names, or None. `topics`, when given, are the only topics it may be in
        (a send-back names the original topic; the message may also sit in the group's retry topic): the cache
        and the synthetic form can both collide across topics, the topic cannot."""
        allowed = None if topics is None else set(topics)
        found = await self.store.read_at(commit_offset)
        if found is not None and (allowed is None or found[0] in allowed):
            topic, queue, batch = found
            for msg in self.to_messages(topic, queue, batch):
                if msg.commit_log_offset == commit_offset:
                    return msg
        candidates: list[tuple[str, int, int]] = []
        where = self._locations.get(commit_offset)
        if where is not None and (allowed is None or where[0] in allowed):
            candidates.append(where)
        offset = synthetic_queue_offset(commit_offset)
        for topic, info in self.store.topics().items():
            if allowed is not None and topic not in allowed:
                continue
            for queue in range(info.queue_count):
                if synthetic_matches(commit_offset, topic, queue) and (topic, queue, offset) not in candidates:
                    candidates.append((topic, queue, offset))
        for topic, queue, offset in candidates:
            for msg in await self.read_messages(topic, queue, offset, 1):
                if msg.queue_offset == offset and msg.commit_log_offset == commit_offset:
                    return msg
        return None

    async def read_messages(self, topic: str, queue: int, offset: int, max_count: int,
                            max_bytes: int = 1 << 20) -> list[MessageExt]:
        try:
            result = await self.store.read(topic, queue, offset, max_bytes)
        except StorageError:
            return []
        out: list[MessageExt] = []
        for batch in result.batches:
            out += self.to_messages(topic, queue, batch, offset)
            if len(out) >= max_count:
                break
        return out[:max_count]

    def to_messages(self, topic: str, queue: int, batch: Any, min_offset: int = 0) -> list[MessageExt]:
        phys = batch.physical_offset
        msgs = batch_to_messages(batch.data, topic, queue, batch.store_timestamp, phys, self.host, min_offset)
        for msg in msgs:
            if msg.commit_log_offset != phys:  # read_at names only a batch's first record
                self.remember(msg.commit_log_offset, topic, queue, msg.queue_offset)
        return msgs

    # --- topics ---------------------------------------------------------------------------------------------

    def queue_count(self, topic: str) -> int:
        info = self.store.topic(topic)
        return 0 if info is None else info.queue_count

    async def ensure_topic(self, topic: str, queues: int) -> int:
        """Create `topic` with `queues` queues unless it exists; returns its queue count."""
        info = self.store.topic(topic)
        if info is not None:
            return info.queue_count
        lock = self._topic_locks.setdefault(topic, asyncio.Lock())
        async with lock:
            info = self.store.topic(topic)
            if info is None:
                try:
                    info = await self.store.create_topic(topic, max(1, queues))
                except ShardExists:
                    info = self.store.topic(topic)
            if info is None:
                raise UnknownShard(f"topic {topic!r} vanished while being created")
            return info.queue_count

    @staticmethod
    def is_system_topic(topic: str) -> bool:
        return topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)) or topic.startswith("mqk.")

    def topic_config(self, topic: str, queues: int) -> dict[str, Any]:
        return {"topicName": topic, "readQueueNums": queues, "writeQueueNums": queues,
                "perm": PERM_READ | PERM_WRITE, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}
