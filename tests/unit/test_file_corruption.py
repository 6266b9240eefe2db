"""Damaged files at start: the store starts, reports what it found (log + recovery_report, with the position),
serves everything before the damage, and keeps working (appends after the cut, a clean restart after that)."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import pytest

from mqk._fast import load
from mqk.config import StoreConfig, TopicConfig
from mqk.errors import OffsetOutOfRange
from mqk.store.file.consumequeue import UNIT
from mqk.store.file.engine import FileEngine

rb = load("recbatch")
T = "events"
SEG = 64 * 1024


def batch(i: int) -> bytearray:
    recs = b"".join(rb.encode_record(k, k, None, bytes([i % 251]) * 300 + b"%d" % i, []) for k in range(2))
    return rb.build_batch(0, 1000 + i, 1001 + i, recs, 2, 1)


def config(root: Path) -> StoreConfig:
    return StoreConfig(
        data_dir=root,
        commitlog_segment_bytes=SEG,
        cq_units_per_file=32,
        flush_interval_ms=20,
        checkpoint_interval_ms=50,
    )


async def build(root: Path, count: int = 500) -> list[int]:
    """`count` batches spread over two queues and several segments; returns each batch's physical offset."""
    e = FileEngine(config(root), root)
    await e.start()
    await e.create_shards(T, 2, TopicConfig())
    phys = []
    for i in range(count):
        r = await e.append(T, i % 2, [batch(i)])
        phys.append(r.physical_offset)
    await e.close()
    return phys


async def reopen(root: Path) -> FileEngine:
    e = FileEngine(config(root), root)
    await e.start()
    return e


async def served(e: FileEngine, queue: int) -> list[bytes]:
    out, offset = [], e.log_start_offset(T, queue)
    end = e.end_offset(T, queue)
    while offset < end:
        result = await e.read(T, queue, offset, 1 << 20)
        for b in result.batches:
            rb.scan_batches(b.data, True)
            out.append(bytes(b.data[12:]))
        offset = result.next_offset
    return out


def expected(upto: int, queue: int) -> list[bytes]:
    return [bytes(batch(i)[12:]) for i in range(upto) if i % 2 == queue]


def segment_of(root: Path, phys: int) -> tuple[Path, int]:
    start = phys // SEG * SEG
    return root / "commitlog" / f"{start:020d}", phys - start


def flip(root: Path, phys: int, delta: int) -> None:
    path, pos = segment_of(root, phys)
    with open(path, "r+b") as f:
        f.seek(pos + delta)
        byte = f.read(1)
        f.seek(pos + delta)
        f.write(bytes([byte[0] ^ 0x5A]))


async def check_serves_prefix_and_recovers(root: Path, first_bad: int) -> FileEngine:
    e = await reopen(root)
    for q in (0, 1):
        assert await served(e, q) == expected(first_bad, q)
    # the store keeps working after the cut: the next offsets continue the served prefix
    r = await e.append(T, 0, [batch(10_000)])
    assert r.base_offset == 2 * len(expected(first_bad, 0))
    await e.close()
    again = await reopen(root)
    assert again.recovery_report["error"] is None and not again.recovery_report["abnormal"]
    assert await served(again, 0) == [*expected(first_bad, 0), bytes(batch(10000)[12:])]
    return again


async def test_flipped_byte_in_the_last_entry(tmp_path: Path, caplog) -> None:
    phys = await build(tmp_path)
    flip(tmp_path, phys[-1], 100)
    caplog.set_level(logging.WARNING)
    e = await reopen(tmp_path)
    report = e.recovery_report
    assert report["end"] == phys[-1] and report["torn_tail"]
    assert f"position {phys[-1]}" in report["error"]
    assert any(str(phys[-1]) in r.getMessage() for r in caplog.records)
    await e.close()
    await (await check_serves_prefix_and_recovers(tmp_path, 499)).close()


async def test_flipped_byte_in_a_middle_entry(tmp_path: Path, caplog) -> None:
    phys = await build(tmp_path)
    bad = 440  # inside the last three segments: re-verified at every start
    assert phys[bad] >= phys[-1] // SEG * SEG - 2 * SEG
    flip(tmp_path, phys[bad], 70)
    caplog.set_level(logging.WARNING)
    e = await reopen(tmp_path)
    assert not e.recovery_report["torn_tail"] and e.recovery_report["end"] == phys[bad]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and str(phys[bad]) in errors[0].getMessage()
    assert e.end_offset(T, 0) == 2 * len(expected(bad, 0))
    await e.close()
    await (await check_serves_prefix_and_recovers(tmp_path, bad)).close()


