"""The `rocksdb` engine: every shard's batches, indexes, log start and the group offsets in one RocksDB (rocksdict).

Owns the database under `<root>/rocksdb` and its key layout. Keys are built so that one shard's data is one ordered
range (integers big-endian, so byte order is numeric order):

    tk = u16 len + topic (UTF-8)          sp = tk + u32 queue
    b"d" + sp + u64 base_offset           -> DATA_HEADER (store ts, own max ts, running max ts, tags code, count)
                                             + the record batch v2 (base offset set)
    b"t" + sp + u64 biased running max ts + u64 base_offset -> b""   (Kafka-style time index: monotone)
    b"m" + sp                             -> u64 log start offset, u64 end offset (as of the last delete)
    b"s" + topic                          -> u32 queue count
    b"k" + tk + u32 len + key + u64 biased store ts + u32 queue + u64 base_offset -> b""   (key index)
    b"g" + u16 len + group + tk + u32 queue -> i64 offset, i64 commit ts, i32 leader epoch + metadata (UTF-8)
    b"p" + u64 physical offset            -> u64 base_offset + u32 span + sp   (read_at: batch by physical offset)
    b"P" + sp + u64 base_offset           -> u64 physical offset   (the reverse: reads report it; read_at checks it)
    b"n"                                  -> u64 next physical offset as of the last forward-key deletion

Physical offsets (adapter's PHYSICAL_KINDS, rocksdb's range) are handed out per batch, moving by the offsets it
covers, so physical offset + offset delta names one record. A forward key is trusted only if the reverse key of
its batch still points back at it: a deleted (or deleted and re-created) topic's ids then resolve to nothing.
None is ever handed out twice: at open the next one is past the last forward key and past `n`, which every
deletion of forward keys rewrites (so appends pay no extra write for it).

Timestamps are biased by 2**63 so negative ones (-1: none) sort first.

Off the event loop: reads and synced writes run in worker threads (RocksDB is thread-safe). Fast paths stay on the
loop: a read at the end offset (the long-poll case) is answered from memory; under `async` flush an append is a
memtable + WAL write without fsync (no disk wait), done inline. Under `sync` flush appends go through one writer
task that folds every waiting append into one synced WriteBatch (group commit). Offsets are assigned on the loop
and a batch becomes visible (the shard's end offset moves) only after its write returned, in offset order.
Group-offset commits are always written with sync=True.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from mqk.config import FLUSH_SYNC, StoreConfig, TopicConfig
from mqk.errors import Corrupt, InvalidRecord, InvalidShardName, OffsetOutOfRange, StorageError, UnknownShard
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
from mqk.store.batches import recbatch as _recbatch

DATA_HEADER = struct.Struct(">qqqqi")  # store ts, own max ts, running max ts, tags code, record count
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_META = struct.Struct(">qq")
_PHYS_VALUE = struct.Struct(">QI")  # base offset, span; then the shard prefix
_GROUP_VALUE = struct.Struct(">qqi")
_BIAS = 1 << 63
_TS_MIN = -(1 << 63)
_MAX_KEY_SUFFIX = b"\xff" * 32


def _bias(ts: int) -> bytes:
    return _U64.pack(ts + _BIAS)


def _topic_key(topic: str) -> bytes:
    raw = topic.encode()
    if len(raw) > 0xFFFF:
        raise InvalidShardName(f"topic name of {len(raw)} bytes is too long")
    return _U16.pack(len(raw)) + raw


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with `prefix` (prefix never ends in 0xff here)."""
    return prefix + _MAX_KEY_SUFFIX


@dataclass
class _Shard:
    sp: bytes  # shard prefix (topic key + queue)
    log_start: int = 0
    end: int = 0  # visible end offset (high watermark)
    assigned: int = 0  # next offset to hand out (>= end while synced appends are in flight)
    running_max: int = _TS_MIN


