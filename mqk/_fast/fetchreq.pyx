# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Fetch request bodies decoded by hand, compiled: the hot-path twin of `fetchreq_py.py` (same API, identical
results). See fetchreq_py.py for what it decodes, what it declines and how it fails.

The walk is C; what is left per partition is its dict.
"""
from libc.stdint cimport int32_t, int64_t

from cpython.buffer cimport PyBuffer_Release

from mqk._fast._bytes cimport borrow
from mqk._fast._cursor cimport Cursor, array_length, i8, i32, i64, length, need, raw16, string

from uuid import UUID

from mqk._fast import handwritten as _hw
from mqk._fast.handwritten import Decline

ZERO_UUID = UUID(int=0)
FIRST_VERSION = 4
LAST_VERSION = 17
_NO_HIGH_WATERMARK = (1 << 63) - 1


cdef inline int _no_tags(Cursor* c) except -1:
    """An empty tagged-field section (one zero byte); anything else is declined (see fetchreq_py)."""
    need(c, 1)
    if c.b[c.pos]:
        raise Decline(_hw.DECLINE_FIELD)
    c.pos += 1
    return 0


cdef tuple _name(Cursor* c, bint compact, bint by_id):
    cdef int64_t size
    if by_id:
        return "", UUID(bytes=raw16(c))
    size = length(c, compact)
    if size < 0:
        raise ValueError("null topic")
    return string(c, size), ZERO_UUID


def decode_fetch_request(buf, Py_ssize_t version):
    """A Fetch request body (no frame size, no request header) of `version` (4..17) -> the generated decoder's
    dict, or handwritten.DECLINE_FIELD for a body with a tagged field (see fetchreq_py.py). Malformed bytes raise ValueError."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        raise ValueError(f"Fetch v{version} is not decoded here")
    cdef Py_buffer view
    cdef Cursor c
    borrow(buf, &view)
    try:
        c.b = <const unsigned char*>view.buf
        c.n = view.len
        c.pos = 0
        return _decode(&c, version)
    except Decline as exc:
        return exc.reason
    finally:
        PyBuffer_Release(&view)


cdef dict _decode(Cursor* c, Py_ssize_t version):
    cdef bint compact = version >= 12
    cdef bint by_id = version >= 13
    cdef int32_t replica_id = -1, max_wait_ms, min_bytes, max_bytes, session_id = 0, session_epoch = -1
    cdef int32_t partition, current_leader_epoch, last_fetched_epoch, partition_max_bytes
    cdef int64_t fetch_offset, log_start_offset, t, i, count, size
    cdef int isolation_level
    cdef list topics = [], forgotten = [], partitions, ids
    cdef object name, topic_id, rack_id = ""
    cdef object no_high_watermark = _NO_HIGH_WATERMARK, zero_uuid = ZERO_UUID
    if version <= 14:
        replica_id = i32(c)
    max_wait_ms = i32(c)
    min_bytes = i32(c)
    max_bytes = i32(c)
    isolation_level = i8(c)
    if version >= 7:
        session_id = i32(c)
        session_epoch = i32(c)
    for t in range(array_length(c, compact, "topics")):
        name, topic_id = _name(c, compact, by_id)
        partitions = []
        count = array_length(c, compact, "partitions")
        for i in range(count):
            partition = i32(c)
            current_leader_epoch = i32(c) if version >= 9 else -1
            fetch_offset = i64(c)
            last_fetched_epoch = i32(c) if version >= 12 else -1
            log_start_offset = i64(c) if version >= 5 else -1
            partition_max_bytes = i32(c)
            if compact:
                _no_tags(c)
            partitions.append({"partition": partition, "current_leader_epoch": current_leader_epoch,
                               "fetch_offset": fetch_offset, "last_fetched_epoch": last_fetched_epoch,
                               "log_start_offset": log_start_offset, "partition_max_bytes": partition_max_bytes,
                               "replica_directory_id": zero_uuid, "high_watermark": no_high_watermark})
        if compact:
            _no_tags(c)
        topics.append({"topic": name, "topic_id": topic_id, "partitions": partitions})
    if version >= 7:
        for t in range(array_length(c, compact, "forgotten_topics_data")):
            name, topic_id = _name(c, compact, by_id)
            ids = []
            count = array_length(c, compact, "partitions")
            for i in range(count):
                ids.append(i32(c))
            forgotten.append({"topic": name, "topic_id": topic_id, "partitions": ids})
            if compact:
                _no_tags(c)
    if version >= 11:
        size = length(c, compact)
        if size < 0:
            raise ValueError("null rack_id")
        rack_id = string(c, size)
    if compact:
        _no_tags(c)
    return {"cluster_id": None, "replica_id": replica_id, "replica_state": {"replica_id": -1, "replica_epoch": -1},
            "max_wait_ms": max_wait_ms, "min_bytes": min_bytes, "max_bytes": max_bytes,
            "isolation_level": isolation_level, "session_id": session_id, "session_epoch": session_epoch,
            "topics": topics, "forgotten_topics_data": forgotten, "rack_id": rack_id}
