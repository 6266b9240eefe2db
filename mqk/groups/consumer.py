"""Consumer groups of the KIP-848 protocol (ConsumerGroupHeartbeat): the broker assigns the partitions.

Each group has a *group epoch*, bumped whenever what the assignment depends on changes (a member joins or leaves,
a subscription changes, a subscribed topic gains partitions), and a *target assignment* computed at that epoch by
the group's assignor (`uniform`, the default, or `range`: `group.remote.assignor` on the client,
`group_consumer_assignors` here). Each member has a *member epoch* and the partitions it owns now, and converges
to its target one heartbeat at a time, as Kafka's coordinator reconciles:

- partitions it owns but its target does not name are revoked first: the answer leaves them out, and the member
  keeps its epoch until a heartbeat reports it no longer owns them (past its rebalance timeout it is removed);
- then it takes the target's epoch and the partitions of its target that no other member still owns; a partition
  another member has yet to give up is handed over on a later heartbeat, once that member has let it go.

So no partition is owned by two members at once. A heartbeat carries the member epoch the member holds: a later one
than the broker's, or an earlier one that is not the member's previous epoch answered with what the member already
owns (a lost answer), is FENCED_MEMBER_EPOCH; an unknown member id UNKNOWN_MEMBER_ID; the member then joins again
with epoch 0. Epoch -1 leaves; -2 leaves a static member (`group.instance.id`) whose partitions wait for it to come
back (under the same instance id) until its session timeout. A member that sends no heartbeat within
`group_consumer_session_timeout_ms` is removed. OffsetCommit (v9+) and OffsetFetch carry the member epoch and are
checked against it (`commit_check`, `fetch_check`).

Membership lives in memory, as the classic groups' does: after a restart, or a coordinator moving in cluster mode,
members are unknown and join again (their committed offsets are the store's). A group id names either a classic
group or a consumer group: an empty classic group (offsets only) becomes a consumer group when a consumer-protocol
member joins, and a consumer group with members refuses classic members (INCONSISTENT_GROUP_PROTOCOL) and the other
way round (GROUP_ID_NOT_FOUND), as Kafka answers without online migration.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from mqk import errors as E
from mqk.clock import SYSTEM_CLOCK, Clock
from mqk.groups.answers import FENCED_MEMBER_EPOCH, NONE, described_group, described_partitions, heartbeat_answer

log = logging.getLogger("mqk.groups")

#: the assignors this broker runs (Kafka's names); the first of the configured list is the default
ASSIGNORS = ("uniform", "range")
#: member epochs a heartbeat may carry with a meaning of their own
JOIN, LEAVE, STATIC_LEAVE = 0, -1, -2
#: a topic's partitions a member owns or is given: topic id -> partition numbers
Partitions = dict[uuid.UUID, frozenset[int]]

UNRELEASED_INSTANCE_ID = 111
UNSUPPORTED_ASSIGNOR = 112
STALE_MEMBER_EPOCH = 113


@dataclass(eq=False)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    rack_id: str | None = None
    member_epoch: int = 0
    previous_epoch: int = -1
    topics: tuple[str, ...] = ()
    regex: str | None = None
    assignor: str | None = None
    rebalance_timeout_ms: int = 300_000
    #: what the member owns now (as this broker gave it)
    owned: Partitions = field(default_factory=dict)
    #: what it must give up before it takes its target's epoch, and since when (monotonic ms)
    revoking: Partitions = field(default_factory=dict)
    revoking_since: float = 0.0
    #: when its session ends without a heartbeat (monotonic ms)
    session_deadline: float = 0.0
    #: a static member that left with epoch -2: its partitions wait for its instance id until the deadline
    away: bool = False
    #: the assignment the member was last told (None: tell it again)
    sent: Partitions | None = None


@dataclass(eq=False)
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    #: member id -> its target assignment at assignment_epoch
    target: dict[str, Partitions] = field(default_factory=dict)
    members: dict[str, Member] = field(default_factory=dict)
    #: what the target was computed from: subscribed topic -> (topic id, partition count)
    subscribed: dict[str, tuple[uuid.UUID, int]] = field(default_factory=dict)

    @property
    def state(self) -> str:
        """Kafka's consumer group states: EMPTY, ASSIGNING, RECONCILING, STABLE (DEAD is a deleted group)."""
        if not self.members:
            return "Empty"
        if self.assignment_epoch < self.group_epoch:
            return "Assigning"
        if any(m.member_epoch != self.assignment_epoch or m.revoking for m in self.members.values()):
            return "Reconciling"
        return "Stable"

    def owner_of(self, topic_id: uuid.UUID, partition: int, but: str) -> bool:
        """Whether a member other than `but` still owns (or is giving up) the partition."""
        return any(
            partition in m.owned.get(topic_id, ()) or partition in m.revoking.get(topic_id, ())
            for m in self.members.values()
            if m.member_id != but
        )


