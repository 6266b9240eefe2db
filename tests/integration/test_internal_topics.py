"""The broker's internal topics against clients (a real broker, real sockets): Kafka clients cannot produce to them,
delete, grow, reconfigure or trim them, RocketMQ producers cannot send to them, Metadata marks them internal and
leaves RocketMQ's `%` names out of its full listing; and a data directory that already holds a timer record the
timer cannot read (written before clients were kept out) still starts and delivers every good delayed message."""

from __future__ import annotations

import time
from pathlib import Path

from helpers import produce_body, wait_until

from mqk import errors as E
from mqk.broker.internal import TRANSACTION_HALF_TOPIC
from mqk.client.remoting import RemotingConnection
from mqk.config import StoreConfig
from mqk.protocol.kafka.api import ApiKey
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.records import message_to_batch
from mqk.server.kafka.rawclient import RawKafkaClient, make_batch
from mqk.store.manager import StoreManager
from mqk.testing import ThreadedBroker, broker_config
from mqk.timer import TIMER_TOPIC
from mqk.timer.delay import Waiting, wrap

AUTHZ = E.TopicAuthorizationFailedError.code


async def _kafka(broker: ThreadedBroker) -> RawKafkaClient:
    return await RawKafkaClient.connect(*broker.kafka_address)


async def test_kafka_clients_cannot_change_internal_topics(mqk_broker: ThreadedBroker) -> None:
    client = await _kafka(mqk_broker)
    try:
        resp = await client.call(ApiKey.PRODUCE, 9, produce_body(TIMER_TOPIC, make_batch([b"poison"])))
        part = resp["responses"][0]["partition_responses"][0]
        assert part["error_code"] == E.InvalidTopicError.code and "internal topic" in part["error_message"]
        assert mqk_broker.store.end_offset(TIMER_TOPIC, 0) == 0  # nothing written
        # a name reserved for an internal topic cannot be made by a client either
        resp = await client.call(ApiKey.PRODUCE, 9, produce_body("__consumer_offsets", make_batch([b"x"])))
        assert resp["responses"][0]["partition_responses"][0]["error_code"] == E.InvalidTopicError.code
        assert mqk_broker.store.topic("__consumer_offsets") is None

        resp = await client.call(ApiKey.DELETE_TOPICS, 4, {"topic_names": [TIMER_TOPIC], "timeout_ms": 1000})
        assert resp["responses"][0]["error_code"] == AUTHZ
        resp = await client.call(
            ApiKey.CREATE_PARTITIONS,
            2,
            {
                "timeout_ms": 1000,
                "validate_only": True,
                "topics": [{"name": TIMER_TOPIC, "count": 3, "assignments": None}],
            },
        )
        assert resp["results"][0]["error_code"] == AUTHZ
        resource = {"resource_type": 2, "resource_name": TIMER_TOPIC}
        resp = await client.call(
            ApiKey.ALTER_CONFIGS,
            1,
            {"validate_only": False, "resources": [{**resource, "configs": [{"name": "retention.ms", "value": "1"}]}]},
        )
        assert resp["responses"][0]["error_code"] == AUTHZ
        change = {"name": "retention.ms", "config_operation": 0, "value": "1"}
        resp = await client.call(
            ApiKey.INCREMENTAL_ALTER_CONFIGS,
            1,
            {"validate_only": False, "resources": [{**resource, "configs": [change]}]},
        )
        assert resp["responses"][0]["error_code"] == AUTHZ
        resp = await client.call(
            ApiKey.DELETE_RECORDS,
            1,
            {
                "timeout_ms": 1000,
                "topics": [{"name": TIMER_TOPIC, "partitions": [{"partition_index": 0, "offset": -1}]}],
            },
        )
        assert resp["topics"][0]["partitions"][0]["error_code"] == AUTHZ
        info = mqk_broker.store.topic(TIMER_TOPIC)
        assert info is not None and info.queue_count == 1 and "retention.ms" in info.config.overrides
        assert info.config.overrides["retention.ms"] != "1"
    finally:
        await client.close()


