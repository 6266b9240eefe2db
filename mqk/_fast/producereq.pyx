# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Produce request bodies decoded by hand, compiled: the hot-path twin of `producereq_py.py` (same API, identical
results). See producereq_py.py for what it decodes and how it fails.

The generated decoder spends about half a microsecond per partition of a Produce request in Python (a struct
unpack, a varint, a slice, a dict); a producer spreading its records over many partitions pays that once per
partition. Here the walk is C; what is left per partition is the records view and the partition's dict.
"""
from libc.stdint cimport int16_t, int32_t, int64_t

from cpython.buffer cimport PyBuffer_Release

from mqk._fast._bytes cimport borrow, ld_i16, ld_i32

from uuid import UUID

ZERO_UUID = UUID(int=0)
FIRST_VERSION = 3
LAST_VERSION = 13


cdef class _Cursor:
    cdef const unsigned char* b
    cdef Py_ssize_t n
    cdef Py_ssize_t pos

    cdef inline int need(self, Py_ssize_t k) except -1:
        if k > self.n - self.pos:
            raise ValueError(f"truncated at byte {self.pos}")
        return 0

    cdef inline int16_t i16(self) except? -1:
        self.need(2)
        self.pos += 2
        return ld_i16(self.b + self.pos - 2)

    cdef inline int32_t i32(self) except? -1:
        self.need(4)
        self.pos += 4
        return ld_i32(self.b + self.pos - 4)

    cdef inline int64_t uvarint(self) except? -1:
        # the generated decoder's _uv: at most five bytes, the last one's high bits kept
        cdef int64_t result = 0
        cdef int shift = 0
        cdef unsigned char byte
        while True:
            self.need(1)
            byte = self.b[self.pos]
            self.pos += 1
            result |= <int64_t>(byte & 0x7F) << shift
            if byte < 0x80:
                return result
            shift += 7
            if shift > 28:
                raise ValueError("varint too long")

    cdef inline int64_t length(self, bint compact) except? -2:
        """A string / bytes / array length: -1 (or any negative) for null."""
        if compact:
            return self.uvarint() - 1
        return self.i16()

    cdef inline int64_t length32(self, bint compact) except? -2:
        if compact:
            return self.uvarint() - 1
        return self.i32()

    cdef inline int64_t array_length(self, bint compact, str what) except -1:
        """The element count of a non-nullable array: ValueError for null, or for more elements than bytes left."""
        cdef int64_t count = self.length32(compact)
        if count < 0:
            raise ValueError(f"null {what}")
        if count > self.n - self.pos:
            raise ValueError("truncated or oversized length")
        return count

    cdef inline int skip_tags(self) except -1:
        cdef int64_t count, i, size
        count = self.uvarint()
        for i in range(count):
            self.uvarint()
            size = self.uvarint()
            self.pos += size
            if self.pos > self.n:
                raise ValueError("truncated or oversized length")
        return 0

    cdef inline object string(self, int64_t size):
        if size > self.n - self.pos:
            raise ValueError("truncated or oversized length")
        self.pos += size
        return (<const char*>self.b)[self.pos - size:self.pos].decode("utf-8")


def decode_produce_request(buf, Py_ssize_t version):
    """A Produce request body (no frame size, no request header) of `version` (3..13) -> the same dict as the
    generated decoder's: transactional_id, acks, timeout_ms, topic_data [name, topic_id, partition_data
    [index, records (a memoryview into `buf`, or None)]]. `buf` must be a one-dimensional byte memoryview (the
    records are slices of it). Malformed bytes raise ValueError."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        raise ValueError(f"Produce v{version} is not decoded here")
    cdef bint compact = version >= 9
    cdef bint by_id = version >= 13
    cdef _Cursor c = _Cursor.__new__(_Cursor)
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
        size = c.length(compact)
        transactional_id = None if size < 0 else c.string(size)
        acks = c.i16()
        timeout_ms = c.i32()
        topics = c.array_length(compact, "topic_data")
        topic_data = []
        for t in range(topics):
            if by_id:
                c.need(16)
                topic_id = UUID(bytes=(<const char*>c.b)[c.pos:c.pos + 16])
                c.pos += 16
                name = ""
            else:
                size = c.length(compact)
                if size < 0:
                    raise ValueError("null name")
                name = c.string(size)
                topic_id = ZERO_UUID
            partitions = c.array_length(compact, "partition_data")
            partition_data = []
            for i in range(partitions):
                index = c.i32()
                size = c.length32(compact)
                if size < 0:
                    records = None
                else:
                    if size > c.n - c.pos:
                        raise ValueError("truncated or oversized length")
                    records = buf[c.pos:c.pos + size]
                    c.pos += size
                if compact:
                    c.skip_tags()
                partition_data.append({"index": index, "records": records})
            if compact:
                c.skip_tags()
            topic_data.append({"name": name, "topic_id": topic_id, "partition_data": partition_data})
        if compact:
            c.skip_tags()
    finally:
        PyBuffer_Release(&view)
    return {"transactional_id": transactional_id, "acks": acks, "timeout_ms": timeout_ms, "topic_data": topic_data}
