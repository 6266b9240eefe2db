# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Kafka record batch v2 kernels, compiled: the hot-path twin of `recbatch_py.py` (same API, identical results).

Every produce request runs `scan_batches`; the loops here touch no Python objects except the result tuples. Bounds
are checked explicitly before each access (boundscheck is off), so bad bytes raise Corrupt / OutOfBounds, never
an out-of-bounds read or write. See recbatch_py.py for the layout and the error contract.
"""
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy
from cpython.buffer cimport PyBuffer_Release
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8

from mqk._fast._bytes cimport (VARINT_TRUNCATED, mqk_crc32c_mode, as_i16, as_i32, borrow, borrow_writable, crc32c_of,
                               ld_i16, ld_i32, ld_i64, ld_u32, put_uvarint, rd_varint, rd_varlong, st_i64, st_u16,
                               st_u32, uvarint_size, zigzag32, zigzag64)

from mqk._fast.crc import crc32c as _crc32c

from mqk.errors import Corrupt, InvalidRecord, InvalidTimestamp, OutOfBounds

if sizeof(Py_ssize_t) != 8:
    raise ImportError("mqk._fast kernels need a 64-bit Py_ssize_t; the pure-Python twins are used instead")

HEADER_SIZE = 61
MAGIC = 2
MIN_BATCH_LENGTH = 49
CRC_START = 21
ATTR_COMPRESSION_MASK = 0x07
ATTR_LOG_APPEND_TIME = 0x08
MIN_RECORD_BODY = 6

# why plan_plain_appends stopped before a partition (the twin's PLAN_* say each one)
PLAN_END = 0
PLAN_SHAPE = 1
PLAN_NO_QUEUE = 2
PLAN_LEGACY = 3
PLAN_IDEMPOTENT = 4
PLAN_INVALID = 5
PLAN_COMPRESSED = 6
PLAN_TOO_LARGE = 7
PLAN_CONTROL = 8

DEF C_HEADER = 61
DEF C_MIN_BATCH_LENGTH = 49
DEF C_CRC_START = 21
DEF C_MIN_RECORD_BODY = 6
DEF C_INT32_MAX = 2147483647


cdef inline Py_ssize_t _varint(const unsigned char* b, Py_ssize_t p, Py_ssize_t end, int32_t* out) except -1:
    """rd_varint raising the twins' Corrupt for a truncated or over-long varint at p."""
    cdef Py_ssize_t q = rd_varint(b, p, end, out)
    if q < 0:
        raise _varint_error(q, p, False)
    return q


cdef inline Py_ssize_t _varlong(const unsigned char* b, Py_ssize_t p, Py_ssize_t end, int64_t* out) except -1:
    """rd_varlong raising the twins' Corrupt for a truncated or over-long varlong at p."""
    cdef Py_ssize_t q = rd_varlong(b, p, end, out)
    if q < 0:
        raise _varint_error(q, p, True)
    return q


def crc32c_direct():
    """Whether this module calls the crc32c package's C function directly (else through its Python function)."""
    if mqk_crc32c_mode == 0:
        crc32c_of(_crc32c, <const unsigned char*>b"", 0)
    return mqk_crc32c_mode == 1


cdef inline object _varint_error(Py_ssize_t code, Py_ssize_t start, bint long_form):
    if code == VARINT_TRUNCATED:
        return Corrupt("truncated varlong" if long_form else "truncated varint", start)
    return Corrupt("varlong longer than 10 bytes" if long_form else "varint longer than 5 bytes", start)


def parse_header(buf, Py_ssize_t pos=0):
    cdef Py_buffer view
    cdef const unsigned char* h
    cdef int8_t magic
    borrow(buf, &view)
    try:
        if pos < 0 or view.len - pos < C_HEADER:
            raise Corrupt("truncated record batch header", pos)
        h = <const unsigned char*>view.buf + pos
        magic = <int8_t>h[16]
        if magic != 2:
            raise Corrupt(f"unsupported record batch magic {magic}", pos)
        return (ld_i64(h), ld_i32(h + 8), ld_i32(h + 12), magic, ld_u32(h + 17), ld_i16(h + 21), ld_i32(h + 23),
                ld_i64(h + 27), ld_i64(h + 35), ld_i64(h + 43), ld_i16(h + 51), ld_i32(h + 53), ld_i32(h + 57))
    finally:
        PyBuffer_Release(&view)


