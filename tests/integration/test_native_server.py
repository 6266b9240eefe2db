"""The RocketMQ broker and name-server roles over real sockets, with mqk's native client and raw remoting
commands, in-process, on the memory and the file store (real CommitLog offsets in message ids)."""

from __future__ import annotations

import asyncio
import json
import struct
import time

import pytest
from helpers import wait_until_async

from mqk.client import Message, MessageQueue, Producer, PullConsumer
from mqk.client.remoting import ClientError, RemotingConnection
from mqk.config import BrokerConfig, StoreConfig
from mqk.errors import NotSupported
from mqk.protocol.native.codes import RequestCode, ResponseCode, SerializeType
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.message import decode_message_id, decode_messages
from mqk.server.native.namesrv import NameServer
from mqk.server.native.server import NativeServer
from mqk.store.manager import StoreManager


class Native:
    def __init__(
        self,
        store: StoreManager,
        broker: NativeServer,
        namesrv: NameServer,
        broker_addr: tuple[str, int],
        namesrv_addr: tuple[str, int],
    ) -> None:
        self.store, self.broker, self.namesrv = store, broker, namesrv
        self.broker_addr, self.namesrv_addr = broker_addr, namesrv_addr

    @property
    def ns(self) -> str:
        return f"{self.namesrv_addr[0]}:{self.namesrv_addr[1]}"


@pytest.fixture(params=["memory", "file"])
async def native(request, tmp_path):
    config = BrokerConfig(
        native_listen=("127.0.0.1", 0),
        namesrv_listen=("127.0.0.1", 0),
        store=StoreConfig(storage=request.param, data_dir=tmp_path / "data", commitlog_segment_bytes=1 << 20),
    )
    store = StoreManager(config.store)
    await store.start()
    broker = NativeServer(config, store)
    broker_addr = await broker.start()
    namesrv = NameServer(config, store, broker_addr)
    namesrv_addr = await namesrv.start()
    yield Native(store, broker, namesrv, broker_addr, namesrv_addr)
    await namesrv.stop()
    await broker.stop()
    await store.close()


async def raw(
    addr: tuple[str, int],
    code: int,
    ext: dict | None = None,
    body: bytes | None = None,
    serialize: int = SerializeType.JSON,
) -> RemotingCommand:
    conn = RemotingConnection(addr)
    await conn.connect()
    try:
        return await conn.invoke(
            RemotingCommand(code=code, ext_fields=ext or {}, body=body, serialize_type=serialize), timeout=10
        )
    finally:
        await conn.close()


async def test_route_for_unknown_topic_and_auto_create_key(native: Native) -> None:
    resp = await raw(native.namesrv_addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "nope"})
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST
    resp = await raw(native.namesrv_addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
    assert resp.code == ResponseCode.SUCCESS
    await native.store.create_topic("routed", 3)
    resp = await raw(native.namesrv_addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "routed"})
    route = json.loads(resp.body)
    assert route["queueDatas"][0]["readQueueNums"] == 3 and route["queueDatas"][0]["perm"] == 6
    assert route["brokerDatas"][0]["brokerAddrs"]["0"] == f"{native.broker_addr[0]}:{native.broker_addr[1]}"
    cluster = json.loads((await raw(native.namesrv_addr, RequestCode.GET_BROKER_CLUSTER_INFO)).body)
    assert "mqk-broker-a" in cluster["brokerAddrTable"]
    topics = json.loads((await raw(native.namesrv_addr, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)).body)
    assert "routed" in topics["topicList"]


async def test_unknown_code_and_binary_header(native: Native) -> None:
    resp = await raw(native.broker_addr, 9999, serialize=SerializeType.ROCKETMQ)
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "9999" in (resp.remark or "")
    assert resp.serialize_type == SerializeType.ROCKETMQ
    # ACL fields are accepted and ignored
    resp = await raw(native.broker_addr, RequestCode.GET_ALL_TOPIC_CONFIG, {"AccessKey": "ak", "Signature": "sig"})
    assert resp.code == ResponseCode.SUCCESS and "topicConfigTable" in json.loads(resp.body)


async def test_oversized_frame_closes_connection(native: Native) -> None:
    reader, writer = await asyncio.open_connection(*native.broker_addr)
    writer.write(struct.pack(">ii", 64 * 1024 * 1024, 10))
    await writer.drain()
    assert await asyncio.wait_for(reader.read(100), 5) == b""
    writer.close()
    # the broker still serves others
    resp = await raw(native.broker_addr, RequestCode.GET_ALL_TOPIC_CONFIG)
    assert resp.code == ResponseCode.SUCCESS


