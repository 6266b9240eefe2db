"""BrokerRuntime: builds the store, the services and the servers from one BrokerConfig; starts and stops them.

Start order is store → services (timer, retention, disk guard, compaction) → Kafka listeners → RocketMQ broker
listener → name server (which advertises the broker listener's bound address). Stop runs in reverse, so no
listener outlives the store it uses. The front doors share one `mqk.broker.Broker` (topic registry, wake-up hub,
clock).

The runtime owns the broker's `Clock` (the system clock unless one is passed in, as tests pass a `FakeClock`) and
hands it to every part that reads time or waits for it: the timer, retention, the disk guard, compaction, and
through the broker the servers, the group coordinator and the producer-id state.

This module imports the whole broker; `mqk.cli` and `mqk.testing` import it only when a broker is started.
"""

from __future__ import annotations

import logging
from typing import Any

from mqk.broker import Broker
from mqk.broker.cluster import ClusterConfig, ClusterMember, ClusterStartError
from mqk.clock import SYSTEM_CLOCK, Clock
from mqk.config import BrokerConfig
from mqk.meta.etcd import parse_endpoints
from mqk.server.kafka.server import KafkaServer
from mqk.server.listeners import advertised_address
from mqk.server.native.namesrv import NameServer
from mqk.server.native.server import NativeServer
from mqk.services.compaction import CompactionService
from mqk.services.diskguard import DiskGuard
from mqk.services.retention import RetentionService
from mqk.store.manager import StoreManager
from mqk.timer import TimerService

log = logging.getLogger("mqk.runtime")

Address = tuple[str, int]


class BrokerRuntime:
    def __init__(self, config: BrokerConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.clock = clock
        self.store: StoreManager | None = None
        self.kafka_address: Address | None = None
        #: named Kafka listener -> its bound address (the ready line's `kafka.NAME=` pairs)
        self.kafka_listeners: dict[str, Address] = {}
        self.native_address: Address | None = None
        self.namesrv_address: Address | None = None
        self._parts: list[Any] = []  # started parts, stopped in reverse
        self.timer: TimerService | None = None
        self.kafka: KafkaServer | None = None  # (its group coordinator: .groups)
        self.native: NativeServer | None = None
        self.retention: RetentionService | None = None
        self.diskguard: DiskGuard | None = None
        self.compaction: CompactionService | None = None
        self.cluster: ClusterMember | None = None

    async def start(self) -> "BrokerRuntime":
        cfg = self.config
        try:
            self.store = StoreManager(cfg.store)
            await self.store.start()
            self.timer = TimerService(cfg, self.store, clock=self.clock)
            await self.timer.start()
            self._parts.append(self.timer)
            self.retention = RetentionService(cfg, self.store, clock=self.clock)
            await self.retention.start()
            self._parts.append(self.retention)
            self.diskguard = DiskGuard(cfg, self.store, self.retention, clock=self.clock)
            await self.diskguard.start()
            self._parts.append(self.diskguard)
            self.compaction = CompactionService(cfg, self.store, clock=self.clock)
            await self.compaction.start()
            self._parts.append(self.compaction)

            broker = Broker(cfg, self.store, self.clock)
            self.kafka = KafkaServer(cfg, self.store, broker=broker)
            self.kafka_address = await self.kafka.start()
            self._parts.append(self.kafka)
            self.kafka_listeners = {lst.name: lst.bound for lst in self.kafka.listeners if lst.name and lst.bound}

            self.native = NativeServer(cfg, self.store, broker=broker)
            self.native_address = await self.native.start()
            self._parts.append(self.native)

            namesrv = NameServer(cfg, self.store, self.native_address, topics=broker.topics)
            self.namesrv_address = await namesrv.start()
            self._parts.append(namesrv)

            if cfg.cluster:
                await self._join(broker)
        except BaseException:
            await self.stop()
            raise
        return self

    async def _join(self, broker: Broker) -> None:
        """Cluster mode: register with the advertised listeners (the bound addresses are known now), follow the
        metadata, and let the topic registry answer from it. ClusterStartError when the cluster cannot be joined."""
        cfg = self.config
        assert cfg.cluster and self.store is not None
        assert self.kafka is not None
        bound = {lst.key: lst.bound for lst in self.kafka.listeners}
        bound.update(native=self.native_address, namesrv=self.namesrv_address)
        config = ClusterConfig(
            parse_endpoints(cfg.cluster),
            cfg.cluster_id,
            cfg.node_id,
            cfg.group_name,
            advertised_listeners(cfg, bound),
            session_timeout_s=max(1, cfg.cluster_session_timeout_ms // 1000),
        )
        self.cluster = ClusterMember(
            config,
            self.store,
            cfg.store.data_dir if self.store.persistent else None,
            offsets_partitions=cfg.offsets_topic_num_partitions,
            clock=self.clock,
        )
        broker.attach_cluster(self.cluster)
        assert self.kafka is not None and self.native is not None
        self.kafka.ctx.cluster = self.cluster
        await self.cluster.start()
        self._parts.append(self.cluster)
        await self.kafka.producers.use_cluster(self.cluster.node)

    def ready_line(self) -> str:
        def fmt(addr: Address | None) -> str:
            return f"{addr[0]}:{addr[1]}" if addr else "-"

        return (
            f"mqk ready kafka={fmt(self.kafka_address)} native={fmt(self.native_address)} "
            f"namesrv={fmt(self.namesrv_address)}"
        ) + "".join(f" kafka.{name}={fmt(addr)}" for name, addr in self.kafka_listeners.items())

    @property
    def bootstrap(self) -> str:
        assert self.kafka_address is not None
        return f"{self.kafka_address[0]}:{self.kafka_address[1]}"

    async def stop(self) -> None:
        while self._parts:
            part = self._parts.pop()
            try:
                await part.stop()
            except Exception:  # noqa: BLE001 - keep stopping the rest; the store must still close
                log.exception("error stopping %s", type(part).__name__)
        if self.store is not None:
            store, self.store = self.store, None
            await store.close()

    async def __aenter__(self) -> "BrokerRuntime":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def advertised_listeners(config: BrokerConfig, bound: dict[str, Address | None]) -> dict[str, str]:
    """Listener key -> "host:port" a cluster broker registers (mqk.server.listeners.advertised_address). A Kafka
    listener bound to every interface needs an address configured (ClusterStartError): its peers' clients cannot
    be told the address they would reach it by."""
    out = {}
    for key, addr in bound.items():
        if addr is None:
            continue
        advertised = advertised_address(config, key, addr)
        if advertised is None:
            if key.startswith("kafka"):
                raise ClusterStartError(
                    f"listener {key} is bound to every interface ({addr[0]}): give it an advertised address "
                    f"(--advertise {key}=HOST:PORT, or advertised_listeners for a named listener)"
                )
            advertised = addr
        out[key] = f"{advertised[0]}:{advertised[1]}"
    return out
