"""Shared by the hand-written codecs: `Decline`, which both builds of an encoder (produceresp, fetchresp) or a
decoder (fetchreq) raise for a body they leave to the generated codec; and the encoder twins' writers of answer
fields (the compiled modules' side is _out.pxd). A field is taken only as an int within its range, an array only
as a list or tuple; anything else is declined, and the generated encoder then encodes it or raises its own error.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

I16_RANGE = (-(1 << 15), (1 << 15) - 1)
I32_RANGE = (-(1 << 31), (1 << 31) - 1)
I64_RANGE = (-(1 << 63), (1 << 63) - 1)
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


#: why a hand-written codec left a body to the generated codec (0: it took the body). The entry points return
#: these; `Decline` carries one from where the kernel found it up to its entry point.
DECLINE_NONE = 0
#: the version is outside the kernel's range
DECLINE_VERSION = 1
#: a body, topic, partition, array or records value of another type than the usual answer's
DECLINE_SHAPE = 2
#: an integer field that is not an int, or outside its field's range (a length too, in its width)
DECLINE_VALUE = 3
#: a topic name or message that is not a str (or does not encode), a topic id that is not a UUID
DECLINE_TEXT = 4
#: a field the kernel does not write or read: a tagged field (in a request, or an answer's optional one such as
#: node_endpoints or current_leader) or a Produce answer's record_errors
DECLINE_FIELD = 5


class Decline(Exception):
    """The body is not the usual one: the generated codec takes it. `reason` is a DECLINE_* code, which the
    kernel's entry point returns."""

    def __init__(self, reason: int) -> None:
        super().__init__(reason)
        self.reason = reason


_T = TypeVar("_T")


def written(write: Callable[[dict[str, Any], int], _T], body: Any, version: int, first: int, last: int) -> _T | int:
    """An encoder twin's entry point: `write(body, version)`, or why the body is declined: DECLINE_VERSION for a
    version outside [first, last], DECLINE_SHAPE for a body that is not a dict, else the reason the `Decline`
    raised where the writer found it carries. Nothing else is caught: every field is checked before it is
    written (dict_int, dict_seq, put_text), so any other exception is a fault of the writer's, and it propagates."""
    if not first <= version <= last:
        return DECLINE_VERSION
    if body.__class__ is not dict:
        return DECLINE_SHAPE
    try:
        return write(body, version)
    except Decline as exc:
        return exc.reason


def dict_int(d: dict[str, Any], key: str, default: int, bounds: tuple[int, int]) -> int:
    v = d.get(key, default)
    if not isinstance(v, int) or not bounds[0] <= v <= bounds[1]:
        raise Decline(DECLINE_VALUE)
    return v


def put_text(b: bytearray, text: Any, compact: bool) -> None:
    """A topic name or message: its int16 length and UTF-8 bytes. Declined (DECLINE_TEXT) when it is not a str, or
    holds what UTF-8 cannot encode (a lone surrogate)."""
    if text.__class__ is not str:
        raise Decline(DECLINE_TEXT)
    try:
        data = text.encode()
    except UnicodeEncodeError:
        raise Decline(DECLINE_TEXT) from None
    put_length(b, len(data), compact, True)
    b += data


def dict_seq(d: dict[str, Any], key: str) -> list[Any] | tuple[Any, ...]:
    v = d.get(key, ())
    if v.__class__ is not list and v.__class__ is not tuple:
        raise Decline(DECLINE_SHAPE)
    seq: list[Any] | tuple[Any, ...] = v
    return seq


def put_uvarint(b: bytearray, n: int) -> None:
    while n >= 0x80:
        b.append((n & 0x7F) | 0x80)
        n >>= 7
    b.append(n)


def put_length(b: bytearray, n: int, compact: bool, i16: bool = False) -> None:
    """An array, string or bytes length (-1: null): an unsigned varint of n + 1 in flexible versions, else an
    int16 (strings) or int32."""
    if compact:
        put_uvarint(b, n + 1)
    elif i16:
        if n > I16_RANGE[1]:
            raise Decline(DECLINE_VALUE)
        b += _I16.pack(n)
    else:
        b += _I32.pack(n)


def put_topic(b: bytearray, topic: dict[str, Any], name_key: str, by_id: bool, compact: bool) -> None:
    """A topic's 16-byte id (`topic_id`, a uuid.UUID, default zero) from v13, else its name (`name_key`, a str,
    default "")."""
    if by_id:
        topic_id = topic.get("topic_id", _ZERO_UUID)
        if topic_id.__class__ is not UUID:
            raise Decline(DECLINE_TEXT)
        b += topic_id.bytes
        return
    put_text(b, topic.get(name_key, ""), compact)


_ZERO_UUID = UUID(int=0)
