"""RocketMQ 5's MessagingService on the wire: raw protobuf requests over a real gRPC channel to a broker's
`grpc_listen` (mqk.server.rocketmq5), each test with a broker of its own. Routes (a new topic created, an invalid name
refused, nothing without auto-creation), a send received and acknowledged once (a second acknowledgement and a
malformed receipt handle refused), the refusals of a send (an internal topic, an empty body, a body over the broker's
limit, a tag with a bar) and of a receive (SQL filters, illegal invisible durations, too large a batch, no group), a
message made visible again by changing its invisible duration to zero or kept held by a longer one, a tag filter's
refused message done for the group, transactional messages committed and rolled back, delayed messages, a long poll
woken by a send, a terminating client's messages released, dead letters (forwarded, and at the delivery limit), the
Telemetry settings handshake, garbage on the port, and the refusal of RocketMQ's system topics and mqk's internal ones.
The official SDK against the front door: compat/test_rocketmq5_clients.py; the message conversions alone:
tests/unit/test_rocketmq5_messages.py."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
import pytest
from helpers import wait_until
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as pbs
from rocketmq.grpc_protocol import service_pb2_grpc as pbs_grpc

from mqk.broker.internal import AUTO_CREATE_KEY, TRANSACTION_HALF_TOPIC
from mqk.testing import ThreadedBroker, broker_config
from mqk.timer import TIMER_TOPIC

pytestmark = pytest.mark.timeout(60)

Code = pb.Code
#: every call's deadline (a call the broker never answers fails the test instead of hanging it)
CALL_TIMEOUT_S = 10.0
CLIENT_ID = "wire-test-client"


@pytest.fixture
def start_broker() -> Iterator[Callable[..., ThreadedBroker]]:
    """Start a broker with a gRPC listener and these config changes; each one started is stopped after the test."""
    started: list[ThreadedBroker] = []

    def start(**changes: Any) -> ThreadedBroker:
        config = dataclasses.replace(broker_config(), grpc_listen=("127.0.0.1", 0), **changes)
        broker = ThreadedBroker(config).start()
        started.append(broker)
        return broker

    try:
        yield start
    finally:
        for broker in started:
            broker.stop()


@pytest.fixture
def broker(start_broker: Callable[..., ThreadedBroker]) -> ThreadedBroker:
    return start_broker()


class Client:
    """Raw MessagingService calls over one gRPC channel, each with a deadline."""

    def __init__(self, broker: ThreadedBroker, client_id: str = CLIENT_ID, own_connection: bool = False) -> None:
        """`own_connection`: a TCP connection of its own (channels to one address otherwise share one)."""
        address = broker.grpc_address
        assert address is not None
        options = [("grpc.use_local_subchannel_pool", 1)] if own_connection else []
        self.channel = grpc.insecure_channel(f"{address[0]}:{address[1]}", options=options)
        self.stub = pbs_grpc.MessagingServiceStub(self.channel)
        self.metadata = (("x-mq-client-id", client_id),)

    def close(self) -> None:
        self.channel.close()

    def query_route(self, topic: str) -> Any:
        request = pbs.QueryRouteRequest()
        request.topic.name = topic
        return self.stub.QueryRoute(request, timeout=CALL_TIMEOUT_S, metadata=self.metadata)

    def send(
        self,
        topic: str,
        body: bytes,
        *,
        tag: str = "",
        keys: Sequence[str] = (),
        properties: dict[str, str] | None = None,
        message_id: str = "",
        message_type: int = pb.MessageType.NORMAL,
    ) -> Any:
        message = pb.Message(body=body)
        message.topic.name = topic
        message.user_properties.update(properties or {})
        sp = message.system_properties
        sp.tag = tag
        sp.keys.extend(keys)
        sp.message_id = message_id
        sp.message_type = message_type
        sp.body_encoding = pb.Encoding.IDENTITY
        request = pbs.SendMessageRequest(messages=[message])
        return self.stub.SendMessage(request, timeout=CALL_TIMEOUT_S, metadata=self.metadata)

    def receive(
        self,
        topic: str,
        group: str = "G",
        *,
        batch_size: int = 16,
        invisible_ms: int | None = 5_000,
        expression: str = "*",
        filter_type: int = pb.FilterType.TAG,
        long_polling_ms: int | None = None,
    ) -> list[Any]:
        """Every response of one ReceiveMessage stream."""
        request = pbs.ReceiveMessageRequest(batch_size=batch_size)
        request.group.name = group
        request.message_queue.topic.name = topic
        request.message_queue.id = -1
        request.filter_expression.type = filter_type
        request.filter_expression.expression = expression
        if invisible_ms is not None:
            request.invisible_duration.seconds, millis = divmod(invisible_ms, 1000)
            request.invisible_duration.nanos = millis * 1_000_000
        if long_polling_ms is not None:
            request.long_polling_timeout.seconds, millis = divmod(long_polling_ms, 1000)
            request.long_polling_timeout.nanos = millis * 1_000_000
        return list(self.stub.ReceiveMessage(request, timeout=CALL_TIMEOUT_S, metadata=self.metadata))

    def ack(self, topic: str, handle: str, group: str = "G", message_id: str = "") -> Any:
        request = pbs.AckMessageRequest()
        request.group.name = group
        request.topic.name = topic
        request.entries.add(message_id=message_id, receipt_handle=handle)
        return self.stub.AckMessage(request, timeout=CALL_TIMEOUT_S, metadata=self.metadata)

    def change_invisible(self, topic: str, handle: str, invisible_ms: int, group: str = "G") -> Any:
        request = pbs.ChangeInvisibleDurationRequest(receipt_handle=handle)
        request.group.name = group
        request.topic.name = topic
        request.invisible_duration.seconds, millis = divmod(invisible_ms, 1000)
        request.invisible_duration.nanos = millis * 1_000_000
        return self.stub.ChangeInvisibleDuration(request, timeout=CALL_TIMEOUT_S, metadata=self.metadata)

    def end_transaction(self, topic: str, message_id: str, transaction_id: str, resolution: int) -> Any:
        request = pbs.EndTransactionRequest(
            message_id=message_id,
            transaction_id=transaction_id,
            resolution=resolution,
            source=pb.TransactionSource.SOURCE_CLIENT,
        )
        request.topic.name = topic
        return self.stub.EndTransaction(request, timeout=CALL_TIMEOUT_S, metadata=self.metadata)

    def telemetry(self, *commands: Any) -> list[Any]:
        """Every command the broker sends back on a Telemetry stream that sends `commands` and then ends."""
        return list(self.stub.Telemetry(iter(commands), timeout=CALL_TIMEOUT_S, metadata=self.metadata))


@pytest.fixture
def client(broker: ThreadedBroker) -> Iterator[Client]:
    c = Client(broker)
    try:
        yield c
    finally:
        c.close()


def code_name(code: int) -> str:
    return str(Code.Name(code))


def messages_of(responses: list[Any]) -> list[Any]:
    """The messages of a receive's stream, checking its shape: a status (OK), then the delivery time, then one
    response per message."""
    kinds = [r.WhichOneof("content") for r in responses]
    assert len(responses) >= 3 and kinds[:2] == ["status", "delivery_timestamp"], kinds
    assert responses[0].status.code == Code.OK, responses[0].status
    delivered_ms = responses[1].delivery_timestamp.seconds * 1000 + responses[1].delivery_timestamp.nanos // 10**6
    assert abs(delivered_ms - time.time() * 1000) < 60_000  # (an epoch time, not a monotonic one)
    assert kinds[2:] == ["message"] * (len(responses) - 2), kinds
    return [r.message for r in responses[2:]]


def refusal_of(responses: list[Any]) -> str:
    """The code of a receive answered with one status and nothing else."""
    assert len(responses) == 1 and responses[0].WhichOneof("content") == "status", responses
    return code_name(responses[0].status.code)


def sent_ok(answer: Any) -> Any:
    assert code_name(answer.status.code) == "OK", answer.status
    assert len(answer.entries) == 1 and code_name(answer.entries[0].status.code) == "OK", answer
    return answer.entries[0]


# --- routes ---------------------------------------------------------------------------------------------------


def test_query_route_creates_a_new_topic_and_lists_its_queues(start_broker: Callable[..., ThreadedBroker]) -> None:
    broker = start_broker(num_partitions=3)
    client = Client(broker)
    try:
        assert broker.store.topic("fresh-topic") is None
        answer = client.query_route("fresh-topic")
        assert code_name(answer.status.code) == "OK", answer.status
        info = broker.store.topic("fresh-topic")
        assert info is not None and info.queue_count == 3  # created by the route query
        assert [mq.id for mq in answer.message_queues] == [0, 1, 2]
        host, port = broker.grpc_address  # type: ignore[misc]
        for mq in answer.message_queues:
            assert mq.topic.name == "fresh-topic"
            assert mq.permission == pb.Permission.READ_WRITE
            assert mq.broker.name == broker.config.broker_name and mq.broker.id == 0
            assert mq.broker.endpoints.scheme == pb.AddressScheme.IPv4
            assert [(a.host, a.port) for a in mq.broker.endpoints.addresses] == [(host, port)]
            assert {pb.MessageType.NORMAL, pb.MessageType.FIFO, pb.MessageType.DELAY} <= set(mq.accept_message_types)
        again = client.query_route("fresh-topic")  # the topic is there now: the same route
        assert code_name(again.status.code) == "OK" and list(again.message_queues) == list(answer.message_queues)
    finally:
        client.close()


@pytest.mark.parametrize("name", ["bad topic", "bad/topic", "", "naïve"])
def test_query_route_of_an_invalid_topic_name_is_refused(broker: ThreadedBroker, client: Client, name: str) -> None:
    answer = client.query_route(name)
    assert code_name(answer.status.code) == "ILLEGAL_TOPIC", answer.status
    assert list(answer.message_queues) == []
    assert broker.store.topic(name) is None


# --- sending, receiving, acknowledging ------------------------------------------------------------------------


def test_a_sent_message_is_received_and_acknowledged_once(client: Client) -> None:
    entry = sent_ok(
        client.send(
            "orders", b"hello", tag="TagA", keys=["k1", "k2"], properties={"color": "blue"}, message_id="MID-0001"
        )
    )
    assert entry.message_id == "MID-0001" and entry.offset == 0
    (message,) = messages_of(client.receive("orders", batch_size=8, invisible_ms=5_000))
    sp = message.system_properties
    assert message.topic.name == "orders" and message.body == b"hello"
    assert sp.tag == "TagA" and list(sp.keys) == ["k1", "k2"]
    assert dict(message.user_properties) == {"color": "blue"}
    assert sp.message_id == "MID-0001"
    assert sp.message_type == pb.MessageType.NORMAL
    assert sp.delivery_attempt == 1 and sp.queue_id == 0 and sp.queue_offset == 0
    assert (sp.invisible_duration.seconds, sp.invisible_duration.nanos) == (5, 0)
    assert sp.receipt_handle
    acked = client.ack("orders", sp.receipt_handle, message_id=sp.message_id)
    assert code_name(acked.status.code) == "OK", acked.status
    assert [code_name(e.status.code) for e in acked.entries] == ["OK"]
    assert acked.entries[0].receipt_handle == sp.receipt_handle and acked.entries[0].message_id == "MID-0001"
    again = client.ack("orders", sp.receipt_handle, message_id=sp.message_id)
    assert code_name(again.status.code) == "INVALID_RECEIPT_HANDLE", again.status
    assert [code_name(e.status.code) for e in again.entries] == ["INVALID_RECEIPT_HANDLE"]
    assert refusal_of(client.receive("orders", invisible_ms=5_000)) == "MESSAGE_NOT_FOUND"
    assert refusal_of(client.receive("orders", invisible_ms=5_000, long_polling_ms=0)) == "MESSAGE_NOT_FOUND"


def test_a_malformed_receipt_handle_is_refused(client: Client) -> None:
    sent_ok(client.send("orders", b"x"))
    messages_of(client.receive("orders"))  # the group exists and holds the message
    for handle in ("", "not-a-handle", "m1:0:0:0:" + CLIENT_ID, "m9:0:0:1:" + CLIENT_ID, "m1:0:-1:1:x"):
        acked = client.ack("orders", handle)
        assert code_name(acked.status.code) == "INVALID_RECEIPT_HANDLE", (handle, acked.status)
        changed = client.change_invisible("orders", handle, 1_000)
        assert code_name(changed.status.code) == "INVALID_RECEIPT_HANDLE", (handle, changed.status)
    # well formed, but naming what the group does not hold: another member, a later delivery, another offset or
    # queue, another group
    for handle, group in [
        ("m1:0:0:1:someone-else", "G"),
        ("m1:0:0:2:" + CLIENT_ID, "G"),
        ("m1:0:7:1:" + CLIENT_ID, "G"),
        ("m1:5:0:1:" + CLIENT_ID, "G"),
        ("m1:0:0:1:" + CLIENT_ID, "other-group"),
    ]:
        acked = client.ack("orders", handle, group=group)
        assert code_name(acked.status.code) == "INVALID_RECEIPT_HANDLE", (handle, group, acked.status)
        changed = client.change_invisible("orders", handle, 1_000, group=group)
        assert code_name(changed.status.code) == "INVALID_RECEIPT_HANDLE", (handle, group, changed.status)
    # the right one still settles it
    assert code_name(client.ack("orders", "m1:0:0:1:" + CLIENT_ID).status.code) == "OK"


@pytest.mark.parametrize(
    "name", ["__consumer_offsets", "__share_group_state", TRANSACTION_HALF_TOPIC, TIMER_TOPIC, "SCHEDULE_TOPIC_XXXX"]
)
def test_a_send_to_an_internal_topic_is_forbidden(broker: ThreadedBroker, client: Client, name: str) -> None:
    existed = broker.store.topic(name) is not None
    answer = client.send(name, b"x")
    assert code_name(answer.status.code) == "FORBIDDEN", answer.status
    assert [code_name(e.status.code) for e in answer.entries] == ["FORBIDDEN"]
    assert (broker.store.topic(name) is not None) == existed


def test_a_send_with_an_empty_body_is_refused(broker: ThreadedBroker, client: Client) -> None:
    answer = client.send("orders", b"")
    assert code_name(answer.status.code) == "MESSAGE_BODY_EMPTY", answer.status
    assert [code_name(e.status.code) for e in answer.entries] == ["MESSAGE_BODY_EMPTY"]
    assert broker.store.topic("orders") is None  # nothing stored, not even the topic made


def test_a_body_over_the_brokers_limit_is_refused(start_broker: Callable[..., ThreadedBroker]) -> None:
    broker = start_broker(native_max_message_size=1024)
    client = Client(broker)
    try:
        answer = client.send("orders", b"x" * 1025)
        assert code_name(answer.status.code) == "MESSAGE_BODY_TOO_LARGE", answer.status
        assert [code_name(e.status.code) for e in answer.entries] == ["MESSAGE_BODY_TOO_LARGE"]
        sent_ok(client.send("orders", b"y" * 1024))  # the limit itself is allowed
        (message,) = messages_of(client.receive("orders"))
        assert message.body == b"y" * 1024
    finally:
        client.close()


def test_a_tag_with_a_bar_is_refused(client: Client) -> None:
    answer = client.send("orders", b"x", tag="a|b")
    assert code_name(answer.status.code) == "ILLEGAL_MESSAGE_TAG", answer.status


# --- transactions ---------------------------------------------------------------------------------------------


def test_a_transactional_message_is_delivered_once_committed(client: Client) -> None:
    entry = sent_ok(client.send("orders", b"in-tx", message_id="TX-1", message_type=pb.MessageType.TRANSACTION))
    assert entry.message_id == "TX-1" and entry.transaction_id
    assert refusal_of(client.receive("orders")) == "MESSAGE_NOT_FOUND"  # a half message is not delivered
    commit = pb.TransactionResolution.COMMIT
    wrong = client.end_transaction("orders", "TX-1", "no-such-transaction", commit)
    assert code_name(wrong.status.code) == "INVALID_TRANSACTION_ID", wrong.status
    other_topic = client.end_transaction("payments", "TX-1", entry.transaction_id, commit)
    assert code_name(other_topic.status.code) == "INVALID_TRANSACTION_ID", other_topic.status
    other_message = client.end_transaction("orders", "TX-2", entry.transaction_id, commit)
    assert code_name(other_message.status.code) == "INVALID_TRANSACTION_ID", other_message.status
    assert refusal_of(client.receive("orders")) == "MESSAGE_NOT_FOUND"  # none of those committed it
    ended = client.end_transaction("orders", "TX-1", entry.transaction_id, commit)
    assert code_name(ended.status.code) == "OK", ended.status
    (message,) = messages_of(client.receive("orders", long_polling_ms=5_000))
    assert message.body == b"in-tx" and message.system_properties.message_id == "TX-1"
    assert code_name(client.ack("orders", message.system_properties.receipt_handle).status.code) == "OK"
    # committing it again does not deliver it again
    client.end_transaction("orders", "TX-1", entry.transaction_id, commit)
    assert refusal_of(client.receive("orders")) == "MESSAGE_NOT_FOUND"


def test_a_rolled_back_transactional_message_is_never_delivered(client: Client) -> None:
    entry = sent_ok(client.send("orders", b"undone", message_id="TX-9", message_type=pb.MessageType.TRANSACTION))
    ended = client.end_transaction("orders", "TX-9", entry.transaction_id, pb.TransactionResolution.ROLLBACK)
    assert code_name(ended.status.code) == "OK", ended.status
    sent_ok(client.send("orders", b"after"))
    (message,) = messages_of(client.receive("orders", long_polling_ms=5_000))
    assert message.body == b"after"


# --- receive refusals -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"filter_type": pb.FilterType.SQL, "expression": "a > 1"}, "ILLEGAL_FILTER_EXPRESSION"),
        ({"expression": "||"}, "ILLEGAL_FILTER_EXPRESSION"),
        ({"invisible_ms": 100}, "ILLEGAL_INVISIBLE_TIME"),
        ({"invisible_ms": 13 * 3600 * 1000}, "ILLEGAL_INVISIBLE_TIME"),
        ({"batch_size": 5000}, "BAD_REQUEST"),
        ({"group": ""}, "ILLEGAL_CONSUMER_GROUP"),
        ({"group": "bad group"}, "ILLEGAL_CONSUMER_GROUP"),
        ({"topic": "no-such-topic"}, "TOPIC_NOT_FOUND"),
    ],
)
def test_a_receive_with_bad_arguments_is_refused(client: Client, changes: dict[str, Any], expected: str) -> None:
    sent_ok(client.send("orders", b"x"))
    arguments: dict[str, Any] = {"topic": "orders", **changes}
    assert refusal_of(client.receive(**arguments)) == expected
    # the refused receive took nothing: the group's first delivery of the message is still to come
    (message,) = messages_of(client.receive("orders"))
    assert message.system_properties.delivery_attempt == 1


# --- invisible durations --------------------------------------------------------------------------------------


def test_changing_the_invisible_duration_to_zero_makes_the_message_visible_at_once(client: Client) -> None:
    sent_ok(client.send("orders", b"again"))
    (first,) = messages_of(client.receive("orders", invisible_ms=5_000))
    old = first.system_properties.receipt_handle
    assert first.system_properties.delivery_attempt == 1
    assert refusal_of(client.receive("orders", invisible_ms=5_000)) == "MESSAGE_NOT_FOUND"  # invisible meanwhile
    changed = client.change_invisible("orders", old, 0)
    assert code_name(changed.status.code) == "OK", changed.status
    assert changed.receipt_handle
    (second,) = messages_of(client.receive("orders", invisible_ms=5_000))
    new = second.system_properties.receipt_handle
    assert second.body == b"again" and second.system_properties.delivery_attempt == 2
    assert new and new != old
    # the first delivery's handle (and the one the change answered with) are spent
    for spent in {old, changed.receipt_handle}:
        assert code_name(client.ack("orders", spent).status.code) == "INVALID_RECEIPT_HANDLE"
        assert code_name(client.change_invisible("orders", spent, 1_000).status.code) == "INVALID_RECEIPT_HANDLE"
    assert code_name(client.ack("orders", new).status.code) == "OK"
    assert refusal_of(client.receive("orders")) == "MESSAGE_NOT_FOUND"


def test_changing_the_invisible_duration_keeps_the_message_held(client: Client) -> None:
    sent_ok(client.send("orders", b"held"))
    (first,) = messages_of(client.receive("orders", invisible_ms=1_000))
    handle = first.system_properties.receipt_handle
    changed = client.change_invisible("orders", handle, 60_000)
    assert code_name(changed.status.code) == "OK", changed.status
    # its first lock (1 s) would have ended within this long poll; the new one (60 s) does not
    assert refusal_of(client.receive("orders", long_polling_ms=2_500)) == "MESSAGE_NOT_FOUND"
    assert code_name(client.ack("orders", changed.receipt_handle).status.code) == "OK"


def test_a_change_to_an_illegal_invisible_duration_is_refused(client: Client) -> None:
    sent_ok(client.send("orders", b"x"))
    (message,) = messages_of(client.receive("orders"))
    changed = client.change_invisible("orders", message.system_properties.receipt_handle, 13 * 3600 * 1000)
    assert code_name(changed.status.code) == "ILLEGAL_INVISIBLE_TIME", changed.status
    assert code_name(client.ack("orders", message.system_properties.receipt_handle).status.code) == "OK"


# --- tag filters ----------------------------------------------------------------------------------------------


def test_a_message_a_tag_filter_refuses_is_done_for_the_group(client: Client) -> None:
    sent_ok(client.send("orders", b"tagged-b", tag="b"))
    sent_ok(client.send("orders", b"tagged-a", tag="a"))
    (got,) = messages_of(client.receive("orders", expression="a"))
    assert got.body == b"tagged-a" and got.system_properties.tag == "a"
    assert code_name(client.ack("orders", got.system_properties.receipt_handle).status.code) == "OK"
    sent_ok(client.send("orders", b"tagged-c", tag="c"))
    # the group now takes every tag, but its "b" message was passed over: only what came after is delivered
    (later,) = messages_of(client.receive("orders", expression="*"))
    assert later.body == b"tagged-c"
    assert code_name(client.ack("orders", later.system_properties.receipt_handle).status.code) == "OK"
    assert refusal_of(client.receive("orders", expression="*")) == "MESSAGE_NOT_FOUND"
    # another group has its own view: it gets all three
    bodies = sorted(m.body for m in messages_of(client.receive("orders", group="G2", expression="*")))
    assert bodies == [b"tagged-a", b"tagged-b", b"tagged-c"]


def test_a_tag_filter_with_alternatives(client: Client) -> None:
    for tag in ("a", "b", "c"):
        sent_ok(client.send("orders", tag.encode(), tag=tag))
    got = messages_of(client.receive("orders", expression=" a || c "))
    assert sorted(m.body for m in got) == [b"a", b"c"]


# --- telemetry ------------------------------------------------------------------------------------------------


def test_telemetry_answers_a_producers_settings_with_the_brokers_body_limit(
    start_broker: Callable[..., ThreadedBroker],
) -> None:
    broker = start_broker(native_max_message_size=12_345)
    client = Client(broker)
    try:
        settings = pb.Settings(client_type=pb.ClientType.PRODUCER)
        settings.publishing.topics.add(name="orders")
        answers = client.telemetry(pbs.TelemetryCommand(settings=settings))
        assert len(answers) == 1 and answers[0].WhichOneof("command") == "settings", answers
        assert code_name(answers[0].status.code) == "OK"
        got = answers[0].settings
        assert got.client_type == pb.ClientType.PRODUCER
        assert got.publishing.max_body_size == 12_345
        assert [t.name for t in got.publishing.topics] == ["orders"]
        assert got.backoff_policy.max_attempts >= 1
    finally:
        client.close()


def test_telemetry_answers_a_simple_consumers_settings_with_the_groups_delivery_limit(
    start_broker: Callable[..., ThreadedBroker],
) -> None:
    broker = start_broker(group_share_delivery_count_limit=3)
    client = Client(broker)
    try:
        settings = pb.Settings(client_type=pb.ClientType.SIMPLE_CONSUMER)
        settings.subscription.group.name = "G"
        settings.subscription.subscriptions.add().topic.name = "orders"
        answers = client.telemetry(pbs.TelemetryCommand(settings=settings))
        assert len(answers) == 1 and answers[0].WhichOneof("command") == "settings", answers
        assert code_name(answers[0].status.code) == "OK"
        got = answers[0].settings
        assert got.client_type == pb.ClientType.SIMPLE_CONSUMER
        assert got.backoff_policy.max_attempts == 3
        assert got.subscription.group.name == "G"
        assert [s.topic.name for s in got.subscription.subscriptions] == ["orders"]
    finally:
        client.close()


def test_a_group_whose_subscription_config_disables_consumption_receives_nothing(
    broker: ThreadedBroker, client: Client
) -> None:
    """`mqadmin updateSubGroup` with consumeEnable false (over remoting) pauses the group's gRPC receives too."""
    from mqk.client.remoting import RemotingConnection
    from mqk.protocol.native.codes import RequestCode
    from mqk.protocol.native.command import RemotingCommand

    async def configure(enabled: bool) -> int:
        conn = RemotingConnection(broker.native_address)
        await conn.connect()
        try:
            body = json.dumps({"groupName": "PAUSED", "consumeEnable": enabled}).encode()
            answer = await conn.invoke(
                RemotingCommand(code=RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body), timeout=10
            )
            return int(answer.code)
        finally:
            await conn.close()

    sent_ok(client.send("orders", b"held back"))
    assert broker.call(configure(False)) == 0
    assert refusal_of(client.receive("orders", group="PAUSED")) == "FORBIDDEN"
    assert broker.call(configure(True)) == 0
    assert [m.body for m in messages_of(client.receive("orders", group="PAUSED"))] == [b"held back"]


