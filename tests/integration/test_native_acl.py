"""RocketMQ's plain ACL over real sockets: an in-process broker role and name server with the ACL authorizer on,
driven by mqk's own RocketMQ client signing with an access key (mqk.server.native.acl). Allowed sends, pulls and
offset commits go through; a wrong secret, an unknown key, an unsigned request and an operation the ACLs do not
grant get NO_PERMISSION; name-server routes keep working; with the authorizer off nothing is checked. A message
viewed by id (VIEW_MESSAGE_BY_ID) needs READ on the topic it is stored in or DESCRIBE on the cluster, checked after
the signature and the lookup, and a refused viewer cannot tell a forbidden message from a missing one."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mqk.broker.internal import TRANSACTION_HALF_TOPIC
from mqk.broker.security.acls import AclBinding
from mqk.cli import main
from mqk.client import Admin, MessageQueue, Producer, PullConsumer
from mqk.client.remoting import ClientError
from mqk.config import BrokerConfig, StoreConfig
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.message import decode_message_id, decode_messages, encode_message_id
from mqk.server.native.namesrv import NameServer
from mqk.server.native.server import NativeServer
from mqk.store.manager import StoreManager

NO_PERMISSION = ResponseCode.NO_PERMISSION


def allow(principal: str, rtype: str, name: str, operation: str) -> AclBinding:
    return AclBinding(rtype, name, "LITERAL", principal, "*", operation, "ALLOW")


@contextlib.asynccontextmanager
async def acl_broker(data_dir: Path, authorizer: bool = True) -> AsyncIterator[tuple[str, NativeServer]]:
    config = BrokerConfig(
        native_listen=("127.0.0.1", 0),
        namesrv_listen=("127.0.0.1", 0),
        store=StoreConfig(storage="memory", data_dir=data_dir),
        authorizer=authorizer,
        super_users=("User:root",),
    )
    store = StoreManager(config.store)
    await store.start()
    broker = NativeServer(config, store)
    namesrv = NameServer(config, store, await broker.start())
    host, port = await namesrv.start()
    try:
        yield f"{host}:{port}", broker
    finally:
        await namesrv.stop()
        await broker.stop()
        await store.close()


@pytest.fixture
async def acl(tmp_path: Path) -> AsyncIterator[tuple[str, NativeServer]]:
    async with acl_broker(tmp_path) as parts:
        _namesrv, broker = parts
        security = broker.ctx.broker.security
        security.access_keys.set("alice", "alice-secret")
        security.access_keys.set("bob", "bob-secret")
        await broker.ctx.ensure_topic("orders", 2)
        await broker.ctx.ensure_topic("payments", 2)
        await security.acls.change(
            add=[
                allow("User:alice", "TOPIC", "orders", "WRITE"),
                allow("User:alice", "TOPIC", "orders", "READ"),
                allow("User:alice", "GROUP", "g", "READ"),
                allow("User:bob", "TOPIC", "orders", "READ"),
            ]
        )
        yield parts


def signed(client, key: str, secret: str):
    client.credentials = (key, secret)
    return client


async def test_an_allowed_user_sends_pulls_and_commits(acl) -> None:
    namesrv, _broker = acl
    async with signed(Producer(namesrv, "pg"), "alice", "alice-secret") as producer:
        result = await producer.send("orders", b"hello", queue_id=0)
    assert result is not None
    async with signed(PullConsumer(namesrv, "g"), "alice", "alice-secret") as consumer:
        mq = MessageQueue("orders", "mqk-broker-a", 0)
        pulled = await consumer.pull(mq, 0)
        assert [m.body for m in pulled.messages] == [b"hello"]
        await consumer.commit_offset(mq, 1)
        assert await consumer.committed_offset(mq) == 1


async def test_signed_requests_of_one_key_share_one_principal_and_its_cached_decisions(acl) -> None:
    namesrv, broker = acl
    authorizer = broker.ctx.broker.security.authorizer
    async with signed(Producer(namesrv, "pg"), "alice", "alice-secret") as producer:
        for i in range(50):
            await producer.send("orders", b"m%d" % i, queue_id=0)
    # 50 signed sends, one WRITE decision for alice: the authorizer caches decisions by the principal's identity,
    # so a principal made afresh for each request would add an entry per request
    alice_writes = [key for key in authorizer._cache if key[2:] == ("WRITE", "TOPIC", "orders")]
    assert len(alice_writes) == 1, alice_writes


async def test_a_wrong_secret_an_unknown_key_and_no_signature_get_no_permission(acl, caplog) -> None:
    namesrv, _broker = acl
    reasons = []
    for key, secret in (("alice", "wrong"), ("mallory", "whatever")):
        async with signed(Producer(namesrv, "pg"), key, secret) as producer:
            with pytest.raises(ClientError) as info:
                await producer.send("orders", b"x", queue_id=0)
        assert info.value.code == NO_PERMISSION, info.value
        reasons.append(str(info.value))
    assert "Check signature failed for accessKey=alice" in reasons[0] and "unknown AccessKey mallory" in reasons[1]
    async with Producer(namesrv, "pg") as producer:  # unsigned: the route comes, the send is refused
        for _ in range(20):
            with pytest.raises(ClientError) as info:
                await producer.send("orders", b"x", queue_id=0)
            assert info.value.code == NO_PERMISSION and "not signed" in str(info.value)
    # one line per address and key: the 19 unsigned sends after the first one are held back (a client retrying a
    # refused request is not a flood of log lines) and counted in that pair's next line
    lines = [r.getMessage() for r in caplog.records if "NO_PERMISSION" in r.getMessage()]
    assert len(lines) == 3, lines
    assert "Check signature failed for accessKey=alice" in lines[0] and "unknown AccessKey mallory" in lines[1]
    assert "not signed" in lines[2]


async def test_operations_the_acls_do_not_grant_get_no_permission(acl) -> None:
    namesrv, broker = acl
    async with signed(Producer(namesrv, "pg"), "alice", "alice-secret") as producer:
        with pytest.raises(ClientError) as info:
            await producer.send("payments", b"x", queue_id=0)  # no WRITE on payments
        assert info.value.code == NO_PERMISSION and "WRITE on TOPIC payments" in str(info.value)
        with pytest.raises(ClientError) as info:
            await producer.send("brand-new", b"x")  # would create a topic: no CREATE
        assert info.value.code == NO_PERMISSION
    assert broker.ctx.queue_count("brand-new") == 0
    # bob may READ the topic but not the group
    async with signed(PullConsumer(namesrv, "g"), "bob", "bob-secret") as consumer:
        with pytest.raises(ClientError) as info:
            await consumer.pull(MessageQueue("orders", "mqk-broker-a", 0), 0)
        assert info.value.code == NO_PERMISSION and "READ on GROUP g" in str(info.value)
    # a consumer heartbeat needs READ on its group
    beat = json.dumps({"clientID": "c1", "consumerDataSet": [{"groupName": "g"}], "producerDataSet": []}).encode()
    assert broker.address is not None
    for key, secret, code in (("bob", "bob-secret", NO_PERMISSION), ("alice", "alice-secret", ResponseCode.SUCCESS)):
        async with signed(PullConsumer(namesrv, "g"), key, secret) as consumer:
            answer = await consumer.invoke(
                broker.address, RequestCode.HEART_BEAT, {}, beat, ok=(ResponseCode.SUCCESS, NO_PERMISSION)
            )
        assert answer.code == code, (key, answer.remark)
    # admin: creating and deleting topics needs CREATE / DELETE
    async with signed(Producer(namesrv, "pg"), "alice", "alice-secret") as client:
        broker_addr = broker.address
        assert broker_addr is not None
        for code, ext in (
            (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "made", "readQueueNums": 1, "writeQueueNums": 1}),
            (RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "orders"}),
        ):
            answer = await client.invoke(broker_addr, code, ext, ok=(ResponseCode.SUCCESS, NO_PERMISSION))
            assert answer.code == NO_PERMISSION
    assert broker.ctx.queue_count("orders") == 2 and broker.ctx.queue_count("made") == 0


async def test_a_super_user_may_administer(acl) -> None:
    namesrv, broker = acl
    broker.ctx.broker.security.access_keys.set("root", "root-secret")
    async with signed(Producer(namesrv, "pg"), "root", "root-secret") as client:
        assert broker.address is not None
        await client.invoke(
            broker.address,
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": "made", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6},
        )
    assert broker.ctx.queue_count("made") == 1


async def test_without_the_authorizer_signatures_are_ignored(tmp_path: Path) -> None:
    async with acl_broker(tmp_path, authorizer=False) as (namesrv, broker):
        await broker.ctx.ensure_topic("orders", 1)
        async with signed(Producer(namesrv, "pg"), "nobody", "bad") as producer:
            assert await producer.send("orders", b"x", queue_id=0) is not None
        async with Producer(namesrv, "pg") as producer:
            assert await producer.send("orders", b"y", queue_id=0) is not None


async def test_the_cli_signs_native_produce_and_consume_with_an_access_key(acl, monkeypatch, capsys) -> None:
    namesrv, broker = acl
    monkeypatch.setenv("MQK_ROCKETMQ_SECRET_KEY", "alice-secret")
    monkeypatch.setattr("sys.stdin", io.StringIO("from the cli\n"))
    base = ["--protocol", "native", "--namesrv", namesrv, "--topic", "orders"]
    assert await asyncio.to_thread(main, ["produce", *base, "--access-key", "alice"]) == 0
    consume = ["consume", *base, "--group", "g", "--timeout", "1", "--max-messages", "1"]
    assert await asyncio.to_thread(main, [*consume, "--access-key", "alice"]) == 0
    assert "from the cli" in capsys.readouterr().out
    # unsigned: refused (exit 1), nothing more written
    monkeypatch.setattr("sys.stdin", io.StringIO("unsigned\n"))
    assert await asyncio.to_thread(main, ["produce", *base]) == 1
    assert "code 16" in capsys.readouterr().err
    total = sum(broker.ctx.store.end_offset("orders", q) for q in (0, 1))
    assert total == 1


async def test_pop_acks_and_batch_acks_need_read_on_the_topic_and_the_group(acl) -> None:
    namesrv, broker = acl
    assert broker.address is not None
    pop = {"consumerGroup": "g", "topic": "orders", "queueId": -1, "maxMsgNums": 1, "invisibleTime": 1000}
    pop.update(pollTime=0, bornTime=0, initMode=0)
    ack = {"consumerGroup": "g", "topic": "orders", "queueId": 0, "extraInfo": "0 1 1000 0 0 b 0 0", "offset": 0}
    batch = json.dumps({"acks": [{"c": "g", "t": "orders", "r": "0", "so": 0, "q": 0, "pt": 1, "b": "AQ=="}]})
    for key, secret, allowed in (("bob", "bob-secret", False), ("alice", "alice-secret", True)):
        async with signed(PullConsumer(namesrv, "g"), key, secret) as client:
            for code, ext, body in (
                (RequestCode.POP_MESSAGE, pop, None),
                (RequestCode.ACK_MESSAGE, ack, None),
                (RequestCode.CHANGE_MESSAGE_INVISIBLETIME, {**ack, "invisibleTime": 1000}, None),
                (RequestCode.BATCH_ACK_MESSAGE, {}, batch.encode()),
                (RequestCode.NOTIFICATION, {**pop, "pollTime": 0}, None),
            ):
                answer = await client.invoke(broker.address, code, ext, body, ok=tuple(ResponseCode))
                assert (answer.code != NO_PERMISSION) == allowed, (key, code, answer.remark)
                if not allowed:
                    assert "READ on GROUP g" in (answer.remark or ""), answer.remark


async def test_a_subscription_group_config_needs_alter_configs_on_the_group(acl) -> None:
    namesrv, broker = acl
    assert broker.address is not None
    body = json.dumps({"groupName": "g", "consumeMessageOrderly": True}).encode()
    for key, secret, code in (("alice", "alice-secret", NO_PERMISSION), ("root", "root-secret", ResponseCode.SUCCESS)):
        broker.ctx.broker.security.access_keys.set("root", "root-secret")
        async with signed(PullConsumer(namesrv, "g"), key, secret) as client:
            answer = await client.invoke(
                broker.address, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body, ok=tuple(ResponseCode)
            )
        assert answer.code == code, (key, answer.remark)
    assert broker.pop.share.orderly("g")


async def _view(
    namesrv: str, broker: NativeServer, key: str | None, offset: int, secret: str | None = None
) -> RemotingCommand:
    """VIEW_MESSAGE_BY_ID of `offset`, signed by access key `key` with `secret` (default: the fixtures' `<key>-secret`;
    `key` None: unsigned)."""
    assert broker.address is not None
    async with Admin(namesrv) as admin:
        if key is not None:
            signed(admin, key, secret or f"{key}-secret")
        return await admin.invoke(
            broker.address, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset}, ok=tuple(ResponseCode)
        )


@pytest.fixture
async def viewed(acl) -> AsyncIterator[tuple[str, NativeServer, dict[str, int]]]:
    """The ACL broker with one message in `orders` (sent by alice), one in `payments` (sent by root), carol allowed
    DESCRIBE on the cluster, dave allowed nothing; and the commit-log offsets of the messages by topic."""
    namesrv, broker = acl
    security = broker.ctx.broker.security
    for key in ("root", "carol", "dave"):
        security.access_keys.set(key, f"{key}-secret")
    await security.acls.change(add=[allow("User:carol", "CLUSTER", "kafka-cluster", "DESCRIBE")])
    offsets = {}
    for key, topic in (("alice", "orders"), ("root", "payments")):
        async with signed(Producer(namesrv, "pg"), key, f"{key}-secret") as producer:
            sent = await producer.send(topic, f"in {topic}".encode(), queue_id=0)
        assert sent is not None
        offsets[topic] = decode_message_id(sent.offset_msg_id)[2]
    yield namesrv, broker, offsets


async def test_read_on_a_topic_views_its_messages_by_id_and_no_others(viewed) -> None:
    namesrv, broker, offsets = viewed
    for key in ("alice", "bob"):  # bob may READ orders and nothing else (no group, no WRITE): enough
        answer = await _view(namesrv, broker, key, offsets["orders"])
        assert answer.code == ResponseCode.SUCCESS, (key, answer.remark)
        (msg,) = decode_messages(answer.body or b"")
        assert (msg.topic, msg.body) == ("orders", b"in orders")
    async with signed(Admin(namesrv), "alice", "alice-secret") as admin:  # the client call users make
        assert broker.address is not None
        found = await admin.view_message(encode_message_id(*broker.address, offsets["orders"]))
        assert found.body == b"in orders"
    for key, topic in (("alice", "payments"), ("bob", "payments"), ("dave", "orders"), ("dave", "payments")):
        answer = await _view(namesrv, broker, key, offsets[topic])
        assert answer.code == NO_PERMISSION, (key, topic, answer.remark)
        assert b"in " not in (answer.body or b"") and topic not in (answer.remark or ""), answer.remark


async def test_a_refused_viewer_cannot_tell_a_forbidden_message_from_a_missing_one(viewed, caplog) -> None:
    namesrv, broker, offsets = viewed
    missing = offsets["payments"] + 1_000_000
    for key in ("alice", "dave"):
        forbidden = await _view(namesrv, broker, key, offsets["payments"])
        absent = await _view(namesrv, broker, key, missing)
        assert forbidden.code == absent.code == NO_PERMISSION
        assert (forbidden.remark or "").replace(str(offsets["payments"]), "N") == (absent.remark or "").replace(
            str(missing), "N"
        )
    # the operator's log says which it was (one line per address, key and request code per interval: alice's and
    # dave's first refusals)
    lines = [r.getMessage() for r in caplog.records if "NO_PERMISSION for request code 33" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "User:alice is not allowed READ on TOPIC payments" in lines[0]
    assert "AccessKey dave" in lines[1] and "READ on TOPIC payments" in lines[1]


async def test_the_signature_is_checked_before_the_message_is_looked_up(viewed, monkeypatch) -> None:
    namesrv, broker, offsets = viewed
    looked_up: list[int] = []
    resolve = broker.ctx.resolve

    async def counting(offset: int, topics=None):
        looked_up.append(offset)
        return await resolve(offset, topics)

    monkeypatch.setattr(broker.ctx, "resolve", counting)
    for key, secret in ((None, None), ("alice", "wrong"), ("mallory", "mallory-secret")):
        answer = await _view(namesrv, broker, key, offsets["orders"], secret)
        assert answer.code == NO_PERMISSION, (key, answer.remark)
        assert "offset" not in (answer.remark or ""), answer.remark  # refused for the signature alone
    assert looked_up == []
    assert (await _view(namesrv, broker, "alice", offsets["orders"])).code == ResponseCode.SUCCESS
    assert looked_up == [offsets["orders"]]


async def test_a_super_user_and_describe_on_the_cluster_view_any_message(viewed) -> None:
    namesrv, broker, offsets = viewed
    for key in ("root", "carol"):
        for topic in ("orders", "payments"):
            answer = await _view(namesrv, broker, key, offsets[topic])
            assert answer.code == ResponseCode.SUCCESS, (key, topic, answer.remark)
            assert decode_messages(answer.body or b"")[0].topic == topic
        # they may see any message, so they are told when an offset names none (RocketMQ's answer)
        answer = await _view(namesrv, broker, key, offsets["payments"] + 1_000_000)
        assert answer.code == ResponseCode.SYSTEM_ERROR and "can not find message" in (answer.remark or "")


async def test_a_message_is_authorized_on_the_topic_it_is_stored_in(viewed) -> None:
    namesrv, broker, _offsets = viewed
    # a group's retry topic stands for the group: READ on group g (alice), not on a topic (bob may READ orders)
    await broker.ctx.ensure_topic("%RETRY%g", 1)
    ids, _ = await broker.send.append("%RETRY%g", 0, [(b"again", {}, 0)], 0, 1, ("127.0.0.1", 1))
    retry = decode_message_id(ids[0])[2]
    assert (await _view(namesrv, broker, "alice", retry)).code == ResponseCode.SUCCESS
    assert (await _view(namesrv, broker, "bob", retry)).code == NO_PERMISSION
    # a transaction's half message sits in an internal topic until it is committed: READ on the topic it is bound
    # for does not show it (a pull of that topic does not either); the super user sees it where it is
    _, half_id = await broker.transactions.store_half("orders", 0, b"half", {}, 0, 0, ("127.0.0.1", 1))
    half = decode_message_id(half_id)[2]
    assert (await _view(namesrv, broker, "alice", half)).code == NO_PERMISSION
    answer = await _view(namesrv, broker, "root", half)
    assert answer.code == ResponseCode.SUCCESS
    assert decode_messages(answer.body or b"")[0].topic == TRANSACTION_HALF_TOPIC
