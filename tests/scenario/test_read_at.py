"""`read_at`: a batch found again by the physical offset its append returned, on every engine (memory, rocksdb,
file), after a restart on the durable ones, and refused (None, never an error) for offsets that name nothing
readable: never issued, between batches, beyond the end, below the log start, of a deleted or re-created topic.
Also the StoreManager's routing of the one id space (adapter.PHYSICAL_KINDS) to the engine that issued a value."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from helpers import Harness, records_of, store_config, twin_batch

from mqk.config import TopicConfig
from mqk.store.adapter import PHYSICAL_SPAN, physical_base, physical_engine
from mqk.store.manager import StoreManager

T = "orders"


async def _append(h: Harness, values: list[bytes], queue: int = 0, topic: str = T) -> tuple[int, int]:
    """(base offset, physical offset) of one appended batch."""
    assert h.engine is not None
    result = await h.engine.append(topic, queue, [twin_batch(values)])
    return result.base_offset, result.physical_offset


def _values(found: tuple) -> list[bytes | None]:
    return [value for _offset, _ts, value in records_of(found[2].data)]


async def test_read_at_finds_each_batch_and_survives_restart(harness: Harness) -> None:
    engine = harness.engine
    assert engine is not None
    await engine.create_shards(T, 2, TopicConfig())
    await engine.create_shards("other", 1, TopicConfig())
    written = []
    for i in range(40):  # enough to cross the file engine's 4 KiB CommitLog segments
        topic, queue = ("other", 0) if i % 5 == 0 else (T, i % 2)
        values = [b"m%03d-%d" % (i, k) * 8 for k in range(1 + i % 3)]
        base, phys = await _append(harness, values, queue, topic)
        written.append((topic, queue, base, phys, values))
    physs = [w[3] for w in written]
    assert len(set(physs)) == len(physs) and all(p >= 0 for p in physs)
    # the engine's values lie in its own part of the id space, so the manager can route them
    assert all(physical_engine(p) == harness.name for p in physs)
    assert all(physical_base(harness.name) <= p < physical_base(harness.name) + PHYSICAL_SPAN for p in physs)

    async def check() -> None:
        assert harness.engine is not None
        for topic, queue, base, phys, values in written:
            found = await harness.engine.read_at(phys)
            assert found is not None, (topic, queue, base, phys)
            assert found[:2] == (topic, queue)
            assert found[2].base_offset == base and found[2].physical_offset == phys
            assert _values(found) == values
            # the same batch as `read` serves, with the same physical offset (message ids agree)
            read = await harness.engine.read(topic, queue, base, 1)
            assert read.batches[0].physical_offset == phys

    await check()
    if harness.durable:
        await harness.restart()
        await check()
        # offsets handed out after the restart never reuse one handed out before
        _base, phys = await _append(harness, [b"after restart"])
        assert phys not in physs
        found = await harness.engine.read_at(phys)
        assert found is not None and _values(found) == [b"after restart"]


async def test_read_at_refuses_offsets_that_name_nothing(harness: Harness) -> None:
    engine = harness.engine
    assert engine is not None
    await engine.create_shards(T, 1, TopicConfig())
    physs = [(await _append(harness, [b"a" * 50, b"b" * 50, b"c" * 50]))[1] for _ in range(5)]
    own = physical_base(harness.name)
    other = physical_base("memory" if harness.name != "memory" else "file")
    bad = [
        -1,
        -(1 << 62),
        other,
        other + physs[0] - own,
        physs[0] + 1,
        physs[0] + 2,
        physs[-1] + 100_000,
        own + PHYSICAL_SPAN - 1,
        1 << 63,
        (1 << 64) - 1,
    ]
    if harness.name == "file":
        bad.append(physs[1] - 1)  # the last bytes of the entry before: inside an entry, not at its start
    for value in bad:
        assert await engine.read_at(value) is None, value
    if harness.durable:
        engine = await harness.restart()
        for value in bad:
            assert await engine.read_at(value) is None, value
    assert await engine.read_at(physs[2]) is not None


async def test_read_at_respects_log_start_and_topic_incarnation(harness: Harness) -> None:
    engine = harness.engine
    assert engine is not None
    await engine.create_shards(T, 1, TopicConfig())
    first = [await _append(harness, [b"v%d" % i]) for i in range(6)]
    await engine.delete_before(T, 0, first[3][0])
    for base, phys in first:
        found = await engine.read_at(phys)
        assert (found is not None) == (base >= first[3][0]), (base, phys)
    if harness.durable:
        engine = await harness.restart()
        for base, phys in first:
            assert (await engine.read_at(phys) is not None) == (base >= first[3][0])
    # a topic deleted and re-created under the same name: the old ids name nothing, the new ones the new data
    await engine.delete_shards(T)
    for _base, phys in first:
        assert await engine.read_at(phys) is None
    if harness.durable:  # the deleted batches were the last ones: their values must still never come back
        engine = await harness.restart()
    await engine.create_shards(T, 1, TopicConfig())
    second = [await _append(harness, [b"w%d" % i]) for i in range(6)]
    assert {b for b, _p in second} == {b for b, _p in first}  # same queue offsets as the old incarnation
    assert not {p for _b, p in second} & {p for _b, p in first}
    for _base, phys in first:
        assert await engine.read_at(phys) is None
    for i, (_base, phys) in enumerate(second):
        found = await engine.read_at(phys)
        assert found is not None and _values(found) == [b"w%d" % i]
    if harness.durable:
        engine = await harness.restart()
        for i, (_base, phys) in enumerate(second):
            found = await engine.read_at(phys)
            assert found is not None and _values(found) == [b"w%d" % i]


async def test_file_read_at_refuses_a_damaged_entry(tmp_path: Path) -> None:
    """The CRC is checked: a flipped byte in a batch makes its offset name nothing (after a restart, which
    would otherwise serve the mapping as it is on disk)."""
    h = Harness("file", tmp_path / "data")
    engine = await h.open()
    try:
        await engine.create_shards(T, 1, TopicConfig())
        kept_base, kept = await _append(h, [b"kept"])
        _base, phys = await _append(h, [b"to be damaged" * 4])
        found = await engine.read_at(phys)
        assert found is not None
        data = found[2].data
        assert isinstance(data, memoryview)
        data[-3] ^= 0xFF  # in the mapping, as a bad disk would
        assert await engine.read_at(phys) is None
        found = await engine.read_at(kept)
        assert found is not None and found[2].base_offset == kept_base
    finally:
        await h.close()


async def test_manager_routes_read_at_by_engine(tmp_path: Path) -> None:
    """One StoreManager holding topics on all three engines: every append's physical offset routes back to the
    engine that issued it; a topic deleted and re-created on another engine does not own the old ids."""
    config = dataclasses.replace(store_config("file", tmp_path / "data"))
    store = StoreManager(config)
    await store.start()
    try:
        ids = {}
        for name in ("file", "memory", "rocksdb"):
            await store.create_topic(f"t-{name}", 1, TopicConfig({"storage.type": name}))
            result = await store.append(f"t-{name}", 0, [twin_batch([name.encode()])])
            assert physical_engine(result.physical_offset) == name
            ids[name] = result.physical_offset
        for name, phys in ids.items():
            found = await store.read_at(phys)
            assert found is not None and found[:2] == (f"t-{name}", 0) and _values(found) == [name.encode()]
        await store.delete_topic("t-memory")
        await store.create_topic("t-memory", 1, TopicConfig({"storage.type": "rocksdb"}))
        assert await store.read_at(ids["memory"]) is None
        assert await store.read_at(-5) is None and await store.read_at(7 << 48) is None
    finally:
        await store.close()
    store = StoreManager(config)
    await store.start()
    try:
        for name in ("file", "rocksdb"):
            found = await store.read_at(ids[name])
            assert found is not None and _values(found) == [name.encode()]
    finally:
        await store.close()
