"""RocketMQ 5 POP consumption over the remoting protocol (POP_MESSAGE, ACK_MESSAGE, BATCH_ACK_MESSAGE,
CHANGE_MESSAGE_INVISIBLETIME, NOTIFICATION, POLLING_INFO), driven the way RocketMQ's Java client drives it: each
message's receipt (`extraInfo`) is built from the pop answer's header as MQClientAPIImpl.processPopResponse builds
it. The commands are raw here, to reach every field and refusal; mqk's own PopConsumer is tested against a Kafka
ShareConsumer of the same group in compat/test_share_groups_clients.py, and in cluster mode (a new master has the
group's states) in tests/integration/test_cluster_state.py. mqk's own producer sends. On the memory store, and the
first test on the file store too (POP reads the store as a pull does; the engines' reads have their own tests)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from helpers import wait_until_async

from mqk.client import Producer
from mqk.client.remoting import RemotingConnection
from mqk.config import BrokerConfig, StoreConfig
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.message import MessageExt, decode_messages
from mqk.server.native.namesrv import NameServer
from mqk.server.native.server import NativeServer
from mqk.store.manager import StoreManager

BROKER_NAME = "mqk-broker-a"


@dataclass
class Broker:
    store: StoreManager
    server: NativeServer
    conn: RemotingConnection
    ns: str

    async def call(self, code: int, ext: dict | None = None, body: bytes | None = None) -> RemotingCommand:
        return await self.conn.invoke(RemotingCommand(code=code, ext_fields=ext or {}, body=body), timeout=20)


@pytest.fixture(params=["memory"])
async def broker(request, tmp_path) -> AsyncIterator[Broker]:
    config = BrokerConfig(
        native_listen=("127.0.0.1", 0),
        namesrv_listen=("127.0.0.1", 0),
        store=StoreConfig(storage=request.param, data_dir=tmp_path / "data"),
    )
    store = StoreManager(config.store)
    await store.start()
    server = NativeServer(config, store)
    address = await server.start()
    namesrv = NameServer(config, store, address)
    ns_host, ns_port = await namesrv.start()
    conn = RemotingConnection(address)
    await conn.connect()
    try:
        yield Broker(store, server, conn, f"{ns_host}:{ns_port}")
    finally:
        await conn.close()
        await namesrv.stop()
        await server.stop()
        await store.close()


@dataclass
class Popped:
    code: int
    header: dict[str, str]
    messages: list[MessageExt]

    def receipt(self, message: MessageExt) -> str:
        """The message's extraInfo, as RocketMQ's Java client builds it from the answer's header."""
        key = f"0 {message.queue_id}"
        starts = dict(s.rsplit(" ", 1) for s in self.header["startOffsetInfo"].split(";"))
        h = self.header
        return (
            f"{starts[key]} {h['popTime']} {h['invisibleTime']} {h['reviveQid']} 0 {BROKER_NAME} "
            f"{message.queue_id} {message.queue_offset}"
        )


async def pop(
    b: Broker,
    group: str,
    topic: str,
    *,
    queue: int = -1,
    most: int = 32,
    lock_ms: int = 60_000,
    poll_ms: int = 0,
    **more,
) -> Popped:
    ext = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": queue,
        "maxMsgNums": most,
        "invisibleTime": lock_ms,
        "pollTime": poll_ms,
        "bornTime": 0,
        "initMode": 0,
        **more,
    }
    answer = await b.call(RequestCode.POP_MESSAGE, ext)
    messages = decode_messages(answer.body) if answer.code == ResponseCode.SUCCESS else []
    return Popped(answer.code, answer.ext_fields, messages)


async def ack(b: Broker, group: str, topic: str, popped: Popped, message: MessageExt) -> RemotingCommand:
    ext = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": message.queue_id,
        "extraInfo": popped.receipt(message),
        "offset": message.queue_offset,
    }
    return await b.call(RequestCode.ACK_MESSAGE, ext)


async def send(b: Broker, topic: str, bodies: list[bytes], *, queue: int = 0, tags: str | None = None) -> None:
    async with Producer(b.ns, "pop-producer") as producer:
        for body in bodies:
            await producer.send(topic, body, queue_id=queue, tags=tags)


def offsets_of(info: str) -> dict[int, list[int]]:
    """msgOffsetInfo -> {queue: [offsets]}."""
    out = {}
    for part in info.split(";"):
        mark, queue, offsets = part.split(" ")
        assert mark == "0"
        out[int(queue)] = [int(o) for o in offsets.split(",")]
    return out


