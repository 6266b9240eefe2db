"""The classic group coordinator driven by Hypothesis through random interleavings of what consumers do: join (old
and new JoinGroup versions, dynamic and static members, changing protocol lists), sync, heartbeat, commit, leave,
vanish without leaving (a crash: the session timer must clean up), and time passing past session and rebalance
timeouts. Time is a FakeClock moved by the steps (sessions and rebalance timeouts of tens of milliseconds), so a
run is deterministic and takes no wall time.

Invariants checked after every step:
- nothing the coordinator answers raises, and every error code is one a client of that call can be given;
- one generation has one protocol, which every member of it offered, and one leader (whose member id changes only
  when it is a static member that restarted);
- a generation holds only members that were told they joined it (one that did not rejoin in time is dropped);
- generations only grow for a member; the leader's member list contains the leader;
- an assignment a member receives is one a leader handed out, and a dynamic member only ever gets its own;
- at the end, with the clients gone quiet past every timeout, every parked JoinGroup / SyncGroup has an answer and
  the group is Empty (the coordinator never leaves a caller waiting forever or a dead member in the group).
"""

from __future__ import annotations

import asyncio

from helpers import OffsetsOnly, subscription
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mqk import errors as E
from mqk.clock import FakeClock, settle
from mqk.groups.coordinator import COMPLETING_REBALANCE, DEAD, EMPTY, PREPARING_REBALANCE, STABLE, GroupCoordinator

GROUP = "g"
SUBSCRIPTION = subscription("t")
PROTOCOL_LISTS = [("range", "roundrobin"), ("roundrobin",), ("range",), ("roundrobin", "range")]
OK = 0
JOIN_ERRORS = {
    OK,
    E.MemberIdRequiredError.code,
    E.UnknownMemberIdError.code,
    E.RebalanceInProgressError.code,
    E.FencedInstanceIdError.code,
    E.InconsistentGroupProtocolError.code,
    E.CoordinatorNotAvailableError.code,
}
SYNC_ERRORS = {
    OK,
    E.UnknownMemberIdError.code,
    E.IllegalGenerationError.code,
    E.RebalanceInProgressError.code,
    E.FencedInstanceIdError.code,
    E.InconsistentGroupProtocolError.code,
    E.CoordinatorNotAvailableError.code,
}
HEARTBEAT_ERRORS = {
    OK,
    E.UnknownMemberIdError.code,
    E.IllegalGenerationError.code,
    E.RebalanceInProgressError.code,
    E.FencedInstanceIdError.code,
}
COMMIT_ERRORS = {
    OK,
    E.UnknownMemberIdError.code,
    E.IllegalGenerationError.code,
    E.RebalanceInProgressError.code,
    E.FencedInstanceIdError.code,
}
SESSION_MS = 60
REBALANCE_MS = 90
QUIET_S = 0.35  # far past every session and rebalance timeout


