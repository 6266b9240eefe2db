"""A transaction whose answer etcd never gave (a timeout, a channel closed under it) may have been applied: the etcd
client does not send it again, and the cluster node decides from what etcd holds. An election it won without
knowing must not leave its group or the cluster with a key nobody acts on. No etcd: the client's channel and the
node's meta service are stand-ins that record what they were asked."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import wait_until_async

from mqk.broker.cluster.model import ControllerRecord, MasterRecord, dump
from mqk.broker.cluster.node import ClusterConfig, ClusterNode
from mqk.clock import settle
from mqk.errors import MetaOutcomeUnknown, MetaUnavailable
from mqk.meta import Compare, Delete, EtcdClient, Record


class SilentChannel:
    """An etcd channel that takes every call and never answers."""

    def __init__(self) -> None:
        self.calls = 0

    async def close(self) -> None:
        pass


def client_over(channel: SilentChannel, endpoints: int) -> EtcdClient:
    client = EtcdClient([("127.0.0.1", 1 + n) for n in range(endpoints)], timeout=0.05)
    client._client = channel
    client._new_client = lambda: channel  # type: ignore[method-assign]  # every endpoint's channel is the silent one
    return client


async def unanswered(channel: Any) -> None:
    channel.calls += 1
    await asyncio.Event().wait()


async def test_a_transaction_without_an_answer_is_not_sent_again() -> None:
    channel = SilentChannel()
    client = client_over(channel, endpoints=3)
    with pytest.raises(MetaOutcomeUnknown):
        await client._call(unanswered, resend=False)
    assert channel.calls == 1


async def test_a_read_without_an_answer_goes_round_the_endpoints_once() -> None:
    channel = SilentChannel()
    client = client_over(channel, endpoints=3)
    with pytest.raises(MetaUnavailable) as raised:
        await client._call(unanswered)
    assert channel.calls == 3 and not isinstance(raised.value, MetaOutcomeUnknown)


class Meta:
    """The node's meta service: transactions applied, then their answers lost; keys as `held` says."""

    def __init__(self, held: dict[str, Record]) -> None:
        self.held = held
        self.txns: list[tuple[list[Compare], list[Any]]] = []

    async def txn(self, compares: list[Compare], success: list[Any], failure: Any = ()) -> bool:
        self.txns.append((list(compares), list(success)))
        raise MetaOutcomeUnknown("the answer was lost")

    async def get(self, key: str) -> Record | None:
        return self.held.get(key)


def node(meta: Meta) -> ClusterNode:
    n = ClusterNode(ClusterConfig([("127.0.0.1", 1)], "c", 0, "g", {}))
    n.meta = meta  # type: ignore[assignment]  # the stand-in above
    n.lease = 77
    return n


def record(key: str, value: bytes, lease: int) -> Record:
    return Record(key, value, 5, 5, 1, lease)


@pytest.mark.parametrize(("holder_lease", "won"), [(77, True), (78, False)])
async def test_an_election_whose_answer_was_lost_is_decided_by_the_key(holder_lease: int, won: bool) -> None:
    meta = Meta({})
    n = node(meta)
    key = n.keys.master("g")
    meta.held[key] = record(key, dump(MasterRecord(0, 1)), holder_lease)
    epoch = await n._elect(key, n.keys.master_epoch("g"), lambda e: MasterRecord(0, e))
    assert epoch == (1 if won else 0)


async def test_a_controllership_held_without_knowing_is_released() -> None:
    meta = Meta({})
    n = node(meta)
    n.master_epoch = 4
    n.view.state.masters["g"] = MasterRecord(0, 4)
    n.view.state.controller = ControllerRecord(0, 2)  # etcd says this node is the controller; the node does not know
    n._on_change()
    await settle()
    key = n.keys.controller
    assert meta.txns == [([Compare(key, "value", "==", dump(ControllerRecord(0, 2)))], [Delete(key)])]


async def test_a_mastership_won_without_knowing_is_taken_as_a_handed_over_one() -> None:
    meta = Meta({})
    n = node(meta)
    key = n.keys.master("g")
    meta.held[key] = record(key, dump(MasterRecord(0, 4)), 77)  # under this node's lease
    n.view.state.masters["g"] = MasterRecord(0, 4)
    n.view.state.controller = ControllerRecord(1, 2)  # another node's
    n._on_change()
    await settle()
    assert n.master_epoch == 4 and meta.txns == []


async def test_a_mastership_and_a_controllership_the_node_holds_are_kept() -> None:
    meta = Meta({})
    n = node(meta)
    n.master_epoch, n._epoch_seen = 4, 4
    n.view.state.masters["g"] = MasterRecord(0, 4)
    n.view.state.controller = ControllerRecord(0, 2)
    n.controlling = (2, 5)
    n._on_change()
    await settle()
    assert meta.txns == [] and n.master_epoch == 4


