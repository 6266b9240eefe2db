"""Cluster mode: many broker processes, one cluster, its metadata in etcd (mqk.meta).

A broker started with `--cluster etcd://...` is a `ClusterMember`: it registers itself, follows the cluster's
metadata (view.py), runs for its group's mastership and for controller (node.py), applies metadata changes while it
is the controller (controller.py), keeps its local store in line with what is placed in its group (reconcile.py),
and answers the front doors' questions: who leads a partition, which broker coordinates a consumer group, which
brokers exist, and what a metadata change came to.

Layout of the keys and what each holds: model.py. Placement of partitions: placement.py.

State a master needs lives in its log, so a replica that becomes master has it: committed group offsets are
`__consumer_offsets` records (mqk.store.offsets_log, installed here as the store's offset keeper), loaded when this
broker becomes master and dropped when it stops being master. Other parts hook the same moments with `on_leadership`
(the runtime registers the timer, the producer state, the group coordinator and RocketMQ's transactions).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mqk.broker import internal
from mqk.broker.cluster.controller import OFFSETS_TOPIC, Controller
from mqk.broker.cluster.epochs import EpochHistory
from mqk.broker.cluster.model import BrokerRecord, Keys, MasterRecord, RequestRecord, TopicRecord, dump
from mqk.broker.cluster.node import ClusterConfig, ClusterNode, ClusterStartError
from mqk.broker.cluster.reconcile import TopicReconciler
from mqk.broker.cluster.view import ClusterView, KeyTable
from mqk.clock import SYSTEM_CLOCK, Clock
from mqk.errors import UnknownTopicOrPartitionError
from mqk.meta import Compare, Delete, Put
from mqk.store.manager import StoreManager
from mqk.store.offsets_log import LogOffsetStore

log = logging.getLogger("mqk.cluster")


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (Kafka places a group's coordinator with it), as a signed 32-bit int."""
    data = text.encode("utf-16-be")  # (Java hashes UTF-16 code units)
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


