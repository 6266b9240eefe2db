"""Share groups (mqk.groups.share) without a broker: a share partition's record states step by step (acquire,
accept, release, reject, lock expiry, the delivery limit, control records, the start offset moving past what is
done, a document round trip), the spread of partitions over members, and the membership's epochs. On the wire:
tests/integration/test_share_groups_wire.py."""

from __future__ import annotations

import asyncio
import random
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
    return {o: state for o, (state, _count) in part.states().items()}


def take(part: SharePartition, first: int, end: int, member: str, deadline: float) -> list[tuple[int, int, int]]:
    return part.acquire(first, end, member, deadline, budget=1000)


def test_a_share_partition_steps_through_its_record_states() -> None:
    part = SharePartition(10)
    assert take(part, 10, 15, "a", deadline=100) == [(10, 14, 1)]
    assert take(part, 10, 15, "b", deadline=100) == []  # all held by a
    assert part.acknowledge("b", 10, 10, [ACCEPT], 100, limit=3) == INVALID_RECORD_STATE
    assert part.acknowledge("a", 10, 12, [ACCEPT, RELEASE, REJECT], 100, limit=3) == 0
    assert part.spso == 11 and states(part) == {11: AVAILABLE, 12: ARCHIVED, 13: ACQUIRED, 14: ACQUIRED}
    assert part.first_available() == 11
    assert take(part, 11, 15, "b", deadline=100) == [(11, 11, 2)]  # delivered a second time
    assert part.expire(now=101, limit=3)  # the locks of 11, 13 and 14 end
    assert states(part) == {11: AVAILABLE, 12: ARCHIVED, 13: AVAILABLE, 14: AVAILABLE}
    take(part, 11, 12, "b", deadline=200)
    assert part.acknowledge("b", 11, 11, [RELEASE], 200, limit=3) == 0  # third delivery released: archived
    assert part.spso == 13
    take(part, 13, 15, "c", deadline=300)
    assert part.release_member("c", limit=3) and states(part) == {13: AVAILABLE, 14: AVAILABLE}
    take(part, 13, 15, "c", deadline=300)
    assert part.acknowledge("c", 13, 14, [ACCEPT], 300, limit=3) == 0
    assert part.spso == part.next_offset == 15 and part.spans == []
    part.archive(15, 17)  # a control batch: never handed out
    assert part.spso == 17


def test_records_delivered_often_are_handed_out_in_halves_and_alone_at_their_last_delivery() -> None:
    """Kafka's throttling of redeliveries (delivery limit 5: from three deliveries on): a batch a consumer keeps
    releasing (it cannot get past one record) goes out in halves, each such run as a request's only acquisition,
    and a record's last delivery is made alone, so one bad record does not take the others to the limit."""
    part = SharePartition(0)
    part.dead = []  # (records archived at the limit are kept, as a RocketMQ group's dead letters are)

    def take(member: str) -> list[tuple[int, int, int]]:
        return part.acquire(0, 200, member, 1e12, 100, limit=5)  # (100..199 are new records, never taken here)

    def release(member: str, lo: int, hi: int) -> None:
        assert part.acknowledge(member, lo, hi, [RELEASE], 1e12, limit=5) == 0

    for delivery in (1, 2, 3):
        assert take("m") == [(0, 99, delivery)] and not part.held_back
        release("m", 0, 99)
    assert take("m") == [(0, 49, 4)] and part.held_back  # the fourth: half, and nothing new with it
    assert take("n") == [(50, 74, 4)] and part.held_back  # the other half's fourth: half of it
    release("m", 0, 49)
    assert take("m") == [(0, 0, 5)]  # the last delivery of each: alone
    assert take("m") == [(1, 1, 5)]
    assert part.acknowledge("m", 1, 1, [ACCEPT], 1e12, limit=5) == 0
    release("m", 0, 0)  # the bad record, released at its last delivery: archived, the others still to come
    assert part.dead == [0] and part.spso == 2 and states(part)[2] == AVAILABLE and part.next_offset == 100


