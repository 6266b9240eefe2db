"""Moving a partition between broker groups, piece by piece (the whole, with real processes:
tests/integration/test_partition_moves.py).

- the topic record keeps moves, epoch bases, arrivals and departures across encode and decode, and refuses
  malformed ones;
- the controller's steps: start (and what it refuses), seal, switch (a leader epoch above every earlier one, the
  arrival and the departure recorded), cancel;
- the store's fence: appends to a fenced queue are refused, the rest of a Produce goes on;
- the copier against a source over a real connection, on every engine: offsets kept through a compacted gap and a
  log start inside a batch, the seal asked once caught up and no transaction is under way, the switch once the
  source is sealed, with the aborted transactions and the consumer offsets committed at the source taken along; a
  copy that would lack records it left behind is refused;
- the scan that finds aborted transactions in a partition's batches.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import store_config

from mqk import errors as E
from mqk._fast import load
from mqk.broker.cluster.controller import Controller
from mqk.broker.cluster.model import (
    MOVE_COPYING,
    MOVE_SEALED,
    Malformed,
    MasterRecord,
    PartitionMove,
    RequestRecord,
    TopicRecord,
    dump,
)
from mqk.broker.moves import PartitionMoves, Unmovable
from mqk.broker.replication.link import read_frame
from mqk.config import TopicConfig
from mqk.protocol.kafka.aborted import AbortedScan
from mqk.protocol.kafka.records import batch_records
from mqk.server.kafka.rawclient import make_batch
from mqk.server.kafka.transactions import control_batch
from mqk.store.adapter import GroupOffset
from mqk.store.manager import StoreManager

TOPIC_ID = "ab" * 16
recbatch = load("recbatch")


# --- the record ---------------------------------------------------------------------------------------------------


def test_a_topic_record_keeps_its_moves_epochs_arrivals_and_departures() -> None:
    record = TopicRecord(
        TOPIC_ID,
        {},
        [("g0", 0), ("g1", 1)],
        3,
        2,
        [PartitionMove(0, "g1", MOVE_SEALED)],
        [0, 4],
        [[1, 7, 120]],
        [[1, "g0", 120]],
    )
    again = TopicRecord.decode(dump(record))
    assert again == record
    assert again.move_of(0) == PartitionMove(0, "g1", MOVE_SEALED) and again.move_of(1) is None
    assert [again.epoch_base(p) for p in range(2)] == [0, 4]
    assert again.arrival(1) == (7, 120) and again.arrival(0) is None
    assert again.departure(1, "g0") == 120 and again.departure(1, "g1") is None
    assert again.involves("g1") and again.involves("g0") and not again.involves("g2")
    # a record written before moves existed reads as one without any
    old = json.loads(dump(record))
    for name in ("moves", "epoch_bases", "arrivals", "departures"):
        del old[name]
    plain = TopicRecord.decode(json.dumps(old).encode())
    assert plain.moves == [] and plain.epoch_base(1) == 0 and plain.arrival(1) is None


@pytest.mark.parametrize(
    "change",
    [
        {"moves": [{"partition": 5, "target": "g1", "state": MOVE_COPYING}]},
        {"moves": [{"partition": 0, "target": "g1", "state": "flying"}]},
        {"moves": ["g1"]},
        {"epoch_bases": [0, 0, 0]},
        {"epoch_bases": ["1"]},
        {"arrivals": [[9, 1, 1]]},
        {"departures": [[0, 1, 1]]},
    ],
)
def test_a_malformed_move_is_refused(change: dict[str, Any]) -> None:
    doc = json.loads(dump(TopicRecord(TOPIC_ID, {}, [("g0", 0), ("g1", 1)])))
    doc.update(change)
    with pytest.raises(Malformed):
        TopicRecord.decode(json.dumps(doc).encode())


# --- the controller -----------------------------------------------------------------------------------------------


def controller(masters: dict[str, int], members: dict[str, list[int]]) -> Controller:
    state = SimpleNamespace(masters={g: MasterRecord(members[g][0], e) for g, e in masters.items()})
    view = SimpleNamespace(state=state, live_groups=lambda: sorted(masters), members_of=lambda g: members.get(g, []))
    node: Any = SimpleNamespace(view=view, controlling=(5, 1))
    return Controller(node)


def step(c: Controller, record: TopicRecord, op: str, partition: int, group: str, offset: int = -1) -> TopicRecord:
    changed = c._move(record, RequestRecord(op, "t", partition, group=group, offset=offset))
    assert changed is not None
    return changed


def test_the_controller_starts_seals_and_switches_a_move_with_epochs_that_only_go_up() -> None:
    c = controller({"g0": 9, "g1": 2, "g2": 1}, {"g0": [0, 1], "g1": [2, 3], "g2": [4, 5]})
    record = TopicRecord(TOPIC_ID, {}, [("g0", 0), ("g1", 1)], replication_factor=2)
    started = step(c, record, "move", 0, "g1")
    assert started.moves == [PartitionMove(0, "g1", MOVE_COPYING)] and started.partitions == record.partitions
    assert c._move(started, RequestRecord("move", "t", 0, group="g1")) is None  # asked again: nothing new
    with pytest.raises(E.ReassignmentInProgressError):
        step(c, started, "move-switch", 0, "g1", 50)  # not sealed yet
    sealed = step(c, started, "move-seal", 0, "g1")
    assert sealed.moves == [PartitionMove(0, "g1", MOVE_SEALED)]
    with pytest.raises(E.ReassignmentInProgressError):
        step(c, sealed, "move", 0, "g2")  # a sealed move is switching: it cannot go elsewhere now
    assert step(c, sealed, "move", 0, "").moves == []  # (but it can be cancelled: the source takes writes again)
    switched = step(c, sealed, "move-switch", 0, "g1", 50)
    assert switched.partitions == [("g1", 0), ("g1", 1)] and switched.moves == []
    # its leader epoch was 9 (g0's master epoch); now g1's master epoch 2 plus the base: 10
    assert switched.epoch_base(0) + 2 == 10 and switched.epoch_base(1) == 0
    assert switched.arrival(0) == (10, 50) and switched.departure(0, "g0") == 50
    # and back: a later departure from g1 replaces nothing else, and the one from g0 goes once it is back there
    back = step(c, step(c, step(c, switched, "move", 0, "g0"), "move-seal", 0, "g0"), "move-switch", 0, "g0", 80)
    assert back.partitions[0] == ("g0", 0)
    assert back.epoch_base(0) + 9 == 11  # above 10
    assert back.departure(0, "g0") is None and back.departure(0, "g1") == 80


def test_the_controller_refuses_moves_it_cannot_make_and_cancels_one_still_copying() -> None:
    c = controller({"g0": 1, "g1": 1, "small": 1}, {"g0": [0, 1], "g1": [2, 3], "small": [4]})
    record = TopicRecord(TOPIC_ID, {}, [("g0", 0)], replication_factor=2)
    with pytest.raises(E.InvalidReplicaAssignmentError):
        step(c, record, "move", 0, "gone")  # no live master
    with pytest.raises(E.InvalidReplicaAssignmentError):
        step(c, record, "move", 0, "small")  # fewer members than the topic's replication factor
    with pytest.raises(E.UnknownTopicOrPartitionError):
        step(c, record, "move", 3, "g1")
    with pytest.raises(E.NoReassignmentInProgressError):
        step(c, record, "move", 0, "")  # a cancel with nothing to cancel
    with pytest.raises(E.NoReassignmentInProgressError):
        step(c, record, "move-seal", 0, "g1")  # a copier's step for a move that is not there
    assert c._move(record, RequestRecord("move", "t", 0, group="g0")) is None  # where it is
    moving = step(c, record, "move", 0, "g1")
    assert step(c, moving, "move", 0, "").moves == []
    assert step(c, moving, "move", 0, "g0").moves == []  # back to where it is: a cancel too


# --- the store's fence --------------------------------------------------------------------------------------------


async def test_a_fenced_queue_takes_no_appends_and_the_others_go_on() -> None:
    store = StoreManager(store_config("memory", Path(".")))
    await store.start()
    try:
        await store.create_topic("t", 3, TopicConfig())
        store.fence({"t": frozenset({1})})
        with pytest.raises(E.PartitionFenced):
            store.append("t", 1, [make_batch([b"x"])])
        results = await store.append_many(
            "t", [(0, [make_batch([b"a"])]), (1, [make_batch([b"b"])]), (2, [make_batch([b"c"])])]
        )
        assert [type(r).__name__ for r in results] == ["AppendResult", "PartitionFenced", "AppendResult"]
        assert E.kafka_code_for(results[1]) == E.NotLeaderOrFollowerError.code  # (the client retries elsewhere)
        store.fence({})
        assert (await store.append("t", 1, [make_batch([b"x"])])).base_offset == 0
    finally:
        await store.close()


# --- the copier against a source ----------------------------------------------------------------------------------


class FakeMember:
    """What PartitionMoves asks of its cluster member: the topic record, its group, the view and the controller
    (whose steps are recorded and applied to the record)."""

    def __init__(self, group: str, record: TopicRecord, source_address: tuple[str, int] | None = None) -> None:
        self.group = group
        self.record = record
        self.keys = SimpleNamespace(root="/mqk/test/")
        self.node = SimpleNamespace(leading=True, on_role=[])
        broker = SimpleNamespace(node_id=0, address=lambda _name: source_address)
        self.view = SimpleNamespace(
            master_of=lambda _g: SimpleNamespace(node_id=0), broker=lambda _n: broker, add_listener=lambda _f: None
        )
        self.asked: list[tuple[str, int, str, int]] = []

    def topic(self, name: str) -> TopicRecord | None:
        return self.record if name == "t" else None

    def topics(self) -> dict[str, TopicRecord]:
        return {"t": self.record}

    async def change_topic(self, op: str, topic: str, wait: float | None = None, **fields: Any) -> None:
        self.asked.append((op, fields["partitions"], fields["group"], fields.get("offset", -1)))
        move = self.record.move_of(0)
        if op == "move-seal" and move is not None:
            self.record = TopicRecord(
                TOPIC_ID, {}, self.record.partitions, moves=[PartitionMove(0, move.target, MOVE_SEALED)]
            )


def replication(store: StoreManager) -> Any:
    async def replicated(*_args: Any) -> None:
        return None

    return SimpleNamespace(
        committed_end=lambda _t, _q, end: end, wait_replicated=replicated, engine=SimpleNamespace(log_end=0)
    )


@pytest.fixture(params=["memory", "rocksdb", "file"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[StoreManager, StoreManager]]:
    pair = []
    for side in ("source", "target"):
        store = StoreManager(store_config(request.param, tmp_path / side))
        await store.start()
        await store.create_topic("t", 1, TopicConfig(), topic_id=bytes.fromhex(TOPIC_ID))
        pair.append(store)
    try:
        yield pair[0], pair[1]
    finally:
        for store in pair:
            await store.close()


async def copy_until(moves: PartitionMoves, source: PartitionMoves, stop: str) -> list[str]:
    """Pull from `source` over a real connection until a pull answers `stop` (as the copier does, with a scan of
    what the copy holds already); the answers."""
    scan = await moves._scan_copy("t", 0)
    served: list[asyncio.Task[None]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(asyncio.current_task())  # type: ignore[arg-type]
        _kind, body = await read_frame(reader)  # (what the replication listener does with a FETCH first frame)
        await source.serve_fetch(body, reader, writer)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    reader, writer = await asyncio.open_connection(host, port)
    answers: list[str] = []
    asked = False
    try:
        for _ in range(50):
            record = moves.member.topic("t")
            answer = await moves._pull("t", 0, record, reader, writer, record.move_of(0), asked, scan)
            if answer in ("sealing", "unsealed"):  # (what the copier remembers between pulls)
                asked = answer == "sealing"
            answers.append(answer)
            if answer == stop:
                break
    finally:
        writer.close()
        await writer.wait_closed()
        await asyncio.gather(*served)  # (the source's side ends when the copier goes away)
        server.close()
        await server.wait_closed()
    return answers


async def test_a_copy_keeps_every_offset_through_gaps_and_a_log_start_inside_a_batch(
    stores: tuple[StoreManager, StoreManager],
) -> None:
    source_store, target_store = stores
    for i in range(4):  # batches [0, 10), [10, 20), [20, 30), [30, 40)
        await source_store.append("t", 0, [make_batch([b"v%d" % (10 * i + j) for j in range(10)])])
    # then a transaction of producer 7 that was aborted: its batch at 40, its marker at 41
    await source_store.append("t", 0, [make_batch([b"t40"], producer_id=7, producer_epoch=0, transactional=True)])
    await source_store.append("t", 0, [control_batch(7, 0, False, 1)])
    first = (await source_store.read("t", 0, 0, 1 << 20)).batches[0].data
    # compaction kept [0, 10) and took [10, 20) away: a gap
    await source_store.engine_of("t").replace_range("t", 0, 0, 20, [first])
    await source_store.delete_before("t", 0, 5)  # a log start inside the first batch
    moving = TopicRecord(TOPIC_ID, {}, [("g0", 0)], moves=[PartitionMove(0, "g1")])
    source = PartitionMoves(FakeMember("g0", moving), source_store, replication(source_store))  # type: ignore[arg-type]
    member = FakeMember("g1", moving)
    target = PartitionMoves(member, target_store, replication(target_store))  # type: ignore[arg-type]
    adopted: list[tuple[str, int, list[tuple[int, int, int]]]] = []

    async def adopt(topic: str, partition: int, aborted: Any) -> None:
        adopted.append((topic, partition, list(aborted)))

    target.adopt_aborted = adopt
    under_way = [True]
    source.under_way = lambda _t, _p: under_way[0]
    # caught up, but a transaction is under way at the source: no seal (its marker could not be written once sealed)
    answers = await copy_until(target, source, "idle")
    assert member.asked == [] and target_store.offset_bounds("t", 0) == (5, 42)
    under_way[0] = False
    answers = await copy_until(target, source, "sealing")
    assert answers[-1] == "sealing" and member.asked == [("move-seal", 0, "g1", -1)]
    # sealed: the source's fence is up, so its answers say so; the copy then asks for the switch at its end, once
    # the aborted transaction it copied is known here
    source_store.fence({"t": frozenset({0})})
    source.member.record = member.record
    # consumer offsets committed to the source for the partition (RocketMQ's) come along, unless committed here
    await source_store.commit_offsets("rocketmq", {("t", 0): GroupOffset(30, "m")})
    await source_store.commit_offsets("both", {("t", 0): GroupOffset(10)})
    await target_store.commit_offsets("both", {("t", 0): GroupOffset(35)})
    answers = await copy_until(target, source, "switched")
    assert answers[-1] == "switched" and member.asked[-1] == ("move-switch", 0, "g1", 42)
    assert adopted == [("t", 0, [(41, 7, 40)])]
    assert target_store.fetch_offsets("rocketmq")[("t", 0)].offset == 30
    assert target_store.fetch_offsets("rocketmq")[("t", 0)].metadata == "m"
    assert target_store.fetch_offsets("both")[("t", 0)].offset == 35
    # every record where it was, the gap a gap (an empty batch spans it), nothing below the log start
    got = {}
    offset = 5
    while offset < 42:
        result = await target_store.read("t", 0, offset, 1 << 20)
        for batch in result.batches:
            for record in _records(batch.data):
                if record[0] >= 5:
                    got[record[0]] = record[1]
        offset = result.next_offset
    assert {o: v for o, v in got.items() if o < 40} == {o: b"v%d" % o for o in [*range(5, 10), *range(20, 40)]}


def _records(data: Any) -> list[tuple[int, bytes]]:
    """(offset, value) of each record of a batch."""
    base = recbatch.parse_header(data, 0)[0]
    return [(base + r[2], bytes(r[4])) for r in batch_records(bytes(data))]


async def test_a_copy_back_into_a_group_that_deleted_what_the_source_still_holds_is_refused(
    stores: tuple[StoreManager, StoreManager],
) -> None:
    source_store, target_store = stores
    await source_store.append("t", 0, [make_batch([b"v%d" % j for j in range(10)])])
    await target_store.append("t", 0, [make_batch([b"v%d" % j for j in range(10)])])
    await target_store.delete_before("t", 0, 10)  # what a group does once a partition left it at 10
    back = TopicRecord(TOPIC_ID, {}, [("g0", 0)], moves=[PartitionMove(0, "g1")], departures=[[0, "g1", 10]])
    source = PartitionMoves(FakeMember("g0", back), source_store, replication(source_store))  # type: ignore[arg-type]
    target = PartitionMoves(FakeMember("g1", back), target_store, replication(target_store))  # type: ignore[arg-type]
    with pytest.raises(Unmovable):
        await copy_until(target, source, "sealing")


def test_a_scan_finds_the_aborted_transactions_in_a_partitions_batches() -> None:
    scan = AbortedScan(100)
    batches = [
        (100, make_batch([b"a"], producer_id=5, producer_epoch=0, transactional=True)),  # 5 begins at 100
        (101, make_batch([b"plain"])),
        (102, make_batch([b"b"], producer_id=6, producer_epoch=0, transactional=True)),  # 6 begins at 102
        (103, make_batch([b"c"], producer_id=5, producer_epoch=0, transactional=True)),
        (104, control_batch(6, 0, True, 1)),  # 6 committed
        (105, control_batch(5, 0, False, 1)),  # 5 aborted: [100, 105)
        (106, control_batch(9, 0, False, 1)),  # 9 aborted, begun before the scan's start
    ]
    for offset, data in batches:
        scan.feed(offset, data)
    assert scan.aborted == [(105, 5, 100), (106, 9, 100)]
