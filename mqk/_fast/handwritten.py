"""Shared by the hand-written codecs: `Decline`, which both builds of an encoder (produceresp, fetchresp) or a
decoder (fetchreq) raise for a body they leave to the generated codec; and the encoder twins' writers of answer
fields (the compiled modules' side is _out.pxd). A field is taken only as an int within its range, an array only
as a list or tuple; anything else is declined, and the generated encoder then encodes it or raises its own error.
"""

from __future__ import annotations

import struct
from typing import Any
from uuid import UUID

I16_RANGE = (-(1 << 15), (1 << 15) - 1)
I32_RANGE = (-(1 << 31), (1 << 31) - 1)
I64_RANGE = (-(1 << 63), (1 << 63) - 1)
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class Decline(Exception):
    """The body is not the usual one (an unusual answer, a tagged field in a request): the generated codec takes
    it."""


def dict_int(d: dict[str, Any], key: str, default: int, bounds: tuple[int, int]) -> int:
    v = d.get(key, default)
    if not isinstance(v, int) or not bounds[0] <= v <= bounds[1]:
        raise Decline
    return v


def dict_seq(d: dict[str, Any], key: str) -> list[Any] | tuple[Any, ...]:
    v = d.get(key, ())
    if v.__class__ is not list and v.__class__ is not tuple:
        raise Decline
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
            raise Decline
        b += _I16.pack(n)
    else:
        b += _I32.pack(n)


def put_topic(b: bytearray, topic: dict[str, Any], name_key: str, by_id: bool, compact: bool) -> None:
    """A topic's 16-byte id (`topic_id`, a uuid.UUID, default zero) from v13, else its name (`name_key`, a str,
    default "")."""
    if by_id:
        topic_id = topic.get("topic_id", _ZERO_UUID)
        if topic_id.__class__ is not UUID:
            raise Decline
        b += topic_id.bytes
        return
    name = topic.get(name_key, "")
    if name.__class__ is not str:
        raise Decline
    name = name.encode()
    put_length(b, len(name), compact, True)
    b += name


_ZERO_UUID = UUID(int=0)
