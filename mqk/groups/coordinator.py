"""Classic (pre-KIP-848) consumer-group coordinator: membership, rebalances and committed offsets.

This module owns the group state machine — Empty → PreparingRebalance → CompletingRebalance → Stable (and Dead
once deleted) — with member ids, generations, static membership (group.instance.id), protocol selection and the
session / rebalance timers. It is pure logic on asyncio futures and timers of the injected `Clock`
(`clock.call_later`; commit timestamps read `clock.time_ms`): no sockets, no wire codecs, no direct reading of the
system clock, so tests drive sessions and rebalances with a `FakeClock`. Handlers translate requests into calls
here and results back into responses; errors come back as Kafka error codes (ints from `mqk.errors`) because every
API answers them per group or per member, never by raising.

Committed offsets live in the store (`commit_offsets` / `fetch_offsets` on the StoreManager), so they survive a
broker restart; membership does not (members rejoin after a restart, as they would after a coordinator move).
A group that exists only through its committed offsets is reported as Empty.

Committed offsets expire as Kafka's `offsets.retention.minutes` has them (`expire_offsets`, run every
`offsets.retention.check.interval.ms`): a group with no members loses its offsets once it has been empty for the
retention (then it is gone, Dead, as in Kafka); a group that never had members (a standalone consumer's commits)
loses each offset once it is that old; a stable consumer group keeps the offsets of the topics it subscribes to and
loses the others by their age (KIP-496); other active groups keep them all. A group this coordinator has seen only
through its offsets (after a restart or a failover, since membership is not kept in the log) is measured from the
later of each commit and the moment this coordinator took over, never from before: an offset may live longer than
in Kafka, never shorter. Groups with RocketMQ consumers heart-beating (`active_elsewhere`) keep theirs. Expiry is a
delete through the store, so in cluster mode it writes tombstones into `__consumer_offsets` and a new master
rebuilding from the log agrees.

Semantics follow Kafka's GroupCoordinator where clients can observe them:
- a dynamic member joining with an empty member id on JoinGroup v4+ gets MEMBER_ID_REQUIRED plus its new id and
  must join again with it (KIP-394); older versions are admitted directly;
- a rebalance completes when every known member has rejoined or the largest rebalance timeout elapses (members
  that did not rejoin are dropped); the leader's SyncGroup assignment is handed to every member;
- a static member rejoining with a known instance id replaces (fences) its old member id and, when the group is
  stable and its protocols are unchanged, gets the current assignment back without a rebalance (KIP-345).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict

from mqk import errors
from mqk.clock import SYSTEM_CLOCK, Clock, TimerHandle
from mqk.groups.consumer import ASSIGNORS, ConsumerGroups
from mqk.groups.share import ShareGroups
from mqk.store.adapter import GroupOffset

log = logging.getLogger("mqk.groups")

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"

NONE = 0
OFFSET_METADATA_TOO_LARGE = 12
#: Kafka's offset.metadata.max.bytes default
MAX_OFFSET_METADATA = 4096
#: Kafka's offsets.retention.minutes (7 days) and offsets.retention.check.interval.ms (10 minutes) defaults
OFFSETS_RETENTION_MS = 7 * 24 * 3600 * 1000
OFFSETS_RETENTION_CHECK_INTERVAL_MS = 600_000

E = errors  # short alias for the error-code table


@dataclass
class JoinResult:
    error: int
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    skip_assignment: bool = False
    #: (member_id, group_instance_id, metadata); only the leader receives the member list
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass
class SyncResult:
    error: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_future: asyncio.Future | None = None
    sync_future: asyncio.Future | None = None
    session_timer: TimerHandle | None = None
    #: true once the member has joined the rebalance in progress
    joined: bool = False

    def metadata_for(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]


class JoinParams(TypedDict):
    """What a JoinGroup request says about its member (the Member fields a join sets)."""

    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]


class Group:
    def __init__(self, group_id: str, now_ms: int = 0) -> None:
        self.group_id = group_id
        self.state = EMPTY
        #: when the group last became Empty (Kafka's currentStateTimestamp, as its offset expiry reads it)
        self.empty_since_ms = now_ms
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}  # group.instance.id -> member id
        #: member ids handed out with MEMBER_ID_REQUIRED, not yet joined (expire after one session timeout)
        self.pending: dict[str, TimerHandle] = {}
        self.rebalance_timer: TimerHandle | None = None

    # --- views -----------------------------------------------------------------------------------------

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        # Compare with the members' type: group.protocol_type is only set once the first rebalance completes,
        # and a second member joining before that must not be refused (INCONSISTENT_GROUP_PROTOCOL).
        if protocol_type != next(iter(self.members.values())).protocol_type:
            return False
        names = {name for name, _ in protocols}
        return bool(names & self.candidate_protocols())

    def candidate_protocols(self) -> set[str]:
        sets = [set(m.protocol_names()) for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str | None:
        """Each member votes for the first protocol in its own preference order that all members support."""
        candidates = self.candidate_protocols()
        if not candidates:
            return None
        votes: dict[str, int] = {}
        order: list[str] = []
        for member in self.members.values():
            choice = next(name for name in member.protocol_names() if name in candidates)
            if choice not in votes:
                order.append(choice)
            votes[choice] = votes.get(choice, 0) + 1
        return max(order, key=lambda name: votes[name])  # ties: the first voted for

    def all_joined(self) -> bool:
        return not self.pending and all(m.joined for m in self.members.values())

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to (consumer protocol metadata), or None if it cannot be told."""
        if self.protocol_type != "consumer" or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            parsed = parse_consumer_subscription(member.metadata_for(self.protocol_name))
            if parsed is None:
                return None
            topics.update(parsed)
        return topics


