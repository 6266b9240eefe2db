"""Broker: the protocol-neutral services of one broker process, built once and shared by its front doors.

It holds the store, the topic registry (names, settings, auto-creation, ids), the wake-up hub for long polls, the
clock, the counters /metrics reports (stats.py) and the security services (users, SASL mechanisms, the authorizer
hook: mqk.broker.security), the client quotas (mqk.broker.quotas). The Kafka listener and the RocketMQ broker role
each take the same Broker (the runtime builds it), so a record appended through one wakes the long polls of the
other, and both apply one topic policy.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from mqk.broker.hub import WakeupHub
from mqk.broker.logsizes import LogSizes
from mqk.broker.quotas import FILE as QUOTAS_FILE
from mqk.broker.quotas import ClientQuotas
from mqk.broker.security import Security
from mqk.broker.stats import BrokerStats
from mqk.broker.topics import TopicRegistry
from mqk.clock import SYSTEM_CLOCK, Clock
from mqk.config import BrokerConfig
from mqk.store.manager import StoreManager

# typing only: cluster mode's modules (etcd client, controller, replication) load with --cluster alone (start-up)
if TYPE_CHECKING:
    from mqk.broker.cluster import ClusterMember


class Broker:
    def __init__(self, config: BrokerConfig, store: StoreManager, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.topics = TopicRegistry(store, config)
        self.hub = WakeupHub(clock)
        #: the hot paths' counters for /metrics (None with `metrics` off: the front doors then count nothing)
        self.stats: BrokerStats | None = BrokerStats() if config.metrics else None
        #: per-partition log sizes, kept up to date as logs grow (/metrics, DescribeLogDirs)
        self.log_sizes = LogSizes(store)
        self.security = Security(config, store, clock)
        #: produce and fetch byte-rate quotas per user and client id (mqk.broker.quotas)
        self.quotas = ClientQuotas(
            clock, store.config.data_dir / "security" / QUOTAS_FILE if store.persistent else None
        )
        self.quotas.load()
        #: cluster mode: this broker's membership (None for a single broker on its own)
        self.cluster: ClusterMember | None = None
        self._listening = False

    def attach_cluster(self, cluster: ClusterMember) -> None:
        """Cluster mode: topics and the questions of leadership are the cluster's from now on."""
        self.cluster = cluster
        self.topics.attach_cluster(cluster)
        self.security.attach_cluster(cluster)
        self.quotas.attach_cluster(cluster)

    def open(self) -> None:
        """Called by each front door as it starts (on the event loop): the hub hears the store's appends from
        then on. Idempotent."""
        if not self._listening:
            self.hub.bind(asyncio.get_running_loop())
            self.store.add_listener(self.hub.notify)
            self._listening = True

    def release_waiters(self) -> None:
        """Called by each front door as it stops: every long poll returns now (and finds its connection closing)
        rather than at its timeout. The hub stays the store's listener; empty, it costs an append one truth test."""
        self.hub.wake_all()
