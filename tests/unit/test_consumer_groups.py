"""The KIP-848 consumer groups (mqk.groups.consumer) on a fake clock, heartbeat by heartbeat: the assignors, revocation
before reassignment, member epochs and fencing, sessions and rebalance timeouts, static members, and the offset
checks; then on the wire (ConsumerGroupHeartbeat and ConsumerGroupDescribe through the codec, and the classic APIs
that meet consumer groups) against an in-process broker."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from mqk.clock import FakeClock
from mqk.groups.consumer import (
    FENCED_MEMBER_EPOCH,
    STALE_MEMBER_EPOCH,
    UNSUPPORTED_ASSIGNOR,
    ConsumerGroups,
    assign_range,
    assign_uniform,
)

T1, T2 = uuid.uuid4(), uuid.uuid4()
TOPICS = {"t1": (T1, 4), "t2": (T2, 3)}
UNKNOWN_MEMBER_ID, INVALID_REQUEST, GROUP_MAX_SIZE = 25, 42, 81


@pytest.fixture
def groups() -> ConsumerGroups:
    return ConsumerGroups(TOPICS.get, lambda: list(TOPICS), session_timeout_ms=3000, clock=FakeClock())


def beat(
    groups: ConsumerGroups, member: str, epoch: int, owned: dict[uuid.UUID, list[int]] | None = None, **fields: Any
) -> dict[str, Any]:
    body = {
        "group_id": "g",
        "member_id": member,
        "member_epoch": epoch,
        "instance_id": None,
        "rack_id": None,
        "rebalance_timeout_ms": fields.pop("rebalance_timeout_ms", 30_000 if epoch == 0 else -1),  # (-1: unchanged)
        "subscribed_topic_names": ["t1"] if epoch == 0 else None,
        "subscribed_topic_regex": None,
        "server_assignor": None,
        "topic_partitions": None if owned is None else [{"topic_id": t, "partitions": p} for t, p in owned.items()],
        **fields,
    }
    return groups.heartbeat(body, 1, "client", "/127.0.0.1")


def assigned(answer: dict[str, Any]) -> dict[uuid.UUID, list[int]] | None:
    if answer["assignment"] is None:
        return None
    return {tp["topic_id"]: tp["partitions"] for tp in answer["assignment"]["topic_partitions"]}


def test_uniform_spreads_evenly_and_keeps_partitions_where_they_were() -> None:
    members = {"a": ("t1", "t2"), "b": ("t1", "t2")}
    first = assign_uniform(members, TOPICS, {})
    assert sorted(sum(len(p) for p in parts.values()) for parts in first.values()) == [3, 4]
    members["c"] = ("t1", "t2")
    second = assign_uniform(members, TOPICS, first)
    assert sorted(sum(len(p) for p in parts.values()) for parts in second.values()) == [2, 2, 3]
    for m in ("a", "b"):  # what a and b keep they had before: only c's share moved
        for t, ps in second[m].items():
            assert ps <= first[m].get(t, frozenset())
    every = [(t, p) for parts in second.values() for t, ps in parts.items() for p in ps]
    assert sorted(every, key=str) == sorted({(t, p) for t, p in every}, key=str) and len(every) == 7
    # a member subscribed to one topic only gets only that topic's partitions
    only = assign_uniform({"a": ("t1",), "b": ("t1", "t2")}, TOPICS, {})
    assert set(only["a"]) <= {T1} and set(only["b"]) >= {T2}


def test_range_gives_consecutive_ranges_in_member_order() -> None:
    out = assign_range({"b": ("t1",), "a": ("t1",), "c": ("t1",)}, TOPICS, {})
    assert out == {"a": {T1: frozenset({0, 1})}, "b": {T1: frozenset({2})}, "c": {T1: frozenset({3})}}


def test_a_partition_moves_only_after_its_owner_revoked_it(groups: ConsumerGroups) -> None:
    a = beat(groups, "a", 0)
    assert a["error_code"] == 0 and a["member_epoch"] >= 1 and assigned(a) == {T1: [0, 1, 2, 3]}
    epoch_a = a["member_epoch"]
    b = beat(groups, "b", 0)
    assert assigned(b) is None or assigned(b) == {}  # all four are still a's
    epoch_b = b["member_epoch"]
    a = beat(groups, "a", epoch_a, {T1: [0, 1, 2, 3]})
    kept = assigned(a)
    assert kept is not None and len(kept[T1]) == 2 and a["member_epoch"] == epoch_a  # revoke first, same epoch
    b = beat(groups, "b", epoch_b)
    assert b["assignment"] is None  # a has not let them go yet
    a = beat(groups, "a", epoch_a, kept)  # it reports it owns only the two it kept
    assert a["member_epoch"] > epoch_a and a["assignment"] is None
    b = beat(groups, "b", b["member_epoch"], {})
    given = assigned(b)
    assert given is not None and sorted(given[T1] + kept[T1]) == [0, 1, 2, 3]
    assert b["member_epoch"] == a["member_epoch"]
    desc = groups.describe("g", lambda t: "t1")
    assert desc is not None and desc["group_state"] == "Stable" and len(desc["members"]) == 2


def test_epochs_fence_and_unknown_members_join_again(groups: ConsumerGroups) -> None:
    a = beat(groups, "a", 0)
    epoch = a["member_epoch"]
    assert beat(groups, "a", epoch + 5)["error_code"] == FENCED_MEMBER_EPOCH
    assert beat(groups, "nobody", 3)["error_code"] == UNKNOWN_MEMBER_ID
    assert beat(groups, "", 0)["error_code"] == INVALID_REQUEST  # v1: the member names itself
    assert beat(groups, "x", 0, server_assignor="sticky")["error_code"] == UNSUPPORTED_ASSIGNOR
    again = beat(groups, "a", 0)  # a fenced member joins again: it starts over
    assert again["error_code"] == 0 and again["member_epoch"] > epoch
    left = beat(groups, "a", -1)
    assert left["error_code"] == 0 and left["member_epoch"] == -1 and not groups.has_members("g")


def test_offset_requests_carry_the_member_epoch(groups: ConsumerGroups) -> None:
    assert groups.commit_check("none", "", -1) is None  # no consumer group: the classic coordinator decides
    a = beat(groups, "a", 0)
    epoch = a["member_epoch"]
    assert groups.commit_check("g", "a", epoch) == 0
    assert groups.commit_check("g", "a", epoch - 1) == STALE_MEMBER_EPOCH
    assert groups.commit_check("g", "a", epoch + 1) == FENCED_MEMBER_EPOCH
    assert groups.commit_check("g", "zz", epoch) == UNKNOWN_MEMBER_ID
    assert groups.commit_check("g", "", -1) == UNKNOWN_MEMBER_ID  # an admin's commit: not while it has members
    assert groups.fetch_check("g", "a", epoch) == 0 and groups.fetch_check("g", None, -1) == 0
    assert groups.fetch_check("g", "a", epoch - 1) == STALE_MEMBER_EPOCH
    beat(groups, "a", -1)
    assert groups.commit_check("g", "", -1) == 0


async def test_a_silent_member_leaves_with_its_session_and_a_stuck_one_with_its_rebalance_timeout(
    groups: ConsumerGroups,
) -> None:
    clock = groups.clock
    assert isinstance(clock, FakeClock)
    a = beat(groups, "a", 0, rebalance_timeout_ms=5_000)
    b = beat(groups, "b", 0)
    a = beat(groups, "a", a["member_epoch"], {T1: [0, 1, 2, 3]})  # told to give two up; it never does
    given_b = assigned(b)
    for _ in range(3):
        await clock.advance(2.0)
        b = beat(groups, "b", b["member_epoch"], given_b or {})
        given_b = assigned(b) or given_b
        a = beat(groups, "a", a["member_epoch"], {T1: [0, 1, 2, 3]})
    assert a["error_code"] == UNKNOWN_MEMBER_ID  # removed past its rebalance timeout
    assert given_b == {T1: [0, 1, 2, 3]}  # and b has every partition
    await clock.advance(4.0)  # b's session (3 s) ends without a heartbeat
    assert not groups.has_members("g")


def test_a_static_member_comes_back_to_its_partitions(groups: ConsumerGroups) -> None:
    a = beat(groups, "a1", 0, instance_id="web-1")
    b = beat(groups, "b", 0)
    a = beat(groups, "a1", a["member_epoch"], {T1: [0, 1, 2, 3]})
    mine = assigned(a)  # the two it keeps
    assert mine is not None and len(mine[T1]) == 2
    a = beat(groups, "a1", a["member_epoch"], mine)
    b = beat(groups, "b", b["member_epoch"], {})
    assert beat(groups, "a1", -2)["member_epoch"] == -2 and groups.has_members("g")
    back = beat(groups, "a2", 0, instance_id="web-1")  # a new process, the same instance
    assert back["error_code"] == 0 and (assigned(back) or {}) == mine


def test_group_size_limit(groups: ConsumerGroups) -> None:
    groups.max_size = 1
    assert beat(groups, "a", 0)["error_code"] == 0
    assert beat(groups, "b", 0)["error_code"] == GROUP_MAX_SIZE
