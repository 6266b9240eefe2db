"""The RocketMQ 5 front door's message conversions (mqk.server.rocketmq5.messages) without a broker: receipt
handles both ways and the refusal of malformed ones, protobuf timestamps (also the SDK's milliseconds in `seconds`),
a protocol message's stored properties, tag filter expressions, and a stored message as the protocol delivers it.
On the wire: tests/integration/test_rocketmq5_wire.py."""

from __future__ import annotations

import zlib

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from mqk.protocol.native.message import MessageExt
from mqk.server.rocketmq5.messages import (
    PROPERTY_SHARDING_KEY,
    ReceiptHandle,
    stored_properties,
    tag_filter,
    timestamp_ms,
    to_protocol,
)

SQL, TAG = pb.FilterType.SQL, pb.FilterType.TAG


# --- receipt handles ------------------------------------------------------------------------------------------


def test_a_receipt_handle_round_trips() -> None:
    handle = ReceiptHandle(queue=3, offset=1234567890123, delivery_count=2, member_id="client-7")
    text = handle.encode()
    assert text == "m1:3:1234567890123:2:client-7"
    assert ReceiptHandle.decode(text) == handle


def test_a_receipt_handle_keeps_a_member_id_holding_colons() -> None:
    # a client without x-mq-client-id is named by its gRPC peer, "ipv4:127.0.0.1:5555"
    handle = ReceiptHandle(0, 0, 1, "ipv4:127.0.0.1:5555")
    text = handle.encode()
    assert text == "m1:0:0:1:ipv4:127.0.0.1:5555"
    assert ReceiptHandle.decode(text) == handle
    assert ReceiptHandle.decode("m1:1:2:3:a:b:c:") == ReceiptHandle(1, 2, 3, "a:b:c:")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "m1",
        "m2:0:0:1:member",  # another layout's version
        "M1:0:0:1:member",
        "x:0:0:1:member",
        "0:0:1:member",  # no version at all
        "m1:0:0:1",  # too few fields
        "m1:0:0",
        "m1::::",  # empty numbers
        "m1:q:0:1:member",  # not integers
        "m1:0:zero:1:member",
        "m1:0:0:one:member",
        "m1:0.5:0:1:member",
        "m1:-1:0:1:member",  # negative
        "m1:0:-5:1:member",
        "m1:0:0:-1:member",
        "m1:0:0:0:member",  # a delivery count starts at 1
        "rmq-handle-from-another-broker",
    ],
)
def test_a_malformed_receipt_handle_is_refused(text: str) -> None:
    assert ReceiptHandle.decode(text) is None


# --- timestamps -----------------------------------------------------------------------------------------------


def test_timestamp_ms_of_a_normal_timestamp() -> None:
    ts = pb.SystemProperties().born_timestamp
    ts.seconds, ts.nanos = 1_700_000_000, 123_456_789
    assert timestamp_ms(ts) == 1_700_000_000_123
    ts.seconds, ts.nanos = 0, 999_999
    assert timestamp_ms(ts) == 0


def test_timestamp_ms_takes_milliseconds_put_in_seconds_as_milliseconds() -> None:
    # the Python SDK 5.x puts a delivery time in milliseconds into `seconds` unconverted
    ts = pb.SystemProperties().delivery_timestamp
    ts.seconds = 1_700_000_000_123
    assert timestamp_ms(ts) == 1_700_000_000_123
    ts.seconds = 10**11  # the threshold itself is milliseconds (1973), not seconds (year 5138)
    assert timestamp_ms(ts) == 10**11
    ts.seconds = 10**11 - 1  # just below it: seconds
    assert timestamp_ms(ts) == (10**11 - 1) * 1000


# --- stored properties ----------------------------------------------------------------------------------------


def protocol_message(**system: object) -> pb.Message:
    message = pb.Message(body=b"x")
    message.topic.name = "t"
    for name, value in system.items():
        if name == "keys":
            message.system_properties.keys.extend(value)
        elif name == "delivery_timestamp":
            message.system_properties.delivery_timestamp.seconds = value
        else:
            setattr(message.system_properties, name, value)
    return message


