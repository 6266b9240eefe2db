"""The `memory` engine: every shard as an in-process list of batches; nothing survives a restart.

Owns, per shard: the stored batches (base offset set by the engine, byte-for-byte what the broker serves), the log
start and end offsets, a timestamp index, and a key index for `read_by_key`; and every group's committed offsets.
It is the reference the scenario suite holds the other engines to, and what tests and `--storage memory` run on.

The timestamp index is Kafka's: one entry per batch holding the *running* maximum timestamp up to that batch, so it
is monotone and a binary search finds the first batch that can hold a record at or after a time; the lookup is then
refined record by record inside that batch (`mqk.store.batches.first_record_at_or_after`, shared by every engine).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from mqk._fast import load
from mqk.config import TopicConfig
from mqk.errors import (
    InvalidRecord,
    OffsetOutOfRange,
    StorageError,
    UnknownShard,
)
from mqk.store.adapter import (
    AppendResult,
    Buffer,
    GroupOffset,
    ReadResult,
    StorageAdapter,
    StoredBatch,
    check_shard_count,
    physical_base,
    store_time_ms,
)
from mqk.store.batches import first_record_at_or_after, max_retained_timestamp, prepare_batches

recbatch = load("recbatch")

_TS_MIN = -(1 << 63)


# --- the engine ----------------------------------------------------------------------------------------------


@dataclass
class _Shard:
    batches: list[StoredBatch] = field(default_factory=list)
    bases: list[int] = field(default_factory=list)  # batches[i].base_offset, for bisect
    #: (running max timestamp, base offset) per batch; monotone in both, like Kafka's time index
    time_index: SortedList = field(default_factory=SortedList)
    running_max: int = _TS_MIN
    log_start: int = 0
    end: int = 0

    def index_of(self, offset: int) -> int:
        """Index of the batch holding `offset` (or the next batch after a gap)."""
        i = bisect.bisect_right(self.bases, offset) - 1
        if i < 0:
            return 0
        return i if self.batches[i].next_offset > offset else i + 1


class MemoryEngine(StorageAdapter):
    name = "memory"

    def __init__(self) -> None:
        super().__init__()
        self._topics: dict[str, list[_Shard]] = {}
        self._configs: dict[str, TopicConfig] = {}
        #: topic -> key -> [(queue, base offset)] in append order
        self._keys: dict[str, dict[bytes, list[tuple[int, int]]]] = {}
        self._groups: dict[str, dict[tuple[str, int], GroupOffset]] = {}
        self._closed = False
        #: read_at's map: physical offset -> (topic, queue, the shard object, base offset). Each batch gets the
        #: next value and the counter moves by the offsets it covers, so physical offset + offset delta names one
        #: record (as in the CommitLog). Holding the shard object tells a re-created topic's shards apart.
        self._next_phys = physical_base(self.name)
        self._by_phys: dict[int, tuple[str, int, _Shard, int]] = {}

    async def close(self) -> None:
        self._closed = True  # the data stays for inspection, but a closed engine takes no more appends or reads

    # --- shards ------------------------------------------------------------------------------------------

    async def create_shards(self, topic: str, queue_count: int, config: TopicConfig) -> None:
        check_shard_count(queue_count)
        shards = self._topics.setdefault(topic, [])
        shards.extend(_Shard() for _ in range(queue_count - len(shards)))
        self._configs[topic] = config
        self._keys.setdefault(topic, defaultdict(list))

    async def delete_shards(self, topic: str) -> None:
        shards = self._topics.pop(topic, None)
        if shards is None:
            raise UnknownShard(f"unknown topic {topic!r}")
        for shard in shards:
            for batch in shard.batches:
                self._by_phys.pop(batch.physical_offset, None)
        self._configs.pop(topic, None)
        self._keys.pop(topic, None)

    def list_shards(self) -> dict[str, int]:
        return {topic: len(shards) for topic, shards in self._topics.items()}

    async def update_config(self, topic: str, config: TopicConfig) -> None:
        if topic in self._topics:
            self._configs[topic] = config

    def _shard(self, topic: str, queue: int) -> _Shard:
        if self._closed:
            raise StorageError("memory engine is closed")
        shards = self._topics.get(topic)
        if shards is None or not 0 <= queue < len(shards):
            raise UnknownShard(f"unknown shard {topic!r}/{queue}")
        return shards[queue]

    # --- data --------------------------------------------------------------------------------------------

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
        shard = self._shard(topic, queue)
        store_ts = store_time_ms()
        prepared = prepare_batches(batches, shard.end, store_ts if log_append_time else None)
        first = prepared[0].base_offset
        first_phys = self._next_phys
        for p in prepared:
            phys = self._next_phys
            self._next_phys += p.record_count
            stored = StoredBatch(p.base_offset, p.record_count, p.data, store_ts, p.max_timestamp, tags_code, phys)
            self._by_phys[phys] = (topic, queue, shard, p.base_offset)
            shard.batches.append(stored)
            shard.bases.append(p.base_offset)
            shard.running_max = max(shard.running_max, p.max_timestamp)
            shard.time_index.add((shard.running_max, p.base_offset))
            shard.end = stored.next_offset
        if keys:
            index = self._keys[topic]
            for key in set(keys):
                index[bytes(key)].append((queue, first))
        self._notify(topic, ((queue, shard.end),))
        return AppendResult(first, shard.end - 1, store_ts, shard.log_start, first_phys)

    async def read(self, topic: str, queue: int, offset: int, max_bytes: int) -> ReadResult:
        shard = self._shard(topic, queue)
        if offset < shard.log_start or offset > shard.end:
            raise OffsetOutOfRange(offset, shard.log_start, shard.end)
        picked: list[StoredBatch] = []
        size = 0
        for i in range(shard.index_of(offset), len(shard.batches)):
            batch = shard.batches[i]
            if picked and size + len(batch.data) > max_bytes:
                break
            picked.append(batch)
            size += len(batch.data)
        return ReadResult(picked, shard.log_start, shard.end)

    async def read_by_key(
        self, topic: str, key: bytes, max_count: int, begin_ms: int = 0, end_ms: int = 1 << 62
    ) -> list[tuple[int, StoredBatch]]:
        if topic not in self._topics:
            raise UnknownShard(f"unknown topic {topic!r}")
        found: list[tuple[int, StoredBatch]] = []
        for queue, base in reversed(self._keys[topic].get(bytes(key), ())):
            if len(found) >= max_count:
                break
            shard = self._topics[topic][queue]
            i = bisect.bisect_left(shard.bases, base)
            if i < len(shard.bases) and shard.bases[i] == base:
                batch = shard.batches[i]
                if begin_ms <= batch.store_timestamp <= end_ms:
                    found.append((queue, batch))
        return found

    async def delete_before(self, topic: str, queue: int, offset: int) -> int:
        shard = self._shard(topic, queue)
        if offset == -1:  # Kafka's DeleteRecords: -1 means the high watermark
            offset = shard.end
        if offset < 0 or offset > shard.end:
            raise OffsetOutOfRange(offset, shard.log_start, shard.end)
        if offset <= shard.log_start:
            return shard.log_start
        drop = 0
        while drop < len(shard.batches) and shard.batches[drop].next_offset <= offset:
            self._by_phys.pop(shard.batches[drop].physical_offset, None)
            drop += 1
        del shard.batches[:drop]
        del shard.bases[:drop]
        del shard.time_index[:drop]
        shard.log_start = offset
        if drop:
            self._trim_keys(topic, queue, shard.bases[0] if shard.bases else shard.end)
        return offset

    def _trim_keys(self, topic: str, queue: int, first_base: int) -> None:
        """Forget key-index entries of deleted batches (delete_before is rare; one pass over the topic's keys)."""
        index = self._keys.get(topic)
        if not index:
            return
        for key in list(index):
            kept = [e for e in index[key] if e[0] != queue or e[1] >= first_base]
            if kept:
                index[key] = kept
            else:
                del index[key]

    async def offset_for_timestamp(self, topic: str, queue: int, timestamp: int) -> tuple[int, int] | None:
        shard = self._shard(topic, queue)
        i = shard.time_index.bisect_left((timestamp, _TS_MIN))
        # time_index[k] describes batches[k] (both are trimmed together), so i indexes the batch too
        for j in range(i, len(shard.batches)):
            batch = shard.batches[j]
            if batch.max_timestamp >= timestamp:
                hit = first_record_at_or_after(batch.data, timestamp, shard.log_start)
                if hit is not None:
                    return hit
        return None

    async def max_timestamp(self, topic: str, queue: int) -> tuple[int, int] | None:
        shard = self._shard(topic, queue)
        if not shard.batches:
            return None
        # After delete_before the running maxima may still count deleted batches, and the top record may lie
        # below the log start: then (rarely: ListOffsets MAX_TIMESTAMP) find the retained maximum the slow way.
        if shard.time_index[0][0] <= shard.batches[0].max_timestamp:
            hit = await self.offset_for_timestamp(topic, queue, shard.time_index[-1][0])
            if hit is not None:
                return hit
        return max_retained_timestamp(shard.batches, shard.log_start)

    async def replace_range(self, topic: str, queue: int, start: int, end: int, batches: Sequence[Buffer]) -> None:
        """Compaction's rewrite (StorageAdapter.replace_range): one list-slice swap, so readers see old or new."""
        shard = self._shard(topic, queue)
        lo, hi = bisect.bisect_left(shard.bases, start), bisect.bisect_left(shard.bases, end)
        old = {b.base_offset: b for b in shard.batches[lo:hi]}
        # time_index[k] describes batches[k]: a kept batch keeps its running max (the index stays monotone)
        running = {base: ts for ts, base in shard.time_index[lo:hi]}
        new = []
        for data in batches:
            header = recbatch.parse_header(data, 0)
            prev = old.get(header[0])
            if prev is None or prev.record_count != header[6] + 1:
                raise InvalidRecord(
                    f"replacement batch at {header[0]} does not match a stored batch in "
                    f"[{start}, {end}) of {topic}-{queue}"
                )
            new.append(
                StoredBatch(
                    prev.base_offset,
                    prev.record_count,
                    bytes(data),
                    prev.store_timestamp,
                    header[8],
                    prev.tags_code,
                    prev.physical_offset,
                )
            )
        kept = {b.physical_offset for b in new}
        for batch in old.values():
            if batch.physical_offset not in kept:  # compacted away: its id no longer names a message
                self._by_phys.pop(batch.physical_offset, None)
        shard.batches[lo:hi] = new
        shard.bases[lo:hi] = [b.base_offset for b in new]
        del shard.time_index[lo:hi]
        shard.time_index.update((running[b.base_offset], b.base_offset) for b in new)

    async def read_at(self, physical_offset: int) -> tuple[str, int, StoredBatch] | None:
        if self._closed:
            return None
        where = self._by_phys.get(physical_offset)
        if where is None:
            return None
        topic, queue, shard, base = where
        shards = self._topics.get(topic)
        if shards is None or queue >= len(shards) or shards[queue] is not shard:
            return None  # deleted (and maybe re-created: a new shard object)
        i = bisect.bisect_left(shard.bases, base)
        if i == len(shard.bases) or shard.bases[i] != base:
            return None
        batch = shard.batches[i]
        return (topic, queue, batch) if batch.physical_offset == physical_offset else None

    def log_start_offset(self, topic: str, queue: int) -> int:
        return self._shard(topic, queue).log_start

    def end_offset(self, topic: str, queue: int) -> int:
        return self._shard(topic, queue).end

    # --- group offsets -----------------------------------------------------------------------------------

    async def commit_offsets(self, group: str, offsets: dict[tuple[str, int], GroupOffset]) -> None:
        if offsets:
            self._groups.setdefault(group, {}).update(offsets)

    def fetch_offsets(self, group: str) -> dict[tuple[str, int], GroupOffset]:
        return dict(self._groups.get(group, {}))

    async def delete_offsets(self, group: str, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        if partitions is None:
            self._groups.pop(group, None)
            return
        parts = self._groups.get(group)
        if parts is None:
            return
        for partition in partitions:
            parts.pop(partition, None)
        if not parts:
            del self._groups[group]

    def list_offset_groups(self) -> list[str]:
        return sorted(self._groups)


__all__ = ["MemoryEngine"]
