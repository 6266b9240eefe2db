# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""CommitLog entry kernels, compiled: the hot-path twin of `clentry_py.py` (same API, identical results).

Every single append runs `put_entry` (or `encode_head`), every Produce spread over partitions `append_run`, every
recovery and dispatch pass `read_entry`. Bounds are checked explicitly before each access (boundscheck is off). See
clentry_py.py for the layout, the BLANK rule and the error contract.
"""
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t
from libc.string cimport memcpy
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.buffer cimport PyBuffer_Release
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.exc cimport PyErr_CheckSignals
from cpython.list cimport PyList_GET_ITEM
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdlib cimport calloc, free
from libc cimport errno as c_errno
from libc.string cimport strerror
from posix.types cimport off_t
from posix.uio cimport iovec, pwritev

from mqk._fast._bytes cimport (as_i32, borrow, borrow_writable, crc32c_of, crc32c_of_two, ld_i32, ld_i64, ld_u16, ld_u32,
                               st_cq_unit, st_i64, st_u16, st_u32)

from crc32c import crc32c as _crc32c

from mqk.errors import Corrupt, OutOfBounds

if sizeof(Py_ssize_t) != 8:
    raise ImportError("mqk._fast kernels need a 64-bit Py_ssize_t; the pure-Python twins are used instead")

FIXED_HEADER_SIZE = 66
MAGIC_MESSAGE = 0xDAA320A7
MAGIC_BLANK = 0xCBD43194
BLANK_MIN_SIZE = 8
CRC_START = 12
KIND_END, KIND_MESSAGE, KIND_BLANK = 0, 1, 2
MAX_TOPIC_LEN = 0xFFFF

DEF C_FIXED = 66
DEF C_BATCH_HEADER = 61
DEF C_MAGIC_MESSAGE = 0xDAA320A7
DEF C_MAGIC_BLANK = 0xCBD43194
DEF C_BLANK_MIN = 8
DEF C_CRC_START = 12
DEF C_INT32_MAX = 2147483647
DEF C_UNIT = 48

cdef tuple _END = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, "", -1)


cdef Py_ssize_t _entry_size(Py_ssize_t topic_len, Py_ssize_t body_len) except -1:
    if topic_len < 0 or topic_len > 0xFFFF:
        raise ValueError(f"topic length {topic_len} outside [0, 65535]")
    if body_len < 0 or body_len > C_INT32_MAX - C_FIXED - topic_len:
        raise ValueError(f"body length {body_len} does not fit an entry")
    return C_FIXED + topic_len + body_len


cdef Py_ssize_t _write_head(unsigned char* e, Py_ssize_t size, int32_t queue_id, int32_t flags,
                            int64_t queue_offset, int64_t physical_offset, int32_t record_count,
                            int64_t store_timestamp, int64_t max_timestamp, int64_t tags_code, bytes topic,
                            Py_ssize_t topic_len) noexcept:
    """Fixed header (CRC left for the caller), topic and the body's base offset (= queue offset) of one MESSAGE
    entry at e; returns the body's position in the entry. The caller checked that FIXED + topic_len + 8 bytes fit."""
    st_u32(e, <uint32_t>size)
    st_u32(e + 4, C_MAGIC_MESSAGE)
    st_u32(e + 12, <uint32_t>queue_id)
    st_u32(e + 16, <uint32_t>flags)
    st_i64(e + 20, queue_offset)
    st_i64(e + 28, physical_offset)
    st_u32(e + 36, <uint32_t>record_count)
    st_i64(e + 40, store_timestamp)
    st_i64(e + 48, max_timestamp)
    st_i64(e + 56, tags_code)
    st_u16(e + 64, <uint16_t>topic_len)
    if topic_len:
        memcpy(e + C_FIXED, PyBytes_AS_STRING(topic), topic_len)
    # the stored batch's base offset is the queue offset (outside the batch CRC, so the batch stays valid)
    st_i64(e + C_FIXED + topic_len, queue_offset)
    return C_FIXED + topic_len


cdef int _write_head_crc(unsigned char* e, Py_ssize_t size, int32_t queue_id, int32_t flags, int64_t queue_offset,
                         int64_t physical_offset, int32_t record_count, int64_t store_timestamp,
                         int64_t max_timestamp, int64_t tags_code, bytes topic, Py_ssize_t topic_len,
                         const unsigned char* body, Py_ssize_t body_len) except -1:
    """The head (see encode_head) at e, its CRC covering body[8:] as well."""
    cdef Py_ssize_t at = _write_head(e, size, queue_id, flags, queue_offset, physical_offset, record_count,
                                     store_timestamp, max_timestamp, tags_code, topic, topic_len)
    st_u32(e + 8, crc32c_of_two(_crc32c, e + C_CRC_START, at + 8 - C_CRC_START, body + 8, body_len - 8))
    return 0