# --- garbage --------------------------------------------------------------------------------------------------


def test_garbage_on_the_grpc_port_closes_the_connection(broker: ThreadedBroker, client: Client) -> None:
    address = broker.grpc_address
    assert address is not None
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(b"\x00\xffthis is not HTTP/2 at all\r\n\r\n" + bytes(range(256)) * 4)
        wait_closed_by_server(sock)
    answer = client.query_route("still-serving")
    assert code_name(answer.status.code) == "OK" and len(answer.message_queues) == 1


def wait_closed_by_server(sock: socket.socket, seconds: float = 10) -> None:
    """Read until the server closes the connection (it may say why first: an HTTP/2 GOAWAY); bounded."""
    sock.settimeout(1.0)
    deadline = time.monotonic() + seconds
    received = b""
    while True:
        assert time.monotonic() < deadline, f"the connection is still open after {received!r}"
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        if not chunk:
            return
        received += chunk


def test_an_idle_grpc_connection_is_closed_after_the_brokers_idle_limit(
    start_broker: Callable[..., ThreadedBroker],
) -> None:
    broker = start_broker(connections_max_idle_ms=300)
    address = broker.grpc_address
    assert address is not None
    with socket.create_connection(address, timeout=5) as sock:
        # a well-formed HTTP/2 start (the client preface and an empty SETTINGS frame), then silence
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        wait_closed_by_server(sock)
    client = Client(broker)
    try:
        assert code_name(client.query_route("after-idle").status.code) == "OK"  # (a new connection is served)
    finally:
        client.close()


