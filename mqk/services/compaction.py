"""CompactionService: Kafka's log cleaner for topics with `cleanup.policy` containing `compact`.

Owns the cleaning rules and the cleaner checkpoints (the offset up to which each shard is clean, in the store state
document `compaction`); the engines own the atomic rewrite (`StorageAdapter.replace_range`).

One pass over a shard, as Kafka's cleaner does it:
1. The *cleanable range* ends before the active segment, which Kafka never cleans, and before anything younger
   than `min.compaction.lag.ms`. No engine keeps a log per shard in segments (the file engine's CommitLog segments
   are shared by every shard), so the shard's segments are those Kafka's roll rules would have cut, recomputed
   from the log start at each pass (`active_segment_start`): a batch starts a new segment when the current one
   plus the batch would exceed `segment.bytes`, or when the batch comes more than `segment.ms` after the current
   segment's first batch. A batch's time is its own max timestamp (what Kafka's rolling is based on; for
   CreateTime topics the producer's clock stands in for the append time Kafka compares it with). So a quiet
   compacted topic becomes cleanable at the first append after `segment.ms`, as in Kafka. The last batch is
   always in the active segment.
2. Dirty = batches between the cleaner checkpoint and the end of the cleanable range. The shard is cleaned only if
   dirty bytes / cleanable bytes >= `min.cleanable.dirty.ratio`, or a dirty batch is older than
   `max.compaction.lag.ms`.
3. An `OffsetMap` (16-byte key digest -> latest offset, bounded by `log.cleaner.dedupe.buffer.size`, like Kafka's
   SkimpyOffsetMap) is built over the dirty batches. If it fills, only the batches it fully covers count as cleaned
   this pass; the next pass goes on from there.
4. Every batch from the log start to the end of the mapped range is filtered: a record stays if it holds the
   latest offset of its key (or its key is not in the map: its latest value is in the clean section), it has a key
   (Kafka drops keyless records from compacted logs), and it is not a tombstone (null value) older than
   `delete.retention.ms`. Offsets never change: gaps are allowed.
5. Batches are rewritten whole, with Kafka's header rules: the base offset, last offset delta (so the offset span),
   producer id / epoch, base sequence, partition leader epoch and base timestamp stay; the max timestamp becomes
   the retained records' maximum (a LogAppendTime batch keeps its own); records keep their offset and timestamp
   deltas. Retained records of a compressed batch are compressed again with the batch's codec (Kafka's cleaner
   keeps it too, so a topic whose compression.type names a codec stays in it). A batch
   with nothing left is dropped, except the last batch of each producer id, which stays as an empty batch so the
   producer's sequence state (idempotence) survives, as in Kafka. Control batches are kept as they are, or go
   whole (below).
   Transactions (Kafka's cleaner rules, with `transactions` set: mqk.server.kafka.transactions): nothing at or past
   the partition's last stable offset is cleanable (an undecided transaction's records stay as they are); a
   batch of an aborted transaction neither enters the offset map (an aborted value never hides a committed one)
   nor survives the filter (its records go; the producer's last batch stays empty, as above). A marker stays
   while its transaction has something left before it: a kept record of a committed transaction; any batch of an
   aborted one, so an ABORT marker outlives its transaction's batches by at least one pass (they go in the pass
   that covers them, the marker in a later one), as in Kafka's cleaner. Once nothing is left, a marker goes when
   it is older than delete.retention.ms (counted from its timestamp, as a tombstone's is here; Kafka counts from
   the cleaning that found it empty), unless it is its producer's last batch. The aborted-transaction index
   (what read_committed fetches are told) keeps, as Kafka's rewritten `.txnindex` does, only the aborted
   transactions whose batches the pass met: the others (`TransactionView.forget_aborted`) are forgotten, their
   markers gone or not, before the rewrite of the range holding their markers (why in that order: `_forget_settled`).
6. The new batches replace the old ones chunk by chunk (`replace_range`: atomic per call, so a crash leaves every
   batch old or new and cleaning is idempotent), then the checkpoint moves.

The CPU work (decoding and re-encoding records) runs on the event loop one batch at a time, yielding between
slices and, while other work is waiting, keeping to `duty` (25 %) of the loop, so producers and consumers keep most
of the broker while a log is cleaned (a worker thread would fight the loop for the GIL and stall every socket
call). Engines that cannot rewrite (NotSupported) are skipped with one log line per topic.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from mqk._fast import load
from mqk.clock import SYSTEM_CLOCK, Clock
from mqk.config import BrokerConfig
from mqk.errors import NotSupported, StorageError, UnknownShard
from mqk.protocol.kafka.aborted import NO_ABORTS, AbortedBatches
from mqk.protocol.kafka.records import compress
from mqk.services import BackgroundTask
from mqk.store.adapter import BatchInfo, StoredBatch
from mqk.store.batches import decompress as _decompress

recbatch = load("recbatch")
log = logging.getLogger("mqk.compaction")

STATE_NAME = "compaction"
_ATTR_COMPRESSION = 0x07
_ATTR_LOG_APPEND_TIME = 0x08
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20
#: bytes per map entry in CPython (dict slot + index + 16-byte bytes key + int value; bench/compaction_bench.py)
MAP_ENTRY_BYTES = 120
#: batches rewritten per replace_range call (each call is atomic)
CHUNK_BYTES = 4 << 20
#: cleaner work between two yields to the event loop
SLICE_SECONDS = 0.002
#: share of the event loop the cleaner may take while producers and consumers are busy
DEFAULT_DUTY = 0.25


def key_digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


class OffsetMap:
    """Key digest -> latest offset, bounded in entries (the memory cap divided by the cost of one entry).

    Like Kafka's SkimpyOffsetMap, keys are stored as 16-byte digests (a collision would need ~2^64 keys), so the
    memory per key does not depend on key size. A plain dict beats a sorted map here: only point lookups are needed
    (bench/compaction_bench.py measures it against sortedcontainers.SortedDict)."""

    __slots__ = ("_map", "capacity")

    def __init__(self, memory_bytes: int) -> None:
        self.capacity = max(1, memory_bytes // MAP_ENTRY_BYTES)
        self._map: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._map)

    def room_for(self, n: int) -> bool:
        return len(self._map) + n <= self.capacity

    def put(self, digest: bytes, offset: int) -> None:
        self._map[digest] = offset

    def get(self, digest: bytes, default: int = -1) -> int:
        return self._map.get(digest, default)


@dataclass
class CleanStats:
    batches_read: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_kept: int = 0
    records_removed: int = 0
    seconds: float = 0.0

    @property
    def mb_per_sec(self) -> float:
        return self.bytes_read / 1e6 / self.seconds if self.seconds else 0.0


@dataclass
class CompactionReport:
    cleaned: dict[tuple[str, int], CleanStats] = field(default_factory=dict)
    skipped: dict[tuple[str, int], str] = field(default_factory=dict)


# --- the record-level work (pure functions; the service runs them on the loop in slices, see _pace) -------------


def _records(data: Any) -> tuple[tuple, list[tuple]]:
    header = recbatch.parse_header(data, 0)
    section = bytes(memoryview(data)[recbatch.HEADER_SIZE :])
    codec = header[5] & _ATTR_COMPRESSION
    if codec:
        section = _decompress(codec, section)
    return header, recbatch.decode_records(section, header[12])


class TransactionView(Protocol):
    """What the cleaner must know of a partition's transactions (mqk.server.kafka.transactions)."""

    def last_stable(self, topic: str, partition: int, high_watermark: int) -> int: ...

    def aborted_ranges(self, topic: str, partition: int) -> list[tuple[int, int, int]]:
        """(marker offset, producer id, first offset) of each aborted transaction, in marker order."""
        ...

    async def forget_aborted(self, topic: str, partition: int, markers: Iterable[int]) -> None:
        """Forget the aborted transactions whose markers are at `markers`: their tombstones are appended to the
        state log when this returns (see CompactionService._forget_settled for why that comes first)."""
        ...


