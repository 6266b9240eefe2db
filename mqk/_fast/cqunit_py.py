"""ConsumeQueue unit kernels, pure Python: the twin of `cqunit.pyx`, same API, identical results.

Owns the 48-byte unit layout (big-endian) and the two binary searches over a run of units:
  0 physical_offset i64 | 8 size i32 | 12 record_count i32 | 16 tags_code i64 | 24 store_timestamp i64 |
  32 max_timestamp i64 | 40 base_offset i64
A unit covers the queue offsets [base_offset, base_offset + record_count). For a compacted Kafka batch (fewer
records than offsets) the writer should store the batch's offset span, last_offset_delta + 1, as record_count, or
`search_offset` will step past offsets that are still in the batch. `max_timestamp` is the running maximum over the
queue up to that unit, so it never decreases and `search_timestamp` may bisect it. Units are sorted by base_offset.

Also RocketMQ's tags code: `hash_tag` is Java's String.hashCode (over UTF-16 code units, int32 arithmetic).
Reads or writes outside the buffer raise `OutOfBounds`.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from mqk._fast.api import Unit
from mqk._fast.recbatch_py import _i32, _i64, _ssize, _view, _writable
from mqk.errors import OutOfBounds

if TYPE_CHECKING:
    from typing_extensions import Buffer

UNIT_SIZE = 48
_UNIT = struct.Struct(">qiiqqqq")
_I64 = struct.Struct(">q")
_BASE_AT = 40
_COUNT_AT = 12
_MAX_TS_AT = 32


def pack_unit(
    buf: Buffer,
    pos: int,
    physical_offset: int,
    size: int,
    record_count: int,
    tags_code: int,
    store_ts: int,
    max_ts: int,
    base_offset: int,
) -> None:
    pos = _ssize(pos)
    fields = (
        _i64(physical_offset),
        _i32(size),
        _i32(record_count),
        _i64(tags_code),
        _i64(store_ts),
        _i64(max_ts),
        _i64(base_offset),
    )
    mv = _writable(buf)
    if pos < 0 or mv.nbytes - pos < UNIT_SIZE:
        raise OutOfBounds(f"unit at {pos} outside buffer of {mv.nbytes} bytes")
    _UNIT.pack_into(mv, pos, *fields)


def unpack_unit(buf: Buffer, pos: int) -> Unit:
    """(physical_offset, size, record_count, tags_code, store_ts, max_ts, base_offset) of the unit at `pos`."""
    pos = _ssize(pos)
    mv = _view(buf)
    if pos < 0 or mv.nbytes - pos < UNIT_SIZE:
        raise OutOfBounds(f"unit at {pos} outside buffer of {mv.nbytes} bytes")
    unit: Unit = _UNIT.unpack_from(mv, pos)
    return unit


def _units(mv: memoryview, n_units: int) -> tuple[memoryview, int]:
    if n_units < 0 or n_units > mv.nbytes // UNIT_SIZE:
        raise OutOfBounds(f"{n_units} units do not fit buffer of {mv.nbytes} bytes")
    return mv, n_units


def search_offset(buf: Buffer, n_units: int, offset: int) -> int:
    """Index of the unit holding queue offset `offset`; the next unit if it falls in a gap; -1 if it is below the
    first unit's base; n_units if it is past the last unit (or there are no units)."""
    # every argument is coerced before any check, in order, as the compiled module's typed arguments are
    mv, n_units, offset = _view(buf), _ssize(n_units), _i64(offset)
    mv, n = _units(mv, n_units)
    unpack = _I64.unpack_from
    # Bisect for the last unit with base_offset <= offset.
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) >> 1
        if unpack(mv, mid * UNIT_SIZE + _BASE_AT)[0] <= offset:
            lo = mid + 1
        else:
            hi = mid
    if lo == 0:
        return -1 if n else 0
    i = lo - 1
    at = i * UNIT_SIZE
    base: int = unpack(mv, at + _BASE_AT)[0]
    count: int = struct.unpack_from(">i", mv, at + _COUNT_AT)[0]
    # Python ints do not overflow; the compiled twin compares the same way without forming base + count.
    if offset - base < count:
        return i
    return i + 1


def search_timestamp(buf: Buffer, n_units: int, ts: int) -> int:
    """Index of the first unit whose max_timestamp >= ts, or n_units."""
    # every argument is coerced before any check, in order, as the compiled module's typed arguments are
    mv, n_units, ts = _view(buf), _ssize(n_units), _i64(ts)
    mv, n = _units(mv, n_units)
    unpack = _I64.unpack_from
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) >> 1
        if unpack(mv, mid * UNIT_SIZE + _MAX_TS_AT)[0] < ts:
            lo = mid + 1
        else:
            hi = mid
    return lo


def hash_tag(tag: str) -> int:
    """Java's String.hashCode of `tag` (UTF-16 code units, int32 overflow), as a signed int."""
    if not isinstance(tag, str):
        raise TypeError("tag must be str")
    h = 0
    for ch in tag:
        c = ord(ch)
        if c > 0xFFFF:
            c -= 0x10000
            h = (31 * h + (0xD800 | (c >> 10))) & 0xFFFFFFFF
            h = (31 * h + (0xDC00 | (c & 0x3FF))) & 0xFFFFFFFF
        else:
            h = (31 * h + c) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h