cdef struct Rules:
    # what a record walk checks beyond the record structure (the produce check of one topic's batches)
    uint64_t short_lengths  # bitmask of the wanted header names' lengths below 64 (_is_wanted)
    bint any_long           # a wanted name of 64 bytes or more
    bint require_keys       # a compacted topic: a null key is InvalidRecord
    bint check_timestamps   # CreateTime: a record's timestamp outside [ts_low, ts_high] is InvalidTimestamp
    int64_t ts_low
    int64_t ts_high


cdef tuple _rules(Rules* rules, names, bint require_keys, timestamps):
    """Fill `rules`; returns `names` checked to be a tuple of bytes."""
    rules.short_lengths = 0
    rules.any_long = False
    rules.require_keys = require_keys
    rules.check_timestamps = timestamps is not None
    rules.ts_low = rules.ts_high = 0
    cdef tuple wanted = _wanted_names(names, &rules.short_lengths, &rules.any_long)
    cdef Py_ssize_t low, high  # 64-bit (the module refuses to import otherwise); converted through __index__
    if timestamps is not None:
        if type(timestamps) is not tuple or len(<tuple>timestamps) != 2:
            raise TypeError("timestamps must be a (low, high) tuple")
        low = (<tuple>timestamps)[0]
        high = (<tuple>timestamps)[1]
        rules.ts_low, rules.ts_high = low, high
    return wanted


def scan_batches(buf, bint verify_crc=True, bint walk_records=False, names=(), bint require_keys=False,
                 timestamps=None):
    cdef Rules rules
    cdef tuple wanted = _rules(&rules, names, require_keys, timestamps)
    cdef Py_buffer view
    borrow(buf, &view)
    try:
        return _scan_batches(<const unsigned char*>view.buf, view.len, verify_crc, walk_records, wanted, &rules)
    finally:
        PyBuffer_Release(&view)


cdef list _scan_batches(const unsigned char* base, Py_ssize_t n, bint verify_crc, bint walk_records, tuple wanted,
                        Rules* rules):
    cdef Py_ssize_t pos = 0, size
    cdef const unsigned char* h
    cdef int named
    cdef list out = []
    while pos < n:
        size = _check_batch(base, n, pos, verify_crc, walk_records, wanted, rules, &named)
        h = base + pos
        out.append((pos, size, ld_i32(h + 23), ld_i64(h + 35), ld_i32(h + 57), ld_i16(h + 21), ld_i64(h + 43),
                    ld_i16(h + 51), ld_i32(h + 53), ld_i64(h + 27), None if named < 0 else named == 1))
        pos += size
    return out


cdef Py_ssize_t _check_batch(const unsigned char* base, Py_ssize_t n, Py_ssize_t pos, bint verify_crc,
                             bint walk_records, tuple wanted, Rules* rules, int* named) except -1:
    """scan_batches' checks of the batch at `pos` of base[0:n]; returns its size. named[0]: -1 (not walked), 0 or
    1 (whether a record carries a wanted header)."""
    cdef const unsigned char* h
    cdef int32_t batch_length, record_count
    cdef int8_t magic
    cdef Py_ssize_t size, count
    cdef bint found
    if n - pos < C_HEADER:
        raise Corrupt("truncated record batch header", pos)
    h = base + pos
    batch_length = ld_i32(h + 8)
    magic = <int8_t>h[16]
    if magic != 2:
        raise Corrupt(f"unsupported record batch magic {magic}", pos)
    if batch_length < C_MIN_BATCH_LENGTH:
        raise Corrupt(f"record batch length {batch_length} below minimum", pos)
    size = <Py_ssize_t>batch_length + 12
    if size > n - pos:
        raise Corrupt("truncated record batch", pos)
    record_count = ld_i32(h + 57)
    if record_count < 0:
        raise Corrupt(f"negative record count {record_count}", pos)
    if verify_crc and crc32c_of(_crc32c, h + C_CRC_START, size - C_CRC_START) != ld_u32(h + 17):
        raise Corrupt("record batch CRC mismatch", pos)
    named[0] = -1
    if walk_records and not ld_i16(h + 21) & 0x07:
        found = False
        count = _walk_section(base, pos + C_HEADER, pos + size, ld_i64(h + 27), wanted, rules, &found)
        if count != record_count:
            raise Corrupt(f"batch holds {count} records, header says {record_count}", pos)
        named[0] = found
    return size


