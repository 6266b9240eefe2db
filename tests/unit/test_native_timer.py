"""Delayed delivery: due-time rules, the put-hook reroute, on-time delivery, and restart without loss or duplicates
(memory StoreManager, no server). The timer runs on a FakeClock: a test moves time to just before a due time and
checks nothing was delivered, then to the due time and checks it was."""

from __future__ import annotations

import asyncio

import pytest
from helpers import queue_reaches

from mqk._fast import load
from mqk.clock import FakeClock, settle
from mqk.config import BrokerConfig, StoreConfig
from mqk.errors import Corrupt, PutRejected
from mqk.protocol.native.records import batch_records, batch_to_messages, message_to_batch, tags_code_for
from mqk.store.manager import StoreManager
from mqk.timer import TIMER_TOPIC, TimerService, due_time
from mqk.timer.delay import Waiting, batch_due_time, unwrap, wrap

recbatch = load("recbatch")
#: far past every due time in these tests
LATER = 3600.0


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
    records = recbatch.encode_record(0, 0, None, b"a", [("mqk-delay-ms", b"500")]) + recbatch.encode_record(
        1, 0, None, b"b", [("mqk-delay-ms", b"900")]
    )
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


def test_unwrap_reports_what_it_cannot_read() -> None:
    inner = bytes(message_to_batch(b"body", {}, 5))
    good = Waiting("real", 0, 100, 0, (), inner)
    records = (
        recbatch.encode_record(0, 0, None, b"plain", [])  # no routing headers (a client's record)
        + recbatch.encode_record(1, 0, None, b"not a batch", [(k, v) for k, v in _routing("real")])
        + recbatch.encode_record(2, 0, None, inner, [(k, v) for k, v in _routing("real")])
    )
    stored = recbatch.build_batch(0, 0, 0, records, 3, 2)
    recbatch.set_base_offset(stored, 0, 7)
    with pytest.raises(Corrupt, match="offset 7 lacks its routing headers"):
        list(unwrap(stored))
    unreadable: list[tuple[int, str]] = []
    assert list(unwrap(stored, 0, unreadable)) == [(9, good)]
    assert [offset for offset, _ in unreadable] == [7, 8] and "unreadable" in unreadable[1][1]


def _routing(topic: str, due: int = 100) -> list[tuple[str, bytes]]:
    """The headers `wrap` gives a waiting record (read back from a wrapped batch, so the names stay wrap's)."""
    wrapped = wrap([Waiting(topic, 0, due, 0, (), bytes(message_to_batch(b"x", {}, 0)))], 0)
    _header, records = batch_records(wrapped)
    headers = records[0][5]
    return [(name, value or b"") for name, value in headers]


async def _poison(store: StoreManager) -> None:
    """What `kcat -P -t __mqk_timer` left in the timer topic before clients were kept out of it."""
    plain = recbatch.build_batch(0, 0, 0, recbatch.encode_record(0, 0, None, b"poison", []), 1, 0)
    await store.append(TIMER_TOPIC, 0, [plain])


async def test_an_unreadable_timer_record_is_skipped_at_start(
    memory_store: StoreManager, mqk_fake_clock: FakeClock
) -> None:
    clock = mqk_fake_clock
    await memory_store.create_topic("d", 1)
    await memory_store.create_topic(TIMER_TOPIC, 1)
    await _poison(memory_store)  # offset 0: the record that used to stop the broker from starting
    good = Waiting("d", 0, clock.time_ms() + 500, 0, (), bytes(message_to_batch(b"good", {}, 0)))
    await memory_store.append(TIMER_TOPIC, 0, [wrap([good], clock.time_ms())])
    timer = await _timer(memory_store, clock).start()
    await timer.wait_loaded()  # (the schedule is read from the floor after the start)
    try:
        assert timer.unreadable == 1 and timer.pending == 1
        await clock.advance(0.5)
        assert await _bodies(memory_store, "d") == [b"good"]
        assert memory_store.load_state("timer")["floor"] == 2  # the skipped record counts as done
    finally:
        await timer.stop()
    timer = await _timer(memory_store, clock).start()  # a restart neither counts it again nor redelivers
    await timer.wait_loaded()  # (the schedule is read from the floor after the start)
    try:
        assert timer.unreadable == 0 and timer.pending == 0
    finally:
        await timer.stop()


