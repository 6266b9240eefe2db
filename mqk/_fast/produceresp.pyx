# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Produce response bodies encoded by hand, compiled: the hot-path twin of `produceresp_py.py` (same API,
identical bytes; see there for what it encodes and when it declines). The partitions' fields are read with C dict
lookups and written into a C buffer, copied into `out` once at the end.
"""
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject

from uuid import UUID

FIRST_VERSION = 3
LAST_VERSION = 13
_ZERO_UUID = UUID(int=0)
_UUID = UUID

DEF I16_MIN = -32768
DEF I16_MAX = 32767
DEF I32_MIN = -2147483648
DEF I32_MAX = 2147483647


class _Decline(Exception):
    """The body is not the usual answer: the generated encoder takes it."""


cdef struct Out:
    unsigned char* p
    Py_ssize_t n
    Py_ssize_t cap


cdef int _reserve(Out* o, Py_ssize_t k) except -1:
    cdef Py_ssize_t cap
    cdef unsigned char* p
    if o.n + k <= o.cap:
        return 0
    cap = max(2 * o.cap, o.n + k, 256)
    p = <unsigned char*>realloc(o.p, cap)
    if p == NULL:
        raise MemoryError()
    o.p = p
    o.cap = cap
    return 0


cdef int _be(Out* o, uint64_t v, int width) except -1:
    cdef int i
    _reserve(o, width)
    for i in range(width):
        o.p[o.n + i] = <unsigned char>(v >> (8 * (width - 1 - i)))
    o.n += width
    return 0


cdef int _uvarint(Out* o, uint64_t v) except -1:
    _reserve(o, 10)
    while v >= 0x80:
        o.p[o.n] = <unsigned char>((v & 0x7F) | 0x80)
        o.n += 1
        v >>= 7
    o.p[o.n] = <unsigned char>v
    o.n += 1
    return 0


cdef int _raw(Out* o, bytes data) except -1:
    cdef Py_ssize_t k = PyBytes_GET_SIZE(data)
    _reserve(o, k)
    memcpy(o.p + o.n, PyBytes_AS_STRING(data), k)
    o.n += k
    return 0


cdef int _length(Out* o, Py_ssize_t n, bint compact, bint i16) except -1:
    if compact:
        _uvarint(o, <uint64_t>n + 1)
    elif i16:
        if n > I16_MAX:
            raise _Decline()
        _be(o, <uint64_t>n, 2)
    else:
        _be(o, <uint64_t>n, 4)
    return 0


cdef int64_t _int(dict d, str key, int64_t default, int64_t lo, int64_t hi) except? -1:
    """An int16 / int32 field: an exact int within [lo, hi], else the generated encoder takes the body."""
    cdef PyObject* v = PyDict_GetItem(d, key)
    cdef int64_t x
    if v == NULL:
        return default
    if type(<object>v) is not int:
        raise _Decline()
    try:
        x = <object>v
    except OverflowError:
        raise _Decline()
    if not lo <= x <= hi:
        raise _Decline()
    return x


cdef int64_t _i64(dict d, str key, int64_t default) except? -1:
    cdef PyObject* v = PyDict_GetItem(d, key)
    if v == NULL:
        return default
    if type(<object>v) is not int:
        raise _Decline()
    try:
        return <object>v
    except OverflowError:
        raise _Decline()


cdef object _seq(dict d, str key):
    cdef PyObject* v = PyDict_GetItem(d, key)
    if v == NULL:
        return ()
    if type(<object>v) is not list and type(<object>v) is not tuple:
        raise _Decline()
    return <object>v


cdef int _write(Out* o, dict body, Py_ssize_t version) except -1:
    cdef bint compact = version >= 9
    cdef object responses, partitions, topic, p, name, topic_id, message
    cdef PyObject* found
    cdef int64_t throttle
    if version >= 10 and body.get("node_endpoints"):
        raise _Decline()
    responses = _seq(body, "responses")
    throttle = _int(body, "throttle_time_ms", 0, I32_MIN, I32_MAX)
    _length(o, len(responses), compact, False)
    for topic in responses:
        if type(topic) is not dict:
            raise _Decline()
        if version >= 13:
            found = PyDict_GetItem(topic, "topic_id")
            topic_id = _ZERO_UUID if found == NULL else <object>found
            if type(topic_id) is not _UUID:
                raise _Decline()
            _raw(o, topic_id.bytes)
        else:
            found = PyDict_GetItem(topic, "name")
            name = "" if found == NULL else <object>found
            if type(name) is not str:
                raise _Decline()
            name = (<str>name).encode("utf-8")
            _length(o, len(name), compact, True)
            _raw(o, name)
        partitions = _seq(topic, "partition_responses")
        _length(o, len(partitions), compact, False)
        for p in partitions:
            if type(p) is not dict:
                raise _Decline()
            _be(o, <uint64_t>_int(p, "index", 0, I32_MIN, I32_MAX), 4)
            _be(o, <uint64_t>_int(p, "error_code", 0, I16_MIN, I16_MAX), 2)
            _be(o, <uint64_t>_i64(p, "base_offset", 0), 8)
            _be(o, <uint64_t>_i64(p, "log_append_time_ms", -1), 8)
            if version >= 5:
                _be(o, <uint64_t>_i64(p, "log_start_offset", -1), 8)
            if version >= 8:
                if _seq(p, "record_errors"):
                    raise _Decline()
                _length(o, 0, compact, False)
                found = PyDict_GetItem(p, "error_message")
                message = None if found == NULL else <object>found
                if message is None:
                    if compact:
                        _be(o, 0, 1)
                    else:
                        _be(o, 0xFFFF, 2)
                elif type(message) is str:
                    message = (<str>message).encode("utf-8")
                    _length(o, len(message), compact, True)
                    _raw(o, message)
                else:
                    raise _Decline()
            if version >= 10:
                found = PyDict_GetItem(p, "current_leader")
                if found != NULL and <object>found is not None:
                    raise _Decline()
            if compact:
                _be(o, 0, 1)  # no tagged fields
        if compact:
            _be(o, 0, 1)
    _be(o, <uint64_t>throttle, 4)
    if compact:
        _be(o, 0, 1)
    return 0


def encode_produce_response(body, Py_ssize_t version, bytearray out):
    """Append the Produce response body of `version` for `body` to `out` and return True, or return False (and
    leave `out` alone) when `body` is not the usual answer; see produceresp_py.py."""
    if not FIRST_VERSION <= version <= LAST_VERSION or type(body) is not dict:
        return False
    cdef Out o
    o.p = NULL
    o.n = 0
    o.cap = 0
    try:
        _write(&o, body, version)
        out += (<char*>o.p)[:o.n] if o.n else b""
    except (_Decline, UnicodeEncodeError):
        return False
    finally:
        free(o.p)
    return True
