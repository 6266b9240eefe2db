"""The seam between the broker and its data: `StorageAdapter`, and the values that cross it.

Everything above the store (Kafka and RocketMQ handlers, groups, timer, CLI) reaches data only through this
interface; everything below it (engines: file, memory, rocksdb) implements it. Nothing here imports a protocol.

Vocabulary:
- a *shard* is one queue of one topic (a Kafka partition is a RocketMQ queue);
- a *batch* is a Kafka record batch v2 (magic 2), stored byte-for-byte as the broker serves it. The engine sets
  its base offset (bytes 0..8, outside the CRC) when it appends. A RocketMQ message is stored as a batch of one
  record, its properties as record headers;
- offsets are record offsets (Kafka's), the same ones RocketMQ clients see as queue offsets.

All data methods are coroutines, so an engine that blocks (rocksdb) can run its work off the event loop while the
file and memory engines answer without suspending (a coroutine that never awaits costs well under a microsecond).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from mqk.config import TopicConfig

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int  #: offset of the first record appended
    last_offset: int  #: offset of the last record appended
    log_append_time: int  #: the store timestamp (ms) given to the batch(es)
    log_start_offset: int  #: the shard's log start offset after the append
    physical_offset: int = -1  #: where the (first) entry landed in the CommitLog, or -1 for engines without one


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """One stored batch with what the index knows of it (ConsumeQueue unit fields)."""

    base_offset: int
    record_count: int
    data: Buffer  #: the whole record batch v2, base offset already set
    store_timestamp: int = 0
    max_timestamp: int = -1
    tags_code: int = 0
    physical_offset: int = -1

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


@dataclass(frozen=True, slots=True)
class ReadResult:
    batches: list[StoredBatch]
    log_start_offset: int
    end_offset: int  #: the high watermark: the offset the next record will get

    @property
    def next_offset(self) -> int:
        return self.batches[-1].next_offset if self.batches else -1

    @property
    def size(self) -> int:
        return sum(len(b.data) for b in self.batches)


@dataclass(frozen=True, slots=True)
class ShardInfo:
    topic: str
    queue_count: int
    config: TopicConfig
    engine: str
    topic_id: bytes = b"\x00" * 16  #: Kafka topic UUID, stable across restarts


@dataclass(frozen=True, slots=True)
class GroupOffset:
    offset: int
    metadata: str = ""
    commit_timestamp: int = -1
    leader_epoch: int = -1


#: called as listener(topic, queue, end_offset) whenever new records become visible
DataListener = Callable[[str, int, int], None]


@dataclass
class PutContext:
    """What a put-message hook sees and may change before an append: the hook may rewrite `topic`/`queue`
    (the timer reroutes delayed messages this way) or raise `PutRejected`."""

    topic: str
    queue: int
    batches: list[Buffer]
    tags_code: int = 0
    keys: Sequence[bytes] = ()
    properties: dict[str, str] = field(default_factory=dict)


PutHook = Callable[[PutContext], None]


class StorageAdapter(abc.ABC):
    """One engine's view of its shards. An engine instance is created once and shared by every topic using it."""

    name: str = "abstract"

    def __init__(self) -> None:
        self.listeners: list[DataListener] = []

    def _notify(self, topic: str, queue: int, end_offset: int) -> None:
        for listener in self.listeners:
            listener(topic, queue, end_offset)

    # --- life cycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open files, recover, start background services (flush, dispatch, checkpoint)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Flush, close, and mark a clean stop."""

    # --- shards ----------------------------------------------------------------------------------------

    @abc.abstractmethod
    async def create_shards(self, topic: str, queue_count: int, config: TopicConfig) -> None:
        """Create queues 0..queue_count-1 of `topic`, or add queues up to queue_count if it exists."""

    @abc.abstractmethod
    async def delete_shards(self, topic: str) -> None: ...

    @abc.abstractmethod
    def list_shards(self) -> dict[str, int]:
        """topic -> queue count, for the topics this engine holds."""

    async def update_config(self, topic: str, config: TopicConfig) -> None:
        """Engines that act on topic settings (retention, compaction) hear about changes here."""

    # --- data ------------------------------------------------------------------------------------------

    @abc.abstractmethod
    async def append(
        self,
        topic: str,
        queue: int,
        batches: Sequence[Buffer],
        *,
        tags_code: int = 0,
        keys: Sequence[bytes] = (),
        log_append_time: bool = False,
    ) -> AppendResult:
        """Append whole, already validated record batches v2 and return their offsets.

        The engine assigns consecutive offsets (setting each batch's base offset), and with `log_append_time`
        also sets the timestamp type bit and max timestamp (recomputing the CRC). The call completes once the
        data is readable and, under sync flush, on disk.
        """

    @abc.abstractmethod
    async def read(self, topic: str, queue: int, offset: int, max_bytes: int) -> ReadResult:
        """Whole batches from the one containing `offset`, up to `max_bytes` (but at least one batch when any
        exists). Raises OffsetOutOfRange below the log start or above the end offset; at the end: no batches."""

    async def read_by_tags(
        self, topic: str, queue: int, offset: int, tags_codes: Iterable[int], max_batches: int
    ) -> ReadResult:
        """Like `read`, but only batches whose tags code is in `tags_codes` (RocketMQ tag filtering)."""
        wanted = set(tags_codes)
        result = await self.read(topic, queue, offset, 1 << 62)
        picked = [b for b in result.batches if b.tags_code in wanted][:max_batches]
        return ReadResult(picked, result.log_start_offset, result.end_offset)

    async def read_by_key(
        self, topic: str, key: bytes, max_count: int, begin_ms: int = 0, end_ms: int = 1 << 62
    ) -> list[tuple[int, StoredBatch]]:
        """(queue, batch) pairs whose keys include `key`, newest first."""
        from mqk.errors import NotSupported

        raise NotSupported(f"{self.name} engine has no key index yet")

    @abc.abstractmethod
    async def delete_before(self, topic: str, queue: int, offset: int) -> int:
        """Move the log start offset forward to `offset` (whole batches only become unreadable); returns the
        new log start offset."""

    @abc.abstractmethod
    async def offset_for_timestamp(self, topic: str, queue: int, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record whose timestamp >= `timestamp`, or None if there is none."""

    @abc.abstractmethod
    def log_start_offset(self, topic: str, queue: int) -> int: ...

    @abc.abstractmethod
    def end_offset(self, topic: str, queue: int) -> int: ...

    async def max_timestamp(self, topic: str, queue: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets MAX_TIMESTAMP)."""
        from mqk.errors import NotSupported

        raise NotSupported(f"{self.name} engine has no max-timestamp lookup")

    # --- group offsets ---------------------------------------------------------------------------------

    @abc.abstractmethod
    async def commit_offsets(self, group: str, offsets: dict[tuple[str, int], GroupOffset]) -> None:
        """Durably store committed offsets (atomically for the whole call)."""

    @abc.abstractmethod
    def fetch_offsets(self, group: str) -> dict[tuple[str, int], GroupOffset]: ...

    @abc.abstractmethod
    async def delete_offsets(self, group: str, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        """Forget the group's offsets for these partitions, or all of them."""

    @abc.abstractmethod
    def list_offset_groups(self) -> list[str]: ...