def entry_size(Py_ssize_t topic_len, Py_ssize_t body_len):
    return _entry_size(topic_len, body_len)


def head_size(Py_ssize_t topic_len):
    return C_FIXED + topic_len + 8


def encode_head(head, bytes topic not None, Py_ssize_t queue_id, Py_ssize_t queue_offset, Py_ssize_t physical_offset,
                Py_ssize_t store_timestamp, Py_ssize_t max_timestamp, Py_ssize_t tags_code, Py_ssize_t flags,
                Py_ssize_t record_count, body):
    cdef int32_t c_queue_id = as_i32(queue_id), c_flags = as_i32(flags), c_record_count = as_i32(record_count)
    cdef Py_buffer out, batch
    cdef Py_ssize_t topic_len, size
    borrow_writable(head, &out)
    try:
        borrow(body, &batch)
        try:
            if batch.len < C_BATCH_HEADER:
                raise ValueError(f"body of {batch.len} bytes is not a record batch")
            topic_len = PyBytes_GET_SIZE(topic)
            size = _entry_size(topic_len, batch.len)
            if C_FIXED + topic_len + 8 > out.len:
                raise OutOfBounds(f"entry head of {C_FIXED + topic_len + 8} bytes does not fit buffer of {out.len} bytes")
            _write_head_crc(<unsigned char*>out.buf, size, c_queue_id, c_flags, queue_offset, physical_offset,
                            c_record_count, store_timestamp, max_timestamp, tags_code, topic, topic_len,
                            <const unsigned char*>batch.buf, batch.len)
            return size
        finally:
            PyBuffer_Release(&batch)
    finally:
        PyBuffer_Release(&out)


def append_head(head, bytes topic not None, Py_ssize_t queue_id, Py_ssize_t queue_offset, Py_ssize_t physical_offset,
                Py_ssize_t store_timestamp, Py_ssize_t tags_code, body, cq_buf, Py_ssize_t cq_pos,
                Py_ssize_t running_max_ts):
    """One record batch's entry head and ConsumeQueue unit in one call; see clentry_py.append_head (None: not
    exactly one valid batch, nothing written; OutOfBounds: head or unit does not fit, nothing written)."""
    return _append_and_write(-1, 0, head, topic, queue_id, queue_offset, physical_offset, store_timestamp, tags_code,
                             body, cq_buf, cq_pos, running_max_ts)


cdef object _append_and_write(int fd, Py_ssize_t pos, head, bytes topic, Py_ssize_t queue_id,
                              Py_ssize_t queue_offset, Py_ssize_t physical_offset, Py_ssize_t store_timestamp,
                              Py_ssize_t tags_code, body, cq_buf, Py_ssize_t cq_pos, Py_ssize_t running_max_ts):
    """append_head, then (fd >= 0) the entry's pwritev at pos of fd: put_entry's and append_head's one body."""
    cdef Py_buffer out, batch, units
    borrow_writable(head, &out)
    try:
        borrow(body, &batch)
        try:
            borrow_writable(cq_buf, &units)
            try:
                done = _append_head(&out, topic, queue_id, queue_offset, physical_offset, store_timestamp,
                                    tags_code, &batch, &units, cq_pos, running_max_ts)
            finally:
                PyBuffer_Release(&units)
            if done is not None and fd >= 0:
                _write_head_and_tail(fd, pos, out.buf, C_FIXED + PyBytes_GET_SIZE(topic) + 8, &batch)
            return done
        finally:
            PyBuffer_Release(&batch)
    finally:
        PyBuffer_Release(&out)


cdef object _append_head(Py_buffer* out, bytes topic, Py_ssize_t queue_id, int64_t queue_offset,
                         int64_t physical_offset, int64_t store_timestamp, int64_t tags_code, Py_buffer* batch,
                         Py_buffer* units, Py_ssize_t cq_pos, int64_t running_max_ts):
    cdef int64_t done[3]
    if not _head_and_unit(<unsigned char*>out.buf, out.len, topic, queue_id, queue_offset, physical_offset,
                          store_timestamp, tags_code, <const unsigned char*>batch.buf, batch.len,
                          <unsigned char*>units.buf, units.len, cq_pos, running_max_ts, done):
        return None
    return (done[0], done[1], done[2])