def test_locks_end_at_their_deadlines_whatever_order_they_were_given_or_renewed_in() -> None:
    part = SharePartition(0)
    take(part, 0, 1, "a", deadline=100)
    take(part, 1, 2, "b", deadline=200)
    take(part, 2, 3, "c", deadline=150)
    assert part.acknowledge("a", 0, 0, [RENEW], 300, limit=5) == 0  # 0's lock now ends at 300
    assert not part.expire(now=100, limit=5)
    assert part.expire(now=151, limit=5) and states(part) == {0: ACQUIRED, 1: ACQUIRED, 2: AVAILABLE}
    assert not part.expire(now=200, limit=5)
    assert part.expire(now=201, limit=5) and states(part) == {0: ACQUIRED, 1: AVAILABLE, 2: AVAILABLE}
    take(part, 2, 3, "d", deadline=250)  # a lock given after the others ended before it
    assert part.expire(now=251, limit=5) and states(part) == {0: ACQUIRED, 1: AVAILABLE, 2: AVAILABLE}
    assert not part.expire(now=300, limit=5)
    assert part.expire(now=301, limit=5) and states(part) == {0: AVAILABLE, 1: AVAILABLE, 2: AVAILABLE}


def test_a_share_partition_document_keeps_states_and_counts_but_not_locks() -> None:
    part = SharePartition(0)
    take(part, 0, 4, "a", deadline=100)
    part.acknowledge("a", 1, 1, [ACCEPT], 100, limit=5)
    back = SharePartition.from_doc(part.doc())
    assert back.spso == 0 and back.next_offset == 4
    assert back.states() == {
        0: (AVAILABLE, 1),
        1: (ACKNOWLEDGED, 1),
        2: (AVAILABLE, 1),
        3: (AVAILABLE, 1),
    }