cdef extern from "Python.h":
    Py_buffer* PyMemoryView_GET_BUFFER(object view)


def plan_plain_appends(list partitions not None, Py_ssize_t start, Py_ssize_t queue_count,
                       Py_ssize_t max_batch_bytes, names, bint require_keys, timestamps, list entries not None,
                       list delays not None, list slots not None, list answers not None):
    """The Produce handler's common case, one topic's `partition_data` dicts at a time from `start`: a partition
    whose `index` is a queue below `queue_count` and whose `records` (a 1-byte-item memoryview, as the request
    decoder gives) are v2 batches that pass scan_batches' whole check (CRC, record walk, `require_keys`,
    `timestamps`), none compressed, none over `max_batch_bytes`, the first without an idempotent producer id and
    sequence, is planned for one append: (index, [batch views]) onto `entries`, whether a record carries a
    header named in `names` onto `delays`, len(answers) onto `slots` and None onto `answers` (its answer's place).
    Stops at the first partition that is not such and returns (its position, why: PLAN_*), or
    (len(partitions), PLAN_END) when all were planned; the caller takes that partition on (the twin's docstring
    gives the order in which the reasons are checked)."""
    cdef Rules rules
    cdef tuple wanted = _rules(&rules, names, require_keys, timestamps)
    cdef Py_ssize_t i = start, n = len(partitions), index, pos, size, batches, first_size, n_bytes
    cdef Py_buffer view
    cdef Py_buffer* shape
    cdef const unsigned char* b
    cdef object part, index_obj, records
    cdef list views
    cdef int named, any_named, stop = PLAN_END
    if i < 0:
        raise ValueError("start must not be negative")
    while i < n:
        part = partitions[i]
        if type(part) is not dict:
            stop = PLAN_SHAPE
            break
        index_obj = (<dict>part).get("index")
        records = (<dict>part).get("records")
        if type(index_obj) is not int or type(records) is not memoryview:
            stop = PLAN_SHAPE
            break
        shape = PyMemoryView_GET_BUFFER(records)
        if shape.ndim != 1 or shape.itemsize != 1:
            stop = PLAN_SHAPE
            break
        try:
            index = index_obj
        except OverflowError:
            stop = PLAN_NO_QUEUE
            break
        if index < 0 or index >= queue_count:
            stop = PLAN_NO_QUEUE
            break
        try:
            borrow(records, &view)
        except BufferError:  # not contiguous
            stop = PLAN_SHAPE
            break
        try:
            b = <const unsigned char*>view.buf
            n_bytes = view.len
            if n_bytes <= 16 or b[16] != 2:  # nothing, or a legacy message set
                stop = PLAN_LEGACY
            elif n_bytes < C_HEADER:
                stop = PLAN_INVALID
            elif ld_i64(b + 43) >= 0 and ld_i32(b + 53) >= 0:
                stop = PLAN_IDEMPOTENT
            pos = batches = any_named = 0
            first_size = -1
            try:
                while stop == PLAN_END and pos < n_bytes:
                    size = _check_batch(b, n_bytes, pos, True, True, wanted, &rules, &named)
                    if named < 0:
                        stop = PLAN_COMPRESSED
                    elif size > max_batch_bytes:
                        stop = PLAN_TOO_LARGE
                    elif ld_i16(b + pos + 21) & 0x20:  # (which no client may write: the caller refuses it)
                        stop = PLAN_CONTROL
                    any_named |= named
                    if first_size < 0:
                        first_size = size
                    pos += size
                    batches += 1
            except (Corrupt, InvalidRecord):  # (InvalidTimestamp too) the caller's own check says what is wrong
                stop = PLAN_INVALID
        finally:
            PyBuffer_Release(&view)
        if stop != PLAN_END:
            break
        if first_size == n_bytes:
            views = [records]
        else:
            views = []
            pos = 0
            while pos < n_bytes:
                size = ld_i32(<const unsigned char*>shape.buf + pos + 8) + 12
                views.append(records[pos:pos + size])
                pos += size
        entries.append((index_obj, views))
        delays.append(any_named == 1)
        slots.append(len(answers))
        answers.append(None)
        i += 1
    return i, stop


