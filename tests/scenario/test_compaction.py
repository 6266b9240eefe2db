"""Compaction semantics through the StoreManager on every engine (memory, rocksdb, file): latest record
per key with offsets preserved, tombstones removed only after delete.retention.ms, the active head untouched,
min.cleanable.dirty.ratio and min.compaction.lag.ms respected, a small offset map cleaning in several passes,
idempotent producers' last batch kept (emptied) so their sequence state survives, and the result surviving restart.
Transactions: aborted records never kept nor mapped, markers going as Kafka's cleaner lets them go (an ABORT marker a
pass after its transaction's batches, its aborted-index entry forgotten before the rewrite that drops it).
On the file engine the cleaned prefix lives in the shard's own compaction log (mqk.store.file.compactlog)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import pytest
from helpers import header_of, rb, store_config

from mqk.config import BrokerConfig, TopicConfig
from mqk.services.compaction import CompactionService, OffsetMap
from mqk.store.manager import StoreManager

HOUR = 3600 * 1000
COMPACT = {"cleanup.policy": "compact", "segment.bytes": "1", "min.cleanable.dirty.ratio": "0.01"}


def _now() -> int:
    return time.time_ns() // 1_000_000


def _service(m: StoreManager, **changes) -> CompactionService:
    return CompactionService(dataclasses.replace(BrokerConfig(store=m.config), **changes), m)


def _batch(records: list[tuple[bytes | None, bytes | None]], ts: int, producer: tuple[int, int, int] = (-1, -1, -1)):
    body = b"".join(rb.encode_record(i, 0, k, v, []) for i, (k, v) in enumerate(records))
    pid, epoch, seq = producer
    return rb.build_batch(0, ts, ts, body, len(records), len(records) - 1, 0, pid, epoch, seq)


async def _records(m: StoreManager, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every stored record, decoded with the recbatch twin."""
    out = []
    offset = m.log_start_offset(topic, 0)
    while offset < m.end_offset(topic, 0):
        result = await m.read(topic, 0, offset, 1 << 20)
        if not result.batches:
            break
        for batch in result.batches:
            header = header_of(batch.data)
            for r in rb.decode_records(bytes(batch.data)[rb.HEADER_SIZE :], header[12]):
                out.append((header[0] + r[2], r[3], r[4]))
        offset = result.batches[-1].next_offset
    return out


async def _write_rounds(m: StoreManager, topic: str, rounds: int, keys: int, ts: int) -> dict[bytes, tuple]:
    """`rounds` batches, each updating every key; returns key -> (latest offset, latest value)."""
    latest = {}
    for r in range(rounds):
        records = [(b"k%d" % k, b"v%d-%d" % (k, r)) for k in range(keys)]
        result = await m.append(topic, 0, [_batch(records, ts)])
        for k in range(keys):
            latest[b"k%d" % k] = (result.base_offset + k, b"v%d-%d" % (k, r))
    return latest


async def test_latest_record_per_key_with_offsets_preserved_and_head_untouched(manager: StoreManager) -> None:
    m = manager
    await m.create_topic("c", 1, TopicConfig(COMPACT))
    latest = await _write_rounds(m, "c", 5, 10, _now() - HOUR)
    head_before = bytes((await m.read("c", 0, 40, 1 << 20)).batches[0].data)
    report = await _service(m).run_once()
    # rounds 0..2 go; round 3 is the latest of each key in the cleanable range (Kafka maps only that range,
    # never the active head, round 4), so it stays beside the head
    assert report.cleaned[("c", 0)].records_removed == 30
    got = await _records(m, "c")
    assert [o for o, _, _ in got] == list(range(30, 50))
    assert bytes((await m.read("c", 0, 40, 1 << 20)).batches[0].data) == head_before
    assert {k: (o, v) for o, k, v in got} == latest
    assert m.log_start_offset("c", 0) == 0 and m.end_offset("c", 0) == 50
    # a consumer positioned in a removed range moves to the next existing offset
    assert (await m.read("c", 0, 13, 1 << 20)).batches[0].base_offset == 30