def test_a_share_partition_document_saves_ranges_as_runs_and_reads_the_older_per_record_form() -> None:
    part = SharePartition(10)
    take(part, 10, 1010, "a", deadline=100)
    part.acknowledge("a", 500, 500, [ACCEPT], 100, limit=5)
    part.acknowledge("a", 600, 601, [RELEASE, RELEASE], 100, limit=5)
    doc = part.doc()
    # three runs for a thousand records: an acquired record is saved as available (with its delivery), so the
    # released two are alike with the still held ones around them; the accepted one breaks the run
    assert doc["runs"] == [[10, 490, AVAILABLE, 1], [500, 1, ACKNOWLEDGED, 1], [501, 509, AVAILABLE, 1]]
    back = SharePartition.from_doc(doc)
    assert back.states() == {
        o: (state if state != ACQUIRED else AVAILABLE, count) for o, (state, count) in part.states().items()
    }
    older = {"spso": 10, "next": 13, "records": [[10, AVAILABLE, 2], [11, ACKNOWLEDGED, 1], [12, ARCHIVED, 5]]}
    read = SharePartition.from_doc(older)
    assert read.states() == {
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


def test_a_partition_moving_to_a_member_not_told_yet_stays_with_the_member_that_had_it() -> None:
    """Members hear of a new assignment only with their own heartbeats. A partition that goes from a member that
    heartbeats now to one that will only in a heartbeat interval stays with the first until the second is told,
    so nobody stops fetching it meanwhile (once seen as a 5 s stall of one partition when three members joined)."""
    groups = ShareGroups(lambda name: (T, 3) if name == "t" else None, clock=FakeClock())
    epochs: dict[str, int] = {}

    def told(member: str) -> list[int] | None:
        body = {
            "group_id": "g",
            "member_id": member,
            "member_epoch": epochs.get(member, 0),
            "subscribed_topic_names": ["t"] if member not in epochs else None,
        }
        answer = groups.heartbeat(body, "c", "h")[0]
        assert answer["error_code"] == 0, answer
        epochs[member] = answer["member_epoch"]
        return None if answer["assignment"] is None else answer["assignment"]["topic_partitions"][0]["partitions"]

    assert told("c") == [0, 1, 2]
    assert told("b") == [0, 2]  # (b and c: b takes 0 and 2)
    assert told("c") == [1]  # 0 and 2 went to b, which has been told them
    assert told("a") == [0]  # (a, b and c: one each; 1 goes to b, which has not heard yet)
    assert told("c") == [1, 2]  # so c keeps 1 beside its new 2
    assert told("b") == [1]
    assert told("c") == [2]  # b has been told 1: c lets it go
    assert told("a") is None and told("b") is None and told("c") is None


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
    reading, release = asyncio.Event(), asyncio.Event()
    real = LogStateDocs.load_all

    async def slow_load_all(self: LogStateDocs) -> dict[str, dict[str, Any]]:
        nonlocal reads
        reads += 1
        reading.set()
        await release.wait()
        return await real(self)

    LogStateDocs.load_all = slow_load_all  # type: ignore[method-assign]
    try:
        first = asyncio.create_task(share.ensure_loaded(memory_store))
        second = asyncio.create_task(share.ensure_loaded(memory_store))
        await reading.wait()  # (the first request is reading the log)
        release.set()
        await first
        part = share.partition("g", topic_id, 0, 0, 3)
        assert take(part, 0, 3, "pop-owner", deadline=share.now() + 60_000) == [(0, 2, 1)]
        await second
    finally:
        LogStateDocs.load_all = real  # type: ignore[method-assign]
    assert reads == 1
    assert share.partition("g", topic_id, 0, 0, 3) is part and set(states(part).values()) == {ACQUIRED}

    share.unload()  # (cluster mode: a new master reads again)
    await share.ensure_loaded(memory_store)
    assert share.partition("g", topic_id, 0, 0, 3) is not part


class PerRecordModel:
    """The record states kept one entry a record, the plainest reading of KIP-932's rules: what SharePartition's
    spans must agree with, operation by operation. An offset of [spso, next) with no entry is done (a gap)."""

    def __init__(self, spso: int) -> None:
        self.spso = self.next = spso
        #: offset -> [state, delivery count, owner, deadline]
        self.records: dict[int, list[Any]] = {}

    def advance(self) -> None:
        while self.spso < self.next:
            rec = self.records.get(self.spso)
            if rec is not None and rec[0] not in (ACKNOWLEDGED, ARCHIVED):
                break
            self.records.pop(self.spso, None)
            self.spso += 1

    def release(self, rec: list[Any], limit: int) -> None:
        rec[0], rec[2], rec[3] = (AVAILABLE if rec[1] < limit else ARCHIVED), "", 0.0

    def acquire(self, first: int, end: int, member: str, deadline: float, budget: int, new_below: int) -> list:
        got = []
        for o in range(first, min(end, self.next)):
            rec = self.records.get(o)
            if budget and rec is not None and rec[0] == AVAILABLE:
                rec[0], rec[1], rec[2], rec[3] = ACQUIRED, rec[1] + 1, member, deadline
                got.append((o, rec[1]))
                budget -= 1
        o = max(first, self.next)
        while o < end and budget and o < new_below:
            self.records[o] = [ACQUIRED, 1, member, deadline]
            got.append((o, 1))
            budget -= 1
            self.next = o = o + 1
        self.advance()
        return got

    def unlock(self, which: Any, limit: int) -> bool:
        hit = [r for r in self.records.values() if r[0] == ACQUIRED and which(r)]
        for rec in hit:
            self.release(rec, limit)
        self.advance()
        return bool(hit)

    def archive(self, first: int, end: int) -> None:
        for o in range(first, min(end, self.next)):
            if (rec := self.records.get(o)) is not None and rec[0] == AVAILABLE:
                rec[0] = ARCHIVED
        self.next = max(self.next, end)
        self.advance()

    def acknowledge(self, member: str, first: int, last: int, types: list[int], deadline: float, limit: int) -> int:
        chosen = []
        for i, o in enumerate(range(first, last + 1)):
            kind = types[0] if len(types) == 1 else types[i]
            rec = self.records.get(o) if o < self.next else None
            if kind == GAP and (rec is None or rec[2] == member):
                chosen.append((rec, kind))
            elif rec is None or rec[0] != ACQUIRED or rec[2] != member:
                return INVALID_RECORD_STATE
            else:
                chosen.append((rec, kind))
        for rec, kind in chosen:
            if rec is None:
                continue
            if kind == RENEW:
                rec[3] = deadline
            elif kind == ACCEPT:
                rec[0], rec[2], rec[3] = ACKNOWLEDGED, "", 0.0
            elif kind == RELEASE:
                self.release(rec, limit)
            else:
                rec[0], rec[2], rec[3] = ARCHIVED, "", 0.0
        self.advance()
        return 0


def test_spans_agree_with_a_per_record_model_over_random_operations() -> None:
    """Acquisitions, acknowledgements of every kind (one type for a range, or one per record), lock expiry,
    members leaving, archived control batches, renewed receipts handed over, gaps in the log and the in-flight
    bound, in a seeded random order: the spans give the model's states, holders, counts and document at every
    step, while holding far fewer entries than records."""
    limit, members = 3, ["a", "b", "c"]
    for seed in range(40):
        rng = random.Random(seed)
        part, model = SharePartition(100), PerRecordModel(100)
        dead: list[int] = []
        part.dead = dead
        now = 0.0
        for step in range(300):
            now += rng.randint(0, 40)
            op = rng.random()
            first = model.spso + rng.randint(-3, 60)
            end = first + rng.randint(1, 80)
            member = rng.choice(members)
            if op < 0.3:
                budget, bound, deadline = (
                    rng.randint(1, 90),
                    model.spso + rng.randint(20, 200),
                    now + rng.randint(10, 200),
                )
                got = part.acquire(first, end, member, deadline, budget, bound)
                expanded = [(o, c) for lo, hi, c in got for o in range(lo, hi + 1)]
                assert sorted(expanded) == sorted(model.acquire(first, end, member, deadline, budget, bound))
            elif op < 0.6:
                last = first + rng.randint(0, 40)
                if rng.random() < 0.5:
                    types = [rng.choice([GAP, ACCEPT, RELEASE, REJECT, RENEW])]
                else:
                    types = [rng.choice([ACCEPT, RELEASE, REJECT, RENEW, GAP]) for _ in range(last - first + 1)]
                expected = model.acknowledge(member, first, last, types, now + 300, limit)
                assert part.acknowledge(member, first, last, types, now + 300, limit) == expected, (seed, step)
            elif op < 0.7:
                assert part.expire(now, limit) == model.unlock(lambda r, now=now: r[3] < now, limit)
            elif op < 0.75:
                assert part.release_member(member, limit) == model.unlock(lambda r, m=member: r[2] == m, limit)
            elif op < 0.85:
                part.archive(first, end)
                model.archive(first, end)
            elif op < 0.9 and model.records:
                offset = rng.choice(sorted(model.records))
                rec = model.records[offset]
                handed = part.hand_over(offset, member, "renewed-" + member)
                assert handed == (rec[0] == ACQUIRED and rec[2] == member)
                if handed:
                    rec[2] = "renewed-" + member
            else:
                gap_end = model.next + rng.randint(1, 5)  # the log skips offsets (a compacted topic)
                part.acquire(gap_end, gap_end + 3, member, now + 50, 3, gap_end + 3)
                model.acquire(gap_end, gap_end + 3, member, now + 50, 3, gap_end + 3)
            assert (part.spso, part.next_offset) == (model.spso, model.next), (seed, step)
            assert part.states() == {o: (r[0], r[1]) for o, r in model.records.items()}, (seed, step)
            for o, r in model.records.items():
                assert part.holds(o, r[2], r[1]) == (r[0] == ACQUIRED), (seed, step, o)
            held = [r[3] for r in model.records.values() if r[0] == ACQUIRED]
            assert part.next_lock_end() == min(held, default=None)
            assert part.lag(model.next + 7) == 7 + sum(r[0] in (AVAILABLE, ACQUIRED) for r in model.records.values())
            back = SharePartition.from_doc(part.doc())
            assert back.states() == {
                o: (r[0] if r[0] != ACQUIRED else AVAILABLE, r[1]) for o, r in model.records.items()
            }
            assert len(part.spans) <= len(model.records)
        assert len(set(dead)) == len(dead)  # a record is a dead letter once
