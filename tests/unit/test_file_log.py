"""CommitLog placement (BLANK at segment ends, no entry spanning segments), its recovery scan, and ConsumeQueue
units across files: offset and timestamp search, recovery cut, truncation to the CommitLog."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mqk._fast import load
from mqk.config import StoreConfig, TopicConfig
from mqk.errors import MessageTooLarge, OutOfBounds
from mqk.store.file.commitlog import CommitLog
from mqk.store.file.consumequeue import UNIT, ConsumeQueue
from mqk.store.file.engine import FileEngine

rb = load("recbatch")
cl = load("clentry")
SEG = 4096


def batch(n: int = 1, value_size: int = 100, ts: int = 1000) -> bytearray:
    recs = b"".join(rb.encode_record(i, i, None, b"v" * value_size, []) for i in range(n))
    return rb.build_batch(0, ts, ts + n - 1, recs, n, n - 1)


async def open_engine(root: Path) -> FileEngine:
    """A file store whose CommitLog segments are SEG bytes (its placement is the append pipeline's)."""
    engine = FileEngine(dataclasses.replace(StoreConfig(data_dir=root), commitlog_segment_bytes=SEG), root)
    await engine.start()
    await engine.create_shards("topic", 1, TopicConfig())
    return engine


async def fill(engine: FileEngine, count: int, value_size: int = 300) -> list[tuple[int, int]]:
    """Append `count` one-record batches; (CommitLog offset, entry size) of each."""
    out = []
    for _ in range(count):
        result = await engine.append("topic", 0, [batch(1, value_size)])
        out.append((result.physical_offset, engine.clog.read_entry(result.physical_offset)[1]))
    return out


async def test_entries_never_span_segments_and_segments_end_with_blank(tmp_path: Path) -> None:
    engine = await open_engine(tmp_path)
    clog = engine.clog
    try:
        placed = await fill(engine, 40)
        for phys, size in placed:
            assert phys // SEG == (phys + size - 1) // SEG, "an entry crosses a segment boundary"
        assert len(clog.mfq.files) > 3
        for mf in clog.mfq.files[:-1]:
            # walk the segment: messages, then exactly one BLANK reaching the end
            pos, kinds = 0, []
            while pos < SEG:
                entry = cl.read_entry(mf.buf, pos, SEG, True)
                kinds.append(entry[0])
                pos += entry[1]
            assert pos == SEG and kinds[-1] == 2 and set(kinds[:-1]) == {1}
        # each entry knows where it is and its body is the batch with base offset = queue offset
        for i, (phys, size) in enumerate(placed):
            entry = clog.read_entry(phys)
            assert entry[0] == 1 and entry[1] == size and entry[4] == i and entry[5] == phys
            body = clog.body_view(phys, size, len(b"topic"))
            assert rb.parse_header(body)[0] == i
    finally:
        await engine.close()


async def test_entry_larger_than_a_segment_is_refused(tmp_path: Path) -> None:
    engine = await open_engine(tmp_path)
    try:
        with pytest.raises(MessageTooLarge):
            await engine.append("topic", 0, [batch(1, SEG)])
        assert engine.clog.max_offset == 0 and engine.end_offset("topic", 0) == 0
        await fill(engine, 1)  # the next append goes where the refused one would have
        assert engine.clog.read_entry(0)[4] == 0
    finally:
        await engine.close()


async def test_scan_replays_every_entry_and_stops_at_damage(tmp_path: Path) -> None:
    engine = await open_engine(tmp_path)
    placed = await fill(engine, 30)
    await engine.close()
    again = CommitLog(tmp_path / "commitlog", SEG)
    again.load()
    try:
        seen = [phys for phys, _entry, _mf in again.scan(0)]
        assert seen == [p for p, _ in placed]
        assert again.scan_end == placed[-1][0] + placed[-1][1] and again.scan_error is None
        # flip one byte inside entry 17's body: the scan stops there and says where
        phys17, size17 = placed[17]
        mf = again.mfq.find(phys17)
        at = phys17 - mf.start_offset + size17 - 5
        mf.buf[at] ^= 0xFF
        seen = [phys for phys, _entry, _mf in again.scan(0)]
        assert seen == [p for p, _ in placed[:17]]
        assert again.scan_end == phys17 and again.scan_error.position == phys17
        assert again.has_data_after(phys17 + size17)
        again.truncate(phys17)
        assert again.max_offset == phys17 and not again.has_data_after(phys17)
    finally:
        again.close()


def put_units(cq: ConsumeQueue, n: int, span: int = 10) -> None:
    for i in range(n):
        # timestamps go up and down; the unit keeps the running max
        ts = 1000 + i * 10 + (5 if i % 3 == 0 else 0)
        cq.put(100 * i, 100, span, i % 4, 50_000 + i, ts, i * span)


def test_consumequeue_search_across_files(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path / "cq", 4)
    try:
        put_units(cq, 23)
        assert len(cq.mfq.files) == 6 and cq.end_offset == 230 and len(cq) == 23
        assert cq.mfq.files[1].path.name == f"{4 * UNIT:020d}"
        for offset in (0, 5, 39, 40, 41, 229):
            i = cq.search_offset(offset)
            _phys, _size, count, _tags, _store_ts, _max_ts, base = cq.unit(i)
            assert base <= offset < base + count
        assert cq.search_offset(230) == 23 and cq.search_offset(10_000) == 23
        for ts, expected in ((0, 0), (1005, 0), (1006, 1), (1100, 10), (1220, 22), (1221, 23)):
            assert cq.search_timestamp(ts) == expected, ts
        running = [cq.unit(i)[5] for i in range(23)]
        assert running == sorted(running)
        with pytest.raises(OutOfBounds):
            cq.unit(23)
    finally:
        cq.close()


def test_consumequeue_recover_and_truncate(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path / "cq", 4)
    put_units(cq, 23)
    cq.flush()
    cq.close()
    again = ConsumeQueue(tmp_path / "cq", 4)
    again.load()
    try:
        again.recover(phys_limit=100 * 9)  # units of entries below CommitLog offset 900 survive
        assert len(again) == 9 and again.end_offset == 90
        assert again.max_ts == again.unit(8)[5]
        again.put(900, 100, 10, 0, 1, 2000, 90)
        assert again.end_offset == 100
        again.truncate_to_phys(850)  # entry 8 ends at 900 > 850: cut it and what follows
        assert len(again) == 8 and again.end_offset == 80
        assert again.last_unit_end_phys() == 800
    finally:
        again.close()