def test_grpc_connections_past_the_brokers_max_connections_are_closed(
    start_broker: Callable[..., ThreadedBroker],
) -> None:
    broker = start_broker(max_connections=2)
    clients = [Client(broker, f"capped-{i}", own_connection=True) for i in range(3)]
    try:
        for client in clients[:2]:
            assert code_name(client.query_route("capped").status.code) == "OK"
        with pytest.raises(grpc.RpcError) as refused:  # the third connection is closed before it is served
            clients[2].stub.QueryRoute(pbs.QueryRouteRequest(), timeout=3, metadata=clients[2].metadata)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        clients[0].close()

        # once one closes, a new connection is served: once the server has seen the close (asked again, on a new
        # connection each time, until it has)
        def served() -> bool:
            late = Client(broker, "capped-late", own_connection=True)
            clients.append(late)
            try:
                return code_name(late.query_route("capped").status.code) == "OK"
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                late.close()
                return False

        wait_until(served, 15, "a new connection served once one of the two closed")
    finally:
        for client in clients:
            client.close()


# --- more of the service ----------------------------------------------------------------------------------------


def test_without_auto_creation_a_missing_topic_is_not_found(start_broker: Callable[..., ThreadedBroker]) -> None:
    broker = start_broker(auto_create_topics=False)
    client = Client(broker)
    try:
        route = client.query_route("missing")
        assert code_name(route.status.code) == "TOPIC_NOT_FOUND" and not route.message_queues, route
        sent = client.send("missing", b"x")
        assert code_name(sent.status.code) == "TOPIC_NOT_FOUND", sent.status
        assert broker.store.topic("missing") is None
    finally:
        client.close()