class Client:
    """What one consumer knows about its membership."""

    def __init__(self, index: int) -> None:
        self.name = f"c{index}"
        self.instance_id = f"static-{index}" if index % 2 else None
        self.protocols = PROTOCOL_LISTS[0]
        self.reset()
        self.join_task: asyncio.Task | None = None
        self.sync_task: asyncio.Task | None = None

    def reset(self) -> None:
        self.member_id = ""
        self.generation = -1
        self.leader = ""
        self.members: list[str] = []


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.coordinator = GroupCoordinator(
            OffsetsOnly(), min_session_timeout_ms=10, max_session_timeout_ms=60_000, clock=self.clock
        )
        self.clients = [Client(i) for i in range(4)]
        self.other_tasks: list[tuple[str, asyncio.Task]] = []
        self.generations: dict[int, tuple[str, str | None]] = {}  # generation -> (leader, protocol)
        self.offered: dict[int, dict[str, tuple[str, ...]]] = {}  # generation -> member -> protocols offered
        self.handed_out: set[bytes] = set()
        self.joined_ok: dict[int, set[str]] = {}  # generation -> member ids that were told they are in it
        self.instance_of: dict[str, str | None] = {}  # member id -> its group.instance.id
        self.abandoned: set[str] = set()  # members that may be in a generation without hearing so (see vanish)

    def teardown(self) -> None:
        try:
            self._run(QUIET_S)
            for client in self.clients:
                for task in (client.join_task, client.sync_task):
                    assert task is None or task.done(), f"{client.name} is still waiting for an answer"
            group = self.coordinator.groups.get(GROUP)
            assert group is None or (group.state == EMPTY and not group.members), (group.state, list(group.members))
        finally:
            self.coordinator.close()
            self._run(0)
            self.loop.close()

    # --- driving the loop ----------------------------------------------------------------------------

    def _run(self, seconds: float) -> None:
        """Time passes (the timers due meanwhile fire), and every task they woke runs to its next wait."""
        self.loop.run_until_complete(self.clock.advance(seconds))
        self._harvest()

    def _now(self, fn, *args):
        """A synchronous coordinator call, made on the loop (its timers need the running loop)."""

        async def call():
            return fn(*args)

        return self.loop.run_until_complete(call())

    def _start(self, coro) -> asyncio.Task:
        task = self.loop.create_task(coro)
        self.loop.run_until_complete(settle())
        return task

    def _harvest(self) -> None:
        for client in self.clients:
            if client.join_task is not None and client.join_task.done():
                task, client.join_task = client.join_task, None
                self._joined(client, task.result())
            if client.sync_task is not None and client.sync_task.done():
                task, client.sync_task = client.sync_task, None
                self._synced(client, *task.result())
        still = []
        for kind, task in self.other_tasks:
            if task.done():
                codes = task.result()
                assert set(codes.values()) <= COMMIT_ERRORS, (kind, codes)
            else:
                still.append((kind, task))
        self.other_tasks = still

    def _joined(self, client: Client, result) -> None:
        assert result.error in JOIN_ERRORS, result
        if result.error == E.MemberIdRequiredError.code:
            assert result.member_id
            client.member_id = result.member_id
            return
        if result.error in (E.UnknownMemberIdError.code, E.FencedInstanceIdError.code):
            client.reset()
            return
        if result.error != OK:
            return
        assert result.member_id and result.generation_id >= 1
        assert result.generation_id >= client.generation, (result.generation_id, client.generation)
        self.instance_of[result.member_id] = client.instance_id
        seen = self.generations.setdefault(result.generation_id, (result.leader, result.protocol_name))
        if seen[0] != result.leader:
            # the one change a generation allows: its static leader restarted and took a new member id (KIP-345)
            instance = self.instance_of.get(seen[0])
            assert instance is not None and instance == self.instance_of.get(result.leader), (seen, result)
            self.generations[result.generation_id] = (result.leader, seen[1])
        assert seen[1] == result.protocol_name, (result.generation_id, seen, result)
        assert result.protocol_name in client.protocols
        self.joined_ok.setdefault(result.generation_id, set()).add(result.member_id)
        if result.leader == result.member_id and not result.skip_assignment:
            ids = [member_id for member_id, _instance, _metadata in result.members]
            assert result.member_id in ids and len(ids) == len(set(ids))
            client.members = ids
        client.member_id = result.member_id
        client.generation = result.generation_id
        client.leader = result.leader

    def _synced(self, client: Client, generation: int, member_id: str, result) -> None:
        assert result.error in SYNC_ERRORS, result
        if result.error == OK:
            if result.assignment:
                assert result.assignment in self.handed_out, result.assignment
                if client.instance_id is None:
                    assert result.assignment.endswith(f"|{member_id}".encode()), (member_id, result.assignment)
        elif (
            result.error in (E.UnknownMemberIdError.code, E.FencedInstanceIdError.code)
            and client.member_id == member_id
        ):
            client.reset()

    # --- what consumers do -----------------------------------------------------------------------------

    @rule(index=st.integers(0, 3), protocols=st.sampled_from(PROTOCOL_LISTS), new_version=st.booleans())
    def join(self, index: int, protocols: tuple[str, ...], new_version: bool) -> None:
        client = self.clients[index]
        if client.join_task is not None:
            return
        client.protocols = protocols
        client.join_task = self._start(
            self.coordinator.join(
                GROUP,
                client.member_id,
                "consumer",
                [(name, SUBSCRIPTION) for name in protocols],
                session_timeout_ms=SESSION_MS,
                rebalance_timeout_ms=REBALANCE_MS,
                group_instance_id=client.instance_id,
                require_known_member_id=new_version,
                client_id=client.name,
            )
        )

    @rule(index=st.integers(0, 3))
    def sync(self, index: int) -> None:
        client = self.clients[index]
        if client.sync_task is not None or client.generation < 0 or not client.member_id:
            return
        assignments = {}
        if client.member_id == client.leader:
            assignments = {m: f"{client.generation}|{m}".encode() for m in client.members}
            self.handed_out.update(assignments.values())
        generation, member_id = client.generation, client.member_id

        async def sync():
            result = await self.coordinator.sync(
                GROUP, generation, member_id, assignments, group_instance_id=client.instance_id
            )
            return generation, member_id, result

        client.sync_task = self._start(sync())

    @rule(index=st.integers(0, 3))
    def heartbeat(self, index: int) -> None:
        client = self.clients[index]
        if not client.member_id:
            return
        code = self._now(self.coordinator.heartbeat, GROUP, client.generation, client.member_id, client.instance_id)
        assert code in HEARTBEAT_ERRORS, code
        if code in (E.UnknownMemberIdError.code, E.FencedInstanceIdError.code) and client.join_task is None:
            client.reset()

    @rule(index=st.integers(0, 3), offset=st.integers(0, 1000))
    def commit(self, index: int, offset: int) -> None:
        client = self.clients[index]
        self.other_tasks.append(
            (
                "commit",
                self._start(
                    self.coordinator.commit_offsets(
                        GROUP,
                        client.generation,
                        client.member_id,
                        {("t", 0): (offset, -1, None)},
                        group_instance_id=client.instance_id,
                    )
                ),
            )
        )

    @rule(index=st.integers(0, 3))
    def leave(self, index: int) -> None:
        client = self.clients[index]
        if not client.member_id and client.instance_id is None:
            return
        error, codes = self._now(self.coordinator.leave, GROUP, [(client.member_id, client.instance_id)])
        assert error in (OK, E.UnknownMemberIdError.code) and len(codes) == 1
        assert codes[0] in (OK, E.UnknownMemberIdError.code, E.FencedInstanceIdError.code), codes
        if codes[0] == OK:
            client.reset()

    @rule(index=st.integers(0, 3))
    def vanish(self, index: int) -> None:
        """The consumer process dies: no LeaveGroup; its parked requests' connections drop."""
        client = self.clients[index]
        self._run(0)  # an answer that already arrived was seen by the consumer before it died
        if client.join_task is not None:
            # a member whose JoinGroup was parked stays in the rebalance it joined, and in the generation that
            # completes, until its session expires (as in Kafka): nobody is told it joined that generation
            group = self.coordinator.groups.get(GROUP)
            if group is not None:
                self.abandoned.update(m.member_id for m in group.members.values() if m.client_id == client.name)
        for task in (client.join_task, client.sync_task):
            if task is not None:
                task.cancel()
        client.join_task = client.sync_task = None
        self._run(0)
        client.reset()

    @rule(rounds=st.integers(1, 4))
    def cooperate(self, rounds: int) -> None:
        """Every consumer that is in the group, or trying to be, follows the protocol for a few rounds: rejoin
        when its generation is gone, then sync (the leader with everyone's assignment), then heartbeat. This is
        what brings random walks to a Stable group of several members."""
        for _ in range(rounds):
            group = self.coordinator.groups.get(GROUP)
            generation = group.generation_id if group is not None else -1
            for index, client in enumerate(self.clients):
                if (client.member_id or client.join_task is not None) and client.generation != generation:
                    self.join(index, client.protocols, False)
            self._run(0.005)
            for index in range(len(self.clients)):
                self.sync(index)
            self._run(0.005)
            for index in range(len(self.clients)):
                self.heartbeat(index)

    @rule(ms=st.sampled_from([0, 5, 20, 50, 120]))
    def wait(self, ms: int) -> None:
        self._run(ms / 1000)

    # --- what must always hold ----------------------------------------------------------------------------

    @invariant()
    def group_is_consistent(self) -> None:
        self._run(0)
        group = self.coordinator.groups.get(GROUP)
        if group is None:
            return
        assert group.state in (EMPTY, PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE, DEAD)
        if group.state in (COMPLETING_REBALANCE, STABLE):
            assert group.members and group.leader in group.members
            # a generation holds only members that joined it: one that did not rejoin in time was dropped
            assert set(group.members) - self.abandoned <= self.joined_ok.get(group.generation_id, set()), (
                group.generation_id,
                list(group.members),
                self.joined_ok.get(group.generation_id),
            )
            assert group.protocol_name is not None
            for member in group.members.values():
                assert group.protocol_name in member.protocol_names(), (group.protocol_name, member.protocols)
            if group.state == STABLE:
                for member in group.members.values():  # what the leader handed out, to the member it named
                    assert not member.assignment or member.assignment in self.handed_out
                    if member.instance_id is None:
                        assert member.assignment in (b"", f"{group.generation_id}|{member.member_id}".encode()), (
                            member.member_id,
                            member.assignment,
                        )
        if group.state == EMPTY:
            assert not group.members
        for instance_id, member_id in group.static_members.items():
            assert group.members[member_id].instance_id == instance_id


TestGroupCoordinatorInterleavings = GroupMachine.TestCase
TestGroupCoordinatorInterleavings.settings = settings(
    # fake time makes a run cheap: many more interleavings than real sleeps allowed, and failures shrink
    max_examples=300,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow],
)
