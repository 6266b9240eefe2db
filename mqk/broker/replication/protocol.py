"""The replication link's frames (sans I/O): how a replica and its master talk over `--replication-listen`.

Every frame is a 5-byte head (body length u32, kind u8, big-endian) and a body. Control frames carry a small JSON
object; the hot frames are fixed binary:

    HELLO      replica -> master  JSON: protocol version, cluster id, group, node id, segment size, its CommitLog
                                  end and its epoch history [[epoch, start offset], ...]
    START      master -> replica  JSON: where the replica's log must be cut back to (the end of the last epoch
                                  both logs share), the master's epoch and its whole epoch history document
    REFUSE     master -> replica  JSON: why the link is refused (another cluster or group, a segment size that
                                  differs, a master that is not one any more); the replica retries later
    DATA       master -> replica  offset u64, commit u64, then CommitLog bytes from `offset`
    HEARTBEAT  master -> replica  master end u64, commit u64 (the link is idle)
    ACK        replica -> master  end u64: the replica holds every byte below it (written, and flushed when the
                                  group flushes synchronously)
    LOG_STARTS master -> replica  JSON: [[topic, queue, log start], ...] of every queue that does not start at 0,
                                  sent first and whenever one moved (DeleteRecords, retention): a replica's
                                  queues start where the master's do, so a failover does not bring deleted
                                  records back

The same listener serves one more conversation, between broker groups: a partition moving to another group
(mqk.broker.moves) is copied by the target group's master, which asks the source group's master:

    FETCH      copier -> master   JSON: cluster id, topic, topic id, partition, offset, max bytes
    FETCHED    master -> copier   log start u64, end u64, high watermark u64, flags u8 (1: sealed, the source
                                  takes no more writes for the partition; 2: stable, no Kafka transaction is
                                  under way in it), then whole record batches as stored,
                                  from the one holding `offset`, below the high watermark
    PARTITION_STATES copier <-> master  JSON: asked with the FETCH fields (no offset), answered, once the source is
                                  sealed, with what is kept beside the partition's records: its share groups'
                                  states {"share": {group: state}} and the consumer offsets committed to this
                                  group for it (RocketMQ's) {"offsets": {group: [offset, metadata]}}

`commit` is the master's commit offset: every in-sync replica holds the bytes below it (Kafka's high watermark, in
CommitLog bytes). A frame whose declared length is over its kind's limit, of an unknown kind, or whose body does
not decode is a `ProtocolError`: the link is closed and logged, never trusted further.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from mqk.errors import FrameTooLarge, ProtocolError

VERSION = 1
HEAD = struct.Struct(">IB")
HELLO, START, REFUSE, DATA, HEARTBEAT, ACK, FETCH, FETCHED, LOG_STARTS, PARTITION_STATES = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
KIND_NAMES = {
    HELLO: "HELLO",
    START: "START",
    REFUSE: "REFUSE",
    DATA: "DATA",
    HEARTBEAT: "HEARTBEAT",
    ACK: "ACK",
    FETCH: "FETCH",
    FETCHED: "FETCHED",
    LOG_STARTS: "LOG_STARTS",
    PARTITION_STATES: "PARTITION_STATES",
}
_U64X2 = struct.Struct(">QQ")
_U64 = struct.Struct(">Q")
_FETCHED = struct.Struct(">QQQB")
FETCHED_SEALED = 1
#: no Kafka transaction is under way in the partition (its markers all written)
FETCHED_STABLE = 2
#: CommitLog bytes one DATA frame carries at most
DATA_CHUNK = 1 << 20
#: the record batches one FETCHED frame carries at most (one batch alone may be bigger than a FETCH asks for)
FETCHED_MAX = 128 << 20
#: the largest body each kind may declare (checked before anything is allocated for it)
MAX_BODY = {
    HELLO: 1 << 20,
    START: 64 << 20,  # the master's epoch history, with each epoch's partition ends
    REFUSE: 1 << 16,
    DATA: _U64X2.size + DATA_CHUNK,
    HEARTBEAT: _U64X2.size,
    ACK: _U64.size,
    FETCH: 1 << 16,
    FETCHED: _FETCHED.size + FETCHED_MAX,
    LOG_STARTS: 64 << 20,
    PARTITION_STATES: 64 << 20,
}


def parse_head(head: bytes) -> tuple[int, int]:
    """(kind, body length) of a frame head; ProtocolError for an unknown kind, FrameTooLarge over its limit."""
    length, kind = HEAD.unpack(head)
    limit = MAX_BODY.get(kind)
    if limit is None:
        raise ProtocolError(f"replication frame of unknown kind {kind}")
    if length > limit:
        raise FrameTooLarge(f"replication {KIND_NAMES[kind]} frame of {length} bytes (limit {limit})")
    return kind, length


def control(kind: int, doc: dict[str, Any]) -> bytes:
    body = json.dumps(doc, separators=(",", ":")).encode()
    if len(body) > MAX_BODY[kind]:
        raise FrameTooLarge(f"replication {KIND_NAMES[kind]} of {len(body)} bytes")
    return HEAD.pack(len(body), kind) + body


def decode_control(kind: int, body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"replication {KIND_NAMES[kind]}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"replication {KIND_NAMES[kind]}: not a JSON object")
    return doc


def data_head(offset: int, commit: int, size: int) -> bytes:
    """The head and fixed fields of a DATA frame; the CommitLog bytes follow as they are (no copy into it)."""
    return HEAD.pack(_U64X2.size + size, DATA) + _U64X2.pack(offset, commit)


def decode_data(body: bytes | memoryview) -> tuple[int, int, memoryview]:
    if len(body) < _U64X2.size:
        raise ProtocolError("replication DATA frame shorter than its fixed fields")
    offset, commit = _U64X2.unpack_from(body)
    return offset, commit, memoryview(body)[_U64X2.size :]


def heartbeat(end: int, commit: int) -> bytes:
    return HEAD.pack(_U64X2.size, HEARTBEAT) + _U64X2.pack(end, commit)


def decode_heartbeat(body: bytes) -> tuple[int, int]:
    if len(body) != _U64X2.size:
        raise ProtocolError("replication HEARTBEAT frame of the wrong size")
    end, commit = _U64X2.unpack(body)
    return end, commit


def ack(end: int) -> bytes:
    return HEAD.pack(_U64.size, ACK) + _U64.pack(end)


def decode_ack(body: bytes) -> int:
    if len(body) != _U64.size:
        raise ProtocolError("replication ACK frame of the wrong size")
    end: int = _U64.unpack(body)[0]
    return end


def fetched_head(log_start: int, end: int, high_watermark: int, flags: int, size: int) -> bytes:
    """The head and fixed fields of a FETCHED frame; `size` bytes of record batches follow."""
    if size > FETCHED_MAX:
        raise FrameTooLarge(f"replication FETCHED of {size} bytes of batches (limit {FETCHED_MAX})")
    return HEAD.pack(_FETCHED.size + size, FETCHED) + _FETCHED.pack(log_start, end, high_watermark, flags)


def decode_fetched(body: bytes) -> tuple[int, int, int, int, memoryview]:
    """(log start, end, high watermark, flags, record batches) of a FETCHED body."""
    if len(body) < _FETCHED.size:
        raise ProtocolError("replication FETCHED frame shorter than its fixed fields")
    log_start, end, high_watermark, flags = _FETCHED.unpack_from(body)
    return log_start, end, high_watermark, flags, memoryview(body)[_FETCHED.size :]


def field(doc: dict[str, Any], name: str, kind: type, what: str) -> Any:
    """A required field of a control frame, of the given type (ProtocolError otherwise)."""
    value = doc.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(f"replication {what}: {name!r} missing or not {kind.__name__}")
    return value


__all__ = [
    "ACK",
    "DATA",
    "DATA_CHUNK",
    "FETCH",
    "FETCHED",
    "FETCHED_MAX",
    "FETCHED_SEALED",
    "FETCHED_STABLE",
    "HEAD",
    "HEARTBEAT",
    "HELLO",
    "LOG_STARTS",
    "PARTITION_STATES",
    "REFUSE",
    "START",
    "VERSION",
    "ack",
    "control",
    "data_head",
    "decode_ack",
    "decode_control",
    "decode_data",
    "decode_fetched",
    "decode_heartbeat",
    "fetched_head",
    "field",
    "heartbeat",
    "parse_head",
]
