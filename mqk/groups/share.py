"""Kafka share groups (KIP-932, "queues for Kafka"): membership, and the per-record state of each share partition.

Membership (ShareGroupHeartbeat): members join with epoch 0, leave with -1, and are removed when their session ends
without a heartbeat. The group's partitions are spread over its members (`assign_share`): with fewer members than
partitions each partition has one member; with more, partitions are shared so every member has one. Nothing is
revoked first: records, not partitions, are what a member owns, one acquisition at a time. The group epoch moves on
when a member joins or the assignment changes; a member takes it with its own next heartbeat, as Kafka's
coordinator moves a member's epoch: a heartbeat with the member's epoch, or with the one before it (its last answer
was lost: the assignment is sent again), is accepted, any other is FENCED_MEMBER_EPOCH.

Share partition state (`SharePartition`, one per group and partition): the share-partition start offset (SPSO; every
record below it is done) and, from there up to the next offset never handed out, each record's state:
AVAILABLE -> ACQUIRED (by one member, with a lock deadline and a delivery count) -> ACKNOWLEDGED (accepted) or
ARCHIVED (rejected, a gap, or delivered `delivery_count_limit` times); a release or an expired lock makes it
AVAILABLE again. The SPSO moves past the records that are done. At most `max_record_locks` records past the SPSO are
in flight, so a partition's state stays bounded whatever its consumers do. The states are kept as spans of
consecutive records alike (`Span`), as Kafka's share partition keeps in-flight batches: records are acquired and
settled a batch at a time, so a request's work follows its ranges, not its records. A group's first look at a
partition starts it at the log's end or start (`share.auto.offset.reset`: latest, as Kafka, or earliest).

The state is durable: after every change a request makes, the group's document (SPSO, and each in-flight record's
state and delivery count) is written to the compacted internal topic `__share_group_state` (one record per group,
the latest wins), and read back at start. An acquisition does not survive a restart (locks are in memory): what was
acquired comes back AVAILABLE, with its delivery count, so an accepted record is never delivered again and an
unacknowledged one is delivered again after the restart, as after its lock expiring.

Cluster mode: the topic is local to each broker group (mqk.broker.internal) and replicated with its log, so a
group's master keeps the states of the partitions (RocketMQ: queues) it holds, as a RocketMQ broker keeps its own;
a share group's coordinator keeps its members. A broker that becomes or stops being its group's master forgets what
it held (`unload`): the next use reads the states its predecessor saved, which it replicated.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from mqk import errors as E
from mqk.clock import SYSTEM_CLOCK, Clock
from mqk.groups.answers import FENCED_MEMBER_EPOCH, NONE, described_group, described_partitions, heartbeat_answer
from mqk.protocol.kafka.aborted import NO_ABORTS, AbortedBatches

log = logging.getLogger("mqk.groups")

AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = 0, 1, 2, 4
#: AcknowledgeType values of ShareFetch / ShareAcknowledge
GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4
INVALID_RECORD_STATE = 121

Assignment = dict[uuid.UUID, frozenset[int]]
#: bytes read from a partition at a time while acquiring: about READ_BYTES_PER_RECORD for each record still wanted,
#: within [READ_BYTES_MIN, READ_BYTES_MAX] (a pop of 32 small records must not decode a megabyte of batches)
READ_BYTES_PER_RECORD = 512
READ_BYTES_MIN, READ_BYTES_MAX = 16 << 10, 1 << 20


def is_control_batch(data: Any) -> bool:
    """A control batch (transaction marker): attributes bit 5, at bytes 21-22 of a record batch v2."""
    return len(data) > 22 and bool(data[22] & 0x20)


def assign_share(
    members: list[str], topics: dict[uuid.UUID, int], subscriptions: dict[str, set[uuid.UUID]]
) -> dict[str, Assignment]:
    """Each subscribed partition to one of its topic's subscribers, evenly; when a topic has more subscribers than
    partitions its partitions go round again, so every subscriber has one (records are shared, not partitions)."""
    out: dict[str, dict[uuid.UUID, set[int]]] = {m: {} for m in members}
    for topic_id, count in sorted(topics.items(), key=lambda kv: str(kv[0])):
        subscribers = sorted(m for m in members if topic_id in subscriptions.get(m, ()))
        if not subscribers or count <= 0:
            continue
        for i, m in enumerate(subscribers):
            mine = {p for p in range(count) if p % len(subscribers) == i}
            if not mine:
                mine = {i % count}
            out[m].setdefault(topic_id, set()).update(mine)
    return {m: {t: frozenset(ps) for t, ps in a.items()} for m, a in out.items()}


@dataclass(eq=False)
class ShareMember:
    member_id: str
    client_id: str
    client_host: str
    rack_id: str | None = None
    member_epoch: int = 0
    #: the epoch it held before its last heartbeat's answer (a member whose answer was lost comes with it)
    previous_epoch: int = -1
    topics: tuple[str, ...] = ()
    assignment: Assignment = field(default_factory=dict)
    sent: Assignment | None = None
    session_deadline: float = 0.0


#: the states a record is done in: the SPSO moves past them
DONE = (ACKNOWLEDGED, ARCHIVED)


class Span:
    """Consecutive offsets [first, end) of a share partition in one state: one delivery count, one owner and one
    lock deadline (ACQUIRED; "" and 0 otherwise). Records are acquired and settled in ranges, so a partition holds
    a few spans where it would hold thousands of records."""

    __slots__ = ("count", "deadline", "end", "first", "owner", "state")

    def __init__(self, first: int, end: int, state: int, count: int = 0, owner: str = "", deadline: float = 0.0):
        self.first = first
        self.end = end
        self.state = state
        self.count = count
        self.owner = owner
        self.deadline = deadline

    def alike(self, other: Span) -> bool:
        return (
            self.state == other.state
            and self.count == other.count
            and self.owner == other.owner
            and self.deadline == other.deadline
        )

    def __repr__(self) -> str:
        return f"Span({self.first}, {self.end}, state={self.state}, count={self.count}, owner={self.owner!r})"


def _span_end(span: Span) -> int:
    return span.end


def _throttled(span: Span, limit: int) -> int | None:
    """How many of an AVAILABLE span's records its next delivery may take (None: as many as asked): one for
    their last delivery; from half the delivery limit on (at least 2), half as many at each further delivery."""
    if limit > 2 and span.count >= limit - 1:
        return 1
    threshold = max(2, -(-limit // 2))
    if span.count >= threshold:
        return max(1, (span.end - span.first) >> (span.count - threshold + 1))
    return None


class SharePartition:
    """One share group's state of one partition (see the module docstring): the SPSO, the first offset never handed
    out (`next_offset`), and between them the in-flight records as ordered, non-overlapping spans. An offset of
    [spso, next_offset) that no span covers is done (a gap in the log, or a control record archived on sight)."""

    def __init__(self, spso: int) -> None:
        self.spso = spso
        #: the first offset never handed out
        self.next_offset = spso
        self.spans: list[Span] = []
        #: the offsets archived for reaching the delivery limit since last taken (`ShareGroups.take_dead_letters`),
        #: kept only for the groups whose dead letters go somewhere (RocketMQ's %DLQ%group); None: not kept
        self.dead: list[int] | None = None
        #: the last `acquire` met records it throttles: the request that asked takes nothing more
        self.held_back = False

    # --- spans ---------------------------------------------------------------------------------------------------

    def _index(self, offset: int) -> int:
        """The index of the first span that ends past `offset` (the one holding it, if any does)."""
        spans = self.spans
        # (the front and the back first: records are mostly settled at the front and taken at the back)
        if not spans or offset < spans[0].end:
            return 0
        if offset >= spans[-1].end:
            return len(spans)
        return bisect_right(spans, offset, key=_span_end)

    def _span_at(self, offset: int) -> Span | None:
        i = self._index(offset)
        return self.spans[i] if i < len(self.spans) and self.spans[i].first <= offset else None

    def _cut(self, offset: int) -> int:
        """Split the span holding `offset` so that one starts there; the index of the first span at or past it."""
        i = self._index(offset)
        if i < len(self.spans) and (span := self.spans[i]).first < offset:
            self.spans.insert(i + 1, Span(offset, span.end, span.state, span.count, span.owner, span.deadline))
            span.end = offset
            return i + 1
        return i

    def _between(self, first: int, end: int) -> tuple[int, int]:
        """Cut at both ends: spans[i:j] are those within [first, end)."""
        i = self._cut(first)
        return i, self._cut(end)

    def _join(self, lo: int = 0, hi: int | None = None) -> None:
        """Join alike neighbours among spans[lo - 1 : hi + 1] (all of them by default)."""
        spans = self.spans
        k = max(lo - 1, 0)
        stop = len(spans) if hi is None else min(hi + 1, len(spans))
        while k < stop - 1:
            a, b = spans[k], spans[k + 1]
            if a.end == b.first and a.alike(b):
                a.end = b.end
                del spans[k + 1]
                stop -= 1
            else:
                k += 1

    def _release(self, span: Span, limit: int) -> None:
        """The span's records are no longer held: AVAILABLE again, or ARCHIVED (dead letters) at the delivery
        limit."""
        span.owner, span.deadline = "", 0.0
        if span.count < limit:
            span.state = AVAILABLE
            return
        span.state = ARCHIVED
        if self.dead is not None:
            self.dead.extend(range(span.first, span.end))

    def states(self) -> dict[int, tuple[int, int]]:
        """Offset -> (state, delivery count) of every in-flight record (for inspection: it is one entry a record)."""
        return {o: (s.state, s.count) for s in self.spans for o in range(s.first, s.end)}

    # --- locks ---------------------------------------------------------------------------------------------------

    def expire(self, now: float, limit: int) -> bool:
        """Locks past their deadline end: the records are AVAILABLE again (ARCHIVED at the delivery limit)."""
        return self._unlock(lambda span: span.deadline < now, limit)

    def release_member(self, member_id: str, limit: int) -> bool:
        """Every record the member holds is AVAILABLE again (ARCHIVED at the delivery limit): it left."""
        return self._unlock(lambda span: span.owner == member_id, limit)

    def _unlock(self, which: Callable[[Span], bool], limit: int) -> bool:
        changed = False
        for span in self.spans:
            if span.state == ACQUIRED and which(span):
                self._release(span, limit)
                changed = True
        if changed:
            self._join()
            self.advance()
        return changed

    def held(self) -> bool:
        """Whether any record is held (ACQUIRED)."""
        return any(span.state == ACQUIRED for span in self.spans)

    def next_lock_end(self) -> float | None:
        """When the first lock ends (None: nothing is held)."""
        return min((span.deadline for span in self.spans if span.state == ACQUIRED), default=None)

    # --- counts ----------------------------------------------------------------------------------------------------

    def lag(self, end: int) -> int:
        """Records from the SPSO to `end` not yet done (Kafka's share-partition lag)."""
        pending = sum(min(s.end, end) - s.first for s in self.spans if s.first < end and s.state not in DONE)
        return pending + max(0, end - self.next_offset)

    def takeable(self, end: int, now: float) -> int:
        """How many records below `end` an acquisition could take now: those never handed out, AVAILABLE ones,
        and held ones whose lock has ended."""
        again = sum(
            s.end - s.first for s in self.spans if s.state == AVAILABLE or (s.state == ACQUIRED and s.deadline < now)
        )
        return max(0, end - self.next_offset) + again

    def first_available(self) -> int | None:
        """The first AVAILABLE offset (a released or expired record, handed out again before new ones)."""
        return next((s.first for s in self.spans if s.state == AVAILABLE), None)

    # --- changes ---------------------------------------------------------------------------------------------------

    def advance(self) -> None:
        """Move the SPSO past every record that is done."""
        spans = self.spans
        i = 0
        while i < len(spans) and spans[i].state in DONE:
            i += 1
        if i:
            del spans[:i]
        self.spso = spans[0].first if spans else self.next_offset

    def drop_below(self, start: int) -> None:
        """The log no longer holds the records below `start` (retention): they can no longer be delivered."""
        del self.spans[: self._cut(start)]
        self.next_offset = max(self.next_offset, start)
        self.advance()
        self.spso = max(self.spso, start)

    def acquire(
        self,
        first: int,
        end: int,
        member_id: str,
        deadline: float,
        budget: int,
        new_below: int | None = None,
        *,
        limit: int | None = None,
        fresh: bool = True,
    ) -> list[tuple[int, int, int]]:
        """Acquire for the member up to `budget` records of [first, end): AVAILABLE ones, then new ones from
        `next_offset` on (below `new_below`, when given: the bound on records in flight). The acquired ranges,
        (first offset, last offset, delivery count) each.

        With the group's delivery `limit`, records delivered often are throttled as Kafka throttles them, so that
        one record a consumer cannot get past does not take a whole batch to the limit with it: from half the
        limit on, a run of such records is handed out halved at each further delivery, and a record's last
        delivery is made alone. Such a run is acquired only as the request's first (`fresh`: the request has
        taken nothing yet), and the request takes nothing after it; `held_back` says so to the caller."""
        out: list[tuple[int, int, int]] = []
        spans = self.spans
        self.held_back = False
        touched = i = self._index(first)
        while budget > 0 and i < len(spans) and (span := spans[i]).first < end:
            if span.state == AVAILABLE:
                if span.first < first:
                    i = self._cut(first)
                    span = spans[i]
                cap = None if limit is None else _throttled(span, limit)
                if cap is not None:
                    self.held_back = True
                    if out or not fresh:
                        break  # (delivered by itself, to the next request)
                    budget = min(budget, cap)
                if span.end > min(end, span.first + budget):
                    self._cut(min(end, span.first + budget))
                span.state, span.owner, span.deadline = ACQUIRED, member_id, deadline
                span.count += 1
                out.append((span.first, span.end - 1, span.count))
                budget -= span.end - span.first
                if self.held_back:
                    break
            i += 1
        if self.held_back:
            budget = 0
        lo = max(first, self.next_offset)
        hi = min(end, lo + budget, end if new_below is None else new_below)
        if out:
            self._join(touched)
        if hi > lo:
            gap = lo > self.next_offset  # (offsets the log does not have: done)
            back = spans[-1] if spans else None
            if (
                back is not None
                and back.end == lo
                and back.state == ACQUIRED
                and back.count == 1
                and back.owner == member_id
                and back.deadline == deadline
            ):
                back.end = hi  # (the run this member was given just before, one lock for both)
            else:
                spans.append(Span(lo, hi, ACQUIRED, 1, member_id, deadline))
            self.next_offset = hi
            out.append((lo, hi - 1, 1))
            if gap:
                self.advance()
        return out

    def holds(self, offset: int, member_id: str, delivery_count: int | None = None) -> bool:
        """Whether the member holds the record at `offset` (from its `delivery_count`-th delivery, when given): not
        since settled, nor released, nor delivered again after its lock ran out."""
        span = self._span_at(offset)
        return (
            span is not None
            and span.state == ACQUIRED
            and span.owner == member_id
            and (delivery_count is None or span.count == delivery_count)
        )

    def hand_over(self, offset: int, member_id: str, new_member_id: str) -> bool:
        """The record the member holds at `offset` is held by `new_member_id` from now on (a RocketMQ receipt
        renewed: the old receipt no longer settles it); whether it was the member's."""
        if not self.holds(offset, member_id):
            return False
        i, _j = self._between(offset, offset + 1)
        self.spans[i].owner = new_member_id
        return True

    def archive(self, first: int, end: int) -> None:
        """The records of [first, end) nobody is to receive (control records, or ones the group's filter refuses):
        done at once, new ones (never in flight: the SPSO passes them) and AVAILABLE ones alike."""
        below = min(end, self.next_offset)
        if first < below:
            i, j = self._between(first, below)
            for span in self.spans[i:j]:
                if span.state == AVAILABLE:
                    span.state = ARCHIVED
            self._join(i, j)
        self.next_offset = max(self.next_offset, end)
        self.advance()

    def acknowledge(self, member_id: str, first: int, last: int, types: list[int], deadline: float, limit: int) -> int:
        """Apply one acknowledgement batch; INVALID_RECORD_STATE when a record in it is not acquired by the member
        (nothing of the batch is applied then). A released record delivered `limit` times is archived."""
        if last < first or not types or (len(types) != 1 and len(types) != last - first + 1):
            return E.InvalidRequestError.code
        if len(types) == 1:
            runs = [(first, last + 1, types[0])]
            if not self._settleable(member_id, first, last + 1, types[0]):
                return INVALID_RECORD_STATE
        else:
            runs = []
            for offset, kind in enumerate(types, first):
                if runs and runs[-1][2] == kind:
                    runs[-1] = (runs[-1][0], offset + 1, kind)
                else:
                    runs.append((offset, offset + 1, kind))
            if not all(self._settleable(member_id, f, e, kind) for f, e, kind in runs):
                return INVALID_RECORD_STATE
        spans = self.spans
        for f, e, kind in runs:
            below = min(e, self.next_offset)
            if f >= below:
                continue  # (a gap past what was handed out)
            if kind in (ACCEPT, REJECT, GAP) and spans and spans[0].first == f and below < spans[0].end:
                spans[0].first = below  # done at the front: the SPSO passes them now (no span of their own)
                continue
            i, j = self._between(f, below)
            for span in self.spans[i:j]:
                if kind == RENEW:
                    span.deadline = deadline
                elif kind == ACCEPT:
                    span.state, span.owner, span.deadline = ACKNOWLEDGED, "", 0.0
                elif kind == RELEASE:
                    self._release(span, limit)
                else:  # REJECT, GAP
                    span.state, span.owner, span.deadline = ARCHIVED, "", 0.0
            self._join(i, j)
        self.advance()
        return NONE

    def _settleable(self, member_id: str, first: int, end: int, kind: int) -> bool:
        """Whether the member may settle [first, end) with `kind`: it holds every record there (GAP: every one
        there is its own or none's)."""
        at, i = first, self._index(first)
        while at < end:
            span = self.spans[i] if i < len(self.spans) else None
            if span is None or span.first > at:  # offsets no span holds
                if kind != GAP:
                    return False
                at = end if span is None else span.first
                continue
            if span.owner != member_id or (kind != GAP and span.state != ACQUIRED):
                return False
            at, i = span.end, i + 1
        return True

    # --- saved form -------------------------------------------------------------------------------------------------

    def doc(self) -> dict[str, Any]:
        """The saved form: the in-flight records as runs `[first offset, length, state, delivery count]` (an
        acquisition is saved as AVAILABLE: locks do not survive a restart). A document is written after every
        request that changes the group, so its size is what a request costs: a span is at most one run."""
        runs: list[list[int]] = []
        for span in self.spans:
            state = span.state if span.state != ACQUIRED else AVAILABLE
            last = runs[-1] if runs else None
            if last is not None and last[0] + last[1] == span.first and last[2] == state and last[3] == span.count:
                last[1] += span.end - span.first
            else:
                runs.append([span.first, span.end - span.first, state, span.count])
        return {"spso": self.spso, "next": self.next_offset, "runs": runs}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> SharePartition:
        part = cls(int(doc["spso"]))
        part.next_offset = max(part.spso, int(doc.get("next", part.spso)))
        found = [(int(f), int(f) + int(n), int(s), int(c)) for f, n, s, c in doc.get("runs", [])]
        # (the form written before runs: one per record)
        found += [(int(o), int(o) + 1, int(s), int(c)) for o, s, c in doc.get("records", [])]
        at = part.spso
        for first, end, state, count in sorted(found):
            first, end = max(first, at), min(end, part.next_offset)
            if first < end:
                part.spans.append(Span(first, end, state, count))
                at = end
        part._join()
        part.advance()
        return part


@dataclass(eq=False)
class ShareGroup:
    group_id: str
    group_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    #: (topic id, partition) -> its state
    partitions: dict[tuple[uuid.UUID, int], SharePartition] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return "Stable" if self.members else "Empty"


@dataclass
class ShareSession:
    """A member's share session with this broker (ShareFetch / ShareAcknowledge): the epoch its next request must
    carry and the partitions it fetches."""

    epoch: int
    partitions: set[tuple[uuid.UUID, int]] = field(default_factory=set)


def _int_within(low: int, high: int) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        try:
            number = int(value)
        except ValueError:
            return f"{value!r} is not an integer"
        return None if low <= number <= high else f"{number} is outside [{low}, {high}]"

    return check


#: Kafka's group configs (GroupConfig) of share groups that a group may override (IncrementalAlterConfigs on a
#: GROUP resource), each with the check of a value; the broker's `group_share_*` settings are the defaults
GROUP_CONFIGS: dict[str, Callable[[str], str | None]] = {
    "share.session.timeout.ms": _int_within(1_000, 3_600_000),
    "share.heartbeat.interval.ms": _int_within(100, 3_600_000),
    "share.record.lock.duration.ms": _int_within(1_000, 3_600_000),
    "share.delivery.count.limit": _int_within(2, 10),
    "share.auto.offset.reset": lambda v: None if v in ("latest", "earliest") else f"{v!r} is not latest or earliest",
    "share.isolation.level": lambda v: (
        None if v in ("read_uncommitted", "read_committed") else f"{v!r} is not read_uncommitted or read_committed"
    ),
}

#: where the share groups' record states are kept (Kafka's name for its share coordinator's topic; an internal
#: topic: mqk.broker.internal)
SHARE_GROUP_STATE_TOPIC = "__share_group_state"


class MovingShareStates:
    """A partition's share group states by topic name, as a partition moving to another broker group gives and
    takes them (mqk.broker.moves.ShareStates; the engine keys partitions by topic id, the store knows it)."""

    def __init__(self, share: ShareGroups, store: Any) -> None:
        self.share = share
        self.store = store

    def _topic_id(self, topic: str) -> uuid.UUID | None:
        info = self.store.topic(topic)
        return None if info is None else uuid.UUID(bytes=bytes(info.topic_id))

    async def give(self, topic: str, partition: int) -> dict[str, Any]:
        topic_id = self._topic_id(topic)
        return {} if topic_id is None else await self.share.export_partition(self.store, topic_id, partition)

    async def take(self, topic: str, partition: int, states: dict[str, Any]) -> None:
        topic_id = self._topic_id(topic)
        if topic_id is not None:
            await self.share.import_partition(self.store, topic_id, partition, states)


class ShareGroups:
    """Every share group this broker coordinates, and their partitions' record states."""

    def __init__(
        self,
        topics: Callable[[str], tuple[uuid.UUID, int] | None],
        *,
        session_timeout_ms: int = 45_000,
        heartbeat_interval_ms: int = 5_000,
        record_lock_duration_ms: int = 30_000,
        delivery_count_limit: int = 5,
        max_record_locks: int = 2000,
        auto_offset_reset: str = "latest",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.topics = topics
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.record_lock_duration_ms = record_lock_duration_ms
        self.delivery_count_limit = delivery_count_limit
        self.max_record_locks = max_record_locks
        self.auto_offset_reset = auto_offset_reset
        self.clock = clock
        self.groups: dict[str, ShareGroup] = {}
        #: group id -> its overrides of GROUP_CONFIGS (kept in its state document, so they survive restarts)
        self.configs: dict[str, dict[str, str]] = {}
        #: the groups whose dead letters are kept (keep_dead_letters)
        self.dead_letter_groups: set[str] = set()
        #: (group id, member id) -> its share session
        self.sessions: dict[tuple[str, str], ShareSession] = {}
        #: group id -> its RocketMQ subscription group config (SubscriptionGroupConfig as mqadmin sent it, kept in
        #: the group's state document): `consumeMessageOrderly` makes the group's acquisitions ordered
        self.subscriptions: dict[str, dict[str, Any]] = {}
        #: the Kafka transaction coordinator (its `last_stable` and `aborted_ranges`), when transactions are on: a
        #: read_committed group acquires below a partition's last stable offset and skips aborted transactions
        self.transactions: Any = None
        self._docs: Any = None
        #: one load at a time: a second request that arrives while the first reads the log waits for that read
        #: instead of reading again (a second read would put back, over what the first request then acquired,
        #: the saved states, where nothing is acquired)
        self._loading = asyncio.Lock()
        #: bumped by `unload`: a load that was under way then does not install what it read
        self._generation = 0
        #: cluster mode: the groups' configs are the cluster's (`use_cluster_configs`), not the documents'
        self.configs_from_cluster = False
        #: cluster mode: writes a group's new overrides where the cluster keeps them (None: `configure` and save)
        self.config_writer: Callable[[str, dict[str, str]], Awaitable[None]] | None = None

    async def ensure_loaded(self, store: Any) -> None:
        """Read the groups' saved record states the first time share groups are used (mqk.store.statelog)."""
        if self._docs is not None:
            return
        async with self._loading:
            if self._docs is not None:
                return
            from mqk.store.statelog import LogStateDocs

            generation = self._generation
            docs = LogStateDocs(store, SHARE_GROUP_STATE_TOPIC)
            await docs.prepare()
            saved = await docs.load_all()
            if generation != self._generation:
                return  # unloaded meanwhile (cluster mode: mastership changed): the next use reads again
            for group_id, doc in saved.items():
                self.load(group_id, doc)
            self._docs = docs

    async def export_partition(self, store: Any, topic_id: uuid.UUID, partition: int) -> dict[str, dict[str, Any]]:
        """Each share group's saved form of one partition's state: a partition moving to another broker group takes
        its share groups' progress with it (mqk.broker.moves). Nothing, and nothing created, without saved states."""
        if self._docs is None and store.topic(SHARE_GROUP_STATE_TOPIC) is None:
            return {}
        await self.ensure_loaded(store)
        key = (topic_id, partition)
        return {g.group_id: g.partitions[key].doc() for g in self.groups.values() if key in g.partitions}

    async def import_partition(
        self, store: Any, topic_id: uuid.UUID, partition: int, docs: dict[str, dict[str, Any]]
    ) -> None:
        """Take over a partition's share group states exported by another broker group, and save them (before the
        partition is served here). ValueError for a document that is not one (nothing taken then)."""
        if not docs:
            return
        try:
            parts = {group_id: SharePartition.from_doc(doc) for group_id, doc in docs.items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"a share partition state that does not read: {exc!r}") from None
        await self.ensure_loaded(store)
        for group_id, part in parts.items():
            self.groups.setdefault(group_id, ShareGroup(group_id)).partitions[(topic_id, partition)] = part
        await self.save(parts)

    def unload(self) -> None:
        """Forget every group's state and sessions (cluster mode: this broker became, or stopped being, its group's
        master); the next use reads the saved states from the log again."""
        self.groups.clear()
        if not self.configs_from_cluster:  # (the cluster's stay: they are not this broker's to forget)
            self.configs.clear()
        self.sessions.clear()
        self.subscriptions.clear()
        self.dead_letter_groups.clear()
        self._docs = None
        self._generation += 1

    async def save(self, group_ids: Iterable[str]) -> None:
        """Write these groups' record states (one record each, in one append)."""
        wanted = sorted(set(group_ids))
        if wanted and self._docs is not None:
            await self._docs.save_many({g: self.doc(g) for g in wanted})

    def now(self) -> float:
        return self.clock.monotonic() * 1000

    # --- per-group settings (GROUP_CONFIGS over the broker's defaults) ----------------------------------------

    def defaults(self) -> dict[str, str]:
        return {
            "share.session.timeout.ms": str(self.session_timeout_ms),
            "share.heartbeat.interval.ms": str(self.heartbeat_interval_ms),
            "share.record.lock.duration.ms": str(self.record_lock_duration_ms),
            "share.delivery.count.limit": str(self.delivery_count_limit),
            "share.auto.offset.reset": self.auto_offset_reset,
            "share.isolation.level": "read_uncommitted",
        }

    def setting(self, group_id: str, key: str) -> str:
        overrides = self.configs.get(group_id)
        return overrides[key] if overrides and key in overrides else self.defaults()[key]

    def lock_ms(self, group_id: str) -> int:
        return int(self.setting(group_id, "share.record.lock.duration.ms"))

    def limit(self, group_id: str) -> int:
        """How many deliveries a record of the group gets before it is archived: the group's own
        `share.delivery.count.limit` when it sets one; else, for a group with a RocketMQ subscription group config,
        the first delivery and its `retryMaxTimes` retries (as a RocketMQ 5 broker counts a POP group's); else the
        broker's default."""
        overrides = self.configs.get(group_id)
        if not (overrides and "share.delivery.count.limit" in overrides):
            found = self.subscriptions.get(group_id)
            retries = found.get("retryMaxTimes") if found is not None else None
            if isinstance(retries, int) and not isinstance(retries, bool) and retries >= 0:
                return retries + 1
        return int(self.setting(group_id, "share.delivery.count.limit"))

    def consumable(self, group_id: str) -> bool:
        """Whether the group may consume now (RocketMQ's `consumeEnable`: an operator pauses a group with false)."""
        found = self.subscriptions.get(group_id)
        return found is None or found.get("consumeEnable") is not False

    def saved_unread(self, store: Any) -> bool:
        """Whether `store` holds saved group states not read yet (then `ensure_loaded`); a broker that never used
        share groups has none, and a reader asking this creates nothing."""
        return self._docs is None and store.topic(SHARE_GROUP_STATE_TOPIC) is not None

    def lock_deadline(self, group_id: str) -> float:
        return self.now() + self.lock_ms(group_id)

    def orderly(self, group_id: str) -> bool:
        """Whether the group consumes in order (RocketMQ's consumeMessageOrderly): see `acquire_from_log`."""
        found = self.subscriptions.get(group_id)
        return found is not None and found.get("consumeMessageOrderly") is True

    def use_cluster_configs(self, configs: dict[str, dict[str, str]]) -> None:
        """Cluster mode: every group's overrides are these from now on (what the cluster keeps; unknown keys are
        left out), whatever the state documents say."""
        self.configs_from_cluster = True
        self.configs = {
            group_id: {k: v for k, v in overrides.items() if k in GROUP_CONFIGS}
            for group_id, overrides in configs.items()
            if any(k in GROUP_CONFIGS for k in overrides)
        }

    def configure(self, group_id: str, overrides: dict[str, str]) -> None:
        """Replace the group's overrides (checked by the caller against GROUP_CONFIGS); save() keeps them."""
        if overrides:
            self.configs[group_id] = dict(overrides)
        else:
            self.configs.pop(group_id, None)

    # --- membership ------------------------------------------------------------------------------------------

    def heartbeat(self, body: dict[str, Any], client_id: str, client_host: str) -> tuple[dict[str, Any], set[str]]:
        """One ShareGroupHeartbeat: its answer, and the groups whose record states changed (members that left)."""
        changed = self.expire()
        group_id, member_id, epoch = body["group_id"], body["member_id"] or "", body["member_epoch"]
        answer = heartbeat_answer(member_id, epoch, int(self.setting(group_id, "share.heartbeat.interval.ms")))

        def refuse(code: int, message: str) -> tuple[dict[str, Any], set[str]]:
            answer.update(error_code=code, error_message=message)
            return answer, changed

        if not group_id or not member_id:
            return refuse(E.InvalidRequestError.code, "a share group member names its group and its member id")
        group = self.groups.setdefault(group_id, ShareGroup(group_id))
        member = group.members.get(member_id)
        if epoch == -1:
            if member is None:
                return refuse(E.UnknownMemberIdError.code, f"member {member_id!r} is unknown")
            self._remove(group, member)
            changed.add(group_id)
            return answer, changed
        if epoch == 0:
            if not body.get("subscribed_topic_names"):
                return refuse(E.InvalidRequestError.code, "a member joining subscribes to topics")
            if member is None:
                member = group.members[member_id] = ShareMember(member_id, client_id, client_host)
                group.group_epoch += 1
                log.info("share group %s: member %s joined", group_id, member_id)
        elif member is None:
            return refuse(E.UnknownMemberIdError.code, f"member {member_id!r} is not in share group {group_id!r}")
        elif epoch == member.previous_epoch and epoch != member.member_epoch:
            member.sent = None  # (the answer that moved it on was lost: its assignment is sent again)
        elif epoch != member.member_epoch:
            return refuse(FENCED_MEMBER_EPOCH, f"member {member_id!r} is at epoch {member.member_epoch}, not {epoch}")
        names = body.get("subscribed_topic_names")
        if names is not None:
            member.topics = tuple(sorted(set(names)))
        if body.get("rack_id") is not None:
            member.rack_id = body["rack_id"]
        member.session_deadline = self.now() + int(self.setting(group_id, "share.session.timeout.ms"))
        self._assign(group)
        if member.member_epoch != group.group_epoch:  # (a member moves to the group's epoch with its own heartbeat)
            member.previous_epoch, member.member_epoch = member.member_epoch, group.group_epoch
        answer["member_id"] = member.member_id
        answer["member_epoch"] = member.member_epoch
        offered = self._offer(group, member)
        if member.sent != offered:
            member.sent = offered
            answer["assignment"] = {
                "topic_partitions": [
                    {"topic_id": t, "partitions": sorted(ps)} for t, ps in sorted(offered.items(), key=str)
                ]
            }
        return answer, changed

    @staticmethod
    def _offer(group: ShareGroup, member: ShareMember) -> Assignment:
        """What a heartbeat tells the member: its assignment, and the partitions it was told before that went to
        other members none of which has been told yet. A member hears of a change only with its own heartbeat, up
        to a heartbeat interval later; until a partition's new member has, the old one keeps fetching it (records
        are shared: two fetching it do no harm), so no partition waits that long with nobody fetching it."""
        offered = {t: set(ps) for t, ps in member.assignment.items()}
        for t, ps in (member.sent or {}).items():
            for p in ps:
                if p in member.assignment.get(t, ()):
                    continue
                owners = [o for o in group.members.values() if o is not member and p in o.assignment.get(t, ())]
                if owners and not any(p in (o.sent or {}).get(t, ()) for o in owners):
                    offered.setdefault(t, set()).add(p)
        return {t: frozenset(ps) for t, ps in offered.items()}

    def _assign(self, group: ShareGroup) -> None:
        topics: dict[uuid.UUID, int] = {}
        subscriptions: dict[str, set[uuid.UUID]] = {}
        for m in group.members.values():
            for name in m.topics:
                found = self.topics(name)
                if found is not None:
                    topics[found[0]] = found[1]
                    subscriptions.setdefault(m.member_id, set()).add(found[0])
        target = assign_share(sorted(group.members), topics, subscriptions)
        if any(group.members[member_id].assignment != a for member_id, a in target.items()):
            group.group_epoch += 1
            for member_id, a in target.items():
                group.members[member_id].assignment = a

    def release(self, group_id: str, member_id: str) -> bool:
        """Make every record the member holds in the group AVAILABLE again (its session ended); True if any was."""
        group = self.groups.get(group_id)
        if group is None:
            return False
        limit = self.limit(group_id)
        released = [part.release_member(member_id, limit) for part in group.partitions.values()]
        return any(released)

    def _remove(self, group: ShareGroup, member: ShareMember) -> None:
        del group.members[member.member_id]
        self.sessions.pop((group.group_id, member.member_id), None)
        self.release(group.group_id, member.member_id)
        self._assign(group)
        log.info("share group %s: member %s left", group.group_id, member.member_id)

    def expire(self) -> set[str]:
        """End silent members' sessions and expired locks; the groups whose record states changed."""
        now = self.now()
        changed = set()
        for group in self.groups.values():
            for member in [m for m in group.members.values() if m.session_deadline < now]:
                log.info("share group %s: member %s's session timed out", group.group_id, member.member_id)
                self._remove(group, member)
                changed.add(group.group_id)
            limit = self.limit(group.group_id)
            for part in group.partitions.values():
                if part.expire(now, limit):
                    changed.add(group.group_id)
        return changed

    def is_member(self, group_id: str, member_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and member_id in group.members

    # --- partitions ------------------------------------------------------------------------------------------

    def partition(
        self, group_id: str, topic_id: uuid.UUID, partition: int, start: int, end: int, reset: str | None = None
    ) -> SharePartition:
        """The group's state of a partition, started per `reset` (the group's share.auto.offset.reset by default)
        the first time it is asked for."""
        group = self.groups.setdefault(group_id, ShareGroup(group_id))
        key = (topic_id, partition)
        part = group.partitions.get(key)
        if part is None:
            earliest = (reset or self.setting(group_id, "share.auto.offset.reset")) == "earliest"
            part = group.partitions[key] = SharePartition(start if earliest else end)
        if part.dead is None and group_id in self.dead_letter_groups:
            part.dead = []
        if part.spso < start:  # retention removed records below it
            part.drop_below(start)
        return part

    async def acquire_from_log(
        self,
        store: Any,
        group_id: str,
        member_id: str,
        topic_id: uuid.UUID,
        partition: int,
        name: str,
        budget: int,
        *,
        lock_ms: float | None = None,
        wanted: Callable[[Any], bool] | None = None,
        reset: str | None = None,
        ordered: bool = False,
        whole_batches: bool = False,
    ) -> list[tuple[Any, list[tuple[int, int, int]]]]:
        """Acquire up to `budget` records of one partition of the log for the member, released and expired ones
        first: each stored batch holding some, with its acquired ranges (first offset, last offset, delivery
        count). The lock lasts `lock_ms` (the group's record lock duration by default). With
        `share.isolation.level=read_committed` only records below the last stable offset are acquired, and those
        of aborted transactions are archived. Control batches are archived; so are the batches `wanted` refuses
        (a RocketMQ consumer's tag filter: for this group they are done). `reset`: where the group starts on a
        partition it has not read yet (`partition`). Ordered (asked for, or the group is `orderly`): nothing is
        acquired from a partition while one of its records is held, so its records go out one acquisition at a
        time, in offset order, a released or expired one before any later one (RocketMQ's ordered POP and FIFO
        consumer groups; a queue is a partition, and one message group's messages share a queue). `whole_batches`
        (Kafka's batch-optimised acquire mode): `budget` and the in-flight bound are soft, a stored batch begun is
        acquired to its end, so a member is sent no batch it holds only part of."""
        start, end = store.offset_bounds(name, partition)
        part = self.partition(group_id, topic_id, partition, start, end, reset)
        aborted = NO_ABORTS
        if self.transactions is not None and self.setting(group_id, "share.isolation.level") == "read_committed":
            end = self.transactions.last_stable(name, partition, end)
            ranges = self.transactions.aborted_ranges(name, partition)
            if ranges:
                aborted = AbortedBatches(ranges)
        limit = self.limit(group_id)
        part.expire(self.now(), limit)
        if (ordered or self.orderly(group_id)) and part.held():
            return []
        deadline = self.now() + (self.lock_ms(group_id) if lock_ms is None else lock_ms)
        taken = 0
        again = part.first_available()
        read_from = part.next_offset if again is None else again
        chosen: list[tuple[Any, list[tuple[int, int, int]]]] = []
        offset = read_from
        while offset < end and taken < budget:
            wanted_bytes = (budget - taken) * READ_BYTES_PER_RECORD
            result = await store.read(name, partition, offset, min(READ_BYTES_MAX, max(READ_BYTES_MIN, wanted_bytes)))
            if not result.batches:
                break
            for batch in result.batches:
                if taken >= budget or batch.base_offset >= end:
                    break
                first = max(batch.base_offset, read_from)
                if (
                    is_control_batch(batch.data)
                    or (aborted and aborted.holds_batch(batch.base_offset, batch.data))
                    or (wanted is not None and not wanted(batch))
                ):
                    part.archive(first, batch.next_offset)
                    continue
                new_below, wants = part.spso + self.max_record_locks, budget - taken
                if whole_batches and first < new_below:
                    new_below, wants = max(new_below, batch.next_offset), max(wants, batch.next_offset - first)
                got = part.acquire(
                    first, batch.next_offset, member_id, deadline, wants, new_below, limit=limit, fresh=not taken
                )
                if got:
                    taken += sum(hi - lo + 1 for lo, hi, _count in got)
                    chosen.append((batch, got))
                if part.held_back:
                    return chosen
            offset = result.next_offset
            if offset >= part.next_offset and part.next_offset - part.spso >= self.max_record_locks:
                break
        return chosen

    def wait_for(self, group_id: str, keys: Iterable[tuple[uuid.UUID, int]], wait_s: float) -> float:
        """How long a consumer of these partitions with nothing to take may wait for new records: up to `wait_s`,
        and no longer than until the first held record's lock ends (it is then there to take again)."""
        lock_end = self.next_lock_end(group_id, keys)
        if lock_end is None:
            return wait_s
        return min(wait_s, max(0.0, lock_end - self.now()) / 1000 + 0.005)

    def keep_dead_letters(self, group_id: str) -> None:
        """From now on keep the offsets the group archives at its delivery limit (a RocketMQ group: its dead
        letters go to %DLQ%group)."""
        self.dead_letter_groups.add(group_id)
        group = self.groups.get(group_id)
        for part in group.partitions.values() if group is not None else ():
            if part.dead is None:
                part.dead = []

    def take_dead_letters(self, group_id: str) -> dict[tuple[uuid.UUID, int], list[int]]:
        """The offsets archived at the delivery limit since last taken, by (topic id, partition)."""
        group = self.groups.get(group_id)
        out: dict[tuple[uuid.UUID, int], list[int]] = {}
        for key, part in group.partitions.items() if group is not None else ():
            if part.dead:
                out[key], part.dead = part.dead, []
        return out

    def next_lock_end(self, group_id: str, keys: Iterable[tuple[uuid.UUID, int]]) -> float | None:
        """When the first lock of the group's records in these partitions ends (ms on the clock; None: no record
        is held): a consumer waiting for records also waits for that one to come back."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        ends = [
            end
            for key in keys
            if (part := group.partitions.get(key)) is not None and (end := part.next_lock_end()) is not None
        ]
        return min(ends, default=None)

    def has_members(self, group_id: str) -> bool:
        self.expire()
        group = self.groups.get(group_id)
        return group is not None and bool(group.members)

    def exists(self, group_id: str) -> bool:
        """Whether the group was ever used here (what ListGroups shows; an empty one too, as Kafka's)."""
        return group_id in self.groups

    def reset(self, group_id: str, topic_id: uuid.UUID, partition: int, start: int) -> None:
        """AlterShareGroupOffsets: the group starts the partition over at `start` (nothing in flight)."""
        group = self.groups.setdefault(group_id, ShareGroup(group_id))
        part = group.partitions[(topic_id, partition)] = SharePartition(start)
        if group_id in self.dead_letter_groups:
            part.dead = []

    def forget(self, group_id: str, topic_id: uuid.UUID) -> bool:
        """DeleteShareGroupOffsets: drop the group's states of the topic's partitions (the next fetch starts them
        per share.auto.offset.reset); whether it had any."""
        group = self.groups.get(group_id)
        if group is None:
            return False
        keys = [k for k in group.partitions if k[0] == topic_id]
        for key in keys:
            del group.partitions[key]
        return bool(keys)

    def doc(self, group_id: str) -> dict[str, Any]:
        group = self.groups.get(group_id)
        doc: dict[str, Any] = {"partitions": {}}
        if group is not None:
            doc["partitions"] = {f"{t.hex}:{p}": part.doc() for (t, p), part in group.partitions.items()}
        else:
            doc["configured_only"] = True  # (a group with settings but never used: not a group yet)
        if group_id in self.configs and not self.configs_from_cluster:
            doc["configs"] = self.configs[group_id]
        if group_id in self.subscriptions:
            doc["subscription"] = self.subscriptions[group_id]
        return doc

    def load(self, group_id: str, doc: dict[str, Any]) -> None:
        configs = doc.get("configs")
        if configs and not self.configs_from_cluster:
            self.configure(group_id, {k: str(v) for k, v in configs.items() if k in GROUP_CONFIGS})
        subscription = doc.get("subscription")
        if isinstance(subscription, dict):
            self.subscriptions[group_id] = subscription
        if doc.get("configured_only"):
            return
        group = self.groups.setdefault(group_id, ShareGroup(group_id))
        for key, part in (doc.get("partitions") or {}).items():
            topic_hex, _, p = key.partition(":")
            group.partitions[(uuid.UUID(hex=topic_hex), int(p))] = SharePartition.from_doc(part)

    def describe(self, group_id: str, topic_name: Callable[[uuid.UUID], str | None]) -> dict[str, Any] | None:
        self.expire()
        group = self.groups.get(group_id)
        if group is None:
            return None
        members = [
            {
                "member_id": m.member_id,
                "rack_id": m.rack_id,
                "member_epoch": m.member_epoch,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "subscribed_topic_names": list(m.topics),
                "assignment": described_partitions(m.assignment, topic_name),
            }
            for m in group.members.values()
        ]
        return described_group(
            group_id,
            state=group.state,
            group_epoch=group.group_epoch,
            assignment_epoch=group.group_epoch,
            assignor="simple",
            members=members,
        )

    def list_groups(self) -> list[tuple[str, str]]:
        self.expire()
        return [(g.group_id, g.state) for g in self.groups.values()]


__all__ = ["GROUP_CONFIGS", "ShareGroups", "SharePartition", "assign_share"]