async def test_send_and_pull_with_tags_keys_properties(native: Native) -> None:
    async with Producer(native.ns, "pg") as producer:
        first = await producer.send(
            "orders", b"one", tags="A", keys=["k1", "k2"], properties={"color": "red"}, queue_id=0
        )
        await producer.send("orders", b"two", tags="B", queue_id=0)
        await producer.send("orders", b"three", tags="A", queue_id=0)
    assert first.queue_offset == 0 and first.queue.queue_id == 0
    assert decode_message_id(first.offset_msg_id)[1] == native.broker_addr[1]
    async with PullConsumer(native.ns, "cg") as consumer:
        mq = MessageQueue("orders", "mqk-broker-a", 0)
        everything = await consumer.pull(mq, 0)
        assert [m.body for m in everything.messages] == [b"one", b"two", b"three"]
        assert everything.next_offset == 3 and everything.max_offset == 3
        msg = everything.messages[0]
        assert msg.tags == "A" and msg.keys == ["k1", "k2"] and msg.properties["color"] == "red"
        assert msg.msg_id == first.msg_id and msg.offset_msg_id == first.offset_msg_id
        assert msg.born_host[0] == "127.0.0.1" and msg.born_host != msg.store_host  # the producer's address
        only_a = await consumer.pull(mq, 0, expression="A")
        assert [m.body for m in only_a.messages] == [b"one", b"three"] and only_a.next_offset == 3
        only_c = await consumer.pull(mq, 0, expression="C || D")
        assert only_c.status == "NO_MATCHED_MSG" and only_c.next_offset == 3
        at_end = await consumer.pull(mq, 3)
        assert at_end.status == "NO_NEW_MSG" and at_end.next_offset == 3
        beyond = await consumer.pull(mq, 10)
        assert beyond.status == "OFFSET_ILLEGAL" and beyond.next_offset == 0  # min offset is 0
        assert await consumer.max_offset(mq) == 3 and await consumer.min_offset(mq) == 0
        assert await consumer.search_offset(mq, 0) == 0
        assert await consumer.search_offset(mq, int(time.time() * 1000) + 60_000) == 3


async def test_empty_queue_answers(native: Native) -> None:
    await native.store.create_topic("empty", 1)
    async with PullConsumer(native.ns, "cg") as consumer:
        mq = MessageQueue("empty", "mqk-broker-a", 0)
        assert (await consumer.pull(mq, 0)).status == "NO_NEW_MSG"
        moved = await consumer.pull(mq, 5)
        assert moved.status == "OFFSET_ILLEGAL" and moved.next_offset == 0
        with pytest.raises(ClientError) as err:
            await consumer.pull(MessageQueue("missing", "mqk-broker-a", 0), 0)
        assert err.value.code == ResponseCode.TOPIC_NOT_EXIST


async def test_long_poll_wakes_on_new_message(native: Native) -> None:
    await native.store.create_topic("lp", 1)
    mq = MessageQueue("lp", "mqk-broker-a", 0)
    hub = native.broker.ctx.hub
    async with PullConsumer(native.ns, "cg") as consumer, Producer(native.ns) as producer:
        # suspended for a minute: an answer within the 10 s below can only come from the wake-up
        waiting = asyncio.create_task(consumer.pull(mq, 0, suspend_ms=60_000))
        await wait_until_async(lambda: hub.waiting_on("lp", 0), what="the pull to be parked")
        assert not waiting.done()
        await producer.send("lp", b"wake", queue_id=0)
        result = await asyncio.wait_for(waiting, 10)
        assert result.status == "FOUND" and result.messages[0].body == b"wake"
        # with nothing new, the pull is held (parked) and answered NO_NEW_MSG when its suspension is over
        nothing = asyncio.create_task(consumer.pull(mq, 1, suspend_ms=1000))
        await wait_until_async(lambda: hub.waiting_on("lp", 0), what="the second pull to be parked")
        assert (await asyncio.wait_for(nothing, 10)).status == "NO_NEW_MSG"


async def test_batch_send(native: Native) -> None:
    async with Producer(native.ns) as producer:
        result = await producer.send_batch(
            [
                Message("batchy", b"m%d" % i, tags="T" if i % 2 else None, keys=[f"key{i}"] if i == 2 else None)
                for i in range(5)
            ],
            queue_id=0,
        )
    assert result.queue_offset == 0 and len(result.msg_id.split(",")) == 5
    assert len(result.offset_msg_id.split(",")) == 5
    async with PullConsumer(native.ns, "cg") as consumer:
        got = await consumer.pull(MessageQueue("batchy", "mqk-broker-a", 0), 0)
        assert [m.body for m in got.messages] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        assert [m.queue_offset for m in got.messages] == [0, 1, 2, 3, 4]
        assert [m.msg_id for m in got.messages] == result.msg_id.split(",")
        # the broker ids of the send answer are the ones pulls show (real CommitLog positions on the file store)
        assert [m.offset_msg_id for m in got.messages] == result.offset_msg_id.split(",")


