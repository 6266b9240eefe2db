# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Fetch response bodies encoded by hand, compiled: the hot-path twin of `fetchresp_py.py` (same API, identical
bytes; see there for what it encodes and when it declines). The partitions' fields are read with C dict lookups
and written into a C buffer; each run of bytes between two passed-on record buffers becomes one bytearray.
"""
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject

from uuid import UUID

FIRST_VERSION = 4
LAST_VERSION = 17
INLINE_MAX = 4096
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


cdef int _mem(Out* o, const unsigned char* data, Py_ssize_t k) except -1:
    _reserve(o, k)
    memcpy(o.p + o.n, data, k)
    o.n += k
    return 0


cdef int _length(Out* o, Py_ssize_t n, bint compact, bint i16) except -1:
    """An array, string or bytes length; -1 is null."""
    if compact:
        _uvarint(o, <uint64_t>(n + 1))
    elif i16:
        if n > I16_MAX:
            raise _Decline()
        _be(o, <uint64_t>n, 2)
    else:
        _be(o, <uint64_t>n, 4)
    return 0


cdef int64_t _int(dict d, str key, int64_t default, int64_t lo, int64_t hi) except? -1:
    """An int16 / int32 field: an int within [lo, hi], else the generated encoder takes the body."""
    cdef PyObject* v = PyDict_GetItem(d, key)
    cdef int64_t x
    if v == NULL:
        return default
    if not isinstance(<object>v, int):  # bool too, as struct.pack in the twin takes it
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
    if not isinstance(<object>v, int):  # bool too, as struct.pack in the twin takes it
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


cdef bint _absent(dict d, str key):
    cdef PyObject* v = PyDict_GetItem(d, key)
    return v == NULL or <object>v is None


cdef inline bint _bytes_like(object x):
    return type(x) is bytes or type(x) is bytearray or type(x) is memoryview


cdef int _cut(Out* o, list parts) except -1:
    """The bytes written so far become the next part."""
    parts.append(bytearray((<char*>o.p)[:o.n]) if o.n else bytearray())
    o.n = 0
    return 0


cdef int _write(Out* o, dict body, Py_ssize_t version, list parts) except -1:
    cdef bint compact = version >= 12
    cdef object responses, partitions, topic, p, name, topic_id, aborted, txn, records, chunk
    cdef PyObject* found
    cdef Py_ssize_t size
    cdef int64_t throttle
    if version >= 16 and body.get("node_endpoints"):
        raise _Decline()
    throttle = _int(body, "throttle_time_ms", 0, I32_MIN, I32_MAX)
    _be(o, <uint64_t>throttle, 4)
    if version >= 7:
        _be(o, <uint64_t>_int(body, "error_code", 0, I16_MIN, I16_MAX), 2)
        _be(o, <uint64_t>_int(body, "session_id", 0, I32_MIN, I32_MAX), 4)
    responses = _seq(body, "responses")
    _length(o, len(responses), compact, False)
    for topic in responses:
        if type(topic) is not dict:
            raise _Decline()
        if version >= 13:
            found = PyDict_GetItem(topic, "topic_id")
            topic_id = _ZERO_UUID if found == NULL else <object>found
            if type(topic_id) is not _UUID:
                raise _Decline()
            name = topic_id.bytes
            _mem(o, <const unsigned char*>PyBytes_AS_STRING(name), 16)
        else:
            found = PyDict_GetItem(topic, "topic")
            name = "" if found == NULL else <object>found
            if type(name) is not str:
                raise _Decline()
            name = (<str>name).encode("utf-8")
            _length(o, PyBytes_GET_SIZE(name), compact, True)
            _mem(o, <const unsigned char*>PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name))
        partitions = _seq(topic, "partitions")
        _length(o, len(partitions), compact, False)
        for p in partitions:
            if type(p) is not dict:
                raise _Decline()
            _be(o, <uint64_t>_int(p, "partition_index", 0, I32_MIN, I32_MAX), 4)
            _be(o, <uint64_t>_int(p, "error_code", 0, I16_MIN, I16_MAX), 2)
            _be(o, <uint64_t>_i64(p, "high_watermark", 0), 8)
            _be(o, <uint64_t>_i64(p, "last_stable_offset", -1), 8)
            if version >= 5:
                _be(o, <uint64_t>_i64(p, "log_start_offset", -1), 8)
            if compact and not (_absent(p, "diverging_epoch") and _absent(p, "current_leader")
                                and _absent(p, "snapshot_id")):
                raise _Decline()
            found = PyDict_GetItem(p, "aborted_transactions")
            aborted = () if found == NULL else <object>found
            if aborted is None:
                _length(o, -1, compact, False)
            elif type(aborted) is list or type(aborted) is tuple:
                _length(o, len(aborted), compact, False)
                for txn in aborted:
                    if type(txn) is not dict:
                        raise _Decline()
                    _be(o, <uint64_t>_i64(txn, "producer_id", 0), 8)
                    _be(o, <uint64_t>_i64(txn, "first_offset", 0), 8)
                    if compact:
                        _be(o, 0, 1)
            else:
                raise _Decline()
            if version >= 11:
                _be(o, <uint64_t>_int(p, "preferred_read_replica", -1, I32_MIN, I32_MAX), 4)
            found = PyDict_GetItem(p, "records")
            records = None if found == NULL else <object>found
            if records is None:
                _length(o, -1, compact, False)
            elif type(records) is list or type(records) is tuple:
                size = 0
                for chunk in records:
                    if not _bytes_like(chunk):
                        raise _Decline()
                    size += len(chunk)
                _length(o, size, compact, False)
                _cut(o, parts)
                parts.extend(records)
            elif _bytes_like(records):
                size = len(records)
                _length(o, size, compact, False)
                if size >= INLINE_MAX:
                    _cut(o, parts)
                    parts.append(records)
                elif type(records) is bytes:
                    _mem(o, <const unsigned char*>PyBytes_AS_STRING(records), size)
                else:
                    chunk = bytes(records)
                    _mem(o, <const unsigned char*>PyBytes_AS_STRING(chunk), PyBytes_GET_SIZE(chunk))
            else:
                raise _Decline()
            if compact:
                _be(o, 0, 1)  # no tagged fields
        if compact:
            _be(o, 0, 1)
    if compact:
        _be(o, 0, 1)
    _cut(o, parts)
    return 0


def encode_fetch_response(body, Py_ssize_t version, bytearray out):
    """The Fetch response body of `version` for `body` as [out + its first bytes, further buffers...], or None
    (and `out` left alone) when `body` is not the usual answer; see fetchresp_py.py."""
    if not FIRST_VERSION <= version <= LAST_VERSION or type(body) is not dict:
        return None
    cdef Out o
    cdef list parts = []
    o.p = NULL
    o.n = 0
    o.cap = 0
    try:
        _write(&o, body, version, parts)
    except (_Decline, UnicodeEncodeError):
        return None
    finally:
        free(o.p)
    out += parts[0]
    parts[0] = out
    return parts
