"""Delayed delivery: due-time rules, the put-hook reroute, on-time delivery, and restart without loss or duplicates
(memory StoreManager, no server)."""
from __future__ import annotations

import asyncio
import time

import pytest

from mqk._fast import load
from mqk.config import BrokerConfig, StoreConfig
from mqk.errors import PutRejected
from mqk.protocol.native.records import batch_to_messages, message_to_batch, tags_code_for
from mqk.store.manager import StoreManager
from mqk.timer import TIMER_TOPIC, TimerService, due_time
from mqk.timer.delay import Waiting, batch_due_time, unwrap, wrap

recbatch = load("recbatch")


def now_ms() -> int:
    return int(time.time() * 1000)


def test_due_time_rules() -> None:
    assert due_time({}, 1000) is None
    assert due_time({"DELAY": "1"}, 1000) == 2000
    assert due_time({"DELAY": "3"}, 0) == 10_000
    assert due_time({"DELAY": "18"}, 0) == 2 * 3600 * 1000
    assert due_time({"DELAY": "99"}, 0) == 2 * 3600 * 1000  # clamped to the last level, as RocketMQ does
    assert due_time({"DELAY": "0"}, 0) is None
    assert due_time({"__STARTDELIVERTIME": "5000"}, 0) == 5000
    assert due_time({"TIMER_DELIVER_MS": "7000"}, 0) == 7000
    assert due_time({"TIMER_DELAY_SEC": "3"}, 100) == 3100
    assert due_time({"mqk-deliver-at": b"9000"}, 0) == 9000
    assert due_time({"mqk-delay-ms": (250).to_bytes(8, "big")}, 100) == 350
    assert due_time({"mqk-delay-ms": b"garbage"}, 100) is None


def test_batch_due_time_kafka_records() -> None:
    records = (recbatch.encode_record(0, 0, None, b"a", [("mqk-delay-ms", b"500")])
               + recbatch.encode_record(1, 0, None, b"b", [("mqk-delay-ms", b"900")]))
    batch = recbatch.build_batch(0, 0, 0, records, 2, 1)
    assert batch_due_time(batch, 1000) == 1900  # the whole batch waits for its latest record
    plain = recbatch.build_batch(0, 0, 0, recbatch.encode_record(0, 0, None, b"x", []), 1, 0)
    assert batch_due_time(plain, 1000) is None


def test_wrap_round_trip() -> None:
    inner = bytes(message_to_batch(b"body", {"TAGS": "t"}, 5))
    waiting = [Waiting("real", 2, 12345, -7, (b"k1", b"k2"), inner), Waiting("other", 0, 1, 0, (), inner)]
    wrapped = wrap(waiting, 99)
    recbatch.set_base_offset(wrapped, 0, 40)
    assert list(unwrap(wrapped)) == [(40, waiting[0]), (41, waiting[1])]
    assert list(unwrap(wrapped, 41)) == [(41, waiting[1])]


@pytest.fixture
async def store():
    manager = StoreManager(StoreConfig(storage="memory"))
    await manager.start()
    yield manager
    await manager.close()


async def _bodies(store: StoreManager, topic: str, queue: int = 0) -> list[bytes]:
    if store.end_offset(topic, queue) == 0:
        return []
    result = await store.read(topic, queue, 0, 1 << 30)
    out = []
    for batch in result.batches:
        out += [m.body for m in batch_to_messages(batch.data, topic, queue, 0, -1, ("127.0.0.1", 1))]
    return out