async def test_consumer_offsets_shared_with_store_groups(native: Native) -> None:
    await native.store.create_topic("off", 2)
    mq = MessageQueue("off", "mqk-broker-a", 1)
    async with PullConsumer(native.ns, "g1") as consumer:
        assert await consumer.committed_offset(mq) == 0  # never committed, queue starts at 0
        await consumer.commit_offset(mq, 7)
        assert await consumer.committed_offset(mq) == 7
        assert native.store.fetch_offsets("g1")[("off", 1)].offset == 7
        await consumer.pull(mq, 0, commit_offset=9)
        assert await consumer.committed_offset(mq) == 9


async def test_an_unchanged_consumer_offset_is_not_committed_again(native: Native, monkeypatch) -> None:
    """Push consumers send their offset every few seconds and with every pull: only a change costs a commit (a
    journal write here, a record in the log in cluster mode)."""
    await native.store.create_topic("same", 1)
    mq = MessageQueue("same", "mqk-broker-a", 0)
    commits: list[int] = []
    real = native.store.commit_offsets

    async def counting(group, offsets):
        commits.extend(o.offset for o in offsets.values())
        await real(group, offsets)

    monkeypatch.setattr(native.store, "commit_offsets", counting)
    async with PullConsumer(native.ns, "g-same") as consumer:
        for offset in (3, 3, 4):
            await consumer.commit_offset(mq, offset)
        for offset in (4, 5, 5):
            await consumer.pull(mq, 0, commit_offset=offset)
        assert await consumer.committed_offset(mq) == 5
    assert commits == [3, 4, 5]


async def test_query_by_key_and_view_by_id(native: Native) -> None:
    async with Producer(native.ns) as producer:
        sent = await producer.send("keyed", b"findme", keys=["order-42"])
        await producer.send("keyed", b"other", keys=["order-43"])
    resp = await raw(
        native.broker_addr,
        RequestCode.QUERY_MESSAGE,
        {
            "topic": "keyed",
            "key": "order-42",
            "maxNum": 10,
            "beginTimestamp": 0,
            "endTimestamp": int(time.time() * 1000) + 1000,
        },
    )
    try:
        await native.store.read_by_key("keyed", b"order-42", 1)
    except NotSupported:  # an engine without a key index yet: a clear error, not a crash
        assert resp.code == ResponseCode.SYSTEM_ERROR and "not available" in (resp.remark or "")
    else:
        assert resp.code == ResponseCode.SUCCESS
        assert [m.body for m in decode_messages(resp.body)] == [b"findme"]
    _, _, offset = decode_message_id(sent.offset_msg_id)
    resp = await raw(native.broker_addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
    assert resp.code == ResponseCode.SUCCESS and decode_messages(resp.body)[0].body == b"findme"
    resp = await raw(native.broker_addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": 123})
    assert resp.code == ResponseCode.SYSTEM_ERROR


async def test_admin_topics(native: Native) -> None:
    resp = await raw(
        native.broker_addr,
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        {"topic": "made", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6},
    )
    assert resp.code == ResponseCode.SUCCESS and native.store.topic("made").queue_count == 4
    table = json.loads((await raw(native.broker_addr, RequestCode.GET_ALL_TOPIC_CONFIG)).body)["topicConfigTable"]
    assert table["made"]["writeQueueNums"] == 4
    resp = await raw(native.broker_addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "made"})
    assert resp.code == ResponseCode.SUCCESS and native.store.topic("made") is None
    resp = await raw(native.broker_addr, RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "bad topic!"})
    assert resp.code == ResponseCode.SYSTEM_ERROR


async def test_missing_required_field_is_an_error_not_a_crash(native: Native) -> None:
    resp = await raw(native.broker_addr, RequestCode.PULL_MESSAGE, {"topic": "x"})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "null" in (resp.remark or "")
    resp = await raw(native.broker_addr, RequestCode.HEART_BEAT, body=b"\xff not json")
    assert resp.code == ResponseCode.SYSTEM_ERROR