def _string(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">h", len(data)) + data


def consumer_subscription(topics: list[str]) -> bytes:
    """A ConsumerProtocolSubscription v0 (version, topics, no user data)."""
    return struct.pack(">hi", 0, len(topics)) + b"".join(_string(t) for t in topics) + struct.pack(">i", -1)


def consumer_assignment(assigned: list[tuple[str, list[int]]]) -> bytes:
    """A ConsumerProtocolAssignment v0 (version, [topic, [partition]], no user data)."""
    out = bytearray(struct.pack(">hi", 0, len(assigned)))
    for topic, partitions in assigned:
        out += _string(topic) + struct.pack(f">i{len(partitions)}i", len(partitions), *partitions)
    return bytes(out + struct.pack(">i", -1))


def parse_consumer_subscription(metadata: bytes) -> list[str] | None:
    """Topic names from ConsumerProtocolSubscription bytes (version i16, topics [string]); None if malformed."""
    try:
        _version, count = struct.unpack_from(">hi", metadata, 0)
        pos = 6
        topics = []
        if count < 0 or count > len(metadata):
            return None
        for _ in range(count):
            (length,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if length < 0 or pos + length > len(metadata):
                return None
            topics.append(metadata[pos : pos + length].decode())
            pos += length
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


class GroupCoordinator:
    """Every classic group this broker coordinates (this broker coordinates all of them)."""

    def __init__(
        self,
        store: Any,
        *,
        min_session_timeout_ms: int = 6000,
        max_session_timeout_ms: int = 1800000,
        initial_rebalance_delay_ms: int = 0,
        offsets_retention_ms: int = OFFSETS_RETENTION_MS,
        offsets_retention_check_interval_ms: int = OFFSETS_RETENTION_CHECK_INTERVAL_MS,
        consumer_session_timeout_ms: int = 45_000,
        consumer_heartbeat_interval_ms: int = 5_000,
        consumer_assignors: tuple[str, ...] = ASSIGNORS,
        share: dict[str, Any] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        topics: Any = None,
    ) -> None:
        """`topics`: where the groups' assignors look topics up (`get(name)`, `all()`: the broker's TopicRegistry,
        which in cluster mode knows every topic of the cluster, those with no partition on this broker too);
        the store's own topics when not given."""
        #: anything with commit_offsets / fetch_offsets / delete_offsets / list_offset_groups (the StoreManager)
        self.store = store
        self.topics = topics
        self.clock = clock
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.offsets_retention_ms = offsets_retention_ms
        self.offsets_retention_check_interval_ms = offsets_retention_check_interval_ms
        self.groups: dict[str, Group] = {}
        #: whether a group has members over another protocol (the runtime sets it to the RocketMQ listener's
        #: heart-beating consumers): such a group is active and its offsets do not expire
        self.active_elsewhere: Callable[[str], bool] | None = None
        #: offset commits in flight per group: expiry leaves such a group for the next pass, so a tombstone is
        #: never written behind a commit that was already on its way (Kafka's pending offset commits)
        self._committing: dict[str, int] = {}
        #: when this coordinator took its groups over (start, or becoming master): what a group it has seen only
        #: through its offsets is measured from at the earliest
        self._since_ms = clock.time_ms()
        self._expiry: asyncio.Task[None] | None = None
        #: the groups of the KIP-848 consumer protocol (a group id is one or the other: mqk.groups.consumer)
        self.consumer = ConsumerGroups(
            self._topic_of,
            self._topic_names,
            session_timeout_ms=consumer_session_timeout_ms,
            heartbeat_interval_ms=consumer_heartbeat_interval_ms,
            assignors=consumer_assignors,
            clock=clock,
        )
        #: share groups (KIP-932; mqk.groups.share), with `share`'s settings
        self.share = ShareGroups(self._topic_of, clock=clock, **(share or {}))

    def _topic_of(self, name: str) -> tuple[uuid.UUID, int] | None:
        info = self.store.topic(name) if self.topics is None else self.topics.get(name)
        return None if info is None else (uuid.UUID(bytes=bytes(info.topic_id)), info.queue_count)

    def _topic_names(self) -> list[str]:
        return list(self.store.topics() if self.topics is None else self.topics.all())

    def classic_members(self, group_id: str) -> bool:
        """Whether `group_id` is a classic group with members now (a consumer-protocol member cannot join it)."""
        group = self.groups.get(group_id)
        return group is not None and bool(group.members)

    @classmethod
    def from_config(
        cls, config: Any, store: Any, *, clock: Clock = SYSTEM_CLOCK, topics: Any = None
    ) -> GroupCoordinator:
        return cls(
            store,
            topics=topics,
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            offsets_retention_ms=config.offsets_retention_minutes * 60_000,
            offsets_retention_check_interval_ms=config.offsets_retention_check_interval_ms,
            consumer_session_timeout_ms=config.group_consumer_session_timeout_ms,
            consumer_heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms,
            consumer_assignors=tuple(config.group_consumer_assignors),
            share={
                "session_timeout_ms": config.group_share_session_timeout_ms,
                "heartbeat_interval_ms": config.group_share_heartbeat_interval_ms,
                "record_lock_duration_ms": config.group_share_record_lock_duration_ms,
                "delivery_count_limit": config.group_share_delivery_count_limit,
                "max_record_locks": config.group_share_partition_max_record_locks,
                "auto_offset_reset": config.group_share_auto_offset_reset,
            },
            clock=clock,
        )

    def start(self) -> None:
        """Start the periodic offset expiry (on the running loop)."""
        if self._expiry is None:
            self._expiry = asyncio.get_running_loop().create_task(self._expiry_loop(), name="mqk-offsets-expiry")

    def close(self) -> None:
        """Cancel every timer and fail pending joins/syncs (broker shutdown)."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._drop_all(E.CoordinatorNotAvailableError.code)

    def load(self) -> None:
        """This broker coordinates its groups from now on (cluster mode: it became its group's master): the
        offsets it finds were committed under another coordinator, whose membership it never saw."""
        self._since_ms = self.clock.time_ms()

    def unload(self) -> None:
        """This broker coordinates no group any more (cluster mode: it stopped being its group's master): every
        group's membership goes, as Kafka unloads a partition's groups when its leadership moves, and members
        waiting in JoinGroup / SyncGroup are answered NOT_COORDINATOR, so they look for the new coordinator.
        Committed offsets are not this class's: the store keeps them."""
        self._drop_all(E.NotCoordinatorError.code)
        self.consumer.unload()

    def _drop_all(self, code: int) -> None:
        for group in self.groups.values():
            if group.rebalance_timer:
                group.rebalance_timer.cancel()
            for handle in group.pending.values():
                handle.cancel()
            for member in group.members.values():
                if member.session_timer:
                    member.session_timer.cancel()
                _resolve(member.join_future, JoinResult(code, member_id=member.member_id))
                _resolve(member.sync_future, SyncResult(code))
        self.groups.clear()

    # --- JoinGroup -------------------------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        member_id: str,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        *,
        session_timeout_ms: int,
        rebalance_timeout_ms: int = -1,
        group_instance_id: str | None = None,
        require_known_member_id: bool = False,
        client_id: str = "",
        client_host: str = "",
    ) -> JoinResult:
        if not group_id:
            return JoinResult(E.InvalidGroupIdError.code, member_id=member_id)
        if not (self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms):
            return JoinResult(E.InvalidSessionTimeoutError.code, member_id=member_id)
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms
        if self.consumer.has_members(group_id):  # a consumer-protocol group (no online migration)
            return JoinResult(E.InconsistentGroupProtocolError.code, member_id=member_id)
        self.consumer.groups.pop(group_id, None)  # an empty one becomes a classic group again
        group = self.groups.get(group_id)
        if group is None:
            if member_id and group_instance_id is None:
                return JoinResult(E.UnknownMemberIdError.code, member_id=member_id)
            group = self.groups[group_id] = Group(group_id, self.clock.time_ms())
        if group.state == DEAD:
            return JoinResult(E.CoordinatorNotAvailableError.code, member_id=member_id)
        if not group.supports(protocol_type, protocols):
            return JoinResult(E.InconsistentGroupProtocolError.code, member_id=member_id)
        params: JoinParams = {
            "client_id": client_id,
            "client_host": client_host,
            "session_timeout_ms": session_timeout_ms,
            "rebalance_timeout_ms": rebalance_timeout_ms,
            "protocol_type": protocol_type,
            "protocols": list(protocols),
        }

        if not member_id:
            if group_instance_id is not None:
                return await self._join_static_unknown(group, group_instance_id, params)
            new_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if require_known_member_id:
                group.pending[new_id] = self.clock.call_later(
                    session_timeout_ms / 1000, self._expire_pending, group, new_id
                )
                return JoinResult(E.MemberIdRequiredError.code, member_id=new_id)
            member = Member(new_id, None, **params)
            return await self._add_member_and_rebalance(group, member)

        # a known (or pending) member id
        if group_instance_id is not None:
            known = group.static_members.get(group_instance_id)
            if known is not None and known != member_id:
                return JoinResult(E.FencedInstanceIdError.code, member_id=member_id)
        if member_id in group.pending:
            group.pending.pop(member_id).cancel()
            member = Member(member_id, group_instance_id, **params)
            return await self._add_member_and_rebalance(group, member)
        known_member = group.members.get(member_id)
        if known_member is None:
            return JoinResult(E.UnknownMemberIdError.code, member_id=member_id)
        return await self._join_known(group, known_member, params)

    async def _join_static_unknown(self, group: Group, instance_id: str, params: JoinParams) -> JoinResult:
        new_id = f"{instance_id}-{uuid.uuid4()}"
        old_id = group.static_members.get(instance_id)
        if old_id is None or old_id not in group.members:
            member = Member(new_id, instance_id, **params)
            return await self._add_member_and_rebalance(group, member)
        # the same instance came back (restart): fence the old member id, keep its place and assignment
        old = group.members.pop(old_id)
        _cancel(old.session_timer)
        _resolve(old.join_future, JoinResult(E.FencedInstanceIdError.code, member_id=old_id))
        _resolve(old.sync_future, SyncResult(E.FencedInstanceIdError.code))
        member = Member(new_id, instance_id, assignment=old.assignment, **params)
        member.joined = old.joined
        group.members[new_id] = member
        group.static_members[instance_id] = new_id
        if group.leader == old_id:
            group.leader = new_id
        unchanged = old.protocols == member.protocols and old.protocol_type == member.protocol_type
        if group.state == STABLE and unchanged:
            self._heartbeat_ok(group, member)
            return JoinResult(
                NONE,
                generation_id=group.generation_id,
                protocol_type=group.protocol_type,
                protocol_name=group.protocol_name,
                leader=group.leader or "",
                member_id=new_id,
                # the leader must not reassign: the group did not change (KIP-814)
                skip_assignment=group.leader == new_id,
                members=self._member_list(group) if group.leader == new_id else [],
            )
        if group.state == PREPARING_REBALANCE:
            return await self._await_join(group, member)
        return await self._rebalance_with(group, member)

    async def _join_known(self, group: Group, member: Member, params: JoinParams) -> JoinResult:
        changed = member.protocols != params["protocols"]
        member.protocols = params["protocols"]
        member.session_timeout_ms = params["session_timeout_ms"]
        member.rebalance_timeout_ms = params["rebalance_timeout_ms"]
        member.client_id = params["client_id"] or member.client_id
        member.client_host = params["client_host"] or member.client_host
        if group.state == PREPARING_REBALANCE:
            return await self._await_join(group, member)
        if (
            group.state in (COMPLETING_REBALANCE, STABLE)
            and not changed
            and not (group.state == STABLE and group.leader == member.member_id)
        ):
            # a member that already has this generation: answer with it (e.g. a lost JoinGroup response)
            self._heartbeat_ok(group, member)
            return self._join_result(group, member)
        return await self._rebalance_with(group, member)

    async def _add_member_and_rebalance(self, group: Group, member: Member) -> JoinResult:
        group.members[member.member_id] = member
        if member.instance_id is not None:
            group.static_members[member.instance_id] = member.member_id
        if group.state == PREPARING_REBALANCE:
            return await self._await_join(group, member)
        return await self._rebalance_with(group, member)

    async def _rebalance_with(self, group: Group, member: Member) -> JoinResult:
        self._prepare_rebalance(group)
        return await self._await_join(group, member)

    async def _await_join(self, group: Group, member: Member) -> JoinResult:
        _resolve(member.join_future, JoinResult(E.RebalanceInProgressError.code, member_id=member.member_id))
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        member.join_future = future
        member.joined = True
        _cancel(member.session_timer)
        member.session_timer = None
        if group.all_joined() and not (group.generation_id == 0 and self.initial_rebalance_delay_ms > 0):
            self._complete_join(group)
        return await future

    def _prepare_rebalance(self, group: Group) -> None:
        if group.state == PREPARING_REBALANCE:
            return
        # members waiting in SyncGroup learn that a new round started
        for m in group.members.values():
            _resolve(m.sync_future, SyncResult(E.RebalanceInProgressError.code))
            m.sync_future = None
            m.joined = False
        group.state = PREPARING_REBALANCE
        timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        if group.generation_id == 0 and self.initial_rebalance_delay_ms > 0:
            timeout = max(timeout, self.initial_rebalance_delay_ms)
            # the first rebalance waits a little for more members (group.initial.rebalance.delay.ms)
            delay = self.initial_rebalance_delay_ms
        else:
            delay = timeout
        _cancel(group.rebalance_timer)
        group.rebalance_timer = self.clock.call_later(delay / 1000, self._rebalance_deadline, group)

    def _rebalance_deadline(self, group: Group) -> None:
        group.rebalance_timer = None
        if group.state != PREPARING_REBALANCE:
            return
        for member_id, member in list(group.members.items()):
            if not member.joined:
                log.info("group %s: member %s did not rejoin in time; removing it", group.group_id, member_id)
                self._remove_member(group, member)
        for handle in group.pending.values():
            handle.cancel()
        group.pending.clear()
        self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        _cancel(group.rebalance_timer)
        group.rebalance_timer = None
        group.generation_id += 1
        if not group.members:
            group.state = EMPTY
            group.empty_since_ms = self.clock.time_ms()
            group.protocol_name = None
            group.leader = None
            return
        first = next(iter(group.members.values()))
        group.protocol_type = first.protocol_type
        group.protocol_name = group.select_protocol()
        if group.leader not in group.members:
            group.leader = first.member_id
        group.state = COMPLETING_REBALANCE
        for member in group.members.values():
            member.joined = False
            future, member.join_future = member.join_future, None
            _resolve(future, self._join_result(group, member))
            self._heartbeat_ok(group, member)

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        is_leader = member.member_id == group.leader
        return JoinResult(
            NONE,
            generation_id=group.generation_id,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader=group.leader or "",
            member_id=member.member_id,
            members=self._member_list(group) if is_leader else [],
        )

    @staticmethod
    def _member_list(group: Group) -> list[tuple[str, str | None, bytes]]:
        return [(m.member_id, m.instance_id, m.metadata_for(group.protocol_name)) for m in group.members.values()]

    # --- SyncGroup -------------------------------------------------------------------------------------

    async def sync(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        assignments: dict[str, bytes],
        *,
        group_instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> SyncResult:
        group = self.groups.get(group_id)
        if group is None or group.state == DEAD:
            return SyncResult(E.UnknownMemberIdError.code)
        error, member = self._check_member(group, member_id, group_instance_id)
        if member is None:
            return SyncResult(error)
        if generation_id != group.generation_id:
            return SyncResult(E.IllegalGenerationError.code)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return SyncResult(E.InconsistentGroupProtocolError.code)
        if group.state == PREPARING_REBALANCE:
            return SyncResult(E.RebalanceInProgressError.code)
        if group.state == STABLE:
            self._heartbeat_ok(group, member)
            return self._sync_result(group, member)
        if group.state != COMPLETING_REBALANCE:
            return SyncResult(E.UnknownMemberIdError.code)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        _resolve(member.sync_future, SyncResult(E.RebalanceInProgressError.code))
        member.sync_future = future
        self._heartbeat_ok(group, member)
        if member_id == group.leader:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            group.state = STABLE
            for m in group.members.values():
                waiting, m.sync_future = m.sync_future, None
                _resolve(waiting, self._sync_result(group, m))
        return await future

    @staticmethod
    def _sync_result(group: Group, member: Member) -> SyncResult:
        return SyncResult(NONE, group.protocol_type, group.protocol_name, member.assignment)

    # --- Heartbeat / LeaveGroup ------------------------------------------------------------------------

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None = None) -> int:
        group = self.groups.get(group_id)
        if group is None or group.state in (DEAD, EMPTY):
            return E.UnknownMemberIdError.code
        error, member = self._check_member(group, member_id, group_instance_id)
        if member is None:
            return error
        if generation_id != group.generation_id:
            return E.IllegalGenerationError.code
        self._heartbeat_ok(group, member)
        if group.state == PREPARING_REBALANCE:
            return E.RebalanceInProgressError.code
        return NONE

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> tuple[int, list[int]]:
        """Remove members ((member_id, group_instance_id) pairs); returns (group error, per-member errors)."""
        group = self.groups.get(group_id)
        if group is None or group.state == DEAD:
            return E.UnknownMemberIdError.code, [E.UnknownMemberIdError.code] * len(members)
        codes = []
        for member_id, instance_id in members:
            if instance_id is not None:
                known = group.static_members.get(instance_id)
                if known is None:
                    codes.append(E.UnknownMemberIdError.code)
                    continue
                if member_id and member_id != known:
                    codes.append(E.FencedInstanceIdError.code)
                    continue
                member_id = known
            member = group.members.get(member_id)
            if member is None:
                if member_id in group.pending:
                    group.pending.pop(member_id).cancel()
                    codes.append(NONE)
                else:
                    codes.append(E.UnknownMemberIdError.code)
                continue
            codes.append(NONE)
            self._member_left(group, member)
        return NONE, codes

    def _check_member(self, group: Group, member_id: str, instance_id: str | None) -> tuple[int, Member | None]:
        if instance_id is not None:
            known = group.static_members.get(instance_id)
            if known is not None and known != member_id:
                return E.FencedInstanceIdError.code, None
        member = group.members.get(member_id)
        if member is None:
            return E.UnknownMemberIdError.code, None
        return NONE, member

    # --- timers ----------------------------------------------------------------------------------------

    def _heartbeat_ok(self, group: Group, member: Member) -> None:
        _cancel(member.session_timer)
        member.session_timer = self.clock.call_later(
            member.session_timeout_ms / 1000, self._session_expired, group, member
        )

    def _session_expired(self, group: Group, member: Member) -> None:
        member.session_timer = None
        if group.members.get(member.member_id) is not member:
            return
        if _waiting(member.join_future) or _waiting(member.sync_future):
            # a member parked in JoinGroup / SyncGroup is alive; the rebalance timeout governs it (a future
            # cancelled because the member's connection dropped does not count)
            self._heartbeat_ok(group, member)
            return
        log.info("group %s: member %s session expired", group.group_id, member.member_id)
        self._member_left(group, member)

    def _expire_pending(self, group: Group, member_id: str) -> None:
        group.pending.pop(member_id, None)
        if group.state == PREPARING_REBALANCE and group.all_joined():
            self._complete_join(group)

    def _member_left(self, group: Group, member: Member) -> None:
        self._remove_member(group, member)
        if group.state in (STABLE, COMPLETING_REBALANCE):
            if group.members:
                self._prepare_rebalance(group)
                # the members still here must rejoin; their sync/heartbeat tells them so
            else:
                group.state = EMPTY
                group.empty_since_ms = self.clock.time_ms()
                group.generation_id += 1
                group.leader = None
                group.protocol_name = None
        elif group.state == PREPARING_REBALANCE and group.all_joined():
            self._complete_join(group)

    def _remove_member(self, group: Group, member: Member) -> None:
        group.members.pop(member.member_id, None)
        if member.instance_id is not None and group.static_members.get(member.instance_id) == member.member_id:
            del group.static_members[member.instance_id]
        _cancel(member.session_timer)
        member.session_timer = None
        _resolve(member.join_future, JoinResult(E.UnknownMemberIdError.code, member_id=member.member_id))
        _resolve(member.sync_future, SyncResult(E.UnknownMemberIdError.code))
        if group.leader == member.member_id:
            group.leader = next(iter(group.members), None)

    # --- offsets ---------------------------------------------------------------------------------------

    async def commit_offsets(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        offsets: dict[tuple[str, int], tuple[int, int, str | None]],
        *,
        group_instance_id: str | None = None,
    ) -> dict[tuple[str, int], int]:
        """Commit (offset, leader_epoch, metadata) per partition; returns an error code per partition.

        Partition validity (topic exists) is the handler's check; it passes only known partitions here."""
        error = self._commit_check(group_id, generation_id, member_id, group_instance_id)
        if error:
            return dict.fromkeys(offsets, error)
        result: dict[tuple[str, int], int] = {}
        now = self.clock.time_ms()
        to_store: dict[tuple[str, int], GroupOffset] = {}
        for tp, (offset, leader_epoch, metadata) in offsets.items():
            metadata = metadata or ""
            if len(metadata) > MAX_OFFSET_METADATA:
                result[tp] = OFFSET_METADATA_TOO_LARGE
                continue
            to_store[tp] = GroupOffset(offset, metadata, now, leader_epoch)
            result[tp] = NONE
        if to_store:
            self._committing[group_id] = self._committing.get(group_id, 0) + 1
            try:
                await self.store.commit_offsets(group_id, to_store)
            except Exception as exc:  # noqa: BLE001 - every partition learns the storage failure
                log.warning("group %s: offset commit failed: %s", group_id, exc)
                code = errors.kafka_code_for(exc)
                return {tp: (code if tp in to_store else c) for tp, c in result.items()}
            finally:
                left = self._committing.pop(group_id) - 1
                if left:
                    self._committing[group_id] = left
        if group_id not in self.groups:
            self.groups[group_id] = Group(group_id, now)
        return result

    async def commit_transactional_offsets(self, group_id: str, offsets: dict[tuple[str, int], GroupOffset]) -> None:
        """A committed transaction's offsets (mqk.server.kafka.transactions): stored as they are, whatever the
        group's membership now (TxnOffsetCommit checked the member when the transaction sent them)."""
        await self.store.commit_offsets(group_id, offsets)
        if group_id not in self.groups:
            self.groups[group_id] = Group(group_id, self.clock.time_ms())

    def txn_commit_check(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None) -> int:
        """TxnOffsetCommit v3+ names the consumer's member and generation: checked as an OffsetCommit's would be
        (an older request, or generation -1, is not checked, as in Kafka)."""
        if generation_id < 0 and not member_id:
            return NONE if group_id else E.InvalidGroupIdError.code
        return self._commit_check(group_id, generation_id, member_id, instance_id)

    def _commit_check(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None) -> int:
        if not group_id:
            return E.InvalidGroupIdError.code
        consumer_code = self.consumer.commit_check(group_id, member_id, generation_id)
        if consumer_code is not None:  # a consumer-protocol group: the member epoch is the generation
            return consumer_code
        group = self.groups.get(group_id)
        if group is None:
            # a "simple" commit (no membership, offsets only) creates the group as Empty
            return NONE if generation_id < 0 else E.IllegalGenerationError.code
        if group.state == DEAD:
            return E.CoordinatorNotAvailableError.code
        if group.state == EMPTY and generation_id < 0:
            return NONE
        error, member = self._check_member(group, member_id, instance_id)
        if member is None:
            return error
        if generation_id != group.generation_id:
            return E.IllegalGenerationError.code
        if group.state == COMPLETING_REBALANCE:
            return E.RebalanceInProgressError.code
        self._heartbeat_ok(group, member)
        return NONE

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[tuple[str, int]] | None = None
    ) -> dict[tuple[str, int], GroupOffset | None]:
        """Committed offsets of these partitions (None where nothing is committed), or all of them."""
        committed = self.store.fetch_offsets(group_id)
        if partitions is None:
            return dict(committed)
        return {tp: committed.get(tp) for tp in partitions}

    # --- expiry (offsets.retention.minutes) ------------------------------------------------------------

    async def _expiry_loop(self) -> None:
        while True:
            await self.clock.sleep(self.offsets_retention_check_interval_ms / 1000)
            try:
                await self.expire_offsets()
            except Exception:  # a failed pass is retried at the next interval; it must not end the loop
                log.exception("offset expiry pass failed")

    async def expire_offsets(self) -> int:
        """Delete the committed offsets that have outlived `offsets_retention_ms` (the module docstring says
        which); a group left with neither members nor offsets is gone. Returns how many offsets were deleted."""
        started = self.clock.monotonic()
        horizon = self.clock.time_ms() - self.offsets_retention_ms
        removed = 0
        for group_id in self.store.list_offset_groups():
            if group_id in self._committing:
                continue
            if self.active_elsewhere is not None and self.active_elsewhere(group_id):
                continue
            group = self.groups.get(group_id)
            expired = self._expired(group, self.store.fetch_offsets(group_id), horizon)
            if not expired:
                continue
            try:
                await self.store.delete_offsets(group_id, expired)
            except (errors.MqkError, OSError) as exc:  # e.g. no longer master: the next pass (or master) retries
                log.warning("group %s: expired offsets not deleted: %s", group_id, exc)
                continue
            removed += len(expired)
            if (
                group is not None
                and self.groups.get(group_id) is group
                and group.state == EMPTY
                and not group.members
                and not self.store.fetch_offsets(group_id)
            ):
                group.state = DEAD
                del self.groups[group_id]
                log.info("group %s: no members and no offsets left; Dead", group_id)
        if removed:
            took_ms = (self.clock.monotonic() - started) * 1000
            log.info("removed %d expired offset(s) in %.0f ms", removed, took_ms)
        return removed

    def _expired(
        self, group: Group | None, committed: dict[tuple[str, int], GroupOffset], horizon: int
    ) -> list[tuple[str, int]]:
        """The partitions of `committed` whose offsets are due to expire (base timestamp at or before
        `horizon`), by Kafka's rules for the group's state."""
        if group is None or (group.protocol_type is None and not group.members):
            # a standalone consumer's commits, or a group this coordinator knows only from its offsets
            return [tp for tp, value in committed.items() if max(value.commit_timestamp, self._since_ms) <= horizon]
        if group.state == EMPTY:
            return list(committed) if max(group.empty_since_ms, self._since_ms) <= horizon else []
        if group.state == STABLE:
            topics = group.subscribed_topics()
            if topics is not None:  # KIP-496: what the members no longer subscribe to ages out
                return [
                    tp
                    for tp, value in committed.items()
                    if tp[0] not in topics and max(value.commit_timestamp, self._since_ms) <= horizon
                ]
        return []

    # --- admin -----------------------------------------------------------------------------------------

    def group_ids(self) -> list[str]:
        ids = {gid for gid, g in self.groups.items() if g.state != DEAD}
        ids.update(self.store.list_offset_groups())
        ids.update(self.consumer.groups)
        ids.update(g for g, _state in self.share.list_groups())
        return sorted(ids)

    def list_groups(self, states: Iterable[str] | None = None) -> list[tuple[str, str, str]]:
        """(group_id, protocol_type, state), optionally only in the given states (case-insensitive)."""
        wanted = {s.lower() for s in states} if states else None
        out = []
        consumer = dict(self.consumer.list_groups())
        share = dict(self.share.list_groups())
        for gid in self.group_ids():
            group = self.groups.get(gid)
            if gid in share:
                state, ptype = share[gid], "share"
            elif gid in consumer:
                state, ptype = consumer[gid], "consumer"
            else:
                state = group.state if group else EMPTY
                ptype = (group.protocol_type if group else None) or ""
            if wanted is None or state.lower() in wanted:
                out.append((gid, ptype, state))
        return out

    def group_type(self, group_id: str) -> str:
        """ListGroups v5's group type: "consumer" for a group of the KIP-848 protocol, else "classic"."""
        if group_id in self.consumer.groups:
            return "consumer"
        return "share" if any(g == group_id for g, _state in self.share.list_groups()) else "classic"

    def describe(self, group_id: str) -> dict[str, Any] | None:
        """The group as DescribeGroups shows it, or None if the coordinator knows nothing of it. A consumer-protocol
        group is shown as Kafka shows one to DescribeGroups: protocol type "consumer", its assignor as the protocol,
        and each member's subscription and assignment in the classic consumer protocol's encoding."""
        described = self.consumer.describe(group_id, lambda t: None)
        if described is not None:
            names = {uuid.UUID(bytes=bytes(i.topic_id)): n for n, i in self.store.topics().items()}
            return {
                "group_id": group_id,
                "group_state": described["group_state"],
                "protocol_type": "consumer",
                "protocol_data": described["assignor_name"],
                "members": [
                    {
                        "member_id": m["member_id"],
                        "group_instance_id": m["instance_id"],
                        "client_id": m["client_id"],
                        "client_host": m["client_host"],
                        "member_metadata": consumer_subscription(m["subscribed_topic_names"]),
                        "member_assignment": consumer_assignment(
                            [
                                (names.get(tp["topic_id"], ""), tp["partitions"])
                                for tp in m["assignment"]["topic_partitions"]
                            ]
                        ),
                    }
                    for m in described["members"]
                ],
            }
        group = self.groups.get(group_id)
        if group is None:
            if group_id in self.store.list_offset_groups():
                group = Group(group_id)
            else:
                return None
        stable = group.state == STABLE
        members = [
            {
                "member_id": m.member_id,
                "group_instance_id": m.instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                # like Kafka, metadata and assignment are only shown once the group is stable
                "member_metadata": m.metadata_for(group.protocol_name) if stable else b"",
                "member_assignment": m.assignment if stable else b"",
            }
            for m in group.members.values()
        ]
        return {
            "group_id": group_id,
            "group_state": group.state,
            "protocol_type": group.protocol_type or "",
            "protocol_data": (group.protocol_name or "") if stable else "",
            "members": members,
        }

    async def delete_group(self, group_id: str) -> int:
        if self.consumer.has_members(group_id):
            return E.NonEmptyGroupError.code
        self.consumer.groups.pop(group_id, None)
        group = self.groups.get(group_id)
        known = group is not None and group.state != DEAD
        if not known and group_id not in self.store.list_offset_groups():
            return E.GroupIdNotFoundError.code
        if group is not None and (group.members or group.state not in (EMPTY, DEAD)):
            return E.NonEmptyGroupError.code
        try:
            await self.store.delete_offsets(group_id, None)
        except (errors.MqkError, OSError) as exc:  # what the store raises for a fault it answers with a code
            return errors.kafka_code_for(exc)
        if group is not None:
            group.state = DEAD
            del self.groups[group_id]
        return NONE

    async def forget_topic(self, topic: str) -> None:
        """A deleted topic's committed offsets go with it (as in Kafka), so a topic created again under the
        same name does not inherit them."""
        for group_id in self.store.list_offset_groups():
            stale = [tp for tp in self.store.fetch_offsets(group_id) if tp[0] == topic]
            if stale:
                try:
                    await self.store.delete_offsets(group_id, stale)
                except Exception as exc:  # noqa: BLE001 - the topic is gone either way; log and go on
                    log.warning("group %s: offsets of deleted topic %s not removed: %s", group_id, topic, exc)

    async def delete_offsets(
        self, group_id: str, partitions: list[tuple[str, int]]
    ) -> tuple[int, dict[tuple[str, int], int]]:
        """OffsetDelete: (group error, per-partition errors). Partitions of topics the group's members are
        subscribed to are refused with GROUP_SUBSCRIBED_TO_TOPIC."""
        group = self.groups.get(group_id)
        if (group is None or group.state == DEAD) and group_id not in self.store.list_offset_groups():
            return E.GroupIdNotFoundError.code, {}
        subscribed: set[str] = set()
        if group is not None and group.members:
            topics = group.subscribed_topics()
            if topics is None:
                return E.NonEmptyGroupError.code, {}
            subscribed = topics
        result = {}
        deletable = []
        for tp in partitions:
            if tp[0] in subscribed:
                result[tp] = E.GroupSubscribedToTopicError.code
            else:
                result[tp] = NONE
                deletable.append(tp)
        if deletable:
            try:
                await self.store.delete_offsets(group_id, deletable)
            except (errors.MqkError, OSError) as exc:  # what the store raises for a fault it answers with a code
                return errors.kafka_code_for(exc), {}
        return NONE, result


def _waiting(future: asyncio.Future | None) -> bool:
    return future is not None and not future.done()


def _resolve(future: asyncio.Future | None, value: Any) -> None:
    if future is not None and not future.done():
        future.set_result(value)


def _cancel(handle: TimerHandle | None) -> None:
    if handle is not None:
        handle.cancel()