async def test_an_unreadable_timer_record_does_not_stall_later_ones(
    memory_store: StoreManager, mqk_fake_clock: FakeClock
) -> None:
    clock = mqk_fake_clock
    await memory_store.create_topic("d", 1)
    timer = await _timer(memory_store, clock).start()
    try:
        await _poison(memory_store)
        props = {"TIMER_DELAY_MS": "300"}
        await memory_store.append("d", 0, [message_to_batch(b"later", props, 0)], properties=props)
        # routed, but what it holds is no record batch: delivering it would put garbage in "d"
        garbage = recbatch.encode_record(0, 0, None, b"garbage", _routing("d"))
        await memory_store.append(TIMER_TOPIC, 0, [recbatch.build_batch(0, 0, 0, garbage, 1, 0)])
        await memory_store.append("d", 0, [message_to_batch(b"last", props, 0)], properties=props)
        await clock.advance(0.3)
        assert await _bodies(memory_store, "d") == [b"later", b"last"]
        assert timer.unreadable == 2
    finally:
        await timer.stop()


async def _bodies(memory_store: StoreManager, topic: str, queue: int = 0) -> list[bytes]:
    if memory_store.end_offset(topic, queue) == 0:
        return []
    result = await memory_store.read(topic, queue, 0, 1 << 30)
    out = []
    for batch in result.batches:
        out += [m.body for m in batch_to_messages(batch.data, topic, queue, 0, -1, ("127.0.0.1", 1))]
    return out


def _timer(memory_store: StoreManager, clock: FakeClock, **config: object) -> TimerService:
    return TimerService(BrokerConfig(**config), memory_store, clock=clock)  # type: ignore[arg-type]  # BrokerConfig fields


async def test_delayed_message_waits_then_arrives_once(memory_store: StoreManager, mqk_fake_clock: FakeClock) -> None:
    clock = mqk_fake_clock
    timer = await _timer(memory_store, clock).start()
    try:
        await memory_store.create_topic("t", 1)
        due = clock.time_ms() + 400
        props = {"TIMER_DELIVER_MS": str(due), "TAGS": "x"}
        result = await memory_store.append(
            "t",
            0,
            [message_to_batch(b"later", props, clock.time_ms())],
            properties=props,
            tags_code=tags_code_for(props),
            keys=[b"k9"],
        )
        await memory_store.append("t", 0, [message_to_batch(b"now", {}, clock.time_ms())])
        assert await _bodies(memory_store, "t") == [b"now"]
        assert memory_store.end_offset(TIMER_TOPIC, 0) == 1 and result.base_offset == 0
        await clock.advance(0.399)
        assert await _bodies(memory_store, "t") == [b"now"] and timer.pending == 1  # not visible before its time
        await clock.advance(0.001)
        assert await _bodies(memory_store, "t") == [b"now", b"later"] and timer.pending == 0
        stored = (await memory_store.read("t", 0, 1, 1 << 20)).batches[0]
        assert stored.tags_code == tags_code_for(props) != 0  # the tags code travels with it
        assert [q for q, _ in await memory_store.read_by_key("t", b"k9", 10)] == [0]  # and the keys
        # recorded as delivered: a restart will not deliver it again
        assert memory_store.load_state("timer")["floor"] == 1
        await clock.advance(LATER)
        assert await _bodies(memory_store, "t") == [b"now", b"later"]
    finally:
        await timer.stop()


async def test_kafka_header_delay_and_max_delay(memory_store: StoreManager, mqk_fake_clock: FakeClock) -> None:
    clock = mqk_fake_clock
    timer = await _timer(memory_store, clock, timer_max_delay_ms=10_000).start()
    try:
        await memory_store.create_topic("k", 1)
        rec = recbatch.encode_record(0, 0, b"key", b"kafka", [("mqk-delay-ms", b"200")])
        await memory_store.append("k", 0, [recbatch.build_batch(0, clock.time_ms(), clock.time_ms(), rec, 1, 0)])
        assert memory_store.end_offset("k", 0) == 0
        too_far = recbatch.encode_record(0, 0, None, b"x", [("mqk-delay-ms", b"20000")])
        with pytest.raises(PutRejected):
            await memory_store.append("k", 0, [recbatch.build_batch(0, 0, 0, too_far, 1, 0)])
        await clock.advance(0.199)
        assert memory_store.end_offset("k", 0) == 0 and timer.pending == 1
        await clock.advance(0.001)
        assert await _bodies(memory_store, "k") == [b"kafka"]
    finally:
        await timer.stop()