def test_a_send_of_messages_with_different_outcomes(client: Client) -> None:
    messages = []
    for body in (b"good", b""):
        message = pb.Message(body=body)
        message.topic.name = "orders"
        messages.append(message)
    answer = client.stub.SendMessage(
        pbs.SendMessageRequest(messages=messages), timeout=CALL_TIMEOUT_S, metadata=client.metadata
    )
    assert code_name(answer.status.code) == "MULTIPLE_RESULTS", answer.status
    assert [code_name(e.status.code) for e in answer.entries] == ["OK", "MESSAGE_BODY_EMPTY"]
    (message,) = messages_of(client.receive("orders"))
    assert message.body == b"good"
    empty = client.stub.SendMessage(pbs.SendMessageRequest(), timeout=CALL_TIMEOUT_S, metadata=client.metadata)
    assert code_name(empty.status.code) == "BAD_REQUEST", empty.status


def test_a_delayed_message_is_delivered_at_its_time(client: Client) -> None:
    message = pb.Message(body=b"later")
    message.topic.name = "orders"
    message.system_properties.message_type = pb.MessageType.DELAY
    due_ms = int(time.time() * 1000) + 1_500
    message.system_properties.delivery_timestamp.seconds, millis = divmod(due_ms, 1000)
    message.system_properties.delivery_timestamp.nanos = millis * 1_000_000
    answer = client.stub.SendMessage(
        pbs.SendMessageRequest(messages=[message]), timeout=CALL_TIMEOUT_S, metadata=client.metadata
    )
    sent_ok(answer)
    assert refusal_of(client.receive("orders")) == "MESSAGE_NOT_FOUND"  # not yet
    received: list[Any] = []
    deadline = time.monotonic() + 20
    while not received:  # each receive waits (long polling) for the timer to deliver it
        assert time.monotonic() < deadline, "the delayed message never came"
        responses = client.receive("orders", long_polling_ms=5_000)
        if len(responses) > 1:
            received = messages_of(responses)
    assert time.time() * 1000 >= due_ms - 50  # not before its time (the clocks are one)
    (got,) = received
    sp = got.system_properties
    assert got.body == b"later" and sp.message_type == pb.MessageType.DELAY
    assert abs(sp.delivery_timestamp.seconds * 1000 + sp.delivery_timestamp.nanos // 10**6 - due_ms) <= 1


def test_a_waiting_receive_gets_a_message_sent_meanwhile(broker: ThreadedBroker, client: Client) -> None:
    sent_ok(client.send("orders", b"first"))
    (first,) = messages_of(client.receive("orders"))
    assert code_name(client.ack("orders", first.system_properties.receipt_handle).status.code) == "OK"
    sender = Client(broker, client_id="sender")
    answers: list[list[Any]] = []
    waiting = threading.Thread(target=lambda: answers.append(client.receive("orders", long_polling_ms=8_000)))
    try:
        started = time.monotonic()
        waiting.start()
        sent_ok(sender.send("orders", b"second"))
    finally:
        waiting.join(CALL_TIMEOUT_S + 5)
        sender.close()
    assert not waiting.is_alive() and len(answers) == 1
    (second,) = messages_of(answers[0])
    assert second.body == b"second"
    assert time.monotonic() - started < 7.5  # woken by the send, not at the end of its long polling


def test_a_terminating_client_releases_what_it_holds(broker: ThreadedBroker, client: Client) -> None:
    sent_ok(client.send("orders", b"held"))
    (first,) = messages_of(client.receive("orders", invisible_ms=60_000))
    request = pbs.NotifyClientTerminationRequest()
    request.group.name = "G"
    ended = client.stub.NotifyClientTermination(request, timeout=CALL_TIMEOUT_S, metadata=client.metadata)
    assert code_name(ended.status.code) == "OK", ended.status
    other = Client(broker, client_id="other-client")
    try:
        (second,) = messages_of(other.receive("orders", invisible_ms=60_000))
        assert second.body == b"held" and second.system_properties.delivery_attempt == 2
        assert code_name(other.ack("orders", first.system_properties.receipt_handle).status.code) == (
            "INVALID_RECEIPT_HANDLE"
        )
        assert code_name(other.ack("orders", second.system_properties.receipt_handle).status.code) == "OK"
    finally:
        other.close()


def forward_to_dead_letters(client: Client, topic: str, message: Any, group: str = "G") -> Any:
    request = pbs.ForwardMessageToDeadLetterQueueRequest(
        receipt_handle=message.system_properties.receipt_handle,
        message_id=message.system_properties.message_id,
        delivery_attempt=message.system_properties.delivery_attempt,
        max_delivery_attempts=16,
    )
    request.group.name = group
    request.topic.name = topic
    return client.stub.ForwardMessageToDeadLetterQueue(request, timeout=CALL_TIMEOUT_S, metadata=client.metadata)


def test_a_message_forwarded_to_the_dead_letter_queue(client: Client) -> None:
    sent_ok(client.send("orders", b"poison", tag="t", message_id="POISON-1"))
    (message,) = messages_of(client.receive("orders"))
    forwarded = forward_to_dead_letters(client, "orders", message)
    assert code_name(forwarded.status.code) == "OK", forwarded.status
    assert refusal_of(client.receive("orders")) == "MESSAGE_NOT_FOUND"  # done for the group
    again = forward_to_dead_letters(client, "orders", message)
    assert code_name(again.status.code) == "INVALID_RECEIPT_HANDLE", again.status
    (dead,) = messages_of(client.receive("%DLQ%G", group="dlq-reader"))
    assert dead.body == b"poison" and dead.system_properties.tag == "t"
    assert dead.system_properties.message_id == "POISON-1"


def test_a_message_past_the_delivery_limit_goes_to_the_dead_letter_queue(
    start_broker: Callable[..., ThreadedBroker],
) -> None:
    broker = start_broker(group_share_delivery_count_limit=2)
    client = Client(broker)
    try:
        sent_ok(client.send("orders", b"fails"))
        for attempt in (1, 2):
            (message,) = messages_of(client.receive("orders"))
            assert message.system_properties.delivery_attempt == attempt
            changed = client.change_invisible("orders", message.system_properties.receipt_handle, 0)
            assert code_name(changed.status.code) == "OK"
        assert refusal_of(client.receive("orders")) == "MESSAGE_NOT_FOUND"  # no third attempt
        (dead,) = messages_of(client.receive("%DLQ%G", group="dlq-reader", long_polling_ms=5_000))
        assert dead.body == b"fails"
    finally:
        client.close()


# --- system topics ----------------------------------------------------------------------------------------------
#
# RocketMQ's proxy refuses every gRPC call naming one of its system topics (GrpcValidator.validateTopic:
# TopicValidator.isSystemTopic -> ILLEGAL_TOPIC "cannot access system topic"), and mqk's internal topics are no client's
# to create or read (mqk.broker.internal). The broker's own refusal of a send to them is FORBIDDEN (above); either code
# is a refusal here.

REFUSED = ("ILLEGAL_TOPIC", "FORBIDDEN")


@pytest.mark.parametrize(
    "name",
    [
        "__consumer_offsets",
        "__share_group_state",
        TRANSACTION_HALF_TOPIC,
        TIMER_TOPIC,
        "SCHEDULE_TOPIC_XXXX",
        AUTO_CREATE_KEY,
    ],
)
def test_query_route_of_a_system_topic_is_refused_and_creates_nothing(
    broker: ThreadedBroker, client: Client, name: str
) -> None:
    existed = broker.store.topic(name) is not None
    answer = client.query_route(name)
    # a route to a system topic would let a client create it (the missing ones) and then read or write it
    assert code_name(answer.status.code) in REFUSED, (name, answer.status, len(answer.message_queues))
    assert list(answer.message_queues) == []
    assert (broker.store.topic(name) is not None) == existed, f"QueryRoute created the system topic {name}"


def test_a_send_to_the_auto_create_key_topic_is_refused(broker: ThreadedBroker, client: Client) -> None:
    answer = client.send(AUTO_CREATE_KEY, b"x")
    # (RocketMQ's proxy refuses the auto-creation key as a system topic; it is never created as a topic here)
    assert code_name(answer.status.code) in REFUSED, answer.status
    assert broker.store.topic(AUTO_CREATE_KEY) is None


@pytest.mark.parametrize("name", [TRANSACTION_HALF_TOPIC, TIMER_TOPIC])
def test_a_receive_from_an_internal_topic_is_refused(client: Client, name: str) -> None:
    entry = sent_ok(client.send("orders", b"uncommitted", message_type=pb.MessageType.TRANSACTION))
    assert entry.transaction_id  # (a half message now waits in the half topic)
    delayed = pb.Message(body=b"not-due-yet")
    delayed.topic.name = "orders"
    delayed.system_properties.message_type = pb.MessageType.DELAY
    delayed.system_properties.delivery_timestamp.seconds = int(time.time()) + 3600
    sent_ok(
        client.stub.SendMessage(
            pbs.SendMessageRequest(messages=[delayed]), timeout=CALL_TIMEOUT_S, metadata=client.metadata
        )
    )
    responses = client.receive(name, group="snoop")
    leaked = [r.message.body for r in responses if r.WhichOneof("content") == "message"]
    # a receive from the half topic would deliver uncommitted transactions, one from the timer's topic delayed
    # messages before their time: refused (ILLEGAL_TOPIC "cannot access system topic", as RocketMQ's proxy)
    assert leaked == [], f"ReceiveMessage on {name} delivered {leaked!r}"
    assert refusal_of(responses) in REFUSED
