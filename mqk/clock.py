"""Time, injected: the one place the broker's services read the clock and schedule timers.

A `Clock` is handed down from the runtime to everything that measures or waits for time (group sessions and
rebalances, the timer's delivery schedule, retention and compaction passes, the disk guard, producer-id state).
Production runs on `SystemClock`; tests drive a `FakeClock` (mqk.testing re-exports it) whose time moves only when
the test says so, so a test of a 30 s session timeout takes no wall time and never passes by accident on a slow
machine.

Two readings, as Kafka's `Time` has them:
- wall time (`time_ms`, `time_ns`): what timestamps carry and what "older than retention.ms" is measured against;
- monotonic time (`monotonic`): what durations and deadlines are measured with.

This module is a leaf: it imports nothing from mqk, so every layer may use it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any, Protocol


class TimerHandle(Protocol):
    """What `Clock.call_later` returns: asyncio's TimerHandle has this shape, and so has the fake one."""

    def cancel(self) -> None: ...

    def cancelled(self) -> bool: ...


class Clock(Protocol):
    """Everything above the store that reads time or waits for it takes one of these."""

    def time_ms(self) -> int:
        """Wall-clock milliseconds since the epoch."""
        ...

    def time_ns(self) -> int:
        """Wall-clock nanoseconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for durations and deadlines)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Suspend the caller for `seconds` of this clock's time."""
        ...

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        """Run `callback(*args)` on the event loop after `delay` seconds of this clock's time."""
        ...


class SystemClock:
    """The real clock: the OS's wall and monotonic clocks, asyncio's sleep and timers."""

    __slots__ = ()

    def time_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def time_ns(self) -> int:
        return time.time_ns()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        return asyncio.get_running_loop().call_later(delay, callback, *args)


#: the process's real clock; the default wherever no clock is passed in
SYSTEM_CLOCK = SystemClock()


