"""RocketMQ message wire formats (MessageDecoder's), sans-IO:

- properties string: `name 0x01 value 0x02` per property;
- message id: store host (IPv4 4 bytes + port 4 bytes, or IPv6 16 + 4) + commit-log offset (8), upper-case hex;
- a stored message as a pull response carries it (`encode_message_ext` / `decode_messages`): totalSize, magicCode,
  bodyCRC, queueId, flag, queueOffset, physicalOffset, sysFlag, bornTimestamp, bornHost, storeTimestamp,
  storeHost, reconsumeTimes, preparedTransactionOffset, body (i32 length), topic (u8 length), properties
  (i16 length);
- a batch send body (`encode_batch_body` / `decode_batch_body`): per message totalSize, magicCode, bodyCRC,
  flag, body (i32 length), properties (i16 length).

Every decoder checks each length against the bytes left before slicing and raises `MessageFormatError`.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
import zlib
from dataclasses import dataclass, field

from mqk.errors import ProtocolError
from mqk.protocol.native.codes import SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
MESSAGE_MAGIC_CODE = 0xDAA320A7  # MessageDecoder.MESSAGE_MAGIC_CODE (-626843481 as a Java int)
_MAX_PROPERTIES = 0x7FFF


class MessageFormatError(ProtocolError):
    """A message body (batch, pull result, properties, message id) is malformed."""


def properties_to_string(properties: dict[str, str]) -> str:
    return "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in properties.items())


def string_to_properties(text: str | None) -> dict[str, str]:
    """Lenient like RocketMQ's: empty items and items without a name/value separator are skipped."""
    out: dict[str, str] = {}
    if not text:
        return out
    for item in text.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and name:
            out[name] = value
    return out


def body_crc(body: bytes) -> int:
    """UtilAll.crc32: java.util.zip.CRC32 masked to a non-negative int."""
    return zlib.crc32(body) & 0x7FFFFFFF


# --- host addresses and message ids --------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def pack_host(host: str, port: int) -> bytes:
    """4 (IPv4) or 16 (IPv6) address bytes followed by the port as an i32 (cached: a broker has few peers)."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        addr = ipaddress.ip_address("127.0.0.1")
    return addr.packed + struct.pack(">i", port)


@functools.lru_cache(maxsize=1024)
def unpack_host(data: bytes) -> tuple[str, int]:
    if len(data) not in (8, 20):
        raise MessageFormatError(f"host address of {len(data)} bytes")
    addr = ipaddress.ip_address(bytes(data[:-4]))
    return str(addr), struct.unpack(">i", data[-4:])[0]


def encode_message_id(host: str, port: int, offset: int) -> str:
    return (pack_host(host, port) + struct.pack(">q", offset)).hex().upper()


def decode_message_id(msg_id: str) -> tuple[str, int, int]:
    """(host, port, commit-log offset) of an offset message id (32 hex chars for IPv4, 56 for IPv6)."""
    if len(msg_id) not in (32, 56):
        raise MessageFormatError(f"message id of {len(msg_id)} characters")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise MessageFormatError("message id is not hex") from None
    host, port = unpack_host(raw[:-8])
    return host, port, struct.unpack(">q", raw[-8:])[0]


# --- stored messages (pull results) -----------------------------------------------------------------------


@dataclass
class MessageExt:
    topic: str
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    commit_log_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    store_timestamp: int = 0
    store_host: tuple[str, int] = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get("KEYS", "").split(" ") if k]

    @property
    def offset_msg_id(self) -> str:
        return encode_message_id(self.store_host[0], self.store_host[1], self.commit_log_offset)

    @property
    def msg_id(self) -> str:
        """What RocketMQ clients call the message id: the producer's UNIQ_KEY, else the offset id."""
        return self.properties.get("UNIQ_KEY") or self.offset_msg_id


_EXT_HEAD = struct.Struct(">iIiiiqqiq")  # size, magic, crc, queueId, flag, queueOffset, physOffset, sysFlag, bornTs


def encode_message_ext(msg: MessageExt) -> bytes:
    topic = msg.topic.encode()
    if len(topic) > 255:
        raise MessageFormatError("topic longer than 255 bytes")
    props = properties_to_string(msg.properties).encode()
    if len(props) > _MAX_PROPERTIES:
        raise MessageFormatError(f"properties of {len(props)} bytes exceed {_MAX_PROPERTIES}")
    sys_flag = msg.sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    born = pack_host(*msg.born_host)
    store = pack_host(*msg.store_host)
    if len(born) == 20:
        sys_flag |= SYSFLAG_BORNHOST_V6
    if len(store) == 20:
        sys_flag |= SYSFLAG_STOREHOST_V6
    total = _EXT_HEAD.size + len(born) + 8 + len(store) + 4 + 8 + 4 + len(msg.body) + 1 + len(topic) + 2 + len(props)
    return b"".join(
        (
            _EXT_HEAD.pack(
                total,
                MESSAGE_MAGIC_CODE,
                body_crc(msg.body),
                msg.queue_id,
                msg.flag,
                msg.queue_offset,
                msg.commit_log_offset,
                sys_flag,
                msg.born_timestamp,
            ),
            born,
            struct.pack(">q", msg.store_timestamp),
            store,
            struct.pack(">iqi", msg.reconsume_times, msg.prepared_transaction_offset, len(msg.body)),
            msg.body,
            bytes((len(topic),)),
            topic,
            struct.pack(">h", len(props)),
            props,
        )
    )


