"""FileEngine through the StorageAdapter API: appends and reads across CommitLog segments and ConsumeQueue files,
restart, delete-before, timestamp lookups, tag filtering, LogAppendTime, group commit, stats, topic re-creation."""

from __future__ import annotations

import asyncio
import dataclasses
import struct
import threading
from pathlib import Path

import pytest
from helpers import cached_pages, wait_until_async

from mqk._fast import compiled, load, twin
from mqk.clock import settle
from mqk.config import StoreConfig, TopicConfig
from mqk.errors import InvalidRecord, MessageTooLarge, OffsetOutOfRange, StorageError, UnknownShard
from mqk.store.adapter import GroupOffset
from mqk.store.file.checkpoint import Checkpoint
from mqk.store.file.engine import FileEngine
from mqk.store.file.mapped_file import MappedFileQueue
from mqk.store.file.reader import TIMESTAMP_FAULT_IN_UNITS

rb = load("recbatch")
T = "orders"
#: append_many's run kernel, each build (the twin alone when the compiled one is not built)
CLENTRY_IMPLS = [m for m in (compiled("clentry"), twin("clentry")) if m is not None]


def batch(n: int = 3, ts: int = 1000, value: bytes = b"v" * 200, ts_step: int = 1) -> bytearray:
    recs = b"".join(rb.encode_record(i, i * ts_step, None, value + bytes([i]), []) for i in range(n))
    return rb.build_batch(0, ts, ts + (n - 1) * ts_step, recs, n, n - 1)


def config(root: Path, **changes) -> StoreConfig:
    base = StoreConfig(
        data_dir=root,
        commitlog_segment_bytes=64 * 1024,
        cq_units_per_file=8,
        flush_interval_ms=20,
        checkpoint_interval_ms=50,
    )
    return dataclasses.replace(base, **changes)


async def open_engine(root: Path, **changes) -> FileEngine:
    engine = FileEngine(config(root, **changes), root)
    await engine.start()
    return engine


@pytest.fixture
async def engine(tmp_path: Path):
    e = await open_engine(tmp_path)
    await e.create_shards(T, 2, TopicConfig())
    yield e
    await e.close()


def records_of(data) -> list[bytes]:
    header = rb.parse_header(data)
    return [r[4] for r in rb.decode_records(bytes(data[rb.HEADER_SIZE :]), header[12])]