def test_stored_properties_of_a_message_with_every_system_property() -> None:
    message = protocol_message(
        tag="TagA", keys=["k1", "k2", "k3"], message_id="01ABCDEF", message_group="orders-7", delivery_timestamp=1_800
    )
    message.user_properties["color"] = "blue"
    message.user_properties["empty"] = ""
    assert stored_properties(message) == {
        "color": "blue",
        "empty": "",
        "TAGS": "TagA",
        "KEYS": "k1 k2 k3",
        "UNIQ_KEY": "01ABCDEF",
        PROPERTY_SHARDING_KEY: "orders-7",
        "TIMER_DELIVER_MS": "1800000",
    }


def test_stored_properties_take_a_delivery_time_in_milliseconds() -> None:
    message = protocol_message(delivery_timestamp=1_700_000_000_456)
    assert stored_properties(message) == {"TIMER_DELIVER_MS": "1700000000456"}


def test_stored_properties_of_a_bare_message_are_empty() -> None:
    assert stored_properties(protocol_message()) == {}


def test_stored_properties_drop_user_properties_with_system_names() -> None:
    message = protocol_message(tag="real")
    for name in ("TAGS", "KEYS", "UNIQ_KEY", "__SHARDINGKEY", "TIMER_DELIVER_MS", "DELAY", "__STARTDELIVERTIME"):
        message.user_properties[name] = "forged"
    message.user_properties["kept"] = "yes"
    # the user's TAGS does not replace the system tag, and none of the others slips in
    assert stored_properties(message) == {"kept": "yes", "TAGS": "real"}


# --- tag filters ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("expression", ["*", "", "  ", " * "])
def test_a_tag_filter_for_every_message(expression: str) -> None:
    assert tag_filter(TAG, expression, SQL) is None


def test_a_tag_filter_names_its_tags() -> None:
    assert tag_filter(TAG, "a", SQL) == frozenset({"a"})
    assert tag_filter(TAG, "a||b", SQL) == frozenset({"a", "b"})
    assert tag_filter(TAG, " a || b ||c ", SQL) == frozenset({"a", "b", "c"})
    assert tag_filter(TAG, "a||||b", SQL) == frozenset({"a", "b"})
    # an unspecified type is a tag filter too (what the SDK's default sends)
    assert tag_filter(pb.FilterType.FILTER_TYPE_UNSPECIFIED, "x||y", SQL) == frozenset({"x", "y"})


def test_an_sql_filter_is_refused() -> None:
    with pytest.raises(ValueError, match="SQL92"):
        tag_filter(SQL, "a > 1", SQL)
    with pytest.raises(ValueError, match="SQL92"):
        tag_filter(SQL, "*", SQL)  # refused by its type, whatever it says


@pytest.mark.parametrize("expression", ["||", " || ", "||||", "|| ||"])
def test_a_tag_filter_naming_no_tag_is_refused(expression: str) -> None:
    with pytest.raises(ValueError, match="names no tag"):
        tag_filter(TAG, expression, SQL)


# --- stored messages as delivered -----------------------------------------------------------------------------


def stored(**properties: str) -> MessageExt:
    return MessageExt(
        topic="orders",
        body=b"body-0",
        properties=properties,
        queue_id=2,
        queue_offset=41,
        commit_log_offset=9000,
        born_timestamp=1_700_000_000_111,
        born_host=("10.0.0.9", 40000),
        store_timestamp=1_700_000_000_222,
        store_host=("127.0.0.1", 10911),
    )