@pytest.mark.parametrize("broker", ["memory", "file"], indirect=True)
async def test_a_pop_hands_out_each_message_once_and_an_unacknowledged_one_comes_back_with_its_attempt(
    broker: Broker,
) -> None:
    await broker.store.create_topic("jobs", 2)
    await send(broker, "jobs", [b"a0", b"a1", b"a2"], queue=0)
    await send(broker, "jobs", [b"b0", b"b1"], queue=1)
    first = await pop(broker, "workers", "jobs", lock_ms=300)
    assert first.code == ResponseCode.SUCCESS
    assert sorted(m.body for m in first.messages) == [b"a0", b"a1", b"a2", b"b0", b"b1"]
    assert offsets_of(first.header["msgOffsetInfo"]) == {0: [0, 1, 2], 1: [0, 1]}
    assert {int(first.header["invisibleTime"]), int(first.header["restNum"])} == {300, 0}
    assert all(m.reconsume_times == 0 for m in first.messages)
    nothing = await pop(broker, "workers", "jobs")  # every message is held
    assert nothing.code == ResponseCode.POLLING_TIMEOUT and nothing.messages == []
    for message in first.messages:
        if message.body != b"a1":
            assert (await ack(broker, "workers", "jobs", first, message)).code == ResponseCode.SUCCESS
    # the unacknowledged one comes back once its lock ends (the pop waits for it, not for its whole poll time)
    again = await pop(broker, "workers", "jobs", poll_ms=10_000, lock_ms=300)
    assert [(m.body, m.queue_id, m.queue_offset, m.reconsume_times) for m in again.messages] == [(b"a1", 0, 1, 1)]
    # a late ack of the first delivery does not settle the second: the message comes back a third time
    late = await ack(broker, "workers", "jobs", first, next(m for m in first.messages if m.body == b"a1"))
    assert late.code == ResponseCode.SUCCESS  # (as RocketMQ answers it)
    third = await pop(broker, "workers", "jobs", poll_ms=10_000, lock_ms=60_000)
    assert [(m.body, m.reconsume_times) for m in third.messages] == [(b"a1", 2)]
    assert (await ack(broker, "workers", "jobs", third, third.messages[0])).code == ResponseCode.SUCCESS
    assert (await pop(broker, "workers", "jobs")).code == ResponseCode.POLLING_TIMEOUT
    # another group has all of them
    other = await pop(broker, "auditors", "jobs")
    assert len(other.messages) == 5


async def test_one_queue_a_tag_filter_and_the_most_a_pop_takes(broker: Broker) -> None:
    await broker.store.create_topic("tagged", 2)
    for i in range(6):
        await send(broker, "tagged", [b"x%d" % i], queue=0, tags="red" if i % 2 else "blue")
    await send(broker, "tagged", [b"other-queue"], queue=1, tags="red")
    reds = await pop(broker, "g", "tagged", queue=0, most=2, exp="red || green", expType="TAG")
    assert [m.body for m in reds.messages] == [b"x1", b"x3"] and {m.queue_id for m in reds.messages} == {0}
    rest = await pop(broker, "g", "tagged", queue=0, exp="red || green", expType="TAG")
    assert [m.body for m in rest.messages] == [b"x5"]  # (the blue ones are done for this group)


async def test_batch_ack_settles_the_offsets_its_bit_set_names(broker: Broker) -> None:
    await broker.store.create_topic("batched", 1)
    await send(broker, "batched", [b"m%d" % i for i in range(5)])
    popped = await pop(broker, "g", "batched", lock_ms=300)
    start = int(popped.header["startOffsetInfo"].split(" ")[2])
    bits = sum(1 << (o - start) for o in (0, 2, 4))  # Java's BitSet.toByteArray: little-endian
    entry = {
        "c": "g",
        "t": "batched",
        "r": "0",
        "so": start,
        "q": 0,
        "rq": 0,
        "pt": int(popped.header["popTime"]),
        "it": 300,
        "b": base64.b64encode(bits.to_bytes(1, "little")).decode(),
    }
    body = json.dumps({"brokerName": BROKER_NAME, "acks": [entry]}).encode()
    assert (await broker.call(RequestCode.BATCH_ACK_MESSAGE, body=body)).code == ResponseCode.SUCCESS
    back = await pop(broker, "g", "batched", poll_ms=10_000)
    assert sorted(m.body for m in back.messages) == [b"m1", b"m3"]
    refused = await broker.call(RequestCode.BATCH_ACK_MESSAGE, body=b"{not json")
    assert refused.code == ResponseCode.MESSAGE_ILLEGAL
    huge = {**entry, "b": base64.b64encode(b"\xff" * 1_000_000).decode()}  # 8 M offsets: refused, not walked
    refused = await broker.call(RequestCode.BATCH_ACK_MESSAGE, body=json.dumps({"acks": [huge]}).encode())
    assert refused.code == ResponseCode.MESSAGE_ILLEGAL
    empty = await broker.call(RequestCode.BATCH_ACK_MESSAGE, body=json.dumps({"acks": []}).encode())
    assert empty.code == ResponseCode.NO_MESSAGE


