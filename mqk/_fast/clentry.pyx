# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""CommitLog entry kernels, compiled: the hot-path twin of `clentry_py.py` (same API, identical results).

Every append runs through `AppendRun` (plan, write, publish), every recovery and dispatch pass `read_entry`.
Bounds are checked explicitly before each access (boundscheck is off). See clentry_py.py for the layout, the BLANK
rule and the error contract.
"""
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t
from libc.string cimport memcpy
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.buffer cimport PyBuffer_Release
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.exc cimport PyErr_CheckSignals
from cpython.buffer cimport PyObject_CheckBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_CheckExact
from cpython.long cimport PyLong_CheckExact
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_CheckExact, PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_SET_ITEM
from libc cimport errno as c_errno
from libc.string cimport strerror
from posix.types cimport off_t
from posix.uio cimport iovec, pwritev

from mqk._fast._bytes cimport (as_i32, borrow, borrow_writable, crc32c_of, crc32c_of_two, ld_i32, ld_i64, ld_u16, ld_u32,
                               st_cq_unit, st_i64, st_u16, st_u32)

from mqk._fast.crc import crc32c as _crc32c

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


cdef extern from "Python.h":
    long PyLong_AsLongAndOverflow(object o, int* overflow) except? -1


# --- the append pipeline's kernel: plan, write, publish ----------------------------------------------------------
#
# The file store appends through one `AppendRun`: `plan` stages a run of entries (each entry's heads side by side in
# the run's buffer, each batch's ConsumeQueue unit past its queue's published end), `write` puts the run's bytes in
# the CommitLog with pwritev (no GIL), and `publish` moves the positions: the only place they move. Per-queue
# positions live in the store's queue table, a flat buffer of ROW_FIELDS native int64 per queue (row layout below),
# so staging reads one cache line per queue instead of a chain of Python objects.

ROW_END = 0             #: the queue's end offset (the offset its next record gets)
ROW_MAX_TS = 1          #: running maximum record timestamp over the queue
ROW_CQ_WROTE = 2        #: write position in the queue's last ConsumeQueue file (published units end here)
ROW_CQ_RESERVED = 3     #: bytes of that file with disk blocks (a unit is only staged below this)
ROW_DIRTY_PHYS = 4      #: CommitLog offset of the first unit not yet flushed (-1: none)
ROW_DIRTY_MS = 5        #: store time of that unit
ROW_LOG_START = 6       #: the queue's log start offset (answered with every append)
ROW_STAGED = 7          #: 1 + index of the queue's last batch staged in the current run (0: none); plan's scratch
ROW_FIELDS = 8
ROW_BYTES = 64

STOP_END = 0            #: every entry was planned
STOP_FULL = 1           #: the run holds as many batches as it can (`capacity`)
STOP_SEGMENT = 2        #: the entry does not fit the rest of the CommitLog segment
STOP_UNIT_ROOM = 3      #: the queue's last ConsumeQueue file has no reserved room for the entry's units
STOP_NO_SHARD = 4       #: the entry's queue is not a shard of the topic
STOP_BATCH = 5          #: a buffer of the entry is not exactly one acceptable record batch v2
STOP_SHAPE = 6          #: the entry is not a (queue id, sequence of buffers) pair

DEF R_END = 0
DEF R_MAX_TS = 1
DEF R_CQ_WROTE = 2
DEF R_CQ_RESERVED = 3
DEF R_DIRTY_PHYS = 4
DEF R_DIRTY_MS = 5
DEF R_LOG_START = 6
DEF R_STAGED = 7
DEF R_FIELDS = 8

cdef extern from *:
    """
    /* a new, empty instance of the tuple type `type` with room for n items (what tuple.__new__ allocates) */
    static PyObject* mqk_alloc_tuple(PyObject* type, Py_ssize_t n) {
        return ((PyTypeObject*)type)->tp_alloc((PyTypeObject*)type, n);
    }
    #define MQK_PREFETCH(p) __builtin_prefetch((const void*)(p), 0, 3)
    #define MQK_PREFETCH_W(p) __builtin_prefetch((const void*)(p), 1, 3)
    """
    object mqk_alloc_tuple(object type, Py_ssize_t n)
    void MQK_PREFETCH(const void* p) nogil
    void MQK_PREFETCH_W(const void* p) nogil

DEF PREFETCH_WINDOW = 16


cdef struct Staged:
    int64_t slot
    int64_t queue
    int64_t entry       # index of the entry in the caller's list
    int64_t index       # position of the batch in its entry
    int64_t qpos        # where its unit was staged
    int64_t phys        # its CommitLog offset
    int64_t base
    int64_t span
    int64_t running     # the queue's running max timestamp with this batch
    int64_t size        # its entry's size in the CommitLog


cdef class AppendRun:
    """See clentry_py.AppendRun: the same API and results."""

    cdef Staged* _staged
    cdef Py_buffer* _bodies
    cdef readonly Py_ssize_t capacity
    cdef bytearray _heads
    cdef Py_ssize_t _head_len
    cdef readonly Py_ssize_t batches
    cdef readonly Py_ssize_t entries
    cdef readonly int stop
    cdef readonly Py_ssize_t start
    cdef readonly Py_ssize_t pos
    cdef readonly Py_ssize_t end_pos
    cdef readonly int64_t seg_start
    cdef readonly int64_t store_timestamp
    cdef readonly int64_t published_entries
    cdef readonly int64_t published_batches
    cdef readonly int64_t published_bytes

    def __cinit__(self, Py_ssize_t capacity=4096):
        if capacity < 1 or capacity > 1 << 20:
            raise ValueError(f"run capacity {capacity} outside [1, 1048576]")
        self._staged = <Staged*>PyMem_Malloc(capacity * sizeof(Staged))
        self._bodies = <Py_buffer*>PyMem_Malloc(capacity * sizeof(Py_buffer))
        if self._staged == NULL or self._bodies == NULL:
            raise MemoryError()
        self.capacity = capacity
        self._heads = bytearray()
        self._head_len = 0
        self.batches = 0
        self.entries = 0
        self.stop = STOP_END
        self.start = self.pos = self.end_pos = 0
        self.published_entries = self.published_batches = self.published_bytes = 0

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self._bodies != NULL:
            for i in range(self.batches):
                PyBuffer_Release(&self._bodies[i])
        PyMem_Free(self._staged)
        PyMem_Free(self._bodies)

    cdef void _release(self, Py_ssize_t first) noexcept:
        """Forget the staged batches from `first` on (their bodies' buffers released)."""
        cdef Py_ssize_t i
        for i in range(first, self.batches):
            PyBuffer_Release(&self._bodies[i])
        self.batches = first

    def plan(self, rows, slot_map, list unit_bufs not None, list entries not None, Py_ssize_t start,
             bytes topic not None, int64_t store_timestamp, int64_t tags_code, int64_t seg_start, Py_ssize_t pos,
             Py_ssize_t seg_size, int write_to=-1):
        """See clentry_py.AppendRun.plan."""
        if self.batches:
            raise RuntimeError("an AppendRun must be published or abandoned before it plans again")
        if start < 0 or start > len(entries) or pos < 0 or seg_size < pos or seg_start < 0:
            raise OutOfBounds(f"run from entry {start} at {pos} of a {seg_size}-byte segment at {seg_start}")
        cdef Py_ssize_t topic_len = PyBytes_GET_SIZE(topic)
        if topic_len > 0xFFFF:
            raise ValueError(f"topic length {topic_len} outside [0, 65535]")
        cdef Py_ssize_t head_len = C_FIXED + topic_len + 8
        if len(self._heads) < head_len * self.capacity:
            self._heads = bytearray(head_len * self.capacity)
        self._head_len = head_len
        self.start = start
        self.pos = self.end_pos = pos
        self.seg_start = seg_start
        self.store_timestamp = store_timestamp
        self.entries = 0
        self.stop = STOP_END
        cdef Py_buffer rv, mv
        borrow_writable(rows, &rv)
        try:
            borrow(slot_map, &mv)
            try:  # (the heads buffer is the run's own bytearray, never resized while planned)
                self._plan(<int64_t*>rv.buf, rv.len // (R_FIELDS * 8), <const int64_t*>mv.buf, mv.len // 8,
                           unit_bufs, entries, topic, tags_code, seg_size,
                           <unsigned char*>PyByteArray_AS_STRING(self._heads))
            finally:
                PyBuffer_Release(&mv)
        finally:
            PyBuffer_Release(&rv)
        if write_to >= 0 and self.batches:
            _write_heads_and_bodies(write_to, self.pos, <char*>PyByteArray_AS_STRING(self._heads), head_len,
                                    self._bodies, self.batches)
        return self.entries

    cdef int _plan(self, int64_t* rows, Py_ssize_t n_rows, const int64_t* slots, Py_ssize_t n_queues,
                   list unit_bufs, list entries, bytes topic, int64_t tags_code, Py_ssize_t seg_size,
                   unsigned char* heads) except -1:
        cdef Py_ssize_t n_entries = PyList_GET_SIZE(entries), e, j, n_batches, first_batch
        cdef Py_ssize_t head_len = self._head_len, topic_len = PyBytes_GET_SIZE(topic)
        cdef Py_ssize_t n_bufs = PyList_GET_SIZE(unit_bufs)
        cdef Py_ssize_t cur = self.pos, entry_cur, size
        cdef int64_t slot, queue, end, running, qpos, reserved, saved_staged
        cdef int64_t* row
        cdef int64_t done[3]
        cdef Staged* st
        cdef Staged* prev
        cdef Py_buffer* body
        cdef Py_buffer unit_view
        cdef int stop
        cdef long q
        cdef int overflow
        cdef object entry, batches, ubuf
        for e in range(self.start, n_entries):
            if (e - self.start) % PREFETCH_WINDOW == 0:
                _prefetch_rows(rows, n_rows, slots, n_queues, entries, e, min(n_entries, e + PREFETCH_WINDOW))
            entry = <object>PyList_GET_ITEM(entries, e)
            if not PyTuple_CheckExact(entry) or PyTuple_GET_SIZE(entry) != 2:
                self.stop = STOP_SHAPE
                return 0
            qobj = <object>PyTuple_GET_ITEM(entry, 0)
            batches = <object>PyTuple_GET_ITEM(entry, 1)
            if not PyLong_CheckExact(qobj) or not (PyList_CheckExact(batches) or PyTuple_CheckExact(batches)):
                self.stop = STOP_SHAPE
                return 0
            q = PyLong_AsLongAndOverflow(qobj, &overflow)
            if overflow or q < 0 or q >= n_queues or slots[q] < 0:
                self.stop = STOP_NO_SHARD
                return 0
            queue = q
            slot = slots[q]
            if slot >= n_rows or slot >= n_bufs:
                raise OutOfBounds(f"queue {queue} maps to slot {slot} outside the table of {n_rows} rows")
            n_batches = len(batches)
            if n_batches == 0:
                self.stop = STOP_BATCH
                return 0
            if self.batches + n_batches > self.capacity:
                self.stop = STOP_FULL
                return 0
            row = rows + slot * R_FIELDS
            saved_staged = row[R_STAGED]
            if saved_staged > 0:  # the queue is in this run already: build on what was staged for it
                prev = &self._staged[saved_staged - 1]
                end = prev.base + prev.span
                running = prev.running
                qpos = prev.qpos + C_UNIT
            else:
                end = row[R_END]
                running = row[R_MAX_TS]
                qpos = row[R_CQ_WROTE]
            reserved = row[R_CQ_RESERVED]
            ubuf = <object>PyList_GET_ITEM(unit_bufs, slot)
            first_batch = self.batches
            entry_cur = cur
            stop = STOP_END
            for j in range(n_batches):
                obj = batches[j]
                if not PyObject_CheckBuffer(obj):
                    stop = STOP_SHAPE
                    break
                body = &self._bodies[self.batches]
                borrow(obj, body)
                self.batches += 1  # (released by _release from here on)
                if not _acceptable_batch(<const unsigned char*>body.buf, body.len) \
                        or body.len > C_INT32_MAX - C_FIXED - topic_len:
                    stop = STOP_BATCH
                    break
                size = C_FIXED + topic_len + body.len
                if size + C_BLANK_MIN > seg_size - cur:
                    stop = STOP_SEGMENT
                    break
                if ubuf is None or qpos < 0 or qpos + C_UNIT > reserved:
                    stop = STOP_UNIT_ROOM
                    break
                borrow_writable(ubuf, &unit_view)
                try:
                    _head_and_unit(heads + (self.batches - 1) * head_len, head_len, topic, queue, end,
                                   self.seg_start + cur, self.store_timestamp, tags_code,
                                   <const unsigned char*>body.buf, body.len, <unsigned char*>unit_view.buf,
                                   unit_view.len, qpos, running, done)
                finally:
                    PyBuffer_Release(&unit_view)
                st = &self._staged[self.batches - 1]
                st.slot = slot
                st.queue = queue
                st.entry = e
                st.index = j
                st.qpos = qpos
                st.phys = self.seg_start + cur
                st.base = end
                st.span = done[1]
                st.running = done[2]
                st.size = done[0]
                cur += done[0]
                end += done[1]
                running = done[2]
                qpos += C_UNIT
            if stop != STOP_END:  # the entry is planned whole or not at all
                self._release(first_batch)
                self.stop = stop
                return 0
            row[R_STAGED] = self.batches
            self.entries += 1
            self.end_pos = cur
        return 0

    def write(self, int fd):
        """See clentry_py.AppendRun.write."""
        if self.batches == 0:
            return None
        if fd < 0:
            raise OSError(c_errno.EBADF, "AppendRun.write: bad file descriptor")
        _write_heads_and_bodies(fd, self.pos, <char*>PyByteArray_AS_STRING(self._heads), self._head_len,
                                self._bodies, self.batches)
        return None

    def publish(self, rows, list out not None, list grown not None, list dirtied not None, type result_type not None):
        """See clentry_py.AppendRun.publish."""
        global _checked_result_type
        if result_type is not _checked_result_type:
            if not issubclass(result_type, tuple):
                raise TypeError(f"result_type must be a tuple type, not {result_type.__name__}")
            _checked_result_type = result_type
        cdef Py_buffer rv
        cdef Py_ssize_t i, n = self.batches, n_rows
        cdef Staged* st
        cdef int64_t* row
        cdef int64_t* r
        cdef int64_t first_base = 0, first_phys = 0, end
        if n == 0:
            return 0
        borrow_writable(rows, &rv)
        try:
            r = <int64_t*>rv.buf
            n_rows = rv.len // (R_FIELDS * 8)
            for i in range(n):
                if self._staged[i].slot >= n_rows:
                    raise OutOfBounds(f"staged slot {self._staged[i].slot} outside the table of {n_rows} rows")
            for i in range(n):
                st = &self._staged[i]
                row = r + st.slot * R_FIELDS
                if st.index == 0:
                    first_base = st.base
                    first_phys = st.phys
                end = st.base + st.span
                row[R_CQ_WROTE] = st.qpos + C_UNIT
                row[R_END] = end
                row[R_MAX_TS] = st.running
                row[R_STAGED] = 0
                if row[R_DIRTY_PHYS] < 0:  # the queue's first unit not yet flushed
                    row[R_DIRTY_PHYS] = st.phys
                    row[R_DIRTY_MS] = self.store_timestamp
                    dirtied.append(st.slot)
                if i + 1 == n or self._staged[i + 1].entry != st.entry:  # the entry's last batch
                    out.append(_result(result_type, first_base, end - 1, self.store_timestamp, row[R_LOG_START],
                                       first_phys))
                    grown.append((st.queue, end))
                    self.published_entries += 1
        finally:
            PyBuffer_Release(&rv)
        self.published_batches += n
        self.published_bytes += self.end_pos - self.pos
        self._release(0)
        return n

    def abandon(self, rows):
        """See clentry_py.AppendRun.abandon."""
        cdef Py_buffer rv
        cdef Py_ssize_t i, n_rows
        cdef int64_t* r
        if self.batches == 0:
            return None
        borrow_writable(rows, &rv)
        try:
            r = <int64_t*>rv.buf
            n_rows = rv.len // (R_FIELDS * 8)
            for i in range(self.batches):
                if self._staged[i].slot < n_rows:
                    r[self._staged[i].slot * R_FIELDS + R_STAGED] = 0
        finally:
            PyBuffer_Release(&rv)
        self._release(0)
        return None

    def batch(self, Py_ssize_t i):
        """See clentry_py.AppendRun.batch."""
        if i < 0 or i >= self.batches:
            raise IndexError(f"batch {i} of a run of {self.batches}")
        cdef Staged* st = &self._staged[i]
        return (st.entry, st.index, st.queue, st.base, st.span, st.phys, st.size)


cdef object _result(type result_type, int64_t base, int64_t last, int64_t store_ts, int64_t log_start,
                    int64_t phys):
    """result_type(base, last, store_ts, log_start, phys) for a tuple subclass of five fields (AppendResult), built
    as tuple.__new__ builds it, without looking tuple.__new__ up and binding it at every call."""
    result = mqk_alloc_tuple(result_type, 5)
    _set_item(result, 0, base)
    _set_item(result, 1, last)
    _set_item(result, 2, store_ts)
    _set_item(result, 3, log_start)
    _set_item(result, 4, phys)
    return result


cdef inline void _set_item(object result, Py_ssize_t i, object value) noexcept:
    Py_INCREF(value)  # (PyTuple_SET_ITEM steals a reference)
    PyTuple_SET_ITEM(result, i, value)


cdef type _checked_result_type = None  # the last result type publish was handed and found to be a tuple type


cdef bint _acceptable_batch(const unsigned char* b, Py_ssize_t n) noexcept:
    """Exactly one record batch v2 the store takes as it is (clentry_py.acceptable_batch)."""
    if n < C_BATCH_HEADER or b[16] != 2 or <Py_ssize_t>ld_i32(b + 8) + 12 != n:
        return False
    cdef int32_t last_offset_delta = ld_i32(b + 23)
    return 0 <= last_offset_delta < C_INT32_MAX and ld_i32(b + 57) >= 0


def acceptable_batch(body):
    """See clentry_py.acceptable_batch."""
    cdef Py_buffer view
    borrow(body, &view)
    try:
        return _acceptable_batch(<const unsigned char*>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)


cdef void _prefetch_rows(int64_t* rows, Py_ssize_t n_rows, const int64_t* slots, Py_ssize_t n_queues,
                         list entries, Py_ssize_t first, Py_ssize_t stop) noexcept:
    """Ask for the queue-table rows of entries[first:stop] ahead of staging them (a Produce into many partitions
    finds none of them cached; their misses then overlap instead of queueing). A hint: nothing is read for a
    result, an entry of the wrong shape is skipped."""
    cdef Py_ssize_t k
    cdef object entry, qobj
    cdef long q
    cdef int overflow
    for k in range(first, stop):
        entry = <object>PyList_GET_ITEM(entries, k)
        if not PyTuple_CheckExact(entry) or PyTuple_GET_SIZE(entry) != 2:
            continue
        qobj = <object>PyTuple_GET_ITEM(entry, 0)
        if not PyLong_CheckExact(qobj):
            continue
        q = PyLong_AsLongAndOverflow(qobj, &overflow)
        if overflow or q < 0 or q >= n_queues or slots[q] < 0 or slots[q] >= n_rows:
            continue
        MQK_PREFETCH_W(rows + slots[q] * R_FIELDS)


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
