"""One broker's membership in a cluster: its lease, registration, the elections it takes part in, and its requests.

Owns:
- the broker's **lease** (TTL `session_timeout_s`): its registration `brokers/<node-id>`, its group's `master` key
  (when it is the master) and the `controller` key (when it is the controller) live under it, so they vanish when
  the broker dies or stops answering (SIGSTOP) for longer than the TTL. A keepalive runs every third of the TTL.
  When etcd answers that the lease expired, the broker stops leading (`leading` turns False: request handlers then
  answer NOT_LEADER_OR_FOLLOWER / NOT_COORDINATOR) and registers again under a new lease, which takes a new master
  epoch. While etcd cannot be reached at all, it keeps serving what it leads with its last view (the lease cannot
  be known lost) and refuses metadata changes (MetaUnavailable, retriable);
- the two **elections** (etcd transactions, not a protocol of mqk's own): the group's master and the cluster's
  controller. Each takes its key only if nobody holds it (`version == 0`) and bumps its epoch counter in the same
  transaction, compared on its revision, so epochs are unique and increase;
- the **mastership hooks**: `on_master` callbacks are awaited with the new master epoch before the broker serves
  as master (what a master needs comes from its log then: offsets, timer, producer state); `on_resign` callbacks
  run when it stops being master (its lease expired, etcd shows a later master of its group, or it stops), before
  it could become master again, so a replica never runs a master's services;
- **mastership handed over** (an ElectLeaders request: mqk.broker.cluster.elections): another broker may move the
  group's master key to this broker, under this broker's own lease, in one compare-and-set transaction that also
  bumps the master epoch. This broker then sees itself named master with an epoch it never held, checks in etcd that
  the key is under its current lease, and becomes master through the same `on_master` callbacks as after winning
  an election (the old master sees a later epoch and resigns, as after losing its lease);
- **asking the controller** (`ask`): a request key (under this broker's lease), answered by a result key the
  controller writes under the same lease; the asker waits for it in its view;
- **producer id blocks** (`allocate_pids`): a compare-and-set on `pid-blocks`, unique across the cluster.

The controller's work itself is in controller.py; the view in view.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from mqk import errors as E
from mqk.broker.cluster.model import (
    BrokerRecord,
    ControllerRecord,
    Keys,
    Malformed,
    MasterRecord,
    RequestRecord,
    ResultRecord,
    SyncStateRecord,
    dump,
    load_int,
    load_members,
)
from mqk.broker.cluster.view import ClusterView
from mqk.clock import SYSTEM_CLOCK, Clock
from mqk.errors import ClusterStartError
from mqk.meta import Compare, Delete, EtcdClient, LeaseExpired, MetaUnavailable, Put

log = logging.getLogger("mqk.cluster")

#: producer ids handed to one broker at a time
PID_BLOCK = 1000
#: how soon a mastership handed to this broker is looked at again when it could not be taken yet
HANDOVER_RETRY_S = 0.2
#: how soon an election etcd did not answer (slow or unreachable) is run again: nothing else may wake it, since a
#: write that never happened changes no key the watch could report
ELECTION_RETRY_S = 0.5


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    endpoints: list[tuple[str, int]]
    cluster_id: str
    node_id: int
    group: str
    #: listener name -> "host:port" advertised to clients and peers
    listeners: dict[str, str]
    rack: str | None = None
    #: the lease TTL: how long a broker that stops answering keeps its keys (Kafka's broker session timeout)
    session_timeout_s: int = 6
    #: how long a metadata change waits for the controller's answer
    request_timeout_s: float = 30.0
    #: a group whose in-sync replicas are all gone may elect any other member (Kafka's
    #: unclean.leader.election.enable)
    unclean_election: bool = False


class ClusterNode:
    def __init__(self, config: ClusterConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.clock = clock
        self.keys = Keys(config.cluster_id)
        self.meta = EtcdClient(config.endpoints, timeout=max(1.0, config.session_timeout_s / 3))
        self.view = ClusterView(self.keys)
        self.lease = 0
        #: the master epoch this broker leads its group with, 0 while it does not
        self.master_epoch = 0
        #: (controller epoch, the controller key's create revision) while this broker is the controller
        self.controlling: tuple[int, int] | None = None
        #: awaited with the new master epoch whenever this broker becomes its group's master (before it serves)
        self.on_master: list[Callable[[int], Awaitable[None]]] = []
        #: awaited, in order, whenever this broker stops being its group's master: its lease expired, etcd shows
        #: another master of its group, or it stops. They run on a task of their own; the next `on_master`
        #: callbacks wait for them, so a broker never runs both at once
        self.on_resign: list[Callable[[], Awaitable[None]]] = []
        self._resigning: asyncio.Task[None] | None = None
        #: called whenever this broker becomes the controller
        self.on_controller: list[Callable[[], None]] = []
        #: called when this broker starts serving as master and when it loses its lease (its role changed)
        self.on_role: list[Callable[[], None]] = []
        #: the in-sync set this broker wrote when it last won its group's election
        self.elected_isr: frozenset[int] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._campaigning = False
        #: orphaned keys (see `_release_orphans`) being deleted now
        self._releasing: set[str] = set()
        self._stopped = False
        #: a member outside the in-sync set may run for master (Kafka's unclean leader election: records only the
        #: lost in-sync replicas held are gone)
        self.unclean = config.unclean_election
        self._not_in_sync_logged: SyncStateRecord | None = None
        #: the highest master epoch this broker served or declined: a master record naming it with a later epoch
        #: is a mastership handed over to it (`_handed_over`)
        self._epoch_seen = 0
        #: the view revision the watchdog found etcd ahead of at its last check (`_check_watch`)
        self._behind_at: int | None = None
        self._watch_task: asyncio.Task[None] | None = None

    @property
    def node_id(self) -> int:
        return self.config.node_id

    @property
    def group(self) -> str:
        return self.config.group

    @property
    def leading(self) -> bool:
        """This broker is its group's master now (as its view last saw etcd)."""
        master = self.view.master_of(self.group)
        return (
            self.master_epoch > 0
            and master is not None
            and master.node_id == self.node_id
            and master.epoch == self.master_epoch
        )

    # --- life cycle -------------------------------------------------------------------------------------------

    async def start(self, ready_timeout: float = 30.0) -> None:
        """Join: connect, take a lease, register, follow the metadata, run for master and controller. Raises
        ClusterStartError when etcd cannot be reached or the node id stays taken by another live broker."""
        try:
            await self.meta.connect()
        except MetaUnavailable as exc:
            raise ClusterStartError(f"cannot join cluster {self.config.cluster_id!r}: {exc}") from None
        await self._register(ready_timeout)
        loop = asyncio.get_running_loop()
        self._watch_task = loop.create_task(self._follow(), name="mqk-cluster-watch")
        if not await self.view.wait_until(lambda s: self.view.synced, ready_timeout):
            raise ClusterStartError("no metadata listing from etcd")
        self.view.add_listener(self._on_change)
        self._tasks.append(loop.create_task(self._keepalive(), name="mqk-cluster-lease"))
        await self._campaign()

    async def stop(self) -> None:
        self._stopped = True
        self._resign("it stops")  # (before the lease goes: nothing of a master outlives its mastership)
        if self._resigning is not None:
            await asyncio.shield(self._resigning)
        tasks = [*self._tasks, *([self._watch_task] if self._watch_task is not None else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.lease:
            try:  # its keys go now, not a session timeout later: the others take over at once
                await self.meta.revoke(self.lease)
            except MetaUnavailable as exc:
                log.warning("cluster: lease not revoked at stop (%s); it expires by itself", exc)
            except LeaseExpired:
                pass  # gone already (it expired before this broker noticed): nothing left to revoke
        await self.meta.close()

    async def _register(self, timeout: float) -> None:  # noqa: ASYNC109 - how long a dead predecessor may hold the id
        """A new lease and this broker's key under it; waits (up to `timeout`) for the key a previous incarnation
        left to expire, and refuses a node id another live broker holds."""
        cfg = self.config
        record = BrokerRecord(cfg.node_id, cfg.group, dict(cfg.listeners), cfg.rack)
        key = self.keys.broker(cfg.node_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                self.lease = await self.meta.grant(cfg.session_timeout_s)
                if await self.meta.txn([Compare(key, "version", "==", 0)], [Put(key, dump(record), self.lease)]):
                    log.info("cluster %s: registered node %d in group %s", cfg.cluster_id, cfg.node_id, cfg.group)
                    await self._join_group()
                    return
                await self.meta.revoke(self.lease)
                self.lease = 0
            except MetaUnavailable as exc:
                raise ClusterStartError(f"cannot register in cluster {cfg.cluster_id!r}: {exc}") from None
            if loop.time() > deadline:
                raise ClusterStartError(
                    f"node id {cfg.node_id} is registered by a live broker of cluster {cfg.cluster_id!r}"
                )
            await self.clock.sleep(0.5)  # a dead predecessor's key goes when its lease expires

    async def _join_group(self) -> None:
        """Add this node to its group's members (kept when it dies: a dead replica is still the group's)."""
        key = self.keys.members(self.group)
        while True:
            current = await self.meta.get(key)
            members = load_members(current.value, key) if current is not None else []
            if self.node_id in members:
                return
            guard = (
                Compare(key, "mod", "==", current.mod_revision)
                if current is not None
                else Compare(key, "version", "==", 0)
            )
            value = json.dumps(sorted({*members, self.node_id})).encode()
            if await self.meta.txn([guard], [Put(key, value)]):
                return

    async def _follow(self) -> None:
        """Fold the metadata watch into the view for as long as the broker runs. A failure nobody foresaw (a
        client library's error, a bug in applying an event) is logged and the watch started again: a view that
        silently stops following is a broker that serves stale metadata for ever."""
        while not self._stopped:
            try:
                async for event in self.meta.watch_prefix(self.keys.root):
                    self.view.apply(event)
                return  # (the meta client was closed: the broker stops)
            except Exception:
                log.exception("cluster: the metadata watch failed; starting it again")
                await self.clock.sleep(0.5)

    async def _keepalive(self) -> None:
        period = max(0.5, self.config.session_timeout_s / 3)
        while not self._stopped:
            await self.clock.sleep(period)
            try:
                ttl = await self.meta.keepalive(self.lease)
                await self._check_watch()
            except MetaUnavailable as exc:
                log.warning("cluster: lease keepalive failed (%s); serving with the last view", exc)
                continue
            except LeaseExpired:
                ttl = 0
            if ttl <= 0:
                log.error(
                    "cluster: this broker's lease expired (paused or cut off longer than %ds); it stops "
                    "leading and registers again",
                    self.config.session_timeout_s,
                )
                self._lost_lease()
                try:
                    await self._register(self.config.session_timeout_s * 2)
                    await self._campaign()
                except (ClusterStartError, MetaUnavailable) as exc:
                    log.error("cluster: registering again failed: %s", exc)

    async def _check_watch(self) -> None:
        """The watch's watchdog, run with each keepalive: when etcd holds keys of the cluster written after the
        view's revision at two checks in a row (a period apart, far longer than a watch event takes), the watch
        has stopped delivering without failing (seen once in CI: a controller whose view never saw a request, and
        a CreateTopics that waited for its answer in vain). It is then started again on a fresh channel, and its
        listing brings the view up to date. Deletions alone are not seen this way; the next write shows the gap."""
        if not self.view.connected:
            self._behind_at = None
            return
        at = self.view.state.revision
        if not await self.meta.changed_since(self.keys.root, at):
            self._behind_at = None
            return
        if self._behind_at is None or self._behind_at < at:
            self._behind_at = at  # (an event may be on its way: look again next time)
            return
        log.warning(
            "cluster: the metadata watch delivered nothing since revision %d while etcd changed; restarting it", at
        )
        self._behind_at = None
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch_task
        await self.meta.reset_channel()
        self._watch_task = asyncio.get_running_loop().create_task(self._follow(), name="mqk-cluster-watch")

    def _lost_lease(self) -> None:
        self._resign("its lease expired")
        self.controlling = None
        self.lease = 0
        self._role_changed()

    def _role_changed(self) -> None:
        for callback in self.on_role:
            try:
                callback()
            except Exception:  # one listener's bug must not stop the node (logged with its traceback)
                log.exception("cluster: role listener %r failed", callback)

    def _resign(self, why: str) -> None:
        """Stop leading the group (if it did): `leading` turns False now, the `on_resign` callbacks run next."""
        if self.master_epoch == 0:
            return
        log.warning("cluster: no longer master of group %s (epoch %d): %s", self.group, self.master_epoch, why)
        self.master_epoch = 0
        previous = self._resigning
        self._resigning = asyncio.get_running_loop().create_task(self._run_resign(previous), name="mqk-resign")

    async def _run_resign(self, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        for callback in self.on_resign:
            try:
                await callback()
            except Exception:  # one failing part must not keep the others leading
                log.exception("cluster: a resign callback failed")

    async def _resigned(self) -> None:
        """Wait for the `on_resign` callbacks of a mastership that ended."""
        if self._resigning is not None:
            await asyncio.gather(asyncio.shield(self._resigning), return_exceptions=True)

    # --- elections ----------------------------------------------------------------------------------------------

    def _on_change(self) -> None:
        """After every change of the view: step down when another broker holds this group's mastership with a later
        epoch (this one's lease went while it was cut off), and run for what nobody holds (the group's mastership,
        the controller)."""
        state = self.view.state
        master = state.masters.get(self.group)
        if (
            self.master_epoch
            and master is not None
            and master.epoch > self.master_epoch
            and master.node_id != self.node_id
        ):
            self._resign(f"node {master.node_id} is master with epoch {master.epoch}")
        if (
            self.lease
            and not self._campaigning
            and (state.masters.get(self.group) is None or state.controller is None or self._handed_over() is not None)
        ):
            asyncio.get_running_loop().create_task(self._campaign())
        if self.lease and not self._campaigning:
            self._release_orphans()

    def _release_orphans(self) -> None:
        """Free a controllership etcd gives this broker but the broker does not hold (it won an election whose
        answer was lost and whose re-read failed): kept, the key would stall the cluster's metadata for as long as
        this broker lives. Deleted only if etcd still holds that very record, so a fresh election decides. (A
        mastership won that way is taken as a handed-over one is: `_handed_over`.)"""
        controller = self.view.state.controller
        key = self.keys.controller
        orphan = controller is not None and controller.node_id == self.node_id and self.controlling is None
        if orphan and controller is not None and key not in self._releasing:
            self._releasing.add(key)
            task = self._release(key, dump(controller))
            asyncio.get_running_loop().create_task(task, name="mqk-release-orphan")

    async def _release(self, key: str, value: bytes) -> None:
        try:
            if await self.meta.txn([Compare(key, "value", "==", value)], [Delete(key)]):
                log.warning("cluster: released %s, which this broker held without knowing it", key)
        except MetaUnavailable as exc:
            log.warning("cluster: could not release %s yet: %s", key, exc)
        finally:
            self._releasing.discard(key)

    def _handed_over(self) -> MasterRecord | None:
        """The group's master record when it names this broker with an epoch it has not served yet (another broker
        moved the mastership here: an ElectLeaders request), else None."""
        master = self.view.master_of(self.group)
        if master is not None and master.node_id == self.node_id and master.epoch > self._epoch_seen:
            return master
        return None

    @property
    def is_controller(self) -> bool:
        """This broker is the controller now (as its view last saw etcd)."""
        state = self.view.state
        return (
            self.controlling is not None
            and state.controller is not None
            and state.controller_revision == self.controlling[1]
        )

    async def _campaign(self) -> None:
        if self._campaigning or self._stopped or not self.lease:
            return
        self._campaigning = True
        postponed = False
        try:
            handed = self._handed_over()
            epoch = 0
            if self.view.master_of(self.group) is None:
                epoch = await self._elect_master()
            elif handed is not None:
                epoch = await self._accept_handover(handed)
            if epoch:
                self._epoch_seen = max(self._epoch_seen, epoch)
                lease = self.lease
                await self._resigned()
                for on_master in self.on_master:
                    try:
                        await on_master(epoch)
                    except Exception:  # the mastership is taken: it is served, the part says why not
                        log.exception("cluster: a master callback failed (epoch %d)", epoch)
                self.master_epoch = epoch
                if self.lease != lease or self._stopped:  # lost while the callbacks ran: undo them at once
                    self._resign("its lease expired while it became master")
                else:
                    log.info("cluster: master of group %s, epoch %d", self.group, epoch)
                self._role_changed()
            if self.view.state.controller is None:
                epoch = await self._elect(
                    self.keys.controller, self.keys.controller_epoch, lambda e: ControllerRecord(self.node_id, e)
                )
                if epoch:
                    record = await self.meta.get(self.keys.controller)
                    if record is not None and record.lease == self.lease:
                        self.controlling = (epoch, record.create_revision)
                        log.info("cluster: controller, epoch %d", epoch)
                        for on_controller in self.on_controller:
                            on_controller()
        except MetaUnavailable as exc:
            log.warning("cluster: election postponed: %s", exc)
            postponed = True
        except LeaseExpired:
            if not self._stopped:  # (a stop revokes the lease under a running campaign)
                log.warning("cluster: the lease expired during an election; the keepalive registers again")
        finally:
            self._campaigning = False
            retry_after = None
            if postponed:
                # every broker may have met the same etcd stall: unless one runs again, the cluster may be left
                # without a controller (or the group without a master) until some unrelated key changes
                retry_after = ELECTION_RETRY_S
            elif self._handed_over() is not None:
                # handed over while this campaign ran (its view change found `_campaigning` set), or etcd could
                # not be asked whether the handover is real: look again shortly
                retry_after = HANDOVER_RETRY_S
            if retry_after is not None and self.lease and not self._stopped:
                loop = asyncio.get_running_loop()
                loop.call_later(retry_after, lambda: loop.create_task(self._campaign()))

    async def _accept_handover(self, master: MasterRecord) -> int:
        """Take a mastership another broker moved to this one: only if etcd holds that very record under this
        broker's current lease (a record a lapsed lease left in the view is declined). The epoch, or 0."""
        current = await self.meta.get(self.keys.master(self.group))  # (MetaUnavailable: asked again, see _campaign)
        isr = await self.meta.get(self.keys.isr(self.group))
        self._epoch_seen = max(self._epoch_seen, master.epoch)  # decided once etcd answered, whatever the answer
        if current is None or current.lease != self.lease:
            return 0
        try:
            if MasterRecord.decode(current.value) != master:
                return 0
        except Malformed:
            return 0
        members = {self.node_id}
        if isr is not None:
            try:
                members.update(SyncStateRecord.decode(isr.value).members)
            except Malformed as exc:
                log.error("cluster: %s unreadable (%s); in sync: this broker alone", self.keys.isr(self.group), exc)
        self.elected_isr = frozenset(members)
        log.info("cluster: group %s's mastership handed to this broker, epoch %d", self.group, master.epoch)
        return master.epoch

    async def _elect_master(self) -> int:
        """Run for the group's mastership: only an in-sync replica may (unless `unclean` allows any member), and the
        winner writes the new in-sync set with the master key, in the same transaction: itself and the members of
        the old set that are still registered (a dead or paused old master is not). The epoch, or 0."""
        isr_key = self.keys.isr(self.group)
        current = await self.meta.get(isr_key)
        old: SyncStateRecord | None = None
        if current is not None:
            try:
                old = SyncStateRecord.decode(current.value)
            except Malformed as exc:
                log.error("cluster: %s unreadable (%s); electing as if the group had no in-sync set", isr_key, exc)
        if old is not None and self.node_id not in old.members and not self.unclean:
            if self._not_in_sync_logged != old:
                self._not_in_sync_logged = old
                log.warning(
                    "cluster: group %s has no master; node %d is not in its in-sync set %s and waits for one of "
                    "them (unclean election is off)",
                    self.group,
                    self.node_id,
                    old.members,
                )
            return 0
        registered, _revision = await self.meta.get_prefix(self.keys.brokers)
        live = {r.key[len(self.keys.brokers) :] for r in registered}
        members = {self.node_id} | {m for m in (old.members if old else ()) if str(m) in live}
        isr_guard = (
            Compare(isr_key, "mod", "==", current.mod_revision)
            if current is not None
            else Compare(isr_key, "version", "==", 0)
        )
        epoch = await self._elect(
            self.keys.master(self.group),
            self.keys.master_epoch(self.group),
            lambda e: MasterRecord(self.node_id, e),
            extra_guard=isr_guard,
            extra_put=lambda e: Put(isr_key, dump(SyncStateRecord(sorted(members), e))),
        )
        if epoch:
            self.elected_isr = frozenset(members)
        return epoch

    async def _elect(
        self,
        key: str,
        epoch_key: str,
        record: Callable[[int], object],
        extra_guard: Compare | None = None,
        extra_put: Callable[[int], Put] | None = None,
    ) -> int:
        """Take `key` under this broker's lease if nobody holds it, with the next epoch of `epoch_key`; the epoch, or
        0 when someone else holds it."""
        current = await self.meta.get(epoch_key)
        epoch = (load_int(current.value, epoch_key) if current is not None else 0) + 1
        guard = (
            Compare(epoch_key, "mod", "==", current.mod_revision)
            if current is not None
            else Compare(epoch_key, "version", "==", 0)
        )
        guards = [Compare(key, "version", "==", 0), guard]
        puts = [Put(key, dump(record(epoch)), self.lease), Put(epoch_key, str(epoch).encode())]
        if extra_guard is not None:
            guards.append(extra_guard)
        if extra_put is not None:
            puts.append(extra_put(epoch))
        try:
            won = await self.meta.txn(guards, puts)
        except E.MetaOutcomeUnknown:
            # the answer was lost, not necessarily the write: the key says who won (this re-read may itself fail;
            # then a mastership is taken as a handed-over one, a controllership released: `_on_change`)
            held = await self.meta.get(key)
            won = held is not None and held.lease == self.lease and held.value == dump(record(epoch))
            log.warning(
                "cluster: the answer to the election for %s was lost; re-read: %s", key, "won" if won else "lost"
            )
        return epoch if won else 0

    def controller_fence(self) -> Compare:
        """The compare every controller write carries: the controller key is still the one this broker created."""
        if not self.is_controller or self.controlling is None:
            raise E.NotControllerError("this broker is not the controller")
        return Compare(self.keys.controller, "create", "==", self.controlling[1])

    # --- metadata changes ----------------------------------------------------------------------------------------

    async def ask(
        self,
        request: RequestRecord,
        timeout: float | None = None,  # noqa: ASYNC109 - the wait for the controller's answer, which the caller may shorten
    ) -> None:
        """Have the controller make a metadata change and wait for its answer; raises the error it answered with
        (an mqk.errors class), MetaUnavailable when etcd cannot be reached, or RequestTimedOut."""
        if not self.lease:
            raise MetaUnavailable("this broker is not registered in its cluster (lease lost)")
        request_id = uuid.uuid4().hex
        body = dataclasses.replace(request, configs=dict(request.configs), lease=self.lease)
        await self.meta.put(self.keys.request(request_id), dump(body), self.lease)
        answered = await self.view.wait_until(
            lambda s: request_id in s.results, timeout or self.config.request_timeout_s
        )
        result = self.view.state.results.get(request_id)
        with contextlib.suppress(MetaUnavailable):
            await self.meta.txn([], [Delete(self.keys.result(request_id)), Delete(self.keys.request(request_id))])
        if not answered or result is None:
            raise E.RequestTimedOutError(f"the controller did not answer {request.op} {request.topic!r} in time")
        raise_result(result)

    async def next_free_pid(self) -> int:
        """The first producer id no broker has handed out yet."""
        current = await self.meta.get(self.keys.pid_blocks)
        return load_int(current.value, self.keys.pid_blocks) if current is not None else 0

    async def allocate_pids(self, size: int = PID_BLOCK) -> range:
        """A block of producer ids no other broker of the cluster will hand out."""
        key = self.keys.pid_blocks
        while True:
            current = await self.meta.get(key)
            first = load_int(current.value, key) if current is not None else 0
            guard = (
                Compare(key, "mod", "==", current.mod_revision)
                if current is not None
                else Compare(key, "version", "==", 0)
            )
            if await self.meta.txn([guard], [Put(key, str(first + size).encode())]):
                return range(first, first + size)


def raise_result(result: ResultRecord) -> None:
    """Raise the error a controller answered with (nothing for success)."""
    if not result.error:
        return
    cls = getattr(E, result.error, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = E.StorageError
    raise cls(result.message)


__all__ = ["PID_BLOCK", "ClusterConfig", "ClusterNode", "ClusterStartError", "raise_result"]
