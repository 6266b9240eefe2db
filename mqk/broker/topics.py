"""The topic registry: every front door looks topics up, creates, grows, reconfigures and deletes them here.

It sits over the store's topic metadata (`StoreManager`, which persists it) and adds the broker's policy:
- names: one rule set (mqk.broker.names), in the alphabet of the front door that asks;
- settings: every creation and alteration is checked against the schema (mqk.broker.topic_config) before
  anything changes; the store then refuses only what it cannot do (a storage.type change, a partition count
  outside its range);
- auto-creation: Kafka's Metadata and Produce and RocketMQ's send create a missing topic when the broker's
  `auto_create_topics` allows it (and, for Metadata, the request does), with `num_partitions` partitions (a
  RocketMQ producer may ask for fewer); RocketMQ's per-group topics are created on demand with one queue
  whatever the setting says (mqk.broker.internal). Concurrent creations of one topic create it once;
- topic ids: Kafka names topics by a 16-byte id in newer API versions; the id -> name map is cached and rebuilt
  only when a lookup misses (a topic created or re-created since);
- cluster mode (`attach_cluster`): topics are the cluster's (mqk.broker.cluster): lookups answer from the cluster's
  metadata view (a topic may have no partition in this broker's store), and every change is made by the
  controller; topics that are local by nature (mqk.broker.internal) stay this broker's own.

Failures are raised as mqk.errors types (InvalidTopicError, InvalidConfigError, UnknownShard, ShardExists, ...);
each front door turns them into its own codes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from mqk.broker import internal
from mqk.broker import topic_config as settings
from mqk.broker.names import KAFKA, ROCKETMQ, NameRule
from mqk.config import BrokerConfig
from mqk.errors import (
    InvalidConfigError,
    InvalidTopicError,
    ShardExists,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    UnknownShard,
)
from mqk.store.adapter import ShardInfo
from mqk.store.manager import StoreManager

# the cluster member is only typed here (its requests are built by its own `change_topic`), so a broker on its own
# never loads cluster mode's modules (etcd client, controller, replication): it keeps start-up cheap
if TYPE_CHECKING:
    from mqk.broker.cluster import ClusterMember, TopicRecord

log = logging.getLogger("mqk.broker.topics")


class TopicRegistry:
    def __init__(self, store: StoreManager, config: BrokerConfig) -> None:
        self._store = store
        self._auto_create = config.auto_create_topics
        self._default_partitions = config.num_partitions
        #: the topic named `name`, or None: the store's own lookup, bound once (Produce and Fetch call it for
        #: every topic of every request)
        self.get = store.topic
        self._names_by_id: dict[bytes, str] = {}
        self._creating: dict[str, asyncio.Lock] = {}
        #: cluster mode: the cluster whose metadata the topics are
        self.cluster: ClusterMember | None = None
        #: cluster mode: each topic record's ShardInfo (rebuilt when the record changes)
        self._infos: dict[str, tuple[TopicRecord, ShardInfo]] = {}

    def attach_cluster(self, cluster: ClusterMember) -> None:
        """From now on topics are the cluster's (see the module docstring)."""
        self.cluster = cluster
        self.get = self._cluster_topic

    def _cluster_topic(self, name: str) -> ShardInfo | None:
        if internal.is_local(name) or internal.created_on_demand(name):
            return self._store.topic(name)
        assert self.cluster is not None
        record = self.cluster.topic(name)
        if record is None:
            return None
        cached = self._infos.get(name)
        if cached is not None and cached[0] is record:
            return cached[1]
        local = self._store.topic(name)
        info = ShardInfo(
            name,
            len(record.partitions),
            settings.config_of(record.configs),
            local.engine if local is not None else self._store.config.storage,
            record.topic_id_bytes,
        )
        self._infos[name] = (record, info)
        return info

    # --- lookup -------------------------------------------------------------------------------------------

    def all(self) -> dict[str, ShardInfo]:
        """Every topic, by name (a copy). In cluster mode the cluster's topics."""
        if self.cluster is None:
            return self._store.topics()
        infos = {name: self._cluster_topic(name) for name in list(self.cluster.topics())}
        return {name: info for name, info in infos.items() if info is not None}

    def queue_count(self, name: str) -> int:
        """The topic's partition (queue) count; 0 when it does not exist."""
        info = self.get(name)
        return 0 if info is None else info.queue_count

    def by_id(self, topic_id: bytes) -> ShardInfo | None:
        """The topic with this 16-byte id, or None."""
        names = self._names_by_id
        name = names.get(topic_id)
        if name is not None:
            info = self.get(name)
            if info is not None and info.topic_id == topic_id:
                return info
        names.clear()
        for info in self.all().values():
            names[bytes(info.topic_id)] = info.topic
        name = names.get(topic_id)
        return self.get(name) if name is not None else None

    @staticmethod
    def is_internal(name: str) -> bool:
        """Written only by the broker's own services (mqk.broker.internal)."""
        return internal.is_internal(name)

    @staticmethod
    def is_local(name: str) -> bool:
        """An internal topic this broker keeps for itself, whatever the cluster holds (mqk.broker.internal)."""
        return internal.is_local(name)

    @staticmethod
    def client_change_refusal(name: str) -> str | None:
        """Why no client may write, delete, grow or reconfigure `name` (an internal topic), or None."""
        return internal.client_change_refusal(name)

    # --- creation -----------------------------------------------------------------------------------------

    async def create(
        self,
        name: str,
        partitions: int,
        changes: Mapping[str, str | None] | None = None,
        *,
        names: NameRule = KAFKA,
        replication_factor: int = -1,
        timeout: float | None = None,  # noqa: ASYNC109 - the request's own bound on the controller's answer
    ) -> ShardInfo:
        """Create `name` with `partitions` partitions and the settings `changes` (None values ignored).
        InvalidTopicError for an illegal name, InvalidConfigError for a refused setting, ShardExists if it
        exists, the store's error if it cannot make it. In a cluster, `timeout` (seconds) bounds the wait for the
        controller (RequestTimedOutError: the topic may still be created, as with Kafka)."""
        reason = names.error(name) or _reserved(name)
        if reason:
            raise InvalidTopicError(reason)
        reason = settings.check_all(changes or {})
        if reason:
            raise InvalidConfigError(reason)
        changes = settings.without_legacy(changes or {})
        if self.cluster is not None and not internal.is_local(name):
            values = {k: v for k, v in (changes or {}).items() if v is not None}
            try:
                await self.cluster.change_topic(
                    "create",
                    name,
                    timeout,
                    partitions=partitions,
                    configs=values,
                    replication_factor=replication_factor,
                )
            except TopicAlreadyExistsError as exc:
                raise ShardExists(str(exc)) from None
            info = self.get(name)
            if info is None:
                raise UnknownShard(f"topic {name!r} was deleted right after it was created")
            return info
        return await self._store.create_topic(name, partitions, settings.config_of(changes or {}))

    def may_auto_create(self, name: str, client_allows: bool = True) -> bool:
        """Whether a missing topic of this name is created when first used."""
        return internal.created_on_demand(name) or (client_allows and self._auto_create)

    def auto_create_partitions(self, name: str, requested: int = 0) -> int:
        """The partition count auto-creation gives `name`: `num_partitions`, or fewer when the producer asks
        for fewer (RocketMQ's defaultTopicQueueNums); one for a topic created on demand."""
        if internal.created_on_demand(name):
            return internal.ON_DEMAND_QUEUES
        default = self._default_partitions
        return min(requested, default) if requested > 0 else default

    async def auto_create(
        self, name: str, *, names: NameRule = KAFKA, client_allows: bool = True, requested: int = 0
    ) -> ShardInfo:
        """The topic `name`, created under the auto-creation policy if it does not exist. InvalidTopicError for an
        illegal name, UnknownShard when the policy does not create it."""
        info = self.get(name)
        if info is not None:
            return info
        reason = names.error(name) or _reserved(name)
        if reason:
            raise InvalidTopicError(reason)
        if not self.may_auto_create(name, client_allows):
            raise UnknownShard(f"unknown topic {name!r}")
        try:
            info = await self.ensure(name, self.auto_create_partitions(name, requested), names=names)
        except Exception as exc:  # the caller answers with the error; the log keeps the reason
            log.warning("auto-creating topic %s failed: %s", name, exc)
            raise
        return info

    async def ensure(self, name: str, partitions: int, *, names: NameRule = ROCKETMQ) -> ShardInfo:
        """The topic `name`, created with `partitions` partitions (at least one) unless it exists. Concurrent calls
        for one name create it once."""
        info = self.get(name)
        if info is not None:
            return info
        reason = names.error(name)
        if reason:
            raise InvalidTopicError(reason)
        lock = self._creating.setdefault(name, asyncio.Lock())
        async with lock:
            info = self.get(name)
            if (
                info is None
                and self.cluster is not None
                and not (internal.is_local(name) or internal.created_on_demand(name))
            ):
                try:
                    await self.cluster.change_topic("create", name, partitions=max(1, partitions))
                    log.info("auto-created topic %s with %d partition(s) in the cluster", name, max(1, partitions))
                except TopicAlreadyExistsError:
                    pass  # created meanwhile by another broker
                info = self.get(name)
            if info is None:
                try:
                    info = await self._store.create_topic(name, max(1, partitions))
                    log.info("auto-created topic %s with %d partition(s)", name, info.queue_count)
                except ShardExists:
                    info = self._store.topic(name)
            if info is None:
                raise UnknownShard(f"topic {name!r} vanished while being created")
            return info

    # --- changes ------------------------------------------------------------------------------------------

    def _clustered(self, name: str) -> ClusterMember | None:
        """The cluster when `name` is one of its topics' names (not a local one)."""
        if self.cluster is None or internal.is_local(name) or internal.created_on_demand(name):
            return None
        return self.cluster

    async def delete(self, name: str, timeout: float | None = None) -> None:  # noqa: ASYNC109 - see `create`
        """UnknownShard if there is no such topic; TopicAuthorizationFailedError for an internal one; `timeout` as
        `create`'s."""
        _refuse_internal(name)
        cluster = self._clustered(name)
        if cluster is not None:
            if cluster.topic(name) is None:
                raise UnknownShard(f"unknown topic {name!r}")
            await cluster.change_topic("delete", name, timeout)
        else:
            await self._store.delete_topic(name)
        self._creating.pop(name, None)

    async def add_partitions(self, name: str, total: int, timeout: float | None = None) -> None:  # noqa: ASYNC109 - see `create`
        """Grow `name` to `total` partitions (InvalidPartitionsError unless more than it has); `timeout` as
        `create`'s."""
        _refuse_internal(name)
        cluster = self._clustered(name)
        if cluster is not None:
            await cluster.change_topic("partitions", name, timeout, partitions=total)
            return
        await self._store.add_partitions(name, total)

    async def alter_config(self, name: str, changes: Mapping[str, str | None]) -> None:
        """Replace the topic's settings with `changes` (None values ignored), after checking them."""
        _refuse_internal(name)
        reason = settings.check_all(changes)
        if reason:
            raise InvalidConfigError(reason)
        changes = settings.without_legacy(changes)
        cluster = self._clustered(name)
        if cluster is not None:
            revision = cluster.view.state.topic_revisions.get(name, 0)
            values = {k: v for k, v in changes.items() if v is not None}
            await cluster.change_topic("configs", name, configs=values, base_revision=revision)
            return
        await self._store.alter_topic_config(name, settings.config_of(changes))


def _reserved(name: str) -> str | None:
    """Why a client may not create a topic of this name: an internal topic's (the broker makes those itself)."""
    if internal.is_internal(name):
        return f"topic name {name!r} is reserved for the broker's internal use"
    return None


def _refuse_internal(name: str) -> None:
    """Deleting, growing and reconfiguring are client requests: never granted on an internal topic."""
    reason = internal.client_change_refusal(name)
    if reason:
        raise TopicAuthorizationFailedError(reason)