class ClusterMember:
    def __init__(
        self,
        config: ClusterConfig,
        store: StoreManager,
        data_dir: Path | None,
        *,
        offsets_partitions: int = 50,
        max_partitions: int = 10_000,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.node = ClusterNode(config, clock=clock)
        self.view: ClusterView = self.node.view
        self.offsets_partitions = offsets_partitions
        self.controller = Controller(self.node, offsets_partitions=offsets_partitions, max_partitions=max_partitions)
        self.reconciler = TopicReconciler(self.view, store, config.group, data_dir)
        self.store = store
        #: this group's leader epochs (OffsetForLeaderEpoch)
        self.epochs = EpochHistory(data_dir / "cluster" / "leader-epochs.json" if data_dir is not None else None)
        self.node.on_master.append(self._begin_epoch)
        #: committed group offsets, in the offsets-topic partitions placed in this group
        self.offsets = LogOffsetStore(store, _OffsetsPlacement(self))
        store.use_offsets(self.offsets)
        self.on_leadership(become=self._activate_offsets, resign=self._deactivate_offsets)
        self._started = False
        #: led_partitions' answers, for the view state, revision and master epoch they were computed at
        self._led: dict[str, frozenset[int]] = {}
        self._led_at: tuple[int, int, int] = (0, -1, -1)

    @property
    def node_id(self) -> int:
        return self.node.node_id

    @property
    def group(self) -> str:
        return self.node.group

    def master_fence(self) -> Compare:
        """The condition a write of this group's master carries: its master key still holds its record (it has not
        been replaced since it was elected)."""
        node = self.node
        return Compare(self.keys.master(self.group), "value", "==", dump(MasterRecord(node.node_id, node.master_epoch)))

    async def start(self) -> None:
        """Join the cluster (ClusterStartError when it cannot)."""
        await asyncio.to_thread(self.epochs.load)
        await self.node.start()
        self.controller.start()
        await self.reconciler.start()
        await self.reconciler.sync()
        self._started = True

    async def stop(self) -> None:
        await self.controller.stop()
        await self.reconciler.stop()
        await self.node.stop()

    async def _begin_epoch(self, epoch: int) -> None:
        """Record where the CommitLog and every partition of this group stand as master epoch `epoch` begins."""
        ends = {}
        for name, info in self.store.topics().items():
            if not (internal.is_local(name) or internal.created_on_demand(name)):
                ends[name] = [self.store.end_offset(name, q) for q in range(info.queue_count)]
        engine = self.store.replicated_engine
        log_start = engine.log_end if engine is not None else -1
        await asyncio.to_thread(self.epochs.begin, epoch, log_start, ends)

    def on_leadership(
        self,
        *,
        become: Callable[[int], Awaitable[None]] | None = None,
        resign: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Await `become(master epoch)` whenever this broker becomes its group's master, before it serves as one
        (register before `start`: the first election happens there), and `resign()` whenever it stops being
        master (its lease expired, another broker took over, or it stops). Callbacks run in the order they were
        registered."""
        if become is not None:
            self.node.on_master.append(become)
        if resign is not None:
            self.node.on_resign.append(resign)

    async def _activate_offsets(self, epoch: int) -> None:
        await self.offsets.activate()

    async def _deactivate_offsets(self) -> None:
        self.offsets.deactivate()

    def leader_epoch(self) -> int:
        """The epoch this broker leads its group with (-1 while it does not). A partition's leader epoch adds its
        `epoch_bases` entry to it."""
        return self.node.master_epoch if self.node.leading else -1

    def epoch_bases(self, topic: str) -> list[int]:
        """Per partition of `topic`, what its leader epoch adds to its group's master epoch (empty: 0 for all; see
        TopicRecord.epoch_bases)."""
        record = self.view.state.topics.get(topic)
        return record.epoch_bases if record is not None else []

    # --- questions the front doors ask ----------------------------------------------------------------------------

    def brokers(self) -> list[BrokerRecord]:
        """Every live broker, by node id."""
        return [b for _n, b in sorted(self.view.state.brokers.items())]

    def controller_id(self) -> int:
        controller = self.view.state.controller
        return controller.node_id if controller is not None else -1

    def topic(self, name: str) -> TopicRecord | None:
        return self.view.state.topics.get(name)

    def topics(self) -> dict[str, TopicRecord]:
        return self.view.state.topics

    def leader(self, topic: str, partition: int) -> tuple[int, int]:
        """(leader node id, leader epoch); (-1, -1) without a live leader."""
        return self.view.leader_of(topic, partition)

    def leads(self, topic: str, partition: int) -> bool:
        """Whether this broker leads the partition now (its group's master, its lease alive)."""
        record = self.view.state.topics.get(topic)
        return (
            record is not None
            and 0 <= partition < len(record.partitions)
            and record.partitions[partition][0] == self.group
            and self.node.leading
        )

    def led_partitions(self, topic: str) -> frozenset[int]:
        """The partitions of `topic` this broker leads now (`leads` for each), computed once per view revision
        and master epoch: the produce path asks it for every topic of every request."""
        state = self.view.state
        at = (id(state), state.revision, self.node.master_epoch)
        if at != self._led_at:
            self._led.clear()
            self._led_at = at
        led = self._led.get(topic)
        if led is None:
            record = state.topics.get(topic)
            led = self._led[topic] = (
                frozenset(i for i, (group, _queue) in enumerate(record.partitions) if group == self.group)
                if record is not None and self.node.leading
                else frozenset()
            )
        return led

    def replicas(self, topic: str, partition: int) -> list[int]:
        """The nodes of the partition's group (its replicas; the leader among them)."""
        record = self.view.state.topics.get(topic)
        if record is None or not 0 <= partition < len(record.partitions):
            return []
        return self.view.members_of(record.partitions[partition][0])

    def isr(self, topic: str, partition: int) -> list[int]:
        """The partition's in-sync replicas: its group's in-sync set as etcd holds it."""
        record = self.view.state.topics.get(topic)
        if record is None or not 0 <= partition < len(record.partitions):
            return []
        return self.view.isr_of(record.partitions[partition][0])

    def coordinator_partition(self, key: str) -> int:
        """The offsets-topic partition of group `key` (Kafka's Utils.abs(key.hashCode()) % partitions)."""
        h = java_string_hash(key)
        return (0 if h == -(1 << 31) else abs(h)) % self.offsets_partitions

    def coordinator(self, key: str) -> int:
        """The node coordinating group `key` (the leader of its offsets-topic partition), -1 if none is live."""
        return self.leader(OFFSETS_TOPIC, self.coordinator_partition(key))[0]

    def coordinates(self, key: str) -> bool:
        return self.coordinator(key) == self.node_id and self.node.leading

    def loading(self, key: str) -> bool:
        """Whether the committed offsets of group `key` are not loaded here yet (COORDINATOR_LOAD_IN_PROGRESS)."""
        return self.offsets.loading(key)

    def offsets_partitions_here(self) -> list[int]:
        """The offsets-topic partitions placed in this broker's group."""
        record = self.view.state.topics.get(OFFSETS_TOPIC)
        if record is None:
            return []
        return [p for p, (group, _queue) in enumerate(record.partitions) if group == self.group]

    # --- metadata changes (through the controller) -----------------------------------------------------------

    async def change_topic(
        self,
        op: str,
        topic: str,
        timeout: float | None = None,  # noqa: ASYNC109 - as `change`'s
        **fields: Any,
    ) -> None:
        """`change` with the request built here (RequestRecord's `op`, `topic` and other fields): the callers in the
        broker layer need not load the cluster's modules for it."""
        await self.change(RequestRecord(op, topic, **fields), timeout)

    async def change(
        self,
        request: RequestRecord,
        timeout: float | None = None,  # noqa: ASYNC109 - the wait for the controller's answer, which the caller may shorten
    ) -> None:
        """Ask the controller for `request` and wait until this broker's view (and, where the topic is placed in
        this group, its store) shows the outcome. Raises what the controller answered, MetaUnavailable or
        RequestTimedOutError."""
        await self.node.ask(request, timeout)
        if request.validate_only:
            return
        if request.op == "delete":
            await self.view.wait_until(lambda s: request.topic not in s.topics, 5.0)
            await self.reconciler.sync()
            return
        await self.view.wait_until(lambda s: request.topic in s.topics, 5.0)
        await self.reconciler.ensure(request.topic)

    async def ensure_offsets_topic(self) -> None:
        """Create the offsets topic if the cluster has none yet (Kafka creates it on the first FindCoordinator, once
        brokers are up, so coordinators spread over them), and have this broker's part of it made here."""
        if OFFSETS_TOPIC in self.view.state.topics:
            if self.store.topic(OFFSETS_TOPIC) is None:  # (the reconciler is a moment behind the view)
                await self.reconciler.ensure(OFFSETS_TOPIC)
            return
        try:
            await self.change(
                RequestRecord("create", OFFSETS_TOPIC, self.offsets_partitions, {"cleanup.policy": "compact"})
            )
        except Exception as exc:  # noqa: BLE001 - created concurrently, or not now: FindCoordinator answers retriably
            if OFFSETS_TOPIC not in self.view.state.topics:
                log.info("cluster: %s not created yet: %s", OFFSETS_TOPIC, exc)

    @property
    def keys(self) -> Keys:
        """The cluster's key names."""
        return self.node.keys

    # --- users (SCRAM credentials: mqk.broker.security.users owns their format) ---------------------------------

    def users(self) -> dict[str, tuple[int, bytes]]:
        """User name -> (its key's mod revision, its stored value), as this broker's view last saw them."""
        return self.view.state.users

    async def write_user(
        self,
        name: str,
        value: bytes | None,
        revision: int,
        timeout: float = 5.0,  # noqa: ASYNC109 - how long to wait for the view to show the write (False after)
    ) -> bool:
        """Store (None: delete) user `name`'s value if its key is still at mod revision `revision` (0: the user
        does not exist). Whether it was written; when it was, this broker's view shows it on return (or after
        `timeout`: the watch is late). MetaUnavailable when etcd cannot be reached."""
        key = self.node.keys.user(name)
        guard = Compare(key, "mod", "==", revision) if revision else Compare(key, "version", "==", 0)
        change: Put | Delete = Put(key, value) if value is not None else Delete(key)
        written, at = await self.node.meta.txn_at([guard], [change])
        if written:
            await self.view.wait_until(lambda s: s.revision >= at, timeout)
        return written

    # --- tables: ACLs, client quotas, RocketMQ access keys (the modules that read them own their formats) ------

    def table(self, prefix: str) -> KeyTable:
        """The keys under `prefix` (one of `keys.tables`: `keys.acls`, `keys.quotas`, `keys.rocketmq_keys`) as this
        broker's view last saw them, by tail; their generation changes whenever they may have."""
        return self.view.state.table(prefix)

    async def write_table(
        self,
        prefix: str,
        puts: dict[str, bytes],
        deletes: list[str],
        timeout: float = 5.0,  # noqa: ASYNC109 - how long to wait for the view to show the write
    ) -> None:
        """Put and delete keys under `prefix` (by tail), a hundred per transaction; on return this broker's view
        shows them (or `timeout` passed: the watch is late). MetaUnavailable when etcd cannot be reached."""
        changes: list[Put | Delete] = [Put(prefix + k, v) for k, v in puts.items()]
        changes += [Delete(prefix + k) for k in deletes]
        at = 0
        for start in range(0, len(changes), 100):  # etcd takes at most 128 operations in one transaction
            _written, revision = await self.node.meta.txn_at([], changes[start : start + 100])
            at = max(at, revision)
        if at:
            await self.view.wait_until(lambda s: s.revision >= at, timeout)

    def require_topic(self, name: str) -> TopicRecord:
        record = self.topic(name)
        if record is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        return record


class _OffsetsPlacement:
    """Where the offsets store finds a group's partition (mqk.store.offsets_log.Placement), from the view."""

    def __init__(self, member: ClusterMember) -> None:
        self.member = member

    def partition_of(self, group: str) -> int:
        return self.member.coordinator_partition(group)

    def partitions_here(self) -> list[int]:
        return self.member.offsets_partitions_here()

    async def ensure_topic(self) -> None:
        await self.member.ensure_offsets_topic()


__all__ = [
    "OFFSETS_TOPIC",
    "ClusterConfig",
    "ClusterMember",
    "ClusterStartError",
    "RequestRecord",
    "TopicRecord",
    "java_string_hash",
]
