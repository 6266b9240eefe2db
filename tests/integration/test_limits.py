"""Broker limits over real sockets: message.max.bytes on Produce (MESSAGE_TOO_LARGE; a topic's max.message.bytes
overrides it), native_max_message_size on RocketMQ sends (MESSAGE_ILLEGAL), max_connections /
max_connections_per_ip (the connection past the limit is closed at once, the others keep working; Kafka's and
RocketMQ's connections count together) and connections_max_idle_ms (a silent connection is closed, one waiting on a
long poll is not, on either protocol). Waits are bounded;
nothing is timed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from helpers import produce_body, wait_until_async

from mqk import errors as E
from mqk.broker import Broker
from mqk.client.remoting import RemotingConnection
from mqk.config import BrokerConfig, StoreConfig
from mqk.protocol.kafka.api import ApiKey
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.server.kafka.rawclient import RawKafkaClient, make_batch
from mqk.server.kafka.server import KafkaServer
from mqk.server.native.server import NativeServer
from mqk.store.manager import StoreManager

LIMIT = 2000


class Broker2:
    def __init__(self, kafka: KafkaServer, native: NativeServer) -> None:
        self.kafka, self.native = kafka, native

    async def client(self) -> RawKafkaClient:
        return await RawKafkaClient.connect(self.kafka.host, self.kafka.port)


async def _start(**config: object) -> AsyncIterator[Broker2]:
    cfg = BrokerConfig(
        kafka_listen=("127.0.0.1", 0),
        native_listen=("127.0.0.1", 0),
        store=StoreConfig(storage="memory"),
        **config,  # type: ignore[arg-type]  # BrokerConfig fields
    )
    store = StoreManager(cfg.store)
    await store.start()
    broker = Broker(cfg, store)
    kafka = KafkaServer(cfg, store, broker=broker)
    native = NativeServer(cfg, store, broker=broker, limits=kafka.limits)  # (one set of limits, as the runtime's)
    await kafka.start()
    await native.start()
    try:
        yield Broker2(kafka, native)
    finally:
        await native.stop()
        await kafka.stop()
        await store.close()


@pytest.fixture
async def small() -> AsyncIterator[Broker2]:
    async for broker in _start(
        message_max_bytes=LIMIT, native_max_message_size=LIMIT, max_connections=3, max_connections_per_ip=2
    ):
        yield broker


@pytest.fixture
async def impatient() -> AsyncIterator[Broker2]:
    async for broker in _start(connections_max_idle_ms=200):
        yield broker


async def test_message_max_bytes_on_produce(small: Broker2) -> None:
    client = await small.client()
    try:
        big = make_batch([b"x" * (LIMIT + 100)])
        resp = await client.call(ApiKey.PRODUCE, 9, produce_body("sized", big))
        assert resp["responses"][0]["partition_responses"][0]["error_code"] == E.MessageTooLargeError.code
        assert small.kafka.store.end_offset("sized", 0) == 0
        ok = await client.call(ApiKey.PRODUCE, 9, produce_body("sized", make_batch([b"x" * (LIMIT // 2)])))
        assert ok["responses"][0]["partition_responses"][0]["error_code"] == 0
        # a topic's own max.message.bytes overrides the broker's, as in Kafka
        create = {
            "timeout_ms": 1000,
            "validate_only": False,
            "topics": [
                {
                    "name": "roomy",
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [{"name": "max.message.bytes", "value": str(LIMIT * 4)}],
                }
            ],
        }
        assert (await client.call(ApiKey.CREATE_TOPICS, 5, create))["topics"][0]["error_code"] == 0
        resp = await client.call(ApiKey.PRODUCE, 9, produce_body("roomy", big))
        assert resp["responses"][0]["partition_responses"][0]["error_code"] == 0
        # DescribeConfigs shows what applies: the broker's value where the topic sets none
        described = await client.call(
            ApiKey.DESCRIBE_CONFIGS,
            4,
            {
                "include_synonyms": False,
                "include_documentation": False,
                "resources": [
                    {"resource_type": 2, "resource_name": name, "configuration_keys": ["max.message.bytes"]}
                    for name in ("sized", "roomy")
                ],
            },
        )
        values = [r["configs"][0]["value"] for r in described["results"]]
        assert values == [str(LIMIT), str(LIMIT * 4)]
    finally:
        await client.close()


async def test_native_max_message_size_on_rocketmq_sends(small: Broker2) -> None:
    conn = RemotingConnection(small.native.address)
    await conn.connect()
    try:

        async def send(body: bytes) -> RemotingCommand:
            ext = {"producerGroup": "p", "topic": "rmq", "defaultTopic": "TBW102", "defaultTopicQueueNums": "1"}
            ext |= {"queueId": "0", "sysFlag": "0", "bornTimestamp": "0", "flag": "0", "properties": ""}
            return await conn.invoke(RemotingCommand(code=RequestCode.SEND_MESSAGE, ext_fields=ext, body=body), 10)

        refused = await send(b"y" * (LIMIT + 1))
        assert refused.code == ResponseCode.MESSAGE_ILLEGAL and str(LIMIT) in (refused.remark or "")
        assert (await send(b"y" * LIMIT)).code == ResponseCode.SUCCESS
    finally:
        await conn.close()


async def _works(client: RawKafkaClient) -> bool:
    answer = await client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
    return answer["error_code"] == 0


async def test_connections_past_the_limits_are_closed_and_the_others_work(small: Broker2) -> None:
    first, second = await small.client(), await small.client()
    try:
        assert await _works(first) and await _works(second)
        third = await small.client()  # a third from 127.0.0.1: over max_connections_per_ip = 2
        assert await third.closed_by_peer(10)
        await third.close()
        assert await _works(first) and await _works(second)
        assert small.kafka.limits.refused == 1
        # a slot freed is a slot for the next one
        await second.close()
        replacement = await small.client()
        try:
            assert await _works(replacement)
        finally:
            await replacement.close()
    finally:
        await first.close()


async def test_max_connections_counts_every_address(small: Broker2) -> None:
    limits = small.kafka.limits
    limits.max_per_ip = 100  # (only loopback here: the total is what is tested)
    clients = [await small.client() for _ in range(3)]
    try:
        for c in clients:
            assert await _works(c)
        extra = await small.client()
        assert await extra.closed_by_peer(10)
        await extra.close()
        assert await _works(clients[0])
    finally:
        for c in clients:
            await c.close()


async def test_idle_connections_are_closed_and_a_long_poll_is_not_idleness(impatient: Broker2) -> None:
    silent, polling = await impatient.client(), await impatient.client()
    try:
        fetch = {
            "replica_id": -1,
            "max_wait_ms": 1500,  # longer than connections_max_idle_ms: the poll keeps its connection
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "forgotten_topics_data": [],
            "rack_id": "",
            "topics": [
                {
                    "topic": "quiet",
                    "partitions": [
                        {
                            "partition": 0,
                            "current_leader_epoch": -1,
                            "fetch_offset": 0,
                            "log_start_offset": -1,
                            "partition_max_bytes": 1 << 20,
                        }
                    ],
                }
            ],
        }
        await impatient.kafka.store.create_topic("quiet", 1)
        polling.send(ApiKey.FETCH, 12, fetch)
        assert await silent.closed_by_peer(10)
        _cid, answer = await polling.receive(10)
        assert answer["responses"][0]["partitions"][0]["error_code"] == 0
        assert impatient.kafka.limits.idle_closed >= 1
    finally:
        await silent.close()
        await polling.close()


async def _remoting(broker: Broker2) -> RemotingConnection:
    conn = RemotingConnection(broker.native.address)
    await conn.connect()
    return conn


async def _answers(conn: RemotingConnection) -> bool:
    answer = await conn.invoke(RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO), 10)
    return answer.code == ResponseCode.SUCCESS


async def test_rocketmq_connections_count_against_the_same_limits_as_kafkas(small: Broker2) -> None:
    kafka = await small.client()
    rocketmq = await _remoting(small)
    try:
        assert await _works(kafka) and await _answers(rocketmq)
        late = await _remoting(small)  # a third from 127.0.0.1, Kafka's and RocketMQ's together
        await wait_until_async(lambda: late.closed, 10, "the connection past max_connections_per_ip to be closed")
        await late.close()
        assert await _works(kafka) and await _answers(rocketmq)
        assert small.kafka.limits.refused == 1
        await kafka.close()  # a slot freed is a slot for a RocketMQ client too
        replacement = await _remoting(small)
        try:
            assert await _answers(replacement)
        finally:
            await replacement.close()
    finally:
        await kafka.close()
        await rocketmq.close()


async def test_an_idle_rocketmq_connection_is_closed_and_a_long_pull_is_not_idleness(impatient: Broker2) -> None:
    await impatient.native.ctx.ensure_topic("quiet", 1)
    silent, pulling = await _remoting(impatient), await _remoting(impatient)
    try:
        ext = {"consumerGroup": "g", "topic": "quiet", "queueId": "0", "queueOffset": "0", "maxMsgNums": "32"}
        ext |= {"sysFlag": "2", "commitOffset": "0", "suspendTimeoutMillis": "1500", "subVersion": "0"}
        # a long-polling pull longer than connections_max_idle_ms keeps its connection
        pull = asyncio.create_task(pulling.invoke(RemotingCommand(code=RequestCode.PULL_MESSAGE, ext_fields=ext), 10))
        await wait_until_async(lambda: silent.closed, 10, "the silent connection to be closed")
        answer = await pull
        assert answer.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.SUCCESS) and not pulling.closed
        assert impatient.kafka.limits.idle_closed >= 1
    finally:
        await silent.close()
        await pulling.close()
