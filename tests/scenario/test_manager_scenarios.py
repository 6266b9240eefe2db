"""StoreManager scenarios on each default engine: mixed engines, routing, metadata persistence across restart,
listeners, put hooks (reject, reroute), group offsets kept by the default engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import header_of, kafka_python_batch, records_of, store_config, twin_batch

from mqk.config import TopicConfig
from mqk.errors import PutRejected, ShardExists, UnknownShard
from mqk.store.adapter import GroupOffset, PutContext
from mqk.store.manager import StoreManager

ALL = ["memory", "rocksdb", "file"]


async def _values(m: StoreManager, topic: str, queue: int = 0) -> list[bytes | None]:
    out: list[bytes | None] = []
    offset = m.log_start_offset(topic, queue)
    while offset < m.end_offset(topic, queue):
        result = await m.read(topic, queue, offset, 1 << 20)
        for batch in result.batches:
            out.extend(r[2] for r in records_of(batch.data))
        offset = result.next_offset
    return out


async def test_topics_on_mixed_engines_route_to_shared_engines(manager: StoreManager, engine_name: str) -> None:
    infos = {
        "plain": await manager.create_topic("plain", 2),
        "plain2": await manager.create_topic("plain2", 1),
    }
    for other in ALL:
        infos[f"on-{other}"] = await manager.create_topic(f"on-{other}", 1, TopicConfig({"storage.type": other}))
    assert infos["plain"].engine == engine_name and infos["on-rocksdb"].engine == "rocksdb"
    assert set(manager.engines) == set(ALL)
    # one instance per engine, shared by every topic routed to it
    assert manager.engine_of("plain") is manager.engine_of("plain2") is manager.engine_of(f"on-{engine_name}")
    assert manager.engine_of("on-memory") is not manager.engine_of("on-rocksdb")
    for name in infos:
        assert name in manager.engine_of(name).list_shards()
        await manager.append(name, 0, [twin_batch([name.encode(), b"second"])])
        await manager.append(name, 0, [kafka_python_batch([b"kp"], [7_000])])
    for name in infos:
        assert await _values(manager, name) == [name.encode(), b"second", b"kp"]
        assert manager.end_offset(name, 0) == 3
        assert await manager.offset_for_timestamp(name, 0, 6_999) == (2, 7_000)
    assert manager.end_offset("plain", 1) == 0
    ids = {info.topic_id for info in infos.values()}
    assert len(ids) == len(infos) and b"\x00" * 16 not in ids
    with pytest.raises(ShardExists):
        await manager.create_topic("plain", 3)
    with pytest.raises(UnknownShard):
        await manager.append("plain", 2, [twin_batch([b"x"])])
    with pytest.raises(UnknownShard):
        await manager.read("missing", 0, 0, 10)


async def test_metadata_data_and_offsets_across_restart(engine_name: str, tmp_path: Path) -> None:
    config = store_config(engine_name, tmp_path / "data")
    m = StoreManager(config)
    await m.start()
    await m.create_topic("events", 2, TopicConfig({"retention.ms": "1000", "cleanup.policy": "compact"}))
    await m.create_topic("scratch", 1, TopicConfig({"storage.type": "memory"}))
    gone_id = (await m.create_topic("gone", 1)).topic_id
    await m.add_partitions("events", 4)
    await m.alter_topic_config("events", TopicConfig({"retention.ms": "5000"}))
    await m.delete_topic("gone")
    for q in range(4):
        await m.append("events", q, [twin_batch([b"e%d" % q] * (q + 1))])
    await m.append("scratch", 0, [twin_batch([b"s"])])
    await m.commit_offsets("grp", {("events", 1): GroupOffset(2, "meta")})
    await m.save_state("producer-ids", {"next": 42})
    before = m.topics()
    await m.close()

    again = StoreManager(config)
    await again.start()
    try:
        if engine_name == "memory":
            assert again.topics() == {}
            assert again.fetch_offsets("grp") == {}
            assert again.load_state("producer-ids") is None
            assert not config.data_dir.exists(), "a memory default must leave nothing on disk"
            return
        after = again.topics()
        assert after == before  # queue counts, configs, engines and topic ids
        assert after["events"].queue_count == 4
        assert after["events"].config.get("retention.ms") == "5000"
        assert after["events"].config.get("cleanup.policy") == "delete"  # the alter replaced the overrides
        assert "gone" not in after
        assert [again.end_offset("events", q) for q in range(4)] == [1, 2, 3, 4]
        assert await _values(again, "events", 3) == [b"e3"] * 4
        assert again.end_offset("scratch", 0) == 0  # a memory-engine topic comes back, empty
        assert again.fetch_offsets("grp") == {("events", 1): GroupOffset(2, "meta")}
        assert again.load_state("producer-ids") == {"next": 42}
        assert (config.data_dir / "config" / "topics.json").exists()
        await again.create_topic("gone", 1)  # the deleted name is free again, with a new id
        assert again.end_offset("gone", 0) == 0
        assert (await again.create_topic("gone2", 1)).topic_id != gone_id
        assert again.topic("gone").topic_id != gone_id
    finally:
        await again.close()


async def test_listeners_fire_for_every_engine(manager: StoreManager) -> None:
    heard: list[tuple[str, int, int]] = []
    manager.add_listener(lambda topic, ends: heard.extend((topic, queue, end) for queue, end in ends))
    await manager.create_topic("a", 1)
    for other in ALL:  # engines created after the listener was added hear it too
        await manager.create_topic(f"on-{other}", 2, TopicConfig({"storage.type": other}))
        await manager.append(f"on-{other}", 1, [twin_batch([b"x", b"y", b"z"])])
    await manager.append("a", 0, [twin_batch([b"x"])])
    assert ("a", 0, 1) in heard
    for other in ALL:
        assert (f"on-{other}", 1, 3) in heard


async def test_hooks_reject_and_reroute(manager: StoreManager) -> None:
    await manager.create_topic("orders", 2)
    await manager.create_topic("delayed", 1, TopicConfig({"storage.type": "memory"}))
    seen: list[str] = []

    def audit(ctx: PutContext) -> None:
        seen.append(ctx.topic)

    def reject_blocked(ctx: PutContext) -> None:
        if ctx.properties.get("blocked") == "yes":
            raise PutRejected("blocked by policy")

    def reroute_delayed(ctx: PutContext) -> None:
        if "DELAY" in ctx.properties:
            ctx.properties["REAL_TOPIC"] = ctx.topic
            ctx.topic, ctx.queue = "delayed", 0

    manager.hooks.extend([audit, reject_blocked, reroute_delayed])
    with pytest.raises(PutRejected):
        await manager.append("orders", 0, [twin_batch([b"no"])], properties={"blocked": "yes"})
    assert manager.end_offset("orders", 0) == 0
    result = await manager.append("orders", 1, [twin_batch([b"later"])], properties={"DELAY": "3"})
    assert result.base_offset == 0
    assert manager.end_offset("orders", 1) == 0
    assert await _values(manager, "delayed") == [b"later"]
    await manager.append("orders", 1, [twin_batch([b"now"])])
    assert await _values(manager, "orders", 1) == [b"now"]
    assert seen == ["orders", "orders", "orders"]


async def test_append_many_shows_each_entry_to_the_hooks(manager: StoreManager) -> None:
    await manager.create_topic("orders", 3)
    await manager.create_topic("delayed", 1, TopicConfig({"storage.type": "memory"}))
    seen: list[int] = []

    def hook(ctx: PutContext) -> None:
        seen.append(ctx.queue)
        if ctx.queue == 1:
            raise PutRejected("queue 1 is closed")
        if ctx.queue == 2:
            ctx.topic, ctx.queue = "delayed", 0

    manager.hooks.append(hook)
    results = await manager.append_many(
        "orders",
        [
            (0, [twin_batch([b"a"])]),
            (1, [twin_batch([b"no"])]),
            (2, [twin_batch([b"later"])]),
            (5, [twin_batch([b"x"])]),
            (0, [twin_batch([b"b", b"c"])]),
        ],
    )
    assert seen == [0, 1, 2, 5, 0]
    assert (results[0].base_offset, results[4].base_offset, results[4].last_offset) == (0, 1, 2)
    assert isinstance(results[1], PutRejected) and isinstance(results[3], UnknownShard)
    assert results[2].base_offset == 0  # appended where the hook sent it
    assert await _values(manager, "orders", 0) == [b"a", b"b", b"c"]
    assert [manager.end_offset("orders", q) for q in (1, 2)] == [0, 0]
    assert await _values(manager, "delayed") == [b"later"]
    results = await manager.append_many("nosuch", [(0, [twin_batch([b"x"])])])
    assert isinstance(results[0], UnknownShard)


async def test_topic_log_append_time_config_applies(manager: StoreManager) -> None:
    await manager.create_topic("lat", 1, TopicConfig({"message.timestamp.type": "LogAppendTime"}))
    result = await manager.append("lat", 0, [twin_batch([b"x"], timestamps=[5])])
    header = header_of((await manager.read("lat", 0, 0, 1 << 20)).batches[0].data)
    assert header[5] & 0x08 and header[8] == result.log_append_time


async def test_group_offsets_live_in_the_default_engine(manager: StoreManager, engine_name: str) -> None:
    await manager.commit_offsets("g", {("t", 0): GroupOffset(5), ("t", 1): GroupOffset(6)})
    assert manager.default_engine is manager.engines[engine_name]
    assert manager.default_engine.fetch_offsets("g") == manager.fetch_offsets("g")
    await manager.delete_offsets("g", [("t", 0)])
    assert manager.fetch_offsets("g") == {("t", 1): GroupOffset(6)}
    assert manager.list_offset_groups() == ["g"]
    await manager.delete_offsets("g")
    assert manager.list_offset_groups() == []


async def test_delete_before_and_timestamps_route(manager: StoreManager) -> None:
    await manager.create_topic("t", 1)
    for i in range(4):
        await manager.append("t", 0, [twin_batch([b"%d" % i] * 2, base_timestamp=100 * i)])
    assert await manager.delete_before("t", 0, 3) == 3
    assert manager.log_start_offset("t", 0) == 3
    assert await manager.offset_for_timestamp("t", 0, 0) == (3, 101)
    assert await manager.max_timestamp("t", 0) == (7, 301)