class StallingMeta:
    """A meta service that applies transactions (no compare is checked: the node runs alone) except the first
    `stalls`, which fail as an etcd that did not answer in time fails them (nothing written)."""

    def __init__(self, stalls: int) -> None:
        self.stalls = stalls
        self.held: dict[str, Record] = {}
        self.revision = 10

    async def txn(self, compares: list[Compare], success: list[Any], failure: Any = ()) -> bool:
        if self.stalls:
            self.stalls -= 1
            raise MetaUnavailable("etcd unreachable: no answer in 5 s")
        for put in success:
            self.revision += 1
            self.held[put.key] = Record(put.key, put.value, self.revision, self.revision, 1, put.lease)
        return True

    async def get(self, key: str) -> Record | None:
        return self.held.get(key)

    async def get_prefix(self, prefix: str) -> tuple[list[Record], int]:
        return [r for k, r in self.held.items() if k.startswith(prefix)], self.revision


@pytest.mark.parametrize("stalls", [1, 2])
async def test_an_election_etcd_did_not_answer_is_run_again_without_any_key_changing(
    stalls: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every broker of a cluster may meet the same etcd stall at start; the failed write changes no key, so no watch
    # event would start the next election, and the cluster stayed without a controller until something else changed
    # (a CreateTopics waited for one in vain). One stall fails the mastership's election, two also the controller's.
    monkeypatch.setattr("mqk.broker.cluster.node.ELECTION_RETRY_S", 0.01)
    meta = StallingMeta(stalls)
    n = ClusterNode(ClusterConfig([("127.0.0.1", 1)], "c", 0, "g", {}))
    n.meta = meta  # type: ignore[assignment]  # the stand-in above
    n.lease = 77
    n._on_change()
    await wait_until_async(lambda: n.controlling is not None, 5, "the controller's election after the stalls")
    assert n.master_epoch == 1 and n.controlling is not None and meta.stalls == 0
    assert meta.held[n.keys.controller].lease == 77
    n._stopped = True


class SilentWatchMeta:
    """A meta service whose watch delivers nothing while etcd moves on (`changed` keys written after the view's
    revision); it counts the channel resets and the watches opened."""

    def __init__(self, changed: int) -> None:
        self.changed = changed
        self.resets = 0
        self.watches = 0

    async def changed_since(self, prefix: str, revision: int) -> bool:
        return self.changed > 0

    async def reset_channel(self) -> None:
        self.resets += 1

    async def watch_prefix(self, prefix: str) -> Any:
        self.watches += 1
        await asyncio.Event().wait()
        yield  # pragma: no cover - (never reached: an async generator that waits)


@pytest.mark.parametrize("changed", [0, 2])
async def test_a_watch_that_stopped_delivering_is_started_again(changed: int) -> None:
    meta = SilentWatchMeta(changed)
    n = ClusterNode(ClusterConfig([("127.0.0.1", 1)], "c", 0, "g", {}))
    n.meta = meta  # type: ignore[assignment]  # the stand-in above
    n.view.connected = True
    n.view.state.revision = 10
    await n._check_watch()  # behind once: an event may be on its way
    assert meta.resets == 0
    await n._check_watch()  # behind at the same revision a period later: the watch is stuck
    await settle()
    try:
        if changed:
            assert meta.resets == 1 and meta.watches == 1 and n._watch_task is not None
        else:
            assert meta.resets == 0 and n._watch_task is None
    finally:
        if n._watch_task is not None:
            n._watch_task.cancel()


class FailingWatchMeta:
    """A meta service whose first watch fails with an error no handler foresaw; the next one lists the cluster."""

    def __init__(self) -> None:
        self.watches = 0

    async def watch_prefix(self, prefix: str) -> Any:
        from mqk.meta import WatchEvent

        self.watches += 1
        if self.watches == 1:
            raise RuntimeError("a client library's surprise")
        yield WatchEvent("reset", records=(), revision=42)
        await asyncio.Event().wait()


async def test_a_watch_that_fails_unforeseen_is_logged_and_started_again(caplog: pytest.LogCaptureFixture) -> None:
    meta = FailingWatchMeta()
    n = ClusterNode(ClusterConfig([("127.0.0.1", 1)], "c", 0, "g", {}))
    n.meta = meta  # type: ignore[assignment]  # the stand-in above
    task = asyncio.create_task(n._follow())
    try:
        await wait_until_async(lambda: n.view.state.revision == 42, 5, "the second watch's listing")
        assert meta.watches == 2
        assert "the metadata watch failed" in caplog.text
    finally:
        task.cancel()