async def test_changing_the_invisible_time_moves_the_lock_and_renews_the_receipt(broker: Broker) -> None:
    await broker.store.create_topic("slow", 1)
    await send(broker, "slow", [b"long job"])
    popped = await pop(broker, "g", "slow", lock_ms=200)
    message = popped.messages[0]
    ext = {
        "consumerGroup": "g",
        "topic": "slow",
        "queueId": 0,
        "extraInfo": popped.receipt(message),
        "offset": 0,
        "invisibleTime": 60_000,
    }
    changed = await broker.call(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext)
    assert changed.code == ResponseCode.SUCCESS and changed.ext_fields["invisibleTime"] == "60000"
    assert int(changed.ext_fields["popTime"]) > int(popped.header["popTime"])
    # held for a minute now: a pop waiting well past the first lock's end gets nothing
    assert (await pop(broker, "g", "slow", poll_ms=600)).code == ResponseCode.POLLING_TIMEOUT
    # the old receipt no longer changes the lock; the new one settles the message
    stale = await broker.call(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext)
    assert stale.code == ResponseCode.NO_MESSAGE
    renewed = Popped(changed.code, {**popped.header, "popTime": changed.ext_fields["popTime"]}, [])
    assert (await ack(broker, "g", "slow", renewed, message)).code == ResponseCode.SUCCESS
    assert broker.server.pop.share.groups["g"].partitions.popitem()[1].spans == []  # acknowledged and done


async def test_a_waiting_pop_is_answered_by_a_send_and_counted_while_it_waits(broker: Broker) -> None:
    await broker.store.create_topic("later", 1)
    notified = await broker.call(
        RequestCode.NOTIFICATION, {"consumerGroup": "g", "topic": "later", "queueId": -1, "pollTime": 0, "bornTime": 0}
    )
    assert notified.code == ResponseCode.SUCCESS and notified.ext_fields["hasMsg"] == "false"
    waiting = asyncio.create_task(pop(broker, "g", "later", queue=0, poll_ms=20_000))
    info = {"consumerGroup": "g", "topic": "later", "queueId": 0}

    async def one_pop_waits() -> bool:
        return (await broker.call(RequestCode.POLLING_INFO, info)).ext_fields["pollingNum"] == "1"

    await wait_until_async(one_pop_waits, 10, "POLLING_INFO to count the waiting pop")
    await send(broker, "later", [b"news"])
    got = await asyncio.wait_for(waiting, 10)
    assert [m.body for m in got.messages] == [b"news"]
    assert (await broker.call(RequestCode.POLLING_INFO, info)).ext_fields["pollingNum"] == "0"
    await send(broker, "later", [b"more"])
    notified = await broker.call(
        RequestCode.NOTIFICATION, {"consumerGroup": "g", "topic": "later", "queueId": 0, "pollTime": 0, "bornTime": 0}
    )
    assert notified.ext_fields["hasMsg"] == "true"


async def test_past_the_delivery_limit_a_message_goes_to_the_groups_dead_letter_topic(broker: Broker) -> None:
    await broker.store.create_topic("poison", 1)
    await send(broker, "poison", [b"bad"])
    limit = broker.server.pop.share.limit("g")
    for attempt in range(limit):
        got = await pop(broker, "g", "poison", lock_ms=100, poll_ms=10_000)
        assert [(m.body, m.reconsume_times) for m in got.messages] == [(b"bad", attempt)]
    # the last lock runs out: the message is archived and copied to %DLQ%g, and not delivered again
    assert (await pop(broker, "g", "poison", poll_ms=400)).code == ResponseCode.POLLING_TIMEOUT
    dead = await pop(broker, "dlq-reader", "%DLQ%g")
    assert [m.body for m in dead.messages] == [b"bad"]
    assert dead.messages[0].properties["RETRY_TOPIC"] == "poison"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"maxMsgNums": 0}, ResponseCode.INVALID_PARAMETER),
        ({"maxMsgNums": 33}, ResponseCode.INVALID_PARAMETER),
        ({"invisibleTime": 0}, ResponseCode.INVALID_PARAMETER),
        ({"queueId": 7}, ResponseCode.INVALID_PARAMETER),
        ({"topic": "missing"}, ResponseCode.TOPIC_NOT_EXIST),
        ({"expType": "SQL92", "exp": "a > 1"}, ResponseCode.SUBSCRIPTION_PARSE_FAILED),
        ({"consumerGroup": "bad group!"}, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST),
    ],
)
async def test_bad_pops_get_rocketmqs_codes(broker: Broker, change: dict, code: int) -> None:
    await broker.store.create_topic("t", 1)
    ext = {"consumerGroup": "g", "topic": "t", "queueId": -1, "maxMsgNums": 1, "invisibleTime": 1000, "pollTime": 0}
    ext.update(change)
    ext["bornTime"] = ext["initMode"] = 0
    answer = await broker.call(RequestCode.POP_MESSAGE, ext)
    assert answer.code == code, answer.remark
    assert answer.remark