def _aborted(header: tuple, aborted: AbortedBatches) -> bool:
    return bool(header[5] & _ATTR_TRANSACTIONAL) and (header[9], header[0]) in aborted


def map_batches(batches: list[StoredBatch], offset_map: OffsetMap, aborted: AbortedBatches = NO_ABORTS) -> int:
    """Record each key's latest offset; returns how many batches were mapped whole (the map may fill up). Control
    batches and those of `aborted` transactions are passed over."""
    done = 0
    for batch in batches:
        header, records = _records(batch.data)
        if header[5] & _ATTR_CONTROL or _aborted(header, aborted):
            done += 1
            continue
        keyed = [(key_digest(r[3]), header[0] + r[2]) for r in records if r[3] is not None]
        if not offset_map.room_for(len(keyed)):
            break
        for digest, offset in keyed:
            offset_map.put(digest, offset)
        done += 1
    return done


def filter_batches(
    batches: list[StoredBatch],
    offset_map: OffsetMap,
    tombstone_horizon: int,
    last_of_producer: dict[int, int],
    stats: CleanStats,
    aborted: AbortedBatches = NO_ABORTS,
    transactions_kept: dict[int, bool] | None = None,
    markers_waiting: set[int] | None = None,
) -> list[Any]:
    """The rewritten copies of `batches` (originals where nothing changes); dropped batches are left out. The
    records of `aborted` transactions' batches all go.

    A transaction marker (a control batch, COMMIT or ABORT) goes as Kafka's cleaner lets it go: once its
    transaction has nothing left before it and it is older than the tombstone horizon (delete.retention.ms),
    unless it is its producer's last batch (kept for the producer's state). What a committed transaction leaves is
    a kept record; what an aborted one leaves is any batch met here, although it goes now: its marker must
    outlive it by a pass, because a reader told of the transaction by the aborted-transaction index skips the
    producer's batches until it meets the marker, and that index entry may be forgotten only once the batches are
    gone from the log (the caller forgets it before the rewrite that drops the marker: CompactionService).
    `transactions_kept` (producer id -> whether its transaction under way has left something so far) carries that
    across calls over one log, in offset order; `markers_waiting` gets the offsets of the markers met while their
    transaction had something left (the aborted-transaction index keeps those of aborted transactions)."""
    kept_by_producer = transactions_kept if transactions_kept is not None else {}
    out: list[Any] = []
    for batch in batches:
        data = batch.data
        header, records = _records(data)
        (
            base,
            _length,
            leader_epoch,
            _magic,
            _crc,
            attributes,
            last_delta,
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            _count,
        ) = header
        stats.batches_read += 1
        stats.bytes_read += len(data)
        if attributes & _ATTR_CONTROL:
            transaction_left = kept_by_producer.pop(producer_id, False)
            if transaction_left and markers_waiting is not None:
                markers_waiting.add(base)
            if (
                _is_marker(records)
                and not transaction_left
                and max_ts < tombstone_horizon
                and last_of_producer.get(producer_id) != base
            ):
                stats.records_removed += len(records)
                continue
            out.append(data)
            continue
        kept = []
        # an aborted transaction's records all go: none is walked, so none is kept
        in_aborted = _aborted(header, aborted)
        walked = () if in_aborted else records
        for record in walked:
            key, value = record[3], record[4]
            offset = base + record[2]
            if key is None:
                continue
            if offset_map.get(key_digest(key)) > offset:
                continue  # a later record of this key exists
            if value is None and max_ts < tombstone_horizon:
                continue  # an expired tombstone: the key is gone
            kept.append(record)
        stats.records_kept += len(kept)
        stats.records_removed += len(records) - len(kept)
        if in_aborted or (kept and attributes & _ATTR_TRANSACTIONAL):
            kept_by_producer[producer_id] = True
        if len(kept) == len(records):
            out.append(data)
            stats.bytes_written += len(data)
            continue
        if not kept and not (producer_id >= 0 and last_of_producer.get(producer_id) == base):
            continue
        encoded = b"".join(recbatch.encode_record(r[2], r[1], r[3], r[4], r[5]) for r in kept)
        codec = attributes & _ATTR_COMPRESSION
        if codec:
            encoded = compress(codec, encoded)
        new_max = max_ts if attributes & _ATTR_LOG_APPEND_TIME or not kept else max(base_ts + r[1] for r in kept)
        rebuilt = recbatch.build_batch(
            base,
            base_ts,
            new_max,
            encoded,
            len(kept),
            last_delta,
            attributes,
            producer_id,
            producer_epoch,
            base_sequence,
            leader_epoch,
        )
        out.append(bytes(rebuilt))
        stats.bytes_written += len(rebuilt)
    return out


