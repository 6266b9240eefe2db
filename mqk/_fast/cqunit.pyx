# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""ConsumeQueue unit kernels, compiled: the hot-path twin of `cqunit_py.py` (same API, identical results).

Every fetch runs `search_offset`, every ListOffsets-by-time runs `search_timestamp`: plain C binary searches over
the mapped units, with the unit count checked against the buffer once before the search. See cqunit_py.py for the
layout and the meaning of record_count and max_timestamp.
"""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from cpython.buffer cimport PyBuffer_Release

from mqk._fast._bytes cimport as_i32, borrow, borrow_writable, ld_i32, ld_i64, st_cq_unit

from mqk.errors import OutOfBounds

if sizeof(Py_ssize_t) != 8:
    raise ImportError("mqk._fast kernels need a 64-bit Py_ssize_t; the pure-Python twins are used instead")

UNIT_SIZE = 48
DEF C_UNIT = 48
DEF C_BASE_AT = 40
DEF C_COUNT_AT = 12
DEF C_MAX_TS_AT = 32


def pack_unit(buf, Py_ssize_t pos, Py_ssize_t physical_offset, Py_ssize_t size, Py_ssize_t record_count,
              Py_ssize_t tags_code, Py_ssize_t store_ts, Py_ssize_t max_ts, Py_ssize_t base_offset):
    cdef int32_t c_size = as_i32(size), c_count = as_i32(record_count)
    cdef Py_buffer view
    borrow_writable(buf, &view)
    try:
        if pos < 0 or C_UNIT > view.len - pos:
            raise OutOfBounds(f"unit at {pos} outside buffer of {view.len} bytes")
        st_cq_unit(<unsigned char*>view.buf + pos, physical_offset, <uint32_t>c_size, <uint32_t>c_count, tags_code,
                   store_ts, max_ts, base_offset)
    finally:
        PyBuffer_Release(&view)


def unpack_unit(buf, Py_ssize_t pos):
    cdef Py_buffer view
    cdef const unsigned char* u
    borrow(buf, &view)
    try:
        if pos < 0 or C_UNIT > view.len - pos:
            raise OutOfBounds(f"unit at {pos} outside buffer of {view.len} bytes")
        u = <const unsigned char*>view.buf + pos
        return (ld_i64(u), ld_i32(u + 8), ld_i32(u + 12), ld_i64(u + 16), ld_i64(u + 24), ld_i64(u + 32),
                ld_i64(u + 40))
    finally:
        PyBuffer_Release(&view)


cdef inline int _check_units(const Py_buffer* view, Py_ssize_t n_units) except -1:
    if n_units < 0 or n_units > view.len // C_UNIT:
        raise OutOfBounds(f"{n_units} units do not fit buffer of {view.len} bytes")
    return 0


cdef inline Py_ssize_t _bisect(const unsigned char* u, Py_ssize_t n_units, Py_ssize_t field_at, int64_t key,
                               bint right) noexcept:
    """Index of the first unit whose int64 at `field_at` is > key (right) or >= key (left); the fields ascend. The
    GIL is kept: ~20 steps cost less than releasing it."""
    cdef Py_ssize_t lo = 0, hi = n_units, mid
    cdef int64_t value
    while lo < hi:
        mid = (lo + hi) >> 1
        value = ld_i64(u + mid * C_UNIT + field_at)
        if value < key or (right and value == key):
            lo = mid + 1
        else:
            hi = mid
    return lo


def search_offset(buf, Py_ssize_t n_units, Py_ssize_t offset):
    cdef Py_buffer view
    cdef const unsigned char* u
    cdef Py_ssize_t lo, i
    cdef int64_t base
    cdef int32_t count
    borrow(buf, &view)
    try:
        _check_units(&view, n_units)
        u = <const unsigned char*>view.buf
        lo = _bisect(u, n_units, C_BASE_AT, offset, True)  # one past the last unit with base_offset <= offset
        if lo == 0:
            return -1 if n_units else 0
        i = lo - 1
        base = ld_i64(u + i * C_UNIT + C_BASE_AT)
        count = ld_i32(u + i * C_UNIT + C_COUNT_AT)
        # base <= offset, so offset - base is exact in uint64 (no signed overflow for extreme offsets)
        if count > 0 and <uint64_t>offset - <uint64_t>base < <uint64_t>count:
            return i
        return i + 1
    finally:
        PyBuffer_Release(&view)


def search_timestamp(buf, Py_ssize_t n_units, Py_ssize_t ts):
    cdef Py_buffer view
    borrow(buf, &view)
    try:
        _check_units(&view, n_units)
        return _bisect(<const unsigned char*>view.buf, n_units, C_MAX_TS_AT, ts, False)
    finally:
        PyBuffer_Release(&view)


def hash_tag(str tag not None):
    cdef uint32_t h = 0
    cdef Py_UCS4 ch
    cdef uint32_t c
    for ch in tag:
        c = ch
        if c > 0xFFFF:
            c -= 0x10000
            h = 31 * h + (0xD800 | (c >> 10))
            h = 31 * h + (0xDC00 | (c & 0x3FF))
        else:
            h = 31 * h + c
    return <int32_t>h
