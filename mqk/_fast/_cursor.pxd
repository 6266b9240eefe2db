# Shared by the _fast request decoders (cimported, never imported): a read position over a borrowed byte buffer and
# the Kafka wire primitives read from it, each checking the bounds first, with the generated decoder's limits (an
# unsigned varint of at most five bytes, the last one's high bits kept). Malformed bytes raise ValueError
# (UnicodeDecodeError for a string that is not UTF-8), which the protocol layer turns into MalformedMessage. The
# twins use producereq_py.Cursor, which reads the same way.
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t

from mqk._fast._bytes cimport ld_i16, ld_i32, ld_i64


cdef struct Cursor:
    const unsigned char* b
    Py_ssize_t n
    Py_ssize_t pos


cdef inline int need(Cursor* c, Py_ssize_t k) except -1:
    if k > c.n - c.pos:
        raise ValueError(f"truncated at byte {c.pos}")
    return 0


cdef inline int8_t i8(Cursor* c) except? -1:
    need(c, 1)
    c.pos += 1
    return <int8_t>c.b[c.pos - 1]


cdef inline int16_t i16(Cursor* c) except? -1:
    need(c, 2)
    c.pos += 2
    return ld_i16(c.b + c.pos - 2)


cdef inline int32_t i32(Cursor* c) except? -1:
    need(c, 4)
    c.pos += 4
    return ld_i32(c.b + c.pos - 4)


cdef inline int64_t i64(Cursor* c) except? -1:
    need(c, 8)
    c.pos += 8
    return ld_i64(c.b + c.pos - 8)


cdef inline int64_t uvarint(Cursor* c) except? -1:
    cdef int64_t result = 0
    cdef int shift = 0
    cdef unsigned char byte
    while True:
        need(c, 1)
        byte = c.b[c.pos]
        c.pos += 1
        result |= <int64_t>(byte & 0x7F) << shift
        if byte < 0x80:
            return result
        shift += 7
        if shift > 28:
            raise ValueError("varint too long")


cdef inline int64_t length(Cursor* c, bint compact) except? -2:
    """A string length: negative for null."""
    if compact:
        return uvarint(c) - 1
    return i16(c)


cdef inline int64_t length32(Cursor* c, bint compact) except? -2:
    """A bytes / array length: negative for null."""
    if compact:
        return uvarint(c) - 1
    return i32(c)


cdef inline int64_t array_length(Cursor* c, bint compact, str what) except -1:
    """The element count of a non-nullable array: ValueError for null, or for more elements than bytes left."""
    cdef int64_t count = length32(c, compact)
    if count < 0:
        raise ValueError(f"null {what}")
    if count > c.n - c.pos:
        raise ValueError("truncated or oversized length")
    return count


cdef inline int skip_tags(Cursor* c) except -1:
    cdef int64_t count, i, size
    count = uvarint(c)
    for i in range(count):
        uvarint(c)
        size = uvarint(c)
        c.pos += size
        if c.pos > c.n:
            raise ValueError("truncated or oversized length")
    return 0


cdef inline object string(Cursor* c, int64_t size):
    if size > c.n - c.pos:
        raise ValueError("truncated or oversized length")
    c.pos += size
    return (<const char*>c.b)[c.pos - size:c.pos].decode("utf-8")


cdef inline bytes raw16(Cursor* c):
    """The 16 bytes of a uuid."""
    need(c, 16)
    c.pos += 16
    return (<const char*>c.b)[c.pos - 16:c.pos]
