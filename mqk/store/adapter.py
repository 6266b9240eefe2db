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
file and memory engines answer without suspending (a coroutine that never awaits costs no event-loop round trip).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from mqk.config import TopicConfig
from mqk.errors import InvalidShardCount, NotSupported, UnknownShard

Buffer = bytes | bytearray | memoryview

#: queues per topic every engine takes (the broker's own limit on partitions is lower)
MAX_SHARD_COUNT = 1 << 16


def check_shard_count(queue_count: int) -> None:
    """The one rule every engine's `create_shards` applies: InvalidShardCount outside [1, MAX_SHARD_COUNT]."""
    if not 1 <= queue_count <= MAX_SHARD_COUNT:
        raise InvalidShardCount(f"queue count {queue_count} outside [1, {MAX_SHARD_COUNT}]")


def store_time_ms() -> int:
    """Wall-clock milliseconds: what engines stamp appended batches with (their store timestamp)."""
    return time.time_ns() // 1_000_000


class AppendResult(NamedTuple):
    """What an append answers. A NamedTuple (immutable, same attribute names as the other value types) rather
    than a frozen dataclass: one is built per append, and a frozen dataclass's __init__ sets every field through
    object.__setattr__, a visible share of a small append on the file engine."""

    base_offset: int  #: offset of the first record appended
    last_offset: int  #: offset of the last record appended
    log_append_time: int  #: the store timestamp (ms) given to the batch(es)
    log_start_offset: int  #: the shard's log start offset after the append
    physical_offset: int = -1  #: `read_at` address of the (first) batch (see PHYSICAL_KINDS), or -1 if none


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


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What the log life cycle (retention, compaction) needs to know of one stored batch, without its records."""

    base_offset: int
    next_offset: int  #: one past the batch's last offset (base + last_offset_delta + 1)
    size: int  #: bytes of the record batch
    max_timestamp: int  #: the batch's own max timestamp (not a running maximum)


@dataclass(frozen=True, slots=True)
class ExpireResult:
    """What one retention pass did to one shard."""

    old_start: int
    new_start: int
    bytes_before: int  #: retained batch bytes before the pass (-1 when not measured: no size limit)
    reason: str = ""  #: "time", "size", "time+size" or "" when nothing moved

    @property
    def moved(self) -> bool:
        return self.new_start > self.old_start


#: called as listener(topic, queue_ends) whenever new records become visible: queue_ends holds a (queue, new end
#: offset) pair per queue of `topic` that grew (one for an append, one per written entry for append_many), so a
#: Produce spread over many partitions costs each listener one call
DataListener = Callable[[str, Sequence[tuple[int, int]]], None]


@dataclass(slots=True)  # one per append: slots make it cheaper to build and to read
class PutContext:
    """What a put-message hook sees and may change before an append: the hook may rewrite `topic`/`queue`
    (the timer reroutes delayed messages this way) or raise `PutRejected`.

    `delay_headers` is what the protocol layer's own record check found out: False when no record of the batches
    carries one of the timer's delay headers (mqk.timer.delay.DELAY_HEADER_KEYS), True when one does, None when
    nobody looked (the timer then looks itself)."""

    topic: str
    queue: int
    batches: list[Buffer]
    tags_code: int = 0
    keys: Sequence[bytes] = ()
    properties: dict[str, str] = field(default_factory=dict)
    delay_headers: bool | None = None


PutHook = Callable[[PutContext], None]
_H = TypeVar("_H", bound=Callable[..., None])  # a hook, or the method that becomes one when bound


def delayed_only(hook: _H) -> _H:
    """Mark a put hook that leaves alone every append whose context says that no record carries a delay header
    (`PutContext.delay_headers is False`) and that has no native `properties` (the timer's hook is one). For
    such an append the store neither builds a PutContext nor calls the hook: a Produce spreading its records
    over many partitions would otherwise pay both once per partition."""
    hook.delayed_only = True  # type: ignore[attr-defined]  # (a marker on the function object itself)
    return hook


def is_delayed_only(hook: PutHook) -> bool:
    """Whether `hook` was marked with `delayed_only` (a bound method answers for its function)."""
    return getattr(hook, "delayed_only", False) is True


# --- physical offsets: one id space for every engine -----------------------------------------------------------
#
# A physical offset names one stored batch for `read_at` (RocketMQ message ids carry it). Bits 48..50 say which
# engine issued it, so an offset can be routed without a table and ids of two engines never collide; the file
# engine's kind is 0, so its value is its CommitLog offset unchanged (as RocketMQ's ids are). Everything stays
# below 2**53: JavaScript clients (ali-ons) turn the offset into a Number and must keep it exact. Each engine thus
# has 2**48 values (256 TiB of CommitLog; the memory and rocksdb engines spend one value per offset covered).

PHYSICAL_KIND_SHIFT = 48
#: the values one engine may issue: [kind << 48, (kind + 1) << 48)
PHYSICAL_SPAN = 1 << PHYSICAL_KIND_SHIFT
PHYSICAL_KINDS = {"file": 0, "memory": 1, "rocksdb": 2}
_ENGINE_OF_KIND = {kind: name for name, kind in PHYSICAL_KINDS.items()}


def physical_base(engine: str) -> int:
    """The first physical offset the engine called `engine` may issue."""
    return PHYSICAL_KINDS[engine] << PHYSICAL_KIND_SHIFT


def physical_engine(physical_offset: int) -> str | None:
    """The name of the engine that issued `physical_offset`, or None if no engine issues such values."""
    if physical_offset < 0:
        return None
    return _ENGINE_OF_KIND.get(physical_offset >> PHYSICAL_KIND_SHIFT)


class StorageAdapter(abc.ABC):
    """One engine's view of its shards. An engine instance is created once and shared by every topic using it."""

    name: str = "abstract"
    #: whether `replace_range` rewrites a shard's whole compacted prefix whatever the range (the file engine's
    #: compaction log): compaction then hands it the whole range in one call instead of chunks
    rewrite_copies_prefix: bool = False

    def __init__(self) -> None:
        self.listeners: list[DataListener] = []

    def _notify(self, topic: str, queue_ends: Sequence[tuple[int, int]]) -> None:
        for listener in self.listeners:
            listener(topic, queue_ends)

    # --- life cycle -----------------------------------------------------------------------------------

    async def start(self) -> None:  # noqa: B027 - optional: an engine with nothing to open keeps this no-op
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

    async def update_config(self, topic: str, config: TopicConfig) -> None:  # noqa: B027 - optional, as start
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

    async def append_many(
        self, topic: str, entries: Sequence[tuple[int, Sequence[Buffer]]], *, log_append_time: bool = False
    ) -> list[AppendResult | Exception]:
        """`append` to several queues of one topic at once (a Produce request's partitions): entries are
        (queue, batches), each appended as `append` would, in order; the answer holds, per entry, its
        AppendResult or the exception its append raised. Engines may override it to save the per-call cost."""
        out: list[AppendResult | Exception] = []
        for queue, batches in entries:
            try:
                out.append(await self.append(topic, queue, batches, log_append_time=log_append_time))
            except Exception as exc:  # noqa: BLE001 - that entry's answer
                out.append(exc)
        return out

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
        raise NotSupported(f"{self.name} engine has no key index yet")

    async def read_at(self, physical_offset: int) -> tuple[str, int, StoredBatch] | None:
        """(topic, queue, batch) of the batch stored at `physical_offset` (a value this engine returned as
        `AppendResult.physical_offset` / `StoredBatch.physical_offset`), or None when no readable batch is there.

        None, never an error, for: a value this engine never issued (another engine's, negative, not the start of
        a batch), a batch below its queue's log start (the batch holding the log start still counts, as `read`
        serves it whole), space reclaimed, a damaged entry, and a topic deleted (and maybe re-created) since.
        Survives a restart in every persistent engine. RocketMQ's VIEW_MESSAGE_BY_ID and send-back use this: their
        message ids carry the physical offset (plus the record's offset delta inside the batch)."""
        return None

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

    def offset_bounds_many(self, topic: str, queues: Sequence[int]) -> list[tuple[int, int] | None]:
        """(log start offset, end offset) of each of `queues`, None for a queue the topic does not have (or a
        topic this engine does not hold). A Fetch of a consumer assigned many partitions asks for all of them, in
        every request; an engine that can answer without a call per queue overrides this."""
        bounds: list[tuple[int, int] | None] = []
        for queue in queues:
            try:
                bounds.append((self.log_start_offset(topic, queue), self.end_offset(topic, queue)))
            except UnknownShard:
                bounds.append(None)
        return bounds

    async def max_timestamp(self, topic: str, queue: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets MAX_TIMESTAMP)."""
        raise NotSupported(f"{self.name} engine has no max-timestamp lookup")

    # --- log life cycle (retention; mqk.services.retention drives these) --------------------------------

    async def batch_infos(self, topic: str, queue: int, offset: int, max_batches: int) -> list[BatchInfo]:
        """Up to `max_batches` batches from the one holding `offset` (or the next one after a gap), in offset
        order. The default reads whole batches through `read`; engines with an index may answer from it."""
        out: list[BatchInfo] = []
        end = self.end_offset(topic, queue)
        while len(out) < max_batches and offset < end:
            result = await self.read(topic, queue, offset, 1 << 20)
            if not result.batches:
                break
            for batch in result.batches:
                out.append(BatchInfo(batch.base_offset, batch.next_offset, len(batch.data), batch.max_timestamp))
                if len(out) >= max_batches:
                    break
            offset = result.batches[-1].next_offset
        return out

    async def queue_bytes(self, topic: str, queue: int) -> int:
        """Bytes of the record batches still readable (the batch holding the log start counts whole), the size
        Kafka's `retention.bytes` is measured against."""
        total = 0
        offset = self.log_start_offset(topic, queue)
        while True:
            infos = await self.batch_infos(topic, queue, offset, 4096)
            if not infos:
                return total
            total += sum(i.size for i in infos)
            offset = infos[-1].next_offset

    async def range_bytes(self, topic: str, queue: int, start: int, end: int) -> int:
        """Bytes of the stored batches from the one holding `start` up to those whose base offset reaches `end`:
        with `start` the log start and `end` the end offset, `queue_bytes`. What the log-size figures (/metrics,
        DescribeLogDirs) are counted with, range by range as a log grows. The default reads batches through
        `batch_infos`; an engine with an index answers from it without touching record data."""
        total = 0
        offset = start
        while offset < end:
            infos = await self.batch_infos(topic, queue, offset, 4096)
            if not infos:
                break
            for info in infos:
                if info.base_offset >= end:
                    return total
                total += info.size
            offset = infos[-1].next_offset
        return total

    async def expire(
        self,
        topic: str,
        queue: int,
        now_ms: int,
        retention_ms: int,
        retention_bytes: int,
        limit_offset: int | None = None,
    ) -> ExpireResult:
        """Kafka's retention on one shard, moving the log start offset forward in whole batches:

        - `retention_ms` >= 0: batches whose own max timestamp is older than now - retention_ms go, from the head
          up to the first batch that is still young (Kafka's rule for segments: a young one stops the walk);
        - `retention_bytes` >= 0: head batches go while what remains is still at least `retention_bytes` (so, as
          in Kafka, the log is never cut below the limit);
        - `limit_offset`: never move the start past it (pending timer messages, a consumer the caller protects).

        -1 disables either rule. Returns what moved; the engine frees the space in its own way (`reclaim`)."""
        start = self.log_start_offset(topic, queue)
        end = self.end_offset(topic, queue)
        cut = start
        reasons = []
        if retention_ms >= 0 and start < end:
            deadline = now_ms - retention_ms
            offset = start
            young = False
            while not young and offset < end:
                infos = await self.batch_infos(topic, queue, offset, 1024)
                if not infos:
                    break
                for info in infos:
                    if info.max_timestamp >= deadline:
                        young = True
                        break
                    cut = info.next_offset
                offset = infos[-1].next_offset
            if cut > start:
                reasons.append("time")
        total = -1
        if retention_bytes >= 0 and cut < end:
            total = 0
            infos_all: list[BatchInfo] = []
            offset = cut
            while True:
                infos = await self.batch_infos(topic, queue, offset, 4096)
                if not infos:
                    break
                infos_all.extend(infos)
                offset = infos[-1].next_offset
            total = sum(i.size for i in infos_all)
            remaining = total
            size_cut = cut
            for info in infos_all:
                if remaining - info.size < retention_bytes:
                    break
                remaining -= info.size
                size_cut = info.next_offset
            if size_cut > cut:
                cut = size_cut
                reasons.append("size")
        if limit_offset is not None:
            cut = min(cut, max(limit_offset, start))
        cut = min(cut, end)
        if cut > start:
            await self.delete_before(topic, queue, cut)
        return ExpireResult(start, max(start, cut), total, "+".join(reasons) if cut > start else "")

    async def replace_range(self, topic: str, queue: int, start: int, end: int, batches: Sequence[Buffer]) -> None:
        """Compaction's one write: replace the stored batches whose base offsets lie in [start, end) by `batches`
        (rewritten copies of some of them: each keeps the base offset and offset span of the batch it replaces,
        in offset order). Batches not named go; log start and end offsets do not move; readers see the old or
        the new range, never a mix (atomic per call). Engines that cannot rewrite say NotSupported."""
        raise NotSupported(f"{self.name} engine cannot rewrite stored batches (compaction)")

    async def reclaim(
        self, now_ms: int, reserved_ms: int | None = None, pins: dict[tuple[str, int], int] | None = None
    ) -> int:
        """Give back the space of data below every shard's log start; returns the bytes freed. Engines whose
        `delete_before` already frees space (memory, rocksdb) have nothing to do here. The file engine frees
        whole CommitLog segments (mqk.store.file.reclaim), and also drops segments older than `reserved_ms`
        (RocketMQ's fileReservedTime; None: the engine's configured one), moving the start of the shards that
        still pointed into them, except past `pins[(topic, queue)]` (offsets still needed: pending timer
        messages)."""
        return 0

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
