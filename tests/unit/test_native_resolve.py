"""BrokerContext.resolve: a commit-log offset (what a RocketMQ message id carries) found through store.read_at,
with nothing remembered by this broker context (a fresh one stands for a restarted broker); the LRU only keeps what
read_at cannot name (later records of a multi-record Kafka batch). Memory and file StoreManagers, no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqk._fast import load
from mqk.config import BrokerConfig, StoreConfig
from mqk.protocol.native.records import keys_of, message_to_batch, tags_code_for
from mqk.server.native.context import BrokerContext
from mqk.store.manager import StoreManager

rb = load("recbatch")


@pytest.mark.parametrize("storage", ["memory", "file"])
async def test_resolve_by_read_at_without_any_cache(tmp_path: Path, storage: str) -> None:
    store = StoreManager(StoreConfig(storage=storage, data_dir=tmp_path / "data"))
    await store.start()
    try:
        await store.create_topic("a", 2)
        await store.create_topic("b", 1)
        ids = []
        for i in range(10):
            topic, queue = ("a", i % 2) if i % 3 else ("b", 0)
            props = {"TAGS": f"t{i}", "KEYS": f"k{i}"}
            result = await store.append(
                topic,
                queue,
                [message_to_batch(b"m%d" % i, props, 1000 + i)],
                tags_code=tags_code_for(props),
                keys=keys_of(props),
            )
            ids.append((topic, queue, result.base_offset, result.physical_offset, i))
        ctx = BrokerContext(BrokerConfig(), store)
        for topic, queue, offset, phys, i in ids:
            msg = await ctx.resolve(phys)
            assert msg is not None and (msg.topic, msg.queue_id, msg.queue_offset) == (topic, queue, offset)
            assert msg.body == b"m%d" % i and msg.tags == f"t{i}" and msg.keys == [f"k{i}"]
            assert msg.commit_log_offset == phys
            # a send-back names the topics the message may be in: another topic's message is not it
            assert await ctx.resolve(phys, {"elsewhere"}) is None
            assert (await ctx.resolve(phys, {topic, "%RETRY%g"})) is not None
        assert not ctx._locations  # nothing needed remembering
        assert await ctx.resolve(ids[-1][3] + 1) is None
    finally:
        await store.close()


async def test_later_records_of_a_kafka_batch_resolve_once_read() -> None:
    store = StoreManager(StoreConfig(storage="memory"))
    await store.start()
    try:
        await store.create_topic("k", 1)
        records = b"".join(rb.encode_record(i, i, b"key%d" % i, b"v%d" % i, []) for i in range(3))
        result = await store.append("k", 0, [rb.build_batch(0, 5, 7, records, 3, 2)])
        ctx = BrokerContext(BrokerConfig(), store)
        msgs = await ctx.read_messages("k", 0, 0, 10)
        assert [m.commit_log_offset for m in msgs] == [result.physical_offset + k for k in range(3)]
        for k, m in enumerate(msgs):
            found = await ctx.resolve(m.commit_log_offset)
            assert found is not None and found.body == b"v%d" % k and found.queue_offset == k
    finally:
        await store.close()
