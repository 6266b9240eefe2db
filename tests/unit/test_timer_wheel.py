"""The timer's bounded bookkeeping: the spill index (far-future messages kept off the Python heap, moved into
memory a bucket at a time as their time comes within the horizon) and the done bitmap (the same floor and runs the
state document always held), alone and inside a TimerService on a FakeClock."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from helpers import queue_reaches
from hypothesis import given, settings
from hypothesis import strategies as st

import mqk.timer.wheel as wheel
from mqk.clock import FakeClock, settle
from mqk.config import BrokerConfig, StoreConfig
from mqk.protocol.native.records import batch_to_messages, message_to_batch
from mqk.store.manager import StoreManager
from mqk.timer import TimerService
from mqk.timer.service import BUCKET_MS, HORIZON_MS, TIMER_TOPIC
from mqk.timer.wheel import Coverage, DoneSet, SpillIndex


def _old_mark(done: set[int], floor: int, offset: int) -> int:
    """The set-of-ints bookkeeping DoneSet replaces (the reference its floor and runs must match)."""
    done.add(offset)
    while floor in done:
        done.discard(floor)
        floor += 1
    return floor


def _old_runs(done: set[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for offset in sorted(done):
        if runs and runs[-1][1] == offset - 1:
            runs[-1][1] = offset
        else:
            runs.append([offset, offset])
    return runs


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(0, 40),
    order=st.lists(st.integers(0, 150), min_size=1, max_size=300, unique=True).map(lambda xs: xs),
    reload_at=st.integers(0, 300),
)
def test_done_bitmap_matches_the_set_it_replaces(start: int, order: list[int], reload_at: int) -> None:
    done, floor = DoneSet(), start
    done.clear(floor)
    ref: set[int] = set()
    ref_floor = start
    for step, raw in enumerate(order):
        offset = start + raw
        if offset < ref_floor or offset in ref:
            continue
        assert (offset in done) == (offset in ref)
        ref_floor = _old_mark(ref, ref_floor, offset)
        done.add(offset)
        if offset == floor:
            floor = done.advance(floor)
        assert floor == ref_floor
        assert done.runs() == _old_runs(ref)
        if step == reload_at:  # a restart: the document's runs load back to the same state
            again = DoneSet()
            again.load(floor, [tuple(r) for r in done.runs()])
            done = again
            assert done.runs() == _old_runs(ref)
    for offset in range(start, start + 200):
        assert (offset in done) == (offset >= floor and offset in ref)


def test_done_bitmap_stays_small_as_the_floor_advances() -> None:
    done = DoneSet()
    floor = 0
    for offset in range(200_000):
        done.add(offset)
        floor = done.advance(floor)
    assert floor == 200_000 and len(done._bits) < 1024 and done.runs() == []


@pytest.mark.parametrize("on_disk", [False, True])
def test_spill_index_hands_back_each_bucket_whole(tmp_path, monkeypatch, on_disk: bool) -> None:
    monkeypatch.setattr(wheel, "_FLUSH_BYTES", 24 * 7)  # chains cross the write buffer and the file
    index = SpillIndex(tmp_path / "timer" / "spill.idx" if on_disk else None, 1000)
    rng = random.Random(5)
    pairs = [(rng.randrange(10_000, 20_000), offset) for offset in range(500)]
    for due, offset in pairs:
        index.add(due, offset)
    assert index.count == 500
    assert index.peek(5) == sorted(pairs)[:5]
    got: list[tuple[int, int]] = []
    while index.first_bucket() is not None:
        bucket = index.first_bucket()
        taken = index.take_first()
        assert {due // 1000 for due, _ in taken} == {bucket}
        got += taken
    assert sorted(got) == sorted(pairs) and index.count == 0
    if on_disk:
        assert (tmp_path / "timer" / "spill.idx").stat().st_size == 0  # emptied: the disk space is given back
    index.close()


@pytest.mark.parametrize("on_disk", [False, True])
def test_spill_index_compaction_keeps_what_is_left(tmp_path, monkeypatch, on_disk: bool) -> None:
    monkeypatch.setattr(wheel, "_FLUSH_BYTES", 24 * 16)
    monkeypatch.setattr(wheel, "_COMPACT_BYTES", 24 * 100)
    path = tmp_path / "spill.idx"
    index = SpillIndex(path if on_disk else None, 10)
    pairs = [(offset * 3 % 1000, offset) for offset in range(1000)]
    for due, offset in pairs:
        index.add(due, offset)
    got: list[tuple[int, int]] = []
    while index.count > 40:
        got += index.take_first()
    held = path.stat().st_size if on_disk else len(index._buf)
    assert held < 1000 * 24  # rewritten with only the chains still held
    while index.count:
        got += index.take_first()
    assert sorted(got) == sorted(pairs)
    index.close()


# --- inside the timer ------------------------------------------------------------------------------------------


async def _bodies(store: StoreManager, topic: str) -> list[bytes]:
    if store.end_offset(topic, 0) == 0:
        return []
    result = await store.read(topic, 0, 0, 1 << 30)
    out: list[bytes] = []
    for batch in result.batches:
        out += [m.body for m in batch_to_messages(batch.data, topic, 0, 0, -1, ("127.0.0.1", 1))]
    return out


async def _delay(store: StoreManager, topic: str, body: bytes, deliver_ms: int) -> None:
    props = {"TIMER_DELIVER_MS": str(deliver_ms)}
    await store.append(topic, 0, [message_to_batch(body, props, 0)], properties=props)


async def test_far_messages_spill_and_arrive_on_time_in_due_order(
    memory_store: StoreManager, mqk_fake_clock: FakeClock
) -> None:
    clock = mqk_fake_clock
    timer = await TimerService(BrokerConfig(), memory_store, clock=clock).start()
    try:
        await memory_store.create_topic("far", 1)
        now = clock.time_ms()
        # due times from 10 s to 5 min away, written out of due order, several per bucket
        dues = [now + 10_000 + (i * 7919) % 290_000 for i in range(60)]
        for i, due in enumerate(dues):
            await _delay(memory_store, "far", b"%d" % i, due)
        await settle()
        near = sum(1 for d in dues if d // BUCKET_MS <= (now + HORIZON_MS) // BUCKET_MS)
        assert 0 < near < 60
        assert len(timer._schedule) == near and timer._spill.count == 60 - near and timer.pending == 60
        assert [d for d, _ in timer.upcoming(60)] == sorted(dues)  # spilled ones listed too, soonest first
        delivered = 0
        for due in sorted(set(dues)):
            await clock.advance((due - 1 - clock.time_ms()) / 1000)
            assert len(await _bodies(memory_store, "far")) == delivered  # nothing before its time
            await clock.advance(0.001)
            delivered += dues.count(due)
            await queue_reaches(memory_store, "far", 0, delivered)
            # the in-memory part never reaches far past the horizon
            assert all(d <= clock.time_ms() + HORIZON_MS + BUCKET_MS for d, _ in timer._schedule)
        order = [int(b) for b in await _bodies(memory_store, "far")]
        assert [dues[i] for i in order] == sorted(dues)
        assert timer.pending == 0 and timer._spill.count == 0
    finally:
        await timer.stop()


async def test_promotion_across_bucket_boundaries(memory_store: StoreManager, mqk_fake_clock: FakeClock) -> None:
    """Messages either side of a bucket edge, and one arriving after its bucket was promoted, keep due order."""
    clock = mqk_fake_clock
    timer = await TimerService(BrokerConfig(), memory_store, clock=clock).start()
    try:
        await memory_store.create_topic("edge", 1)
        base = (clock.time_ms() + 2 * HORIZON_MS) // BUCKET_MS * BUCKET_MS  # a bucket edge, well past the horizon
        for name, due in ((b"b", base), (b"a", base - 1), (b"d", base + BUCKET_MS), (b"c", base + BUCKET_MS - 1)):
            await _delay(memory_store, "edge", name, due)
        await settle()
        assert timer._spill.count == 4
        await clock.advance((base - 1 - HORIZON_MS - clock.time_ms()) / 1000)  # "a"'s bucket comes within reach
        await settle()
        assert timer._spill.count == 3 and len(timer._schedule) == 1
        await clock.advance(0.001)  # and now "b" and "c"'s bucket
        await settle()
        assert timer._spill.count == 1
        await _delay(memory_store, "edge", b"b2", base + 5)  # its bucket is in memory already: no spill
        await settle()
        assert timer._spill.count == 1 and len(timer._schedule) == 4
        await clock.advance((base + BUCKET_MS - clock.time_ms()) / 1000)
        await queue_reaches(memory_store, "edge", 0, 5)
        assert await _bodies(memory_store, "edge") == [b"a", b"b", b"b2", b"c", b"d"]
    finally:
        await timer.stop()


async def test_schedule_cap_holds_buckets_not_yet_due(
    memory_store: StoreManager, mqk_fake_clock: FakeClock, monkeypatch
) -> None:
    import mqk.timer.service as service

    monkeypatch.setattr(service, "SCHEDULE_CAP", 3)
    clock = mqk_fake_clock
    timer = await TimerService(BrokerConfig(), memory_store, clock=clock).start()
    try:
        await memory_store.create_topic("cap", 1)
        base = ((clock.time_ms() + 2 * HORIZON_MS) // BUCKET_MS + 1) * BUCKET_MS
        dues = [base + i * 500 for i in range(10)]  # 5 buckets of 2, all spilled
        for i, due in enumerate(dues):
            await _delay(memory_store, "cap", b"%d" % i, due)
        await settle()
        assert timer._spill.count == 10
        await clock.advance((base - HORIZON_MS + 10_000 - clock.time_ms()) / 1000)  # all within reach, none due
        await settle()
        assert len(timer._schedule) == 4 and timer._spill.count == 6  # two buckets in: the cap stops the rest
        late = base + 4_200  # its bucket is held back: it must wait spilled too
        await _delay(memory_store, "cap", b"late", late)
        await settle()
        assert timer._spill.count == 7
        await clock.advance((dues[-1] - clock.time_ms()) / 1000 + 1)
        await queue_reaches(memory_store, "cap", 0, 11)
        bodies = await _bodies(memory_store, "cap")
        assert bodies == [b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8", b"late", b"9"]
    finally:
        await timer.stop()


async def test_restart_with_spilled_messages_delivers_each_once(tmp_path, mqk_fake_clock: FakeClock) -> None:
    """kill -9 style: the first timer is dropped without its stop (no final save); a new one over the same data
    directory rebuilds the spill index from the timer topic and the saved floor and done runs."""
    clock = mqk_fake_clock
    config = StoreConfig(storage="file", data_dir=tmp_path / "data", commitlog_segment_bytes=1 << 20)
    store = StoreManager(config)
    await store.start()
    timer = await TimerService(BrokerConfig(store=config), store, clock=clock).start()
    await store.create_topic("r", 1)
    now = clock.time_ms()
    dues = [now + 1_000 + (i * 37_003) % 400_000 for i in range(40)]
    for i, due in enumerate(dues):
        await _delay(store, "r", b"%d" % i, due)
    await settle()
    assert timer._spill.count > 0 and (tmp_path / "data" / "timer" / "spill.idx").exists()
    half = sorted(dues)[19]
    await clock.advance((half - clock.time_ms()) / 1000)
    await queue_reaches(store, "r", 0, 20)
    await settle()
    await timer._cancel_tasks()  # the process dies: no stop, no final save
    timer.store.hooks.remove(timer.hook)
    await store.close()

    store = StoreManager(config)
    await store.start()
    timer = await TimerService(BrokerConfig(store=config), store, clock=clock).start()
    try:
        await settle()
        assert timer.pending == 20 and timer._spill.count > 0
        await clock.advance((max(dues) - clock.time_ms()) / 1000)
        await queue_reaches(store, "r", 0, 40)
        await settle()
        order = [int(b) for b in await _bodies(store, "r")]
        assert sorted(order) == list(range(40))  # each once
        assert [dues[i] for i in order] == sorted(dues)
        await timer.stop()
        assert store.load_state("timer")["floor"] == 40
    finally:
        await timer.stop()
        await store.close()


# --- the state document while a random-order spread drains (Coverage) -----------------------------------------


def test_coverage_keeps_a_staircase_and_names_only_what_no_rectangle_covers() -> None:
    cov = Coverage()
    for offset, due in ((0, 100), (1, 300), (2, 200)):
        cov.delivered(offset, due)
    cov.add(scanned=5, below=250, floor=0)  # offsets 3, 4 wait (due 250 and later)
    assert cov.rectangles == [(5, 250)] and cov.uncovered_runs() == [[1, 1]]  # 300 is above the head
    cov.add(scanned=6, below=120, floor=0)  # a message due at 120 read late holds the head back
    assert cov.rectangles == [(5, 250), (6, 120)] and cov.covers(4, 200) and not cov.covers(5, 200)
    cov.add(scanned=8, below=400, floor=0)  # it went out: one rectangle holds everything again
    assert cov.rectangles == [(8, 400)] and cov.uncovered_runs() == []
    cov.delivered(9, wheel.NO_DUE)  # a skipped record stays named until the floor passes it
    cov.add(scanned=10, below=wheel.NO_DUE, floor=9)
    assert cov.uncovered_runs() == [[9, 9]]
    cov.add(scanned=11, below=wheel.NO_DUE, floor=10)
    assert cov.uncovered_runs() == [] and cov.rectangles == [(11, wheel.NO_DUE)]


async def test_a_random_order_spread_keeps_the_state_document_small_and_survives_a_crash(
    memory_store: StoreManager, mqk_fake_clock: FakeClock
) -> None:
    """4,000 messages due in random order over 40 s drain second by second. The floor stays near the oldest offset
    still waiting, so naming every delivered offset above it would take about a thousand runs half-way through;
    the document names a few and says the rest by rule. Then the timer dies without a save (kill -9) and a new one
    delivers exactly what had not gone out, each message once, in due order."""
    clock = mqk_fake_clock
    store = memory_store
    timer = await TimerService(BrokerConfig(), store, clock=clock).start()
    await store.create_topic("spread", 1)
    start = clock.time_ms()
    rng = random.Random(7)
    count = 4000
    dues = [start + 1_000 + rng.randrange(40_000) for _ in range(count)]
    for i, due in enumerate(dues):
        await _delay(store, "spread", b"%d" % i, due)
    await settle()
    delivered = 0
    crashed = False
    widest = 0
    for second in range(1, 43):
        await clock.advance((start + second * 1000 - clock.time_ms()) / 1000)
        delivered = sum(1 for d in dues if d <= clock.time_ms())
        await queue_reaches(store, "spread", 0, delivered)
        await settle()
        doc = store.load_state("timer") or {"done": [], "covered": []}  # (none before the first delivery)
        assert len(doc["done"]) <= 3 and len(doc["covered"]) <= 2, doc
        widest = max(widest, len(timer._done.runs()))  # (what the document named before Coverage)
        if second == 20 and not crashed:
            crashed = True
            await timer._cancel_tasks()  # the process dies: no stop, no final save
            store.hooks.remove(timer.hook)
            timer = await TimerService(BrokerConfig(), store, clock=clock).start()
            await timer.wait_loaded()
            assert timer.pending == count - delivered
    assert widest > 900
    order = [int(b) for b in await _bodies(store, "spread")]
    assert sorted(order) == list(range(count))  # each once
    assert [dues[i] for i in order] == sorted(dues)
    await timer.stop()
    assert store.load_state("timer") == {"floor": count, "covered": [], "done": [], "intent": {}}


async def test_the_start_does_not_wait_for_the_timer_topic(
    memory_store: StoreManager, mqk_fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schedule is read from the floor after `start` returns: with the timer topic's reads held, the start
    still returns, nothing is delivered, and once the reads go on the waiting message goes out on time."""
    clock = mqk_fake_clock
    store = memory_store
    await store.create_topic("later", 1)
    timer = await TimerService(BrokerConfig(), store, clock=clock).start()
    await _delay(store, "later", b"x", clock.time_ms() + 2_000)
    await timer.stop()
    held = asyncio.Event()
    read = store.read

    async def gated_read(topic: str, *args: Any, **kwargs: Any) -> Any:
        if topic == TIMER_TOPIC:
            await held.wait()
        return await read(topic, *args, **kwargs)

    monkeypatch.setattr(store, "read", gated_read)
    timer = await asyncio.wait_for(TimerService(BrokerConfig(), store, clock=clock).start(), 5)
    try:
        await clock.advance(3)
        assert timer.pending == 0 and store.end_offset("later", 0) == 0
        held.set()
        await timer.wait_loaded()
        await clock.advance(0)
        await queue_reaches(store, "later", 0, 1)
        assert await _bodies(store, "later") == [b"x"]
    finally:
        held.set()
        await timer.stop()
