"""The RocketMQ 5 protocol's messages and mqk's stored RocketMQ messages, both ways, and the receipt handles.

A message the gRPC front door receives (apache/rocketmq-apis `Message`: system properties in a typed struct, the
user's in a map) is stored as the remoting front door stores one (mqk.protocol.native.records: properties in the
record, TAGS and KEYS indexed), with RocketMQ 4's property names for what the typed struct carries: the client's
message id as UNIQ_KEY, the message group as __SHARDINGKEY, a delivery time as TIMER_DELIVER_MS (the timer's
put-hook takes it from there). So a message sent over one protocol is read over every other one: remoting, Kafka
and gRPC consumers see the same tag, keys and id.

A receipt handle names what an acknowledgement needs and nothing it must trust: the queue, the offset, the
delivery count and the member that received it. An acknowledgement whose record was since delivered again (its
lock ran out: a later delivery count) or is no longer held is refused INVALID_RECEIPT_HANDLE, as RocketMQ refuses an
expired handle.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from mqk.protocol.native.codes import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_START_DELIVER_TIME,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
)
from mqk.protocol.native.message import MessageExt

#: RocketMQ's property for a FIFO message's group (MessageConst.PROPERTY_SHARDING_KEY)
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
#: the properties the protocol carries in its typed system properties (or that only the broker sets): never
#: passed on among a message's user properties
SYSTEM_PROPERTIES = frozenset(
    {
        PROPERTY_TAGS,
        PROPERTY_KEYS,
        PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
        PROPERTY_SHARDING_KEY,
        PROPERTY_TIMER_DELIVER_MS,
        PROPERTY_START_DELIVER_TIME,
        PROPERTY_TIMER_DELAY_MS,
        PROPERTY_TIMER_DELAY_SEC,
        PROPERTY_DELAY_TIME_LEVEL,
        PROPERTY_RECONSUME_TIME,
        "WAIT",
        "MSG_REGION",
        "TRACE_ON",
        "REAL_TOPIC",
        "REAL_QID",
        "RETRY_TOPIC",
        "ORIGIN_MESSAGE_ID",
        "TIMER_OUT_MS",
        "TIMER_ENQUEUE_MS",
        "CLUSTER",
    }
)
#: above this, a Timestamp's `seconds` holds milliseconds: the Python SDK 5.x puts a delivery time given in
#: milliseconds there unconverted (10**11 seconds is past the year 5000)
_MILLIS_IN_SECONDS = 10**11
#: a receipt handle's first field: its layout, so a later one can change it
HANDLE_VERSION = "m1"


def timestamp_ms(ts: Any) -> int:
    """Epoch milliseconds of a protobuf Timestamp (see _MILLIS_IN_SECONDS)."""
    if ts.seconds >= _MILLIS_IN_SECONDS:
        return int(ts.seconds)
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def duration_ms(d: Any) -> int:
    return int(d.seconds) * 1000 + int(d.nanos) // 1_000_000


def set_timestamp(ts: Any, ms: int) -> None:
    ts.seconds, ts.nanos = divmod(ms, 1000)
    ts.nanos *= 1_000_000


def stored_properties(message: Any) -> dict[str, str]:
    """The stored form's properties of a protocol Message (user properties, then the system ones over them)."""
    sp = message.system_properties
    props = {k: v for k, v in message.user_properties.items() if k not in SYSTEM_PROPERTIES}
    if sp.tag:
        props[PROPERTY_TAGS] = sp.tag
    if sp.keys:
        props[PROPERTY_KEYS] = " ".join(sp.keys)
    if sp.message_id:
        props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = sp.message_id
    if sp.message_group:
        props[PROPERTY_SHARDING_KEY] = sp.message_group
    if sp.HasField("delivery_timestamp"):
        props[PROPERTY_TIMER_DELIVER_MS] = str(timestamp_ms(sp.delivery_timestamp))
    return props


@dataclass(frozen=True)
class ReceiptHandle:
    queue: int
    offset: int
    delivery_count: int
    member_id: str

    def encode(self) -> str:
        return f"{HANDLE_VERSION}:{self.queue}:{self.offset}:{self.delivery_count}:{self.member_id}"

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle | None:
        """None when `text` is no receipt handle of this broker."""
        version, _, rest = text.partition(":")
        fields = rest.split(":", 3)
        if version != HANDLE_VERSION or len(fields) != 4:
            return None
        try:
            queue, offset, count = int(fields[0]), int(fields[1]), int(fields[2])
        except ValueError:
            return None
        if queue < 0 or offset < 0 or count < 1:
            return None
        return cls(queue, offset, count, fields[3])


def to_protocol(pb: Any, msg: MessageExt, queue: int, handle: ReceiptHandle | None = None, lock_ms: int = 0) -> Any:
    """The protocol Message (pb: the generated definition_pb2 module) of a stored message, delivered with `handle`
    (None: shown, not delivered, as to a producer asked about a transaction)."""
    props = msg.properties
    out = pb.Message()
    out.topic.name = msg.topic
    out.body = msg.body
    for k, v in props.items():
        if k not in SYSTEM_PROPERTIES:
            out.user_properties[k] = v
    sp = out.system_properties
    if msg.tags:
        sp.tag = msg.tags
    sp.keys.extend(msg.keys)
    sp.message_id = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or msg.msg_id
    sp.body_digest.type = pb.DigestType.CRC32
    sp.body_digest.checksum = format(zlib.crc32(msg.body) & 0xFFFFFFFF, "08X")
    sp.body_encoding = pb.Encoding.IDENTITY
    group = props.get(PROPERTY_SHARDING_KEY)
    deliver_at = props.get(PROPERTY_TIMER_DELIVER_MS) or props.get(PROPERTY_START_DELIVER_TIME)
    if group:
        sp.message_group = group
        sp.message_type = pb.MessageType.FIFO
    elif deliver_at and deliver_at.isdigit():
        sp.message_type = pb.MessageType.DELAY
        set_timestamp(sp.delivery_timestamp, int(deliver_at))
    else:
        sp.message_type = pb.MessageType.NORMAL
    set_timestamp(sp.born_timestamp, msg.born_timestamp or msg.store_timestamp)
    sp.born_host = msg.born_host[0]
    set_timestamp(sp.store_timestamp, msg.store_timestamp)
    sp.store_host = f"{msg.store_host[0]}:{msg.store_host[1]}"
    sp.queue_id = queue
    sp.queue_offset = msg.queue_offset
    if handle is not None:
        sp.receipt_handle = handle.encode()
        sp.delivery_attempt = handle.delivery_count
        sp.invisible_duration.seconds, millis = divmod(lock_ms, 1000)
        sp.invisible_duration.nanos = millis * 1_000_000
    return out


def tag_filter(kind: int, expression: str, sql: int) -> frozenset[str] | None:
    """The tags a TAG filter expression accepts (None: every message); ValueError for an SQL92 expression (not
    offered) or a malformed one."""
    if kind == sql:
        raise ValueError("SQL92 filter expressions are not supported by this broker; filter by tag")
    text = expression.strip()
    if not text or text == "*":
        return None
    tags = frozenset(t.strip() for t in text.split("||") if t.strip())
    if not tags:
        raise ValueError(f"filter expression {expression!r} names no tag")
    return tags


__all__ = [
    "PROPERTY_SHARDING_KEY",
    "ReceiptHandle",
    "duration_ms",
    "set_timestamp",
    "stored_properties",
    "tag_filter",
    "timestamp_ms",
    "to_protocol",
]