def test_a_stored_message_as_delivered() -> None:
    msg = stored(TAGS="TagA", KEYS="k1 k2", UNIQ_KEY="AC1100017F0000000001", color="blue", RETRY_TOPIC="x")
    handle = ReceiptHandle(2, 41, 3, "client-1")
    out = to_protocol(pb, msg, 2, handle, 5_250)
    sp = out.system_properties
    assert out.topic.name == "orders" and out.body == b"body-0"
    assert dict(out.user_properties) == {"color": "blue"}  # the system ones are in the system properties
    assert sp.tag == "TagA" and list(sp.keys) == ["k1", "k2"]
    assert sp.message_id == "AC1100017F0000000001"
    assert sp.body_digest.type == pb.DigestType.CRC32
    # zero-padded upper-case hex of the CRC32 (this body's starts with a 0)
    assert sp.body_digest.checksum == "060BB6A6" == format(zlib.crc32(b"body-0"), "08X")
    assert sp.body_encoding == pb.Encoding.IDENTITY
    assert sp.message_type == pb.MessageType.NORMAL and not sp.message_group
    assert not sp.HasField("delivery_timestamp")
    assert timestamp_ms(sp.born_timestamp) == 1_700_000_000_111 and sp.born_host == "10.0.0.9"
    assert timestamp_ms(sp.store_timestamp) == 1_700_000_000_222 and sp.store_host == "127.0.0.1:10911"
    assert sp.queue_id == 2 and sp.queue_offset == 41
    assert sp.receipt_handle == "m1:2:41:3:client-1" and ReceiptHandle.decode(sp.receipt_handle) == handle
    assert sp.delivery_attempt == 3
    assert (sp.invisible_duration.seconds, sp.invisible_duration.nanos) == (5, 250_000_000)


def test_the_stored_properties_of_a_sent_message_come_back_as_sent() -> None:
    sent = protocol_message(tag="t1", keys=["a", "b"], message_id="MSGID-1")
    sent.user_properties["p"] = "v"
    back = to_protocol(pb, stored(**stored_properties(sent)), 0, ReceiptHandle(0, 41, 1, "m"), 1000)
    assert back.system_properties.tag == "t1" and list(back.system_properties.keys) == ["a", "b"]
    assert back.system_properties.message_id == "MSGID-1" and dict(back.user_properties) == {"p": "v"}


def test_a_stored_message_without_uniq_key_is_named_by_its_offset_id() -> None:
    msg = stored()
    out = to_protocol(pb, msg, 0, ReceiptHandle(0, 41, 1, "m"), 1000)
    assert out.system_properties.message_id == msg.offset_msg_id
    assert len(msg.offset_msg_id) == 32 and msg.offset_msg_id.endswith(format(9000, "016X"))
    assert not out.system_properties.tag and list(out.system_properties.keys) == []


def test_a_stored_fifo_message_is_delivered_as_fifo() -> None:
    out = to_protocol(pb, stored(**{PROPERTY_SHARDING_KEY: "g1"}), 0, ReceiptHandle(0, 41, 1, "m"), 1000)
    assert out.system_properties.message_type == pb.MessageType.FIFO
    assert out.system_properties.message_group == "g1"
    assert PROPERTY_SHARDING_KEY not in out.user_properties


def test_a_stored_delayed_message_is_delivered_as_delay() -> None:
    out = to_protocol(pb, stored(TIMER_DELIVER_MS="1700000060000"), 0, ReceiptHandle(0, 41, 1, "m"), 1000)
    sp = out.system_properties
    assert sp.message_type == pb.MessageType.DELAY and sp.HasField("delivery_timestamp")
    assert (sp.delivery_timestamp.seconds, sp.delivery_timestamp.nanos) == (1_700_000_060, 0)
    assert timestamp_ms(sp.delivery_timestamp) == 1_700_000_060_000
    assert "TIMER_DELIVER_MS" not in out.user_properties
    # a remoting producer's delivery time is one too
    remoting = to_protocol(pb, stored(__STARTDELIVERTIME="1700000061500"), 0, ReceiptHandle(0, 41, 1, "m"), 1000)
    assert remoting.system_properties.message_type == pb.MessageType.DELAY
    assert timestamp_ms(remoting.system_properties.delivery_timestamp) == 1_700_000_061_500


def test_a_stored_message_with_a_malformed_delivery_time_is_normal() -> None:
    out = to_protocol(pb, stored(TIMER_DELIVER_MS="soon"), 0, ReceiptHandle(0, 41, 1, "m"), 1000)
    assert out.system_properties.message_type == pb.MessageType.NORMAL
    assert not out.system_properties.HasField("delivery_timestamp")


def test_a_message_shown_without_a_handle_carries_no_delivery() -> None:
    # (a half message shown to its producer in a transaction check)
    out = to_protocol(pb, stored(UNIQ_KEY="U1"), 0)
    sp = out.system_properties
    assert sp.message_id == "U1" and sp.receipt_handle == "" and sp.delivery_attempt == 0
    assert not sp.HasField("invisible_duration")
