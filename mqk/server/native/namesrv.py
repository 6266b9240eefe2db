"""NameServer: the RocketMQ name-server role (default 127.0.0.1:9876).

Routes come straight from the broker's topic registry (a Kafka partition is a RocketMQ queue), so Kafka-created
topics route too. On a broker on its own every topic lives on it. In cluster mode every broker answers for the
whole cluster from its metadata view (mqk.broker.cluster): a topic's route lists each broker group holding some of
its partitions (brokerName = the group, brokerId 0 = its master's RocketMQ listener) with as many queues as it holds
(RocketMQ numbers queues per broker: mqk.server.native.context); a group without a master now is left out, so
clients send to the others.

GET_ROUTEINFO_BY_TOPIC answers TOPIC_NOT_EXIST for unknown topics, except the auto-create key topic (TBW102) while
`auto_create_topics` is on: RocketMQ producers fetch its route to send to new topics, which the broker then creates.
JSON bodies use standard JSON (quoted map keys), which fastjson and ali-ons both read. With `namesrv_tls` the
name server takes TLS only (the `[tls]` certificate).
"""

from __future__ import annotations

import json
from typing import Any

from mqk.broker import TopicRegistry
from mqk.broker.internal import AUTO_CREATE_KEY
from mqk.broker.stats import RequestMeter
from mqk.config import BrokerConfig
from mqk.protocol.native.codes import (
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    RequestCode,
    ResponseCode,
)
from mqk.protocol.native.command import RemotingCommand
from mqk.server.limits import ConnectionLimits
from mqk.server.native.remoting import Connection, RemotingServer, remoting_tls
from mqk.store.manager import StoreManager