cdef int32_t _uncompressed_batch(const unsigned char* b, Py_ssize_t n, Py_ssize_t pos, Py_ssize_t size,
                                 str what) except? -1:
    """The record count the header of the uncompressed batch at [pos, pos+size) of b[0:n] declares, after the
    checks every record walk starts with (the twin's _uncompressed_batch: same errors, same messages)."""
    if pos < 0 or size < 0 or size > n - pos:
        raise OutOfBounds(f"batch [{pos}, +{size}) outside buffer of {n} bytes")
    if size < C_HEADER:
        raise Corrupt("record batch smaller than its header", pos)
    if ld_i16(b + pos + 21) & 0x07:
        raise Corrupt(f"{what} on a compressed batch", pos)
    return ld_i32(b + pos + 57)


def count_records(buf, Py_ssize_t pos, Py_ssize_t size):
    cdef Py_buffer view
    borrow(buf, &view)
    try:
        return _count_records(<const unsigned char*>view.buf, view.len, pos, size)
    finally:
        PyBuffer_Release(&view)


cdef Py_ssize_t _count_records(const unsigned char* b, Py_ssize_t n, Py_ssize_t pos, Py_ssize_t size) except -1:
    cdef int32_t expected = _uncompressed_batch(b, n, pos, size, "count_records")
    cdef Py_ssize_t end = pos + size
    cdef Py_ssize_t p = pos + C_HEADER, q
    cdef int32_t length
    cdef Py_ssize_t count = 0
    while p < end:
        q = _varint(b, p, end, &length)
        if length < C_MIN_RECORD_BODY or length > end - q:
            raise Corrupt(f"bad record length {length}", p)
        p = q + length
        count += 1
    if count != expected:
        raise Corrupt(f"batch holds {count} records, header says {expected}", pos)
    return count


cdef inline Py_ssize_t _skip_bytes_or_none(const unsigned char* b, Py_ssize_t p, Py_ssize_t end,
                                           str what) except -1:
    """Position after the length-prefixed bytes field (-1 = None) at p, its content not looked at."""
    cdef int32_t length
    cdef Py_ssize_t q = _varint(b, p, end, &length)
    if length == -1:
        return q
    if length < 0 or length > end - q:
        raise Corrupt(f"bad {what} length {length}", p)
    return q + length


cdef inline bint _is_wanted(const unsigned char* key, Py_ssize_t klen, tuple names, uint64_t short_lengths,
                            bint any_long) noexcept:
    """Whether key[0:klen] equals one of `names` (all bytes, held alive by the tuple). A bitmask of the names'
    lengths below 64 rejects almost every key before any byte is compared."""
    cdef Py_ssize_t i
    cdef object name
    if klen < 64:
        if not (short_lengths >> klen) & 1:
            return False
    elif not any_long:
        return False
    for i in range(len(names)):
        name = names[i]
        if PyBytes_GET_SIZE(name) == klen and memcmp(PyBytes_AS_STRING(name), key, klen) == 0:
            return True
    return False


def has_header(buf, Py_ssize_t pos, Py_ssize_t size, names):
    cdef Py_buffer view
    borrow(buf, &view)
    try:
        return _has_header(<const unsigned char*>view.buf, view.len, pos, size, names)
    finally:
        PyBuffer_Release(&view)