class RocksEngine(StorageAdapter):
    name = "rocksdb"

    def __init__(self, config: StoreConfig, root: Path) -> None:
        super().__init__()
        self.config = config
        self.path = Path(root) / "rocksdb"
        self._db: Rdict | None = None
        self._topics: dict[str, list[_Shard]] = {}
        self._groups: dict[str, dict[tuple[str, int], GroupOffset]] = {}
        self._sync = config.flush_mode == FLUSH_SYNC
        self._wo_fast = WriteOptions()
        self._wo_sync = WriteOptions()
        self._wo_sync.sync = True
        # sync-mode group commit: (puts, future, publish) waiting for the writer task
        self._pending: list[tuple[list[tuple[bytes, bytes]], asyncio.Future[None], Any]] = []
        self._writer: asyncio.Task[None] | None = None
        self._write_error: StorageError | None = None
        self._next_phys = physical_base(self.name)

    # --- life cycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._db is not None:
            return
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        try:
            db = Rdict(str(self.path), options)
        except Exception as exc:  # rocksdict raises plain Exceptions (e.g. the LOCK is held by another process)
            raise StorageError(f"cannot open rocksdb at {self.path}: {exc}") from exc
        self._db = db
        next_phys = db.get(b"n")
        if next_phys is not None:
            self._next_phys = max(self._next_phys, _U64.unpack(next_phys)[0])
        it = db.iter()
        try:
            it.seek_for_prev(b"p" + b"\xff" * 9)
            if it.valid() and it.key()[:1] == b"p" and len(it.key()) == 9:
                span = _PHYS_VALUE.unpack_from(it.value())[1]
                self._next_phys = max(self._next_phys, _U64.unpack_from(it.key(), 1)[0] + span)
        finally:
            del it
        it = db.iter()
        try:
            it.seek(b"s")
            while it.valid() and it.key()[:1] == b"s":
                topic = it.key()[1:].decode()
                count = _U32.unpack(it.value())[0]
                tk = _topic_key(topic)
                self._topics[topic] = [self._load_shard(it, tk + _U32.pack(q)) for q in range(count)]
                it.seek(b"s" + topic.encode() + b"\x00")  # the loader moved the iterator; resume after this topic
            it.seek(b"g")
            while it.valid() and it.key()[:1] == b"g":
                group, topic, queue = self._parse_group_key(it.key())
                offset, ts, epoch = _GROUP_VALUE.unpack_from(it.value())
                metadata = it.value()[_GROUP_VALUE.size :].decode()
                self._groups.setdefault(group, {})[(topic, queue)] = GroupOffset(offset, metadata, ts, epoch)
                it.next()
        finally:
            del it

    def _load_shard(self, it: Any, sp: bytes) -> _Shard:
        shard = _Shard(sp)
        meta = self.db.get(b"m" + sp)
        if meta is not None:
            shard.log_start, shard.end = _META.unpack(meta)
        it.seek_for_prev(_prefix_end(b"d" + sp))
        if it.valid() and it.key().startswith(b"d" + sp):
            base = _U64.unpack_from(it.key(), len(sp) + 1)[0]
            value = it.value()
            _store_ts, _own_max, running_max, _tags, count = DATA_HEADER.unpack_from(value)
            shard.end = max(shard.end, base + count)
            shard.running_max = running_max
        shard.assigned = shard.end
        return shard

    @staticmethod
    def _parse_group_key(key: bytes) -> tuple[str, str, int]:
        glen = _U16.unpack_from(key, 1)[0]
        group = key[3 : 3 + glen].decode()
        pos = 3 + glen
        tlen = _U16.unpack_from(key, pos)[0]
        topic = key[pos + 2 : pos + 2 + tlen].decode()
        queue = _U32.unpack_from(key, pos + 2 + tlen)[0]
        return group, topic, queue

    async def close(self) -> None:
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)
        if self._db is not None:
            db, self._db = self._db, None
            await asyncio.to_thread(db.close)

    @property
    def db(self) -> Rdict:
        if self._db is None:
            raise StorageError("rocksdb engine is not started (or closed)")
        return self._db

    # --- shards --------------------------------------------------------------------------------------------

    async def create_shards(self, topic: str, queue_count: int, config: TopicConfig) -> None:
        check_shard_count(queue_count)
        tk = _topic_key(topic)
        shards = self._topics.get(topic, [])
        if len(shards) >= queue_count:
            return
        new = [_Shard(tk + _U32.pack(q)) for q in range(len(shards), queue_count)]
        batch = WriteBatch(raw_mode=True)
        for shard in new:
            batch.put(b"m" + shard.sp, _META.pack(0, 0))
        batch.put(b"s" + topic.encode(), _U32.pack(queue_count))
        await asyncio.to_thread(self.db.write, batch, self._wo_sync)
        self._topics[topic] = shards + new

    async def delete_shards(self, topic: str) -> None:
        if topic not in self._topics:
            raise UnknownShard(f"unknown topic {topic!r}")
        del self._topics[topic]
        while self._writer is not None and not self._writer.done():  # no in-flight batch lands after the delete
            await asyncio.shield(self._writer)
        tk = _topic_key(topic)
        batch = WriteBatch(raw_mode=True)
        batch.delete(b"s" + topic.encode())
        for kind in (b"d", b"t", b"m", b"k", b"P"):
            batch.delete_range(kind + tk, _prefix_end(kind + tk))
        await asyncio.to_thread(self._forget_phys, batch, b"P" + tk, _prefix_end(b"P" + tk))
        await asyncio.to_thread(self.db.write, batch, self._wo_sync)

    def list_shards(self) -> dict[str, int]:
        return {topic: len(shards) for topic, shards in self._topics.items()}

    def _shard(self, topic: str, queue: int) -> _Shard:
        shards = self._topics.get(topic)
        if shards is None or not 0 <= queue < len(shards):
            raise UnknownShard(f"unknown shard {topic!r}/{queue}")
        return shards[queue]

    # --- data ----------------------------------------------------------------------------------------------

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
        db = self.db
        if self._write_error is not None:
            raise self._write_error
        store_ts = store_time_ms()
        prepared = prepare_batches(batches, shard.assigned, store_ts if log_append_time else None)
        puts: list[tuple[bytes, bytes]] = []
        running_max = shard.running_max
        first_phys = phys = self._next_phys
        for p in prepared:
            running_max = max(running_max, p.max_timestamp)
            base = _U64.pack(p.base_offset)
            header = DATA_HEADER.pack(store_ts, p.max_timestamp, running_max, tags_code, p.record_count)
            puts.append((b"d" + shard.sp + base, header + p.data))
            puts.append((b"t" + shard.sp + _bias(running_max) + base, b""))
            puts.append((b"p" + _U64.pack(phys), _PHYS_VALUE.pack(p.base_offset, p.record_count) + shard.sp))
            puts.append((b"P" + shard.sp + base, _U64.pack(phys)))
            phys += p.record_count
        self._next_phys = phys  # handed out now, so a failed write leaves a gap, never a reuse
        first = prepared[0].base_offset
        new_end = prepared[-1].base_offset + prepared[-1].record_count
        if keys:
            tk = shard.sp[:-4]
            tail = _bias(store_ts) + _U32.pack(queue) + _U64.pack(first)
            for key in set(keys):
                key = bytes(key)
                puts.append((b"k" + tk + _U32.pack(len(key)) + key + tail, b""))

        def publish() -> None:
            shard.end = new_end
            self._notify(topic, ((queue, new_end),))

        if not self._sync and self._writer is None:
            batch = WriteBatch(raw_mode=True)
            for key, value in puts:
                batch.put(key, value)
            try:
                db.write(batch, self._wo_fast)
            except Exception as exc:  # nothing was assigned yet: the shard is unchanged
                raise StorageError(f"rocksdb write failed: {exc}") from exc
            shard.assigned, shard.running_max = new_end, running_max
            publish()
        else:
            shard.assigned, shard.running_max = new_end, running_max
            await self._enqueue(puts, publish)
        return AppendResult(first, new_end - 1, store_ts, shard.log_start, first_phys)

    async def _enqueue(self, puts: list[tuple[bytes, bytes]], publish: Any) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((puts, future, publish))
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write_pending())
        await future

    async def _write_pending(self) -> None:
        """The synced writer: one WriteBatch and one fsync for every append waiting at that moment."""
        try:
            while self._pending:
                round_, self._pending = self._pending, []
                if self._write_error is not None:  # queued behind a failed write: would leave a hole
                    for _puts, future, _publish in round_:
                        if not future.done():
                            future.set_exception(self._write_error)
                    continue
                batch = WriteBatch(raw_mode=True)
                for puts, _future, _publish in round_:
                    for key, value in puts:
                        batch.put(key, value)
                try:
                    await asyncio.to_thread(self.db.write, batch, self._wo_sync)
                except Exception as exc:  # noqa: BLE001 - every waiter hears about it
                    # Offsets after the failed ones were already handed out: like Kafka taking a log dir
                    # offline, refuse further appends rather than leave a hole in a shard.
                    error = StorageError(f"rocksdb write failed, appends disabled until restart: {exc}")
                    self._write_error = error
                    for _puts, future, _publish in round_:
                        if not future.done():
                            future.set_exception(error)
                    continue
                for _puts, future, publish in round_:
                    publish()
                    if not future.done():
                        future.set_result(None)
        finally:
            self._writer = None

    async def read(self, topic: str, queue: int, offset: int, max_bytes: int) -> ReadResult:
        shard = self._shard(topic, queue)
        if offset < shard.log_start or offset > shard.end:
            raise OffsetOutOfRange(offset, shard.log_start, shard.end)
        if offset == shard.end:  # fast path: a consumer polling at the tail
            return ReadResult([], shard.log_start, shard.end)
        batches = await asyncio.to_thread(self._read_batches, shard, offset, max_bytes, shard.end)
        return ReadResult(batches, shard.log_start, shard.end)

    def _read_batches(
        self, shard: _Shard, offset: int, max_bytes: int, end: int, limit: int = 1 << 62
    ) -> list[StoredBatch]:
        prefix = b"d" + shard.sp
        picked: list[StoredBatch] = []
        size = 0
        it = self.db.iter()
        try:
            it.seek_for_prev(prefix + _U64.pack(offset))
            if it.valid() and it.key().startswith(prefix):
                _, _, _, _, count = DATA_HEADER.unpack_from(it.value())
                if _U64.unpack_from(it.key(), len(prefix))[0] + count <= offset:
                    it.next()  # the batch before `offset` ends before it: start at the next one
            else:
                it.seek(prefix + _U64.pack(offset))
            while it.valid() and len(picked) < limit:
                key = it.key()
                if not key.startswith(prefix):
                    break
                base = _U64.unpack_from(key, len(prefix))[0]
                if base >= end:
                    break
                value = it.value()
                if picked and size + len(value) - DATA_HEADER.size > max_bytes:
                    break
                store_ts, own_max, _running, tags, count = DATA_HEADER.unpack_from(value)
                data = memoryview(value)[DATA_HEADER.size :]
                picked.append(StoredBatch(base, count, data, store_ts, own_max, tags))
                size += len(data)
                it.next()
        finally:
            del it
        if picked:
            picked = self._with_physical(shard, picked)
        return picked

    def _with_physical(self, shard: _Shard, picked: list[StoredBatch]) -> list[StoredBatch]:
        """The batches with their physical offsets, from one walk over the shard's reverse keys (they run in the
        same base-offset order as the batches; cheaper than a point lookup each). Batches without a reverse key (a
        database written without physical offsets) have none (-1)."""
        rev = b"P" + shard.sp
        last = rev + _U64.pack(picked[-1].base_offset)
        physs: dict[int, int] = {}
        it = self.db.iter()
        try:
            it.seek(rev + _U64.pack(picked[0].base_offset))
            while it.valid():
                key = it.key()
                if key > last:
                    break
                physs[_U64.unpack_from(key, len(rev))[0]] = _U64.unpack(it.value())[0]
                it.next()
        finally:
            del it
        return [
            StoredBatch(
                b.base_offset,
                b.record_count,
                b.data,
                b.store_timestamp,
                b.max_timestamp,
                b.tags_code,
                physs.get(b.base_offset, -1),
            )
            for b in picked
        ]

    def _forget_phys(self, batch: WriteBatch, start: bytes, end: bytes) -> None:
        """Add to `batch` the deletion of the reverse keys in [start, end) and of the forward keys they name, and
        the high-water mark that keeps the deleted values from being handed out again."""
        batch.put(b"n", _U64.pack(self._next_phys))
        it = self.db.iter()
        try:
            it.seek(start)
            while it.valid() and it.key() < end:
                batch.delete(b"p" + it.value())
                it.next()
        finally:
            del it
        batch.delete_range(start, end)

    async def read_at(self, physical_offset: int) -> tuple[str, int, StoredBatch] | None:
        if self._db is None or not 0 <= physical_offset < 1 << 64:
            return None
        return await asyncio.to_thread(self._read_at, physical_offset)

    def _read_at(self, phys: int) -> tuple[str, int, StoredBatch] | None:
        value = self.db.get(b"p" + _U64.pack(phys))
        if value is None or len(value) < _PHYS_VALUE.size + 6:
            return None
        base, span = _PHYS_VALUE.unpack_from(value)
        sp = value[_PHYS_VALUE.size :]
        tlen = _U16.unpack_from(sp)[0]
        if len(sp) != 2 + tlen + 4:
            return None
        topic = sp[2 : 2 + tlen].decode("utf-8", "replace")
        queue = _U32.unpack_from(sp, 2 + tlen)[0]
        shards = self._topics.get(topic)
        if shards is None or queue >= len(shards):
            return None
        shard = shards[queue]
        if base + span <= shard.log_start or base >= shard.end:
            return None  # deleted, or not yet visible
        if self.db.get(b"P" + sp + _U64.pack(base)) != _U64.pack(phys):
            return None  # the topic was deleted (and re-created) since, or the batch compacted away
        found = self._read_batches(shard, base, 0, shard.end, limit=1)
        if not found or found[0].base_offset != base:
            return None
        return topic, queue, found[0]

    async def read_by_tags(
        self, topic: str, queue: int, offset: int, tags_codes: Iterable[int], max_batches: int
    ) -> ReadResult:
        shard = self._shard(topic, queue)
        if offset < shard.log_start or offset > shard.end:
            raise OffsetOutOfRange(offset, shard.log_start, shard.end)
        wanted = set(tags_codes)
        picked: list[StoredBatch] = []
        while offset < shard.end and len(picked) < max_batches:
            chunk = await asyncio.to_thread(self._read_batches, shard, offset, 1 << 20, shard.end)
            if not chunk:
                break
            picked.extend(b for b in chunk if b.tags_code in wanted)
            offset = chunk[-1].next_offset
        return ReadResult(picked[:max_batches], shard.log_start, shard.end)

    async def read_by_key(
        self, topic: str, key: bytes, max_count: int, begin_ms: int = 0, end_ms: int = 1 << 62
    ) -> list[tuple[int, StoredBatch]]:
        if topic not in self._topics:
            raise UnknownShard(f"unknown topic {topic!r}")
        key = bytes(key)
        prefix = b"k" + _topic_key(topic) + _U32.pack(len(key)) + key
        return await asyncio.to_thread(self._read_by_key, topic, prefix, max_count, begin_ms, end_ms)

    def _read_by_key(
        self, topic: str, prefix: bytes, max_count: int, begin_ms: int, end_ms: int
    ) -> list[tuple[int, StoredBatch]]:
        found: list[tuple[int, StoredBatch]] = []
        it = self.db.iter()
        try:
            it.seek_for_prev(prefix + _bias(end_ms) + _MAX_KEY_SUFFIX[:12])
            while it.valid() and len(found) < max_count:
                k = it.key()
                if not k.startswith(prefix):
                    break
                store_ts = _U64.unpack_from(k, len(prefix))[0] - _BIAS
                if store_ts < begin_ms:
                    break
                queue = _U32.unpack_from(k, len(prefix) + 8)[0]
                base = _U64.unpack_from(k, len(prefix) + 12)[0]
                shards = self._topics.get(topic, [])
                if queue < len(shards) and shards[queue].log_start <= base < shards[queue].end:
                    value = self.db.get(b"d" + shards[queue].sp + _U64.pack(base))
                    if value is not None:
                        ts, own_max, _running, tags, count = DATA_HEADER.unpack_from(value)
                        data = memoryview(value)[DATA_HEADER.size :]
                        found.append((queue, StoredBatch(base, count, data, ts, own_max, tags)))
                it.prev()
        finally:
            del it
        return found

    async def delete_before(self, topic: str, queue: int, offset: int) -> int:
        shard = self._shard(topic, queue)
        if offset == -1:  # Kafka's DeleteRecords: -1 means the high watermark
            offset = shard.end
        if offset < 0 or offset > shard.end:
            raise OffsetOutOfRange(offset, shard.log_start, shard.end)
        if offset <= shard.log_start:
            return shard.log_start
        shard.log_start = offset
        await asyncio.to_thread(self._delete_before, shard, offset)
        return offset

    def _delete_before(self, shard: _Shard, offset: int) -> None:
        data_prefix, time_prefix = b"d" + shard.sp, b"t" + shard.sp
        kept = self._read_batches(shard, offset, 0, 1 << 63, limit=1)
        batch = WriteBatch(raw_mode=True)
        rev_prefix = b"P" + shard.sp
        self._forget_phys(
            batch, rev_prefix, rev_prefix + _U64.pack(kept[0].base_offset) if kept else _prefix_end(rev_prefix)
        )
        if kept:
            first = kept[0]
            running = DATA_HEADER.unpack_from(self._stored(data_prefix + _U64.pack(first.base_offset)))[2]
            batch.delete_range(data_prefix, data_prefix + _U64.pack(first.base_offset))
            batch.delete_range(time_prefix, time_prefix + _bias(running) + _U64.pack(first.base_offset))
        else:
            batch.delete_range(data_prefix, _prefix_end(data_prefix))
            batch.delete_range(time_prefix, _prefix_end(time_prefix))
        batch.put(b"m" + shard.sp, _META.pack(offset, shard.end))
        self.db.write(batch, self._wo_sync)

    async def offset_for_timestamp(self, topic: str, queue: int, timestamp: int) -> tuple[int, int] | None:
        shard = self._shard(topic, queue)
        if shard.end == shard.log_start or shard.running_max < timestamp:
            return None
        return await asyncio.to_thread(self._offset_for_timestamp, shard, timestamp)

    def _offset_for_timestamp(self, shard: _Shard, timestamp: int) -> tuple[int, int] | None:
        time_prefix = b"t" + shard.sp
        it = self.db.iter()
        try:
            it.seek(time_prefix + _bias(timestamp))
            if not (it.valid() and it.key().startswith(time_prefix)):
                return None
            base = _U64.unpack_from(it.key(), len(time_prefix) + 8)[0]
        finally:
            del it
        offset = max(base, shard.log_start)
        while offset < shard.end:
            chunk = self._read_batches(shard, offset, 1 << 20, shard.end)
            if not chunk:
                return None
            for batch in chunk:
                if batch.max_timestamp >= timestamp:
                    hit = first_record_at_or_after(batch.data, timestamp, shard.log_start)
                    if hit is not None:
                        return hit
            offset = chunk[-1].next_offset
        return None

    async def max_timestamp(self, topic: str, queue: int) -> tuple[int, int] | None:
        shard = self._shard(topic, queue)
        if shard.end == shard.log_start:
            return None
        return await asyncio.to_thread(self._max_timestamp, shard)

    def _stored(self, key: bytes) -> bytes:
        """The value of a key an index entry or a batch read just named: missing is a damaged database."""
        value: bytes | None = self.db.get(key)
        if value is None:
            raise Corrupt(f"rocksdb: key {key!r} is missing")
        return value

    def _max_timestamp(self, shard: _Shard) -> tuple[int, int] | None:
        # After delete_before the running maxima may still count deleted batches, and the top record may lie
        # below the log start: then (rarely: ListOffsets MAX_TIMESTAMP) scan the retained batches.
        first = self._read_batches(shard, shard.log_start, 0, shard.end, limit=1)
        if not first:
            return None
        value = self._stored(b"d" + shard.sp + _U64.pack(first[0].base_offset))
        if DATA_HEADER.unpack_from(value)[2] == first[0].max_timestamp:  # first retained running max unpolluted
            hit = self._offset_for_timestamp(shard, shard.running_max)
            if hit is not None:
                return hit
        best: tuple[int, int] | None = None
        offset = shard.log_start
        while offset < shard.end:
            chunk = self._read_batches(shard, offset, 1 << 20, shard.end)
            if not chunk:
                break
            found = max_retained_timestamp(chunk, shard.log_start)
            if found is not None and (best is None or found[1] > best[1]):
                best = found
            offset = chunk[-1].next_offset
        return best

    async def replace_range(self, topic: str, queue: int, start: int, end: int, batches: Sequence[Buffer]) -> None:
        """Compaction's rewrite (StorageAdapter.replace_range): one synced WriteBatch, so a crash leaves the old
        range or the new one. Kept batches keep their store time, tags code and running max (time index key)."""
        shard = self._shard(topic, queue)
        copies = [bytes(b) for b in batches]
        await asyncio.to_thread(self._replace_range, shard, start, end, copies, f"{topic}-{queue}")

    def _replace_range(self, shard: _Shard, start: int, end: int, batches: list[bytes], name: str) -> None:
        data_prefix, time_prefix = b"d" + shard.sp, b"t" + shard.sp
        old: dict[int, tuple[int, ...]] = {}
        it = self.db.iter()
        try:
            it.seek(data_prefix + _U64.pack(start))
            while it.valid():
                key = it.key()
                if not key.startswith(data_prefix):
                    break
                base = _U64.unpack_from(key, len(data_prefix))[0]
                if base >= end:
                    break
                old[base] = DATA_HEADER.unpack_from(it.value())
                it.next()
        finally:
            del it
        write = WriteBatch(raw_mode=True)
        kept = set()
        for data in batches:
            header = _recbatch.parse_header(data, 0)
            prev = old.get(header[0])
            if prev is None or prev[4] != header[6] + 1:
                raise InvalidRecord(
                    f"replacement batch at {header[0]} does not match a stored batch in [{start}, {end}) of {name}"
                )
            write.put(
                data_prefix + _U64.pack(header[0]),
                DATA_HEADER.pack(prev[0], header[8], prev[2], prev[3], prev[4]) + data,
            )
            kept.add(header[0])
        for base, prev in old.items():
            if base not in kept:
                write.delete(data_prefix + _U64.pack(base))
                write.delete(time_prefix + _bias(prev[2]) + _U64.pack(base))
                rev = b"P" + shard.sp + _U64.pack(base)
                self._forget_phys(write, rev, rev + b"\x00")  # compacted away: its id names nothing now
        self.db.write(write, self._wo_sync)

    def log_start_offset(self, topic: str, queue: int) -> int:
        return self._shard(topic, queue).log_start

    def end_offset(self, topic: str, queue: int) -> int:
        return self._shard(topic, queue).end

    # --- group offsets -------------------------------------------------------------------------------------

    @staticmethod
    def _group_key(group: str, topic: str, queue: int) -> bytes:
        raw = group.encode()
        if len(raw) > 0xFFFF:
            raise StorageError(f"group id of {len(raw)} bytes is too long")
        return b"g" + _U16.pack(len(raw)) + raw + _topic_key(topic) + _U32.pack(queue)

    async def commit_offsets(self, group: str, offsets: dict[tuple[str, int], GroupOffset]) -> None:
        if not offsets:
            return
        batch = WriteBatch(raw_mode=True)
        for (topic, queue), value in offsets.items():
            batch.put(
                self._group_key(group, topic, queue),
                _GROUP_VALUE.pack(value.offset, value.commit_timestamp, value.leader_epoch)
                + (value.metadata or "").encode(),
            )
        # RocksDB groups concurrent synced writers itself: concurrent commits share one WAL fsync.
        await asyncio.to_thread(self.db.write, batch, self._wo_sync)
        self._groups.setdefault(group, {}).update(offsets)

    def fetch_offsets(self, group: str) -> dict[tuple[str, int], GroupOffset]:
        return dict(self._groups.get(group, {}))

    async def delete_offsets(self, group: str, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        parts = self._groups.get(group)
        if parts is None:
            return
        targets = list(parts) if partitions is None else [p for p in partitions if p in parts]
        batch = WriteBatch(raw_mode=True)
        for topic, queue in targets:
            batch.delete(self._group_key(group, topic, queue))
        await asyncio.to_thread(self.db.write, batch, self._wo_sync)
        for partition in targets:
            parts.pop(partition, None)
        if not parts:
            self._groups.pop(group, None)

    def list_offset_groups(self) -> list[str]:
        return sorted(self._groups)


__all__ = ["RocksEngine"]
