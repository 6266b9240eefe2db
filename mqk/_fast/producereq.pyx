# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Produce request bodies decoded by hand, compiled: the hot-path twin of `producereq_py.py` (same API, identical
results). See producereq_py.py for what it decodes and how it fails.

The generated decoder does Python work per partition of a Produce request (a struct unpack, a varint, a slice, a
dict); a producer spreading its records over many partitions pays that once per partition. Here the walk is C;
what is left per partition is the records view and the partition's dict.
"""
from libc.stdint cimport int16_t, int32_t, int64_t

from cpython.buffer cimport PyBuffer_Release

from mqk._fast._bytes cimport borrow
from mqk._fast._cursor cimport Cursor, array_length, i16, i32, length, length32, raw16, skip_tags, string

from uuid import UUID

ZERO_UUID = UUID(int=0)
FIRST_VERSION = 3
LAST_VERSION = 13


def decode_produce_request(buf, Py_ssize_t version):
    """A Produce request body (no frame size, no request header) of `version` (3..13) -> the same dict as the
    generated decoder's: transactional_id, acks, timeout_ms, topic_data [name, topic_id, partition_data
    [index, records (a memoryview into `buf`, or None)]]. `buf` must be a one-dimensional byte memoryview (the
    records are slices of it). Malformed bytes raise ValueError."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        raise ValueError(f"Produce v{version} is not decoded here")
    cdef bint compact = version >= 9
    cdef bint by_id = version >= 13
    cdef Cursor c
    cdef Py_buffer view
    cdef int64_t size, topics, partitions, t, i
    cdef int32_t index
    cdef list topic_data, partition_data
    cdef object transactional_id, name, topic_id, records
    borrow(buf, &view)
    try:
        c.b = <const unsigned char*>view.buf
        c.n = view.len
        c.pos = 0
        size = length(&c, compact)
        transactional_id = None if size < 0 else string(&c, size)
        acks = i16(&c)
        timeout_ms = i32(&c)
        topics = array_length(&c, compact, "topic_data")
        topic_data = []
        for t in range(topics):
            if by_id:
                topic_id = UUID(bytes=raw16(&c))
                name = ""
            else:
                size = length(&c, compact)
                if size < 0:
                    raise ValueError("null name")
                name = string(&c, size)
                topic_id = ZERO_UUID
            partitions = array_length(&c, compact, "partition_data")
            partition_data = []
            for i in range(partitions):
                index = i32(&c)
                size = length32(&c, compact)
                if size < 0:
                    records = None
                else:
                    if size > c.n - c.pos:
                        raise ValueError("truncated or oversized length")
                    records = buf[c.pos:c.pos + size]
                    c.pos += size
                if compact:
                    skip_tags(&c)
                partition_data.append({"index": index, "records": records})
            if compact:
                skip_tags(&c)
            topic_data.append({"name": name, "topic_id": topic_id, "partition_data": partition_data})
        if compact:
            skip_tags(&c)
    finally:
        PyBuffer_Release(&view)
    return {"transactional_id": transactional_id, "acks": acks, "timeout_ms": timeout_ms, "topic_data": topic_data}
