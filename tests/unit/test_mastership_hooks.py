"""What follows a broker's mastership of its group: ClusterNode's on_resign hooks (a later master seen, the lease
lost, a stop), the producer-id state rebuilt from the log when a broker becomes master, and the group coordinator
unloading its groups when it stops being one. No etcd: the node's view is set by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from mqk.broker.cluster.model import MasterRecord
from mqk.broker.cluster.node import ClusterConfig, ClusterNode
from mqk.clock import settle
from mqk.errors import NotCoordinatorError, OutOfOrderSequenceNumberError
from mqk.groups.coordinator import GroupCoordinator, JoinResult
from mqk.server.kafka.idempotence import ProducerStates
from mqk.server.kafka.rawclient import make_batch
from mqk.store.manager import StoreManager


def node() -> ClusterNode:
    return ClusterNode(ClusterConfig([("127.0.0.1", 1)], "c", 0, "g", {}))


async def test_a_later_master_in_the_view_makes_the_broker_resign_once() -> None:
    n = node()
    calls: list[str] = []

    async def resign() -> None:
        calls.append("resign")

    n.on_resign.append(resign)
    n.master_epoch = 3
    n.view.state.masters["g"] = MasterRecord(0, 3)
    assert n.leading
    n._on_change()  # its own record: nothing
    n.view.state.masters["g"] = MasterRecord(1, 2)  # an older epoch (a view behind etcd): nothing either
    n._on_change()
    await settle()
    assert calls == [] and n.master_epoch == 3
    n.view.state.masters["g"] = MasterRecord(1, 4)
    n._on_change()
    assert not n.leading and n.master_epoch == 0  # at once, before the callbacks run
    await n._resigned()
    n._on_change()
    await settle()
    assert calls == ["resign"]


async def test_a_lost_lease_resigns_and_the_next_mastership_waits_for_it() -> None:
    n = node()
    order: list[str] = []
    release = asyncio.Event()

    async def slow_resign() -> None:
        order.append("resign begins")
        await release.wait()
        order.append("resign ends")

    n.on_resign.append(slow_resign)
    n.master_epoch, n.lease = 2, 77
    n._lost_lease()
    assert n.master_epoch == 0 and n.lease == 0
    waiter = asyncio.create_task(n._resigned())  # what a campaign awaits before the on_master callbacks
    await settle()
    assert order == ["resign begins"] and not waiter.done()
    release.set()
    await waiter
    assert order == ["resign begins", "resign ends"]
    n._lost_lease()  # not master: nothing more
    await settle()
    assert order == ["resign begins", "resign ends"]


async def test_a_failing_resign_callback_does_not_stop_the_others() -> None:
    n = node()
    calls: list[str] = []

    async def broken() -> None:
        raise RuntimeError("boom")

    async def fine() -> None:
        calls.append("fine")

    n.on_resign.extend([broken, fine])
    n.master_epoch = 1
    n._resign("test")
    await n._resigned()
    assert calls == ["fine"]


class Pids:
    """The cluster's producer-id blocks (ProducerIdSource), its next free id set by the test."""

    def __init__(self, next_free: int) -> None:
        self.next_free = next_free

    async def allocate_pids(self, size: int) -> range:
        first, self.next_free = self.next_free, self.next_free + size
        return range(first, first + size)

    async def next_free_pid(self) -> int:
        return self.next_free


async def append(store: StoreManager, pid: int, seq: int, *values: bytes) -> int:
    batch = make_batch(list(values), producer_id=pid, producer_epoch=0, base_sequence=seq)
    return (await store.append("t", 0, [batch])).base_offset


async def test_becoming_master_rebuilds_producer_windows_from_the_replicated_log(memory_store: StoreManager) -> None:
    await memory_store.create_topic("t", 1)
    states = ProducerStates(memory_store)
    await states.start()
    pids = Pids(100)
    await states.use_cluster(pids)
    # this broker served the partition once (its window is cached) ...
    decision = await states.begin("t", 0, 5, 0, 0, 1)
    assert decision.entry is not None
    states.complete(decision, await append(memory_store, 5, 0, b"a", b"b"), -1)
    # ... then another master took batches replicated here: producer 7, and producer 150, allocated later
    pids.next_free = 200
    seven = await append(memory_store, 7, 0, b"c")
    await append(memory_store, 150, 0, b"d")
    stale = await states.begin("t", 0, 7, 0, 0, 0)
    assert stale.duplicate is None and stale.entry is not None  # the stale window would append it twice
    states.abort(stale)

    await states.become_master(3)
    retry = await states.begin("t", 0, 7, 0, 0, 0)
    assert retry.duplicate is not None and retry.duplicate.base_offset == seven
    assert (await states.begin("t", 0, 150, 0, 1, 0)).entry is not None  # goes on after its replicated batch
    # an id handed out before this broker became master, with no batch in the tail, may continue anywhere ...
    assert (await states.begin("t", 0, 180, 0, 9, 0)).entry is not None
    # ... one handed out after it must start at 0
    assert (await states.begin("t", 0, 200, 0, 9, 0)).error == OutOfOrderSequenceNumberError.code


async def test_resigning_coordinator_answers_its_waiting_members_not_coordinator(memory_store: StoreManager) -> None:
    groups = GroupCoordinator(memory_store)

    def join(member: str = "") -> Coroutine[Any, Any, JoinResult]:
        return groups.join("g", member, "consumer", [("range", b"")], session_timeout_ms=10_000)

    first = await join()  # alone: joined at once
    assert first.error == 0
    second = asyncio.create_task(join())  # a rebalance: it waits for the first member to join again
    await settle()
    assert not second.done()
    groups.unload()
    assert (await second).error == NotCoordinatorError.code
    assert groups.groups == {}
