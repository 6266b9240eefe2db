"""NativeServer: the RocketMQ broker role (default 127.0.0.1:10911) over the remoting protocol.

Wires the processors (one per request family: send, pull, POP, offsets, clients, admin, stats, subscription
groups) to request codes; an unknown code gets REQUEST_CODE_NOT_SUPPORTED with a remark naming it. With the
authorizer on, every request first passes RocketMQ's plain-ACL check (mqk.server.native.acl: signature, then the
ACLs); with it off the ACL ext fields (AccessKey, Signature, ...) are accepted and ignored. With `native_tls` the
listener takes TLS only (the `[tls]` certificate). The processors share the broker services (mqk.broker) with the
Kafka listener: the topic registry, the clock, and the wake-up hub that wakes long-polling pulls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from mqk.broker import Broker
from mqk.clock import Clock
from mqk.config import BrokerConfig
from mqk.groups.share import ShareGroups
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.server.limits import ConnectionLimits
from mqk.server.native.acl import NativeAcl
from mqk.server.native.admin import AdminProcessor
from mqk.server.native.clients import ClientManager
from mqk.server.native.context import BrokerContext
from mqk.server.native.offsets import OffsetProcessor
from mqk.server.native.pop import PopConsumption, PopProcessor
from mqk.server.native.pull import PullProcessor
from mqk.server.native.recall import Recalls
from mqk.server.native.remoting import Connection, RemotingServer, remoting_tls
from mqk.server.native.send import SendProcessor
from mqk.server.native.stats import StatsProcessor
from mqk.server.native.subscriptions import SubscriptionGroupProcessor
from mqk.server.native.transaction import TransactionService
from mqk.store.manager import StoreManager

Handler = Callable[[Connection, RemotingCommand], Awaitable[RemotingCommand | None]]

#: what only a group's master serves in cluster mode: the POP record states and subscription group configs behind
#: them are the master's (mqk.groups.share), as a RocketMQ master keeps its own; a replica refuses them
MASTER_ONLY = frozenset(
    {
        RequestCode.POP_MESSAGE,
        RequestCode.ACK_MESSAGE,
        RequestCode.BATCH_ACK_MESSAGE,
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
        RequestCode.NOTIFICATION,
        RequestCode.POLLING_INFO,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG,
        RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
        RequestCode.DELETE_SUBSCRIPTIONGROUP,
    }
)


class NativeServer:
    def __init__(
        self,
        config: BrokerConfig,
        store: StoreManager,
        *,
        broker: Broker | None = None,
        clock: Clock | None = None,
        limits: ConnectionLimits | None = None,
        share: ShareGroups | None = None,
    ) -> None:
        """`broker`: the broker services shared with the other front doors (one is made for this server alone
        when not given, on `clock` or the system clock). `limits`: the connection limits it shares with the Kafka
        listeners (the broker's max_connections count every listener, as Kafka's); its own when not given.
        `share`: the share groups' record states POP consumption works on (the Kafka coordinator's, so a Kafka
        share group of the same name shares the records); its own when not given."""
        self.config = config
        self.store = store
        if broker is None:
            broker = Broker(config, store, *(() if clock is None else (clock,)))
        elif clock is not None and clock is not broker.clock:
            raise ValueError("a NativeServer runs on its broker's clock")
        self.ctx = BrokerContext(config, store, broker=broker)
        self.clients = ClientManager(self.ctx)
        #: RocketMQ's plain ACL (checks nothing unless the authorizer is on)
        self.acl = NativeAcl(config.authorizer, broker.security, lambda topic: self.ctx.queue_count(topic) > 0)
        #: the send path (the RocketMQ 5 gRPC front door appends through it too)
        self.send = send = SendProcessor(self.ctx)
        #: recall handles for delayed sends and RECALL_MESSAGE (the runtime gives it the timer)
        self.recalls = send.recalls = Recalls(self.ctx)
        pull = PullProcessor(self.ctx, self.clients)
        offsets = OffsetProcessor(self.ctx)
        admin = AdminProcessor(self.ctx, self.acl)
        #: what mqadmin and the dashboard read (runtime info, topic and consume stats)
        self.stats = StatsProcessor(self.ctx, self.clients)
        self.transactions = TransactionService(
            self.ctx,
            self.clients,
            check_interval_s=config.native_transaction_check_interval_ms / 1000,
            check_after_ms=config.native_transaction_timeout_ms,
        )
        send.transactions = self.transactions
        if share is None:
            share = ShareGroups(self.ctx.topic_identity, clock=broker.clock)
        #: POP consumption (the RocketMQ 5 gRPC front door consumes through it too)
        self.pop = PopConsumption(self.ctx, send, share)
        subscriptions = SubscriptionGroupProcessor(share, store)
        pull.share = share
        self.handlers: dict[int, Handler] = {
            RequestCode.SEND_MESSAGE: send.send,
            RequestCode.SEND_MESSAGE_V2: send.send,
            RequestCode.SEND_BATCH_MESSAGE: send.send,
            RequestCode.CONSUMER_SEND_MSG_BACK: send.send_back,
            RequestCode.PULL_MESSAGE: pull.pull,
            RequestCode.QUERY_CONSUMER_OFFSET: offsets.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: offsets.update_consumer_offset,
            RequestCode.GET_MAX_OFFSET: offsets.get_max_offset,
            RequestCode.GET_MIN_OFFSET: offsets.get_min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: offsets.search_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: offsets.earliest_store_time,
            RequestCode.HEART_BEAT: self.clients.heart_beat,
            RequestCode.UNREGISTER_CLIENT: self.clients.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.clients.get_consumer_list,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: self.clients.consumer_connections,
            RequestCode.LOCK_BATCH_MQ: self.clients.lock_batch,
            RequestCode.UNLOCK_BATCH_MQ: self.clients.unlock_batch,
            RequestCode.UPDATE_AND_CREATE_TOPIC: admin.create_topic,
            RequestCode.DELETE_TOPIC_IN_BROKER: admin.delete_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: admin.all_topic_config,
            RequestCode.QUERY_MESSAGE: admin.query_message,
            RequestCode.VIEW_MESSAGE_BY_ID: admin.view_message,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.stats.runtime_info,
            RequestCode.GET_TOPIC_STATS_INFO: self.stats.topic_stats,
            RequestCode.GET_CONSUME_STATS: self.stats.consume_stats,
            RequestCode.GET_TOPIC_CONFIG: self.stats.topic_config,
            RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: self.stats.topic_consumed_by,
            RequestCode.QUERY_TOPICS_BY_CONSUMER: self.stats.topics_of_consumer,
            RequestCode.GET_BROKER_CONFIG: self.stats.broker_config,
            RequestCode.CHECK_CLIENT_CONFIG: self._ok,
            RequestCode.END_TRANSACTION: self.transactions.end,
            RequestCode.RECALL_MESSAGE: self.recalls.process,
            **PopProcessor(self.pop).handlers(),
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: subscriptions.update,
            RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG: subscriptions.get,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: subscriptions.get_all,
            RequestCode.DELETE_SUBSCRIPTIONGROUP: subscriptions.delete,
        }
        stats = self.ctx.broker.stats
        self._remoting = RemotingServer(
            config.native_listen,
            self.dispatch,
            config.native_max_frame_bytes,
            "rocketmq-broker",
            None if stats is None else stats.meter("rocketmq", "rocketmq"),
            tls=remoting_tls(config, "rocketmq-broker") if config.native_tls else None,
            limits=limits
            if limits is not None
            else ConnectionLimits(
                config.max_connections, config.max_connections_per_ip, config.connections_max_idle_ms, broker.clock
            ),
        )
        self.address: tuple[str, int] | None = None

    async def start(self) -> tuple[str, int]:
        self.ctx.broker.open()
        self.address = await self._remoting.start()
        self.ctx.host = self.address
        self.clients.start()
        self.stats.start()
        await self.transactions.start()
        self.pop.start()
        return self.address

    @property
    def connections(self) -> set[Connection]:
        """The open client connections."""
        return self._remoting.connections

    async def stop(self) -> None:
        self.ctx.broker.release_waiters()
        await self.pop.stop()
        await self.transactions.stop()
        await self.stats.stop()
        await self.clients.stop()
        await self._remoting.stop()

    async def dispatch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        handler = self.handlers.get(cmd.code)
        if handler is None:
            return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
        if cmd.code in MASTER_ONLY and (cluster := self.ctx.broker.cluster) is not None and not cluster.node.leading:
            why = f"broker {cluster.group} is a replica: POP and subscription group configs are served by its master"
            return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE, why)
        if self.acl.enabled:
            refused = self.acl.check(conn.peer, cmd)
            if refused is not None:
                return refused
        return await handler(conn, cmd)

    async def _ok(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS)