class _FakeTimer:
    """A callback FakeClock runs when its monotonic time reaches `when_ns`."""

    __slots__ = ("_cancelled", "args", "callback", "when_ns")

    def __init__(self, when_ns: int, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.when_ns = when_ns
        self.callback = callback
        self.args = args
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    def cancelled(self) -> bool:
        return self._cancelled


def _ns(seconds: float) -> int:
    return round(seconds * 1_000_000_000)


class FakeClock:
    """A clock whose time moves only through `advance` (or `set_time_ms`).

    Timers and sleeps due at or before the new time fire in deadline order (equal deadlines in the order they were
    set), each with the clock showing its own deadline, as they would have on a real clock. `advance` is a
    coroutine: after each firing it lets the event loop run until every task it woke has settled (see `settle`),
    so code that reacts to a timer (a rebalance that completes, a delayed message appended) has done so when
    `advance` returns, unless it waits for something outside the loop (a worker thread, a socket): a test awaits
    that event itself. A timer callback that raises fails the `advance` that fired it, so a broken timer fails the
    test instead of being logged and forgotten.

    Time is kept in whole nanoseconds, and wall and monotonic time move together, so steps add up exactly (0.199 s
    then 0.001 s reach a deadline set 0.2 s ahead, and a due time 200 ms away in wall milliseconds). The wall clock
    starts at a whole millisecond (now, unless `start_ms` is given).
    """

    def __init__(self, start_ms: int | None = None) -> None:
        self._wall_ns = (time.time_ns() // 1_000_000 if start_ms is None else start_ms) * 1_000_000
        self._mono_ns = 1_000 * 1_000_000_000  # arbitrary, positive, like a real monotonic clock after boot
        self._timers: list[tuple[int, int, _FakeTimer]] = []
        self._order = itertools.count()

    # --- readings -------------------------------------------------------------------------------------------

    def time_ms(self) -> int:
        return self._wall_ns // 1_000_000

    def time_ns(self) -> int:
        return self._wall_ns

    def monotonic(self) -> float:
        return self._mono_ns / 1_000_000_000

    # --- waiting --------------------------------------------------------------------------------------------

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> _FakeTimer:
        timer = _FakeTimer(self._mono_ns + max(0, _ns(delay)), callback, args)
        heapq.heappush(self._timers, (timer.when_ns, next(self._order), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.call_later(seconds, _wake, future)
        try:
            await future
        finally:
            timer.cancel()  # a cancelled sleeper leaves no timer behind (`pending` counts only live ones)

    @property
    def pending(self) -> int:
        """Timers and sleeps not yet due (cancelled ones excluded)."""
        return sum(1 for _when, _n, timer in self._timers if not timer.cancelled())

    def next_deadline(self) -> float | None:
        """Seconds from now until the earliest pending timer, or None when nothing waits."""
        self._drop_cancelled()
        return max(0, self._timers[0][0] - self._mono_ns) / 1_000_000_000 if self._timers else None

    # --- moving time ----------------------------------------------------------------------------------------

    async def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, firing what falls due on the way (see the class docstring)."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        target = self._mono_ns + _ns(seconds)
        await settle()
        while True:
            self._drop_cancelled()
            if not self._timers or self._timers[0][0] > target:
                break
            when, _n, timer = heapq.heappop(self._timers)
            self._move_to(when)
            timer.callback(*timer.args)
            await settle()
        self._move_to(target)
        await settle()

    async def advance_ms(self, ms: float) -> None:
        await self.advance(ms / 1000)

    async def run_until_idle(self, limit_seconds: float = 3600.0) -> None:
        """Advance to each pending deadline in turn until nothing is scheduled (or `limit_seconds` have passed)."""
        end = self._mono_ns + _ns(limit_seconds)
        while True:
            self._drop_cancelled()
            if not self._timers or self._timers[0][0] > end:
                return
            await self.advance((self._timers[0][0] - self._mono_ns) / 1_000_000_000)

    def set_time_ms(self, wall_ms: int) -> None:
        """Step the wall clock (as an operator or NTP might); monotonic time and timers are not affected."""
        self._wall_ns = wall_ms * 1_000_000

    def _move_to(self, mono_ns: int) -> None:
        if mono_ns > self._mono_ns:
            self._wall_ns += mono_ns - self._mono_ns
            self._mono_ns = mono_ns

    def _drop_cancelled(self) -> None:
        while self._timers and self._timers[0][2].cancelled():
            heapq.heappop(self._timers)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def settle(limit: int = 10_000) -> None:
    """Let the event loop run what is ready, and what that makes ready in turn, until nothing is: every task woken
    has run on to its next wait on something outside the loop (I/O, a worker thread, a timer), or finished.

    Yields once, then again while anything else is ready, at most `limit` more times (`settle(0)` is one yield).
    On a loop that does not expose its ready queue (asyncio's own loops do), `min(limit, 49)` more yields are taken.
    Settle from one task at a time: two tasks settling at once see each other ready until their limits run out."""
    ready = getattr(asyncio.get_running_loop(), "_ready", None)  # asyncio.BaseEventLoop's ready callbacks
    await asyncio.sleep(0)
    for _ in range(limit if ready is not None else min(limit, 49)):
        if ready is not None and not ready:
            return
        await asyncio.sleep(0)


async def wait_event(clock: Clock, event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109 - on the injected clock, which asyncio.timeout cannot follow
    """Wait until `event` is set or `timeout` seconds of `clock` time have passed, whichever comes first (what
    `asyncio.wait_for(event.wait(), timeout)` does on the loop's own clock); True when the event was set."""
    if event.is_set():
        return True
    loop = asyncio.get_running_loop()
    timed_out: asyncio.Future[None] = loop.create_future()
    timer = clock.call_later(timeout, _wake, timed_out)
    waiter = loop.create_task(event.wait())
    try:
        await asyncio.wait((waiter, timed_out), return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        waiter.cancel()
        timed_out.cancel()
    return event.is_set()


__all__ = ["SYSTEM_CLOCK", "Clock", "FakeClock", "SystemClock", "TimerHandle", "settle", "wait_event"]