cdef int _head_and_unit(unsigned char* head, Py_ssize_t head_cap, bytes topic, Py_ssize_t queue_id,
                        int64_t queue_offset, int64_t physical_offset, int64_t store_timestamp, int64_t tags_code,
                        const unsigned char* b, Py_ssize_t body_len, unsigned char* units, Py_ssize_t units_len,
                        Py_ssize_t cq_pos, int64_t running_max_ts, int64_t* done) except -1:
    """append_head over raw memory: 0 (nothing written) when the body is not exactly one valid batch, else the head
    and the unit are written and done[] = (entry size, span, new running max timestamp); 1."""
    if body_len < C_BATCH_HEADER or b[16] != 2 or <Py_ssize_t>ld_i32(b + 8) + 12 != body_len:
        return 0
    cdef int32_t last_offset_delta = ld_i32(b + 23)
    if last_offset_delta < 0 or last_offset_delta == C_INT32_MAX or ld_i32(b + 57) < 0:
        return 0
    cdef int32_t span = last_offset_delta + 1
    cdef int64_t batch_max_ts = ld_i64(b + 35)
    cdef int32_t c_queue_id = as_i32(queue_id)
    cdef Py_ssize_t topic_len = PyBytes_GET_SIZE(topic)
    cdef Py_ssize_t size = _entry_size(topic_len, body_len)
    if C_FIXED + topic_len + 8 > head_cap:
        raise OutOfBounds(f"entry head of {C_FIXED + topic_len + 8} bytes does not fit buffer of {head_cap} bytes")
    if cq_pos < 0 or C_UNIT > units_len - cq_pos:
        raise OutOfBounds(f"unit at {cq_pos} outside buffer of {units_len} bytes")
    cdef int64_t running = running_max_ts if running_max_ts >= batch_max_ts else batch_max_ts
    _write_head_crc(head, size, c_queue_id, 0, queue_offset, physical_offset, span, store_timestamp, batch_max_ts,
                    tags_code, topic, topic_len, b, body_len)
    st_cq_unit(units + cq_pos, physical_offset, <uint32_t>size, <uint32_t>span, tags_code, store_timestamp, running,
               queue_offset)
    done[0] = size
    done[1] = span
    done[2] = running
    return 1


def write_entry(int fd, Py_ssize_t pos, head, Py_ssize_t head_len, body):
    """See clentry_py.write_entry: pwritev of head[:head_len] and body[8:] at pos, without the GIL."""
    cdef Py_buffer h, b
    borrow(head, &h)
    try:
        borrow(body, &b)
        try:
            if head_len < 0 or head_len > h.len or b.len < 8 or pos < 0:
                raise OutOfBounds(f"entry write of head {head_len}/{h.len} and body {b.len} bytes at {pos}")
            _write_head_and_tail(fd, pos, h.buf, head_len, &b)
            return None
        finally:
            PyBuffer_Release(&b)
    finally:
        PyBuffer_Release(&h)


def put_entry(int fd, Py_ssize_t pos, head, bytes topic not None, Py_ssize_t queue_id, Py_ssize_t queue_offset,
              Py_ssize_t physical_offset, Py_ssize_t store_timestamp, Py_ssize_t tags_code, body, cq_buf,
              Py_ssize_t cq_pos, Py_ssize_t running_max_ts):
    """See clentry_py.put_entry: append_head, then write_entry of that head and body at pos, in one call."""
    if pos < 0:
        raise OutOfBounds(f"entry write at {pos}")
    if fd < 0:
        raise OSError(c_errno.EBADF, "put_entry: bad file descriptor")
    return _append_and_write(fd, pos, head, topic, queue_id, queue_offset, physical_offset, store_timestamp, tags_code,
                             body, cq_buf, cq_pos, running_max_ts)


cdef int _write_head_and_tail(int fd, Py_ssize_t pos, void* head, Py_ssize_t head_len, Py_buffer* body) except -1:
    """pwritev head[:head_len] and body[8:] at pos. The caller checked 0 <= head_len <= the head's size,
    body.len >= 8 and pos >= 0."""
    cdef iovec iov[2]
    iov[0].iov_base = head
    iov[0].iov_len = <size_t>head_len
    iov[1].iov_base = <char*>body.buf + 8
    iov[1].iov_len = <size_t>(body.len - 8)
    _pwritev_all(fd, pos, iov, 2)
    return 0


