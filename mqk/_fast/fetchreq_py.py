"""Fetch request bodies decoded by hand, pure Python: the twin of `fetchreq.pyx` (same API, identical results).

A consumer sends every partition assigned to it in every Fetch; the generated decoder
(mqk.protocol.kafka.messages.decode_request) does Python work for each, so a consumer of a 1,000-partition topic
would cost the broker a thousand times that per Fetch before anything is read. `decode_fetch_request`
answers exactly what the generated decoder answers for Fetch v4..v17, the same dict for the bytes it accepts, and
refuses what it refuses (tests/unit/test_fast_fetchreq.py holds both twins to that), except that it declines
(returns handwritten.DECLINE_FIELD) a body with a tagged field anywhere: the generated decoder then decodes it
(cluster_id, replica_state, a partition's replica_directory_id, fields this broker does not use and consumers do
not send).

Layout: replica_id (v4..v14; from v15 it is -1 and replica_state says who fetches), max_wait_ms, min_bytes,
max_bytes, isolation_level (int8), session_id and session_epoch (v7+), topics [name (v4..v12) or 16-byte topic id
(v13+), partitions [partition, current_leader_epoch (v9+), fetch_offset, last_fetched_epoch (v12+),
log_start_offset (v5+), partition_max_bytes]], forgotten_topics_data (v7+) [name or id, partitions [int32]],
rack_id (v11+). v4..v11 int16-length strings and int32-length arrays; v12+ (flexible) unsigned-varint lengths + 1
and a tagged-field section after each struct. Fields a version does not carry get the generated decoder's
defaults. Trailing bytes are ignored, as the generated decoder ignores them. Malformed bytes raise ValueError
(UnicodeDecodeError for a name that is not UTF-8); the protocol layer turns that into MalformedMessage.
"""

from __future__ import annotations

import struct
from typing import Any
from uuid import UUID

from mqk._fast import handwritten as _hw
from mqk._fast.handwritten import Decline
from mqk._fast.producereq_py import Cursor

ZERO_UUID = UUID(int=0)
FIRST_VERSION = 4
LAST_VERSION = 17
_NO_HIGH_WATERMARK = (1 << 63) - 1  # the generated decoder's default for a partition's (v18) high_watermark


def _no_tags(c: Cursor) -> None:
    """An empty tagged-field section (one zero byte); anything else is declined, a count spelt in more than one
    byte too (the generated decoder reads that)."""
    c.need(1)
    if c.buf[c.pos]:
        raise Decline(_hw.DECLINE_FIELD)
    c.pos += 1


def _name(c: Cursor, compact: bool, by_id: bool) -> tuple[str, UUID]:
    """A topic's (name, id) as the generated decoder gives them: the id is the zero UUID before v13, the name ""
    from v13."""
    if by_id:
        return "", UUID(bytes=c.raw16())
    size = c.length(compact)
    if size < 0:
        raise ValueError("null topic")
    return c.string(size), ZERO_UUID


def decode_fetch_request(buf: memoryview, version: int) -> dict[str, Any] | int:
    """A Fetch request body (no frame size, no request header) of `version` (4..17) -> the generated decoder's
    dict, or handwritten.DECLINE_FIELD for a body with a tagged field (see the module docstring). Malformed bytes raise
    ValueError."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        raise ValueError(f"Fetch v{version} is not decoded here")
    try:
        return _decode(Cursor(buf), version)
    except Decline as exc:
        return exc.reason


#: a partition's fixed fields per version: partition, [current_leader_epoch v9+], fetch_offset,
#: [last_fetched_epoch v12+], [log_start_offset v5+], partition_max_bytes
_PARTITION = {
    4: struct.Struct(">iqi"),
    5: struct.Struct(">iqqi"),
    9: struct.Struct(">iiqqi"),
    12: struct.Struct(">iiqiqi"),
}


def _decode(c: Cursor, version: int) -> dict[str, Any]:
    compact = version >= 12
    fixed = _PARTITION[12 if version >= 12 else 9 if version >= 9 else 5 if version >= 5 else 4]
    size, unpack = fixed.size, fixed.unpack_from
    by_id = version >= 13
    replica_id = c.i32() if version <= 14 else -1
    max_wait_ms = c.i32()
    min_bytes = c.i32()
    max_bytes = c.i32()
    isolation_level = c.i8()
    session_id, session_epoch = (c.i32(), c.i32()) if version >= 7 else (0, -1)
    topics = []
    for _ in range(c.array_length(compact, "topics")):
        name, topic_id = _name(c, compact, by_id)
        partitions = []
        count = c.array_length(compact, "partitions")
        # the partitions' loop reads the buffer directly: a consumer of a large topic sends a thousand of them
        buf, end, pos = c.buf, c.n, c.pos
        for _ in range(count):
            if size > end - pos:
                raise ValueError(f"truncated at byte {pos}")
            fields = unpack(buf, pos)  # the fixed fields in one unpack, the absent ones as their defaults
            pos += size
            if version >= 12:
                partition, current_leader_epoch, fetch_offset, last_fetched_epoch, log_start_offset, max_b = fields
            elif version >= 9:
                partition, current_leader_epoch, fetch_offset, log_start_offset, max_b = fields
                last_fetched_epoch = -1
            elif version >= 5:
                partition, fetch_offset, log_start_offset, max_b = fields
                current_leader_epoch = last_fetched_epoch = -1
            else:
                partition, fetch_offset, max_b = fields
                current_leader_epoch = last_fetched_epoch = log_start_offset = -1
            if compact:  # _no_tags
                if pos >= end:
                    raise ValueError(f"truncated at byte {pos}")
                if buf[pos]:
                    raise Decline(_hw.DECLINE_FIELD)
                pos += 1
            partitions.append(
                {
                    "partition": partition,
                    "current_leader_epoch": current_leader_epoch,
                    "fetch_offset": fetch_offset,
                    "last_fetched_epoch": last_fetched_epoch,
                    "log_start_offset": log_start_offset,
                    "partition_max_bytes": max_b,
                    "replica_directory_id": ZERO_UUID,
                    "high_watermark": _NO_HIGH_WATERMARK,
                }
            )
        c.pos = pos
        if compact:
            _no_tags(c)
        topics.append({"topic": name, "topic_id": topic_id, "partitions": partitions})
    forgotten = []
    if version >= 7:
        for _ in range(c.array_length(compact, "forgotten_topics_data")):
            name, topic_id = _name(c, compact, by_id)
            forgotten.append(
                {
                    "topic": name,
                    "topic_id": topic_id,
                    "partitions": [c.i32() for _ in range(c.array_length(compact, "partitions"))],
                }
            )
            if compact:
                _no_tags(c)
    rack_id = ""
    if version >= 11:
        size = c.length(compact)
        if size < 0:
            raise ValueError("null rack_id")
        rack_id = c.string(size)
    if compact:
        _no_tags(c)
    return {
        "cluster_id": None,
        "replica_id": replica_id,
        "replica_state": {"replica_id": -1, "replica_epoch": -1},
        "max_wait_ms": max_wait_ms,
        "min_bytes": min_bytes,
        "max_bytes": max_bytes,
        "isolation_level": isolation_level,
        "session_id": session_id,
        "session_epoch": session_epoch,
        "topics": topics,
        "forgotten_topics_data": forgotten,
        "rack_id": rack_id,
    }
