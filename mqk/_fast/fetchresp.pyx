# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Fetch response bodies encoded by hand, compiled: the hot-path twin of `fetchresp_py.py` (same API, identical
bytes; see there for what it encodes and when it declines). The partitions' fields are read with C dict lookups
and written into a C buffer; each run of bytes between two passed-on record buffers becomes one bytearray.
"""
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject

from mqk._fast._out cimport (DECLINE_FIELD, DECLINE_SHAPE, DECLINE_VERSION,
                             Out, decline, dict_i16, dict_i32, dict_i64, dict_seq, out_be, out_length, out_mem,
                             out_topic)

from uuid import UUID

from mqk._fast.handwritten import Decline

FIRST_VERSION = 4
LAST_VERSION = 17
INLINE_MAX = 4096
_UUID = UUID

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
        decline(DECLINE_FIELD)
    throttle = dict_i32(body, "throttle_time_ms", 0)
    out_be(o, <uint64_t>throttle, 4)
    if version >= 7:
        out_be(o, <uint64_t>dict_i16(body, "error_code", 0), 2)
        out_be(o, <uint64_t>dict_i32(body, "session_id", 0), 4)
    responses = dict_seq(body, "responses")
    out_length(o, len(responses), compact, False)
    for topic in responses:
        if type(topic) is not dict:
            decline(DECLINE_SHAPE)
        out_topic(o, topic, "topic", version >= 13, compact, _UUID)
        partitions = dict_seq(topic, "partitions")
        out_length(o, len(partitions), compact, False)
        for p in partitions:
            if type(p) is not dict:
                decline(DECLINE_SHAPE)
            out_be(o, <uint64_t>dict_i32(p, "partition_index", 0), 4)
            out_be(o, <uint64_t>dict_i16(p, "error_code", 0), 2)
            out_be(o, <uint64_t>dict_i64(p, "high_watermark", 0), 8)
            out_be(o, <uint64_t>dict_i64(p, "last_stable_offset", -1), 8)
            if version >= 5:
                out_be(o, <uint64_t>dict_i64(p, "log_start_offset", -1), 8)
            if compact and not (_absent(p, "diverging_epoch") and _absent(p, "current_leader")
                                and _absent(p, "snapshot_id")):
                decline(DECLINE_FIELD)
            found = PyDict_GetItem(p, "aborted_transactions")
            aborted = () if found == NULL else <object>found
            if aborted is None:
                out_length(o, -1, compact, False)
            elif type(aborted) is list or type(aborted) is tuple:
                out_length(o, len(aborted), compact, False)
                for txn in aborted:
                    if type(txn) is not dict:
                        decline(DECLINE_SHAPE)
                    out_be(o, <uint64_t>dict_i64(txn, "producer_id", 0), 8)
                    out_be(o, <uint64_t>dict_i64(txn, "first_offset", 0), 8)
                    if compact:
                        out_be(o, 0, 1)
            else:
                decline(DECLINE_SHAPE)
            if version >= 11:
                out_be(o, <uint64_t>dict_i32(p, "preferred_read_replica", -1), 4)
            found = PyDict_GetItem(p, "records")
            records = None if found == NULL else <object>found
            if records is None:
                out_length(o, -1, compact, False)
            elif type(records) is list or type(records) is tuple:
                size = 0
                for chunk in records:
                    if not _bytes_like(chunk):
                        decline(DECLINE_SHAPE)
                    size += len(chunk)
                out_length(o, size, compact, False)
                _cut(o, parts)
                parts.extend(records)
            elif _bytes_like(records):
                size = len(records)
                out_length(o, size, compact, False)
                if size >= INLINE_MAX:
                    _cut(o, parts)
                    parts.append(records)
                elif type(records) is bytes:
                    out_mem(o, <const unsigned char*>PyBytes_AS_STRING(records), size)
                else:
                    chunk = bytes(records)
                    out_mem(o, <const unsigned char*>PyBytes_AS_STRING(chunk), PyBytes_GET_SIZE(chunk))
            else:
                decline(DECLINE_SHAPE)
            if compact:
                out_be(o, 0, 1)  # no tagged fields
        if compact:
            out_be(o, 0, 1)
    if compact:
        out_be(o, 0, 1)
    _cut(o, parts)
    return 0


def encode_fetch_response(body, Py_ssize_t version, bytearray out):
    """The Fetch response body of `version` for `body` as [out + its first bytes, further buffers...], or, when
    `body` is not the usual answer, why (a handwritten.DECLINE_* code; `out` left alone); see fetchresp_py.py."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        return DECLINE_VERSION
    if type(body) is not dict:
        return DECLINE_SHAPE
    cdef Out o
    cdef list parts = []
    o.p = NULL
    o.n = 0
    o.cap = 0
    try:
        _write(&o, body, version, parts)
    except Decline as exc:  # (only a Decline: every field is checked before it is written)
        return exc.reason
    finally:
        free(o.p)
    out += parts[0]
    parts[0] = out
    return parts