cdef tuple _wanted_names(names, uint64_t* short_lengths, bint* any_long):
    """`names` checked to be a tuple of bytes, with the bitmask of its lengths below 64 (for _is_wanted)."""
    if type(names) is not tuple:
        raise TypeError("names must be a tuple of bytes")
    cdef Py_ssize_t name_len
    for name in <tuple>names:
        if type(name) is not bytes:
            raise TypeError("names must be a tuple of bytes")
        name_len = PyBytes_GET_SIZE(name)
        if name_len < 64:
            short_lengths[0] |= (<uint64_t>1) << name_len
        else:
            any_long[0] = True
    return <tuple>names


cdef bint _has_header(const unsigned char* b, Py_ssize_t n, Py_ssize_t pos, Py_ssize_t size, names) except -1:
    cdef Rules rules
    cdef tuple wanted = _rules(&rules, names, False, None)
    cdef int32_t expected = _uncompressed_batch(b, n, pos, size, "has_header")
    cdef bint found = False
    cdef Py_ssize_t count = _walk_section(b, pos + C_HEADER, pos + size, 0, wanted, &rules, &found)
    if count != expected:
        raise Corrupt(f"batch holds {count} records, header says {expected}", pos)
    return found


cdef Py_ssize_t _walk_section(const unsigned char* b, Py_ssize_t p, Py_ssize_t end, int64_t base_timestamp,
                              tuple wanted, Rules* rules, bint* found) except -1:
    """Parse every record of the records section [p, end) field by field, as Kafka's DefaultRecord.readFrom
    does: length, attributes, timestamp delta, offset delta, key, value, header count, each header's key (never
    null) and value; Corrupt (positions absolute in b) unless every length fits and each record's fields fill
    exactly its declared length. `rules` adds a compacted topic's InvalidRecord for a null key and the create-time
    window's InvalidTimestamp (a record's timestamp is `base_timestamp` + its delta, wrapping as Java's long
    does; -1, no timestamp, is exempt, as in Kafka's LogValidator). Contents are skipped by their lengths, never
    read, except that a header key of a wanted length is compared with `wanted` (empty: none): found[0] is set
    on a match. Returns the count."""
    cdef Py_ssize_t q, start, record_end
    cdef int32_t length, offset_delta, n_headers, klen, key_len, j
    cdef int64_t timestamp_delta, timestamp
    cdef Py_ssize_t count = 0
    # the rules in locals: stores through the out-pointers below could alias the struct's fields for the compiler
    cdef bint check_timestamps = rules.check_timestamps, require_keys = rules.require_keys
    cdef int64_t ts_low = rules.ts_low, ts_high = rules.ts_high
    while p < end:
        start = p
        q = _varint(b, p, end, &length)
        if length < C_MIN_RECORD_BODY or length > end - q:
            raise Corrupt(f"bad record length {length}", start)
        record_end = q + length
        p = q + 1  # attributes
        q = _varlong(b, p, record_end, &timestamp_delta)
        if check_timestamps:
            timestamp = <int64_t>(<uint64_t>base_timestamp + <uint64_t>timestamp_delta)
            if (timestamp < ts_low or timestamp > ts_high) and timestamp != -1:
                raise InvalidTimestamp(f"timestamp {timestamp} of the record at position {start} is out of range: "
                                       f"it should be within [{ts_low}, {ts_high}]")
        p = q
        q = _varint(b, p, record_end, &offset_delta)
        if require_keys:
            _varint(b, q, record_end, &key_len)
            if key_len == -1:
                raise InvalidRecord(f"compacted topic: every record needs a key (record at position {start})")
        p = _skip_bytes_or_none(b, q, record_end, "key")
        p = _skip_bytes_or_none(b, p, record_end, "value")
        q = _varint(b, p, record_end, &n_headers)
        if n_headers < 0:
            raise Corrupt(f"negative header count {n_headers}", p)
        p = q
        for j in range(n_headers):
            q = _varint(b, p, record_end, &klen)
            if klen < 0 or klen > record_end - q:
                raise Corrupt(f"bad header key length {klen}", p)
            if not found[0] and _is_wanted(b + q, klen, wanted, rules.short_lengths, rules.any_long):
                found[0] = True
            p = _skip_bytes_or_none(b, q + klen, record_end, "header value")
        if p != record_end:
            raise Corrupt("record length does not match its fields", start)
        count += 1
    return count


