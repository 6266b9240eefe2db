"""The classic group coordinator as pure logic: no sockets, timers on a FakeClock the tests move (a session or
rebalance timeout is checked just before its deadline and just after it)."""

from __future__ import annotations

import asyncio
import struct

import pytest
from helpers import OffsetsOnly, subscription

from mqk import errors as E
from mqk.clock import FakeClock, settle
from mqk.groups.coordinator import (
    COMPLETING_REBALANCE,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    GroupCoordinator,
    parse_consumer_subscription,
)

PROTOS = [("range", subscription("t")), ("roundrobin", subscription("t"))]


@pytest.fixture
def coord(mqk_fake_clock: FakeClock):
    c = GroupCoordinator(OffsetsOnly(), min_session_timeout_ms=10, max_session_timeout_ms=60000, clock=mqk_fake_clock)
    yield c
    c.close()


@pytest.fixture
def clock(coord) -> FakeClock:
    return coord.clock


async def join(coord, member_id="", *, protos=PROTOS, session=5000, rebalance=5000, instance=None, v4=True, **kw):
    return await coord.join(
        "g",
        member_id,
        "consumer",
        protos,
        session_timeout_ms=session,
        rebalance_timeout_ms=rebalance,
        group_instance_id=instance,
        require_known_member_id=v4 and instance is None,
        client_id="c",
        **kw,
    )


async def join_new(coord, **kw):
    first = await join(coord, **kw)
    assert first.error == E.MemberIdRequiredError.code and first.member_id
    return await join(coord, first.member_id, **kw)


async def test_member_id_required_then_single_member_becomes_leader_and_stable(coord):
    first = await join(coord)
    assert first.error == E.MemberIdRequiredError.code
    assert coord.groups["g"].state == EMPTY
    res = await join(coord, first.member_id)
    assert res.error == 0 and res.generation_id == 1 and res.leader == first.member_id
    assert res.protocol_name == "range"
    assert [m[0] for m in res.members] == [first.member_id]
    assert coord.groups["g"].state == COMPLETING_REBALANCE
    sync = await coord.sync("g", 1, res.member_id, {res.member_id: b"A"})
    assert sync.error == 0 and sync.assignment == b"A"
    assert coord.groups["g"].state == STABLE
    assert coord.heartbeat("g", 1, res.member_id) == 0
    assert coord.heartbeat("g", 0, res.member_id) == E.IllegalGenerationError.code
    assert coord.heartbeat("g", 1, "nobody") == E.UnknownMemberIdError.code


async def test_old_join_versions_are_admitted_without_member_id_round_trip(coord):
    res = await join(coord, v4=False)
    assert res.error == 0 and res.member_id and res.generation_id == 1


async def test_second_member_triggers_rebalance_and_both_get_leader_assignment(coord):
    a = await join_new(coord)
    await coord.sync("g", a.generation_id, a.member_id, {a.member_id: b"all"})
    b_first = await join(coord)
    b_task = asyncio.create_task(join(coord, b_first.member_id))
    await settle()
    assert coord.groups["g"].state == PREPARING_REBALANCE
    # the old member learns of the rebalance from its heartbeat, then rejoins
    assert coord.heartbeat("g", a.generation_id, a.member_id) == E.RebalanceInProgressError.code
    a2 = await join(coord, a.member_id)
    b = await b_task
    assert a2.generation_id == b.generation_id == 2
    assert a2.leader == a.member_id == b.leader
    assert len(a2.members) == 2 and b.members == []
    b_sync = asyncio.create_task(coord.sync("g", 2, b.member_id, {}))
    await settle()
    # parked in SyncGroup until the leader's assignment arrives
    assert coord.groups["g"].members[b.member_id].sync_future is not None and not b_sync.done()
    a_sync = await coord.sync("g", 2, a.member_id, {a.member_id: b"p0", b.member_id: b"p1"})
    assert a_sync.assignment == b"p0" and (await b_sync).assignment == b"p1"
    desc = coord.describe("g")
    assert desc["group_state"] == STABLE and desc["protocol_data"] == "range"
    assert {m["member_assignment"] for m in desc["members"]} == {b"p0", b"p1"}