async def test_keys_updated_unevenly_keep_their_own_latest(manager: StoreManager) -> None:
    m = manager
    await m.create_topic("u", 1, TopicConfig(COMPACT))
    ts = _now() - HOUR
    await m.append("u", 0, [_batch([(b"a", b"a0"), (b"b", b"b0"), (b"c", b"c0")], ts)])  # 0..2
    await m.append("u", 0, [_batch([(b"a", b"a1")], ts)])  # 3
    await m.append("u", 0, [_batch([(b"c", b"c1"), (b"d", b"d0")], ts)])  # 4..5
    await m.append("u", 0, [_batch([(b"e", b"e0")], ts)])  # 6: head
    await _service(m).run_once()
    got = await _records(m, "u")
    assert got == [(1, b"b", b"b0"), (3, b"a", b"a1"), (4, b"c", b"c1"), (5, b"d", b"d0"), (6, b"e", b"e0")]
    # the partly kept first batch keeps its offset span and base offset; its max timestamp is the kept record's
    first = (await m.read("u", 0, 0, 1)).batches[0]
    header = header_of(first.data)
    assert (header[0], header[6], header[12]) == (0, 2, 1)


async def test_tombstones_go_only_after_delete_retention(manager: StoreManager) -> None:
    m = manager
    await m.create_topic("t", 1, TopicConfig({**COMPACT, "delete.retention.ms": str(24 * HOUR)}))
    old = _now() - 2 * HOUR
    await m.append("t", 0, [_batch([(b"x", b"1"), (b"y", b"1")], old)])
    await m.append("t", 0, [_batch([(b"x", None)], old)])  # tombstone for x
    await m.append("t", 0, [_batch([(b"z", b"head")], _now())])
    await _service(m).run_once()
    assert await _records(m, "t") == [(1, b"y", b"1"), (2, b"x", None), (3, b"z", b"head")]
    # past delete.retention.ms the tombstone itself goes: x is gone for good
    await m.alter_topic_config("t", TopicConfig({**COMPACT, "delete.retention.ms": str(HOUR)}))
    await m.append("t", 0, [_batch([(b"w", b"dirty")], _now())])  # make the log dirty again
    await _service(m).run_once()
    assert await _records(m, "t") == [(1, b"y", b"1"), (3, b"z", b"head"), (4, b"w", b"dirty")]


async def test_dirty_ratio_and_min_lag_hold_the_cleaner_back(manager: StoreManager) -> None:
    m = manager
    await m.create_topic("r", 1, TopicConfig({**COMPACT, "min.compaction.lag.ms": str(HOUR)}))
    await _write_rounds(m, "r", 4, 5, _now())  # all younger than the lag
    report = await _service(m).run_once()
    assert ("r", 0) not in report.cleaned and "head" in report.skipped[("r", 0)]
    await m.alter_topic_config("r", TopicConfig({**COMPACT, "min.compaction.lag.ms": "0"}))
    assert ("r", 0) in (await _service(m).run_once()).cleaned
    # clean now; a little new dirt stays below a high ratio
    await m.alter_topic_config("r", TopicConfig({**COMPACT, "min.cleanable.dirty.ratio": "0.9"}))
    await _write_rounds(m, "r", 1, 5, _now())
    report = await _service(m).run_once()
    assert "dirty ratio" in report.skipped[("r", 0)]
    # ... unless the dirt is older than max.compaction.lag.ms
    await m.alter_topic_config(
        "r", TopicConfig({**COMPACT, "min.cleanable.dirty.ratio": "0.9", "max.compaction.lag.ms": "0"})
    )
    await m.append("r", 0, [_batch([(b"head", b"h")], _now())])  # the dirty round leaves the active head
    assert ("r", 0) in (await _service(m).run_once(now=_now() + 1000)).cleaned