def check_records(data, Py_ssize_t expected, names=(), bint require_keys=False, timestamps=None,
                  Py_ssize_t base_timestamp=0):
    cdef Rules rules
    cdef tuple wanted = _rules(&rules, names, require_keys, timestamps)
    cdef bint found = False
    cdef Py_ssize_t count
    cdef Py_buffer view
    borrow(data, &view)
    try:
        count = _walk_section(<const unsigned char*>view.buf, 0, view.len, base_timestamp, wanted, &rules, &found)
    finally:
        PyBuffer_Release(&view)
    if count != expected:
        raise Corrupt(f"batch holds {count} records, header says {expected}", 0)
    return found


cdef inline object _read_bytes_or_none(const unsigned char* b, Py_ssize_t* pp, Py_ssize_t end, str what):
    """The length-prefixed bytes field (-1 = None) at pp[0]; advances pp[0] past it."""
    cdef int32_t length
    cdef Py_ssize_t p = pp[0]
    cdef Py_ssize_t q = _varint(b, p, end, &length)
    if length == -1:
        pp[0] = q
        return None
    if length < 0 or length > end - q:
        raise Corrupt(f"bad {what} length {length}", p)
    pp[0] = q + length
    return PyBytes_FromStringAndSize(<const char*>b + q, length)


def decode_records(data, Py_ssize_t count):
    cdef Py_buffer view
    borrow(data, &view)
    try:
        return _decode_records(<const unsigned char*>view.buf, view.len, as_i32(count))
    finally:
        PyBuffer_Release(&view)


cdef list _decode_records(const unsigned char* b, Py_ssize_t n, int32_t count):
    if count < 0 or count > n // (C_MIN_RECORD_BODY + 1):
        raise Corrupt(f"record count {count} impossible for {n} bytes", 0)
    cdef Py_ssize_t p = 0, q, start, end
    cdef int32_t i, j, length, offset_delta, n_headers, klen
    cdef int64_t timestamp_delta
    cdef unsigned char attributes
    cdef object key = None, value = None, hvalue = None
    cdef list headers
    cdef list out = []
    for i in range(count):
        start = p
        q = _varint(b, p, n, &length)
        if length < C_MIN_RECORD_BODY or length > n - q:
            raise Corrupt(f"bad record length {length}", start)
        p = q
        end = p + length
        attributes = b[p]
        p += 1
        q = _varlong(b, p, end, &timestamp_delta)
        p = q
        q = _varint(b, p, end, &offset_delta)
        p = q
        key = _read_bytes_or_none(b, &p, end, "key")
        value = _read_bytes_or_none(b, &p, end, "value")
        q = _varint(b, p, end, &n_headers)
        if n_headers < 0:
            raise Corrupt(f"negative header count {n_headers}", p)
        p = q
        headers = []
        for j in range(n_headers):
            q = _varint(b, p, end, &klen)
            if klen < 0 or klen > end - q:
                raise Corrupt(f"bad header key length {klen}", p)
            try:
                hkey = PyUnicode_DecodeUTF8(<const char*>b + q, klen, NULL)
            except UnicodeDecodeError:
                raise Corrupt("header key is not UTF-8", q) from None
            p = q + klen
            hvalue = _read_bytes_or_none(b, &p, end, "header value")
            headers.append((hkey, hvalue))
        if p != end:
            raise Corrupt("record length does not match its fields", start)
        out.append((attributes, timestamp_delta, offset_delta, key, value, headers))
    if p != n:
        raise Corrupt("trailing bytes after the last record", p)
    return out


cdef inline Py_ssize_t _field_size(object field, const unsigned char** ptr) except -2:
    """Length of a bytes field (or -1 for None); sets ptr to its bytes, which the caller keeps alive."""
    if field is None:
        ptr[0] = NULL
        return -1
    ptr[0] = <const unsigned char*>PyBytes_AS_STRING(field)
    return PyBytes_GET_SIZE(field)


