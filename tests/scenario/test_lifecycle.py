"""Log life cycle through the StoreManager on every engine: retention by time and by size (Kafka semantics, -1 =
unlimited, `cleanup.policy`), whole-batch log start moves that reads, timestamps and restarts agree with, the timer
pin, and for the file engine: CommitLog segments and ConsumeQueue files deleted once nothing needs them, disk use
falling measurably, fileReservedTime, and a clean restart afterwards."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
from helpers import records_of, store_config, twin_batch

from mqk.config import BrokerConfig, TopicConfig
from mqk.errors import OffsetOutOfRange
from mqk.services.retention import RetentionService, retention_limits
from mqk.store.manager import StoreManager

HOUR = 3600 * 1000


def _now() -> int:
    return time.time_ns() // 1_000_000


def _service(m: StoreManager) -> RetentionService:
    return RetentionService(BrokerConfig(store=m.config), m)


async def _fill(m: StoreManager, topic: str, n: int, ts: int, size: int = 200, per_batch: int = 2) -> list[int]:
    """Append n batches of `per_batch` records with timestamp `ts`; returns their base offsets."""
    bases = []
    for i in range(n):
        values = [b"%06d" % i + b"x" * size for _ in range(per_batch)]
        result = await m.append(topic, 0, [twin_batch(values, timestamps=[ts] * per_batch)])
        bases.append(result.base_offset)
    return bases


async def _flush(m: StoreManager) -> None:
    engine = m.engines.get("file")
    if engine is not None:
        await engine.checkpoint_now(flush_all=True)


async def _all_offsets(m: StoreManager, topic: str) -> list[int]:
    out = []
    offset = m.log_start_offset(topic, 0)
    while offset < m.end_offset(topic, 0):
        result = await m.read(topic, 0, offset, 1 << 20)
        for batch in result.batches:
            out.extend(r[0] for r in records_of(batch.data))
        offset = result.next_offset
    return out


def _disk_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def test_retention_limits_follow_cleanup_policy() -> None:
    assert retention_limits(TopicConfig()) == (7 * 24 * HOUR, -1)
    assert retention_limits(TopicConfig({"cleanup.policy": "compact"})) is None
    assert retention_limits(TopicConfig({"cleanup.policy": "compact,delete", "retention.bytes": "10"})) == (
        7 * 24 * HOUR,
        10,
    )


async def test_retention_by_time_moves_log_start_in_whole_batches(manager: StoreManager) -> None:
    m = manager
    await m.create_topic("t", 1, TopicConfig({"retention.ms": str(HOUR)}))
    now = _now()
    old = await _fill(m, "t", 30, now - 3 * HOUR, per_batch=3)
    young = await _fill(m, "t", 5, now, per_batch=3)
    # DeleteRecords-style move into the middle of the first batch first: retention still cuts at batch ends
    assert await m.delete_before("t", 0, 1) == 1
    report = await _service(m).run_once()
    assert m.log_start_offset("t", 0) == young[0] == old[-1] + 3
    assert report.moved[("t", 0)].reason == "time"
    with pytest.raises(OffsetOutOfRange):
        await m.read("t", 0, young[0] - 1, 1 << 20)
    assert await _all_offsets(m, "t") == list(range(young[0], young[-1] + 3))
    hit = await m.offset_for_timestamp("t", 0, 0)
    assert hit is not None and hit[0] == young[0]
    # a second pass finds nothing more to do
    again = await _service(m).run_once()
    assert ("t", 0) not in again.moved
    assert m.log_start_offset("t", 0) == young[0]


async def test_retention_by_size_keeps_at_least_the_limit(manager: StoreManager) -> None:
    m = manager
    await m.create_topic("s", 1, TopicConfig({"retention.ms": "-1"}))
    await _fill(m, "s", 40, _now(), size=300)
    batch_size = len((await m.read("s", 0, 0, 1)).batches[0].data)
    await m.alter_topic_config("s", TopicConfig({"retention.ms": "-1", "retention.bytes": str(10 * batch_size + 7)}))
    report = await _service(m).run_once()
    engine = m.engine_of("s")
    remaining = await engine.queue_bytes("s", 0)
    # Kafka: delete only while the rest still holds the limit -> 11 batches stay (10 would be below it)
    assert remaining == 11 * batch_size
    assert m.log_start_offset("s", 0) == 29 * 2
    assert report.moved[("s", 0)].reason == "size"
    assert report.moved[("s", 0)].bytes_before == 40 * batch_size


async def test_unlimited_and_compact_only_topics_keep_everything(manager: StoreManager) -> None:
    m = manager
    await m.create_topic("forever", 1, TopicConfig({"retention.ms": "-1", "retention.bytes": "-1"}))
    await m.create_topic(
        "compacted", 1, TopicConfig({"cleanup.policy": "compact", "retention.ms": "1", "retention.bytes": "1"})
    )
    old = _now() - 1000 * HOUR
    await _fill(m, "forever", 10, old)
    await _fill(m, "compacted", 10, old)
    await _service(m).run_once()
    assert m.log_start_offset("forever", 0) == 0
    assert m.log_start_offset("compacted", 0) == 0
    # compact,delete: retention applies as well
    await m.alter_topic_config("compacted", TopicConfig({"cleanup.policy": "compact,delete", "retention.ms": "1"}))
    await _service(m).run_once()
    assert m.log_start_offset("compacted", 0) == m.end_offset("compacted", 0) == 20


async def test_everything_expired_empties_the_log_and_appends_continue(manager: StoreManager, engine_name: str) -> None:
    m = manager
    await m.create_topic("e", 1, TopicConfig({"retention.ms": "1000"}))
    await _fill(m, "e", 50, _now() - HOUR)
    await _flush(m)
    await _service(m).run_once()
    assert m.log_start_offset("e", 0) == m.end_offset("e", 0) == 100
    assert (await m.read("e", 0, 100, 1 << 20)).batches == []
    result = await m.append("e", 0, [twin_batch([b"new"], timestamps=[_now()])])
    assert result.base_offset == 100
    assert await _all_offsets(m, "e") == [100]


async def test_timer_topic_never_passes_the_pending_floor(manager: StoreManager) -> None:
    m = manager
    await m.create_topic("__mqk_timer", 1, TopicConfig({"retention.ms": "1"}))
    await _fill(m, "__mqk_timer", 10, _now() - HOUR, per_batch=1)
    await m.save_state("timer", {"floor": 4, "done": [], "intent": {}})
    await _service(m).run_once()
    assert m.log_start_offset("__mqk_timer", 0) == 4


@pytest.mark.parametrize("engine_name", ["rocksdb", "file"])  # the memory engine keeps nothing by design
async def test_retention_survives_restart(engine_name: str, tmp_path: Path) -> None:
    config = store_config(engine_name, tmp_path / "data")
    m = StoreManager(config)
    await m.start()
    await m.create_topic("r", 1, TopicConfig({"retention.ms": str(HOUR)}))
    await _fill(m, "r", 60, _now() - 2 * HOUR)
    young = await _fill(m, "r", 3, _now())
    await _flush(m)
    await _service(m).run_once()
    await m.close()
    m = StoreManager(config)
    await m.start()
    try:
        assert m.log_start_offset("r", 0) == young[0]
        assert m.end_offset("r", 0) == young[-1] + 2
        assert await _all_offsets(m, "r") == list(range(young[0], young[-1] + 2))
        result = await m.append("r", 0, [twin_batch([b"after"], timestamps=[_now()])])
        assert result.base_offset == young[-1] + 2
    finally:
        await m.close()


# --- file engine: space comes back ------------------------------------------------------------------------------


@pytest.mark.parametrize("engine_name", ["file"])
async def test_file_disk_use_falls_after_expiry_and_restart_is_clean(engine_name: str, tmp_path: Path) -> None:
    config = store_config("file", tmp_path / "data", commitlog_segment_bytes=64 * 1024, cq_units_per_file=16)
    m = StoreManager(config)
    await m.start()
    try:
        await m.create_topic("big", 1, TopicConfig({"retention.ms": str(HOUR)}))
        await m.create_topic("keep", 1, TopicConfig({"retention.ms": "-1"}))
        await _fill(m, "big", 400, _now() - 5 * HOUR, size=1000)
        await _fill(m, "keep", 2, _now() - 5 * HOUR)  # old, but kept for ever
        young = await _fill(m, "big", 5, _now(), size=1000)
        await _fill(m, "keep", 2, _now())
        await _flush(m)
        engine = m.engines["file"]
        keep_phys = (await m.read("keep", 0, 0, 1)).batches[0].physical_offset
        segments_before = len(engine.clog.mfq.files)
        cq_files_before = len(engine.registry.shards[("big", 0)].cq.mfq.files)
        disk_before = _disk_bytes(config.data_dir / "commitlog")
        report = await _service(m).run_once()
        disk_after = _disk_bytes(config.data_dir / "commitlog")
        assert segments_before >= 7
        # every segment wholly below keep's first batch goes; keep's segment and what follows stay
        assert engine.clog.min_offset == keep_phys - keep_phys % config.commitlog_segment_bytes
        assert len(engine.clog.mfq.files) <= 2
        assert report.freed["file"] > 0
        assert disk_after < disk_before / 3, (disk_before, disk_after)
        assert len(engine.registry.shards[("big", 0)].cq.mfq.files) < cq_files_before
        assert await _all_offsets(m, "big") == list(range(young[0], young[-1] + 2))
        assert len(await _all_offsets(m, "keep")) == 8
    finally:
        await m.close()
    m = StoreManager(config)
    await m.start()
    try:
        engine = m.engines["file"]
        assert engine.recovery_report["error"] is None
        assert m.log_start_offset("big", 0) == young[0]
        assert await _all_offsets(m, "big") == list(range(young[0], young[-1] + 2))
        assert len(await _all_offsets(m, "keep")) == 8
        result = await m.append("big", 0, [twin_batch([b"z"], timestamps=[_now()])])
        assert result.base_offset == young[-1] + 2
    finally:
        await m.close()


@pytest.mark.parametrize("engine_name", ["file"])
async def test_file_reserved_time_bounds_how_long_segments_live(engine_name: str, tmp_path: Path) -> None:
    config = store_config("file", tmp_path / "data", commitlog_segment_bytes=64 * 1024, file_reserved_time_ms=HOUR)
    m = StoreManager(config)
    await m.start()
    try:
        await m.create_topic("forever", 1, TopicConfig({"retention.ms": "-1"}))
        await _fill(m, "forever", 200, _now(), size=1000)
        await _flush(m)
        engine = m.engines["file"]
        files = engine.clog.mfq.files
        assert len(files) >= 5
        old = files[:3]
        cut = old[-1].end_offset
        for mf in old:  # pretend these segments were last written two hours ago
            os.utime(mf.path, (time.time() - 7200, time.time() - 7200))
        await _service(m).run_once()
        assert engine.clog.min_offset == cut
        start = m.log_start_offset("forever", 0)
        assert start > 0
        # the new log start is the first batch stored at or after the cut, and it is readable
        first = (await m.read("forever", 0, start, 1)).batches[0]
        assert first.physical_offset >= cut and first.base_offset == start
    finally:
        await m.close()
