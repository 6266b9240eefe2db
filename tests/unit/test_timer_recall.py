"""Recalling a delayed message (RocketMQ 5's RecallMessage): the recall record in the timer topic, the recalled
message never delivered (and its neighbours delivered on time), a restart that keeps the recall, and the recall
handle's format. The timer runs on a FakeClock, as in test_native_timer.py."""

from __future__ import annotations

import base64

import pytest
from helpers import queue_reaches

from mqk.clock import FakeClock
from mqk.config import BrokerConfig, StoreConfig
from mqk.errors import PutRejected
from mqk.protocol.native.records import batch_to_messages, message_to_batch
from mqk.server.native.recall import RecallHandle
from mqk.store.manager import StoreManager
from mqk.timer import TIMER_TOPIC, TimerService
from mqk.timer.delay import Waiting, recall_record, unique_key, unwrap, wrap


async def _bodies(store: StoreManager, topic: str) -> list[bytes]:
    if store.end_offset(topic, 0) == 0:
        return []
    out = []
    for batch in (await store.read(topic, 0, 0, 1 << 30)).batches:
        out += [m.body for m in batch_to_messages(batch.data, topic, 0, 0, -1, ("127.0.0.1", 1))]
    return out


async def _send(store: StoreManager, topic: str, body: bytes, key: str, due: int) -> None:
    props = {"TIMER_DELIVER_MS": str(due), "UNIQ_KEY": key}
    await store.append(topic, 0, [message_to_batch(body, props, 0)], properties=props)


def test_a_recall_record_round_trips_and_names_no_batch() -> None:
    inner = bytes(message_to_batch(b"body", {"UNIQ_KEY": "AC11"}, 5))
    wrapped = wrap([Waiting("real", 0, 500, 0, (), inner), recall_record("real", 500, "AC11")], 0)
    got = [w for _offset, w in unwrap(wrapped)]
    assert got[1] == recall_record("real", 500, "AC11") and got[1].batch == b"" and got[1].recalls == "AC11"
    assert not got[0].recalls and unique_key(got[0].batch) == "AC11"
    assert unique_key(bytes(message_to_batch(b"no key", {}, 0))) is None


async def test_a_recalled_message_is_not_delivered_and_its_neighbours_are(
    memory_store: StoreManager, mqk_fake_clock: FakeClock
) -> None:
    clock = mqk_fake_clock
    await memory_store.create_topic("r", 1)
    timer = await TimerService(BrokerConfig(), memory_store, clock=clock).start()
    try:
        due = clock.time_ms() + 1000
        await _send(memory_store, "r", b"kept-before", "K1", due)
        await _send(memory_store, "r", b"recalled", "K2", due)
        await _send(memory_store, "r", b"kept-after", "K3", due + 1)
        await timer.recall("r", "K2", due)
        await timer.recall("other-topic", "K3", due + 1)  # the same key in another topic recalls nothing here
        assert memory_store.end_offset(TIMER_TOPIC, 0) == 5
        await clock.advance(1.1)
        await queue_reaches(memory_store, "r", 0, 2)
        assert await _bodies(memory_store, "r") == [b"kept-before", b"kept-after"]
        assert timer.recalled == 1 and timer.pending == 0
        await clock.advance(3600)
        assert await _bodies(memory_store, "r") == [b"kept-before", b"kept-after"]
        assert memory_store.load_state("timer")["floor"] == 5  # the recall records are settled too
        with pytest.raises(PutRejected):
            await timer.recall("r", "", due)
    finally:
        await timer.stop()


async def test_a_recall_survives_a_restart_before_the_due_time(tmp_path, mqk_fake_clock: FakeClock) -> None:
    clock = mqk_fake_clock
    config = StoreConfig(storage="file", data_dir=tmp_path / "data", commitlog_segment_bytes=1 << 20)
    store = StoreManager(config)
    await store.start()
    timer = await TimerService(BrokerConfig(store=config), store, clock=clock).start()
    await store.create_topic("f", 1)
    due = clock.time_ms() + 120_000  # beyond the in-memory horizon: both wait in the spill index
    await _send(store, "f", b"recalled", "A1", due)
    await _send(store, "f", b"kept", "A2", due)
    await timer.recall("f", "A1", due)
    await timer.stop()
    await store.close()

    store = StoreManager(config)
    await store.start()
    timer = await TimerService(BrokerConfig(store=config), store, clock=clock).start()
    await timer.wait_loaded()
    try:
        await clock.advance(121)
        await queue_reaches(store, "f", 0, 1)
        await clock.advance(1)
        assert await _bodies(store, "f") == [b"kept"] and timer.recalled == 1
    finally:
        await timer.stop()
        await store.close()


def test_recall_handles_are_rocketmq_s_format() -> None:
    handle = RecallHandle("topicA", "broker-a", 1_700_000_000_123, "7F0000010001")
    text = handle.encode()
    assert base64.urlsafe_b64decode(text).decode() == "v1 topicA broker-a 1700000000123 7F0000010001"
    assert RecallHandle.decode(text) == handle
    assert RecallHandle.decode(text.rstrip("=")) == handle  # padding may be left out
    for bad in (
        "",
        "!!!",
        base64.urlsafe_b64encode(b"v2 a b 1 c").decode(),
        base64.urlsafe_b64encode(b"v1 a b").decode(),
    ):
        with pytest.raises(ValueError, match="recall handle is invalid"):
            RecallHandle.decode(bad)
