# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Produce response bodies encoded by hand, compiled: the hot-path twin of `produceresp_py.py` (same API,
identical bytes; see there for what it encodes and when it declines). The partitions' fields are read with C dict
lookups and written into a C buffer, copied into `out` once at the end.
"""
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free

from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject

from mqk._fast._out cimport (DECLINE_FIELD, DECLINE_NONE, DECLINE_SHAPE, DECLINE_VERSION,
                             Out, decline, dict_i16, dict_i32, dict_i64, dict_seq, out_be, out_length, out_mem,
                             out_text, out_topic)

from uuid import UUID

from mqk._fast.handwritten import Decline

FIRST_VERSION = 3
LAST_VERSION = 13
_UUID = UUID

cdef int _write(Out* o, dict body, Py_ssize_t version) except -1:
    cdef bint compact = version >= 9
    cdef object responses, partitions, topic, p, name, topic_id, message
    cdef PyObject* found
    cdef int64_t throttle
    if version >= 10 and body.get("node_endpoints"):
        decline(DECLINE_FIELD)
    responses = dict_seq(body, "responses")
    throttle = dict_i32(body, "throttle_time_ms", 0)
    out_length(o, len(responses), compact, False)
    for topic in responses:
        if type(topic) is not dict:
            decline(DECLINE_SHAPE)
        out_topic(o, topic, "name", version >= 13, compact, _UUID)
        partitions = dict_seq(topic, "partition_responses")
        out_length(o, len(partitions), compact, False)
        for p in partitions:
            if type(p) is not dict:
                decline(DECLINE_SHAPE)
            out_be(o, <uint64_t>dict_i32(p, "index", 0), 4)
            out_be(o, <uint64_t>dict_i16(p, "error_code", 0), 2)
            out_be(o, <uint64_t>dict_i64(p, "base_offset", 0), 8)
            out_be(o, <uint64_t>dict_i64(p, "log_append_time_ms", -1), 8)
            if version >= 5:
                out_be(o, <uint64_t>dict_i64(p, "log_start_offset", -1), 8)
            if version >= 8:
                if dict_seq(p, "record_errors"):
                    decline(DECLINE_FIELD)
                out_length(o, 0, compact, False)
                found = PyDict_GetItem(p, "error_message")
                message = None if found == NULL else <object>found
                if message is None:
                    if compact:
                        out_be(o, 0, 1)
                    else:
                        out_be(o, 0xFFFF, 2)
                else:
                    out_text(o, message, compact)
            if version >= 10:
                found = PyDict_GetItem(p, "current_leader")
                if found != NULL and <object>found is not None:
                    decline(DECLINE_FIELD)
            if compact:
                out_be(o, 0, 1)  # no tagged fields
        if compact:
            out_be(o, 0, 1)
    out_be(o, <uint64_t>throttle, 4)
    if compact:
        out_be(o, 0, 1)
    return 0


def encode_produce_response(body, Py_ssize_t version, bytearray out):
    """Append the Produce response body of `version` for `body` to `out` and return DECLINE_NONE (0), or, when
    `body` is not the usual answer, return why (a handwritten.DECLINE_* code) and leave `out` alone; see
    produceresp_py.py."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        return DECLINE_VERSION
    if type(body) is not dict:
        return DECLINE_SHAPE
    cdef Out o
    o.p = NULL
    o.n = 0
    o.cap = 0
    try:
        _write(&o, body, version)
        out += (<char*>o.p)[:o.n] if o.n else b""
    except Decline as exc:  # (only a Decline: every field is checked before it is written)
        return exc.reason
    finally:
        free(o.p)
    return DECLINE_NONE
