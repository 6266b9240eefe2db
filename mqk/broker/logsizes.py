"""What each partition's log holds and took in, counted from the store when asked (/metrics, DescribeLogDirs), so
the produce path pays nothing for it:

- its size: the bytes of the record batches it still holds;
- what was appended to it since this broker started (or since the topic was created, for a topic created later):
  records (the end offset's growth) and bytes (the batches between the end offset then and now). Every append
  counts, whoever made it: Kafka producers, RocketMQ senders, the timer delivering what came due.

Sizes and appended bytes are counted range by range (`StoreManager.range_bytes`, which the file engine answers
from its index alone, never reading record data): the next question adds what was appended since the last one. A
size is counted in full again when the log start moved (retention, DeleteRecords), the topic changed (settings,
partitions), or the topic is compacted (compaction rewrites batches without moving an offset). A topic deleted and
created again (a new topic id) starts from 0.
"""

from __future__ import annotations

from mqk.errors import StorageError
from mqk.store.adapter import ShardInfo
from mqk.store.manager import StoreManager


class LogSizes:
    def __init__(self, store: StoreManager) -> None:
        self.store = store
        #: (topic, partition) -> (log start, end offset, bytes, the topic's ShardInfo then)
        self._known: dict[tuple[str, int], tuple[int, int, int, ShardInfo]] = {}
        #: (topic, partition) -> (topic id, end offset when this broker started)
        self._base: dict[tuple[str, int], tuple[bytes, int]] = {}
        #: (topic, partition) -> (topic id, end offset counted up to, bytes appended below it since the base)
        self._appended: dict[tuple[str, int], tuple[bytes, int, int]] = {}
        self.mark_start()

    def mark_start(self) -> None:
        """Take every partition's end offset as where its appended records and bytes count from."""
        store = self.store
        for name, info in store.topics().items():
            try:
                bounds = store.offset_bounds_many(name, list(range(info.queue_count)))
            except StorageError:  # the store is not started: nothing was appended yet
                return
            for partition, bound in enumerate(bounds):
                if bound is not None:
                    self._base[(name, partition)] = (info.topic_id, bound[1])

    def _base_end(self, key: tuple[str, int], info: ShardInfo) -> int:
        base = self._base.get(key)
        return base[1] if base is not None and base[0] == info.topic_id else 0

    async def size(self, topic: str, partition: int) -> int:
        """The partition's log size in bytes (0 for a partition this broker does not hold)."""
        store = self.store
        info = store.topic(topic)
        if info is None or not 0 <= partition < info.queue_count:
            return 0
        key = (topic, partition)
        try:
            start, end = store.offset_bounds(topic, partition)
            known = self._known.get(key)
            if known is not None and known[0] == start and known[3] is info and not info.config.compacted:
                if known[1] == end:
                    return known[2]
                if end > known[1]:
                    size = known[2] + await store.range_bytes(topic, partition, known[1], end)
                    self._known[key] = (start, end, size, info)
                    return size
            size = await store.range_bytes(topic, partition, start, end)
        except StorageError:  # the topic went away meanwhile
            return 0
        self._known[key] = (start, end, size, info)
        return size

    def records_appended(self, topic: str, partition: int) -> int:
        """Records appended to the partition since the base (its end offset's growth)."""
        info = self.store.topic(topic)
        if info is None or not 0 <= partition < info.queue_count:
            return 0
        try:
            end = self.store.end_offset(topic, partition)
        except StorageError:
            return 0
        return max(0, end - self._base_end((topic, partition), info))

    async def bytes_appended(self, topic: str, partition: int) -> int:
        """Record batch bytes appended to the partition since the base."""
        store = self.store
        info = store.topic(topic)
        if info is None or not 0 <= partition < info.queue_count:
            return 0
        key = (topic, partition)
        counted = self._appended.get(key)
        if counted is None or counted[0] != info.topic_id:
            counted = (info.topic_id, self._base_end(key, info), 0)
        try:
            end = store.end_offset(topic, partition)
            if end > counted[1]:
                counted = (info.topic_id, end, counted[2] + await store.range_bytes(topic, partition, counted[1], end))
            elif end < counted[1]:  # the log was cut back (a cluster member truncating to its new leader's)
                counted = (info.topic_id, end, counted[2])
        except StorageError:
            return counted[2]
        self._appended[key] = counted
        return counted[2]

    async def sizes(self, topic: str) -> list[int]:
        """The size of each of the topic's partitions."""
        info = self.store.topic(topic)
        return [] if info is None else [await self.size(topic, p) for p in range(info.queue_count)]

    def forget_deleted(self) -> None:
        """Drop what is known of topics that no longer exist."""
        topics = self.store.topics()
        for table in (self._known, self._appended):
            for key in [k for k in table if k[0] not in topics]:
                del table[key]


__all__ = ["LogSizes"]