async def test_protocol_selection_votes_and_inconsistent_protocol(coord):
    a = await join_new(coord, protos=[("roundrobin", b""), ("range", b"")])
    assert a.protocol_name == "roundrobin"
    await coord.sync("g", 1, a.member_id, {})
    bad = await join(coord, protos=[("sticky", b"")])
    assert bad.error == E.InconsistentGroupProtocolError.code
    b_first = await join(coord, protos=[("range", b"")])
    b_task = asyncio.create_task(join(coord, b_first.member_id, protos=[("range", b"")]))
    await settle()
    a2 = await join(coord, a.member_id, protos=[("roundrobin", b""), ("range", b"")])
    b = await b_task
    # only "range" is supported by both members
    assert a2.protocol_name == b.protocol_name == "range"


async def test_member_not_rejoining_is_dropped_after_rebalance_timeout(coord, clock):
    a = await join_new(coord, rebalance=100)
    await coord.sync("g", 1, a.member_id, {})
    b_first = await join(coord, rebalance=100)
    b_task = asyncio.create_task(join(coord, b_first.member_id, rebalance=100))  # a never rejoins
    await clock.advance(0.099)
    assert not b_task.done() and coord.groups["g"].state == PREPARING_REBALANCE  # the rebalance still waits for a
    assert a.member_id in coord.groups["g"].members
    await clock.advance(0.001)
    b = b_task.result()
    assert b.error == 0 and b.generation_id == 2 and b.leader == b.member_id
    assert [m[0] for m in b.members] == [b.member_id]
    assert coord.heartbeat("g", 2, a.member_id) == E.UnknownMemberIdError.code


async def test_session_expiry_removes_member_and_empties_group(coord, clock):
    a = await join_new(coord, session=300)
    await coord.sync("g", 1, a.member_id, {})
    for _ in range(8):  # heartbeats keep it alive past its session timeout
        await clock.advance(0.05)
        assert coord.heartbeat("g", 1, a.member_id) == 0
    await clock.advance(0.299)  # the session runs from the last heartbeat
    assert coord.groups["g"].state == STABLE and a.member_id in coord.groups["g"].members
    await clock.advance(0.001)
    assert coord.groups["g"].state == EMPTY
    assert coord.heartbeat("g", 1, a.member_id) == E.UnknownMemberIdError.code


async def test_session_expiry_of_one_member_rebalances_the_other(coord, clock):
    a = await join_new(coord, session=60, rebalance=2000)
    await coord.sync("g", 1, a.member_id, {})
    b_first = await join(coord, session=5000)
    b_task = asyncio.create_task(join(coord, b_first.member_id, session=5000))
    await settle()
    a2 = await join(coord, a.member_id, session=60)
    b = await b_task
    await coord.sync("g", 2, a2.member_id, {})
    await coord.sync("g", 2, b.member_id, {})
    # a stops heartbeating; b keeps going and is told to rejoin once a's session is over
    await clock.advance(0.059)
    assert coord.heartbeat("g", 2, b.member_id) == 0 and a.member_id in coord.groups["g"].members
    await clock.advance(0.001)
    assert coord.heartbeat("g", 2, b.member_id) == E.RebalanceInProgressError.code
    assert a.member_id not in coord.groups["g"].members
    b3 = await join(coord, b.member_id, session=5000)
    assert b3.generation_id == 3 and b3.leader == b.member_id and len(b3.members) == 1


async def test_invalid_session_timeout_and_group_id(coord):
    assert (await join(coord, session=5)).error == E.InvalidSessionTimeoutError.code
    res = await coord.join("", "", "consumer", PROTOS, session_timeout_ms=100)
    assert res.error == E.InvalidGroupIdError.code
    assert (await join(coord, "made-up")).error == E.UnknownMemberIdError.code