async def test_metadata_marks_internal_topics_and_hides_rocketmq_names(mqk_broker: ThreadedBroker) -> None:
    mqk_broker.call(mqk_broker.store.create_topic("%RETRY%workers", 1))
    mqk_broker.call(mqk_broker.store.create_topic("orders", 1))
    client = await _kafka(mqk_broker)
    try:
        body = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
        listed = {t["name"]: t["is_internal"] for t in (await client.call(ApiKey.METADATA, 9, body))["topics"]}
        assert listed[TIMER_TOPIC] is True and listed["orders"] is False
        assert "%RETRY%workers" not in listed
        body["topics"] = [{"name": "%RETRY%workers"}]
        (topic,) = (await client.call(ApiKey.METADATA, 9, body))["topics"]
        assert topic["error_code"] == 0 and topic["name"] == "%RETRY%workers" and not topic["is_internal"]
    finally:
        await client.close()


async def test_rocketmq_producers_cannot_send_to_internal_topics(mqk_broker: ThreadedBroker) -> None:
    conn = RemotingConnection(mqk_broker.native_address)
    await conn.connect()
    try:
        for topic in (TIMER_TOPIC, TRANSACTION_HALF_TOPIC, "SCHEDULE_TOPIC_XXXX"):
            ext = {"producerGroup": "p", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4"}
            ext |= {"queueId": "0", "sysFlag": "0", "bornTimestamp": "0", "flag": "0", "properties": ""}
            cmd = RemotingCommand(code=RequestCode.SEND_MESSAGE, ext_fields=ext, body=b"poison")
            resp = await conn.invoke(cmd, timeout=10)
            assert resp.code == ResponseCode.NO_PERMISSION, (topic, resp.remark)
            assert resp.remark == f"Sending message to topic[{topic}] is forbidden."
        assert mqk_broker.store.end_offset(TIMER_TOPIC, 0) == 0
        assert mqk_broker.store.topic(TRANSACTION_HALF_TOPIC) is None
        cmd = RemotingCommand(code=RequestCode.DELETE_TOPIC_IN_BROKER, ext_fields={"topic": TIMER_TOPIC})
        assert (await conn.invoke(cmd, timeout=10)).code == ResponseCode.SYSTEM_ERROR
        assert mqk_broker.store.topic(TIMER_TOPIC) is not None
    finally:
        await conn.close()


async def _older_build_data(data_dir: Path, due: int) -> None:
    """A file store as a build before this protection left it: a plain record in the timer topic (what
    `kcat -P -t __mqk_timer` wrote) between two good delayed messages for topic `d`."""
    store = StoreManager(StoreConfig(storage="file", data_dir=data_dir))
    await store.start()
    try:
        await store.create_topic("d", 1)
        await store.create_topic(TIMER_TOPIC, 1)

        def waiting(body: bytes) -> bytearray:
            return wrap([Waiting("d", 0, due, 0, (), bytes(message_to_batch(body, {}, due)))], due)

        await store.append(TIMER_TOPIC, 0, [waiting(b"before")])
        await store.append(TIMER_TOPIC, 0, [make_batch([b"poison"])])
        await store.append(TIMER_TOPIC, 0, [waiting(b"after")])
    finally:
        await store.close()


async def test_a_broker_starts_on_a_bad_timer_record_and_delivers_the_good_ones(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    await _older_build_data(data_dir, int(time.time() * 1000) + 200)
    broker = ThreadedBroker(broker_config("file", data_dir)).start()  # used to fail: the record lacks its headers
    try:
        wait_until(lambda: broker.store.end_offset("d", 0) == 2, 30, "both good delayed messages delivered")
        timer = broker.runtime.timer
        assert timer is not None and timer.unreadable == 1
        result = broker.call(broker.store.read("d", 0, 0, 1 << 20))
        assert len(result.batches) == 2
    finally:
        broker.stop()