async def test_a_screened_append_is_taken_at_its_word(memory_store: StoreManager, mqk_fake_clock: FakeClock) -> None:
    """The Kafka produce check tells the hook whether a record carries a delay header (PutContext.delay_headers):
    False is trusted (no walk, no decompression), True and None make the hook look. A batch that does carry a
    delay header shows which answer was used."""
    clock = mqk_fake_clock
    timer = await _timer(memory_store, clock).start()
    try:
        await memory_store.create_topic("s", 1)
        rec = recbatch.encode_record(0, 0, None, b"x", [("mqk-delay-ms", b"60000")])
        batch = recbatch.build_batch(0, clock.time_ms(), clock.time_ms(), rec, 1, 0)
        await memory_store.append("s", 0, [batch], delay_headers=False)
        assert memory_store.end_offset("s", 0) == 1 and memory_store.end_offset(TIMER_TOPIC, 0) == 0
        await memory_store.append("s", 0, [batch], delay_headers=True)
        await memory_store.append("s", 0, [batch])
        assert memory_store.end_offset("s", 0) == 1 and memory_store.end_offset(TIMER_TOPIC, 0) == 2
        results = await memory_store.append_many("s", [(0, [batch]), (0, [batch])], delay_headers=[True, False])
        assert [r.__class__.__name__ for r in results] == ["AppendResult", "AppendResult"]
        assert memory_store.end_offset("s", 0) == 2 and memory_store.end_offset(TIMER_TOPIC, 0) == 3
    finally:
        await timer.stop()


async def test_one_delayed_partition_among_many_is_still_rerouted(
    memory_store: StoreManager, mqk_fake_clock: FakeClock
) -> None:
    """append_many with the check's answers: the entries said to carry no delay header skip the timer's hook (no
    context at all), the one said to carry one is still rerouted to the timer topic."""
    clock = mqk_fake_clock
    timer = await _timer(memory_store, clock).start()
    try:
        await memory_store.create_topic("m", 3)
        now = clock.time_ms()
        delayed = recbatch.build_batch(
            0, now, now, recbatch.encode_record(0, 0, None, b"later", [("mqk-delay-ms", b"60000")]), 1, 0
        )
        plain = recbatch.build_batch(0, now, now, recbatch.encode_record(0, 0, None, b"now", []), 1, 0)
        results = await memory_store.append_many(
            "m", [(0, [plain]), (1, [delayed]), (2, [plain])], delay_headers=[False, True, False]
        )
        assert [r.__class__.__name__ for r in results] == ["AppendResult"] * 3
        assert [memory_store.end_offset("m", q) for q in range(3)] == [1, 0, 1]
        assert memory_store.end_offset(TIMER_TOPIC, 0) == 1
    finally:
        await timer.stop()


async def test_many_due_at_once_all_delivered(memory_store: StoreManager, mqk_fake_clock: FakeClock) -> None:
    clock = mqk_fake_clock
    timer = await _timer(memory_store, clock).start()
    try:
        await memory_store.create_topic("bulk", 2)
        due = clock.time_ms() + 300
        for i in range(300):
            props = {"__STARTDELIVERTIME": str(due)}
            await memory_store.append("bulk", i % 2, [message_to_batch(b"%d" % i, props, 0)], properties=props)
        await clock.advance(0.299)
        assert memory_store.end_offset("bulk", 0) + memory_store.end_offset("bulk", 1) == 0 and timer.pending == 300
        await clock.advance(0.001)
        got = sorted(await _bodies(memory_store, "bulk", 0) + await _bodies(memory_store, "bulk", 1), key=int)
        assert got == [b"%d" % i for i in range(300)]
        assert timer.pending == 0
    finally:
        await timer.stop()