async def test_a_small_offset_map_cleans_in_several_passes(manager: StoreManager) -> None:
    m = manager
    await m.create_topic("s", 1, TopicConfig(COMPACT))
    latest = {}
    for r in range(6):  # keys a and b in every round, two new keys per round; round 5 is the head
        records = [(b"a", b"a%d" % r), (b"b", b"b%d" % r), (b"n%d-1" % r, b"x"), (b"n%d-2" % r, b"y")]
        result = await m.append("s", 0, [_batch(records, _now() - HOUR)])
        latest.update({k: (result.base_offset + i, v) for i, (k, v) in enumerate(records)})
    service = _service(m, log_cleaner_dedupe_buffer_size=9 * 120)  # room for 9 keys: two batches per pass
    assert OffsetMap(9 * 120).capacity == 9
    cleaned_passes = 0
    for _ in range(10):
        if ("s", 0) not in (await service.run_once()).cleaned:
            break
        cleaned_passes += 1
    assert cleaned_passes == 3  # rounds 0-1, 2-3, 4
    got = await _records(m, "s")
    assert {k: (o, v) for o, k, v in got} == latest
    keys = [k for _, k, _ in got]
    assert keys.count(b"a") == keys.count(b"b") == 2  # round 4 (cleanable) and round 5 (head)
    assert len(got) == 12 + 4


async def test_idempotent_producer_keeps_its_last_batch_emptied(manager: StoreManager) -> None:
    m = manager
    await m.create_topic("p", 1, TopicConfig(COMPACT))
    ts = _now() - HOUR
    await m.append("p", 0, [_batch([(b"a", b"1"), (b"b", b"1")], ts, (42, 0, 0))])  # 0..1, seq 0..1
    await m.append("p", 0, [_batch([(b"a", b"2")], ts, (42, 0, 2))])  # 2, seq 2
    await m.append("p", 0, [_batch([(b"a", b"3"), (b"b", b"3")], ts)])  # 3..4 (no producer id)
    await m.append("p", 0, [_batch([(b"c", b"head")], ts)])  # 5: head
    await _service(m).run_once()
    batches = (await m.read("p", 0, 0, 1 << 20)).batches
    headers = [header_of(b.data) for b in batches]
    # producer 42's batches are both emptied; the first is dropped, its last stays empty with its sequence
    assert [(h[0], h[6], h[9], h[11], h[12]) for h in headers] == [
        (2, 0, 42, 2, 0),
        (3, 1, -1, -1, 2),
        (5, 0, -1, -1, 1),
    ]
    assert [(o, v) for o, _, v in await _records(m, "p")] == [(3, b"3"), (4, b"3"), (5, b"head")]


@pytest.mark.parametrize("engine", ["rocksdb", "file"])
async def test_compacted_log_survives_restart(engine: str, tmp_path: Path) -> None:
    config = store_config(engine, tmp_path / "data")
    m = StoreManager(config)
    await m.start()
    await m.create_topic("d", 1, TopicConfig(COMPACT))
    latest = await _write_rounds(m, "d", 3, 6, _now() - HOUR)
    await _service(m).run_once()
    before = await _records(m, "d")
    await m.close()
    m = StoreManager(config)
    await m.start()
    try:
        assert await _records(m, "d") == before
        assert {k: (o, v) for o, k, v in before} == latest
        # the checkpoint survived too: nothing is dirty, so nothing is cleaned again
        assert ("d", 0) not in (await _service(m).run_once()).cleaned
        result = await m.append("d", 0, [_batch([(b"k0", b"after")], _now())])
        assert result.base_offset == 18
    finally:
        await m.close()


async def test_file_compaction_lets_reclaim_free_the_commitlog(tmp_path: Path) -> None:
    """The cleaned prefix lives in the compaction log, so the CommitLog segments below it go at the next reclaim;
    reads, time lookups and a restart work from the compaction log and the remaining segments."""
    from mqk.services.retention import RetentionService

    config = store_config("file", tmp_path / "data", commitlog_segment_bytes=16 * 1024)
    m = StoreManager(config)
    await m.start()
    try:
        await m.create_topic("big", 1, TopicConfig({**COMPACT, "segment.bytes": "20000"}))
        old_ts = _now() - HOUR
        latest = {}
        for r in range(40):
            records = [(b"k%d" % k, b"%d-%d-" % (k, r) + b"x" * 300) for k in range(20)]
            result = await m.append("big", 0, [_batch(records, old_ts + r)])
            latest.update({k: (result.base_offset + i, v) for i, (k, v) in enumerate(records)})
        engine = m.engines["file"]
        await engine.checkpoint_now()
        segments = len(engine.clog.mfq.files)
        assert segments >= 8
        await _service(m).run_once()
        retention = RetentionService(BrokerConfig(store=m.config), m)
        report = await retention.run_once()
        assert report.freed["file"] > 0
        assert len(engine.clog.mfq.files) < segments / 2
        got = await _records(m, "big")
        assert {k: (o, v) for o, k, v in got} == latest
        hit = await m.offset_for_timestamp("big", 0, old_ts)
        assert hit is not None and hit[0] == got[0][0]
        assert (await m.read_by_tags("big", 0, 0, [0], 5)).batches[0].base_offset == got[0][0]
    finally:
        await m.close()
    m = StoreManager(config)
    await m.start()
    try:
        assert {k: (o, v) for o, k, v in await _records(m, "big")} == latest
        result = await m.append("big", 0, [_batch([(b"k0", b"new")], _now())])
        assert result.base_offset == 800
    finally:
        await m.close()


