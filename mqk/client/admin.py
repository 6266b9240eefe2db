"""Native admin calls (what `mqadmin` does for a single broker): topics (list, create, delete), cluster info,
query by key and view by message id, and the stats `mqadmin brokerStatus`, `topicStatus` and `consumerProgress`
read (runtime info, topic stats, consume stats; their bodies as RocketMQ's fastjson writes them). Used by the CLI's
`--protocol native` paths and by tests."""

from __future__ import annotations

import json
from typing import Any

from mqk.client.base import ClientBase
from mqk.config import parse_hostport
from mqk.protocol.native import fastjson
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.protocol.native.message import MessageExt, decode_message_id, decode_messages


class Admin(ClientBase):
    def __init__(self, namesrv: str | tuple[str, int], request_timeout: float = 30.0) -> None:
        super().__init__(namesrv, "mqk-admin", request_timeout)

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def cluster(self) -> dict[str, Any]:
        resp = await self.invoke(self.namesrv, RequestCode.GET_BROKER_CLUSTER_INFO)
        return json.loads(resp.body or b"{}")

    async def brokers(self) -> list[tuple[str, int]]:
        table = (await self.cluster()).get("brokerAddrTable", {})
        return [parse_hostport(b["brokerAddrs"]["0"]) for b in table.values() if "0" in b.get("brokerAddrs", {})]

    async def topics(self) -> list[str]:
        resp = await self.invoke(self.namesrv, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        return list(json.loads(resp.body or b"{}").get("topicList", []))

    async def create_topic(self, topic: str, queues: int) -> None:
        for broker in await self.brokers():
            await self.invoke(
                broker,
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                {
                    "topic": topic,
                    "defaultTopic": "TBW102",
                    "readQueueNums": queues,
                    "writeQueueNums": queues,
                    "perm": 6,
                    "topicFilterType": "SINGLE_TAG",
                    "topicSysFlag": 0,
                    "order": False,
                },
            )

    async def delete_topic(self, topic: str) -> None:
        for broker in await self.brokers():
            await self.invoke(broker, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})

    async def query_by_key(
        self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0, end_ms: int = 1 << 62
    ) -> list[MessageExt]:
        """Messages of `topic` whose keys include `key` (RocketMQ KEYS, or a Kafka record key where indexed)."""
        found: list[MessageExt] = []
        for broker in await self.brokers():
            resp = await self.invoke(
                broker,
                RequestCode.QUERY_MESSAGE,
                {"topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin_ms, "endTimestamp": end_ms},
                ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND),
            )
            if resp.code == ResponseCode.SUCCESS and resp.body:
                found += decode_messages(resp.body)
        return found[:max_num]

    async def view_message(self, offset_msg_id: str) -> MessageExt:
        """The message an offset message id (store host + commit-log offset) names."""
        host, port, offset = decode_message_id(offset_msg_id)
        resp = await self.invoke((host, port), RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
        (msg,) = decode_messages(resp.body or b"")
        return msg

    async def broker_runtime_info(self, broker: tuple[str, int] | None = None) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO of `broker` (default: the first master the name server lists)."""
        address = broker or (await self.brokers())[0]
        resp = await self.invoke(address, RequestCode.GET_BROKER_RUNTIME_INFO)
        return dict(json.loads(resp.body or b"{}").get("table", {}))

    async def topic_stats(self, topic: str) -> dict[tuple[str, int], dict[str, Any]]:
        """GET_TOPIC_STATS_INFO from every broker of the topic's route: (broker name, queue id) -> minOffset,
        maxOffset, lastUpdateTimestamp."""
        route = await self.route(topic, refresh=True)
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for address in sorted(set(route.broker_addrs.values())):
            resp = await self.invoke(address, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic})
            for mq, offsets in fastjson.loads(resp.body or b"{}").get("offsetTable", []):
                out[(mq["brokerName"], mq["queueId"])] = offsets
        return out

    async def consume_stats(
        self, group: str, topic: str | None = None
    ) -> tuple[dict[tuple[str, str, int], dict[str, Any]], float]:
        """GET_CONSUME_STATS from every master: ((topic, broker name, queue id) -> brokerOffset, consumerOffset,
        pullOffset, lastTimestamp; the group's consume TPS)."""
        table: dict[tuple[str, str, int], dict[str, Any]] = {}
        tps = 0.0
        ext = {"consumerGroup": group} | ({"topic": topic} if topic else {})
        for address in await self.brokers():
            resp = await self.invoke(address, RequestCode.GET_CONSUME_STATS, ext)
            doc = fastjson.loads(resp.body or b"{}")
            for mq, offsets in doc.get("offsetTable", []):
                table[(mq["topic"], mq["brokerName"], mq["queueId"])] = offsets
            tps += float(doc.get("consumeTps", 0.0))
        return table, tps