cdef Py_ssize_t _pwritev_all(int fd, Py_ssize_t pos, iovec* iov, int count) except -1:
    """pwritev iov[0:count] at pos without the GIL, through EINTR and short writes (a signal, a device error
    about to be reported: the rest is written again); the position after them. Consumes the iovecs."""
    cdef ssize_t done
    cdef int err = 0
    while count > 0:
        with nogil:
            done = pwritev(fd, iov, count, <off_t>pos)
            if done < 0:
                err = c_errno.errno
        if done < 0:
            if err == c_errno.EINTR:
                PyErr_CheckSignals()  # a signal handler's exception ends the write, as in os.pwritev
                continue
            raise OSError(err, strerror(err).decode(errors="replace"))
        if done == 0:
            raise OSError(0, f"pwritev wrote nothing at {pos}")
        pos += done
        while count > 0 and <size_t>done >= iov[0].iov_len:
            done -= iov[0].iov_len
            iov += 1
            count -= 1
        if count > 0 and done > 0:
            iov[0].iov_base = <char*>iov[0].iov_base + done
            iov[0].iov_len -= <size_t>done
    return pos


WRITE_ENTRIES_CHUNK = 512
DEF C_WRITE_ENTRIES_CHUNK = 512
WRITE_BYTES_CHUNK = 1 << 20
DEF C_WRITE_BYTES_CHUNK = 1 << 20


cdef int _write_heads_and_bodies(int fd, Py_ssize_t pos, char* heads, Py_ssize_t head_len, Py_buffer* bodies,
                                 Py_ssize_t n) except -1:
    """Entry i = heads[i * head_len:][:head_len] + bodies[i][8:], written back to back at pos, one pwritev per
    WRITE_ENTRIES_CHUNK entries or WRITE_BYTES_CHUNK bytes, whichever comes first (an entry larger than that goes
    alone). The caller checked the heads' size and that every body has 8 bytes."""
    cdef iovec iov[2 * C_WRITE_ENTRIES_CHUNK]
    cdef Py_ssize_t i = 0, k, chunk, nbytes
    while i < n:
        chunk = min(n - i, C_WRITE_ENTRIES_CHUNK)
        nbytes = head_len + bodies[i].len - 8
        for k in range(1, chunk):
            nbytes += head_len + bodies[i + k].len - 8
            if nbytes > C_WRITE_BYTES_CHUNK:
                chunk = k
                break
        for k in range(chunk):
            iov[2 * k].iov_base = heads + (i + k) * head_len
            iov[2 * k].iov_len = <size_t>head_len
            iov[2 * k + 1].iov_base = <char*>bodies[i + k].buf + 8
            iov[2 * k + 1].iov_len = <size_t>(bodies[i + k].len - 8)
        pos = _pwritev_all(fd, pos, iov, <int>(2 * chunk))
        i += chunk
    return 0


def write_entries(int fd, Py_ssize_t pos, heads, Py_ssize_t head_len, bodies):
    """See clentry_py.write_entries: entry i is heads[i * head_len:][:head_len] + bodies[i][8:], one pwritev per
    WRITE_ENTRIES_CHUNK entries or WRITE_BYTES_CHUNK bytes, without the GIL."""
    cdef Py_buffer h
    cdef Py_buffer* views
    cdef Py_ssize_t n = len(bodies), got = 0, i
    cdef bint short_body = False
    borrow(heads, &h)
    views = <Py_buffer*>PyMem_Malloc(max(n, 1) * sizeof(Py_buffer))
    if views == NULL:
        PyBuffer_Release(&h)
        raise MemoryError()
    try:
        for body in bodies:
            if got == n:
                raise ValueError("bodies grew while being read")
            borrow(body, &views[got])
            got += 1
            if views[got - 1].len < 8:
                short_body = True
        if head_len < 1 or h.len < n * head_len or pos < 0 or short_body:
            raise OutOfBounds(f"write of {n} entries with heads of {head_len} bytes in {h.len} at {pos}")
        _write_heads_and_bodies(fd, pos, <char*>h.buf, head_len, views, n)
        return None
    finally:
        for i in range(got):
            PyBuffer_Release(&views[i])
        PyMem_Free(views)
        PyBuffer_Release(&h)


# --- prefetching a run's per-partition objects ------------------------------------------------------------------
#
# Staging an entry reads a chain of objects that belong to its partition: shard -> ConsumeQueue -> its file queue
# -> the files list -> the last file -> its positions, its memoryview and the unit's page. With a thousand
# partitions none of them is in the cache, and each read waits for the one before it: about 16 misses one after
# the other per entry, most of what a batch into 1,000 partitions costs beyond one into 1 partition. So, a window
# of entries at a time, the chain is walked one link per pass over the window, prefetching each entry's next link:
# the window's misses of one link overlap instead of queueing. Slots are read at their offsets (taken from the
# classes' member descriptors by `plan_prefetch`) and only from objects of exactly the planned type; nothing is
# changed, no reference is taken, and a prefetch of any address is harmless. Whatever does not match the plan is
# skipped here and staged as before.