class _Transactions:
    """The transaction view the cleaner asks (mqk.services.compaction.TransactionView), set by the test; with a
    StoreManager, each `forget_aborted` also notes the offsets of the records the log held when it was called."""

    def __init__(self, store: StoreManager | None = None) -> None:
        self.store = store
        self.stable: int | None = None
        self.aborted: list[tuple[int, int, int]] = []
        #: (markers, offsets of the partition's records at that moment) of each forget_aborted call
        self.forgotten: list[tuple[list[int], set[int]]] = []

    def last_stable(self, topic: str, partition: int, high_watermark: int) -> int:
        return high_watermark if self.stable is None else self.stable

    def aborted_ranges(self, topic: str, partition: int) -> list[tuple[int, int, int]]:
        return list(self.aborted)

    async def forget_aborted(self, topic: str, partition: int, markers: Iterable[int]) -> None:
        gone = sorted(markers)
        logged = {o for o, _k, _v in await _records(self.store, topic)} if self.store is not None else set()
        self.forgotten.append((gone, logged))
        self.aborted = [entry for entry in self.aborted if entry[0] not in gone]


async def _marker_topic(m: StoreManager, topic: str) -> Callable[[bytearray], Awaitable[int]]:
    """A compacted topic whose delete.retention.ms is an hour, and an append to it that answers the base offset."""
    await m.create_topic(topic, 1, TopicConfig({**COMPACT, "delete.retention.ms": str(HOUR)}))

    async def put(batch: bytearray) -> int:
        return (await m.append(topic, 0, [batch])).base_offset

    return put


def _txn_batch(records: list[tuple[bytes, bytes]], ts: int, pid: int, seq: int) -> bytearray:
    body = b"".join(rb.encode_record(i, 0, k, v, []) for i, (k, v) in enumerate(records))
    return rb.build_batch(0, ts, ts, body, len(records), len(records) - 1, 0x10, pid, 0, seq)


async def test_aborted_transactions_never_hide_committed_values_and_undecided_ones_wait(manager: StoreManager) -> None:
    from mqk.server.kafka.transactions import control_batch

    m = manager
    await m.create_topic("tx", 1, TopicConfig(COMPACT))
    ts = _now() - HOUR
    await m.append("tx", 0, [_batch([(b"a", b"a-committed"), (b"b", b"b0")], ts)])  # 0, 1
    await m.append("tx", 0, [_txn_batch([(b"a", b"a-aborted")], ts, pid=7, seq=0)])  # 2
    marker = (await m.append("tx", 0, [control_batch(7, 0, commit=False, timestamp=ts)])).base_offset  # 3
    await m.append("tx", 0, [_batch([(b"b", b"b1")], ts)])  # 4: b0 goes
    await m.append("tx", 0, [_txn_batch([(b"b", b"b-undecided")], ts, pid=8, seq=0)])  # 5: open
    await m.append("tx", 0, [_batch([(b"c", b"c0")], ts)])  # 6
    await m.append("tx", 0, [_batch([(b"z", b"head")], ts)])  # 7: the active head
    service = _service(m)
    txns = service.transactions = _Transactions()
    txns.aborted = [(marker, 7, 2)]
    txns.stable = 5
    await service.run_once()
    got = [(o, v) for o, _k, v in await _records(m, "tx")]
    # a's committed value stays (the aborted one is neither mapped nor kept), b0 went, the ABORT marker stays
    # (its control record), and nothing from the undecided transaction on was touched
    assert (0, b"a-committed") in got
    assert all(v != b"a-aborted" for _o, v in got)
    assert (1, b"b0") not in got
    assert any(o == marker for o, _v in got)
    # b's undecided value (past the LSO) is not mapped, so the committed b1 before it stays
    assert (4, b"b1") in got
    assert [o for o, _v in got if o >= 5] == [5, 6, 7]