async def test_append_and_read_across_segments_and_cq_files(engine: FileEngine) -> None:
    originals = []
    for i in range(400):  # ~110 KB per queue → several 64 KiB segments and 8-unit CQ files
        b = batch(3, ts=1000 + i, value=bytes([i % 256]) * 250)
        originals.append(b)
        result = await engine.append(T, i % 2, [b])
        assert result.base_offset == (i // 2) * 3 and result.last_offset == result.base_offset + 2
    assert len(engine.clog.mfq.files) >= 3
    assert engine.end_offset(T, 0) == 600 and engine.end_offset(T, 1) == 600
    got = []
    offset = 0
    while offset < 600:
        result = await engine.read(T, 0, offset, 5000)
        assert result.batches and result.end_offset == 600 and result.log_start_offset == 0
        for b in result.batches:
            assert isinstance(b.data, memoryview)  # zero-copy view into the mapping
            rb.scan_batches(b.data, True)  # CRC intact
            assert rb.parse_header(b.data)[0] == b.base_offset
            got.append(bytes(b.data[12:]))
        offset = result.next_offset
    assert got == [bytes(o[12:]) for o in originals[0::2]]


async def test_read_semantics(engine: FileEngine) -> None:
    for i in range(5):
        await engine.append(T, 0, [batch(4, ts=1000 + i)])
    # an offset inside a batch returns that whole batch
    result = await engine.read(T, 0, 6, 1)
    assert [b.base_offset for b in result.batches] == [4]  # first batch even though bigger than max_bytes
    assert result.batches[0].record_count == 4 and result.next_offset == 8
    result = await engine.read(T, 0, 0, 10**9)
    assert [b.base_offset for b in result.batches] == [0, 4, 8, 12, 16]
    assert (await engine.read(T, 0, 20, 100)).batches == []
    with pytest.raises(OffsetOutOfRange):
        await engine.read(T, 0, 21, 100)
    with pytest.raises(OffsetOutOfRange):
        await engine.read(T, 0, -1, 100)
    with pytest.raises(UnknownShard):
        await engine.read(T, 7, 0, 100)
    with pytest.raises(UnknownShard):
        await engine.append("nope", 0, [batch()])


async def test_restart_keeps_data_offsets_and_metadata(tmp_path: Path) -> None:
    e = await open_engine(tmp_path)
    await e.create_shards(T, 3, TopicConfig())
    for i in range(300):
        await e.append(T, i % 3, [batch(2, ts=1000 + i)])
    await e.delete_before(T, 1, 50)
    await e.commit_offsets("g1", {(T, 0): GroupOffset(42, "meta")})
    await e.close()
    assert not (tmp_path / "abort").exists()
    e = await open_engine(tmp_path)
    try:
        assert not e.recovery_report["abnormal"]
        assert e.list_shards() == {T: 3}
        assert [e.end_offset(T, q) for q in range(3)] == [200, 200, 200]
        assert e.log_start_offset(T, 1) == 50
        with pytest.raises(OffsetOutOfRange):
            await e.read(T, 1, 49, 100)
        assert (await e.read(T, 1, 50, 1)).batches[0].base_offset == 50
        assert e.fetch_offsets("g1")[(T, 0)].offset == 42
        result = await e.append(T, 2, [batch(2)])
        assert result.base_offset == 200
    finally:
        await e.close()


async def test_delete_before(engine: FileEngine) -> None:
    for _ in range(4):
        await engine.append(T, 0, [batch(5)])
    assert await engine.delete_before(T, 0, 7) == 7
    assert engine.log_start_offset(T, 0) == 7
    assert await engine.delete_before(T, 0, 3) == 7  # never moves back
    result = await engine.read(T, 0, 7, 1)
    assert result.batches[0].base_offset == 5 and result.log_start_offset == 7  # the batch holding 7
    with pytest.raises(OffsetOutOfRange):
        await engine.delete_before(T, 0, 21)
    assert await engine.delete_before(T, 0, 20) == 20
    assert (await engine.read(T, 0, 20, 100)).batches == []


async def test_offset_for_timestamp_and_max_timestamp(engine: FileEngine) -> None:
    # batch i has records at 1000 + 100*i + {0, 10, 20}; batch 3 is out of order (older timestamps)
    stamps = [1000, 1100, 1200, 900, 1400]
    for ts in stamps:
        await engine.append(T, 0, [batch(3, ts=ts, ts_step=10)])
    assert await engine.offset_for_timestamp(T, 0, 0) == (0, 1000)
    assert await engine.offset_for_timestamp(T, 0, 1005) == (1, 1010)
    assert await engine.offset_for_timestamp(T, 0, 1150) == (6, 1200)
    assert await engine.offset_for_timestamp(T, 0, 1201) == (7, 1210)
    assert await engine.offset_for_timestamp(T, 0, 1221) == (12, 1400)
    assert await engine.offset_for_timestamp(T, 0, 1421) is None
    assert await engine.max_timestamp(T, 0) == (14, 1420)
    await engine.delete_before(T, 0, 8)
    assert await engine.offset_for_timestamp(T, 0, 0) == (8, 1220)
    assert await engine.max_timestamp(T, 1) is None
    assert await engine.offset_for_timestamp(T, 1, 0) is None


async def test_timestamp_lookup_scans_on_past_the_units_it_read_first(engine: FileEngine) -> None:
    """The lookup reads the first units of its search to check their pages (the read-back), then scans from
    them on: here the record is 12 batches past the search's start (older batches keep the running maximum up),
    beyond the units read first."""
    await engine.append(T, 0, [batch(1, ts=5_000)])
    for i in range(12):
        await engine.append(T, 0, [batch(1, ts=1_000 + i)])
    await engine.append(T, 0, [batch(1, ts=6_000)])
    await engine.delete_before(T, 0, 1)  # the search starts at offset 1: every unit from there has max 5,000
    assert engine.flusher is not None and TIMESTAMP_FAULT_IN_UNITS < 12
    assert await engine.offset_for_timestamp(T, 0, 4_000) == (13, 6_000)
    assert await engine.offset_for_timestamp(T, 0, 1_005) == (6, 1_005)
    assert await engine.offset_for_timestamp(T, 0, 6_001) is None


async def test_timestamp_lookup_across_many_cq_files(engine: FileEngine) -> None:
    for i in range(100):  # 8 units per CQ file: 13 files
        await engine.append(T, 1, [batch(2, ts=10_000 + 50 * i, ts_step=5)])
    for i in range(0, 100, 7):
        assert await engine.offset_for_timestamp(T, 1, 10_000 + 50 * i + 3) == (2 * i + 1, 10_000 + 50 * i + 5)


async def test_read_by_tags_uses_only_the_consumequeue(engine: FileEngine, monkeypatch) -> None:
    for i in range(30):
        await engine.append(T, 0, [batch(1)], tags_code=i % 3)
    reads = []
    real = engine.clog.body_view
    monkeypatch.setattr(engine.clog, "body_view", lambda *a: reads.append(a) or real(*a))
    result = await engine.read_by_tags(T, 0, 4, [2], 100)
    assert [b.base_offset for b in result.batches] == list(range(5, 30, 3))
    assert all(b.tags_code == 2 for b in result.batches)
    assert len(reads) == len(result.batches)  # non-matching batches were never read from the CommitLog
    assert len((await engine.read_by_tags(T, 0, 0, [0, 1], 4)).batches) == 4


async def test_log_append_time_rewrites_the_stored_copy(engine: FileEngine) -> None:
    original = batch(3, ts=5)
    before = bytes(original)
    result = await engine.append(T, 0, [original], log_append_time=True)
    assert bytes(original) == before  # the caller's buffer is untouched
    stored = (await engine.read(T, 0, 0, 100)).batches[0]
    header = rb.parse_header(stored.data)
    assert header[5] & 0x08 and header[8] == result.log_append_time
    rb.scan_batches(stored.data, True)  # CRC recomputed
    assert stored.max_timestamp == result.log_append_time
    assert await engine.offset_for_timestamp(T, 0, result.log_append_time) == (0, result.log_append_time)


async def test_several_batches_per_append_and_concatenated_buffers(engine: FileEngine) -> None:
    r = await engine.append(T, 0, [batch(2), batch(3)])
    assert (r.base_offset, r.last_offset) == (0, 4)
    r = await engine.append(T, 0, [bytes(batch(1)) + bytes(batch(4))])
    assert (r.base_offset, r.last_offset) == (5, 9)
    result = await engine.read(T, 0, 0, 10**6)
    assert [(b.base_offset, b.record_count) for b in result.batches] == [(0, 2), (2, 3), (5, 1), (6, 4)]


async def test_bad_input_is_a_typed_error_and_writes_nothing(engine: FileEngine) -> None:
    end = engine.clog.max_offset
    for bad in ([b"garbage"], [bytes(batch(2))[:-3]], [batch(1), b"x" * 70], []):
        with pytest.raises(InvalidRecord):
            await engine.append(T, 0, bad)
    with pytest.raises(MessageTooLarge):
        await engine.append(T, 0, [batch(1, value=b"x" * 70_000)])
    assert engine.clog.max_offset == end and engine.end_offset(T, 0) == 0


async def test_sync_flush_group_commit(tmp_path: Path) -> None:
    e = await open_engine(tmp_path, flush_mode="sync")
    try:
        await e.create_shards(T, 1, TopicConfig())
        real_flush = e.clog.flush
        covered = []
        disk = threading.Event()

        def slow_flush():  # a disk slow enough that every writer arrives while the first flush is under way
            assert disk.wait(30), "the test never let the flush finish"
            covered.append(real_flush())
            return covered[-1]

        e.clog.flush = slow_flush
        before = e.flusher.flush_count
        appends = asyncio.gather(*(e.append(T, 0, [batch(1)]) for _ in range(50)))
        try:
            # the first writer's flush is held; every writer, the first too, waits for a flush
            await wait_until_async(lambda: len(e.flusher._waiters) == 50, what="50 writers waiting for a flush")
        finally:
            disk.set()
        results = await appends
        assert sorted(r.base_offset for r in results) == list(range(50))
        assert e.flusher.flushed >= e.clog.max_offset  # acknowledged means flushed
        # the first flush starts with the first write; the 49 writers arriving during it ride the next one
        assert e.flusher.flush_count - before <= 2, "one fsync should serve every writer waiting"
        assert covered[-1] == e.clog.max_offset
    finally:
        await e.close()


async def test_sync_append_many_is_durable_on_return_after_one_flush_wait(tmp_path: Path) -> None:
    e = await open_engine(tmp_path, flush_mode="sync")
    try:
        await e.create_shards(T, 2, TopicConfig())
        before = e.flusher.flush_count
        results = await e.append_many(T, [(i % 2, [batch(2)]) for i in range(20)])
        assert [r.base_offset for r in results] == [2 * (i // 2) for i in range(20)]
        assert e.flusher.flushed >= e.clog.max_offset  # every entry on disk when the call returns
        assert e.flusher.flush_count - before <= 2  # one wait for all twenty (a flush may have been under way)
    finally:
        await e.close()


async def test_checkpoint_defers_quiet_queues_and_recovery_replays_them(tmp_path: Path) -> None:
    # one unit in a quiet queue, many in a busy one: the checkpoint flushes only the busy queue and keeps its safe
    # offset at the quiet queue's unflushed unit, so a crash that loses that unit gets it back from the CommitLog
    # even though the entry is far behind the last three segments recovery re-verifies anyway
    e = await open_engine(
        tmp_path, cq_units_per_file=4096, checkpoint_interval_ms=3_600_000, cq_flush_max_delay_ms=3_600_000
    )
    await e.create_shards(T, 2, TopicConfig())
    quiet = await e.append(T, 0, [batch(2, value=b"q" * 100)])
    for _ in range(400):  # ~110 KB: several 64 KiB segments, 400 units (over two 4 KiB pages of units)
        await e.append(T, 1, [batch(1, value=b"b" * 250)])
    await e.checkpoint_now()
    quiet_cq, busy_cq = e.registry.get(T, 0).cq, e.registry.get(T, 1).cq
    assert busy_cq.mfq.dirty_bytes() == 0
    assert quiet_cq.mfq.dirty_bytes() > 0
    assert e.checkpoint.safe_offset == quiet.physical_offset
    held = Checkpoint.encode(e.checkpoint.safe_offset, e.checkpoint.flushed_offset, e.checkpoint.timestamp)
    await e.close()
    # the crash: the quiet queue's unit never reached the disk, the checkpoint on disk is the one taken above
    for path in (tmp_path / "consumequeue" / T / "0").iterdir():
        path.write_bytes(bytes(path.stat().st_size))
    (tmp_path / "checkpoint").write_bytes(held)
    (tmp_path / "abort").touch()
    e = await open_engine(tmp_path, cq_units_per_file=4096)
    try:
        assert e.recovery_report["abnormal"] and e.recovery_report["scan_start"] == quiet.physical_offset
        assert e.end_offset(T, 0) == 2 and e.end_offset(T, 1) == 400
        assert records_of((await e.read(T, 0, 0, 1 << 20)).batches[0].data) == [b"q" * 100 + b"\0", b"q" * 100 + b"\1"]
    finally:
        await e.close()


async def test_a_failed_checkpoint_flush_leaves_its_queues_dirty(tmp_path: Path, monkeypatch) -> None:
    e = await open_engine(tmp_path, checkpoint_interval_ms=3_600_000, cq_flush_max_delay_ms=0)
    try:
        await e.create_shards(T, 1, TopicConfig())
        first = await e.append(T, 0, [batch(1)])
        cq = e.registry.get(T, 0).cq
        safe_before = e.checkpoint.safe_offset

        def broken_flush(self) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(type(cq), "flush", broken_flush)
        with pytest.raises(OSError):
            await e.checkpoint_now()
        assert e.checkpoint.safe_offset == safe_before  # nothing claimed
        assert cq in e.appender.dirty and cq.dirty_since_phys == first.physical_offset
        monkeypatch.undo()
        await e.checkpoint_now()
        assert cq.mfq.dirty_bytes() == 0 and e.checkpoint.safe_offset == e.clog.max_offset
    finally:
        await e.close()


async def test_checkpoint_flushes_a_quiet_queue_once_its_unit_is_old_enough(tmp_path: Path) -> None:
    e = await open_engine(tmp_path, checkpoint_interval_ms=3_600_000, cq_flush_max_delay_ms=0)
    try:
        await e.create_shards(T, 1, TopicConfig())
        await e.append(T, 0, [batch(1)])
        await e.checkpoint_now()
        assert e.registry.get(T, 0).cq.mfq.dirty_bytes() == 0
        assert e.checkpoint.safe_offset == e.clog.max_offset
    finally:
        await e.close()


async def test_async_flush_happens_in_background(tmp_path: Path) -> None:
    e = await open_engine(
        tmp_path, flush_mode="async", flush_interval_ms=10, flush_min_pages=1, cq_flush_max_delay_ms=0
    )
    try:
        await e.create_shards(T, 1, TopicConfig())
        await e.append(T, 0, [batch(40)])
        # nobody asks for a flush: the interval's flush, in its thread, is what wakes this waiter
        await asyncio.wait_for(e.flusher.wait_flushed(e.clog.max_offset), 10)
        assert e.flusher.flushed >= e.clog.max_offset
        # the checkpoint follows: its safe offset reaches the end
        await wait_until_async(lambda: e.checkpoint.safe_offset >= e.clog.max_offset, what="the checkpoint")
        assert e.checkpoint.safe_offset == e.clog.max_offset
    finally:
        await e.close()


async def test_listeners_and_stats(engine: FileEngine) -> None:
    seen = []
    engine.listeners.append(lambda topic, ends: seen.extend((topic, queue, end) for queue, end in ends))
    await engine.append(T, 1, [batch(3)])
    await engine.append(T, 1, [batch(2), batch(2)])
    assert seen == [(T, 1, 3), (T, 1, 7)]
    stats = engine.stats.as_dict()
    assert stats["puts"] == 2 and stats["put_batches"] == 3
    assert stats["put_bytes"] == engine.clog.max_offset
    assert sum(stats["latency_us"].values()) == 2 and stats["dispatch_lag"] == 0


async def test_append_many_tells_each_listener_once_about_every_written_entry(engine: FileEngine) -> None:
    calls = []
    engine.listeners.append(lambda topic, ends: calls.append((topic, list(ends))))
    results = await engine.append_many(T, [(0, [batch(2)]), (1, [b"not a batch"]), (1, [batch(3)]), (0, [batch(1)])])
    assert isinstance(results[1], InvalidRecord)
    # one call for the whole append_many; the refused entry is not in it; readers already see every end offset
    assert calls == [(T, [(0, 2), (1, 3), (0, 3)])]
    assert engine.end_offset(T, 0) == 3 and engine.end_offset(T, 1) == 3
    await engine.append_many(T, [(0, [b"bad"])])  # nothing written: nothing to tell
    assert len(calls) == 1


async def test_dispatch_hook_sees_each_entry_live_and_at_recovery(tmp_path: Path) -> None:
    e = await open_engine(tmp_path)
    calls = []
    e.dispatcher.hooks.append(lambda *args: calls.append((args[0], args[1], args[2], args[7])))
    await e.create_shards(T, 1, TopicConfig())
    await e.append(T, 0, [batch(2)], keys=[b"k1"])
    assert calls == [(T, 0, 0, [b"k1"])]
    await e.close()
    e = FileEngine(config(tmp_path), tmp_path)
    e.dispatcher.hooks.append(lambda *args: calls.append((args[0], args[1], args[2], args[7])))
    await e.start()
    await e.close()
    assert calls[-1] == (T, 0, 0, None)  # replayed at recovery; keys come from the body then


async def test_deleted_then_recreated_topic_starts_empty(tmp_path: Path) -> None:
    e = await open_engine(tmp_path)
    await e.create_shards(T, 1, TopicConfig())
    for _ in range(5):
        await e.append(T, 0, [batch(2)])
    await e.delete_shards(T)
    assert e.list_shards() == {}
    with pytest.raises(UnknownShard):
        await e.delete_shards(T)
    await e.create_shards(T, 1, TopicConfig())
    assert e.end_offset(T, 0) == 0
    await e.append(T, 0, [batch(1)])
    await e.close()
    e = await open_engine(tmp_path)  # recovery replays the log: the old incarnation's entries stay out
    try:
        assert e.end_offset(T, 0) == 1
        assert [b.record_count for b in (await e.read(T, 0, 0, 10**6)).batches] == [1]
    finally:
        await e.close()


async def test_add_queues_and_bad_topic_names(engine: FileEngine) -> None:
    await engine.create_shards(T, 4, TopicConfig())
    assert engine.list_shards() == {T: 4}
    await engine.append(T, 3, [batch(1)])
    for bad in ("", "a/b", ".."):
        with pytest.raises(StorageError):
            await engine.create_shards(bad, 1, TopicConfig())


async def test_closed_engine_refuses_appends(tmp_path: Path) -> None:
    e = await open_engine(tmp_path)
    await e.create_shards(T, 1, TopicConfig())
    await e.close()
    with pytest.raises(StorageError):
        await e.append(T, 0, [batch(1)])


async def test_stored_max_timestamp_is_the_batch_own(engine: FileEngine) -> None:
    await engine.append(T, 0, [batch(2, ts=5000)])
    await engine.append(T, 0, [batch(2, ts=100)])
    batches = (await engine.read(T, 0, 0, 10**6)).batches
    assert [b.max_timestamp for b in batches] == [5001, 101]
    assert struct.unpack_from(">q", batches[1].data, 35)[0] == 101


async def test_sync_flush_failure_fails_the_waiting_appends_not_the_store(tmp_path: Path, monkeypatch) -> None:
    e = await open_engine(tmp_path, flush_mode="sync")
    try:
        await e.create_shards(T, 1, TopicConfig())
        real = e.clog.flush

        def broken() -> int:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(e.clog, "flush", broken)
        with pytest.raises(StorageError, match="flush failed"):
            await e.append(T, 0, [batch(1)])
        monkeypatch.setattr(e.clog, "flush", real)
        result = await e.append(T, 0, [batch(1)])  # the disk is back: appends are acknowledged again
        assert result.base_offset == 1 and e.flusher.flushed >= e.clog.max_offset
    finally:
        await e.close()


class RunProxy:
    """An engine's AppendRun, observed: the batches each publish made visible; `write_to`, a descriptor every write
    goes to instead of the segment's."""

    def __init__(self, real) -> None:
        self.real = real
        self.published: list[int] = []
        self.write_to: int | None = None

    def write(self, fd: int) -> None:
        self.real.write(fd if self.write_to is None else self.write_to)

    def plan(self, *args) -> int:
        if self.write_to is not None and len(args) == 12 and args[11] >= 0:  # (plan writes too)
            args = (*args[:11], self.write_to)
        return self.real.plan(*args)

    def publish(self, *args) -> int:
        n = self.real.publish(*args)
        self.published.append(n)
        return n

    def __getattr__(self, name: str):
        return getattr(self.real, name)


def observe_runs(e: FileEngine, kernels=None) -> RunProxy:
    """Put a RunProxy (over `kernels`' AppendRun, or the engine's own) in the engine's append pipeline."""
    real = e.appender.run if kernels is None else kernels.AppendRun(4096)
    proxy = e.appender.run = RunProxy(real)
    return proxy


async def test_compiled_kernel_and_twin_store_the_same_bytes(tmp_path: Path, monkeypatch) -> None:
    """The append pipeline on the compiled kernel and on its pure-Python twin must leave byte-identical CommitLog
    segments and ConsumeQueue files, across segment rolls, ConsumeQueue file rolls and block reservations,
    compacted batches, tags codes, and rejected input in between."""
    import mqk.store.file.engine as engine_mod

    clock = iter(range(10**9))
    monkeypatch.setattr(engine_mod, "time_ns", lambda: next(clock) * 1_000_000)

    async def run(root: Path, kernels) -> tuple[list[bytes], list[bytes]]:
        nonlocal clock
        clock = iter(range(10**9))
        e = await open_engine(root, cq_units_per_file=2000)  # 96 KB ConsumeQueue files: 64 KiB reservations
        runs = observe_runs(e, kernels)
        try:
            await e.create_shards(T, 2, TopicConfig())
            for i in range(1500):
                b = batch(1 + i % 4, ts=1000 + (i * 7919) % 5000, value=bytes([i % 256]) * (50 + i % 300))
                if i % 5 == 0:  # a compacted batch: offset span larger than its record count
                    struct.pack_into(">i", b, 23, 5)
                await e.append(T, i % 2, [b], tags_code=i % 3)
                if i % 97 == 0:
                    with pytest.raises(InvalidRecord):
                        await e.append(T, 0, [bytes(b)[:-1]])
            assert e.end_offset(T, 0) > 0
            clog = [bytes(mf.buf[: mf.wrote]) for mf in e.clog.mfq.files]
            cqs = [bytes(mf.buf[: mf.wrote]) for q in (0, 1) for mf in e.registry.shards[(T, q)].cq.mfq.files]
        finally:
            await e.close()
        assert sum(runs.published) == 1500, "every append went through the kernel"
        return clog, cqs

    outcomes = [await run(tmp_path / kernels.__name__, kernels) for kernels in CLENTRY_IMPLS]
    assert len(outcomes[0][0]) >= 3 and len(outcomes[0][1]) >= 2  # segment and ConsumeQueue file rolls happened
    assert all(outcome == outcomes[0] for outcome in outcomes)


async def test_failing_dispatch_hook_on_the_fast_path_is_logged_not_raised(engine: FileEngine, caplog) -> None:
    seen = []

    def broken(*args) -> None:
        raise RuntimeError("hook bug")

    engine.dispatcher.hooks[:0] = [broken]
    engine.dispatcher.hooks.append(lambda *args: seen.append((args[2], args[3], args[4], args[5], bytes(args[8]))))
    b = batch(2)
    result = await engine.append(T, 0, [b], keys=[b"k"])
    assert result.base_offset == 0 and engine.end_offset(T, 0) == 2
    assert "hook bug" in caplog.text
    stored = (await engine.read(T, 0, 0, 10**6)).batches[0]
    assert seen == [(0, 2, stored.physical_offset, engine.clog.max_offset - stored.physical_offset, bytes(stored.data))]


@pytest.mark.parametrize("has_syncfs", [True, False])
async def test_a_checkpoint_of_many_queues_syncs_the_filesystem_once(tmp_path: Path, monkeypatch, has_syncfs) -> None:
    """From SYNCFS_MIN_QUEUES due queues on one filesystem a checkpoint makes them durable with one syncfs instead
    of an fdatasync each; without syncfs each queue is flushed itself. Either way every queue ends flushed and the
    safe offset reaches the end of what was dispatched."""
    import mqk.store.file.checkpoint as engine_mod
    from mqk.store import fsutil

    calls = []

    def counting_syncfs(fd):
        calls.append(fd)
        return fsutil.syncfs(fd) if has_syncfs else False

    monkeypatch.setattr(engine_mod, "syncfs", counting_syncfs)
    e = await open_engine(tmp_path, checkpoint_interval_ms=3_600_000)
    try:
        n = engine_mod.SYNCFS_MIN_QUEUES + 8
        await e.create_shards(T, n, TopicConfig())
        await e.checkpoint_now(flush_all=True)  # the new queues' directories
        calls.clear()
        await e.append_many(T, [(q, [batch(1)]) for q in range(n)])
        cqs = [e.registry.get(T, q).cq for q in range(n)]
        assert all(cq.mfq.dirty_bytes() > 0 for cq in cqs)
        await e.checkpoint_now(flush_all=True)
        assert len(calls) == 1
        assert all(cq.mfq.dirty_bytes() == 0 for cq in cqs)
        assert e.checkpoint.safe_offset == e.dispatcher.dispatched
        # a few queues: their own fdatasync, no filesystem-wide sync
        calls.clear()
        await e.append_many(T, [(q, [batch(1)]) for q in range(3)])
        await e.checkpoint_now(flush_all=True)
        assert calls == [] and all(cq.mfq.dirty_bytes() == 0 for cq in cqs)
    finally:
        await e.close()


async def test_append_many_in_one_write_stores_what_appends_one_by_one_store(tmp_path: Path, monkeypatch) -> None:
    """append_many writes runs of entries with one pwritev (clentry.AppendRun). The files it leaves and its answers
    must be those of the same entries appended one by one, across segment rolls,
    ConsumeQueue file rolls and block reservations, a queue named twice in one call, several batches in one entry,
    compacted batches and refused entries in between; with the compiled kernel and with its twin, byte for byte."""
    import mqk.store.file.engine as engine_mod

    monkeypatch.setattr(engine_mod, "time_ns", lambda: 1_700_000_000_000_000_000)

    def request(i: int) -> list:
        entries = []
        for j in range(12):
            q = (i * 5 + j * 3) % 7
            b = batch(1 + (i + j) % 3, ts=1000 + (i * 31 + j * 7) % 900, value=bytes([j]) * (40 + (i * j) % 400))
            if (i + j) % 11 == 0:
                struct.pack_into(">i", b, 23, 6)  # compacted: a span beyond its record count
            if (i + j) % 13 == 0:
                entries.append((q, [b, batch(1)]))  # several batches
            elif (i + j) % 17 == 0:
                entries.append((q, [bytes(b)[:-1]]))  # refused
            else:
                entries.append((q, [b]))
        entries.append((entries[0][0], [batch(1)]))  # the first queue again
        return entries

    async def run(root: Path, together: bool, kernels=None) -> tuple[list, list, list]:
        e = await open_engine(root, cq_units_per_file=2000)
        runs = observe_runs(e, kernels)
        answers = []
        try:
            await e.create_shards(T, 7, TopicConfig())
            for i in range(120):
                if together:
                    got = await e.append_many(T, request(i))
                else:
                    got = []
                    for q, batches in request(i):
                        try:
                            got.append(await e.append(T, q, batches))
                        except Exception as exc:  # noqa: BLE001 - compared below
                            got.append(exc)
                answers.append([r if isinstance(r, tuple) else type(r).__name__ for r in got])
            clog = [bytes(mf.buf[: mf.wrote]) for mf in e.clog.mfq.files]
            cqs = [bytes(mf.buf[: mf.wrote]) for q in range(7) for mf in e.registry.shards[(T, q)].cq.mfq.files]
        finally:
            await e.close()
        if together:
            assert runs.published and max(runs.published) > 3  # runs of several batches were written at once
        return answers, clog, cqs

    apart = await run(tmp_path / "apart", False)
    assert len(apart[1]) >= 3  # segments rolled
    for kernels in CLENTRY_IMPLS:
        together = await run(tmp_path / f"together-{kernels.__name__}", True, kernels)
        assert together == apart, kernels.__name__


async def test_append_many_write_failure_fails_its_run_and_publishes_nothing(engine: FileEngine, monkeypatch) -> None:
    import os

    from mqk.errors import StorageFull

    await engine.append_many(T, [(0, [batch(1)]), (1, [batch(1)])])  # each queue's first file now exists
    before = (engine.clog.max_offset, engine.end_offset(T, 0), engine.end_offset(T, 1))
    heard = []
    engine.listeners.append(lambda topic, ends: heard.append(list(ends)))
    runs = observe_runs(engine)
    runs.write_to = os.open("/dev/full", os.O_WRONLY)  # every write: ENOSPC
    try:
        results = await engine.append_many(T, [(0, [batch(2)]), (1, [batch(3)])])
    finally:
        os.close(runs.write_to)
        runs.write_to = None
    assert all(isinstance(r, StorageFull) for r in results) and len(results) == 2
    assert (engine.clog.max_offset, engine.end_offset(T, 0), engine.end_offset(T, 1)) == before
    assert heard == [] and len((await engine.read(T, 0, 0, 1 << 20)).batches) == 1
    results = await engine.append_many(T, [(0, [batch(2)]), (1, [batch(3)])])
    assert [r.base_offset for r in results] == [1, 1] and heard == [[(0, 3), (1, 4)]]
    assert [b.base_offset for b in (await engine.read(T, 1, 0, 1 << 20)).batches] == [0, 1]


async def test_append_many_shows_entries_to_dispatch_hooks_one_by_one(engine: FileEngine) -> None:
    seen = []
    engine.dispatcher.hooks.append(
        lambda topic, queue, base, count, phys, size, ts, keys, body: seen.append((queue, base, phys))
    )
    results = await engine.append_many(T, [(0, [batch(2)]), (1, [batch(1)]), (0, [batch(1)])])
    assert seen == [
        (0, 0, results[0].physical_offset),
        (1, 0, results[1].physical_offset),
        (0, 2, results[2].physical_offset),
    ]


@pytest.mark.parametrize("log_append_time", [False, True])
async def test_several_batches_in_one_write_store_what_single_appends_store(
    tmp_path: Path, monkeypatch, log_append_time
) -> None:
    """An append of several batches is one run (one pwritev); the files must be those of the batches appended one
    at a time, with keys shown to the index hook the same way, across segment rolls and ConsumeQueue files too
    small for the whole entry (where its batches go one by one) and LogAppendTime."""
    import mqk.store.file.engine as engine_mod

    monkeypatch.setattr(engine_mod, "time_ns", lambda: 1_700_000_000_000_000_000)
    runs: list[int] = []

    def batches(i: int) -> list:
        return [
            batch(1 + (i + j) % 3, ts=2000 + i * 10 + j, value=bytes([i % 251]) * (30 + (i * 7 + j) % 500))
            for j in range(1 + i % 5)
        ]

    async def run(root: Path, together: bool) -> tuple[list, list, list, list]:
        e = await open_engine(root, cq_units_per_file=16)
        runs_seen = observe_runs(e)
        runs_seen.published = runs
        answers = []
        try:
            await e.create_shards(T, 2, TopicConfig())
            for i in range(150):
                keys = [b"k%d" % i] if i % 4 == 0 else ()
                groups = [batches(i)] if together else [[b] for b in batches(i)]
                for group in groups:
                    r = await e.append(T, i % 2, group, keys=keys, log_append_time=log_append_time)
                    answers.append((r.base_offset, r.last_offset))
            clog = [bytes(mf.buf[: mf.wrote]) for mf in e.clog.mfq.files]
            cqs = [bytes(mf.buf[: mf.wrote]) for q in (0, 1) for mf in e.registry.shards[(T, q)].cq.mfq.files]
            found = [
                sorted((q, b.base_offset) for q, b in await e.read_by_key(T, b"k%d" % i, 10)) for i in range(0, 150, 4)
            ]
        finally:
            await e.close()
        return answers, clog, cqs, found

    together = await run(tmp_path / "together", True)
    assert runs and max(runs) >= 4
    apart = await run(tmp_path / "apart", False)
    assert len(together[1]) >= 3  # segments rolled
    # one append's answer spans what its batches' single appends spanned
    singles = iter(apart[0])
    for i, (base, last) in enumerate(together[0]):
        spanned = [next(singles) for _ in range(1 + i % 5)]
        assert (base, last) == (spanned[0][0], spanned[-1][1])
    assert together[1:] == apart[1:]


async def test_a_queue_on_another_filesystem_is_flushed_on_its_own(tmp_path: Path, monkeypatch) -> None:
    import mqk.store.file.checkpoint as checkpoint_mod
    from mqk.store import fsutil

    calls = []
    monkeypatch.setattr(checkpoint_mod, "syncfs", lambda fd: calls.append(fd) or fsutil.syncfs(fd))
    flushed = []
    e = await open_engine(tmp_path, checkpoint_interval_ms=3_600_000)
    try:
        n = checkpoint_mod.SYNCFS_MIN_QUEUES + 1
        await e.create_shards(T, n, TopicConfig())
        await e.append_many(T, [(q, [batch(1)]) for q in range(n)])
        await e.checkpoint_now(flush_all=True)
        calls.clear()
        await e.append_many(T, [(q, [batch(1)]) for q in range(n)])
        elsewhere = e.registry.get(T, 0).cq
        for mf in elsewhere.mfq.files:
            mf.device = -5  # as if mounted from another disk
        real_flush = MappedFileQueue.flush

        def flush_counted(mfq: MappedFileQueue):
            if mfq is elsewhere.mfq:
                flushed.append(0)
            return real_flush(mfq)

        monkeypatch.setattr(MappedFileQueue, "flush", flush_counted)
        await e.checkpoint_now(flush_all=True)
        assert len(calls) == 1 and flushed == [0]
        assert all(e.registry.get(T, q).cq.mfq.dirty_bytes() == 0 for q in range(n))
    finally:
        await e.close()


async def test_an_entry_larger_than_a_run_is_appended_batch_by_batch(engine: FileEngine) -> None:
    """A run holds at most its capacity of batches: an entry with more is appended one batch after the other, with
    one answer spanning them all, and the entries around it in runs of their own."""
    from mqk._fast import load

    engine.appender.run = load("clentry").AppendRun(4)
    runs = observe_runs(engine)
    results = await engine.append_many(T, [(1, [batch(1)]), (0, [batch(2) for _ in range(9)]), (1, [batch(1)])])
    assert [(r.base_offset, r.last_offset) for r in results] == [(0, 0), (0, 17), (1, 1)]
    assert max(runs.published) <= 4 and sum(runs.published) == 11
    stored = (await engine.read(T, 0, 0, 1 << 20)).batches
    assert [b.base_offset for b in stored] == list(range(0, 18, 2))


async def test_a_start_that_cannot_write_its_checkpoint_still_starts(tmp_path: Path, monkeypatch, caplog) -> None:
    """Recovery on a full disk: the checkpoint it writes at its end fails with ENOSPC, and the store starts anyway
    with everything it recovered, the previous checkpoint left as it was; naming the recovered topic again (as
    the StoreManager does at start) rewrites nothing either (queues.json)."""
    import errno
    import shutil

    import mqk.store.file.checkpoint as checkpoint_mod

    e = await open_engine(tmp_path / "run")
    await e.create_shards(T, 2, TopicConfig())
    for i in range(5):
        await e.append(T, i % 2, [batch(2)])
    await e.checkpoint_now()
    await e.append(T, 0, [batch(1)])
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path / "run", crashed)  # as kill -9 leaves it: the abort marker is there
    await e.close()
    stored = (crashed / "checkpoint").read_bytes()
    meta = (crashed / "queues.json").stat().st_mtime_ns

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_mod, "atomic_write_bytes", full)
    e = await open_engine(crashed)
    try:
        assert "checkpoint not written at start-up" in caplog.text
        assert (e.end_offset(T, 0), e.end_offset(T, 1)) == (7, 4)
        assert (crashed / "checkpoint").read_bytes() == stored
        await e.create_shards(T, 2, TopicConfig())
        assert (crashed / "queues.json").stat().st_mtime_ns == meta
    finally:
        monkeypatch.undo()
        await e.close()


async def test_the_flusher_drops_cached_pages_behind_the_kept_tail_and_reads_still_see_them(tmp_path: Path) -> None:
    keep = 128 * 1024  # two 64 KiB segments
    e = await open_engine(tmp_path, commitlog_cache_bytes=keep)
    try:
        await e.create_shards(T, 1, TopicConfig())
        written = []
        for i in range(300):  # ~240 KB: the CommitLog's first segments fall behind the kept tail
            b = batch(3, ts=1000 + i, value=bytes([i % 256]) * 250)
            written.append(bytes(b))
            await e.append(T, 0, [b])
        await e.flusher.flush()
        segments = e.clog.mfq.snapshot()
        behind = [mf for mf in segments if mf.end_offset <= e.clog.max_offset - keep]
        assert len(behind) >= 2
        assert not any(any(cached_pages(mf)) for mf in behind)
        assert e.flusher.cache_from >= behind[-1].end_offset
        assert cached_pages(segments[-1])[0]  # the tail stays
        # every record reads back as written, those whose pages went included
        got, offset = [], 0
        while offset < 900:
            result = await e.read(T, 0, offset, 1 << 20)
            got.extend(bytes(stored.data) for stored in result.batches)
            offset = result.next_offset
        assert [records_of(g) for g in got] == [records_of(w) for w in written]
    finally:
        await e.close()


def record_fault_ins(
    e: FileEngine, monkeypatch, aheads: list[bool] | None = None
) -> list[tuple[str, list[tuple[int, int]]]]:
    """Every CommitLog.fault_in call from now on: (thread name, entries), the reads still done; whether each asked
    for read-ahead goes to `aheads`."""
    calls = []
    fault_in = e.clog.fault_in

    def recording(entries, ahead=True):
        calls.append((threading.current_thread().name, list(entries)))
        if aheads is not None:
            aheads.append(ahead)
        fault_in(entries, ahead)

    monkeypatch.setattr(e.clog, "fault_in", recording)
    return calls


async def test_reads_of_dropped_bytes_fault_their_entries_in_off_the_event_loop(tmp_path: Path, monkeypatch) -> None:
    e = await open_engine(tmp_path, commitlog_cache_bytes=128 * 1024)
    try:
        await e.create_shards(T, 2, TopicConfig())
        for i in range(150):  # the two queues' entries interleave in the CommitLog
            for q in (0, 1):
                await e.append(T, q, [batch(3, ts=1000 + i, value=bytes([q]) * 250)])
        await e.flusher.flush()
        assert e.flusher.cache_from > 64 * 1024
        calls = record_fault_ins(e, monkeypatch)
        tail = await e.read(T, 0, 140 * 3, 1 << 20)  # written last: still cached, read straight away
        assert tail.batches and calls == []
        old = await e.read(T, 0, 0, 10 * 1000)
        assert [b.base_offset for b in old.batches] == [i * 3 for i in range(len(old.batches))]
        assert all(records_of(b.data) == [bytes([0]) * 250 + bytes([i]) for i in range(3)] for b in old.batches)
        [(thread, entries)] = calls
        assert thread.startswith("mqk-fault-in")
        # exactly the entries read, not the other queue's between them
        assert entries == [(b.physical_offset, len(b.data) + e.registry.get(T, 0).fixed) for b in old.batches]
    finally:
        await e.close()


async def test_a_read_of_less_than_a_page_reads_no_further_ahead(tmp_path: Path, monkeypatch) -> None:
    """The timer loads each due payload alone (max_bytes 1): read-ahead past each would queue far more disk reads
    than the lookups themselves; a consumer's read of dropped bytes still reads ahead."""
    e = await open_engine(tmp_path, commitlog_cache_bytes=128 * 1024)
    try:
        await e.create_shards(T, 1, TopicConfig())
        for i in range(300):
            await e.append(T, 0, [batch(3, ts=1000 + i, value=bytes([i % 256]) * 250)])
        await e.flusher.flush()
        assert e.flusher.cache_from > 64 * 1024
        aheads: list[bool] = []
        calls = record_fault_ins(e, monkeypatch, aheads)
        point = await e.read(T, 0, 30, 1)
        assert [b.base_offset for b in point.batches] == [30] and records_of(point.batches[0].data)[0][-1] == 0
        scan = await e.read(T, 0, 60, 10 * 1000)
        assert scan.batches[0].base_offset == 60
        assert len(calls) == 2 and aheads == [False, True]
    finally:
        await e.close()


async def test_lookups_by_id_key_and_time_read_dropped_entries_back_off_the_event_loop(
    tmp_path: Path, monkeypatch
) -> None:
    e = await open_engine(tmp_path, commitlog_cache_bytes=128 * 1024)
    try:
        await e.create_shards(T, 1, TopicConfig())
        appended = []
        for i in range(300):
            b = batch(3, ts=10_000 + 10 * i, value=bytes([i % 256]) * 250)
            appended.append(await e.append(T, 0, [b], keys=[b"k%d" % i]))
        await e.flusher.flush()
        old, new = appended[2], appended[-1]
        assert old.physical_offset < e.flusher.cache_from <= new.physical_offset
        size = len(batch(3, value=bytes(250))) + e.registry.get(T, 0).fixed  # every entry's size
        calls = record_fault_ins(e, monkeypatch)
        # the kept tail is read straight away
        assert (await e.read_at(new.physical_offset))[2].base_offset == 897
        assert [b.base_offset for _, b in await e.read_by_key(T, b"k299", 4)] == [897]
        assert await e.offset_for_timestamp(T, 0, 12_990) == (897, 12_990)
        assert calls == []
        # by message id: the entry, its size read in the reader thread
        topic, queue, found = await e.read_at(old.physical_offset)
        assert (topic, queue, found.base_offset) == (T, 0, 6)
        assert records_of(found.data) == [bytes([2]) * 250 + bytes([i]) for i in range(3)]
        thread, entries = calls.pop()
        assert thread.startswith("mqk-fault-in") and entries == [(old.physical_offset, size)]
        # by key: the index's hits
        assert [b.base_offset for _, b in await e.read_by_key(T, b"k2", 4)] == [6]
        thread, entries = calls.pop()
        assert thread.startswith("mqk-fault-in") and entries == [(old.physical_offset, size)]
        # by time: the batch the search lands on and a few after it
        assert await e.offset_for_timestamp(T, 0, 10_021) == (7, 10_021)
        thread, entries = calls.pop()
        assert thread.startswith("mqk-fault-in") and entries[0] == (old.physical_offset, size)
        assert [phys for phys, _ in entries] == [r.physical_offset for r in appended[2 : 2 + len(entries)]]
        # a search landing below the log start reads on from the log start, and so does what is read back
        await e.delete_before(T, 0, 9)
        assert await e.offset_for_timestamp(T, 0, 10_000) == (9, 10_030)
        thread, entries = calls.pop()
        assert entries[0] == (appended[3].physical_offset, size)
        assert calls == []
    finally:
        await e.close()


async def test_fault_in_at_reads_no_further_than_written_bytes_whatever_an_offset_points_at(
    tmp_path: Path, monkeypatch
) -> None:
    e = await open_engine(tmp_path)
    try:
        await e.create_shards(T, 1, TopicConfig())
        first = await e.append(T, 0, [batch()])
        last = await e.append(T, 0, [batch()])
        calls = record_fault_ins(e, monkeypatch)
        mf = e.clog.mfq.find(last.physical_offset)
        written_end = mf.start_offset + mf.wrote
        size = last.physical_offset - first.physical_offset
        # an entry, a position inside one (its four bytes are record bytes, not a size), one past the written end
        e.clog.fault_in_at([first.physical_offset, last.physical_offset + 100, written_end])
        [(_thread, entries)] = calls
        assert entries[0] == (first.physical_offset, size)
        assert len(entries) == 2 and entries[1][0] == last.physical_offset + 100
        assert 4 <= entries[1][1] <= written_end - (last.physical_offset + 100)
    finally:
        await e.close()


@pytest.mark.parametrize("many", [False, True])
async def test_an_append_leaving_kick_bytes_unflushed_starts_an_async_flush(tmp_path: Path, many: bool) -> None:
    # neither the flush interval nor a checkpoint (which flushes the CommitLog too) comes within the test
    e = await open_engine(tmp_path, flush_interval_ms=60_000, checkpoint_interval_ms=60_000)
    try:
        await e.create_shards(T, 2, TopicConfig())
        e.flusher.kick_bytes = 2000
        if many:
            await e.append_many(T, [(0, [batch()]), (1, [batch()])])
        else:
            await e.append(T, 0, [batch()])
        assert e.flusher.flushed == 0  # below kick_bytes: left for the interval
        for _ in range(4):
            if many:
                await e.append_many(T, [(0, [batch()]), (1, [batch()])])
            else:
                await e.append(T, 0, [batch()])
        # the kick's flush runs in the flush thread; neither the interval nor a checkpoint comes meanwhile
        await asyncio.wait_for(e.flusher.wait_flushed(2000), 10)
    finally:
        await e.close()


async def test_max_timestamp_past_a_deleted_maximum_walks_in_steps_off_the_loop(tmp_path: Path, monkeypatch) -> None:
    """When the record holding the maximum was deleted, max_timestamp walks the whole queue: in steps of
    MAX_TIMESTAMP_WALK_UNITS units, the loop serving others between them, and reading back dropped entries in the
    reader thread, as Fetch does."""
    import mqk.store.file.reader as reader_mod

    e = await open_engine(tmp_path, commitlog_cache_bytes=128 * 1024)
    try:
        await e.create_shards(T, 1, TopicConfig())
        appended = [await e.append(T, 0, [batch(3, ts=50_000, value=b"max")])]  # the maximum, deleted below
        for i in range(299):  # a peak of 30_000 at batch 100 among older and newer records
            ts = 30_000 if i == 99 else 10_000 + i
            appended.append(await e.append(T, 0, [batch(3, ts=ts, value=bytes([i % 256]) * 250)]))
        await e.flusher.flush()
        await e.delete_before(T, 0, 3)
        assert appended[1].physical_offset < e.flusher.cache_from
        monkeypatch.setattr(reader_mod, "MAX_TIMESTAMP_WALK_UNITS", 16)
        calls = record_fault_ins(e, monkeypatch)
        ticks = 0
        walking = True

        async def other_work() -> None:
            nonlocal ticks
            while walking:
                ticks += 1
                await settle(0)  # one turn of the loop per tick

        other = asyncio.ensure_future(other_work())
        await settle(0)
        try:
            assert await e.max_timestamp(T, 0) == (302, 30_002)  # the last record of the peak batch
        finally:
            walking = False
            await other
        steps = -(-299 // 16)
        assert ticks >= steps  # the loop ran other work between every two steps
        assert calls and all(thread.startswith("mqk-fault-in") for thread, _ in calls)
        # after the timestamp search's own read-back (calls[0]), the steps read back exactly the dropped entries
        # of the walk, in order, from the log start on
        read_back = [phys for _, entries in calls[1:] for phys, _size in entries]
        dropped = [r.physical_offset for r in appended[1:] if r.physical_offset < e.flusher.cache_from]
        assert read_back[: len(dropped)] == dropped
        # with every page cached nothing is read back, and the walk still lets the loop run between its steps
        calls.clear()
        monkeypatch.setattr(e.flusher, "cache_from", 0)
        ticks, walking = 0, True
        other = asyncio.ensure_future(other_work())
        await settle(0)
        try:
            assert await e.max_timestamp(T, 0) == (302, 30_002)
        finally:
            walking = False
            await other
        assert calls == [] and ticks >= steps
    finally:
        await e.close()