async def _wait_end(store: StoreManager, topic: str, end: int, seconds: float) -> None:
    """Wait until queue 0 of `topic` ends at `end` or later; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while store.end_offset(topic, 0) < end:
        assert time.monotonic() < deadline, f"{topic}/0 did not reach offset {end} within {seconds} s"
        await asyncio.sleep(0.02)


async def test_delayed_message_waits_then_arrives_once(store: StoreManager) -> None:
    timer = await TimerService(BrokerConfig(), store).start()
    try:
        await store.create_topic("t", 1)
        due = now_ms() + 400
        props = {"TIMER_DELIVER_MS": str(due), "TAGS": "x"}
        result = await store.append("t", 0, [message_to_batch(b"later", props, now_ms())], properties=props,
                                    tags_code=tags_code_for(props), keys=[b"k9"])
        await store.append("t", 0, [message_to_batch(b"now", {}, now_ms())])
        assert await _bodies(store, "t") == [b"now"]
        assert store.end_offset(TIMER_TOPIC, 0) == 1 and result.base_offset == 0
        while now_ms() < due - 50:
            assert await _bodies(store, "t") == [b"now"]  # not visible before its time
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + 3
        while await _bodies(store, "t") != [b"now", b"later"]:
            assert time.monotonic() < deadline, "delayed message not delivered within 3 s"
            await asyncio.sleep(0.02)
        assert now_ms() >= due
        stored = (await store.read("t", 0, 1, 1 << 20)).batches[0]
        assert stored.tags_code == tags_code_for(props) != 0  # the tags code travels with it
        assert [q for q, _ in await store.read_by_key("t", b"k9", 10)] == [0]  # and the keys
        await asyncio.sleep(0.3)
        assert await _bodies(store, "t") == [b"now", b"later"]
    finally:
        await timer.stop()


async def test_kafka_header_delay_and_max_delay(store: StoreManager) -> None:
    timer = await TimerService(BrokerConfig(timer_max_delay_ms=10_000), store).start()
    try:
        await store.create_topic("k", 1)
        rec = recbatch.encode_record(0, 0, b"key", b"kafka", [("mqk-delay-ms", b"200")])
        await store.append("k", 0, [recbatch.build_batch(0, now_ms(), now_ms(), rec, 1, 0)])
        assert store.end_offset("k", 0) == 0
        too_far = recbatch.encode_record(0, 0, None, b"x", [("mqk-delay-ms", b"20000")])
        with pytest.raises(PutRejected):
            await store.append("k", 0, [recbatch.build_batch(0, 0, 0, too_far, 1, 0)])
        await _wait_end(store, "k", 1, 3)
        assert await _bodies(store, "k") == [b"kafka"]
    finally:
        await timer.stop()


async def test_a_screened_append_is_taken_at_its_word(store: StoreManager) -> None:
    """The Kafka produce check tells the hook whether a record carries a delay header (PutContext.delay_headers):
    False is trusted (no walk, no decompression), True and None make the hook look. A batch that does carry a
    delay header shows which answer was used."""
    timer = await TimerService(BrokerConfig(), store).start()
    try:
        await store.create_topic("s", 1)
        rec = recbatch.encode_record(0, 0, None, b"x", [("mqk-delay-ms", b"60000")])
        batch = recbatch.build_batch(0, now_ms(), now_ms(), rec, 1, 0)
        await store.append("s", 0, [batch], delay_headers=False)
        assert store.end_offset("s", 0) == 1 and store.end_offset(TIMER_TOPIC, 0) == 0
        await store.append("s", 0, [batch], delay_headers=True)
        await store.append("s", 0, [batch])
        assert store.end_offset("s", 0) == 1 and store.end_offset(TIMER_TOPIC, 0) == 2
        results = await store.append_many("s", [(0, [batch]), (0, [batch])], delay_headers=[True, False])
        assert [r.__class__.__name__ for r in results] == ["AppendResult", "AppendResult"]
        assert store.end_offset("s", 0) == 2 and store.end_offset(TIMER_TOPIC, 0) == 3
    finally:
        await timer.stop()


async def test_one_delayed_partition_among_many_is_still_rerouted(store: StoreManager) -> None:
    """append_many with the check's answers: the entries said to carry no delay header skip the timer's hook (no
    context at all), the one said to carry one is still rerouted to the timer topic."""
    timer = await TimerService(BrokerConfig(), store).start()
    try:
        await store.create_topic("m", 3)
        delayed = recbatch.build_batch(0, now_ms(), now_ms(),
                                       recbatch.encode_record(0, 0, None, b"later", [("mqk-delay-ms", b"60000")]), 1, 0)
        plain = recbatch.build_batch(0, now_ms(), now_ms(), recbatch.encode_record(0, 0, None, b"now", []), 1, 0)
        results = await store.append_many("m", [(0, [plain]), (1, [delayed]), (2, [plain])],
                                          delay_headers=[False, True, False])
        assert [r.__class__.__name__ for r in results] == ["AppendResult"] * 3
        assert [store.end_offset("m", q) for q in range(3)] == [1, 0, 1]
        assert store.end_offset(TIMER_TOPIC, 0) == 1
    finally:
        await timer.stop()


async def test_many_due_at_once_all_delivered(store: StoreManager) -> None:
    timer = await TimerService(BrokerConfig(), store).start()
    try:
        await store.create_topic("bulk", 2)
        due = now_ms() + 300
        for i in range(300):
            props = {"__STARTDELIVERTIME": str(due)}
            await store.append("bulk", i % 2, [message_to_batch(b"%d" % i, props, 0)], properties=props)
        deadline = time.monotonic() + 5
        while store.end_offset("bulk", 0) + store.end_offset("bulk", 1) < 300:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        got = sorted(await _bodies(store, "bulk", 0) + await _bodies(store, "bulk", 1), key=int)
        assert got == [b"%d" % i for i in range(300)]
        assert timer.pending == 0
    finally:
        await timer.stop()


async def test_restart_keeps_pending_and_does_not_redeliver(store: StoreManager) -> None:
    await store.create_topic("r", 1)
    timer = await TimerService(BrokerConfig(), store).start()
    props_soon = {"TIMER_DELAY_MS": "100"}
    await store.append("r", 0, [message_to_batch(b"soon", props_soon, 0)], properties=props_soon)
    props_late = {"TIMER_DELAY_MS": "1200"}
    await store.append("r", 0, [message_to_batch(b"late", props_late, 0)], properties=props_late)
    await _wait_end(store, "r", 1, 3)
    await timer.stop()  # "late" is still waiting
    assert await _bodies(store, "r") == [b"soon"]

    timer = await TimerService(BrokerConfig(), store).start()
    try:
        assert timer.pending == 1
        await _wait_end(store, "r", 2, 4)
        await asyncio.sleep(0.2)
        assert await _bodies(store, "r") == [b"soon", b"late"]
    finally:
        await timer.stop()


async def test_crash_mid_delivery_settles_intents(store: StoreManager) -> None:
    """State saved with an intent: if the batch landed it is not delivered again; if not, it is."""
    await store.create_topic("c", 1)
    timer = await TimerService(BrokerConfig(), store).start()
    await timer.stop()  # hook removed: we drive the timer topic by hand
    hook_timer = TimerService(BrokerConfig(), store)
    landed = bytes(message_to_batch(b"landed", {}, 0))
    lost = bytes(message_to_batch(b"lost", {}, 1))
    past = now_ms() - 1000
    await store.append(TIMER_TOPIC, 0, [wrap([Waiting("c", 0, past, 0, (), landed)], past)])
    await store.append(TIMER_TOPIC, 0, [wrap([Waiting("c", 0, past, 0, (), lost)], past)])
    await store.append("c", 0, [bytearray(landed)])  # the crash came after this append...
    await store.save_state("timer", {"floor": 0, "done": [], "intent": {"0": ["c", 0, 0], "1": ["c", 0, 1]}})
    await hook_timer.start()  # ...and before the "done" save
    try:
        await _wait_end(store, "c", 2, 3)
        await asyncio.sleep(0.2)
        assert await _bodies(store, "c") == [b"landed", b"lost"]
        assert store.load_state("timer")["floor"] == 2
    finally:
        await hook_timer.stop()


async def test_file_store_restart_delivers_once(tmp_path) -> None:
    """A real restart: the waiting message and the timer state come back from disk."""
    config = StoreConfig(storage="file", data_dir=tmp_path / "data", commitlog_segment_bytes=1 << 20)
    store = StoreManager(config)
    await store.start()
    timer = await TimerService(BrokerConfig(store=config), store).start()
    await store.create_topic("f", 1)
    for body, delay in ((b"first", "100"), (b"second", "1500")):
        props = {"TIMER_DELAY_MS": delay}
        await store.append("f", 0, [message_to_batch(body, props, 0)], properties=props)
    await _wait_end(store, "f", 1, 3)
    await timer.stop()
    await store.close()

    store = StoreManager(config)
    await store.start()
    timer = await TimerService(BrokerConfig(store=config), store).start()
    try:
        assert await _bodies(store, "f") == [b"first"] and timer.pending == 1
        await _wait_end(store, "f", 2, 4)
        await asyncio.sleep(0.2)
        assert await _bodies(store, "f") == [b"first", b"second"]
    finally:
        await timer.stop()
        await store.close()


async def test_payloads_beyond_the_memory_budget_are_reread(store: StoreManager, monkeypatch) -> None:
    import mqk.timer.service as service

    monkeypatch.setattr(service, "PAYLOAD_BUDGET", 0)
    timer = await TimerService(BrokerConfig(), store).start()
    try:
        await store.create_topic("budget", 1)
        for i in range(5):
            props = {"TIMER_DELAY_MS": "150", "KEYS": f"key{i}"}
            await store.append("budget", 0, [message_to_batch(b"%d" % i, props, 0)], properties=props,
                               keys=[f"key{i}".encode()])
        assert timer._payloads == {}
        await _wait_end(store, "budget", 5, 3)
        assert await _bodies(store, "budget") == [b"0", b"1", b"2", b"3", b"4"]
        assert [q for q, _ in await store.read_by_key("budget", b"key3", 5)] == [0]
    finally:
        await timer.stop()


async def test_stop_in_the_middle_of_a_burst_keeps_its_intent(store: StoreManager, monkeypatch) -> None:
    import mqk.timer.service as service

    await store.create_topic("s", 1)
    timer = await TimerService(BrokerConfig(), store).start()
    original = store.append
    stuck = asyncio.Event()

    async def slow_append(topic, queue, batches, **kw):
        result = await original(topic, queue, batches, **kw)
        if topic == "s" and service.DELIVERING.get():
            stuck.set()
            await asyncio.Event().wait()  # landed, but the deliverer never hears back
        return result

    monkeypatch.setattr(store, "append", slow_append)
    props = {"TIMER_DELAY_MS": "50"}
    await original("s", 0, [message_to_batch(b"once", props, 0)], properties=props)
    await asyncio.wait_for(stuck.wait(), 5)
    await timer.stop()
    assert len(store.load_state("timer")["intent"]) == 1
    monkeypatch.setattr(store, "append", original)

    timer = await TimerService(BrokerConfig(), store).start()
    try:
        await asyncio.sleep(0.5)
        assert await _bodies(store, "s") == [b"once"] and timer.pending == 0
    finally:
        await timer.stop()


async def test_a_hook_that_copies_batches_cannot_make_delivery_loop(store: StoreManager) -> None:
    def copying_hook(ctx) -> None:
        ctx.batches = [bytearray(b) for b in ctx.batches]

    store.hooks.append(copying_hook)
    timer = await TimerService(BrokerConfig(), store).start()
    store.hooks.remove(copying_hook)
    store.hooks.insert(0, copying_hook)  # runs before the timer's hook
    try:
        await store.create_topic("cp", 1)
        props = {"TIMER_DELAY_MS": "50"}
        await store.append("cp", 0, [message_to_batch(b"once", props, 0)], properties=props)
        await _wait_end(store, "cp", 1, 3)
        await asyncio.sleep(0.3)
        assert store.end_offset("cp", 0) == 1 and store.end_offset(TIMER_TOPIC, 0) == 1
    finally:
        store.hooks.remove(copying_hook)
        await timer.stop()
