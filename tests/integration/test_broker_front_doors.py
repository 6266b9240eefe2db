"""Both front doors over one mqk.broker.Broker, over real sockets: one topic policy (names in each protocol's
alphabet, settings checked whichever way a topic is made), Metadata's `is_internal` from the broker's list, and
one wake-up hub (a RocketMQ send wakes a Kafka long poll). The broker runs on a FakeClock: a long poll can only
end early by being woken."""

from __future__ import annotations

import asyncio

import pytest
from helpers import wait_until_async

from mqk import errors as E
from mqk.broker import Broker
from mqk.broker.internal import TRANSACTION_HALF_TOPIC
from mqk.client.remoting import RemotingConnection
from mqk.clock import FakeClock
from mqk.config import BrokerConfig, StoreConfig
from mqk.protocol.kafka.api import ApiKey
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.message import properties_to_string
from mqk.server.kafka.rawclient import RawKafkaClient
from mqk.server.kafka.server import KafkaServer
from mqk.server.native.server import NativeServer
from mqk.store.manager import StoreManager


class Doors:
    def __init__(self, store: StoreManager, broker: Broker, kafka: KafkaServer, native: NativeServer) -> None:
        self.store, self.broker, self.kafka, self.native = store, broker, kafka, native

    async def remoting(self, code: int, ext: dict, body: bytes | None = None) -> RemotingCommand:
        conn = RemotingConnection(self.native.address)
        await conn.connect()
        try:
            return await conn.invoke(RemotingCommand(code=code, ext_fields=ext, body=body), timeout=10)
        finally:
            await conn.close()


@pytest.fixture
async def doors():
    config = BrokerConfig(
        kafka_listen=("127.0.0.1", 0), native_listen=("127.0.0.1", 0), store=StoreConfig(storage="memory")
    )
    store = StoreManager(config.store)
    await store.start()
    broker = Broker(config, store, FakeClock())
    kafka = KafkaServer(config, store, broker=broker)
    native = NativeServer(config, store, broker=broker)
    await kafka.start()
    await native.start()
    yield Doors(store, broker, kafka, native)
    await native.stop()
    await kafka.stop()
    await store.close()


@pytest.fixture
async def client(doors: Doors):
    c = await RawKafkaClient.connect(doors.kafka.host, doors.kafka.port)
    yield c
    await c.close()


def create_body(name: str, configs: dict[str, str] | None = None) -> dict:
    return {
        "timeout_ms": 1000,
        "validate_only": False,
        "topics": [
            {
                "name": name,
                "num_partitions": 1,
                "replication_factor": 1,
                "assignments": [],
                "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()],
            }
        ],
    }


async def test_the_front_doors_share_the_broker(doors: Doors) -> None:
    assert doors.kafka.ctx.topics is doors.native.ctx.topics is doors.broker.topics
    assert doors.kafka.ctx.hub is doors.native.ctx.hub is doors.broker.hub


async def test_metadata_marks_the_brokers_internal_topics(doors: Doors, client: RawKafkaClient) -> None:
    await doors.broker.topics.ensure(TRANSACTION_HALF_TOPIC, 1)
    await doors.store.create_topic("user", 1)
    md = await client.call(
        ApiKey.METADATA,
        9,
        {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False},
    )
    internal = {t["name"]: t["is_internal"] for t in md["topics"]}
    assert internal == {TRANSACTION_HALF_TOPIC: True, "user": False}


async def test_each_door_creates_in_its_own_alphabet_under_one_rule(doors: Doors, client: RawKafkaClient) -> None:
    resp = await client.call(ApiKey.CREATE_TOPICS, 5, create_body("ns%orders"))
    assert resp["topics"][0]["error_code"] == E.InvalidTopicError.code
    resp = await doors.remoting(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "ns%orders", "readQueueNums": "2"})
    assert resp.code == ResponseCode.SUCCESS and doors.store.topic("ns%orders").queue_count == 2
    resp = await doors.remoting(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "a b", "readQueueNums": "1"})
    assert resp.code == ResponseCode.SYSTEM_ERROR and doors.store.topic("a b") is None
    # the RocketMQ-made topic is a topic like any other: Kafka describes its settings from the same schema
    resp = await client.call(
        ApiKey.DESCRIBE_CONFIGS,
        1,
        {
            "resources": [{"resource_type": 2, "resource_name": "ns%orders", "configuration_keys": ["retention.ms"]}],
            "include_synonyms": False,
        },
    )
    assert [(c["name"], c["value"]) for c in resp["results"][0]["configs"]] == [("retention.ms", "604800000")]


async def test_kafka_settings_are_checked_by_the_broker_schema(doors: Doors, client: RawKafkaClient) -> None:
    resp = await client.call(ApiKey.CREATE_TOPICS, 5, create_body("t", {"retention.ms": "-5"}))
    assert resp["topics"][0]["error_code"] == E.InvalidConfigError.code
    assert resp["topics"][0]["error_message"] == "retention.ms=-5 is out of range"
    assert doors.store.topic("t") is None
    resp = await client.call(ApiKey.CREATE_TOPICS, 5, create_body("t", {"retention.ms": "5000"}))
    assert resp["topics"][0]["error_code"] == 0
    resp = await client.call(
        ApiKey.INCREMENTAL_ALTER_CONFIGS,
        0,
        {
            "validate_only": False,
            "resources": [
                {
                    "resource_type": 2,
                    "resource_name": "t",
                    "configs": [{"name": "cleanup.policy", "config_operation": 2, "value": "archive"}],
                }
            ],
        },
    )
    assert resp["responses"][0]["error_code"] == E.InvalidConfigError.code
    assert doors.store.topic("t").config.overrides == {"retention.ms": "5000"}


async def test_a_rocketmq_send_wakes_a_kafka_long_poll(doors: Doors, client: RawKafkaClient) -> None:
    await doors.store.create_topic("x", 1)
    fetch = {
        "replica_id": -1,
        "max_wait_ms": 10_000,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "forgotten_topics_data": [],
        "rack_id": "",
        "topics": [
            {
                "topic": "x",
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
    waiting = asyncio.ensure_future(client.call(ApiKey.FETCH, 12, fetch, timeout=20))
    # until the Fetch found nothing and waits on the hub
    await wait_until_async(lambda: doors.broker.hub.waiting_on("x", 0), what="the Fetch to wait on the hub")
    assert not waiting.done()
    sent = await doors.remoting(
        RequestCode.SEND_MESSAGE,
        {
            "producerGroup": "p",
            "topic": "x",
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "1",
            "queueId": "0",
            "sysFlag": "0",
            "bornTimestamp": "1",
            "flag": "0",
            "properties": properties_to_string({"TAGS": "a"}),
            "reconsumeTimes": "0",
        },
        b"hello",
    )
    assert sent.code == ResponseCode.SUCCESS
    resp = await waiting  # the broker's clock never moved: only a wake-up ends the wait
    part = resp["responses"][0]["partitions"][0]
    assert part["error_code"] == 0 and part["high_watermark"] == 1 and part["records"]