async def test_static_member_rejoins_without_rebalance_and_old_id_is_fenced(coord):
    a = await join(coord, instance="i-1")
    assert a.error == 0 and a.member_id.startswith("i-1-")
    await coord.sync("g", 1, a.member_id, {a.member_id: b"mine"})
    # the instance restarts: it joins with an empty member id and the same instance id
    again = await join(coord, instance="i-1")
    assert again.error == 0 and again.member_id != a.member_id
    assert again.generation_id == 1  # no rebalance
    assert coord.groups["g"].state == STABLE
    sync = await coord.sync("g", 1, again.member_id, {}, group_instance_id="i-1")
    assert sync.assignment == b"mine"
    assert coord.heartbeat("g", 1, a.member_id, "i-1") == E.FencedInstanceIdError.code
    assert coord.heartbeat("g", 1, again.member_id, "i-1") == 0


async def test_leave_group_rebalances_remaining_members_and_static_leave(coord):
    a = await join(coord, instance="i-a")
    await coord.sync("g", 1, a.member_id, {})
    b_task = asyncio.create_task(join(coord, instance="i-b"))
    await settle()
    a2 = await join(coord, a.member_id, instance="i-a")
    b = await b_task
    await coord.sync("g", a2.generation_id, a2.member_id, {})
    await coord.sync("g", b.generation_id, b.member_id, {})
    err, codes = coord.leave("g", [("", "i-b"), ("ghost", None), ("wrong", "i-a")])
    assert err == 0
    assert codes == [0, E.UnknownMemberIdError.code, E.FencedInstanceIdError.code]
    assert coord.groups["g"].state == PREPARING_REBALANCE
    a3 = await join(coord, a.member_id, instance="i-a")
    assert a3.generation_id == 3 and len(a3.members) == 1
    assert coord.leave("nope", [("x", None)])[0] == E.UnknownMemberIdError.code


async def test_sync_errors(coord):
    a = await join_new(coord)
    assert (await coord.sync("g", 99, a.member_id, {})).error == E.IllegalGenerationError.code
    assert (await coord.sync("g", 1, "x", {})).error == E.UnknownMemberIdError.code
    assert (await coord.sync("other", 1, "x", {})).error == E.UnknownMemberIdError.code
    res = await coord.sync("g", 1, a.member_id, {}, protocol_name="roundrobin")
    assert res.error == E.InconsistentGroupProtocolError.code


async def test_offsets_commit_fetch_round_trip_metadata_and_survive_new_coordinator(coord):
    codes = await coord.commit_offsets("g", -1, "", {("t", 0): (42, 3, "meta"), ("t", 1): (7, -1, None)})
    assert codes == {("t", 0): 0, ("t", 1): 0}
    got = coord.fetch_offsets("g", [("t", 0), ("t", 1), ("t", 2)])
    assert got[("t", 0)].offset == 42 and got[("t", 0)].metadata == "meta" and got[("t", 0)].leader_epoch == 3
    assert got[("t", 1)].offset == 7 and got[("t", 2)] is None
    too_big = await coord.commit_offsets("g", -1, "", {("t", 0): (1, -1, "x" * 5000)})
    assert too_big[("t", 0)] == 12
    # a restarted broker (new coordinator, same store) still has them and lists the group as Empty
    fresh = GroupCoordinator(coord.store)
    assert fresh.fetch_offsets("g")[("t", 0)].offset == 42
    assert fresh.list_groups() == [("g", "", EMPTY)]
    assert fresh.describe("g")["group_state"] == EMPTY
    assert fresh.describe("unknown") is None