async def test_restart_keeps_pending_and_does_not_redeliver(
    memory_store: StoreManager, mqk_fake_clock: FakeClock
) -> None:
    clock = mqk_fake_clock
    await memory_store.create_topic("r", 1)
    timer = await _timer(memory_store, clock).start()
    props_soon = {"TIMER_DELAY_MS": "100"}
    await memory_store.append("r", 0, [message_to_batch(b"soon", props_soon, 0)], properties=props_soon)
    props_late = {"TIMER_DELAY_MS": "1200"}
    await memory_store.append("r", 0, [message_to_batch(b"late", props_late, 0)], properties=props_late)
    await clock.advance(0.1)
    await timer.stop()  # "late" is still waiting
    assert await _bodies(memory_store, "r") == [b"soon"]

    timer = await _timer(memory_store, clock).start()
    await timer.wait_loaded()  # (the schedule is read from the floor after the start)
    try:
        assert timer.pending == 1
        await clock.advance(1.099)
        assert await _bodies(memory_store, "r") == [b"soon"]
        # due now: delivered after "soon" and nothing else (a redelivered "soon" would have been due at once)
        await clock.advance(0.001)
        assert await _bodies(memory_store, "r") == [b"soon", b"late"]
        assert timer.pending == 0 and memory_store.load_state("timer")["floor"] == 2
    finally:
        await timer.stop()


async def test_crash_mid_delivery_settles_intents(memory_store: StoreManager, mqk_fake_clock: FakeClock) -> None:
    """State saved with an intent: if the batch landed it is not delivered again; if not, it is."""
    clock = mqk_fake_clock
    await memory_store.create_topic("c", 1)
    timer = await _timer(memory_store, clock).start()
    await timer.stop()  # hook removed: we drive the timer topic by hand
    hook_timer = _timer(memory_store, clock)
    landed = bytes(message_to_batch(b"landed", {}, 0))
    lost = bytes(message_to_batch(b"lost", {}, 1))
    past = clock.time_ms() - 1000
    await memory_store.append(TIMER_TOPIC, 0, [wrap([Waiting("c", 0, past, 0, (), landed)], past)])
    await memory_store.append(TIMER_TOPIC, 0, [wrap([Waiting("c", 0, past, 0, (), lost)], past)])
    await memory_store.append("c", 0, [bytearray(landed)])  # the crash came after this append...
    await memory_store.save_state("timer", {"floor": 0, "done": [], "intent": {"0": ["c", 0, 0], "1": ["c", 0, 1]}})
    await hook_timer.start()  # ...and before the "done" save
    try:
        # the landed one was settled as delivered at start (it is not appended again); the lost one, due already,
        # goes out as soon as the schedule is read
        await queue_reaches(memory_store, "c", 0, 2)
        await settle()
        assert await _bodies(memory_store, "c") == [b"landed", b"lost"]
        assert hook_timer.pending == 0 and memory_store.load_state("timer")["floor"] == 2
    finally:
        await hook_timer.stop()


async def test_file_store_restart_delivers_once(tmp_path, mqk_fake_clock: FakeClock) -> None:
    """A real restart: the waiting message and the timer state come back from disk."""
    clock = mqk_fake_clock
    config = StoreConfig(storage="file", data_dir=tmp_path / "data", commitlog_segment_bytes=1 << 20)
    store = StoreManager(config)
    await store.start()
    timer = await TimerService(BrokerConfig(store=config), store, clock=clock).start()
    await store.create_topic("f", 1)
    for body, delay in ((b"first", "100"), (b"second", "1500")):
        props = {"TIMER_DELAY_MS": delay}
        await store.append("f", 0, [message_to_batch(body, props, 0)], properties=props)
    await clock.advance(0.1)
    await queue_reaches(store, "f", 0, 1)
    await timer.stop()
    await store.close()

    store = StoreManager(config)
    await store.start()
    timer = await TimerService(BrokerConfig(store=config), store, clock=clock).start()
    await timer.wait_loaded()  # (the schedule is read from the floor after the start)
    try:
        assert await _bodies(store, "f") == [b"first"] and timer.pending == 1
        await clock.advance(1.399)
        assert timer.pending == 1
        await clock.advance(0.001)
        await queue_reaches(store, "f", 0, 2)
        # "second" arrives right after "first": a redelivered "first" (due long ago) would have come before it
        assert await _bodies(store, "f") == [b"first", b"second"]
        await timer.stop()  # the stop saves the timer's state: both recorded as delivered
        assert store.load_state("timer")["floor"] == 2
    finally:
        await timer.stop()
        await store.close()