async def test_a_transaction_marker_goes_once_its_records_are_gone_and_it_is_past_delete_retention(
    manager: StoreManager,
) -> None:
    from mqk.server.kafka.transactions import control_batch

    m = manager
    put = await _marker_topic(m, "mk")
    old, now = _now() - 3 * HOUR, _now()
    await put(_txn_batch([(b"a", b"a-txn")], old, pid=7, seq=0))  # superseded below: its marker may go
    commit_7 = await put(control_batch(7, 0, commit=True, timestamp=old))
    await put(_txn_batch([(b"b", b"b-txn")], old, pid=8, seq=0))  # still b's latest value
    commit_8 = await put(control_batch(8, 0, commit=True, timestamp=old))
    await put(_txn_batch([(b"c", b"c-aborted")], old, pid=7, seq=1))
    abort_7 = await put(control_batch(7, 0, commit=False, timestamp=old))  # its transaction goes first
    await put(_txn_batch([(b"c", b"c-txn")], old, pid=7, seq=2))
    await put(control_batch(7, 0, commit=True, timestamp=old))  # producer 7's last batch
    await put(_txn_batch([(b"d", b"d-txn")], now, pid=9, seq=0))  # superseded below, but its marker is young
    commit_9 = await put(control_batch(9, 0, commit=True, timestamp=now))
    await put(_txn_batch([(b"e", b"e-txn")], now, pid=9, seq=1))
    await put(control_batch(9, 0, commit=True, timestamp=now))
    await put(_batch([(b"a", b"a1"), (b"d", b"d1")], old))
    await put(_batch([(b"z", b"head")], now))  # the active head
    service = _service(m)
    txns = service.transactions = _Transactions()
    txns.aborted = [(abort_7, 7, abort_7 - 1)]
    await service.run_once()
    offsets = {o for o, _k, _v in await _records(m, "mk")}
    assert commit_7 not in offsets  # nothing of its transaction left, and older than delete.retention.ms
    assert commit_8 in offsets  # b-txn is still there
    assert abort_7 in offsets  # c-aborted was there when the pass began: the marker waits for a later pass
    assert commit_9 in offsets  # younger than delete.retention.ms
    values = [v for _o, _k, v in await _records(m, "mk")]
    assert b"b-txn" in values and b"a-txn" not in values and b"c-aborted" not in values