def encode_record(Py_ssize_t offset_delta, Py_ssize_t timestamp_delta, key, value, headers):
    cdef int32_t delta32 = as_i32(offset_delta)
    # Pass 1: sizes (and the header keys' UTF-8), with every input checked; pass 2: write into one bytes object.
    cdef Py_ssize_t n_headers = len(headers)
    cdef list parts = []
    cdef Py_ssize_t body, klen_, vlen_, hk, hv
    cdef const unsigned char* kp
    cdef const unsigned char* vp
    cdef const unsigned char* hvp
    cdef object hkey, hvalue, raw
    # key and value are normalised to bytes when not bytes already, so their pointers stay valid below
    if key is not None and type(key) is not bytes:
        key = bytes(memoryview(key))
    if value is not None and type(value) is not bytes:
        value = bytes(memoryview(value))
    klen_ = _field_size(key, &kp)
    vlen_ = _field_size(value, &vp)
    body = 1 + uvarint_size(zigzag64(timestamp_delta)) + uvarint_size(zigzag32(delta32))
    body += uvarint_size(zigzag32(<int32_t>klen_)) + (klen_ if klen_ > 0 else 0)
    body += uvarint_size(zigzag32(<int32_t>vlen_)) + (vlen_ if vlen_ > 0 else 0)
    body += uvarint_size(zigzag32(<int32_t>n_headers))
    for hkey, hvalue in headers:
        if not isinstance(hkey, str):
            raise TypeError("header key must be str")
        raw = (<str>hkey).encode("utf-8")
        if hvalue is not None and type(hvalue) is not bytes:
            hvalue = bytes(memoryview(hvalue))
        hk = PyBytes_GET_SIZE(raw)
        hv = -1 if hvalue is None else PyBytes_GET_SIZE(hvalue)
        body += uvarint_size(zigzag32(<int32_t>hk)) + hk + uvarint_size(zigzag32(<int32_t>hv)) + (hv if hv > 0 else 0)
        parts.append((raw, hvalue))
    if body > C_INT32_MAX:
        raise OverflowError("record larger than 2 GiB")
    cdef Py_ssize_t total = uvarint_size(zigzag32(<int32_t>body)) + body
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char* w = <unsigned char*>PyBytes_AS_STRING(out)
    w = put_uvarint(w, zigzag32(<int32_t>body))
    w[0] = 0
    w += 1
    w = put_uvarint(w, zigzag64(timestamp_delta))
    w = put_uvarint(w, zigzag32(delta32))
    w = put_uvarint(w, zigzag32(<int32_t>klen_))
    if klen_ > 0:
        memcpy(w, kp, klen_)
        w += klen_
    w = put_uvarint(w, zigzag32(<int32_t>vlen_))
    if vlen_ > 0:
        memcpy(w, vp, vlen_)
        w += vlen_
    w = put_uvarint(w, zigzag32(<int32_t>n_headers))
    for raw, hvalue in parts:
        hk = PyBytes_GET_SIZE(raw)
        w = put_uvarint(w, zigzag32(<int32_t>hk))
        memcpy(w, PyBytes_AS_STRING(raw), hk)
        w += hk
        if hvalue is None:
            w = put_uvarint(w, zigzag32(-1))
        else:
            hv = PyBytes_GET_SIZE(hvalue)
            w = put_uvarint(w, zigzag32(<int32_t>hv))
            memcpy(w, PyBytes_AS_STRING(hvalue), hv)
            w += hv
    return out