class NameServer:
    def __init__(
        self,
        config: BrokerConfig,
        store: StoreManager,
        broker_addr: tuple[str, int],
        *,
        topics: TopicRegistry | None = None,
        meter: RequestMeter | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        """`topics`: the broker's topic registry (a registry over `store` when not given); `meter`: where its
        requests are counted for /metrics (None: not counted); `limits`: the broker's connection limits (None:
        none)."""
        self.config = config
        self.store = store
        self.topics = topics if topics is not None else TopicRegistry(store, config)
        self.broker_addr = broker_addr
        self._remoting = RemotingServer(
            config.namesrv_listen,
            self.dispatch,
            config.native_max_frame_bytes,
            "rocketmq-namesrv",
            meter,
            tls=remoting_tls(config, "rocketmq-namesrv") if config.namesrv_tls else None,
            limits=limits,
        )
        self.address: tuple[str, int] | None = None

    async def start(self) -> tuple[str, int]:
        self.address = await self._remoting.start()
        return self.address

    @property
    def connections(self) -> set[Connection]:
        """The open client connections."""
        return self._remoting.connections

    async def stop(self) -> None:
        await self._remoting.stop()

    @property
    def broker_address(self) -> str:
        return f"{self.broker_addr[0]}:{self.broker_addr[1]}"

    def _broker_data(self) -> dict[str, Any]:
        return {
            "cluster": self.config.cluster_id,
            "brokerName": self.config.broker_name,
            "brokerAddrs": {"0": self.broker_address},
        }

    def _group_data(self, group: str) -> dict[str, Any] | None:
        """Cluster mode: the broker data of `group`, None without a master: its master's RocketMQ listener as
        brokerId 0 and each live replica's as 1, 2, ... (in node order), as a RocketMQ name server lists a master and
        its slaves. Clients send to brokerId 0 only; this master never suggests reading from a slave."""
        cluster = self.topics.cluster
        assert cluster is not None
        view = cluster.view
        master = view.master_of(group)
        record = view.broker(master.node_id) if master is not None else None
        address = record.listeners.get("native") if record is not None else None
        if not address or master is None:
            return None
        addrs = {"0": address}
        for node in view.members_of(group):
            replica = view.broker(node) if node != master.node_id else None
            replica_address = replica.listeners.get("native") if replica is not None else None
            if replica_address:
                addrs[str(len(addrs))] = replica_address
        return {"cluster": self.config.cluster_id, "brokerName": group, "brokerAddrs": addrs}

    def _cluster_groups(self) -> dict[str, dict[str, Any]]:
        cluster = self.topics.cluster
        assert cluster is not None
        datas = {g: self._group_data(g) for g in cluster.view.live_groups()}
        return {g: d for g, d in datas.items() if d is not None}

    async def dispatch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        code = cmd.code
        if code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return self.route_info(cmd)
        if code == RequestCode.GET_BROKER_CLUSTER_INFO:
            table = (
                self._cluster_groups()
                if self.topics.cluster is not None
                else {self.config.broker_name: self._broker_data()}
            )
            body = {
                "brokerAddrTable": table,
                "clusterAddrTable": {self.config.cluster_id: sorted(table)},
            }
            return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())
        if code in (RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, RequestCode.GET_TOPICS_BY_CLUSTER):
            body = {"topicList": sorted(self.topics.all())}
            return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())
        if code in (RequestCode.GET_KV_CONFIG, RequestCode.GET_KV_CONFIG_BY_VALUE):
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, "No config item")
        if code in (
            RequestCode.REGISTER_BROKER,
            RequestCode.UNREGISTER_BROKER,
            RequestCode.DELETE_TOPIC_IN_NAMESRV,
            RequestCode.PUT_KV_CONFIG,
            RequestCode.DELETE_KV_CONFIG,
        ):
            return cmd.response(ResponseCode.SUCCESS)  # one embedded broker: nothing to register or forget
        return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {code} not supported")

    def route_info(self, cmd: RemotingCommand) -> RemotingCommand:
        topic = cmd.get_str("topic", required=True) or ""
        if self.topics.cluster is not None:
            found = self._cluster_route(topic)
            if found is not None:
                return cmd.response(ResponseCode.SUCCESS, body=json.dumps(found).encode())
        info = self.topics.get(topic)
        if info is not None:
            queues, perm = info.queue_count, PERM_READ | PERM_WRITE
        elif topic == AUTO_CREATE_KEY and self.config.auto_create_topics:
            queues, perm = self.config.num_partitions, PERM_READ | PERM_WRITE | PERM_INHERIT
        else:
            return cmd.response(
                ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}"
            )
        body: dict[str, Any] = {
            "orderTopicConf": None,
            "queueDatas": [
                {
                    "brokerName": self.config.broker_name,
                    "readQueueNums": queues,
                    "writeQueueNums": queues,
                    "perm": perm,
                    "topicSysFlag": 0,
                    "topicSynFlag": 0,
                }
            ],  # 4.x spells the field this way, 5.x the other
            "brokerDatas": [self._broker_data()],
            "filterServerTable": {},
        }
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())

    def _cluster_route(self, topic: str) -> dict[str, Any] | None:
        """Cluster mode: the route of a cluster topic (or of the auto-create key: every live group), None for a
        topic the cluster does not have."""
        cluster = self.topics.cluster
        assert cluster is not None
        record = cluster.topic(topic)
        counts: dict[str, int] = {}
        perm = PERM_READ | PERM_WRITE
        if record is not None:
            for group, _queue in record.partitions:
                counts[group] = counts.get(group, 0) + 1
        elif topic == AUTO_CREATE_KEY and self.config.auto_create_topics:
            counts = dict.fromkeys(cluster.view.live_groups(), self.config.num_partitions)
            perm |= PERM_INHERIT
        else:
            return None
        datas = {g: self._group_data(g) for g in sorted(counts)}
        live = [g for g in sorted(counts) if datas[g] is not None]
        return {
            "orderTopicConf": None,
            "queueDatas": [
                {
                    "brokerName": g,
                    "readQueueNums": counts[g],
                    "writeQueueNums": counts[g],
                    "perm": perm,
                    "topicSysFlag": 0,
                    "topicSynFlag": 0,
                }
                for g in live
            ],
            "brokerDatas": [datas[g] for g in live],
            "filterServerTable": {},
        }