def _is_marker(records: list[tuple]) -> bool:
    """Whether a control batch's record is a transaction marker (its key: version int16, type int16, 0 = ABORT,
    1 = COMMIT); a control batch of another kind is kept, as Kafka's cleaner keeps it."""
    key = records[0][3] if len(records) == 1 else None
    return key is not None and len(key) == 4 and key[2:4] in (b"\x00\x00", b"\x00\x01")


def _next_offset(data: Any) -> int:
    header = recbatch.parse_header(data, 0)
    return header[0] + header[6] + 1


# --- the service ------------------------------------------------------------------------------------------------


def active_segment_start(infos: list[BatchInfo], segment_bytes: int, segment_ms: int) -> int:
    """The index of the first batch of the active segment of a shard whose batches are `infos` (from its log
    start), had its log been cut into segments by Kafka's roll rules (size: the segment plus the batch would exceed
    `segment_bytes`; time: the batch is more than `segment_ms` after the segment's first batch)."""
    start = 0
    size = infos[0].size
    base = infos[0].max_timestamp
    for i in range(1, len(infos)):
        info = infos[i]
        if size + info.size > segment_bytes or info.max_timestamp - base > segment_ms:
            start, size, base = i, info.size, info.max_timestamp
        else:
            size += info.size
    return start