def decode_messages(data: bytes) -> list[MessageExt]:
    """A pull response body: stored messages back to back."""
    view = memoryview(data)
    out: list[MessageExt] = []
    pos = 0
    while pos < len(view):
        if pos + 4 > len(view):
            raise MessageFormatError("truncated message size")
        (size,) = struct.unpack_from(">i", view, pos)
        if size < _EXT_HEAD.size or pos + size > len(view):
            raise MessageFormatError(f"message size {size} at {pos} does not fit")
        out.append(_decode_one(view[pos : pos + size]))
        pos += size
    return out


def _decode_one(view: memoryview) -> MessageExt:
    end = len(view)

    def take(pos: int, n: int) -> memoryview:
        if n < 0 or pos + n > end:
            raise MessageFormatError(f"message field of {n} bytes at {pos} overruns the message ({end} bytes)")
        return view[pos : pos + n]

    (_size, _magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts) = _EXT_HEAD.unpack_from(view, 0)
    pos = _EXT_HEAD.size
    born_len = 20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8
    born_host = unpack_host(bytes(take(pos, born_len)))
    pos += born_len
    (store_ts,) = struct.unpack(">q", take(pos, 8))
    pos += 8
    store_len = 20 if sys_flag & SYSFLAG_STOREHOST_V6 else 8
    store_host = unpack_host(bytes(take(pos, store_len)))
    pos += store_len
    reconsume, prepared, body_len = struct.unpack(">iqi", take(pos, 16))
    pos += 16
    body = bytes(take(pos, body_len))
    pos += body_len
    topic_len = take(pos, 1)[0]
    pos += 1
    topic = bytes(take(pos, topic_len)).decode("utf-8", "replace")
    pos += topic_len
    (props_len,) = struct.unpack(">h", take(pos, 2))
    pos += 2
    props = string_to_properties(bytes(take(pos, props_len)).decode("utf-8", "replace"))
    return MessageExt(
        topic=topic,
        body=body,
        properties=props,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        commit_log_offset=phys,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=born_host,
        store_timestamp=store_ts,
        store_host=store_host,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body_crc=crc,
    )


# --- batch send bodies -------------------------------------------------------------------------------------


@dataclass
class BatchItem:
    body: bytes
    properties: dict[str, str]
    flag: int = 0


_BATCH_HEAD = struct.Struct(">iiiii")  # totalSize, magicCode, bodyCRC, flag, bodyLen


def encode_batch_body(items: list[BatchItem]) -> bytes:
    parts = []
    for item in items:
        props = properties_to_string(item.properties).encode()
        if len(props) > _MAX_PROPERTIES:
            raise MessageFormatError(f"properties of {len(props)} bytes exceed {_MAX_PROPERTIES}")
        total = _BATCH_HEAD.size + len(item.body) + 2 + len(props)
        parts += [
            _BATCH_HEAD.pack(total, 0, 0, item.flag, len(item.body)),
            item.body,
            struct.pack(">h", len(props)),
            props,
        ]
    return b"".join(parts)


def decode_batch_body(data: bytes, max_count: int = 1 << 16) -> list[BatchItem]:
    view = memoryview(data)
    out: list[BatchItem] = []
    pos = 0
    while pos < len(view):
        if len(out) >= max_count:
            raise MessageFormatError(f"batch holds more than {max_count} messages")
        if pos + _BATCH_HEAD.size > len(view):
            raise MessageFormatError("truncated batch message header")
        total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(view, pos)
        if total < _BATCH_HEAD.size + 2 or pos + total > len(view):
            raise MessageFormatError(f"batch message size {total} at {pos} does not fit")
        end = pos + total
        p = pos + _BATCH_HEAD.size
        if body_len < 0 or p + body_len + 2 > end:
            raise MessageFormatError("batch message body overruns its message")
        body = bytes(view[p : p + body_len])
        p += body_len
        (props_len,) = struct.unpack_from(">h", view, p)
        p += 2
        if props_len < 0 or p + props_len != end:
            raise MessageFormatError("batch message properties do not fill its message")
        try:
            props = string_to_properties(bytes(view[p : p + props_len]).decode("utf-8"))
        except UnicodeDecodeError:
            raise MessageFormatError("batch message properties are not UTF-8") from None
        out.append(BatchItem(body, props, flag))
        pos = end
    return out
