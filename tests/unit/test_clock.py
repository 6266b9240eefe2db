"""mqk.clock: FakeClock fires timers and sleeps in deadline order with exact arithmetic, settles what they wake,
and `wait_event` returns on the event or on the clock's timeout; SystemClock is asyncio's loop time."""

from __future__ import annotations

import asyncio

import pytest

from mqk.clock import SYSTEM_CLOCK, FakeClock, settle, wait_event


async def test_timers_fire_in_deadline_order_each_seeing_its_own_time() -> None:
    clock = FakeClock(start_ms=1_000_000)
    seen: list[tuple[str, int]] = []
    clock.call_later(0.3, lambda: seen.append(("c", clock.time_ms())))
    clock.call_later(0.1, lambda: seen.append(("a", clock.time_ms())))
    clock.call_later(0.1, lambda: seen.append(("b", clock.time_ms())))  # same deadline: in the order set
    cancelled = clock.call_later(0.2, lambda: seen.append(("x", clock.time_ms())))
    cancelled.cancel()
    assert clock.pending == 3 and clock.next_deadline() == pytest.approx(0.1)
    await clock.advance(0.25)
    assert seen == [("a", 1_000_100), ("b", 1_000_100)] and clock.time_ms() == 1_000_250
    await clock.advance(0.05)
    assert seen[-1] == ("c", 1_000_300) and clock.pending == 0 and clock.next_deadline() is None
    with pytest.raises(ValueError):
        await clock.advance(-1)


async def test_small_steps_add_up_exactly() -> None:
    clock = FakeClock(start_ms=0)
    fired = []
    clock.call_later(0.2, fired.append, 1)
    for _ in range(199):
        await clock.advance(0.001)
    assert fired == [] and clock.time_ms() == 199
    await clock.advance(0.001)
    assert fired == [1] and clock.time_ms() == 200 and clock.monotonic() == pytest.approx(1000.2)


async def test_sleepers_wake_at_their_time_and_a_cancelled_one_leaves_no_timer() -> None:
    clock = FakeClock()
    order: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)  # the fake clock's sleep is what is under test: no real time passes
        order.append(name)

    tasks = [asyncio.ensure_future(sleeper("late", 2)), asyncio.ensure_future(sleeper("early", 1))]
    gone = asyncio.ensure_future(sleeper("gone", 1.5))
    await settle()
    assert clock.pending == 3
    gone.cancel()
    await settle()
    assert clock.pending == 2
    await clock.advance(1)
    assert order == ["early"]
    await clock.run_until_idle()
    assert order == ["early", "late"] and all(t.done() for t in tasks)


async def test_advance_settles_a_chain_of_hand_offs_longer_than_a_few_loop_turns() -> None:
    clock = FakeClock()
    queue: asyncio.Queue[int] = asyncio.Queue()
    got: list[int] = []
    due = asyncio.get_running_loop().create_future()
    clock.call_later(1, due.set_result, None)

    async def relay() -> None:
        await due
        for i in range(200):  # each item is taken before the next is put: 200 round trips through the loop
            queue.put_nowait(i)
            await queue.join()

    async def reader() -> None:
        while len(got) < 200:
            got.append(await queue.get())
            queue.task_done()

    tasks = [asyncio.ensure_future(relay()), asyncio.ensure_future(reader())]
    await clock.advance(1)
    assert got == list(range(200)) and all(t.done() for t in tasks)


async def test_a_failing_timer_fails_the_advance_that_fired_it() -> None:
    clock = FakeClock()
    clock.call_later(1, lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        await clock.advance(2)


async def test_wait_event_returns_on_the_event_or_after_the_timeout() -> None:
    clock = FakeClock()
    event = asyncio.Event()
    waiting = asyncio.ensure_future(wait_event(clock, event, 5))
    await clock.advance(4.999)
    assert not waiting.done()
    event.set()
    await settle()
    assert waiting.result() is True and clock.pending == 0  # the timeout's timer went with it

    event.clear()
    waiting = asyncio.ensure_future(wait_event(clock, event, 5))
    await clock.advance(4.999)
    assert not waiting.done()
    await clock.advance(0.001)
    assert waiting.result() is False
    event.set()
    assert await wait_event(clock, event, 5) is True  # already set: at once


async def test_set_time_ms_steps_the_wall_clock_only() -> None:
    clock = FakeClock(start_ms=5_000)
    mono = clock.monotonic()
    clock.set_time_ms(1_000)
    assert clock.time_ms() == 1_000 and clock.time_ns() == 1_000_000_000 and clock.monotonic() == mono


async def test_system_clock_reads_the_real_clocks_and_waits_on_the_loop() -> None:
    assert SYSTEM_CLOCK.time_ns() // 1_000_000 <= SYSTEM_CLOCK.time_ms()
    before = SYSTEM_CLOCK.monotonic()
    fired = asyncio.Event()
    handle = SYSTEM_CLOCK.call_later(0, fired.set)
    await asyncio.wait_for(fired.wait(), 10)
    assert not handle.cancelled() and SYSTEM_CLOCK.monotonic() >= before
    assert await wait_event(SYSTEM_CLOCK, fired, 10) is True
