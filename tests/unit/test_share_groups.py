"""Share groups (mqk.groups.share) without a broker: a share partition's record states step by step (acquire,
accept, release, reject, lock expiry, the delivery limit, control records, the start offset moving past what is
done, a document round trip), the spread of partitions over members, and the membership's epochs. On the wire:
tests/integration/test_share_groups_wire.py."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from mqk.clock import FakeClock
from mqk.groups.share import (
    ACKNOWLEDGED,
    ACQUIRED,
    ARCHIVED,
    AVAILABLE,
    INVALID_RECORD_STATE,
    ShareGroups,
    SharePartition,
    assign_share,
)
from mqk.store.manager import StoreManager
from mqk.store.statelog import LogStateDocs

ACCEPT, RELEASE, REJECT, GAP, RENEW = 1, 2, 3, 0, 4
T = uuid.uuid4()


def states(part: SharePartition) -> dict[int, int]:
    return {o: r.state for o, r in part.records.items()}


def test_a_share_partition_steps_through_its_record_states() -> None:
    part = SharePartition(10)
    assert part.acquire(range(10, 15), "a", deadline=100) == [(o, 1) for o in range(10, 15)]
    assert part.acquire(range(10, 15), "b", deadline=100) == []  # all held by a
    assert part.acknowledge("b", 10, 10, [ACCEPT], 100, limit=3) == INVALID_RECORD_STATE
    assert part.acknowledge("a", 10, 12, [ACCEPT, RELEASE, REJECT], 100, limit=3) == 0
    assert part.spso == 11 and states(part) == {11: AVAILABLE, 12: ARCHIVED, 13: ACQUIRED, 14: ACQUIRED}
    assert part.acquire(part.reacquirable(), "b", deadline=100) == [(11, 2)]  # delivered a second time
    assert part.expire(now=101, limit=3)  # the locks of 11, 13 and 14 end
    assert states(part) == {11: AVAILABLE, 12: ARCHIVED, 13: AVAILABLE, 14: AVAILABLE}
    part.acquire([11], "b", deadline=200)
    assert part.acknowledge("b", 11, 11, [RELEASE], 200, limit=3) == 0  # third delivery released: archived
    assert part.spso == 13
    part.acquire([13, 14], "c", deadline=300)
    assert part.release_member("c", limit=3) and states(part) == {13: AVAILABLE, 14: AVAILABLE}
    part.acquire([13, 14], "c", deadline=300)
    assert part.acknowledge("c", 13, 14, [ACCEPT], 300, limit=3) == 0
    assert part.spso == part.next_offset == 15 and part.records == {}
    part.archive(range(15, 17))  # a control batch: never handed out
    assert part.spso == 17


def test_locks_end_at_their_deadlines_whatever_order_they_were_given_or_renewed_in() -> None:
    part = SharePartition(0)
    part.acquire([0], "a", deadline=100)
    part.acquire([1], "b", deadline=200)
    part.acquire([2], "c", deadline=150)
    assert part.acknowledge("a", 0, 0, [RENEW], 300, limit=5) == 0  # 0's lock now ends at 300
    assert not part.expire(now=100, limit=5)
    assert part.expire(now=151, limit=5) and states(part) == {0: ACQUIRED, 1: ACQUIRED, 2: AVAILABLE}
    assert not part.expire(now=200, limit=5)
    assert part.expire(now=201, limit=5) and states(part) == {0: ACQUIRED, 1: AVAILABLE, 2: AVAILABLE}
    part.acquire([2], "d", deadline=250)  # a lock given after the others ended before it
    assert part.expire(now=251, limit=5) and states(part) == {0: ACQUIRED, 1: AVAILABLE, 2: AVAILABLE}
    assert not part.expire(now=300, limit=5)
    assert part.expire(now=301, limit=5) and states(part) == {0: AVAILABLE, 1: AVAILABLE, 2: AVAILABLE}


def test_a_share_partition_document_keeps_states_and_counts_but_not_locks() -> None:
    part = SharePartition(0)
    part.acquire(range(4), "a", deadline=100)
    part.acknowledge("a", 1, 1, [ACCEPT], 100, limit=5)
    back = SharePartition.from_doc(part.doc())
    assert back.spso == 0 and back.next_offset == 4
    assert {o: (r.state, r.delivery_count) for o, r in back.records.items()} == {
        0: (AVAILABLE, 1),
        1: (ACKNOWLEDGED, 1),
        2: (AVAILABLE, 1),
        3: (AVAILABLE, 1),
    }


def test_a_share_partition_document_saves_ranges_as_runs_and_reads_the_older_per_record_form() -> None:
    part = SharePartition(10)
    part.acquire(range(10, 1010), "a", deadline=100)
    part.acknowledge("a", 500, 500, [ACCEPT], 100, limit=5)
    part.acknowledge("a", 600, 601, [RELEASE, RELEASE], 100, limit=5)
    doc = part.doc()
    # three runs for a thousand records: an acquired record is saved as available (with its delivery), so the
    # released two are alike with the still held ones around them; the accepted one breaks the run
    assert doc["runs"] == [[10, 490, AVAILABLE, 1], [500, 1, ACKNOWLEDGED, 1], [501, 509, AVAILABLE, 1]]
    back = SharePartition.from_doc(doc)
    assert {o: (r.state, r.delivery_count) for o, r in back.records.items()} == {
        o: (r.state if r.state != ACQUIRED else AVAILABLE, r.delivery_count) for o, r in part.records.items()
    }
    older = {"spso": 10, "next": 13, "records": [[10, AVAILABLE, 2], [11, ACKNOWLEDGED, 1], [12, ARCHIVED, 5]]}
    read = SharePartition.from_doc(older)
    assert {o: (r.state, r.delivery_count) for o, r in read.records.items()} == {
        10: (AVAILABLE, 2),
        11: (ACKNOWLEDGED, 1),
        12: (ARCHIVED, 5),
    }
    assert read.spso == 10 and read.next_offset == 13  # (11 and 12 are done but wait behind 10)


def test_members_share_partitions_when_there_are_more_members_than_partitions() -> None:
    few = assign_share(["a", "b"], {T: 4}, {"a": {T}, "b": {T}})
    assert few == {"a": {T: frozenset({0, 2})}, "b": {T: frozenset({1, 3})}}
    many = assign_share(["a", "b", "c"], {T: 2}, {m: {T} for m in "abc"})
    assert all(many[m][T] for m in "abc") and set().union(*(many[m][T] for m in "abc")) == {0, 1}


def test_membership_epochs() -> None:
    groups = ShareGroups(lambda name: (T, 2) if name == "t" else None, session_timeout_ms=1000, clock=FakeClock())

    def beat(member: str, epoch: int) -> dict[str, Any]:
        body = {
            "group_id": "g",
            "member_id": member,
            "member_epoch": epoch,
            "subscribed_topic_names": ["t"] if epoch == 0 else None,
        }
        return groups.heartbeat(body, "c", "h")[0]

    a = beat("a", 0)
    epoch_a = a["member_epoch"]
    assert a["error_code"] == 0 and epoch_a > 0 and a["assignment"]["topic_partitions"][0]["partitions"] == [0, 1]
    b = beat("b", 0)
    assert b["member_epoch"] > epoch_a and b["assignment"]["topic_partitions"][0]["partitions"] == [1]
    # b's arrival moved the group on, not a: a's next heartbeat, at its own epoch, takes the new one and its
    # new assignment (Kafka's rule; fencing a here made every member rejoin whenever another joined)
    again = beat("a", epoch_a)
    assert again["error_code"] == 0 and again["member_epoch"] == b["member_epoch"]
    assert again["assignment"]["topic_partitions"][0]["partitions"] == [0]
    # its answer lost, a comes with its previous epoch: accepted, the assignment sent again
    lost = beat("a", epoch_a)
    assert lost["error_code"] == 0 and lost["assignment"]["topic_partitions"][0]["partitions"] == [0]
    steady = beat("a", b["member_epoch"])
    assert steady["error_code"] == 0 and steady["assignment"] is None  # (nothing new to tell)
    assert beat("a", b["member_epoch"] + 5)["error_code"] == 110  # ahead of what it was told: fenced
    assert beat("zz", 3)["error_code"] == 25
    assert beat("a", -1)["member_epoch"] == -1 and not groups.is_member("g", "a")


def test_a_groups_subscription_config_is_kept_in_its_state_document_and_makes_it_orderly() -> None:
    """A RocketMQ subscription group config (mqadmin updateSubGroup) rides in the group's state document, so a
    restarted broker (which loads the documents back) still knows the group is FIFO; a group never used is kept as
    configured only."""
    groups = ShareGroups(lambda name: None, clock=FakeClock())
    groups.subscriptions["fifo"] = {"groupName": "fifo", "consumeMessageOrderly": True}
    groups.subscriptions["plain"] = {"groupName": "plain", "consumeMessageOrderly": False}
    restarted = ShareGroups(lambda name: None, clock=FakeClock())
    for group in ("fifo", "plain"):
        restarted.load(group, groups.doc(group))
    assert restarted.orderly("fifo") and not restarted.orderly("plain") and not restarted.orderly("other")
    assert not restarted.exists("fifo")  # configured, never used: not listed as a group


async def test_requests_that_arrive_while_the_states_load_wait_for_that_one_load(memory_store: StoreManager) -> None:
    """The saved states are read once: a request that came in while the first read the log, and that runs after
    the first one acquired records, must not read them again (the saved document holds no acquisitions, so a
    second read would hand the acquired records out twice)."""
    await memory_store.create_topic("t", 1)
    topic_id = uuid.UUID(bytes=bytes(memory_store.topic("t").topic_id))  # type: ignore[union-attr]
    saved = ShareGroups(lambda _name: (topic_id, 1), clock=FakeClock())
    await saved.ensure_loaded(memory_store)
    saved.partition("g", topic_id, 0, 0, 0)
    await saved.save(["g"])  # a group with a state in the log, nothing held

    share = ShareGroups(lambda _name: (topic_id, 1), clock=FakeClock())
    reads = 0
    release = asyncio.Event()
    real = LogStateDocs.load_all

    async def slow_load_all(self: LogStateDocs) -> dict[str, dict[str, Any]]:
        nonlocal reads
        reads += 1
        await release.wait()
        return await real(self)

    LogStateDocs.load_all = slow_load_all  # type: ignore[method-assign]
    try:
        first = asyncio.create_task(share.ensure_loaded(memory_store))
        second = asyncio.create_task(share.ensure_loaded(memory_store))
        await asyncio.sleep(0)
        release.set()
        await first
        part = share.partition("g", topic_id, 0, 0, 3)
        assert part.acquire(range(3), "pop-owner", deadline=share.now() + 60_000) == [(0, 1), (1, 1), (2, 1)]
        await second
    finally:
        LogStateDocs.load_all = real  # type: ignore[method-assign]
    assert reads == 1
    assert share.partition("g", topic_id, 0, 0, 3) is part and {r.state for r in part.records.values()} == {ACQUIRED}

    share.unload()  # (cluster mode: a new master reads again)
    await share.ensure_loaded(memory_store)
    assert share.partition("g", topic_id, 0, 0, 3) is not part
