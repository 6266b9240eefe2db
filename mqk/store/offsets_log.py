"""LogOffsetStore: committed group offsets kept in the log, in the `__consumer_offsets` partitions this broker leads
(cluster mode), so that a replica that becomes master finds them in the log it replicated, as in Kafka.

What it owns:
- the **write path**: a commit of group G is one record batch (Kafka's key and value layout,
  mqk.protocol.kafka.offset_records; one record per partition, so a commit lands whole or not at all) appended to
  G's offsets partition; a delete is the same with tombstones. A commit is applied to the in-memory map and
  answered only after the append succeeded and `wait_replicated` (when set) returned: that hook is where
  replication waits for the in-sync replicas to hold the batch. Records are applied by their log offset, so a
  commit whose wait ends after a later one's cannot undo it;
- the **in-memory map** (group -> (topic, partition) -> offset, per offsets partition), which answers fetches without
  touching the log. `activate()` (when this broker becomes its group's master, and at start) rebuilds it by reading
  every offsets partition placed in this broker's group from its log start to its end; a record that fits no
  layout is skipped with a log line (it cannot be a commit this broker answered). `deactivate()` (when it stops
  being master) drops it and refuses commits from then on (NOT_COORDINATOR): a replica never appends;
- **which partition** holds a group (`Placement`, from the cluster's metadata): Kafka's coordinator partition
  (the hash of the group id) when it is placed in this broker's group, which is always so for Kafka clients, since
  only the coordinator accepts their commits. A RocketMQ consumer commits to the broker holding the queue, which
  may not hold that partition: its commit goes to one of the offsets partitions placed here (chosen by the same
  hash), so it is replicated with this group's log all the same; a Kafka coordinator elsewhere does not see it, as
  it would not see it in RocketMQ either (each broker keeps the offsets of its own queues). Only when this broker's
  group holds no offsets partition at all (a group added after the offsets topic was placed) do such commits stay
  in the default engine's side store, with a warning: they do not survive a failover.

It must not: import the broker or the servers (placement comes in through `Placement`), or append while inactive.
Not thread-safe: one event loop owns it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from mqk.errors import Corrupt, NotCoordinatorError, StorageError, UnknownShard
from mqk.protocol.kafka.offset_records import OFFSETS_TOPIC, OffsetKey, OffsetValue, offset_records, offsets_batch
from mqk.store.adapter import AppendResult, GroupOffset, store_time_ms
from mqk.store.manager import StoreManager

log = logging.getLogger("mqk.offsets")

Partition = tuple[str, int]
#: a committed offset (None once deleted) and the log offset of the record that set it
_Entry = tuple[GroupOffset | None, int]
#: bytes read per step while loading a partition
_READ_BYTES = 4 << 20


class Placement(Protocol):
    """Where offsets partitions are (mqk.broker.cluster.ClusterMember answers for the cluster)."""

    def partition_of(self, group: str) -> int:
        """Kafka's offsets partition of `group` (the one whose leader coordinates it)."""
        ...

    def partitions_here(self) -> list[int]:
        """The offsets partitions placed in this broker's group, in order (empty before the topic exists)."""
        ...

    async def ensure_topic(self) -> None:
        """Have the offsets topic created if the cluster has none yet (and wait until it is here)."""
        ...