def _count(parts: Partitions) -> int:
    return sum(len(p) for p in parts.values())


def _minus(a: Partitions, b: Partitions) -> Partitions:
    out = {t: ps - b.get(t, frozenset()) for t, ps in a.items()}
    return {t: ps for t, ps in out.items() if ps}


def _union(a: Partitions, b: Partitions) -> Partitions:
    out = dict(a)
    for t, ps in b.items():
        out[t] = out.get(t, frozenset()) | ps
    return {t: ps for t, ps in out.items() if ps}


def _intersect(a: Partitions, b: Partitions) -> Partitions:
    out = {t: ps & b.get(t, frozenset()) for t, ps in a.items()}
    return {t: ps for t, ps in out.items() if ps}


def assign_uniform(
    members: dict[str, tuple[str, ...]], topics: dict[str, tuple[uuid.UUID, int]], previous: dict[str, Partitions]
) -> dict[str, Partitions]:
    """Kafka's `uniform` assignor: every subscribed partition to one of its subscribers, counts as even as the
    subscriptions allow, and a partition stays where it was when that keeps the counts even (sticky)."""
    ids = sorted(members)
    out: dict[str, dict[uuid.UUID, set[int]]] = {m: {} for m in ids}
    counts = dict.fromkeys(ids, 0)
    pending: list[tuple[str, uuid.UUID, int]] = []
    for name in sorted({t for subs in members.values() for t in subs if t in topics}):
        topic_id, partitions = topics[name]
        pending += [(name, topic_id, p) for p in range(partitions)]
    subscribers_of = {name: [m for m in ids if name in members[m]] for name, _t, _p in pending}
    # each member's share: `base` partitions, and `extra` of them one more (the division's remainder)
    base, extra = divmod(len(pending), len(ids)) if ids else (0, 0)
    left: list[tuple[str, uuid.UUID, int]] = []
    for name, topic_id, p in pending:  # sticky first: a partition stays with its owner within its share
        keeper = next((m for m in subscribers_of[name] if p in previous.get(m, {}).get(topic_id, ())), None)
        if keeper is not None and (counts[keeper] < base or (counts[keeper] == base and extra > 0)):
            if counts[keeper] == base:
                extra -= 1
            out[keeper].setdefault(topic_id, set()).add(p)
            counts[keeper] += 1
        else:
            left.append((name, topic_id, p))
    for name, topic_id, p in left:  # then each to the subscriber holding fewest
        subscribers = subscribers_of[name]
        if not subscribers:
            continue
        taker = min(subscribers, key=lambda m: (counts[m], m))
        out[taker].setdefault(topic_id, set()).add(p)
        counts[taker] += 1
    return {m: {t: frozenset(ps) for t, ps in parts.items()} for m, parts in out.items()}


def assign_range(
    members: dict[str, tuple[str, ...]], topics: dict[str, tuple[uuid.UUID, int]], previous: dict[str, Partitions]
) -> dict[str, Partitions]:
    """Kafka's `range` assignor: per topic, its subscribers (in member id order) take consecutive ranges, the first
    ones one partition more when the count does not divide."""
    out: dict[str, dict[uuid.UUID, frozenset[int]]] = {m: {} for m in members}
    for name in sorted({t for subs in members.values() for t in subs if t in topics}):
        topic_id, partitions = topics[name]
        subscribers = sorted(m for m in members if name in members[m])
        share, extra = divmod(partitions, len(subscribers))
        start = 0
        for i, m in enumerate(subscribers):
            size = share + (1 if i < extra else 0)
            if size:
                out[m][topic_id] = frozenset(range(start, start + size))
            start += size
    return out


_ASSIGN = {"uniform": assign_uniform, "range": assign_range}


def _epoch_code(received: int, current: int) -> int:
    """An offset request's member epoch against the member's: later is FENCED_MEMBER_EPOCH (it cannot be this
    member's), earlier STALE_MEMBER_EPOCH (an answer on its way will tell it the current one)."""
    if received > current:
        return FENCED_MEMBER_EPOCH
    return STALE_MEMBER_EPOCH if received < current else NONE