async def test_payloads_beyond_the_memory_budget_are_reread(
    memory_store: StoreManager, monkeypatch, mqk_fake_clock: FakeClock
) -> None:
    import mqk.timer.service as service

    clock = mqk_fake_clock
    monkeypatch.setattr(service, "PAYLOAD_BUDGET", 0)
    timer = await _timer(memory_store, clock).start()
    try:
        await memory_store.create_topic("budget", 1)
        for i in range(5):
            props = {"TIMER_DELAY_MS": "150", "KEYS": f"key{i}"}
            await memory_store.append(
                "budget", 0, [message_to_batch(b"%d" % i, props, 0)], properties=props, keys=[f"key{i}".encode()]
            )
        assert timer._payloads == {}
        await clock.advance(0.15)
        await queue_reaches(memory_store, "budget", 0, 5)
        assert await _bodies(memory_store, "budget") == [b"0", b"1", b"2", b"3", b"4"]
        assert [q for q, _ in await memory_store.read_by_key("budget", b"key3", 5)] == [0]
    finally:
        await timer.stop()


async def test_stop_in_the_middle_of_a_burst_keeps_its_intent(
    memory_store: StoreManager, monkeypatch, mqk_fake_clock: FakeClock
) -> None:
    import mqk.timer.service as service

    clock = mqk_fake_clock
    await memory_store.create_topic("s", 1)
    timer = await _timer(memory_store, clock).start()
    original = memory_store.append
    stuck = asyncio.Event()

    async def slow_append(topic, queue, batches, **kw):
        result = await original(topic, queue, batches, **kw)
        if topic == "s" and service.DELIVERING.get():
            stuck.set()
            await asyncio.Event().wait()  # landed, but the deliverer never hears back
        return result

    monkeypatch.setattr(memory_store, "append", slow_append)
    props = {"TIMER_DELAY_MS": "50"}
    await original("s", 0, [message_to_batch(b"once", props, 0)], properties=props)
    await clock.advance(0.05)
    assert stuck.is_set()
    await timer.stop()
    assert len(memory_store.load_state("timer")["intent"]) == 1
    monkeypatch.setattr(memory_store, "append", original)

    timer = await _timer(memory_store, clock).start()
    try:
        assert timer.pending == 0  # the intent was settled at start: its batch is in the queue
        await clock.advance(LATER)
        assert await _bodies(memory_store, "s") == [b"once"]
    finally:
        await timer.stop()


async def test_a_hook_that_copies_batches_cannot_make_delivery_loop(
    memory_store: StoreManager, mqk_fake_clock: FakeClock
) -> None:
    clock = mqk_fake_clock

    def copying_hook(ctx) -> None:
        ctx.batches = [bytearray(b) for b in ctx.batches]

    memory_store.hooks.append(copying_hook)
    timer = await _timer(memory_store, clock).start()
    memory_store.hooks.remove(copying_hook)
    memory_store.hooks.insert(0, copying_hook)  # runs before the timer's hook
    try:
        await memory_store.create_topic("cp", 1)
        props = {"TIMER_DELAY_MS": "50"}
        await memory_store.append("cp", 0, [message_to_batch(b"once", props, 0)], properties=props)
        await clock.advance(0.05)
        # delivered, and its re-append was not taken for a new delayed message (that would be a second record in
        # the timer topic, written by the same append)
        assert memory_store.end_offset("cp", 0) == 1 and memory_store.end_offset(TIMER_TOPIC, 0) == 1
        await clock.advance(LATER)
        assert memory_store.end_offset("cp", 0) == 1 and memory_store.end_offset(TIMER_TOPIC, 0) == 1
    finally:
        memory_store.hooks.remove(copying_hook)
        await timer.stop()
