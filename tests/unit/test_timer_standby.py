"""The timer of a cluster broker (TimerService standby=True) and its state document in the log (store.statelog):
it delivers only while master, keeps its progress as `__mqk_timer_state` records instead of a side file, and a new
master (a second timer over the same log, as a replica that took over would have it) goes on from there: nothing
delivered twice, an open intent settled, nothing appended by a broker that is not master. Time is a FakeClock."""

from __future__ import annotations

import asyncio
import logging

import pytest
from helpers import queue_reaches

from mqk._fast import load
from mqk.clock import FakeClock, settle
from mqk.config import BrokerConfig
from mqk.protocol.native.records import batch_to_messages, message_to_batch
from mqk.store.manager import StoreManager
from mqk.store.statelog import LogStateDocs
from mqk.timer import TIMER_STATE_TOPIC, TIMER_TOPIC, TimerService

recbatch = load("recbatch")
LATER = 3600.0


class Mastership:
    """What `may_deliver` asks: whether this broker is master now."""

    def __init__(self, now: bool = True) -> None:
        self.now = now

    def __call__(self) -> bool:
        return self.now


def standby(store: StoreManager, clock: FakeClock, master: Mastership | None = None) -> TimerService:
    return TimerService(BrokerConfig(), store, clock=clock, standby=True, may_deliver=master or Mastership())


async def bodies(store: StoreManager, topic: str) -> list[bytes]:
    if store.end_offset(topic, 0) == 0:
        return []
    result = await store.read(topic, 0, 0, 1 << 30)
    out = []
    for batch in result.batches:
        out += [m.body for m in batch_to_messages(batch.data, topic, 0, 0, -1, ("127.0.0.1", 1))]
    return out


async def delay(store: StoreManager, topic: str, body: bytes, ms: int) -> None:
    props = {"TIMER_DELAY_MS": str(ms)}
    await store.append(topic, 0, [message_to_batch(body, props, 0)], properties=props)


async def saved(store: StoreManager) -> dict:
    doc = await LogStateDocs(store, TIMER_STATE_TOPIC).load("timer")
    assert doc is not None
    return doc


async def test_standby_takes_delayed_messages_and_delivers_only_once_active(
    memory_store: StoreManager, mqk_fake_clock: FakeClock
) -> None:
    clock = mqk_fake_clock
    timer = await standby(memory_store, clock).start()
    try:
        await memory_store.create_topic("t", 1)
        await delay(memory_store, "t", b"x", 100)
        assert memory_store.end_offset(TIMER_TOPIC, 0) == 1  # durable in the timer topic, as on a master
        await clock.advance(1.0)
        assert await bodies(memory_store, "t") == [] and not timer.active
        await timer.activate(1)
        await queue_reaches(memory_store, "t", 0, 1)
        assert await bodies(memory_store, "t") == [b"x"]
        await settle()
        assert (await saved(memory_store))["floor"] == 1
        assert memory_store.load_state("timer") is None  # no side file
        info = memory_store.topic(TIMER_STATE_TOPIC)
        assert info is not None and info.config.compacted
    finally:
        await timer.stop()


async def test_a_new_master_goes_on_from_the_log_and_delivers_each_once(
    memory_store: StoreManager, mqk_fake_clock: FakeClock
) -> None:
    clock = mqk_fake_clock
    old = await standby(memory_store, clock).start()
    await old.activate(1)
    await memory_store.create_topic("t", 1)
    await delay(memory_store, "t", b"early", 100)
    await delay(memory_store, "t", b"pending", 1000)
    await clock.advance(0.1)
    await queue_reaches(memory_store, "t", 0, 1)
    await settle()
    state_end = memory_store.end_offset(TIMER_STATE_TOPIC, 0)
    await old.deactivate()  # it lost its mastership
    await old.stop()
    assert memory_store.end_offset(TIMER_STATE_TOPIC, 0) == state_end  # it appended nothing on the way out

    new = await standby(memory_store, clock).start()
    try:
        await new.activate(2)
        await settle()
        assert new.pending == 1  # "early" is known as delivered from the log
        await clock.advance(0.899)
        assert await bodies(memory_store, "t") == [b"early"]
        await clock.advance(0.001)
        await queue_reaches(memory_store, "t", 0, 2)
        await clock.advance(LATER)
        assert await bodies(memory_store, "t") == [b"early", b"pending"]
        assert (await saved(memory_store))["floor"] == 2
    finally:
        await new.stop()


