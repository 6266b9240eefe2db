"""StoreManager unit tests: validation, metadata life cycle, persistence details, reconciliation, service state.

These use the memory and rocksdb engines only (no file engine), so they pin the manager's own behaviour."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from mqk._fast import twin
from mqk.config import StoreConfig, TopicConfig
from mqk.errors import (
    Corrupt,
    InvalidConfigError,
    InvalidPartitionsError,
    ShardExists,
    UnknownShard,
)
from mqk.store.adapter import GroupOffset
from mqk.store.manager import StoreManager

rb = twin("recbatch")


def _batch(value: bytes) -> bytearray:
    record = rb.encode_record(0, 0, None, value, [])
    return rb.build_batch(0, 1_000, 1_000, record, 1, 0)


@pytest.fixture
async def mem(tmp_path: Path):
    m = StoreManager(StoreConfig(data_dir=tmp_path / "data", storage="memory"))
    await m.start()
    yield m
    await m.close()


async def _rocks(tmp_path: Path) -> StoreManager:
    m = StoreManager(StoreConfig(data_dir=tmp_path / "data", storage="rocksdb"))
    await m.start()
    return m


@pytest.mark.parametrize("name", ["orders", "a.b-c_d", "%RETRY%group", "%DLQ%g", "x" * 249])
async def test_legal_topic_names(mem: StoreManager, name: str) -> None:
    info = await mem.create_topic(name, 1)
    assert info.topic == name and mem.topic(name) == info


@pytest.mark.parametrize("count", [0, -1, 10_001, 1.5, "3"])
async def test_bad_partition_counts(mem: StoreManager, count: object) -> None:
    with pytest.raises(InvalidPartitionsError):
        await mem.create_topic("t", count)  # type: ignore[arg-type]  # bad counts on purpose


async def test_unknown_engine_is_a_config_error(mem: StoreManager) -> None:
    with pytest.raises(InvalidConfigError):
        await mem.create_topic("t", 1, TopicConfig({"storage.type": "tape"}))
    assert mem.topic("t") is None


async def test_topic_life_cycle_errors(mem: StoreManager) -> None:
    await mem.create_topic("t", 2)
    with pytest.raises(ShardExists):
        await mem.create_topic("t", 1)
    with pytest.raises(UnknownShard):
        await mem.delete_topic("nope")
    with pytest.raises(UnknownShard):
        await mem.add_partitions("nope", 3)
    with pytest.raises(UnknownShard):
        await mem.alter_topic_config("nope", TopicConfig())
    for total in (1, 2):
        with pytest.raises(InvalidPartitionsError):
            await mem.add_partitions("t", total)
    await mem.add_partitions("t", 5)
    assert mem.topic("t").queue_count == 5 and mem.engine_of("t").list_shards()["t"] == 5
    with pytest.raises(InvalidConfigError):
        await mem.alter_topic_config("t", TopicConfig({"storage.type": "rocksdb"}))
    await mem.alter_topic_config("t", TopicConfig({"storage.type": "memory", "retention.ms": "1"}))
    assert mem.topic("t").config.get("retention.ms") == "1"
    topic_id = mem.topic("t").topic_id
    assert mem.topic("t").topic_id == topic_id  # the id never changes with config or partitions
    await mem.delete_topic("t")
    assert mem.topic("t") is None and "t" not in mem.engines["memory"].list_shards()
    with pytest.raises(UnknownShard):
        mem.end_offset("t", 0)


async def test_engines_are_created_lazily_and_once(mem: StoreManager) -> None:
    assert set(mem.engines) == {"memory"}
    await mem.create_topic("a", 1, TopicConfig({"storage.type": "rocksdb"}))
    await mem.create_topic("b", 1, TopicConfig({"storage.type": "rocksdb"}))
    assert set(mem.engines) == {"memory", "rocksdb"}
    assert mem.engine_of("a") is mem.engine_of("b")


async def test_memory_default_writes_nothing(tmp_path: Path) -> None:
    m = StoreManager(StoreConfig(data_dir=tmp_path / "data", storage="memory"))
    await m.start()
    await m.create_topic("t", 3)
    await m.append("t", 0, [_batch(b"x")])
    await m.commit_offsets("g", {("t", 0): GroupOffset(1)})
    await m.save_state("timer", {"wheel": [1, 2]})
    assert m.load_state("timer") == {"wheel": [1, 2]}
    await m.close()
    assert not (tmp_path / "data").exists()


async def test_state_documents(tmp_path: Path) -> None:
    m = await _rocks(tmp_path)
    try:
        assert m.load_state("pids") is None
        await asyncio.gather(*(m.save_state("pids", {"n": i}) for i in range(20)))
        assert m.load_state("pids") == {"n": 19}
        doc = m.load_state("pids")
        doc["n"] = -1  # callers get a copy
        assert m.load_state("pids") == {"n": 19}
        path = tmp_path / "data" / "state" / "pids.json"
        assert json.loads(path.read_text()) == {"n": 19}
        for bad in ("", "../x", "a/b", ".hidden", "x" * 200):
            with pytest.raises(ValueError):
                await m.save_state(bad, {})
        with pytest.raises(TypeError):
            await m.save_state("pids", {"bad": object()})
        assert m.load_state("pids") == {"n": 19}
    finally:
        await m.close()
    again = await _rocks(tmp_path)
    try:
        assert again.load_state("pids") == {"n": 19}
    finally:
        await again.close()


async def test_corrupt_topic_metadata_refuses_to_start(tmp_path: Path) -> None:
    m = await _rocks(tmp_path)
    await m.create_topic("t", 1)
    await m.close()
    path = tmp_path / "data" / "config" / "topics.json"
    for content in ("{not json", json.dumps({"version": 1, "topics": {"t": {"queues": 0}}}), "[]"):
        path.write_text(content)
        broken = StoreManager(StoreConfig(data_dir=tmp_path / "data", storage="rocksdb"))
        with pytest.raises(Corrupt):
            await broken.start()
        await broken.close()


async def test_restart_reconciles_engine_shards_with_metadata(tmp_path: Path) -> None:
    m = await _rocks(tmp_path)
    kept = await m.create_topic("kept", 2)
    await m.create_topic("orphan", 1)
    await m.append("orphan", 0, [_batch(b"x")])
    await m.close()
    # simulate a crash after the metadata lost "orphan" but before the engine deleted its shards
    path = tmp_path / "data" / "config" / "topics.json"
    doc = json.loads(path.read_text())
    del doc["topics"]["orphan"]
    path.write_text(json.dumps(doc))

    m = await _rocks(tmp_path)
    assert set(m.topics()) == {"kept"} and m.topic("kept") == kept
    assert m.default_engine.list_shards() == {"kept": 2}
    await m.close()

    # metadata lost entirely: the engine's shards are adopted rather than deleted
    path.unlink()
    m = await _rocks(tmp_path)
    try:
        assert set(m.topics()) == {"kept"}
        assert m.topic("kept").queue_count == 2 and m.topic("kept").engine == "rocksdb"
        assert path.exists()
    finally:
        await m.close()


async def test_rerouting_hook_to_unknown_topic_is_unknown_shard(mem: StoreManager) -> None:
    await mem.create_topic("t", 1)

    def to_nowhere(ctx) -> None:
        ctx.topic = "nowhere"

    mem.hooks.append(to_nowhere)
    with pytest.raises(UnknownShard):
        await mem.append("t", 0, [_batch(b"x")])
    assert mem.end_offset("t", 0) == 0


async def test_closed_manager_gives_typed_errors(tmp_path: Path) -> None:
    from mqk.errors import StorageError

    m = StoreManager(StoreConfig(data_dir=tmp_path / "data", storage="memory"))
    await m.start()
    await m.create_topic("t", 1)
    await m.close()
    with pytest.raises(StorageError):
        await m.append("t", 0, [_batch(b"late")])
    with pytest.raises(StorageError):
        m.fetch_offsets("g")
    with pytest.raises(StorageError):
        m.end_offset("t", 0)


async def test_delayed_only_hooks_skip_appends_said_to_carry_no_delay_header(mem: StoreManager) -> None:
    """A hook marked `delayed_only` sees an append unless the caller said that no record carries a delay header
    (delay_headers False, no properties); an unmarked hook sees every append; the answers are the same."""
    from mqk.store.adapter import delayed_only

    await mem.create_topic("t", 4)
    seen: dict[str, list] = {"marked": [], "plain": []}

    @delayed_only
    def marked(ctx) -> None:
        seen["marked"].append((ctx.queue, ctx.delay_headers))

    def plain(ctx) -> None:
        seen["plain"].append((ctx.queue, ctx.delay_headers))

    mem.hooks.append(marked)
    entries = [(q, [_batch(b"%d" % q)]) for q in range(4)]
    results = await mem.append_many("t", entries, delay_headers=[False, True, None, False])
    assert [r.base_offset for r in results] == [0, 0, 0, 0]
    assert seen["marked"] == [(1, True), (2, None)]
    await mem.append_many("t", entries, delay_headers=[False] * 4)  # no hook needs any entry
    assert seen["marked"] == [(1, True), (2, None)]
    await mem.append_many("t", entries)  # nobody looked: every hook sees every entry
    assert seen["marked"][2:] == [(0, None), (1, None), (2, None), (3, None)]
    await mem.append("t", 0, [_batch(b"x")], delay_headers=False)
    await mem.append("t", 0, [_batch(b"x")], delay_headers=False, properties={"KEYS": "k"})
    await mem.append("t", 0, [_batch(b"x")], delay_headers=True)
    assert seen["marked"][6:] == [(0, False), (0, True)]

    mem.hooks.append(plain)  # an unmarked hook: every entry builds a context again
    seen["marked"].clear()
    await mem.append_many("t", entries, delay_headers=[False, True, False, False])
    assert seen["plain"] == [(0, False), (1, True), (2, False), (3, False)]
    assert seen["marked"] == [(1, True)]
    await mem.append("t", 1, [_batch(b"x")], delay_headers=False)
    assert seen["plain"][-1] == (1, False) and seen["marked"] == [(1, True)]
    assert [mem.end_offset("t", q) for q in range(4)] == [7, 5, 4, 4]


async def test_append_many_without_hooks_answers_unknown_queues_per_entry(mem: StoreManager) -> None:
    await mem.create_topic("t", 2)
    results = await mem.append_many(
        "t", [(0, [_batch(b"a")]), (5, [_batch(b"b")]), (1, [_batch(b"c")])], delay_headers=[False, False, False]
    )
    assert results[0].base_offset == 0 and results[2].base_offset == 0
    assert isinstance(results[1], UnknownShard)
    assert mem.end_offset("t", 0) == 1 and mem.end_offset("t", 1) == 1
