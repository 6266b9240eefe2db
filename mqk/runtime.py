"""BrokerRuntime: builds the store, the services and the servers from one BrokerConfig; starts and stops them.

Start order is the admin listener (HTTP: metrics, health; up first, so a long recovery shows as live and not
ready) → store → services (timer, retention, disk guard, compaction) → Kafka listeners → RocketMQ broker listener
→ name server (which advertises the broker listener's bound address) → the RocketMQ 5 gRPC listener when
configured → in cluster mode, the replication listener
and the cluster membership. Stop runs in reverse, so no listener outlives the store it uses. The front doors share
one `mqk.broker.Broker` (topic registry, wake-up hub, clock).

Cluster mode: the timer starts on standby and, like the producer-id state, the group coordinator and RocketMQ's
transactions, follows this broker's mastership of its group (`ClusterMember.on_leadership`): what a master needs is
loaded from its log when it becomes master and dropped when it stops being one.

The runtime owns the broker's `Clock` (the system clock unless one is passed in, as tests pass a `FakeClock`) and
hands it to every part that reads time or waits for it: the timer, retention, the disk guard, compaction, and
through the broker the servers, the group coordinator and the producer-id state.

This module imports the whole broker; `mqk.cli` and `mqk.testing` import it only when a broker is started.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from mqk.broker import Broker
from mqk.clock import SYSTEM_CLOCK, Clock
from mqk.config import BrokerConfig
from mqk.errors import ClusterStartError
from mqk.server.admin.server import AdminServer
from mqk.server.kafka.server import KafkaServer
from mqk.server.listeners import advertised_address
from mqk.server.native.namesrv import NameServer
from mqk.server.native.server import NativeServer
from mqk.services.compaction import CompactionService
from mqk.services.diskguard import DiskGuard
from mqk.services.retention import RetentionService
from mqk.store.manager import StoreManager
from mqk.timer import TimerService

if TYPE_CHECKING:
    from mqk.broker.cluster import ClusterMember
    from mqk.broker.replication import Replication
    from mqk.server.rocketmq5 import GrpcServer

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
        self.admin_address: Address | None = None
        #: True once every part started, False again from the start of a stop (readiness)
        self.started = False
        self._parts: list[Any] = []  # started parts, stopped in reverse
        self.timer: TimerService | None = None
        self.kafka: KafkaServer | None = None  # (its group coordinator: .groups)
        self.native: NativeServer | None = None
        self.namesrv: NameServer | None = None
        self.broker: Broker | None = None
        #: the admin HTTP listener (metrics, health), None when `admin_listen` is off
        self.admin: AdminServer | None = None
        self.retention: RetentionService | None = None
        self.diskguard: DiskGuard | None = None
        self.compaction: CompactionService | None = None
        self.cluster: ClusterMember | None = None
        self.replication: Replication | None = None
        self.replication_address: Address | None = None
        #: the RocketMQ 5 gRPC front door (None unless `grpc_listen` is set)
        self.grpc: GrpcServer | None = None
        self.grpc_address: Address | None = None

    async def start(self) -> BrokerRuntime:
        cfg = self.config
        try:
            if cfg.admin_listen is not None:
                self.admin = AdminServer(cfg.admin_listen, self)
                self.admin_address = await self.admin.start()
                self._parts.append(self.admin)
            self.store = StoreManager(cfg.store)
            if cfg.cluster:
                # a member of a group takes appends only once it is the group's master (replication)
                self.store.set_writable(False)
            await self.store.start()
            # cluster mode: the timer keeps its state in the log and delivers only while this broker is master
            self.timer = TimerService(
                cfg, self.store, clock=self.clock, standby=bool(cfg.cluster), may_deliver=self._leading
            )
            await self.timer.start()
            self._parts.append(self.timer)
            self.retention = RetentionService(
                cfg, self.store, clock=self.clock, pin_source=self.timer.retention_pins if cfg.cluster else None
            )
            await self.retention.start()
            self._parts.append(self.retention)
            self.diskguard = DiskGuard(cfg, self.store, self.retention, clock=self.clock)
            await self.diskguard.start()
            self._parts.append(self.diskguard)
            self.compaction = CompactionService(cfg, self.store, clock=self.clock)
            await self.compaction.start()
            self._parts.append(self.compaction)

            broker = self.broker = Broker(cfg, self.store, self.clock)
            self.kafka = KafkaServer(cfg, self.store, broker=broker)
            self.kafka_address = await self.kafka.start()
            self._parts.append(self.kafka)
            self.compaction.transactions = self.kafka.ctx.transactions
            self.kafka_listeners = {lst.name: lst.bound for lst in self.kafka.listeners if lst.name and lst.bound}

            # (one set of connection limits for every listener, as Kafka's max.connections)
            self.native = NativeServer(
                cfg, self.store, broker=broker, limits=self.kafka.limits, share=self.kafka.groups.share
            )
            self.native.stats.timer = self.timer  # (its backlog is in RocketMQ's runtime info)
            self.native.recalls.timer = self.timer
            # a group with RocketMQ consumers heart-beating is active: its committed offsets do not expire
            self.kafka.groups.active_elsewhere = self.native.clients.has_consumers
            self.native_address = await self.native.start()
            self._parts.append(self.native)

            namesrv = self.namesrv = NameServer(
                cfg,
                self.store,
                self.native_address,
                topics=broker.topics,
                meter=None if broker.stats is None else broker.stats.meter("namesrv", "rocketmq"),
                limits=self.kafka.limits,
            )
            self.namesrv_address = await namesrv.start()
            self._parts.append(namesrv)

            if cfg.grpc_listen is not None:
                # (imported only when on: gRPC and the RocketMQ 5 protocol's modules take a while to load)
                from mqk.server.rocketmq5 import GrpcServer

                self.grpc = GrpcServer(cfg, self.native, self.kafka.groups.share)
                self.grpc_address = await self.grpc.start()
                self._parts.append(self.grpc)

            if cfg.cluster:
                await self._join(broker)
        except BaseException:
            await self.stop()
            raise
        self.started = True
        return self

    async def _join(self, broker: Broker) -> None:
        """Cluster mode: register with the advertised listeners (the bound addresses are known now), follow the
        metadata, and let the topic registry answer from it. ClusterStartError when the cluster cannot be joined."""
        # cluster mode's modules (etcd client, controller, replication) are imported here, so that a broker on its
        # own never loads them: it keeps start-up cheap
        from mqk.broker.cluster import ClusterConfig, ClusterMember
        from mqk.broker.cluster.txn_partitions import TxnPartitions
        from mqk.broker.replication import Replication, ReplicationConfig
        from mqk.meta.etcd import parse_endpoints

        cfg = self.config
        assert cfg.cluster and self.store is not None
        assert self.kafka is not None
        bound = {lst.key: lst.bound for lst in self.kafka.listeners}
        # (the admin listener too: a console hands a group's offset reset to the console of its coordinator)
        bound.update(native=self.native_address, namesrv=self.namesrv_address, admin=self.admin_address)
        if self.grpc_address is not None:  # (RocketMQ 5 clients reach each queue's master through it)
            bound["grpc"] = self.grpc_address
        engine = self.store.replicated_engine
        if engine is not None:
            self.replication = Replication(
                self.store, engine, ReplicationConfig(cfg.replica_lag_time_max_ms), clock=self.clock
            )
            self._parts.append(self.replication)  # (stopped after the cluster member: links close last)
            self.replication_address = await self.replication.listen(*cfg.replication_listen)
            bound["replication"] = self.replication_address
        else:
            log.warning(
                "cluster mode without the file engine: this broker's group is not replicated (only the file "
                "engine's CommitLog is); a group of several brokers needs --storage file"
            )
        config = ClusterConfig(
            parse_endpoints(cfg.cluster),
            cfg.cluster_id,
            cfg.node_id,
            cfg.group_name,
            advertised_listeners(cfg, bound),
            rack=cfg.broker_rack,
            session_timeout_s=max(1, cfg.cluster_session_timeout_ms // 1000),
            unclean_election=cfg.unclean_leader_election_enable,
        )
        self.cluster = ClusterMember(
            config,
            self.store,
            cfg.store.data_dir if self.store.persistent else None,
            offsets_partitions=cfg.offsets_topic_num_partitions,
            clock=self.clock,
        )
        broker.attach_cluster(self.cluster)
        assert self.kafka is not None and self.native is not None and self.timer is not None
        self.kafka.ctx.cluster = self.cluster
        if self.replication is not None:
            replication = self.replication
            replication.bind(self.cluster)
            replication.wake = broker.hub.notify
            self.kafka.ctx.replication = replication
            self.native.ctx.replication = replication

            async def offsets_replicated(_topic: str, _partition: int, _result: object) -> None:
                # Kafka writes commits with acks=all: answered once every in-sync replica holds them
                await replication.wait_replicated(replication.engine.log_end, 1, cfg.offsets_commit_timeout_ms / 1000)

            self.cluster.offsets.wait_replicated = offsets_replicated
        # what a master needs comes from its log when it becomes master, and goes when it stops being master
        # (the offsets store is the cluster member's own)
        groups = self.kafka.groups

        async def load_groups(_epoch: int) -> None:
            groups.load()

        async def unload_groups() -> None:
            groups.unload()

        self.cluster.on_leadership(become=self.timer.activate, resign=self.timer.deactivate)
        self.cluster.on_leadership(become=self.kafka.producers.become_master, resign=self.kafka.producers.resign)
        self.cluster.on_leadership(become=self.native.transactions.become_master)
        self.cluster.on_leadership(become=load_groups, resign=unload_groups)
        share = self.kafka.groups.share

        async def drop_share_states(_epoch: int = -1) -> None:
            share.unload()  # (read from the log on first use: what this broker's predecessor saved)

        self.cluster.on_leadership(become=drop_share_states, resign=drop_share_states)
        # (after the groups: a commit's offsets go to the group coordinator)
        transactions = self.kafka.ctx.transactions
        assert transactions is not None
        transactions.use_cluster(TxnPartitions(self.cluster))
        self.cluster.on_leadership(become=transactions.become_master, resign=transactions.resign)
        await self.cluster.start()
        self._parts.append(self.cluster)
        from mqk.broker.cluster.group_configs import GroupConfigs

        group_configs = GroupConfigs(self.cluster, share)
        group_configs.start()
        share.config_writer = group_configs.write
        from mqk.broker.cluster.share_ops import ShareOps
        from mqk.server.kafka.handlers.share_groups import perform_share_op

        kafka_ctx = self.kafka.ctx
        kafka_ctx.share_ops = ShareOps(self.cluster, lambda op: perform_share_op(kafka_ctx, op))
        kafka_ctx.share_ops.start()
        if self.replication is not None:
            await self.replication.start()
            from mqk.broker.moves import PartitionMoves
            from mqk.groups.share import MovingShareStates

            moves = PartitionMoves(self.cluster, self.store, self.replication)
            moves.under_way = transactions.under_way
            moves.adopt_aborted = transactions.adopt_aborted
            moves.share_states = MovingShareStates(share, self.store)
            moves.start()
            self._parts.append(moves)  # (stopped before the cluster member: its copiers ask the controller)
            kafka_ctx.moves = moves
        await self.kafka.producers.use_cluster(self.cluster.node)

    def _leading(self) -> bool:
        """Cluster mode: whether this broker is its group's master now (a broker on its own always is)."""
        return self.cluster is None or self.cluster.node.leading

    def ready_line(self) -> str:
        def fmt(addr: Address | None) -> str:
            return f"{addr[0]}:{addr[1]}" if addr else "-"

        line = (
            f"mqk ready kafka={fmt(self.kafka_address)} native={fmt(self.native_address)} "
            f"namesrv={fmt(self.namesrv_address)}"
        )
        if self.replication_address is not None:
            line += f" replication={fmt(self.replication_address)}"
        if self.grpc_address is not None:
            line += f" grpc={fmt(self.grpc_address)}"
        if self.admin_address is not None:
            line += f" admin={fmt(self.admin_address)}"
        return line + "".join(f" kafka.{name}={fmt(addr)}" for name, addr in self.kafka_listeners.items())

    @property
    def bootstrap(self) -> str:
        assert self.kafka_address is not None
        return f"{self.kafka_address[0]}:{self.kafka_address[1]}"

    async def stop(self) -> None:
        self.started = False
        while self._parts:
            part = self._parts.pop()
            try:
                await part.stop()
            except Exception:  # keep stopping the rest; the store must still close
                log.exception("error stopping %s", type(part).__name__)
        if self.store is not None:
            store, self.store = self.store, None
            await store.close()

    async def __aenter__(self) -> BrokerRuntime:
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