def build_batch(Py_ssize_t base_offset, Py_ssize_t base_timestamp, Py_ssize_t max_timestamp, records,
                Py_ssize_t record_count, Py_ssize_t last_offset_delta, Py_ssize_t attributes=0,
                Py_ssize_t producer_id=-1, Py_ssize_t producer_epoch=-1, Py_ssize_t base_sequence=-1,
                Py_ssize_t partition_leader_epoch=-1):
    # range checks in the twin's order, before the records buffer is looked at
    cdef int32_t c_record_count = as_i32(record_count), c_last_offset_delta = as_i32(last_offset_delta)
    cdef int16_t c_attributes = as_i16(attributes), c_producer_epoch = as_i16(producer_epoch)
    cdef int32_t c_base_sequence = as_i32(base_sequence), c_leader_epoch = as_i32(partition_leader_epoch)
    cdef Py_buffer view
    borrow(records, &view)
    try:
        return _build_batch(base_offset, base_timestamp, max_timestamp, <const unsigned char*>view.buf, view.len,
                            c_record_count, c_last_offset_delta, c_attributes, producer_id, c_producer_epoch,
                            c_base_sequence, c_leader_epoch)
    finally:
        PyBuffer_Release(&view)


cdef bytearray _build_batch(int64_t base_offset, int64_t base_timestamp, int64_t max_timestamp,
                            const unsigned char* records, Py_ssize_t n, int32_t record_count,
                            int32_t last_offset_delta, int16_t attributes, int64_t producer_id,
                            int16_t producer_epoch, int32_t base_sequence, int32_t partition_leader_epoch):
    if n > C_INT32_MAX - C_MIN_BATCH_LENGTH:
        raise OverflowError("record batch larger than 2 GiB")
    cdef bytearray out = PyByteArray_FromStringAndSize(NULL, C_HEADER + n)
    cdef unsigned char* h = <unsigned char*>PyByteArray_AS_STRING(out)
    st_i64(h, base_offset)
    st_u32(h + 8, <uint32_t>(C_MIN_BATCH_LENGTH + n))
    st_u32(h + 12, <uint32_t>partition_leader_epoch)
    h[16] = 2
    st_u16(h + 21, <uint16_t>attributes)
    st_u32(h + 23, <uint32_t>last_offset_delta)
    st_i64(h + 27, base_timestamp)
    st_i64(h + 35, max_timestamp)
    st_i64(h + 43, producer_id)
    st_u16(h + 51, <uint16_t>producer_epoch)
    st_u32(h + 53, <uint32_t>base_sequence)
    st_u32(h + 57, <uint32_t>record_count)
    if n:
        memcpy(h + C_HEADER, records, n)
    st_u32(h + 17, crc32c_of(_crc32c, h + C_CRC_START, C_HEADER - C_CRC_START + n))
    return out


def set_base_offset(buf, Py_ssize_t pos, Py_ssize_t base_offset):
    cdef Py_buffer view
    borrow_writable(buf, &view)
    try:
        if pos < 0 or view.len - pos < C_HEADER:
            raise OutOfBounds(f"batch header at {pos} outside buffer of {view.len} bytes")
        st_i64(<unsigned char*>view.buf + pos, base_offset)
    finally:
        PyBuffer_Release(&view)


def set_log_append_time(buf, Py_ssize_t pos, Py_ssize_t ts):
    cdef Py_buffer view
    cdef unsigned char* h
    cdef int32_t batch_length
    borrow_writable(buf, &view)
    try:
        if pos < 0 or view.len - pos < C_HEADER:
            raise OutOfBounds(f"batch header at {pos} outside buffer of {view.len} bytes")
        h = <unsigned char*>view.buf + pos
        batch_length = ld_i32(h + 8)
        if batch_length < C_MIN_BATCH_LENGTH or <Py_ssize_t>batch_length + 12 > view.len - pos:
            raise Corrupt(f"bad record batch length {batch_length}", pos)
        st_u16(h + 21, <uint16_t>(ld_i16(h + 21) | 0x08))
        st_i64(h + 35, ts)
        st_u32(h + 17, crc32c_of(_crc32c, h + C_CRC_START, <Py_ssize_t>batch_length + 12 - C_CRC_START))
    finally:
        PyBuffer_Release(&view)


def new_buffer(Py_ssize_t size):
    """A bytearray of `size` bytes whose contents are unspecified: unlike bytearray(size) it is not zero-filled
    (a receive buffer's bytes are all written before they are read)."""
    if size < 0:
        raise OverflowError(f"integer {size} out of range [0, {PY_SSIZE_T_MAX}]")
    return PyByteArray_FromStringAndSize(NULL, size)