async def test_flipped_header_byte_after_an_unclean_stop(tmp_path: Path) -> None:
    phys = await build(tmp_path)
    (tmp_path / "abort").touch()
    flip(tmp_path, phys[470], 20)  # queue offset field: CRC catches header damage too
    e = await reopen(tmp_path)
    assert e.recovery_report["abnormal"] and e.recovery_report["end"] == phys[470]
    await e.close()
    await (await check_serves_prefix_and_recovers(tmp_path, 470)).close()


async def test_segment_truncated_mid_entry(tmp_path: Path) -> None:
    phys = await build(tmp_path)
    victim = 480
    path, pos = segment_of(tmp_path, phys[victim])
    os.truncate(path, pos + 30)  # half an entry header survives
    (tmp_path / "abort").touch()
    e = await reopen(tmp_path)
    assert e.recovery_report["end"] == phys[victim] and e.recovery_report["torn_tail"]
    assert os.path.getsize(path) == SEG  # noqa: ASYNC240 - a test's look at its own file; nothing else waits
    await e.close()
    await (await check_serves_prefix_and_recovers(tmp_path, victim)).close()


@pytest.mark.parametrize("zeroed", [40, 200])
async def test_zeroed_consumequeue_tail_is_rebuilt(tmp_path: Path, zeroed: int) -> None:
    await build(tmp_path)
    qdir = tmp_path / "consumequeue" / T / "0"
    files = sorted(qdir.iterdir())
    # zero the last units of queue 0 (40: inside the re-verified tail of the CommitLog; 200: reaching back
    # before it, so the queue must be rebuilt from the CommitLog from its last intact unit)
    remaining = zeroed
    for path in reversed(files):
        data = bytearray(path.read_bytes())
        used = len(data.rstrip(b"\x00"))
        used = -(-used // UNIT) * UNIT
        cut = min(remaining, used // UNIT)
        data[used - cut * UNIT : used] = bytes(cut * UNIT)
        path.write_bytes(bytes(data))
        remaining -= cut
        if not remaining:
            break
    assert remaining == 0
    e = await reopen(tmp_path)
    try:
        assert e.recovery_report["repaired_queues"] == ([f"{T}-0"] if zeroed == 200 else [])
        assert await served(e, 0) == expected(500, 0)
        assert await served(e, 1) == expected(500, 1)
        assert e.end_offset(T, 0) == 500
    finally:
        await e.close()


async def test_consumequeue_ahead_of_a_cut_commitlog(tmp_path: Path) -> None:
    phys = await build(tmp_path)
    # lose the CommitLog's last segment entirely while the queues still point into it
    last = sorted((tmp_path / "commitlog").iterdir())[-1]
    start = int(last.name)
    last.unlink()
    first_lost = next(i for i, p in enumerate(phys) if p >= start)
    e = await reopen(tmp_path)
    try:
        for q in (0, 1):
            assert await served(e, q) == expected(first_lost, q)
        with pytest.raises(OffsetOutOfRange):
            await e.read(T, 0, 2 * len(expected(first_lost, 0)) + 1, 100)
    finally:
        await e.close()


async def test_garbage_checkpoint_and_metadata_do_not_stop_the_start(tmp_path: Path) -> None:
    await build(tmp_path, 100)
    (tmp_path / "checkpoint").write_bytes(b"\xff" * 7)
    (tmp_path / "queues.json").write_text("{not json")
    (tmp_path / "abort").touch()
    e = await reopen(tmp_path)
    try:
        assert e.list_shards() == {T: 2}  # found again from consumequeue/
        assert await served(e, 1) == expected(100, 1)
        assert e.recovery_report["scan_start"] == 0  # no checkpoint: replay from the oldest segment
    finally:
        await e.close()


def test_config_helper_is_small() -> None:
    # the corruption scenarios rely on several segments; guard against someone enlarging them
    assert dataclasses.asdict(config(Path("x")))["commitlog_segment_bytes"] == SEG
