"""Replication of a broker group's CommitLog (RocketMQ's HA, with Kafka's in-sync replicas and high watermark).

A broker group has one master and its replicas (the other members). The master's file-engine CommitLog is copied
byte for byte, at the same physical offsets, to each replica over the replication listener (`--replication-listen`,
advertised in etcd as the broker's "replication" listener); replicas dispatch it as recovery does, so their
ConsumeQueues, key index and every internal topic match the master's (link.py, store/file/replica.py).

`Replication` owns this broker's role in that:
- **master** (from the moment the cluster node wins its group's election, before it serves: the `on_master`
  callback): stop following, take local appends, and stream to every replica that connects; track what each holds
  (tracker.py); keep the group's in-sync set in etcd as replicas fall behind (`replica_lag_time_max_ms`), stop
  being registered, or catch up (compare-and-set on the set's revision, fenced on this master's own key);
- **replica** (otherwise): refuse local appends (NotMaster), follow whichever master the view names, cut a diverged
  tail as the master's epoch history says, and ack what it holds;
- **stepping down** (the lease lost, another master in the view): refuse appends at once, fail the produce requests
  waiting for replicas (NOT_LEADER_OR_FOLLOWER), close the links, and follow the new master, which is where a
  paused old master's unreplicated writes are cut away.

Front doors ask it three things: `check_insync` before an acks=all append (NOT_ENOUGH_REPLICAS below
`min.insync.replicas`), `wait_replicated` after it (until every in-sync replica holds the entries), and
`committed_end` for what consumers may read (the high watermark: nothing an in-sync replica may not hold).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mqk import errors as E
from mqk.broker import internal
from mqk.broker.accepted import AcceptedTransports
from mqk.broker.cluster.model import MasterRecord, SyncStateRecord, dump
from mqk.broker.replication import protocol as P
from mqk.broker.replication.link import (
    NOT_READY_RETRY_S,
    RETRY_S,
    MasterLink,
    MasterNotReady,
    close_writer,
    follow,
    read_frame,
)
from mqk.broker.replication.tracker import CommitTracker
from mqk.clock import SYSTEM_CLOCK, Clock
from mqk.config import TopicConfig
from mqk.errors import MqkError
from mqk.meta import Compare, MetaUnavailable, Put

if TYPE_CHECKING:
    from mqk.broker.cluster import ClusterMember
    from mqk.store.file.engine import FileEngine
    from mqk.store.manager import StoreManager

log = logging.getLogger("mqk.replication")

#: how often the master looks at its in-sync set
ISR_CHECK_S = 0.2
#: replication lags kept for the p99 (`lag_p99_ms`)
LAG_SAMPLES = 4096


#: how often stopping a link cancels it again while it has not ended
STOP_FOLLOW_RECHECK_S = 0.5
#: how long a replicated entry waits for its topic to be made here before the link starts again
RESOLVE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    #: Kafka replica.lag.time.max.ms: an in-sync replica that has not caught up for this long leaves the set
    lag_time_max_ms: int = 30_000


class Replication:
    def __init__(
        self,
        store: StoreManager,
        engine: FileEngine,
        config: ReplicationConfig = ReplicationConfig(),
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.engine = engine
        self.config = config
        self.clock = clock
        #: the cluster membership this broker replicates for (`bind`)
        self.member: ClusterMember = None  # type: ignore[assignment]  # (set by bind, before anything connects)
        self.tracker = CommitTracker(-1, lambda: engine.log_end)
        self.tracker.on_commit.append(self._committed)
        #: the master's links, by replica node id
        self.links: dict[int, MasterLink] = {}
        self.is_master = False
        self.master_epoch = 0
        #: a replica's link is up and streaming
        self.following = False
        #: the highest commit offset heard from a master (where this broker's own commit starts if promoted)
        self.heard = 0
        self._server: asyncio.Server | None = None
        #: every socket the listener accepted, for the stop to leave none open
        self._accepted = AcceptedTransports()
        self.address: tuple[str, int] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._follow_task: asyncio.Task[None] | None = None
        self._following_target: tuple[int, int] | None = None
        self._isr_task: asyncio.Task[None] | None = None
        self._role_changed = asyncio.Event()
        self._promoting = False
        #: appends not yet held by every in-sync replica: (CommitLog end after it, monotonic time, topic, the
        #: queues that grew), for the lag samples and to wake the readers once the high watermark passes them
        self._pending: deque[tuple[int, float, str, Sequence[tuple[int, int]]]] = deque()
        #: a replica's copies not yet below the commit offset its master told it: (CommitLog end after them, topic,
        #: the queues that grew), to wake its own readers (follower fetches, slave pulls) once they are
        self._heard_pending: deque[tuple[int, str, Sequence[tuple[int, int]]]] = deque()
        self.lags_ms: deque[float] = deque(maxlen=LAG_SAMPLES)
        #: the readers' wake-up (the broker's WakeupHub.notify): consumers wait for the high watermark, not the end
        self.wake: Callable[[str, Sequence[tuple[int, int]]], None] | None = None
        #: who answers a peer whose first frame is FETCH (a partition copied to another group: mqk.broker.moves),
        #: given that frame's body and the connection
        self.partition_reads: Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]] | None = (
            None
        )

    # --- life cycle -------------------------------------------------------------------------------------------

    async def listen(self, host: str, port: int) -> tuple[str, int]:
        """Bind the replication listener (before the broker registers, so its address can be advertised)."""
        self._server = await asyncio.start_server(self._accept, host, port, limit=1 << 16)
        sock = self._server.sockets[0].getsockname()
        self.address = (sock[0], sock[1])
        return self.address

    def bind(self, member: ClusterMember) -> None:
        """Replicate for `member`: hook into its node and view and into the store (before the node campaigns)."""
        self.member = member
        self.tracker.node_id = member.node_id
        node = member.node
        node.on_master.insert(0, self._promote)  # first: the log must stop growing before anything records its end
        node.on_role.append(self._role_changed.set)
        self.member.view.add_listener(self._role_changed.set)
        self.store.add_listener(self._on_data)

    async def start(self) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(self._roles(), name="mqk-replication-roles"))
        self._role_changed.set()

    async def stop(self) -> None:
        for task in [*self._tasks, self._isr_task]:
            if task is not None:
                task.cancel()
        await self._stop_following()
        for task in [*self._tasks, self._isr_task]:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self.tracker.fail_all(E.NotLeaderOrFollowerError("the broker is stopping"))
        for link in list(self.links.values()):
            link.writer.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        await self._accepted.abort_all()

    # --- what the front doors ask -----------------------------------------------------------------------------

    def check_insync(self, min_insync: int) -> None:
        """Before an acks=all append: NotEnoughReplicasError while the in-sync set is below `min_insync`."""
        if len(self.tracker.isr) < min_insync:
            raise E.NotEnoughReplicasError(
                f"{len(self.tracker.isr)} in-sync replicas, min.insync.replicas is {min_insync}"
            )

    async def wait_replicated(
        self,
        target: int,
        min_insync: int,
        timeout: float,  # noqa: ASYNC109 - the produce request's own timeout, answered REQUEST_TIMED_OUT
    ) -> None:
        """After an acks=all append ending at CommitLog offset `target`: wait until every in-sync replica holds
        it. RequestTimedOutError after `timeout` seconds; NotLeaderOrFollowerError if this broker stops being
        master first; NotEnoughReplicasAfterAppendError if the set shrank below `min_insync` meanwhile."""
        if not self.is_master:
            raise E.NotLeaderOrFollowerError("this broker is not its group's master")
        fut = self.tracker.wait(target, min_insync)
        if fut.done():
            fut.result()
            return
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise E.RequestTimedOutError(
                f"the in-sync replicas did not acknowledge CommitLog offset {target} within {timeout:.1f}s"
            ) from None

    @property
    def commit(self) -> int:
        """The CommitLog offset below which consumers may read (the high watermark, in bytes)."""
        return self.tracker.commit if self.is_master else self.heard

    def committed_end(self, topic: str, queue: int, end: int) -> int:
        """The partition's high watermark: its offset below which every entry lies below the commit offset."""
        if len(self.tracker.isr) == 1 and self.is_master:
            return end
        return self.engine.committed_end(topic, queue, self.commit, end)

    def lag_p99_ms(self) -> float:
        """The 99th percentile of recent replication lags (append to the last in-sync replica's ack)."""
        if not self.lags_ms:
            return 0.0
        ordered = sorted(self.lags_ms)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    # --- events ------------------------------------------------------------------------------------------------

    def _on_data(self, topic: str, queue_ends: Sequence[tuple[int, int]]) -> None:
        if not self.is_master:
            if self.wake is not None:
                self._heard_pending.append((self.engine.log_end, topic, queue_ends))
            return
        for link in self.links.values():
            link.wake.set()
        if len(self.tracker.isr) > 1:
            self._pending.append((self.engine.log_end, self.clock.monotonic(), topic, queue_ends))
        self.tracker.appended()

    def acked(self, node: int, end: int) -> None:
        self.tracker.ack(node, end, self.clock.monotonic())

    def _committed(self, commit: int) -> None:
        pending = self._pending
        if pending and pending[0][0] <= commit:
            now = self.clock.monotonic()
            wake = self.wake
            while pending and pending[0][0] <= commit:
                _end, since, topic, queue_ends = pending.popleft()
                self.lags_ms.append((now - since) * 1000)
                if wake is not None:
                    wake(topic, queue_ends)

    def heard_commit(self, commit: int) -> None:
        self.heard = max(self.heard, commit)
        pending, wake = self._heard_pending, self.wake
        while pending and pending[0][0] <= self.heard:
            _end, topic, queue_ends = pending.popleft()
            assert wake is not None  # (_on_data keeps entries only while there is a wake)
            wake(topic, queue_ends)

    async def replica_durable(self, end: int) -> None:
        """A replica acks by its group's flush policy: after the flush in sync mode."""
        flusher = self.engine.flusher
        if flusher is None:
            return
        if self.engine.config.flush_mode == "sync":
            await flusher.wait_flushed(end)
        elif end - flusher.flushed >= flusher.kick_bytes:
            flusher.kick()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._accepted.add(writer.transport):
            return
        if self.member is None:  # (bound, not yet joined: the replica tries again)
            writer.close()
            return
        try:
            async with asyncio.timeout(10.0):
                first = await read_frame(reader)
        except (MqkError, OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            log.info("replication: a peer (%s) sent no first frame: %s", writer.get_extra_info("peername"), exc)
            await close_writer(writer)
            return
        if first[0] == P.FETCH and self.partition_reads is not None:
            await self.partition_reads(first[1], reader, writer)
            return
        await MasterLink(self, reader, writer).run(first)

    # --- roles --------------------------------------------------------------------------------------------------

    async def _promote(self, epoch: int) -> None:
        """Becoming master (awaited before the broker serves as one): stop following, then take appends."""
        self._promoting = True
        await self._stop_following()
        self.master_epoch = epoch
        self.is_master = True
        now = self.clock.monotonic()
        elected = self.member.node.elected_isr or frozenset({self.member.node_id})
        self.tracker.reset(frozenset(elected), max(self.heard, self.tracker.commit), now)
        self._pending.clear()
        self._heard_pending.clear()
        self.store.set_writable(True)
        if self._isr_task is None or self._isr_task.done():
            self._isr_task = asyncio.get_running_loop().create_task(self._keep_isr(), name="mqk-replication-isr")
        log.info(
            "replication: master of group %s in epoch %d, in-sync %s, CommitLog at %d",
            self.member.group,
            epoch,
            sorted(self.tracker.isr),
            self.engine.log_end,
        )

    async def _roles(self) -> None:
        while True:
            await self._role_changed.wait()
            self._role_changed.clear()
            try:
                await self._settle()
            except Exception:  # a failed step is logged with its traceback; the next change retries it
                log.exception("replication: changing role failed")

    async def _settle(self) -> None:
        node = self.member.node
        if self._promoting:
            if node.master_epoch == self.master_epoch or not node.lease:
                self._promoting = False  # the promotion is complete (or was lost with the lease)
            else:
                return
        if self.is_master and self._mastership_lost():
            await self._step_down()
        if self.is_master:
            return
        master = self.member.view.master_of(self.member.group)
        target = None
        if master is not None and master.node_id != node.node_id and master.node_id in self.member.view.state.brokers:
            target = (master.node_id, master.epoch)
        if target != self._following_target:
            await self._stop_following()
            self._following_target = target
            if target is not None:
                self._follow_task = asyncio.get_running_loop().create_task(
                    self._follow(*target), name="mqk-replication-follow"
                )

    def _mastership_lost(self) -> bool:
        """Whether this broker's mastership is over: its node resigned (lease lost, stopped) or etcd shows another
        master of the group. A view that does not show the group's master yet (its watch behind the election's own
        answer) is no sign: stepping down on it would leave the group with a master that refuses appends."""
        node = self.member.node
        if node.master_epoch != self.master_epoch:
            return True
        master = self.member.view.master_of(self.member.group)
        return master is not None and (master.node_id != node.node_id or master.epoch != self.master_epoch)

    async def _step_down(self) -> None:
        log.warning(
            "replication: no longer master of group %s (epoch %d); appends refused, following the new master",
            self.member.group,
            self.master_epoch,
        )
        self.is_master = False
        self.store.set_writable(False)
        self.tracker.fail_all(E.NotLeaderOrFollowerError("this broker is no longer its group's master"))
        if self._isr_task is not None:
            self._isr_task.cancel()
            self._isr_task = None
        for link in list(self.links.values()):
            link.writer.close()
        self.links.clear()

    async def _stop_following(self) -> None:
        task, self._follow_task = self._follow_task, None
        self._following_target = None
        if task is None:
            return
        # cancelled again until it ends: a cancellation that meets the end of what the link awaits can be lost (the
        # link then sees it is no longer the one to run at its next turn, `_follow`), and a role change must never
        # wait for good on an old link
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_FOLLOW_RECHECK_S)
        with contextlib.suppress(asyncio.CancelledError, Exception):
            task.result()

    async def _follow(self, master: int, epoch: int) -> None:
        me = asyncio.current_task()
        while self._follow_task is me:
            broker = self.member.view.broker(master)
            address = broker.address("replication") if broker is not None else None
            if address is not None:
                try:
                    await follow(self, address, epoch, self._resolve)
                except MasterNotReady:
                    await self.clock.sleep(NOT_READY_RETRY_S)
                    continue
                except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                    log.debug("replication: link to node %d: %s", master, exc)
                except E.MqkError as exc:
                    log.warning("replication: link to node %d: %s", master, exc)
            await self.clock.sleep(RETRY_S)

    async def _resolve(self, topic: str, queue: int) -> bool:
        """Make the shard a replicated entry needs (see store/file/replica.py); whether it exists now."""
        engine = self.engine
        if internal.is_local(topic) or internal.created_on_demand(topic):
            info = self.store.topic(topic)
            if info is None:
                await self.store.create_topic(topic, max(queue + 1, internal.ON_DEMAND_QUEUES), TopicConfig())
            elif info.queue_count <= queue:
                await self.store.add_partitions(topic, queue + 1)
            return (topic, queue) in engine.registry.shards
        view = self.member.view
        await view.wait_until(lambda s: topic in s.topics, 5.0)
        # bounded: a link must never wait on the reconciler for good (the caller drops the link on the timeout and
        # connects again, so a stuck local change cannot keep this replica off a new master)
        async with asyncio.timeout(RESOLVE_TIMEOUT_S):  # (not wait_for: in Python 3.11 it can lose a cancellation)
            await self.member.reconciler.ensure(topic)
        if (topic, queue) in engine.registry.shards:
            return True
        log.warning(
            "replication: %s-%d is not a topic of this group (deleted?); its entry is kept undispatched", topic, queue
        )
        return False

    # --- the in-sync set --------------------------------------------------------------------------------------

    async def _keep_isr(self) -> None:
        lag_s = self.config.lag_time_max_ms / 1000
        while self.is_master:
            await self.clock.sleep(ISR_CHECK_S)
            if not self.member.node.leading:
                continue
            live = set(self.member.view.state.brokers)
            desired = self.tracker.desired_isr(self.clock.monotonic(), lag_s, live)
            if desired != self.tracker.isr:
                try:
                    await self._write_isr(desired)
                except MetaUnavailable as exc:
                    log.warning("replication: in-sync set not changed now: %s", exc)

    async def _write_isr(self, desired: frozenset[int]) -> None:
        node = self.member.node
        keys = node.keys
        key = keys.isr(self.member.group)
        current = await node.meta.get(key)
        guard = Compare(key, "mod", "==", current.mod_revision) if current else Compare(key, "version", "==", 0)
        fence = Compare(
            keys.master(self.member.group), "value", "==", dump(MasterRecord(node.node_id, self.master_epoch))
        )
        record = SyncStateRecord(sorted(desired), self.master_epoch)
        if await node.meta.txn([guard, fence], [Put(key, dump(record))]):
            before = sorted(self.tracker.isr)
            self.tracker.set_isr(desired)
            log.info("replication: in-sync replicas of group %s: %s -> %s", self.member.group, before, sorted(desired))


__all__ = ["Replication", "ReplicationConfig"]