cdef extern from *:
    """
    #include <structmember.h>
    #ifndef T_OBJECT_EX
    #define T_OBJECT_EX Py_T_OBJECT_EX
    #endif
    #define MQK_PREFETCH(p) __builtin_prefetch((const void*)(p), 0, 3)
    #define MQK_PREFETCH_W(p) __builtin_prefetch((const void*)(p), 1, 3)
    /* offset of a __slots__ member of `type` (its own member descriptor of an object slot), or -1 */
    static Py_ssize_t mqk_slot_offset(PyObject* descr, PyObject* type) {
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)
                || (PyObject*)((PyDescrObject*)descr)->d_type != type) return -1;
        PyMemberDef* m = ((PyMemberDescrObject*)descr)->d_member;
        return m->type == T_OBJECT_EX ? m->offset : -1;
    }
    static inline PyObject* mqk_slot(PyObject* obj, Py_ssize_t offset) {
        return *(PyObject**)((char*)obj + offset);
    }
    static inline int mqk_is(PyObject* obj, PyObject* type) {
        return obj != NULL && (PyObject*)Py_TYPE(obj) == type;
    }
    static inline void* mqk_view_buf(PyObject* mv) {
        return ((PyMemoryViewObject*)mv)->view.buf;
    }
    static inline Py_ssize_t mqk_view_len(PyObject* mv) {
        return ((PyMemoryViewObject*)mv)->view.len;
    }
    static inline PyObject** mqk_list_items(PyObject* list) {
        return ((PyListObject*)list)->ob_item;
    }
    static inline int mqk_is_memoryview(PyObject* obj) {
        return obj != NULL && Py_IS_TYPE(obj, &PyMemoryView_Type);
    }
    static inline PyObject* mqk_view_base(PyObject* mv) {
        return (PyObject*)((PyMemoryViewObject*)mv)->mbuf;
    }
    """
    void MQK_PREFETCH(const void* p) nogil
    void MQK_PREFETCH_W(const void* p) nogil
    Py_ssize_t mqk_slot_offset(PyObject* descr, PyObject* type)
    PyObject* mqk_slot(PyObject* obj, Py_ssize_t offset)
    bint mqk_is(PyObject* obj, PyObject* type)
    bint mqk_is_memoryview(PyObject* obj)
    void* mqk_view_buf(PyObject* mv)
    Py_ssize_t mqk_view_len(PyObject* mv)
    PyObject* mqk_view_base(PyObject* mv)
    bint PyTuple_CheckExact(PyObject* o)
    bint PyLong_CheckExact(PyObject* o)
    bint PyList_CheckExact(PyObject* o)
    long PyLong_AsLongAndOverflow(PyObject* o, int* overflow)
    Py_ssize_t PyList_GET_SIZE(PyObject* o)
    PyObject* PyList_GET_ITEM_RAW "PyList_GET_ITEM" (PyObject* o, Py_ssize_t i)
    PyObject* PyTuple_GET_ITEM_RAW "PyTuple_GET_ITEM" (PyObject* o, Py_ssize_t i)
    Py_ssize_t PyTuple_GET_SIZE_RAW "PyTuple_GET_SIZE" (PyObject* o)
    PyObject** mqk_list_items(PyObject* o)

DEF PREFETCH_WINDOW = 16

cdef object _planned = None  # the four classes, kept alive while their addresses are compared
cdef PyObject* _t_shard = NULL
cdef PyObject* _t_queue = NULL
cdef PyObject* _t_file_queue = NULL
cdef PyObject* _t_file = NULL
cdef Py_ssize_t _o_cq, _o_log_start, _o_mfq, _o_end_offset, _o_max_ts, _o_files, _o_wrote, _o_reserved, _o_buf


