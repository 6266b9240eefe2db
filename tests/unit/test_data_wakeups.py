"""The broker's wake-up hub, the store's data listener that wakes long polls (Kafka Fetch and RocketMQ pulls).

The store tells a listener once per append call, with a (queue, end offset) pair per queue that grew: a Produce
spread over many partitions wakes the waiters of each of them."""

from __future__ import annotations

import asyncio
import threading

from mqk.broker.hub import WIDE, WakeupHub
from mqk.clock import settle


async def test_fetch_waiters_wake_on_any_listed_partition_and_only_those() -> None:
    waiters = WakeupHub()
    woken_b = asyncio.ensure_future(waiters.wait([("t", 1)], 5))
    asleep = asyncio.ensure_future(waiters.wait([("t", 2), ("u", 0)], 0.2))
    await settle()
    waiters.notify("u", [(1, 10)])  # another topic's queue 1: nobody here
    waiters.notify("t", [(0, 4), (1, 7)])  # one call for two queues of t
    assert await asyncio.wait_for(woken_b, 1) is True
    assert await asyncio.wait_for(asleep, 1) is False  # its partitions never grew: timed out


async def test_a_wait_on_many_partitions_of_a_topic_wakes_on_any_of_them_and_leaves_nothing_registered() -> None:
    waiters = WakeupHub()
    many = [("t", q) for q in range(0, 2 * WIDE, 2)]  # the even queues of t: registered once, for the topic
    wide = asyncio.ensure_future(waiters.wait([*many, ("u", 0)], 5))
    other = asyncio.ensure_future(waiters.wait([("t", q) for q in range(1, 2 * WIDE, 2)], 5))  # the odd ones
    narrow = asyncio.ensure_future(waiters.wait([("t", 5)], 5))
    await settle()
    assert list(waiters._wide) == ["t"] and len(waiters._wide["t"]) == 2
    waiters.notify("t", [(2 * WIDE, 1), (2 * WIDE + 1, 1)])  # queues nobody waits on
    waiters.notify("v", [(4, 1)])
    await settle()
    assert not (wide.done() or other.done() or narrow.done())
    waiters.notify("t", [(5, 3), (2 * WIDE - 2, 9)])  # an odd queue (a wide and a narrow wait) and an even one
    assert await asyncio.wait_for(wide, 1) is True
    assert await asyncio.wait_for(other, 1) is True
    assert await asyncio.wait_for(narrow, 1) is True
    assert waiters._wide == {} and waiters._waiting == {}
    # a wide wait that times out or is released by wake_all leaves nothing behind either
    assert await waiters.wait(many, 0.01) is False
    stopped = asyncio.ensure_future(waiters.wait(many, 5))
    await settle()
    waiters.wake_all()
    assert await asyncio.wait_for(stopped, 1) is True
    assert waiters._wide == {} and waiters._waiting == {}


async def test_the_hub_wakes_pulls_of_every_grown_queue_from_any_thread() -> None:
    hub = WakeupHub()
    hub.bind(asyncio.get_running_loop())
    pulls = [asyncio.ensure_future(hub.wait([("t", q)], 5)) for q in (0, 1, 2)]
    await settle()
    hub.notify("t", [(0, 3), (2, 9)])
    await asyncio.wait_for(asyncio.gather(pulls[0], pulls[2]), 1)
    await settle()  # the same thread: the wake-ups were handed out synchronously, pulls[1] is still waiting
    assert not pulls[1].done()
    # from another thread (an engine's writer thread): the wake-up is handed to the loop
    thread = threading.Thread(target=hub.notify, args=("t", [(1, 4)]))
    thread.start()
    thread.join()
    await asyncio.wait_for(pulls[1], 1)