async def test_bad_acks_get_rocketmqs_codes(broker: Broker) -> None:
    await broker.store.create_topic("t", 1)
    base = {"consumerGroup": "g", "topic": "t", "queueId": 0, "extraInfo": "0 1 2 0 0 b 0 0", "offset": 0}
    assert (await broker.call(RequestCode.ACK_MESSAGE, {**base, "extraInfo": "garbage"})).code == (
        ResponseCode.MESSAGE_ILLEGAL
    )
    assert (await broker.call(RequestCode.ACK_MESSAGE, {**base, "queueId": 3})).code == ResponseCode.MESSAGE_ILLEGAL
    assert (await broker.call(RequestCode.ACK_MESSAGE, {**base, "topic": "nope"})).code == ResponseCode.TOPIC_NOT_EXIST
    missing = dict(base)
    del missing["offset"]
    assert (await broker.call(RequestCode.ACK_MESSAGE, missing)).code != ResponseCode.SUCCESS
    change = {**base, "invisibleTime": 1000}
    assert (await broker.call(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, change)).code == ResponseCode.NO_MESSAGE


async def test_after_a_kill_9_acknowledged_messages_stay_done_and_held_ones_come_back(tmp_path) -> None:
    """An ack is answered once the group's record states are in the log: a broker killed right after loses none,
    and the messages it held for a pop come back at once after the restart, their delivery counted."""
    from mqk.testing import BrokerProcess

    @contextlib.asynccontextmanager
    async def connected(process: BrokerProcess) -> AsyncIterator[Broker]:
        assert process.native_address is not None and process.namesrv_address is not None
        conn = RemotingConnection(process.native_address)
        await conn.connect()
        try:
            host, port = process.namesrv_address
            yield Broker(None, None, conn, f"{host}:{port}")  # type: ignore[arg-type]
        finally:
            await conn.close()

    process = BrokerProcess(tmp_path / "b").start()
    try:
        async with connected(process) as b:
            await send(b, "durable", [b"%d" % i for i in range(6)])
            held = await pop(b, "g", "durable", lock_ms=600_000, poll_ms=5_000)
            assert len(held.messages) == 6
            for message in held.messages[:3]:
                assert (await ack(b, "g", "durable", held, message)).code == ResponseCode.SUCCESS
        process.kill()
        process.start()
        async with connected(process) as b:
            back = await pop(b, "g", "durable", poll_ms=5_000)
            nothing_more = await pop(b, "g", "durable", poll_ms=500)
    finally:
        process.kill()
    assert sorted(m.body for m in back.messages) == [b"3", b"4", b"5"]
    assert {m.reconsume_times for m in back.messages} == {1}
    assert nothing_more.code == ResponseCode.POLLING_TIMEOUT


async def test_subscription_group_configs_are_kept_shown_and_deleted(broker: Broker) -> None:
    config = {"groupName": "fifo", "consumeMessageOrderly": True, "retryMaxTimes": 3, "unknownField": 1}
    answer = await broker.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=json.dumps(config).encode())
    assert answer.code == ResponseCode.SUCCESS
    shown = json.loads((await broker.call(RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG, {"group": "fifo"})).body)
    assert shown["consumeMessageOrderly"] is True and shown["retryMaxTimes"] == 3 and shown["consumeEnable"] is True
    assert "unknownField" not in shown
    table = json.loads((await broker.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body)
    assert list(table["subscriptionGroupTable"]) == ["fifo"]
    for body in (
        b"{not json",
        json.dumps({"groupName": "bad name!"}).encode(),
        json.dumps({"groupName": "g", "consumeMessageOrderly": "yes"}).encode(),
    ):
        refused = await broker.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
        assert refused.code == ResponseCode.INVALID_PARAMETER and refused.remark
    assert (await broker.call(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "fifo"})).code == ResponseCode.SUCCESS
    gone = await broker.call(RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG, {"group": "fifo"})
    assert gone.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


