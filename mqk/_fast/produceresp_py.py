"""Produce response bodies encoded by hand, pure Python: the twin of `produceresp.pyx` (same API, identical bytes).

A Produce answer carries one small struct per partition; the generated encoder (mqk.protocol.kafka.messages) spends
about half a microsecond on each in Python, which counts when a request spreads its records over many partitions.
`encode_produce_response` writes what the generated encoder writes for Produce v3..v13, but only for the answer
the broker gives: every field an exact int in its range or (error_message, name) an exact str or None, no
record_errors, no current_leader, no node_endpoints, topics by name before v13 and by uuid.UUID from v13. For
anything else it returns False and leaves `out` as it was, so the caller uses the generated encoder, which then
also raises its own errors for bad values. tests/unit/test_fast_produceresp.py holds both twins to the generated
encoder's bytes.

Layout: v3..v8 int16-length strings and int32-length arrays, v5+ log_start_offset, v8+ record_errors (empty) and
error_message (null: -1); v9+ (flexible) unsigned-varint lengths + 1 and an empty tagged-field section after each
partition, topic and the body; v13 a topic's 16-byte id in place of its name.
"""
from __future__ import annotations

import struct
from uuid import UUID

FIRST_VERSION = 3
LAST_VERSION = 13

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PART_V3 = struct.Struct(">ihqq")
_PART_V5 = struct.Struct(">ihqqq")
_I16_RANGE = (-(1 << 15), (1 << 15) - 1)
_I32_RANGE = (-(1 << 31), (1 << 31) - 1)
_I64_RANGE = (-(1 << 63), (1 << 63) - 1)


class _Decline(Exception):
    """The body is not the usual answer: the generated encoder takes it."""


def _int(d: dict, key: str, default: int, bounds: tuple[int, int]) -> int:
    v = d.get(key, default)
    if v.__class__ is not int or not bounds[0] <= v <= bounds[1]:
        raise _Decline
    return v


def _uvarint(b: bytearray, n: int) -> None:
    while n >= 0x80:
        b.append((n & 0x7F) | 0x80)
        n >>= 7
    b.append(n)


def _length(b: bytearray, n: int, compact: bool, i16: bool) -> None:
    if compact:
        _uvarint(b, n + 1)
    elif i16:
        if n > _I16_RANGE[1]:
            raise _Decline
        b += _I16.pack(n)
    else:
        b += _I32.pack(n)


def _seq(d: dict, key: str) -> list | tuple:
    v = d.get(key, ())
    if v.__class__ is not list and v.__class__ is not tuple:
        raise _Decline
    return v


def encode_produce_response(body, version: int, out: bytearray) -> bool:
    """Append the Produce response body of `version` for `body` to `out` and return True, or return False (and
    leave `out` alone) when `body` is not the usual answer; see the module docstring."""
    if not FIRST_VERSION <= version <= LAST_VERSION or body.__class__ is not dict:
        return False
    try:
        b = bytearray()
        _write(b, body, version)
    except (_Decline, UnicodeEncodeError):
        return False
    out += b
    return True


def _write(b: bytearray, body: dict, version: int) -> None:
    compact = version >= 9
    if version >= 10 and body.get("node_endpoints"):
        raise _Decline
    responses = _seq(body, "responses")
    throttle = _int(body, "throttle_time_ms", 0, _I32_RANGE)
    _length(b, len(responses), compact, False)
    for topic in responses:
        if topic.__class__ is not dict:
            raise _Decline
        if version >= 13:
            topic_id = topic.get("topic_id", _ZERO_UUID)
            if topic_id.__class__ is not UUID:
                raise _Decline
            b += topic_id.bytes
        else:
            name = topic.get("name", "")
            if name.__class__ is not str:
                raise _Decline
            name = name.encode()
            _length(b, len(name), compact, True)
            b += name
        partitions = _seq(topic, "partition_responses")
        _length(b, len(partitions), compact, False)
        for p in partitions:
            if p.__class__ is not dict:
                raise _Decline
            head = (_int(p, "index", 0, _I32_RANGE), _int(p, "error_code", 0, _I16_RANGE),
                    _int(p, "base_offset", 0, _I64_RANGE), _int(p, "log_append_time_ms", -1, _I64_RANGE))
            if version >= 5:
                b += _PART_V5.pack(*head, _int(p, "log_start_offset", -1, _I64_RANGE))
            else:
                b += _PART_V3.pack(*head)
            if version >= 8:
                if _seq(p, "record_errors"):
                    raise _Decline
                _length(b, 0, compact, False)
                message = p.get("error_message")
                if message is None:
                    if compact:
                        b.append(0)
                    else:
                        b += b"\xff\xff"
                elif message.__class__ is str:
                    message = message.encode()
                    _length(b, len(message), compact, True)
                    b += message
                else:
                    raise _Decline
            if version >= 10 and p.get("current_leader") is not None:
                raise _Decline
            if compact:
                b.append(0)  # no tagged fields
        if compact:
            b.append(0)
    b += _I32.pack(throttle)
    if compact:
        b.append(0)


_ZERO_UUID = UUID(int=0)
