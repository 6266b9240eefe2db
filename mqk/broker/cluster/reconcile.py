"""The local store follows the cluster's topic metadata: what is placed in this broker's group exists here.

After every change of the view, and at start once the view is synced, for each topic with a partition placed in
this broker's group the local store has the topic (under the cluster's topic id), with the cluster's partition
count (a partition's queue id in the group's store is its partition number, placement.py) and settings. A local
topic the cluster deleted (its id is one this broker once took from the cluster, and the cluster has it no more) is
deleted here. Topics that are local by nature (the timer's, RocketMQ's transaction and per-group topics:
mqk.broker.internal) and topics this broker never took from the cluster are left alone: a data directory that
joins a cluster loses nothing it held.

It also fences, in the store, the queues that take no appends here (partitions placed in another group, and those
sealed while they move away: `_fence`), and deletes the records of a partition that moved to another group.

The ids taken from the cluster are remembered in `<data-dir>/cluster/topic-ids.json` (written before the local
topic is made), so a broker restarted after a deletion still knows the topic was the cluster's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from mqk.broker import internal
from mqk.broker import topic_config as settings
from mqk.broker.cluster.model import MOVE_SEALED, TopicRecord
from mqk.broker.cluster.view import ClusterView
from mqk.broker.cluster.woken import WokenTask
from mqk.errors import ShardExists, UnknownShard
from mqk.store.fsutil import atomic_write_json, read_json
from mqk.store.manager import StoreManager

log = logging.getLogger("mqk.cluster.reconcile")


class TopicReconciler:
    def __init__(self, view: ClusterView, store: StoreManager, group: str, data_dir: Path | None) -> None:
        self.view = view
        self.store = store
        self.group = group
        self._ids_path = data_dir / "cluster" / "topic-ids.json" if data_dir is not None else None
        self._known: set[str] = set()
        #: (the view's state, its topic changes) the store's fence was last computed from (the state itself, held:
        #: a new state after a re-listing is always another object)
        self._fenced_at: tuple[object, int] = (None, -1)
        self._lock = asyncio.Lock()
        self._task = WokenTask("mqk-cluster-reconcile", self._sync_or_retry)

    async def start(self) -> None:
        if self._ids_path is not None:
            doc = await asyncio.to_thread(read_json, self._ids_path)
            self._known = {str(i) for i in (doc or {}).get("topic_ids", [])}
        self.view.add_listener(self._fence)
        self._fence()
        self.view.add_listener(self._task.wake)
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def _sync_or_retry(self) -> float | None:
        try:
            await self.sync()
        except Exception:  # a store error: logged with its traceback, tried again a second later
            log.exception("cluster: bringing the local store in line with the metadata failed")
            return 1.0
        return None

    def placed_here(self, record: TopicRecord) -> bool:
        """Whether the topic has a partition in this group, or one moving into it."""
        return record.involves(self.group)

    def _fence(self) -> None:
        """Fence, in the store, the queues of the cluster's topics that take no appends here: partitions placed
        in another group, and those sealed while they move to one (StoreManager.fence). Run synchronously on
        every change of the view, before anything else hears of it, so that a source group stops growing a
        sealed partition before it can answer "sealed" (mqk.broker.moves); recomputed only when a topic record
        changed (most changes the watch brings are other keys)."""
        state = self.view.state
        if self._fenced_at[0] is state and self._fenced_at[1] == state.topic_changes:
            return
        self._fenced_at = (state, state.topic_changes)
        fenced: dict[str, frozenset[int]] = {}
        for name, record in state.topics.items():
            if not record.involves(self.group):
                continue
            queues = [p for p, (group, _queue) in enumerate(record.partitions) if group != self.group]
            queues += [m.partition for m in record.moves if m.state == MOVE_SEALED]
            if queues:
                fenced[name] = frozenset(queues)
        self.store.fence(fenced)

    async def ensure(self, topic: str) -> bool:
        """Make the local topic now if the view places `topic` here (a request that reached this broker before the
        reconciler did); whether it exists locally afterwards."""
        record = self.view.state.topics.get(topic)
        if record is None or not self.placed_here(record):
            return False
        async with self._lock:
            await self._apply(topic, record)
        return self.store.topic(topic) is not None

    async def sync(self) -> None:
        if not self.view.synced:
            return
        async with self._lock:
            topics = dict(self.view.state.topics)
            for name, record in topics.items():
                if self.placed_here(record):
                    await self._apply(name, record)
                    await self._delete_departed(name, record)
            cluster_ids = {r.topic_id for r in topics.values()}
            for name, info in self.store.topics().items():
                topic_id = bytes(info.topic_id).hex()
                if internal.is_local(name) or internal.created_on_demand(name) or topic_id not in self._known:
                    continue
                wanted = topics.get(name)
                if topic_id not in cluster_ids or wanted is None or not self.placed_here(wanted):
                    log.info("cluster: topic %s (id %s) is gone from this group; deleting it here", name, topic_id)
                    with contextlib.suppress(UnknownShard):
                        await self.store.delete_topic(name)

    async def _apply(self, name: str, record: TopicRecord) -> None:
        info = self.store.topic(name)
        config = settings.config_of(record.configs)
        count = len(record.partitions)
        if info is not None and bytes(info.topic_id) != record.topic_id_bytes:
            if bytes(info.topic_id).hex() not in self._known:
                log.error(
                    "cluster: a local topic %s that the cluster never gave is in the way of the cluster's; "
                    "it is left alone and the cluster's is not served here",
                    name,
                )
                return
            await self.store.delete_topic(name)  # re-created under the same name: a new topic
            info = None
        if info is None:
            await self._remember(record.topic_id)
            try:
                await self.store.create_topic(name, count, config, topic_id=record.topic_id_bytes)
            except ShardExists:
                return
            log.info("cluster: topic %s (%d partitions) created here", name, count)
            return
        if info.queue_count < count:
            await self.store.add_partitions(name, count)
        if info.config != config:
            await self.store.alter_topic_config(name, config)

    async def _delete_departed(self, name: str, record: TopicRecord) -> None:
        """Delete the records of partitions that left this group for another (TopicRecord.departures, written by a
        move's switch: mqk.broker.moves): their log start here moves to where they left, once (a broker that was
        down meanwhile does it when it is back). Not while the partition is moving back here."""
        for p, group, left_at in record.departures:
            if group != self.group or record.partitions[p][0] == self.group or record.move_of(p) is not None:
                continue
            with contextlib.suppress(UnknownShard):
                cut = min(left_at, self.store.end_offset(name, p))
                if self.store.log_start_offset(name, p) < cut:
                    await self.store.delete_before(name, p, cut)
                    log.info("cluster: %s-%d left this group at offset %d; its records here are deleted", name, p, cut)

    async def _remember(self, topic_id: str) -> None:
        if topic_id in self._known:
            return
        self._known.add(topic_id)
        if self._ids_path is not None:
            self._ids_path.parent.mkdir(parents=True, exist_ok=True)
            doc = {"version": 1, "topic_ids": sorted(self._known)}
            await asyncio.to_thread(atomic_write_json, self._ids_path, doc)


__all__ = ["TopicReconciler"]