async def configure(broker: Broker, **config: object) -> None:
    body = json.dumps(config).encode()
    assert (await broker.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)).code == ResponseCode.SUCCESS


async def pull(broker: Broker, group: str, topic: str) -> RemotingCommand:
    ext = {"consumerGroup": group, "topic": topic, "queueId": 0, "queueOffset": 0, "maxMsgNums": 32, "sysFlag": 0}
    return await broker.call(RequestCode.PULL_MESSAGE, ext)


async def test_a_group_whose_config_disables_consumption_pulls_and_pops_nothing_until_enabled(broker: Broker) -> None:
    await broker.store.create_topic("paused", 1)
    await send(broker, "paused", [b"m"])
    await configure(broker, groupName="g", consumeEnable=False)
    popped = await pop(broker, "g", "paused")
    assert popped.code == ResponseCode.NO_PERMISSION and not popped.messages
    pulled = await pull(broker, "g", "paused")
    assert pulled.code == ResponseCode.NO_PERMISSION and pulled.remark == "subscription group no permission, g"
    # another group is not paused
    assert (await pull(broker, "other", "paused")).code == ResponseCode.SUCCESS
    await configure(broker, groupName="g", consumeEnable=True)
    assert [m.body for m in (await pop(broker, "g", "paused")).messages] == [b"m"]
    assert (await pull(broker, "g", "paused")).code == ResponseCode.SUCCESS


async def test_retry_max_times_is_how_often_a_pop_group_gets_a_message_again(broker: Broker) -> None:
    await broker.store.create_topic("retried", 1)
    await send(broker, "retried", [b"bad"])
    await configure(broker, groupName="r", retryMaxTimes=1)
    assert broker.server.pop.share.limit("r") == 2  # the first delivery and one retry
    for attempt in range(2):
        got = await pop(broker, "r", "retried", lock_ms=100, poll_ms=10_000)
        assert [(m.body, m.reconsume_times) for m in got.messages] == [(b"bad", attempt)]
    assert (await pop(broker, "r", "retried", poll_ms=400)).code == ResponseCode.POLLING_TIMEOUT
    assert [m.body for m in (await pop(broker, "dlq-reader", "%DLQ%r")).messages] == [b"bad"]
    # the group's own share.delivery.count.limit, when it sets one, wins over retryMaxTimes
    broker.server.pop.share.configure("r", {"share.delivery.count.limit": "4"})
    assert broker.server.pop.share.limit("r") == 4


@pytest.mark.parametrize("how", ["order flag", "fifo group"])
async def test_an_ordered_pop_takes_nothing_more_from_a_queue_while_its_batch_is_held(broker: Broker, how: str) -> None:
    await broker.store.create_topic("ordered", 1)
    await send(broker, "ordered", [b"o%d" % i for i in range(4)])
    more: dict = {"order": "true"} if how == "order flag" else {}
    if how == "fifo group":
        body = json.dumps({"groupName": "g", "consumeMessageOrderly": True}).encode()
        assert (await broker.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)).code == 0
    first = await pop(broker, "g", "ordered", most=2, lock_ms=300, **more)
    assert [m.body for m in first.messages] == [b"o0", b"o1"] and first.header["reviveQid"] == "999"
    assert (await pop(broker, "g", "ordered", **more)).code == ResponseCode.POLLING_TIMEOUT  # o2 waits
    assert (await ack(broker, "g", "ordered", first, first.messages[1])).code == ResponseCode.SUCCESS
    # o0 was not acknowledged: once its lock ends it comes first, counted, and o2 after it
    again = await pop(broker, "g", "ordered", most=2, poll_ms=10_000, lock_ms=60_000, **more)
    assert [(m.body, m.reconsume_times) for m in again.messages] == [(b"o0", 1), (b"o2", 0)]
    assert again.header["orderCountInfo"] == "0 qo0%0 1;0 qo0%2 0"
    for message in again.messages:
        assert (await ack(broker, "g", "ordered", again, message)).code == ResponseCode.SUCCESS
    last = await pop(broker, "g", "ordered", **more)
    assert [m.body for m in last.messages] == [b"o3"]