async def test_garbage_bytes_close_only_that_connection(native: Native) -> None:
    import random

    rng = random.Random(7)
    for _ in range(20):
        _reader, writer = await asyncio.open_connection(*native.broker_addr)
        size = rng.randrange(8, 200)
        # a plausible length prefix followed by random bytes: a bad header, or a frame that never completes
        writer.write(struct.pack(">i", size) + bytes(rng.randrange(256) for _ in range(size)))
        await writer.drain()
        writer.close()
    resp = await raw(native.broker_addr, RequestCode.GET_ALL_TOPIC_CONFIG)
    assert resp.code == ResponseCode.SUCCESS


async def test_transactional_batches_refused(native: Native) -> None:
    from mqk.protocol.native.message import BatchItem, encode_batch_body

    body = encode_batch_body([BatchItem(b"half", {"TRAN_MSG": "true"})])
    resp = await raw(
        native.broker_addr,
        RequestCode.SEND_BATCH_MESSAGE,
        {"a": "pg", "b": "tx", "d": 4, "e": 0, "f": 4, "g": 0, "h": 0, "i": "TRAN_MSG\x01true\x02", "m": "true"},
        body=body,
    )
    assert resp.code == ResponseCode.NO_PERMISSION and "transaction" in (resp.remark or "")


async def test_transactions_commit_rollback_and_check(native: Native) -> None:
    from mqk.client import COMMIT_MESSAGE, ROLLBACK_MESSAGE, UNKNOWN, TransactionProducer

    await native.store.create_topic("txn", 1)
    checked: list[bytes] = []

    def check(msg) -> str:
        checked.append(msg.body)
        assert msg.topic == "txn" and msg.properties["PGROUP"] == "tpg"
        return COMMIT_MESSAGE

    mq = MessageQueue("txn", "mqk-broker-a", 0)
    async with PullConsumer(native.ns, "tcg") as consumer:
        producer = await TransactionProducer(native.ns, "tpg", check).start()
        try:
            _, state = await producer.send_in_transaction(
                Message("txn", b"committed", tags="T"), lambda r: COMMIT_MESSAGE
            )
            assert state == COMMIT_MESSAGE
            await producer.send_in_transaction(Message("txn", b"rolled-back"), lambda r: ROLLBACK_MESSAGE)
            await producer.send_in_transaction(Message("txn", b"undecided"), lambda r: UNKNOWN)
            got = await consumer.pull(mq, 0, suspend_ms=3000)
            assert [m.body for m in got.messages] == [b"committed"]
            assert got.messages[0].tags == "T" and "TRAN_MSG" not in got.messages[0].properties
            # the broker asks the producer group about the undecided one; the answer commits it
            assert await native.broker.transactions.check_once(older_than_ms=0) == 1
            later = await consumer.pull(mq, 1, suspend_ms=3000)
            assert [m.body for m in later.messages] == [b"undecided"] and checked == [b"undecided"]
            assert await native.broker.transactions.check_once(older_than_ms=0) == 0  # nothing open any more
        finally:
            await producer.stop()
        # all three are resolved (the rollback too, a oneway END_TRANSACTION): the rolled-back one did not appear
        await wait_until_async(lambda: len(native.broker.transactions.resolved) == 3, what="three resolutions")
        assert native.store.end_offset("txn", 0) == 2
    # what was resolved is rebuilt from the op topic (a restart asks nobody about it again)
    from mqk.server.native.transaction import TransactionService

    again = TransactionService(native.broker.ctx, native.broker.clients)
    await again.start()
    try:
        assert again.resolved == native.broker.transactions.resolved and len(again.resolved) == 3
        assert await again.check_once(older_than_ms=0) == 0
    finally:
        await again.stop()


async def test_compressed_body_is_inflated_and_v1_header_names(native: Native) -> None:
    import zlib

    resp = await raw(
        native.broker_addr,
        RequestCode.SEND_MESSAGE,
        {
            "producerGroup": "pg",
            "topic": "zipped",
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4,
            "queueId": 0,
            "sysFlag": 1,
            "bornTimestamp": 1700000000000,
            "flag": 3,
            "properties": "TAGS\x01z\x02",
        },
        body=zlib.compress(b"plain text " * 50),
    )
    assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["queueOffset"] == "0"
    async with PullConsumer(native.ns, "zg") as consumer:
        (msg,) = (await consumer.pull(MessageQueue("zipped", "mqk-broker-a", 0), 0)).messages
    assert msg.body == b"plain text " * 50 and msg.sys_flag & 1 == 0 and msg.flag == 3
    assert msg.born_timestamp == 1700000000000 and msg.tags == "z"