async def test_an_intent_cut_short_by_a_failover_is_settled_by_the_new_master(
    memory_store: StoreManager, mqk_fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mqk.timer.service as service

    clock = mqk_fake_clock
    await memory_store.create_topic("s", 1)
    old = await standby(memory_store, clock).start()
    await old.activate(1)
    original = memory_store.append
    stuck = asyncio.Event()

    async def append_then_hang(topic, queue, batches, **kw):
        result = await original(topic, queue, batches, **kw)
        if topic == "s" and service.DELIVERING.get():
            stuck.set()
            await asyncio.Event().wait()  # landed (and replicated), but the old master never hears back
        return result

    monkeypatch.setattr(memory_store, "append", append_then_hang)
    await delay(memory_store, "s", b"once", 50)
    await clock.advance(0.05)
    await asyncio.wait_for(stuck.wait(), 10)
    await old.deactivate()
    await old.stop()
    monkeypatch.setattr(memory_store, "append", original)
    assert len((await saved(memory_store))["intent"]) == 1  # the intent was in the log before the append

    new = await standby(memory_store, clock).start()
    try:
        await new.activate(2)
        await settle()
        assert new.pending == 0  # settled: its batch is in the real queue
        await clock.advance(LATER)
        assert await bodies(memory_store, "s") == [b"once"]
    finally:
        await new.stop()


async def test_nothing_is_appended_while_this_broker_is_not_master(
    memory_store: StoreManager, mqk_fake_clock: FakeClock
) -> None:
    clock = mqk_fake_clock
    master = Mastership(now=False)
    timer = await standby(memory_store, clock, master).start()
    try:
        await memory_store.create_topic("t", 1)
        await delay(memory_store, "t", b"x", 100)
        await timer.activate(1)  # (the hook fired, but the view does not show it as master)
        await clock.advance(10.0)
        assert await bodies(memory_store, "t") == []
        assert memory_store.end_offset(TIMER_STATE_TOPIC, 0) == 0
        master.now = True
        await clock.advance(1.0)
        await queue_reaches(memory_store, "t", 0, 1)
        assert await bodies(memory_store, "t") == [b"x"]
    finally:
        await timer.stop()


async def test_retention_pin_is_the_floor_in_the_log(memory_store: StoreManager, mqk_fake_clock: FakeClock) -> None:
    clock = mqk_fake_clock
    timer = await standby(memory_store, clock).start()
    try:
        assert await timer.retention_pins() == {(TIMER_TOPIC, 0): 0}
        await timer.activate(1)
        await memory_store.create_topic("t", 1)
        await delay(memory_store, "t", b"a", 10)
        await delay(memory_store, "t", b"b", 10)
        await delay(memory_store, "t", b"c", 10_000)
        await clock.advance(0.01)
        await queue_reaches(memory_store, "t", 0, 2)
        await settle()
        assert await timer.retention_pins() == {(TIMER_TOPIC, 0): 2}
        await timer.deactivate()
        assert await timer.retention_pins() == {(TIMER_TOPIC, 0): 2}  # read back from the log
    finally:
        await timer.stop()


# --- the state document in the log ------------------------------------------------------------------------------


async def test_log_state_docs_last_record_of_a_name_wins(memory_store: StoreManager) -> None:
    docs = LogStateDocs(memory_store, "__docs")
    assert await docs.load("a") is None  # no topic yet
    await docs.prepare()
    info = memory_store.topic("__docs")
    assert info is not None and info.config.compacted
    assert await docs.load("a") is None
    await docs.save("a", {"v": 1})
    await docs.save("a", {"v": 2})
    assert await docs.load("a") == {"v": 2}
    await docs.save("b", {"w": [1, 2]})
    assert await docs.load("a") == {"v": 2}  # (found by a scan: the last record is b's)
    assert await docs.load("b") == {"w": [1, 2]}
    with pytest.raises(TypeError):
        await docs.save("a", {"bad": object()})
    assert memory_store.end_offset("__docs", 0) == 3


async def test_log_state_docs_save_many_lands_in_one_batch_and_load_all_honours_tombstones(
    memory_store: StoreManager,
) -> None:
    docs = LogStateDocs(memory_store, "__docs")
    assert await docs.load_all() == {}  # no topic yet
    await docs.prepare()
    await docs.save_many({"a": {"v": 1}, "b": {"v": 1}, "c": {"v": 1}})
    assert memory_store.end_offset("__docs", 0) == 3
    assert len((await memory_store.read("__docs", 0, 0, 1 << 20)).batches) == 1  # (all or nothing)
    await docs.save_many({"b": None, "c": {"v": 2}})
    assert await docs.load_all() == {"a": {"v": 1}, "c": {"v": 2}}
    assert await docs.load("c") == {"v": 2}
    with pytest.raises(TypeError):
        await docs.save_many({"d": {"v": 1}, "e": {"bad": object()}})
    assert memory_store.end_offset("__docs", 0) == 5  # the bad batch appended nothing


async def test_log_state_docs_skip_malformed_records_with_a_log_line(
    memory_store: StoreManager, caplog: pytest.LogCaptureFixture
) -> None:
    docs = LogStateDocs(memory_store, "__docs")
    await docs.prepare()
    await docs.save("timer", {"floor": 4})
    for value in (b"{not json", b"[1, 2]"):
        record = recbatch.encode_record(0, 0, b"timer", value, [])
        await memory_store.append("__docs", 0, [recbatch.build_batch(0, 0, 0, record, 1, 0)])
    with caplog.at_level(logging.WARNING, logger="mqk.state"):
        assert await docs.load("timer") == {"floor": 4}
    assert docs.skipped == 2
    assert [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()] == [
        "state: record at offset 1: not JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
        "(char 1)) in __docs skipped",
        "state: record at offset 2: not a JSON object in __docs skipped",
    ]