class LogOffsetStore:
    def __init__(self, store: StoreManager, placement: Placement, *, topic: str = OFFSETS_TOPIC) -> None:
        self.store = store
        self.placement = placement
        self.topic = topic
        #: awaited with (topic, partition, append result) after each append of commits or tombstones, before they
        #: are applied and answered; replication waits there until the in-sync replicas hold the batch (an error
        #: raised there fails the commit, as a failed append does)
        self.wait_replicated: Callable[[str, int, AppendResult], Awaitable[None]] | None = None
        self._active = False
        #: offsets partition -> group -> (topic, partition) -> entry, for every partition loaded
        self._parts: dict[int, dict[str, dict[Partition, _Entry]]] = {}
        #: group -> the loaded partitions holding records of it (one, unless the partition count changed)
        self._where: dict[str, set[int]] = {}
        self._loading: dict[int, asyncio.Future[None]] = {}
        self._warned_unplaced = False
        #: records skipped at load because they fit no layout (for stats and tests)
        self.skipped = 0

    @property
    def active(self) -> bool:
        return self._active

    # --- leadership -----------------------------------------------------------------------------------------

    async def activate(self) -> None:
        """This broker became its group's master (or started as it): rebuild the map from the log of every
        offsets partition placed here, then take commits."""
        self._drop()
        for partition in self.placement.partitions_here():
            if not self._is_local(partition):  # not made here yet: nothing to load; `loading` until it is
                continue
            try:
                await self._ensure_loaded(partition)
            except StorageError as exc:  # its groups answer COORDINATOR_LOAD_IN_PROGRESS; loaded again on demand
                log.error("offsets: partition %s-%d not loaded: %s", self.topic, partition, exc)
        self._active = True

    def deactivate(self) -> None:
        """This broker is no longer master: forget every offset (its replicated log keeps them) and refuse commits."""
        self._active = False
        self._drop()

    def _drop(self) -> None:
        self._parts.clear()
        self._where.clear()

    # --- where a group's offsets live ----------------------------------------------------------------------

    def _home(self, group: str) -> int | None:
        """The offsets partition group `group`'s commits go to here, None if this group holds none."""
        here = self.placement.partitions_here()
        if not here:
            return None
        partition = self.placement.partition_of(group)
        return partition if partition in here else here[partition % len(here)]

    def loading(self, group: str) -> bool:
        """Whether `group`'s offsets cannot be answered yet (Kafka's COORDINATOR_LOAD_IN_PROGRESS): this broker
        is not (yet) active, or the group's partition holds records not loaded (a failed load, retried now). A
        partition placed here that is still empty (a new offsets topic) counts as loaded."""
        if not self._active:
            return True
        partition = self._home(group)
        if partition is None or partition in self._parts:
            return False
        if not self._is_local(partition):  # placed here, not made here yet (the reconciler is a moment behind)
            return True
        if self.store.end_offset(self.topic, partition) == 0:
            self._parts[partition] = {}
            return False
        if partition not in self._loading:
            asyncio.get_running_loop().create_task(self._load_quietly(partition))
        return True

    def _is_local(self, partition: int) -> bool:
        info = self.store.topic(self.topic)
        return info is not None and partition < info.queue_count

    async def _load_quietly(self, partition: int) -> None:
        try:
            await self._ensure_loaded(partition)
        except StorageError as exc:
            log.error("offsets: partition %s-%d not loaded: %s", self.topic, partition, exc)

    async def _ensure_loaded(self, partition: int) -> None:
        if partition in self._parts:
            return
        loading = self._loading.get(partition)
        if loading is not None:
            await asyncio.shield(loading)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._loading[partition] = future
        try:
            groups = await self._read(partition)
        except BaseException as exc:
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()  # (retrieved: there may be no other waiter)
            else:
                future.cancel()
            raise
        finally:
            del self._loading[partition]
        self._parts[partition] = groups
        for group in groups:
            self._where.setdefault(group, set()).add(partition)
        if not future.done():
            future.set_result(None)

    async def _read(self, partition: int) -> dict[str, dict[Partition, _Entry]]:
        """Every offset record of one partition, last one per key winning; deleted keys left out."""
        groups: dict[str, dict[Partition, _Entry]] = {}
        if self.store.topic(self.topic) is None:
            return groups
        try:
            offset, end = self.store.offset_bounds(self.topic, partition)
        except UnknownShard:
            return groups
        records = skipped = 0
        while offset < end:
            result = await self.store.read(self.topic, partition, offset, _READ_BYTES)
            if not result.batches:
                break
            for batch in result.batches:
                try:
                    found = list(offset_records(batch.data))
                except Corrupt as exc:
                    skipped += batch.record_count
                    log.warning(
                        "offsets: batch at %s-%d offset %d skipped: %s", self.topic, partition, batch.base_offset, exc
                    )
                    continue
                for record in found:
                    if isinstance(record, Corrupt):
                        skipped += 1
                        log.warning("offsets: %s-%d: %s skipped", self.topic, partition, record)
                        continue
                    records += 1
                    key, value = record.key, record.value
                    entries = groups.setdefault(key.group, {})
                    if value is None:
                        entries.pop((key.topic, key.partition), None)
                    else:
                        entries[(key.topic, key.partition)] = (_group_offset(value), record.offset)
            offset = result.next_offset
        self.skipped += skipped
        for group in [g for g, entries in groups.items() if not entries]:
            del groups[group]
        log.info(
            "offsets: %s-%d loaded: %d group(s) from %d record(s)%s",
            self.topic,
            partition,
            len(groups),
            records,
            f", {skipped} malformed skipped" if skipped else "",
        )
        return groups

    # --- the StorageAdapter group-offset methods -------------------------------------------------------------

    async def commit_offsets(self, group: str, offsets: dict[Partition, GroupOffset]) -> None:
        if not offsets:
            return
        partition = await self._writable_home(group)
        if partition is None:
            await self.store.default_engine.commit_offsets(group, offsets)
            return
        entries: list[tuple[OffsetKey, OffsetValue | None]] = [
            (
                OffsetKey(group, topic, queue),
                OffsetValue(value.offset, value.leader_epoch, value.metadata or "", value.commit_timestamp),
            )
            for (topic, queue), value in offsets.items()
        ]
        stamp = max(value.commit_timestamp for value in offsets.values())
        await self._append(partition, entries, stamp if stamp >= 0 else store_time_ms())

    def fetch_offsets(self, group: str) -> dict[Partition, GroupOffset]:
        where = self._where.get(group)
        if not where:
            if self._active and self._home(group) is None:
                return self.store.default_engine.fetch_offsets(group)
            return {}
        if len(where) == 1:
            (partition,) = where
            entries = self._parts.get(partition, {}).get(group, {})
            return {tp: value for tp, (value, _offset) in entries.items() if value is not None}
        # records in several partitions (the partition count changed): the group's home partition wins
        home = self._home(group)
        out: dict[Partition, GroupOffset] = {}
        for partition in sorted(where, key=lambda p: (p == home, p)):
            for tp, (value, _offset) in self._parts.get(partition, {}).get(group, {}).items():
                if value is not None:
                    out[tp] = value
        return out

    async def delete_offsets(self, group: str, partitions: Iterable[Partition] | None = None) -> None:
        if not self._active:
            raise NotCoordinatorError("this broker is not its group's master")
        wanted = None if partitions is None else set(partitions)
        for partition in sorted(self._where.get(group, ())):
            live = [
                tp
                for tp, (value, _offset) in self._parts.get(partition, {}).get(group, {}).items()
                if value is not None and (wanted is None or tp in wanted)
            ]
            if live:
                await self._append(partition, [(OffsetKey(group, *tp), None) for tp in live], store_time_ms())
        if self._home(group) is None:
            await self.store.default_engine.delete_offsets(group, wanted)

    def list_offset_groups(self) -> list[str]:
        groups = {
            group
            for partition in self._parts.values()
            for group, entries in partition.items()
            if any(value is not None for value, _offset in entries.values())
        }
        if self._active and not self.placement.partitions_here():
            groups.update(self.store.default_engine.list_offset_groups())
        return sorted(groups)

    # --- writing --------------------------------------------------------------------------------------------

    async def _writable_home(self, group: str) -> int | None:
        """The partition `group`'s commit goes to, loaded; None: the default engine's side store. Raises
        NotCoordinatorError while this broker is not master."""
        if not self._active:
            raise NotCoordinatorError("this broker is not its group's master")
        partition = self._home(group)
        if partition is None:
            await self.placement.ensure_topic()
            if not self._active:
                raise NotCoordinatorError("this broker is not its group's master")
            partition = self._home(group)
        if partition is None:
            if not self._warned_unplaced:
                self._warned_unplaced = True
                log.warning(
                    "offsets: no partition of %s is placed in this broker's group; commits of groups "
                    "coordinated elsewhere stay in this broker's side store and do not survive a failover",
                    self.topic,
                )
            return None
        if not self._is_local(partition):
            await self.placement.ensure_topic()
        await self._ensure_loaded(partition)
        return partition

    async def _append(self, partition: int, entries: list[tuple[OffsetKey, OffsetValue | None]], stamp: int) -> None:
        batch = offsets_batch(entries, stamp)
        result = await self.store.append(self.topic, partition, [batch], delay_headers=False)
        if self.wait_replicated is not None:
            await self.wait_replicated(self.topic, partition, result)
        groups = self._parts.get(partition)
        if groups is None:  # dropped meanwhile (no longer master): the log has it, the next master loads it
            return
        for i, (key, value) in enumerate(entries):
            offset = result.base_offset + i
            group_entries = groups.setdefault(key.group, {})
            tp = (key.topic, key.partition)
            current = group_entries.get(tp)
            if current is None or current[1] < offset:
                group_entries[tp] = (None if value is None else _group_offset(value), offset)
            self._where.setdefault(key.group, set()).add(partition)


def _group_offset(value: OffsetValue) -> GroupOffset:
    return GroupOffset(value.offset, value.metadata, value.commit_timestamp, value.leader_epoch)


__all__ = ["LogOffsetStore", "Placement"]
