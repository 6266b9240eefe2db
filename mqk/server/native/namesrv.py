"""NameServer: the RocketMQ name-server role (default 127.0.0.1:9876) for the one broker mqk runs.

Routes come straight from the broker's topic registry (a Kafka partition is a RocketMQ queue), so Kafka-created
topics route too. GET_ROUTEINFO_BY_TOPIC answers TOPIC_NOT_EXIST for unknown topics, except the auto-create key topic
(TBW102) while `auto_create_topics` is on: RocketMQ producers fetch its route to send to new topics, which the
broker then creates. JSON bodies use standard JSON (quoted map keys), which fastjson and ali-ons both read.
"""

from __future__ import annotations

import json
from typing import Any

from mqk.broker import TopicRegistry
from mqk.broker.internal import AUTO_CREATE_KEY
from mqk.config import BrokerConfig
from mqk.protocol.native.codes import (
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    RequestCode,
    ResponseCode,
)
from mqk.protocol.native.command import RemotingCommand
from mqk.server.native.remoting import Connection, RemotingServer
from mqk.store.manager import StoreManager


class NameServer:
    def __init__(
        self,
        config: BrokerConfig,
        store: StoreManager,
        broker_addr: tuple[str, int],
        *,
        topics: TopicRegistry | None = None,
    ) -> None:
        """`topics`: the broker's topic registry (a registry over `store` when not given)."""
        self.config = config
        self.store = store
        self.topics = topics if topics is not None else TopicRegistry(store, config)
        self.broker_addr = broker_addr
        self._remoting = RemotingServer(
            config.namesrv_listen, self.dispatch, config.native_max_frame_bytes, "rocketmq-namesrv"
        )
        self.address: tuple[str, int] | None = None

    async def start(self) -> tuple[str, int]:
        self.address = await self._remoting.start()
        return self.address

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

    async def dispatch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        code = cmd.code
        if code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return self.route_info(cmd)
        if code == RequestCode.GET_BROKER_CLUSTER_INFO:
            body = {
                "brokerAddrTable": {self.config.broker_name: self._broker_data()},
                "clusterAddrTable": {self.config.cluster_id: [self.config.broker_name]},
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