class ConsumerGroups:
    """Every KIP-848 consumer group this broker coordinates."""

    def __init__(
        self,
        topics: Callable[[str], tuple[uuid.UUID, int] | None],
        all_topics: Callable[[], Iterable[str]],
        *,
        session_timeout_ms: int = 45_000,
        heartbeat_interval_ms: int = 5_000,
        assignors: tuple[str, ...] = ASSIGNORS,
        max_size: int = 2**31 - 1,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        #: topic name -> (topic id, partition count), None for a topic that does not exist
        self.topics = topics
        self.all_topics = all_topics
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.assignors = assignors or ASSIGNORS
        self.max_size = max_size
        self.clock = clock
        self.groups: dict[str, ConsumerGroup] = {}

    def _now(self) -> float:
        return self.clock.monotonic() * 1000

    # --- ConsumerGroupHeartbeat ------------------------------------------------------------------------------

    def heartbeat(self, body: dict[str, Any], version: int, client_id: str, client_host: str) -> dict[str, Any]:
        """One ConsumerGroupHeartbeat: its answer body (error_code set on a refusal)."""
        self.expire()
        group_id, member_id, epoch = body["group_id"], body["member_id"] or "", body["member_epoch"]
        answer = heartbeat_answer(member_id, epoch, self.heartbeat_interval_ms)

        def refuse(code: int, message: str) -> dict[str, Any]:
            answer.update(error_code=code, error_message=message, member_epoch=epoch)
            return answer

        if not group_id:
            return refuse(E.InvalidRequestError.code, "the group id is empty")
        assignor = body.get("server_assignor")
        if assignor is not None and assignor not in self.assignors:
            return refuse(UNSUPPORTED_ASSIGNOR, f"assignor {assignor!r} is not one of {list(self.assignors)}")
        if epoch == JOIN and not member_id:
            if version >= 1:  # KIP-1082: the member makes its id
                return refuse(E.InvalidRequestError.code, "a member joining names its member id (v1)")
            member_id = uuid.uuid4().hex
            answer["member_id"] = member_id
        if epoch == JOIN and not body.get("subscribed_topic_names") and body.get("subscribed_topic_regex") is None:
            return refuse(E.InvalidRequestError.code, "a member joining subscribes to topic names or a regex")
        group = self.groups.get(group_id)
        if epoch in (LEAVE, STATIC_LEAVE):
            return self._leave(group, member_id, epoch, answer)
        if group is None:
            group = self.groups[group_id] = ConsumerGroup(group_id)
        member = group.members.get(member_id)
        now = self._now()
        if epoch == JOIN:
            if member is None:
                if len(group.members) >= self.max_size:
                    return refuse(E.GroupMaxSizeReachedError.code, f"group {group_id!r} has {self.max_size} members")
                member = self._new_member(group, member_id, body, client_id, client_host)
            else:  # a member that was fenced joins again: it starts over with nothing owned
                member.owned, member.revoking, member.sent = {}, {}, None
                member.member_epoch = 0
            group.group_epoch += 1
        elif member is None:
            return refuse(E.UnknownMemberIdError.code, f"member {member_id!r} is not in group {group_id!r}")
        elif epoch != member.member_epoch:
            reported = self._reported(body)
            lost_answer = epoch == member.previous_epoch and reported is not None and not _minus(reported, member.owned)
            if not lost_answer:
                return refuse(
                    FENCED_MEMBER_EPOCH,
                    f"member {member_id!r} is at epoch {member.member_epoch}, not {epoch}: join again",
                )
        member.session_deadline = now + self.session_timeout_ms
        member.away = False
        if self._update_subscription(group, member, body):
            group.group_epoch += 1
        self._refresh_metadata(group)
        if group.assignment_epoch < group.group_epoch:
            self._assign(group)
        self._reconcile(group, member, self._reported(body), now)
        answer["member_id"] = member.member_id
        answer["member_epoch"] = member.member_epoch
        if member.sent != member.owned:
            member.sent = dict(member.owned)
            answer["assignment"] = {
                "topic_partitions": [
                    {"topic_id": t, "partitions": sorted(ps)} for t, ps in sorted(member.owned.items(), key=str)
                ]
            }
        return answer

    def _new_member(
        self, group: ConsumerGroup, member_id: str, body: dict[str, Any], client_id: str, client_host: str
    ) -> Member:
        instance_id = body.get("instance_id")
        member = Member(member_id, instance_id, client_id, client_host)
        if instance_id is not None:
            # a static member coming back under a new member id takes its predecessor's place and partitions
            old = next((m for m in group.members.values() if m.instance_id == instance_id), None)
            if old is not None:
                del group.members[old.member_id]
                member.owned, member.member_epoch = old.owned, old.member_epoch
                if old.member_id in group.target:
                    group.target[member_id] = group.target.pop(old.member_id)
        group.members[member_id] = member
        log.info("consumer group %s: member %s joined (instance %s)", group.group_id, member_id, instance_id)
        return member

    @staticmethod
    def _reported(body: dict[str, Any]) -> Partitions | None:
        owned = body.get("topic_partitions")
        if owned is None:
            return None
        return {tp["topic_id"]: frozenset(tp["partitions"]) for tp in owned if tp["partitions"]}

    @staticmethod
    def _update_subscription(group: ConsumerGroup, member: Member, body: dict[str, Any]) -> bool:
        """Take what the heartbeat changes (null fields change nothing); whether the assignment depends on it."""
        changed = False
        names = body.get("subscribed_topic_names")
        if names is not None and tuple(sorted(set(names))) != member.topics:
            member.topics, changed = tuple(sorted(set(names))), True
        regex = body.get("subscribed_topic_regex")
        if regex is not None and (regex or None) != member.regex:
            member.regex, changed = regex or None, True
        assignor = body.get("server_assignor")
        if assignor is not None and assignor != member.assignor:
            member.assignor, changed = assignor, True
        if body.get("rebalance_timeout_ms", -1) >= 0:
            member.rebalance_timeout_ms = body["rebalance_timeout_ms"]
        if body.get("rack_id") is not None:
            member.rack_id = body["rack_id"]
        return changed

    def _subscriptions(self, group: ConsumerGroup) -> dict[str, tuple[str, ...]]:
        """Member id -> the topic names it subscribes to (its regex matched against the topics that exist)."""
        names = None
        out = {}
        for m in group.members.values():
            topics = set(m.topics)
            if m.regex:
                if names is None:
                    names = [t for t in self.all_topics() if not t.startswith("__")]
                try:
                    pattern = re.compile(m.regex)
                except re.error:
                    pattern = None
                if pattern is not None:
                    topics.update(t for t in names if pattern.fullmatch(t))
            out[m.member_id] = tuple(sorted(topics))
        return out

    def _refresh_metadata(self, group: ConsumerGroup) -> None:
        """Bump the group epoch when a subscribed topic appeared, went, or gained partitions."""
        wanted = {t for subs in self._subscriptions(group).values() for t in subs}
        current = {}
        for name in wanted:
            found = self.topics(name)
            if found is not None:
                current[name] = found
        if current != group.subscribed:
            group.subscribed = current
            group.group_epoch += 1

    def _assign(self, group: ConsumerGroup) -> None:
        name = self._assignor_of(group)
        previous = {m: dict(parts) for m, parts in group.target.items()}
        group.target = _ASSIGN[name](self._subscriptions(group), group.subscribed, previous)
        group.assignment_epoch = group.group_epoch
        log.info(
            "consumer group %s: epoch %d assigned by %s: %s",
            group.group_id,
            group.group_epoch,
            name,
            {m: _count(p) for m, p in group.target.items()},
        )

    def _assignor_of(self, group: ConsumerGroup) -> str:
        """The assignor the members asked for (the most common choice), else the broker's default."""
        asked = [m.assignor for m in group.members.values() if m.assignor]
        if asked:
            return max(sorted(set(asked)), key=asked.count)
        return self.assignors[0]

    def _reconcile(self, group: ConsumerGroup, member: Member, reported: Partitions | None, now: float) -> None:
        target = group.target.get(member.member_id, {})
        if member.revoking:
            still = _intersect(member.revoking, reported) if reported is not None else member.revoking
            if still:
                return  # it has not let them go yet: it keeps its epoch (`expire` removes it past its timeout)
            member.revoking = {}
        revoke = _minus(member.owned, target)
        if revoke:
            member.owned = _intersect(member.owned, target)
            member.revoking = revoke
            member.revoking_since = now
            return
        free = {
            t: frozenset(p for p in ps if not group.owner_of(t, p, member.member_id))
            for t, ps in _minus(target, member.owned).items()
        }
        member.owned = _union(member.owned, {t: ps for t, ps in free.items() if ps})
        if member.member_epoch != group.assignment_epoch:
            member.previous_epoch = member.member_epoch
            member.member_epoch = group.assignment_epoch

    def _leave(self, group: ConsumerGroup | None, member_id: str, epoch: int, answer: dict[str, Any]) -> dict[str, Any]:
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            answer.update(error_code=E.UnknownMemberIdError.code, error_message=f"member {member_id!r} is unknown")
            return answer
        if epoch == STATIC_LEAVE and member.instance_id is not None:
            member.away = True  # its partitions wait for its instance id until its session times out
            member.session_deadline = self._now() + self.session_timeout_ms
        else:
            self._remove(group, member)
        answer["member_epoch"] = epoch
        return answer

    def _remove(self, group: ConsumerGroup, member: Member) -> None:
        group.members.pop(member.member_id, None)
        group.target.pop(member.member_id, None)
        group.group_epoch += 1
        log.info("consumer group %s: member %s left (epoch %d)", group.group_id, member.member_id, group.group_epoch)

    def expire(self) -> None:
        """Remove the members whose session ended (no heartbeat within the session timeout), and those that have
        not revoked what they were told to within their rebalance timeout (their partitions go to the others)."""
        now = self._now()
        for group in self.groups.values():
            for member in list(group.members.values()):
                if member.session_deadline and member.session_deadline < now:
                    log.info("consumer group %s: member %s's session timed out", group.group_id, member.member_id)
                    self._remove(group, member)
                elif member.revoking and now - member.revoking_since > member.rebalance_timeout_ms:
                    log.warning(
                        "consumer group %s: member %s did not revoke %s within its rebalance timeout: removed",
                        group.group_id,
                        member.member_id,
                        member.revoking,
                    )
                    self._remove(group, member)

    # --- what the other group APIs ask ---------------------------------------------------------------------

    def has_members(self, group_id: str) -> bool:
        self.expire()
        group = self.groups.get(group_id)
        return group is not None and bool(group.members)

    def commit_check(self, group_id: str, member_id: str, epoch: int) -> int | None:
        """OffsetCommit's check for a consumer group: an error code, NONE, or None when `group_id` is no consumer
        group (the classic coordinator decides)."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        if epoch < 0 and not member_id:
            return NONE if not group.members else E.UnknownMemberIdError.code  # an admin's commit: empty groups
        member = group.members.get(member_id)
        if member is None:
            return E.UnknownMemberIdError.code
        return _epoch_code(epoch, member.member_epoch)

    def fetch_check(self, group_id: str, member_id: str | None, epoch: int) -> int:
        """OffsetFetch v9+ from a member (epoch >= 0) of a consumer group: its epoch must be current (as a commit's)."""
        group = self.groups.get(group_id)
        if epoch < 0 or group is None:
            return NONE
        member = group.members.get(member_id or "")
        if member is None:
            return E.UnknownMemberIdError.code
        return _epoch_code(epoch, member.member_epoch)

    def list_groups(self) -> list[tuple[str, str]]:
        """(group id, state) of every consumer group."""
        self.expire()
        return [(g.group_id, g.state) for g in self.groups.values()]

    def describe(self, group_id: str, topic_name: Callable[[uuid.UUID], str | None]) -> dict[str, Any] | None:
        """ConsumerGroupDescribe's view of a group (None: no such consumer group)."""
        self.expire()
        group = self.groups.get(group_id)
        if group is None:
            return None

        members = [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "rack_id": m.rack_id,
                "member_epoch": m.member_epoch,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "subscribed_topic_names": list(m.topics),
                "subscribed_topic_regex": m.regex,
                "assignment": described_partitions(m.owned, topic_name),
                "target_assignment": described_partitions(group.target.get(m.member_id, {}), topic_name),
                "member_type": 1,  # (v1) the consumer protocol's member, not a classic one
            }
            for m in group.members.values()
        ]
        return described_group(
            group_id,
            state=group.state,
            group_epoch=group.group_epoch,
            assignment_epoch=group.assignment_epoch,
            assignor=self._assignor_of(group),
            members=members,
        )

    def delete(self, group_id: str) -> int | None:
        """DeleteGroups of a consumer group: NONE, NON_EMPTY_GROUP, or None when it is no consumer group."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        if self.has_members(group_id):
            return E.NonEmptyGroupError.code
        del self.groups[group_id]
        return NONE

    def unload(self) -> None:
        """Cluster mode: this broker no longer coordinates groups; members join again at the new coordinator."""
        self.groups.clear()


__all__ = ["ASSIGNORS", "ConsumerGroup", "ConsumerGroups", "Member", "assign_range", "assign_uniform"]