def plan_prefetch(shard_type, queue_type, file_queue_type, file_type):
    """Let `append_run` prefetch a run's per-partition objects (see above): the classes of the shard (slots `cq`,
    `log_start`), ConsumeQueue (`mfq`, `end_offset`, `max_ts`), MappedFileQueue (`files`) and MappedFile
    (`wrote`, `reserved`, `buf`), as `append_run` reads them. Returns whether every one is a __slots__ member;
    if not, nothing is prefetched. A hint only: results never depend on it (the twin's is a no-op)."""
    global _planned, _t_shard, _t_queue, _t_file_queue, _t_file
    global _o_cq, _o_log_start, _o_mfq, _o_end_offset, _o_max_ts, _o_files, _o_wrote, _o_reserved, _o_buf
    _t_shard = _t_queue = _t_file_queue = _t_file = NULL
    _planned = None
    wanted = ((shard_type, ("cq", "log_start")), (queue_type, ("mfq", "end_offset", "max_ts")),
              (file_queue_type, ("files",)), (file_type, ("wrote", "reserved", "buf")))
    offsets = []
    for cls, names in wanted:
        if not isinstance(cls, type):
            return False
        for name in names:
            descr = cls.__dict__.get(name)
            offset = mqk_slot_offset(<PyObject*>descr, <PyObject*>cls) if descr is not None else -1
            if offset < 0:
                return False
            offsets.append(offset)
    _o_cq, _o_log_start, _o_mfq, _o_end_offset, _o_max_ts, _o_files, _o_wrote, _o_reserved, _o_buf = offsets
    _planned = (shard_type, queue_type, file_queue_type, file_type)
    _t_shard = <PyObject*>shard_type
    _t_queue = <PyObject*>queue_type
    _t_file_queue = <PyObject*>file_queue_type
    _t_file = <PyObject*>file_type
    return True


cdef inline void _prefetch_object(PyObject* obj) noexcept:
    if obj != NULL:
        MQK_PREFETCH(obj)
        MQK_PREFETCH(<char*>obj + 64)


cdef void _prefetch_window(PyObject* shards, PyObject* entries, Py_ssize_t first, Py_ssize_t stop) noexcept:
    """Walk entries[first:stop]'s chains one link per pass (see above). Borrowed pointers only, under the GIL."""
    cdef PyObject* link[PREFETCH_WINDOW]
    cdef PyObject* entry
    cdef PyObject* obj
    cdef Py_ssize_t n = min(stop - first, PREFETCH_WINDOW), k, n_shards = PyList_GET_SIZE(shards), last
    cdef long queue
    cdef int overflow
    if _t_shard == NULL:
        return
    for k in range(n):  # the shards (the request's entries are fresh in the cache)
        link[k] = NULL
        entry = PyList_GET_ITEM_RAW(entries, first + k)
        if not PyTuple_CheckExact(entry) or PyTuple_GET_SIZE_RAW(entry) != 2:
            continue
        obj = PyTuple_GET_ITEM_RAW(entry, 0)
        if not PyLong_CheckExact(obj):
            continue
        queue = PyLong_AsLongAndOverflow(obj, &overflow)
        if overflow or not 0 <= queue < n_shards:
            continue
        link[k] = PyList_GET_ITEM_RAW(shards, queue)
        _prefetch_object(link[k])
    for k in range(n):  # shard -> its ConsumeQueue (and the log start its answer reads)
        obj = link[k]
        link[k] = NULL
        if mqk_is(obj, _t_shard):
            MQK_PREFETCH(mqk_slot(obj, _o_log_start))
            link[k] = mqk_slot(obj, _o_cq)
            _prefetch_object(link[k])
    for k in range(n):  # ConsumeQueue -> its end offset, running max timestamp and file queue
        obj = link[k]
        link[k] = NULL
        if mqk_is(obj, _t_queue):
            MQK_PREFETCH(mqk_slot(obj, _o_end_offset))
            MQK_PREFETCH(mqk_slot(obj, _o_max_ts))
            link[k] = mqk_slot(obj, _o_mfq)
            if link[k] != NULL:
                MQK_PREFETCH(<char*>link[k] + _o_files)
    for k in range(n):  # file queue -> the files list
        obj = link[k]
        link[k] = NULL
        if mqk_is(obj, _t_file_queue):
            link[k] = mqk_slot(obj, _o_files)
            if link[k] != NULL:
                MQK_PREFETCH(link[k])
    for k in range(n):  # the list -> its last item's pointer
        obj = link[k]
        if obj != NULL and PyList_CheckExact(obj) and PyList_GET_SIZE(obj) > 0:
            MQK_PREFETCH(mqk_list_items(obj) + PyList_GET_SIZE(obj) - 1)
        else:
            link[k] = NULL
    for k in range(n):  # -> the last file
        obj = link[k]
        link[k] = NULL
        if obj != NULL:
            link[k] = PyList_GET_ITEM_RAW(obj, PyList_GET_SIZE(obj) - 1)
            _prefetch_object(link[k])
    for k in range(n):  # file -> its write position, reservation and memoryview
        obj = link[k]
        link[k] = NULL
        if mqk_is(obj, _t_file):
            MQK_PREFETCH(mqk_slot(obj, _o_reserved))
            MQK_PREFETCH(mqk_slot(obj, _o_wrote))
            link[k] = obj
            obj = mqk_slot(obj, _o_buf)
            if obj != NULL:
                _prefetch_object(obj)
                MQK_PREFETCH(<char*>obj + 128)
    for k in range(n):  # memoryview -> its managed buffer, and the unit's place in the mapping
        obj = link[k]
        if obj == NULL:
            continue
        entry = mqk_slot(obj, _o_buf)  # the memoryview
        obj = mqk_slot(obj, _o_wrote)
        if not mqk_is_memoryview(entry) or obj == NULL or not PyLong_CheckExact(obj):
            continue
        MQK_PREFETCH(mqk_view_base(entry))
        last = PyLong_AsLongAndOverflow(obj, &overflow)
        if not overflow and 0 <= last < mqk_view_len(entry):
            MQK_PREFETCH_W(<char*>mqk_view_buf(entry) + last)


