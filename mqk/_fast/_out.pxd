# Shared by the _fast response encoders (cimported, never imported): a growing C buffer and the writers of answer
# fields read from the body's dicts with C lookups; the twins' side is handwritten.py. A value the usual answer
# never holds (another type, out of its field's range) raises handwritten.Decline with why (a DECLINE_* code): the
# entry point returns that code, and the caller leaves the body to the generated encoder.
from libc.stdint cimport INT64_MAX, INT64_MIN, int64_t, uint64_t
from libc.stdlib cimport realloc
from libc.string cimport memcpy, memset

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject


cdef struct Out:
    unsigned char* p
    Py_ssize_t n
    Py_ssize_t cap


# why a body is declined: the values of handwritten.DECLINE_*, which the entry points return (the twins' parity
# tests hold the two builds to the same code for every declined body)
cdef enum:
    DECLINE_NONE = 0
    DECLINE_VERSION = 1
    DECLINE_SHAPE = 2
    DECLINE_VALUE = 3
    DECLINE_TEXT = 4
    DECLINE_FIELD = 5


cdef inline int decline(int reason) except -1:
    from mqk._fast.handwritten import Decline
    raise Decline(reason)


cdef inline int out_reserve(Out* o, Py_ssize_t k) except -1:
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


cdef inline int out_be(Out* o, uint64_t v, int width) except -1:
    cdef int i
    out_reserve(o, width)
    for i in range(width):
        o.p[o.n + i] = <unsigned char>(v >> (8 * (width - 1 - i)))
    o.n += width
    return 0


cdef inline int out_uvarint(Out* o, uint64_t v) except -1:
    out_reserve(o, 10)
    while v >= 0x80:
        o.p[o.n] = <unsigned char>((v & 0x7F) | 0x80)
        o.n += 1
        v >>= 7
    o.p[o.n] = <unsigned char>v
    o.n += 1
    return 0


cdef inline int out_mem(Out* o, const unsigned char* data, Py_ssize_t k) except -1:
    out_reserve(o, k)
    memcpy(o.p + o.n, data, k)
    o.n += k
    return 0


cdef inline int out_length(Out* o, Py_ssize_t n, bint compact, bint i16) except -1:
    """An array, string or bytes length (-1: null): an unsigned varint of n + 1 in flexible versions, else an
    int16 (strings) or int32."""
    if compact:
        out_uvarint(o, <uint64_t>(n + 1))
    elif i16:
        if n > 32767:
            decline(DECLINE_VALUE)
        out_be(o, <uint64_t>n, 2)
    else:
        out_be(o, <uint64_t>n, 4)
    return 0


cdef inline int64_t dict_int(dict d, str key, int64_t default, int64_t lo, int64_t hi) except? -1:
    """An int field within [lo, hi] (bool included, as the twins' struct packing takes it)."""
    cdef PyObject* v = PyDict_GetItem(d, key)
    cdef int64_t x = 0
    if v == NULL:
        return default
    if not isinstance(<object>v, int):
        decline(DECLINE_VALUE)
    try:
        x = <object>v
    except OverflowError:
        decline(DECLINE_VALUE)
    if not lo <= x <= hi:
        decline(DECLINE_VALUE)
    return x


cdef inline int64_t dict_i16(dict d, str key, int64_t default) except? -1:
    return dict_int(d, key, default, -32768, 32767)


cdef inline int64_t dict_i32(dict d, str key, int64_t default) except? -1:
    return dict_int(d, key, default, -2147483648, 2147483647)


cdef inline int64_t dict_i64(dict d, str key, int64_t default) except? -1:
    return dict_int(d, key, default, INT64_MIN, INT64_MAX)


cdef inline object dict_seq(dict d, str key):
    cdef PyObject* v = PyDict_GetItem(d, key)
    if v == NULL:
        return ()
    if type(<object>v) is not list and type(<object>v) is not tuple:
        decline(DECLINE_SHAPE)
    return <object>v


cdef extern from "Python.h":
    # NULL with the error set (no `except` here: a text UTF-8 cannot encode is declined, not raised)
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size)
    int PyErr_ExceptionMatches(object exc_type)
    void PyErr_Clear()


cdef inline int out_text(Out* o, object text, bint compact) except -1:
    """A topic name or message: its int16 length and UTF-8 bytes (an ASCII str's own, no copy made). Declined
    (DECLINE_TEXT) when it is not a str, or holds what UTF-8 cannot encode (a lone surrogate)."""
    cdef Py_ssize_t n
    cdef const char* s
    if type(text) is not str:
        decline(DECLINE_TEXT)
    s = PyUnicode_AsUTF8AndSize(text, &n)
    if s == NULL:
        if not PyErr_ExceptionMatches(UnicodeEncodeError):
            return -1  # (out of memory: raised)
        PyErr_Clear()
        decline(DECLINE_TEXT)
    out_length(o, n, compact, True)
    out_mem(o, <const unsigned char*>s, n)
    return 0


cdef inline int out_topic(Out* o, dict topic, str name_key, bint by_id, bint compact, object uuid_type) except -1:
    """A topic's 16-byte id (`topic_id`, a `uuid_type`, default zero) from v13, else its name (`name_key`, a str,
    default "")."""
    cdef PyObject* found
    cdef object name
    if by_id:
        found = PyDict_GetItem(topic, "topic_id")
        if found == NULL:
            out_reserve(o, 16)
            memset(o.p + o.n, 0, 16)
            o.n += 16
            return 0
        if type(<object>found) is not uuid_type:
            decline(DECLINE_TEXT)
        name = (<object>found).bytes
        out_mem(o, <const unsigned char*>PyBytes_AS_STRING(name), 16)
        return 0
    found = PyDict_GetItem(topic, name_key)
    return out_text(o, "" if found == NULL else <object>found, compact)
