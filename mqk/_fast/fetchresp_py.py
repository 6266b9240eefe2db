"""Fetch response bodies encoded by hand, pure Python: the twin of `fetchresp.pyx` (same API, identical bytes).

A consumer assigned many partitions sends all of them in every Fetch and gets an answer for each, most of them
offsets only; the generated encoder (mqk.protocol.kafka.messages) does Python work for each, which a
1,000-partition answer pays a thousand times. `encode_fetch_response` writes what the generated encoder writes
for Fetch v4..v17, but only for the answer the broker gives: every field an int (bool included) in its range, topics by
name (an exact str) before v13 and by uuid.UUID from v13, aborted transactions None or a list/tuple of
{producer_id, first_offset}, records None, a bytes-like (bytes, bytearray, memoryview) or a list/tuple of them,
no diverging_epoch, current_leader or snapshot_id (absent or None), no node_endpoints. For anything else it
returns why (a `handwritten.DECLINE_*` code) and leaves `out` as it was, so the caller uses the generated encoder,
which then also raises its own errors for bad values.

It returns the response as a list of buffers for `transport.writelines`, `out` first (with the leading bytes
appended): a partition's records, when they are a list of buffers or a bytes-like of at least `INLINE_MAX` bytes,
are passed on as they are, never copied, as the generated encoder does.

Layout: v4..v11 int16-length strings, int32-length arrays and records (-1: null), v5+ log_start_offset, v7+
the body's error_code and session_id, v11+ preferred_read_replica; v12+ (flexible) unsigned-varint lengths + 1
and an empty tagged-field section after each aborted transaction, partition and topic and the body; v13 a
topic's 16-byte id in place of its name. tests/unit/test_fast_fetchresp.py holds both twins to the generated
encoder's bytes.
"""

from __future__ import annotations

import struct
from typing import Any

from mqk._fast import handwritten as _hw
from mqk._fast.handwritten import (
    I16_RANGE,
    I32_RANGE,
    I64_RANGE,
    Decline,
    dict_int,
    dict_seq,
    put_length,
    put_topic,
    written,
)

FIRST_VERSION = 4
LAST_VERSION = 17
#: records shorter than this are copied into the answer's bytes (as the generated encoder does)
INLINE_MAX = 4096

_I32 = struct.Struct(">i")
_HEAD_V7 = struct.Struct(">ihi")
_PART_V4 = struct.Struct(">ihqq")
_PART_V5 = struct.Struct(">ihqqq")
_ABORTED = struct.Struct(">qq")
_BYTES_LIKE = (bytes, bytearray, memoryview)


def encode_fetch_response(body: Any, version: int, out: bytearray) -> list[bytes | bytearray | memoryview] | int:
    """The Fetch response body of `version` for `body` as [out + its first bytes, further buffers...], or, when
    `body` is not the usual answer, why (a DECLINE_* code; `out` left alone); see the module docstring."""
    parts = written(_write, body, version, FIRST_VERSION, LAST_VERSION)
    if isinstance(parts, int):
        return parts
    out += parts[0]
    parts[0] = out
    return parts


def _write(body: dict[str, Any], version: int) -> list[Any]:
    compact = version >= 12
    if version >= 16 and body.get("node_endpoints"):
        raise Decline(_hw.DECLINE_FIELD)
    parts: list[Any] = []
    b = bytearray()
    throttle = dict_int(body, "throttle_time_ms", 0, I32_RANGE)
    if version >= 7:
        b += _HEAD_V7.pack(
            throttle, dict_int(body, "error_code", 0, I16_RANGE), dict_int(body, "session_id", 0, I32_RANGE)
        )
    else:
        b += _I32.pack(throttle)
    responses = dict_seq(body, "responses")
    put_length(b, len(responses), compact)
    for topic in responses:
        if topic.__class__ is not dict:
            raise Decline(_hw.DECLINE_SHAPE)
        put_topic(b, topic, "topic", version >= 13, compact)
        partitions = dict_seq(topic, "partitions")
        put_length(b, len(partitions), compact)
        for p in partitions:
            if p.__class__ is not dict:
                raise Decline(_hw.DECLINE_SHAPE)
            head = (
                dict_int(p, "partition_index", 0, I32_RANGE),
                dict_int(p, "error_code", 0, I16_RANGE),
                dict_int(p, "high_watermark", 0, I64_RANGE),
                dict_int(p, "last_stable_offset", -1, I64_RANGE),
            )
            if version >= 5:
                b += _PART_V5.pack(*head, dict_int(p, "log_start_offset", -1, I64_RANGE))
            else:
                b += _PART_V4.pack(*head)
            if compact and (
                p.get("diverging_epoch") is not None
                or p.get("current_leader") is not None
                or p.get("snapshot_id") is not None
            ):
                raise Decline(_hw.DECLINE_FIELD)
            aborted = p.get("aborted_transactions", ())
            if aborted is None:
                put_length(b, -1, compact)
            elif aborted.__class__ is list or aborted.__class__ is tuple:
                put_length(b, len(aborted), compact)
                for txn in aborted:
                    if txn.__class__ is not dict:
                        raise Decline(_hw.DECLINE_SHAPE)
                    b += _ABORTED.pack(
                        dict_int(txn, "producer_id", 0, I64_RANGE), dict_int(txn, "first_offset", 0, I64_RANGE)
                    )
                    if compact:
                        b.append(0)
            else:
                raise Decline(_hw.DECLINE_SHAPE)
            if version >= 11:
                b += _I32.pack(dict_int(p, "preferred_read_replica", -1, I32_RANGE))
            records = p.get("records")
            if records is None:
                put_length(b, -1, compact)
            elif records.__class__ is list or records.__class__ is tuple:
                size = 0
                for chunk in records:
                    if chunk.__class__ not in _BYTES_LIKE:
                        raise Decline(_hw.DECLINE_SHAPE)
                    size += len(chunk)
                put_length(b, size, compact)
                parts.append(b)
                parts.extend(records)
                b = bytearray()
            elif records.__class__ in _BYTES_LIKE:
                put_length(b, len(records), compact)
                if len(records) >= INLINE_MAX:
                    parts.append(b)
                    parts.append(records)
                    b = bytearray()
                else:
                    b += records
            else:
                raise Decline(_hw.DECLINE_SHAPE)
            if compact:
                b.append(0)  # no tagged fields
        if compact:
            b.append(0)
    if compact:
        b.append(0)
    parts.append(b)
    return parts
