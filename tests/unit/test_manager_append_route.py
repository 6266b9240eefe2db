"""StoreManager.append keeps a per-topic route (ShardInfo, engine, LogAppendTime) between calls: every topic change
(config, partitions, delete, re-create) and a close must be seen by the very next append."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqk._fast import twin
from mqk.config import StoreConfig, TopicConfig
from mqk.errors import StorageError, UnknownShard
from mqk.store.manager import StoreManager

rb = twin("recbatch")


def _batch(value: bytes) -> bytearray:
    record = rb.encode_record(0, 0, None, value, [])
    return rb.build_batch(0, 1_000, 1_000, record, 1, 0)


@pytest.fixture(params=["memory", "file"])
async def store(request, tmp_path: Path):
    m = StoreManager(StoreConfig(data_dir=tmp_path / "data", storage=request.param))
    await m.start()
    yield m
    await m.close()


async def _max_ts(store: StoreManager, topic: str, queue: int, offset: int) -> int:
    result = await store.read(topic, queue, offset, 1 << 20)
    return result.batches[0].max_timestamp


async def test_config_change_reaches_the_next_append(store: StoreManager) -> None:
    await store.create_topic("t", 1)
    await store.append("t", 0, [_batch(b"a")])
    assert await _max_ts(store, "t", 0, 0) == 1_000  # CreateTime: the producer's timestamp
    await store.alter_topic_config("t", TopicConfig({"message.timestamp.type": "LogAppendTime"}))
    result = await store.append("t", 0, [_batch(b"b")])
    assert result.base_offset == 1
    assert await _max_ts(store, "t", 0, 1) == result.log_append_time > 1_000
    await store.alter_topic_config("t", TopicConfig({"message.timestamp.type": "CreateTime"}))
    await store.append("t", 0, [_batch(b"c")])
    assert await _max_ts(store, "t", 0, 2) == 1_000


async def test_partitions_delete_and_recreate_reach_the_next_append(store: StoreManager) -> None:
    await store.create_topic("t", 1)
    await store.append("t", 0, [_batch(b"a")])
    with pytest.raises(UnknownShard):
        await store.append("t", 1, [_batch(b"a")])
    await store.add_partitions("t", 2)
    assert (await store.append("t", 1, [_batch(b"a")])).base_offset == 0
    with pytest.raises(UnknownShard):
        await store.append("t", 2, [_batch(b"a")])
    with pytest.raises(UnknownShard):
        await store.append("t", -1, [_batch(b"a")])
    await store.delete_topic("t")
    with pytest.raises(UnknownShard):
        await store.append("t", 0, [_batch(b"a")])
    await store.create_topic("t", 1)
    assert (await store.append("t", 0, [_batch(b"b")])).base_offset == 0


async def test_append_after_close_is_refused(store: StoreManager) -> None:
    await store.create_topic("t", 1)
    await store.append("t", 0, [_batch(b"a")])
    await store.close()
    with pytest.raises(StorageError):
        await store.append("t", 0, [_batch(b"a")])