def compaction_settings(config: Any) -> dict[str, float] | None:
    """The cleaner settings of a TopicConfig whose cleanup.policy includes `compact`, else None."""
    policies = {p.strip() for p in config.get("cleanup.policy").split(",")}
    if "compact" not in policies:
        return None
    try:
        return {
            "segment_bytes": config.get_int("segment.bytes"),
            "segment_ms": config.get_int("segment.ms"),
            "min_lag_ms": config.get_int("min.compaction.lag.ms"),
            "max_lag_ms": config.get_int("max.compaction.lag.ms"),
            "dirty_ratio": float(config.get("min.cleanable.dirty.ratio")),
            "delete_retention_ms": config.get_int("delete.retention.ms"),
        }
    except ValueError:
        return None


class CompactionService:
    def __init__(self, config: BrokerConfig, store: Any, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.store = store
        #: when the next pass is due (`log_cleaner_backoff_ms` after the last) and what "now" the lags and the
        #: tombstone horizon are measured from; `_pace` measures real CPU time instead, on purpose (see there)
        self.clock = clock
        self.backoff_ms = config.log_cleaner_backoff_ms
        self.map_bytes = config.log_cleaner_dedupe_buffer_size
        self._lock = asyncio.Lock()
        self._loop_task = BackgroundTask("mqk-compaction")
        self._unsupported: set[str] = set()
        self.duty = DEFAULT_DUTY
        self._debt = 0.0
        self.passes = 0
        self.last_report: CompactionReport | None = None
        #: the Kafka transactions of the broker's partitions (None: no transaction ever writes here)
        self.transactions: TransactionView | None = None

    async def start(self) -> CompactionService:
        self._loop_task.start(self._loop)
        return self

    async def stop(self) -> None:
        await self._loop_task.stop()

    async def _loop(self) -> None:
        while True:
            await self.clock.sleep(self.backoff_ms / 1000)
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # logged; the next pass tries again
                log.exception("compaction pass failed")

    def _checkpoints(self) -> dict[str, int]:
        try:
            doc = self.store.load_state(STATE_NAME) or {}
        except StorageError:
            doc = {}
        return {str(k): int(v) for k, v in dict(doc.get("clean", {})).items()}

    async def run_once(self, now: int | None = None) -> CompactionReport:
        async with self._lock:
            now = self.clock.time_ms() if now is None else now
            report = CompactionReport()
            checkpoints = self._checkpoints()
            changed = False
            for name, info in self.store.topics().items():
                settings = compaction_settings(info.config)
                if settings is None or name in self._unsupported:
                    continue
                for queue in range(info.queue_count):
                    key = f"{name}/{queue}"
                    try:
                        result = await self.clean_shard(name, queue, settings, checkpoints.get(key, 0), now)
                    except NotSupported as exc:
                        self._unsupported.add(name)
                        log.warning("topic %s is compacted but %s", name, exc)
                        break
                    except UnknownShard:
                        break
                    if isinstance(result, str):
                        report.skipped[(name, queue)] = result
                        continue
                    upto, stats = result
                    checkpoints[key] = upto
                    changed = True
                    report.cleaned[(name, queue)] = stats
                    log.info(
                        "compacted %s-%d up to %d: %d of %d records kept, %.1f MB/s",
                        name,
                        queue,
                        upto,
                        stats.records_kept,
                        stats.records_kept + stats.records_removed,
                        stats.mb_per_sec,
                    )
            if changed:
                live = {f"{t}/{q}" for t, i in self.store.topics().items() for q in range(i.queue_count)}
                await self.store.save_state(STATE_NAME, {"clean": {k: v for k, v in checkpoints.items() if k in live}})
            self.passes += 1
            self.last_report = report
            return report

    async def _infos(self, engine: Any, topic: str, queue: int, start: int) -> list[BatchInfo]:
        out: list[BatchInfo] = []
        offset = start
        while True:
            chunk = await engine.batch_infos(topic, queue, offset, 4096)
            if not chunk:
                return out
            out.extend(chunk)
            offset = chunk[-1].next_offset

    async def _read(self, engine: Any, topic: str, queue: int, start: int, end: int) -> list[StoredBatch]:
        out: list[StoredBatch] = []
        offset = start
        while offset < end:
            result = await engine.read(topic, queue, offset, 1 << 20)
            if not result.batches:
                break
            for batch in result.batches:
                if batch.base_offset >= end:
                    return out
                out.append(batch)
            offset = result.batches[-1].next_offset
        return out

    async def clean_shard(
        self, topic: str, queue: int, settings: dict, checkpoint: int, now: int
    ) -> tuple[int, CleanStats] | str:
        """One cleaning of one shard: (new checkpoint, stats), or why it was skipped."""
        engine = self.store.engine_of(topic)
        start = engine.log_start_offset(topic, queue)
        infos = await self._infos(engine, topic, queue, start)
        if len(infos) < 2:
            return "nothing to clean"
        # 1. the active segment (as Kafka's roll rules cut it) and the too young are not cleanable
        head = active_segment_start(infos, int(settings["segment_bytes"]), int(settings["segment_ms"]))
        lag_deadline = now - settings["min_lag_ms"]
        for i in range(head):
            if infos[i].max_timestamp > lag_deadline:
                head = i
                break
        aborted = NO_ABORTS
        ranges: list[tuple[int, int, int]] = []
        if self.transactions is not None:
            # an undecided transaction's records, and all after them, wait for its decision (Kafka's rule)
            stable = self.transactions.last_stable(topic, queue, infos[-1].next_offset)
            head = min(head, next((i for i, info in enumerate(infos) if info.next_offset > stable), head))
            ranges = self.transactions.aborted_ranges(topic, queue)
            if ranges:
                aborted = AbortedBatches(ranges)
        cleanable = infos[:head]
        if not cleanable:
            return "only the active head"
        # 2. dirty ratio
        checkpoint = max(checkpoint, start)
        total = sum(i.size for i in cleanable)
        dirty = sum(i.size for i in cleanable if i.base_offset >= checkpoint)
        if dirty == 0:
            return "nothing dirty"
        if dirty / total < settings["dirty_ratio"]:
            # max.compaction.lag.ms: dirt older than that is cleaned whatever the ratio
            oldest_dirty = min(i.max_timestamp for i in cleanable if i.base_offset >= checkpoint)
            if oldest_dirty >= now - settings["max_lag_ms"]:
                return f"dirty ratio {dirty / total:.2f} below {settings['dirty_ratio']}"
        end = cleanable[-1].next_offset
        t0 = time.perf_counter()
        stats = CleanStats()
        # 3. the offset map over the dirty batches
        dirty_start = next(i.base_offset for i in cleanable if i.base_offset >= checkpoint)
        offset_map = OffsetMap(self.map_bytes)
        upto = dirty_start
        offset = dirty_start
        full = False
        while offset < end and not full:
            batches = await self._read(engine, topic, queue, offset, end)
            if not batches:
                break
            for batch in batches:
                t = time.perf_counter()
                if map_batches([batch], offset_map, aborted) == 0:
                    full = True
                    break
                upto = batch.next_offset
                await self._pace(time.perf_counter() - t)
            offset = batches[-1].next_offset
        if upto == dirty_start:
            return "offset map too small for one batch"
        # 4.-6. filter from the log start to the end of the mapped range, chunk by chunk
        horizon = now - settings["delete_retention_ms"]
        last_of_producer = self._last_batches(await self._read(engine, topic, queue, start, upto))
        transactions_kept: dict[int, bool] = {}
        markers_waiting: set[int] = set()
        offset = start
        while offset < upto:
            chunk = await self._read(engine, topic, queue, offset, upto)
            if not chunk:
                break
            rewritten: list[Any] = []
            size = 0
            taken = 0
            # an engine whose rewrite costs a whole copy of the prefix (the file engine's compaction log) gets the
            # whole range in one call; the others get atomic chunks
            limit = 1 << 62 if engine.rewrite_copies_prefix else CHUNK_BYTES
            for batch in chunk:
                t = time.perf_counter()
                rewritten.extend(
                    filter_batches(
                        [batch],
                        offset_map,
                        horizon,
                        last_of_producer,
                        stats,
                        aborted,
                        transactions_kept,
                        markers_waiting,
                    )
                )
                taken += 1
                size += len(batch.data)
                await self._pace(time.perf_counter() - t)
                if size >= limit:
                    break
            chunk_end = chunk[taken - 1].next_offset
            await self._forget_settled(topic, queue, ranges, offset, chunk_end, markers_waiting)
            # retention (DeleteRecords, compact,delete) may have moved the log start while we worked: batches
            # wholly below it are gone and must not come back
            log_start = engine.log_start_offset(topic, queue)
            if log_start > chunk[0].base_offset:
                rewritten = [b for b in rewritten if _next_offset(b) > log_start]
            await engine.replace_range(topic, queue, chunk[0].base_offset, chunk_end, rewritten)
            offset = max(chunk_end, engine.log_start_offset(topic, queue))
        stats.seconds = time.perf_counter() - t0
        return upto, stats

    async def _forget_settled(
        self,
        topic: str,
        queue: int,
        ranges: list[tuple[int, int, int]],
        start: int,
        end: int,
        markers_waiting: set[int],
    ) -> None:
        """Forget the aborted transactions (`ranges`, in marker order) whose markers lie in [start, end), the range
        about to be rewritten, unless the pass met a batch of theirs (`markers_waiting`): like Kafka's rewritten
        `.txnindex`, the index keeps only the aborted transactions with batches left, whether their markers go now
        or stay (young, or their producer's last batch). One whose marker the pass did not meet at all is
        forgotten too (see below: a crash that kept a rewrite but lost the tombstone before it).

        Why first: a reader told of an aborted transaction skips the producer's batches until it meets the
        marker, so the index must never name a transaction whose marker is gone (the reader would skip the
        producer's later committed batches). With the tombstone appended (and awaited) before the rewrite, a crash
        between the two leaves a marker the index no longer names, which readers pass over. Nor may an entry go
        while its transaction's batches are in the log (a reader not told of them would take them as committed):
        hence the pass that drops them keeps the entry and the marker (`filter_batches`), and only a later pass,
        which finds none, forgets the entry, then may drop the marker. The order holds on disk for a process crash,
        and for any crash under sync flush; under async flush a machine crash may lose the tombstone's append and
        keep the rewrite (the file engine fsyncs its compaction log itself): readers may then be told of that
        transaction until the next pass forgets it, as one whose marker it no longer meets."""
        if self.transactions is None or not ranges:
            return
        first, last = bisect.bisect_left(ranges, (start,)), bisect.bisect_left(ranges, (end,))
        settled = [marker for marker, _pid, _first in ranges[first:last] if marker not in markers_waiting]
        if settled:
            await self.transactions.forget_aborted(topic, queue, settled)

    async def _pace(self, spent: float) -> None:
        """Share the event loop: the cleaner works in slices of one batch on the loop (a worker thread would
        fight the loop for the GIL and stall every socket call). After each slice it yields; if other work was
        waiting (the yield took a while) it also sleeps long enough to use at most `duty` of the loop's time.
        This is about the real loop's real time (CPU shared with sockets), not about the broker's clock: it reads
        `perf_counter` and sleeps on the loop, whatever clock the service was given."""
        self._debt += spent
        if self._debt < SLICE_SECONDS:
            return
        t = time.perf_counter()
        await asyncio.sleep(0)
        others = time.perf_counter() - t
        if others > 0.0005 and self.duty < 1.0:
            await asyncio.sleep(self._debt * (1 - self.duty) / self.duty)
        self._debt = 0.0

    @staticmethod
    def _last_batches(batches: list[StoredBatch]) -> dict[int, int]:
        """producer id -> base offset of its last batch in the range (that batch survives even if emptied)."""
        last: dict[int, int] = {}
        for batch in batches:
            producer_id = recbatch.parse_header(batch.data, 0)[9]
            if producer_id >= 0:
                last[producer_id] = batch.base_offset
        return last


__all__ = [
    "CleanStats",
    "CompactionReport",
    "CompactionService",
    "OffsetMap",
    "compaction_settings",
    "filter_batches",
    "map_batches",
]