async def test_an_abort_marker_goes_a_pass_after_its_transaction_and_its_index_entry_before_it(
    manager: StoreManager,
) -> None:
    """The ABORT counterpart of the test above. The pass that removes an aborted transaction's records keeps its
    marker and its index entry; the next one, finding none of its batches, forgets the entry (before its rewrite,
    while the marker is still in the log), then drops the marker if it is old and not its producer's last batch."""
    from mqk.server.kafka.transactions import control_batch

    m = manager
    put = await _marker_topic(m, "ab")
    old, now = _now() - 3 * HOUR, _now()
    first_7 = await put(_txn_batch([(b"a", b"a-aborted")], old, pid=7, seq=0))
    abort_7 = await put(control_batch(7, 0, commit=False, timestamp=old))  # old, not 7's last batch: it goes
    await put(_txn_batch([(b"b", b"b-txn")], old, pid=7, seq=1))  # producer 7's later, committed transaction
    await put(control_batch(7, 0, commit=True, timestamp=old))
    await put(_txn_batch([(b"c", b"c-txn")], old, pid=7, seq=2))
    last_7 = await put(control_batch(7, 0, commit=True, timestamp=old))  # producer 7's last batch
    first_8 = await put(_txn_batch([(b"d", b"d-aborted")], old, pid=8, seq=0))
    abort_8 = await put(control_batch(8, 0, commit=False, timestamp=old))  # producer 8's last batch: it stays
    first_9 = await put(_txn_batch([(b"e", b"e-aborted")], now, pid=9, seq=0))
    abort_9 = await put(control_batch(9, 0, commit=False, timestamp=now))  # younger than delete.retention.ms
    await put(_txn_batch([(b"f", b"f-txn")], now, pid=9, seq=1))
    await put(control_batch(9, 0, commit=True, timestamp=now))
    await put(_batch([(b"z", b"head")], now))  # the active head
    service = _service(m)
    txns = service.transactions = _Transactions(m)
    txns.aborted = [(abort_7, 7, first_7), (abort_8, 8, first_8), (abort_9, 9, first_9)]

    # 1. the aborted records go; the markers and the index entries stay (a reader told of a transaction whose
    # records were still there when it read meets the marker after them)
    await service.run_once()
    offsets = {o for o, _k, _v in await _records(m, "ab")}
    assert not offsets & {first_7, first_8, first_9}
    assert {abort_7, abort_8, abort_9} <= offsets
    assert txns.forgotten == [] and len(txns.aborted) == 3

    # 2. nothing of the three transactions is left: their index entries are forgotten, in one call made while
    # every marker was still in the log; then the old marker goes, the young one and producer 8's last batch stay
    await put(_batch([(b"y", b"head")], now))  # (the old head is now cleanable, and dirty)
    await service.run_once()
    assert [markers for markers, _logged in txns.forgotten] == [[abort_7, abort_8, abort_9]]
    assert {abort_7, abort_8, abort_9} <= txns.forgotten[0][1]
    assert txns.aborted == []
    got = await _records(m, "ab")
    offsets = {o for o, _k, _v in got}
    assert abort_7 not in offsets
    assert abort_8 in offsets and abort_9 in offsets
    assert last_7 in offsets
    values = {v for _o, _k, v in got}
    assert {b"b-txn", b"c-txn", b"f-txn"} <= values
    assert not values & {b"a-aborted", b"d-aborted", b"e-aborted"}

    # 3. a later pass has no index entry left to forget
    await put(_batch([(b"x", b"head")], now))
    await service.run_once()
    assert len(txns.forgotten) == 1


async def test_a_rewrite_that_fails_after_the_index_entry_is_forgotten_leaves_the_marker(
    manager: StoreManager,
) -> None:
    """The crash order: the index entry is forgotten before the rewrite that drops the marker, so a rewrite that
    never happens (a crash, here a failing engine) leaves a marker the index no longer names, never an index
    entry whose marker is gone; the next pass drops the marker."""
    from mqk.server.kafka.transactions import control_batch

    m = manager
    put = await _marker_topic(m, "cr")
    old, now = _now() - 3 * HOUR, _now()
    first = await put(_txn_batch([(b"a", b"a-aborted")], old, pid=7, seq=0))
    marker = await put(control_batch(7, 0, commit=False, timestamp=old))
    await put(_txn_batch([(b"b", b"b-txn")], old, pid=7, seq=1))
    await put(control_batch(7, 0, commit=True, timestamp=old))
    await put(_batch([(b"z", b"head")], now))
    service = _service(m)
    txns = service.transactions = _Transactions(m)
    txns.aborted = [(marker, 7, first)]
    await service.run_once()  # the aborted record goes
    assert txns.aborted == [(marker, 7, first)]

    engine = m.engine_of("cr")

    async def crash(*_args: object) -> None:
        raise RuntimeError("the broker stops here")

    engine.replace_range = crash  # type: ignore[method-assign]  # the crash point
    await put(_batch([(b"y", b"head")], now))
    with pytest.raises(RuntimeError):
        await service.run_once()
    assert txns.aborted == []  # forgotten first
    assert marker in {o for o, _k, _v in await _records(m, "cr")}  # and the marker still there

    del engine.replace_range  # (the engine's own again)
    await service.run_once()
    got = await _records(m, "cr")
    assert marker not in {o for o, _k, _v in got}
    assert b"b-txn" in {v for _o, _k, v in got}
