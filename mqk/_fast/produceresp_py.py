"""Produce response bodies encoded by hand, pure Python: the twin of `produceresp.pyx` (same API, identical bytes).

A Produce answer carries one small struct per partition; the generated encoder (mqk.protocol.kafka.messages) does
Python work for each, which counts when a request spreads its records over many partitions.
`encode_produce_response` writes what the generated encoder writes for Produce v3..v13, but only for the answer
the broker gives: every field an int (bool included) in its range or (error_message, name) an exact str or None, no
record_errors, no current_leader, no node_endpoints, topics by name before v13 and by uuid.UUID from v13. It returns
DECLINE_NONE when it wrote the body; for anything else, why (a `handwritten.DECLINE_*` code), leaving `out` as it
was, so the caller uses the generated encoder, which then also raises its own errors for bad values.
tests/unit/test_fast_produceresp.py holds both twins to the generated encoder's bytes.

Layout: v3..v8 int16-length strings and int32-length arrays, v5+ log_start_offset, v8+ record_errors (empty) and
error_message (null: -1); v9+ (flexible) unsigned-varint lengths + 1 and an empty tagged-field section after each
partition, topic and the body; v13 a topic's 16-byte id in place of its name.
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
    put_text,
    put_topic,
    written,
)

FIRST_VERSION = 3
LAST_VERSION = 13

_I32 = struct.Struct(">i")
_PART_V3 = struct.Struct(">ihqq")
_PART_V5 = struct.Struct(">ihqqq")


def encode_produce_response(body: Any, version: int, out: bytearray) -> int:
    """Append the Produce response body of `version` for `body` to `out` and return DECLINE_NONE (0), or, when `body`
    is not the usual answer, return why (a DECLINE_* code) and leave `out` alone; see the module docstring."""
    b = written(_write, body, version, FIRST_VERSION, LAST_VERSION)
    if isinstance(b, int):
        return b
    out += b
    return _hw.DECLINE_NONE


def _write(body: dict[str, Any], version: int) -> bytearray:
    b = bytearray()
    compact = version >= 9
    if version >= 10 and body.get("node_endpoints"):
        raise Decline(_hw.DECLINE_FIELD)
    responses = dict_seq(body, "responses")
    throttle = dict_int(body, "throttle_time_ms", 0, I32_RANGE)
    put_length(b, len(responses), compact, False)
    for topic in responses:
        if topic.__class__ is not dict:
            raise Decline(_hw.DECLINE_SHAPE)
        put_topic(b, topic, "name", version >= 13, compact)
        partitions = dict_seq(topic, "partition_responses")
        put_length(b, len(partitions), compact, False)
        for p in partitions:
            if p.__class__ is not dict:
                raise Decline(_hw.DECLINE_SHAPE)
            head = (
                dict_int(p, "index", 0, I32_RANGE),
                dict_int(p, "error_code", 0, I16_RANGE),
                dict_int(p, "base_offset", 0, I64_RANGE),
                dict_int(p, "log_append_time_ms", -1, I64_RANGE),
            )
            if version >= 5:
                b += _PART_V5.pack(*head, dict_int(p, "log_start_offset", -1, I64_RANGE))
            else:
                b += _PART_V3.pack(*head)
            if version >= 8:
                if dict_seq(p, "record_errors"):
                    raise Decline(_hw.DECLINE_FIELD)
                put_length(b, 0, compact, False)
                message = p.get("error_message")
                if message is None:
                    if compact:
                        b.append(0)
                    else:
                        b += b"\xff\xff"
                else:
                    put_text(b, message, compact)
            if version >= 10 and p.get("current_leader") is not None:
                raise Decline(_hw.DECLINE_FIELD)
            if compact:
                b.append(0)  # no tagged fields
        if compact:
            b.append(0)
    b += _I32.pack(throttle)
    if compact:
        b.append(0)
    return b
