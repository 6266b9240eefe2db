"""Log sizes per partition: the bytes of the record batches a partition still holds, for /metrics and
DescribeLogDirs.

A size is counted once in full (`StoreManager.range_bytes` from the log start to the end offset) and then kept up
to date range by range: while a partition only grows, the next question adds what was appended since the last one.
It is counted in full again when the log start moved (retention, DeleteRecords), the topic changed (settings,
partitions), or the topic is compacted (compaction rewrites batches without moving an offset). The file engine
answers a range from its index alone, so asking never reads record data.
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

    async def size(self, topic: str, partition: int) -> int:
        """The partition's log size in bytes (0 for a partition this broker does not hold)."""
        store = self.store
        info = store.topic(topic)
        if info is None or not 0 <= partition < info.queue_count:
            return 0
        try:
            start, end = store.offset_bounds(topic, partition)
            key = (topic, partition)
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

    async def sizes(self, topic: str) -> list[int]:
        """The size of each of the topic's partitions."""
        info = self.store.topic(topic)
        return [] if info is None else [await self.size(topic, p) for p in range(info.queue_count)]

    def forget_deleted(self) -> None:
        """Drop what is known of topics that no longer exist."""
        topics = self.store.topics()
        for key in [k for k in self._known if k[0] not in topics]:
            del self._known[key]


__all__ = ["LogSizes"]