async def test_heartbeat_consumer_list_notify_and_unregister(native: Native) -> None:
    await native.store.create_topic("hb", 1)
    notified: list[RemotingCommand] = []

    def heartbeat(client_id: str) -> bytes:
        return json.dumps(
            {
                "clientID": client_id,
                "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}],
                "consumerDataSet": [
                    {
                        "groupName": "hbg",
                        "consumeType": "CONSUME_PASSIVELY",
                        "messageModel": "CLUSTERING",
                        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                        "subscriptionDataSet": [
                            {
                                "topic": "hb",
                                "subString": "A || B",
                                "tagsSet": ["A", "B"],
                                "codeSet": [65, 66],
                                "subVersion": 1,
                                "classFilterMode": False,
                                "expressionType": "TAG",
                            }
                        ],
                        "unitMode": False,
                    }
                ],
            }
        ).encode()

    first = RemotingConnection(native.broker_addr, notified.append)
    second = RemotingConnection(native.broker_addr)
    await first.connect()
    await second.connect()
    try:
        assert (await first.invoke(RemotingCommand(code=RequestCode.HEART_BEAT, body=heartbeat("c-1")))).code == 0
        assert native.store.topic("%RETRY%hbg") is not None  # created on the group's first heartbeat
        assert (await second.invoke(RemotingCommand(code=RequestCode.HEART_BEAT, body=heartbeat("c-2")))).code == 0
        resp = await second.invoke(
            RemotingCommand(code=RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext_fields={"consumerGroup": "hbg"})
        )
        assert json.loads(resp.body)["consumerIdList"] == ["c-1", "c-2"]
        await wait_until_async(lambda: notified, what="NOTIFY_CONSUMER_IDS_CHANGED")
        assert notified[-1].code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and notified[-1].is_oneway
        assert notified[-1].ext_fields == {"consumerGroup": "hbg"}
        # the registered subscription filters pulls that do not carry their own
        async with Producer(native.ns) as producer:
            for tag in ("A", "C", "B"):
                await producer.send("hb", tag.encode(), tags=tag, queue_id=0)
        resp = await second.invoke(
            RemotingCommand(
                code=RequestCode.PULL_MESSAGE,
                ext_fields={
                    "consumerGroup": "hbg",
                    "topic": "hb",
                    "queueId": "0",
                    "queueOffset": "0",
                    "maxMsgNums": "32",
                    "sysFlag": "0",
                    "commitOffset": "0",
                    "suspendTimeoutMillis": "0",
                },
            )
        )
        assert [m.body for m in decode_messages(resp.body)] == [b"A", b"B"]
        resp = await second.invoke(
            RemotingCommand(code=RequestCode.GET_CONSUMER_CONNECTION_LIST, ext_fields={"consumerGroup": "hbg"})
        )
        connections = json.loads(resp.body)
        assert [c["clientId"] for c in connections["connectionSet"]] == ["c-1", "c-2"]
        assert connections["subscriptionTable"]["hb"]["subString"] == "A || B"
        assert connections["messageModel"] == "CLUSTERING"
        resp = await second.invoke(
            RemotingCommand(code=RequestCode.UNREGISTER_CLIENT, ext_fields={"clientID": "c-2", "consumerGroup": "hbg"})
        )
        assert resp.code == ResponseCode.SUCCESS
        resp = await second.invoke(
            RemotingCommand(code=RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext_fields={"consumerGroup": "hbg"})
        )
        assert json.loads(resp.body)["consumerIdList"] == ["c-1"]
        resp = await second.invoke(
            RemotingCommand(code=RequestCode.GET_EARLIEST_MSG_STORETIME, ext_fields={"topic": "hb", "queueId": "0"})
        )
        assert resp.code == ResponseCode.SUCCESS and 0 < int(resp.ext_fields["timestamp"]) <= time.time() * 1000
    finally:
        await first.close()
        await second.close()
    # a closed connection takes its consumer out of the group
    await wait_until_async(
        lambda: "hbg" not in native.broker.clients.groups or not native.broker.clients.groups["hbg"].clients,
        what="the group to be empty",
    )


async def test_admin_client(native: Native) -> None:
    from mqk.client import Admin

    async with Admin(native.ns) as admin:
        assert await admin.brokers() == [native.broker_addr]
        await admin.create_topic("adm", 3)
        assert "adm" in await admin.topics() and native.store.topic("adm").queue_count == 3
        async with Producer(native.ns) as producer:
            sent = await producer.send("adm", b"look", keys=["lk"])
        assert (await admin.view_message(sent.offset_msg_id)).body == b"look"
        try:
            await native.store.read_by_key("adm", b"lk", 1)
        except NotSupported:
            pass
        else:
            assert [m.body for m in await admin.query_by_key("adm", "lk")] == [b"look"]
            assert await admin.query_by_key("adm", "absent") == []
        await admin.delete_topic("adm")
        assert "adm" not in await admin.topics()
