"""A mastership handed to a broker by an ElectLeaders request (mqk.broker.cluster.elections): the broker takes it
only when etcd holds the master key naming it under its current lease, once per epoch; a record naming it with an
epoch it served already is not a handover. No etcd: the node's view is set by hand and its etcd reads answered
from a dict."""

from __future__ import annotations

from mqk.broker.cluster.model import ControllerRecord, MasterRecord, SyncStateRecord, dump
from mqk.broker.cluster.node import ClusterConfig, ClusterNode
from mqk.clock import settle
from mqk.meta import Record

LEASE = 77


class FakeMeta:
    def __init__(self) -> None:
        self.keys: dict[str, Record] = {}
        self.reads = 0

    def set(self, key: str, value: bytes, lease: int = 0) -> None:
        self.keys[key] = Record(key, value, 1, 1, 1, lease)

    async def get(self, key: str) -> Record | None:
        self.reads += 1
        return self.keys.get(key)


def handed_node() -> tuple[ClusterNode, FakeMeta, list[int]]:
    n = ClusterNode(ClusterConfig([("127.0.0.1", 1)], "c", 2, "g", {}))
    meta = FakeMeta()
    n.meta = meta  # type: ignore[assignment]  # (only `get` is asked on this path)
    n.lease = LEASE
    n.view.state.controller = ControllerRecord(1, 1)  # (someone controls: no controller campaign)
    became: list[int] = []

    async def on_master(epoch: int) -> None:
        became.append(epoch)

    n.on_master.append(on_master)
    return n, meta, became


async def test_a_mastership_handed_over_under_the_brokers_lease_is_taken_with_the_written_in_sync_set() -> None:
    n, meta, became = handed_node()
    meta.set(n.keys.master("g"), dump(MasterRecord(2, 5)), LEASE)
    meta.set(n.keys.isr("g"), dump(SyncStateRecord([1, 2, 3], 5)))
    n.view.state.masters["g"] = MasterRecord(2, 5)
    n._on_change()
    await settle()
    assert became == [5] and n.master_epoch == 5 and n.leading
    assert n.elected_isr == frozenset({1, 2, 3})
    n._on_change()  # the same record again: served already, nothing more
    await settle()
    assert became == [5]


async def test_a_record_under_another_lease_is_declined_once() -> None:
    n, meta, became = handed_node()
    meta.set(n.keys.master("g"), dump(MasterRecord(2, 6)), LEASE + 1)  # (a lapsed lease's record)
    n.view.state.masters["g"] = MasterRecord(2, 6)
    n._on_change()
    await settle()
    assert became == [] and n.master_epoch == 0
    reads = meta.reads
    n._on_change()
    await settle()
    assert meta.reads == reads  # declined for good: not asked again


async def test_a_record_naming_the_broker_with_an_epoch_it_served_is_no_handover() -> None:
    n, meta, became = handed_node()
    n._epoch_seen = 4  # it was master in epoch 4 and lost its lease; its view still shows that record
    n.view.state.masters["g"] = MasterRecord(2, 4)
    assert n._handed_over() is None
    n._on_change()
    await settle()
    assert became == [] and meta.reads == 0