async def test_member_commit_requires_generation(coord):
    a = await join_new(coord)
    err = await coord.commit_offsets("g", 1, a.member_id, {("t", 0): (1, -1, "")})
    assert err[("t", 0)] == E.RebalanceInProgressError.code  # CompletingRebalance
    await coord.sync("g", 1, a.member_id, {})
    assert (await coord.commit_offsets("g", 1, a.member_id, {("t", 0): (5, -1, "")}))[("t", 0)] == 0
    assert (await coord.commit_offsets("g", 0, a.member_id, {("t", 0): (6, -1, "")}))[("t", 0)] == (
        E.IllegalGenerationError.code
    )
    assert (await coord.commit_offsets("g", 1, "x", {("t", 0): (6, -1, "")}))[("t", 0)] == (E.UnknownMemberIdError.code)
    assert (await coord.commit_offsets("new", 3, "x", {("t", 0): (6, -1, "")}))[("t", 0)] == (
        E.IllegalGenerationError.code
    )
    assert coord.fetch_offsets("g")[("t", 0)].offset == 5


async def test_list_describe_delete_groups_and_offset_delete(coord):
    a = await join_new(coord)
    await coord.sync("g", 1, a.member_id, {})
    await coord.commit_offsets("g", 1, a.member_id, {("t", 0): (5, -1, ""), ("u", 0): (9, -1, "")})
    await coord.commit_offsets("idle", -1, "", {("t", 0): (1, -1, "")})
    assert coord.list_groups() == [("g", "consumer", STABLE), ("idle", "", EMPTY)]
    assert coord.list_groups(["empty"]) == [("idle", "", EMPTY)]
    assert await coord.delete_group("g") == E.NonEmptyGroupError.code
    assert await coord.delete_group("missing") == E.GroupIdNotFoundError.code
    err, per = await coord.delete_offsets("g", [("t", 0), ("u", 0)])
    assert err == 0 and per == {("t", 0): E.GroupSubscribedToTopicError.code, ("u", 0): 0}
    assert set(coord.fetch_offsets("g")) == {("t", 0)}
    assert (await coord.delete_offsets("missing", [("t", 0)]))[0] == E.GroupIdNotFoundError.code
    assert await coord.delete_group("idle") == 0
    assert coord.fetch_offsets("idle") == {}
    assert [g[0] for g in coord.list_groups()] == ["g"]
    coord.leave("g", [(a.member_id, None)])
    assert coord.groups["g"].state == EMPTY
    assert await coord.delete_group("g") == 0
    assert coord.list_groups() == []


def test_parse_consumer_subscription():
    assert parse_consumer_subscription(subscription("a", "bc")) == ["a", "bc"]
    assert parse_consumer_subscription(b"\x00") is None
    assert parse_consumer_subscription(struct.pack(">hi", 0, 5)) is None


async def test_member_whose_sync_was_abandoned_still_expires(coord, clock):
    a = await join_new(coord, session=60)
    b_first = await join(coord, session=60)
    b_task = asyncio.create_task(join(coord, b_first.member_id, session=60))
    await settle()
    await join(coord, a.member_id, session=60)
    b = await b_task
    follower = b if b.member_id != b.leader else a
    # the follower waits in SyncGroup, then its connection drops (the request task is cancelled)
    waiting = asyncio.create_task(coord.sync("g", 2, follower.member_id, {}))
    await settle()
    assert coord.groups["g"].members[follower.member_id].sync_future is not None
    waiting.cancel()
    await clock.advance(0.059)  # nobody heartbeats
    assert len(coord.groups["g"].members) == 2
    await clock.advance(0.001)  # both sessions expire, the abandoned SyncGroup's member's too
    assert coord.groups["g"].state == EMPTY and not coord.groups["g"].members


async def test_forget_topic_drops_its_committed_offsets_only(coord):
    await coord.commit_offsets("g1", -1, "", {("gone", 0): (5, -1, ""), ("kept", 0): (7, -1, "")})
    await coord.commit_offsets("g2", -1, "", {("gone", 1): (9, -1, "")})
    await coord.forget_topic("gone")
    assert set(coord.fetch_offsets("g1")) == {("kept", 0)}
    assert coord.fetch_offsets("g2") == {}