cdef struct Staged:
    PyObject* shard
    PyObject* cq
    PyObject* qf
    Py_ssize_t queue
    Py_ssize_t qpos
    int64_t phys
    int64_t base
    int64_t span
    int64_t running


def append_run(int fd, Py_ssize_t seg_start, Py_ssize_t pos, Py_ssize_t seg_size, list shards not None,
               list entries not None, Py_ssize_t start, heads, bytes topic not None, Py_ssize_t store_timestamp,
               list out not None, list grown not None, result_type, set dirty not None):
    """See clentry_py.append_run: a run of single-batch entries staged, written with one pwritev per
    WRITE_ENTRIES_CHUNK entries (without the GIL) and published, in one call."""
    cdef Py_ssize_t topic_len = PyBytes_GET_SIZE(topic)
    cdef Py_ssize_t head_len = C_FIXED + topic_len + 8
    cdef Py_ssize_t n_shards = len(shards), count = 0, limit, i, k, cur = pos, queue, qpos
    cdef Py_buffer h, units
    cdef Py_buffer* bodies = NULL
    cdef Staged* staged = NULL
    cdef Staged* st
    cdef unsigned char* marks = NULL
    cdef int64_t done[3]
    cdef int64_t base, running
    cdef int ok
    if start < 0 or pos < 0 or seg_size < pos or seg_start < 0:
        raise OutOfBounds(f"run from entry {start} at {pos} of a {seg_size}-byte segment at {seg_start}")
    borrow_writable(heads, &h)
    try:
        limit = min(len(entries) - start, h.len // head_len)
        if limit <= 0:
            return (0, pos, None)
        staged = <Staged*>PyMem_Malloc(limit * sizeof(Staged))
        bodies = <Py_buffer*>PyMem_Malloc(limit * sizeof(Py_buffer))
        marks = <unsigned char*>calloc(n_shards // 8 + 1, 1)
        if staged == NULL or bodies == NULL or marks == NULL:
            raise MemoryError()
        # staging: each entry's head into its slot of `heads` and its unit past its queue's published end
        while count < limit:
            if count % PREFETCH_WINDOW == 0:
                _prefetch_window(<PyObject*>shards, <PyObject*>entries, start + count, start + limit)
            entry = entries[start + count]
            if type(entry) is not tuple or PyTuple_GET_SIZE(entry) != 2:
                break
            q = <object>PyTuple_GET_ITEM(entry, 0)
            if type(q) is not int or not 0 <= q < n_shards:
                break
            queue = q
            if marks[queue >> 3] & (1 << (queue & 7)):
                break  # a queue appears once in a run: its second entry builds on the first one's published end
            shard = <object>PyList_GET_ITEM(shards, queue)
            batches = <object>PyTuple_GET_ITEM(entry, 1)
            if shard is None or len(batches) != 1:
                break
            try:
                cq = shard.cq
                files = cq.mfq.files
                if not files:
                    break
                qf = files[len(files) - 1]
                qpos = qf.wrote
                if qpos + C_UNIT > qf.reserved:
                    break
                base = cq.end_offset
                running = cq.max_ts
                borrow(batches[0], &bodies[count])
            except Exception:  # a shape _put reports
                break
            ok = 0
            try:
                if (bodies[count].len <= C_INT32_MAX - C_FIXED - topic_len
                        and C_FIXED + topic_len + bodies[count].len + C_BLANK_MIN <= seg_size - cur):
                    borrow_writable(qf.buf, &units)
                    try:
                        ok = _head_and_unit(<unsigned char*>h.buf + count * head_len, head_len, topic, queue,
                                            base, seg_start + cur, store_timestamp, 0,
                                            <const unsigned char*>bodies[count].buf, bodies[count].len,
                                            <unsigned char*>units.buf, units.len, qpos, running, done)
                    finally:
                        PyBuffer_Release(&units)
            except Exception:  # _put gives this entry its own answer
                ok = 0
            if not ok:
                PyBuffer_Release(&bodies[count])
                break
            st = &staged[count]
            st.shard = <PyObject*>shard
            st.cq = <PyObject*>cq
            st.qf = <PyObject*>qf
            Py_INCREF(shard)
            Py_INCREF(cq)
            Py_INCREF(qf)
            st.queue = queue
            st.qpos = qpos
            st.phys = seg_start + cur
            st.base = base
            st.span = done[1]
            st.running = done[2]
            marks[queue >> 3] |= <unsigned char>(1 << (queue & 7))
            cur += done[0]
            count += 1
        if count == 0:
            return (0, pos, None)
        try:  # the run's bytes, before any of it is published
            _write_heads_and_bodies(fd, pos, <char*>h.buf, head_len, bodies, count)
        except OSError as exc:
            return (count, pos, exc)
        # publish, as FileEngine._put does: the unit, then the queue's end
        for i in range(count):
            st = &staged[i]
            qf = <object>st.qf
            cq = <object>st.cq
            qf.wrote = qf.committed = st.qpos + C_UNIT
            end = st.base + st.span
            cq.end_offset = end
            cq.max_ts = st.running
            if cq.dirty_since_phys < 0:
                cq.dirty_since_phys = st.phys
                cq.dirty_since_ms = store_timestamp
                dirty.add(cq)
            out.append(tuple.__new__(result_type, (st.base, end - 1, store_timestamp, (<object>st.shard).log_start,
                                                   st.phys)))
            grown.append((st.queue, end))
        return (count, cur, None)
    finally:
        if staged != NULL:
            for k in range(count):
                PyBuffer_Release(&bodies[k])
                Py_XDECREF(staged[k].shard)
                Py_XDECREF(staged[k].cq)
                Py_XDECREF(staged[k].qf)
        PyMem_Free(staged)
        PyMem_Free(bodies)
        free(marks)
        PyBuffer_Release(&h)


def blank_head(Py_ssize_t size):
    cdef int32_t c_size = as_i32(size)
    if c_size < C_BLANK_MIN:
        raise ValueError(f"blank of {c_size} bytes is below the minimum {C_BLANK_MIN}")
    cdef unsigned char out[8]
    st_u32(out, <uint32_t>c_size)
    st_u32(out + 4, C_MAGIC_BLANK)
    return (<char*>out)[:8]


def read_entry(buf, Py_ssize_t pos, Py_ssize_t limit, bint verify=True):
    cdef Py_buffer view
    borrow(buf, &view)
    try:
        if limit < 0 or limit > view.len or pos < 0 or pos > limit:
            raise OutOfBounds(f"read at {pos} with limit {limit} outside buffer of {view.len} bytes")
        return _read_entry(<const unsigned char*>view.buf + pos, pos, limit - pos, verify)
    finally:
        PyBuffer_Release(&view)


cdef tuple _read_entry(const unsigned char* e, Py_ssize_t pos, Py_ssize_t remaining, bint verify):
    if remaining < C_BLANK_MIN:
        return _END
    cdef int32_t total_size = ld_i32(e)
    cdef uint32_t magic = ld_u32(e + 4)
    if total_size == 0:
        return _END
    if magic == C_MAGIC_BLANK:
        if total_size < C_BLANK_MIN or total_size > remaining:
            raise Corrupt(f"impossible blank size {total_size}", pos)
        return (2, total_size, 0, 0, 0, 0, 0, 0, 0, 0, "", -1)
    if magic != C_MAGIC_MESSAGE:
        raise Corrupt(f"bad entry magic {magic:#x}", pos)
    if total_size < C_FIXED + C_BATCH_HEADER or total_size > remaining:
        raise Corrupt(f"impossible entry size {total_size}", pos)
    cdef Py_ssize_t topic_len = ld_u16(e + 64)
    if total_size - C_FIXED - topic_len < C_BATCH_HEADER:
        raise Corrupt(f"topic length {topic_len} leaves no record batch", pos)
    if verify and crc32c_of(_crc32c, e + C_CRC_START, total_size - C_CRC_START) != ld_u32(e + 8):
        raise Corrupt("entry CRC mismatch", pos)
    try:
        topic = PyUnicode_DecodeUTF8(<const char*>e + C_FIXED, topic_len, NULL)
    except UnicodeDecodeError:
        raise Corrupt("topic is not UTF-8", pos) from None
    return (1, total_size, ld_i32(e + 12), ld_i32(e + 16), ld_i64(e + 20), ld_i64(e + 28), ld_i32(e + 36),
            ld_i64(e + 40), ld_i64(e + 48), ld_i64(e + 56), topic, pos + C_FIXED + topic_len)
