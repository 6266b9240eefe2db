# Shared by the _fast Cython kernels (cimported, never imported): big-endian loads and stores, Kafka's zigzag
# varints, and CRC32C over raw memory. Every helper takes a raw pointer and trusts its caller to have checked the
# bounds first: the kernels check sizes explicitly before each access (boundscheck is off), so bad input raises
# Corrupt / OutOfBounds instead of reading or writing outside the buffer.
from libc.stdint cimport int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t, uintptr_t
from cpython.buffer cimport PyBUF_READ, PyBUF_SIMPLE, PyBUF_WRITABLE, PyObject_GetBuffer
from cpython.memoryview cimport PyMemoryView_FromMemory


# The kernels borrow their byte arguments with PyObject_GetBuffer and release them in a `finally`, instead of taking
# typed memoryviews: a typed memoryview argument builds a memoryview object on every call, a cost of the order of
# a small append's whole kernel call. They accept the same objects (any C-contiguous buffer: bytes, bytearray,
# memoryview, mmap) and fail the same way (TypeError for a non-buffer or None, BufferError for a read-only buffer
# given to a writer), as the twins do.
cdef inline int borrow(object obj, Py_buffer* view) except -1:
    return PyObject_GetBuffer(obj, view, PyBUF_SIMPLE)


cdef inline int borrow_writable(object obj, Py_buffer* view) except -1:
    return PyObject_GetBuffer(obj, view, PyBUF_SIMPLE | PyBUF_WRITABLE)


cdef inline uint16_t ld_u16(const unsigned char* p) noexcept nogil:
    return <uint16_t>((<uint16_t>p[0] << 8) | p[1])


cdef inline int16_t ld_i16(const unsigned char* p) noexcept nogil:
    return <int16_t>ld_u16(p)


cdef inline uint32_t ld_u32(const unsigned char* p) noexcept nogil:
    return ((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3])


cdef inline int32_t ld_i32(const unsigned char* p) noexcept nogil:
    return <int32_t>ld_u32(p)


cdef inline int64_t ld_i64(const unsigned char* p) noexcept nogil:
    return <int64_t>((<uint64_t>ld_u32(p) << 32) | <uint64_t>ld_u32(p + 4))


cdef inline void st_u16(unsigned char* p, uint16_t v) noexcept nogil:
    p[0] = <unsigned char>(v >> 8)
    p[1] = <unsigned char>v


cdef inline void st_u32(unsigned char* p, uint32_t v) noexcept nogil:
    p[0] = <unsigned char>(v >> 24)
    p[1] = <unsigned char>(v >> 16)
    p[2] = <unsigned char>(v >> 8)
    p[3] = <unsigned char>v


cdef inline void st_i64(unsigned char* p, int64_t v) noexcept nogil:
    st_u32(p, <uint32_t>(<uint64_t>v >> 32))
    st_u32(p + 4, <uint32_t><uint64_t>v)


# Varint readers return the position after the varint, or one of these (positions are never negative).
cdef enum:
    VARINT_TRUNCATED = -1
    VARINT_TOO_LONG = -2


cdef inline Py_ssize_t _rd_zigzag_raw(const unsigned char* b, Py_ssize_t p, Py_ssize_t end, int max_bytes,
                                      uint64_t* raw) noexcept nogil:
    """The raw (still zigzag-encoded) bits of a base-128 varint of at most `max_bytes` bytes at p."""
    cdef uint64_t acc = 0
    cdef int shift = 0
    cdef unsigned char c
    while True:
        if p >= end:
            return VARINT_TRUNCATED
        c = b[p]
        p += 1
        acc |= <uint64_t>(c & 0x7F) << shift
        if not (c & 0x80):
            break
        shift += 7
        if shift >= 7 * max_bytes:
            return VARINT_TOO_LONG
    raw[0] = acc
    return p


cdef inline Py_ssize_t rd_varint(const unsigned char* b, Py_ssize_t p, Py_ssize_t end, int32_t* out) noexcept nogil:
    """Zigzag int32 as Kafka's ByteUtils.readVarint: at most 5 bytes; bits above 32 dropped."""
    cdef uint64_t raw
    cdef uint32_t u
    p = _rd_zigzag_raw(b, p, end, 5, &raw)
    if p >= 0:
        u = <uint32_t>raw
        out[0] = <int32_t>((u >> 1) ^ (0u - (u & 1u)))
    return p


cdef inline Py_ssize_t rd_varlong(const unsigned char* b, Py_ssize_t p, Py_ssize_t end, int64_t* out) noexcept nogil:
    """Zigzag int64 as Kafka's ByteUtils.readVarlong: at most 10 bytes; bits above 64 dropped."""
    cdef uint64_t raw
    p = _rd_zigzag_raw(b, p, end, 10, &raw)
    if p >= 0:
        out[0] = <int64_t>((raw >> 1) ^ (0u - (raw & 1u)))
    return p


cdef inline Py_ssize_t uvarint_size(uint64_t u) noexcept nogil:
    cdef Py_ssize_t n = 1
    while u >= 0x80:
        u >>= 7
        n += 1
    return n


cdef inline void st_cq_unit(unsigned char* u, int64_t physical_offset, uint32_t size, uint32_t record_count,
                            int64_t tags_code, int64_t store_ts, int64_t max_ts, int64_t base_offset) noexcept nogil:
    """One 48-byte ConsumeQueue unit (layout: mqk._fast.cqunit_py); the caller checked the 48 bytes fit."""
    st_i64(u, physical_offset)
    st_u32(u + 8, size)
    st_u32(u + 12, record_count)
    st_i64(u + 16, tags_code)
    st_i64(u + 24, store_ts)
    st_i64(u + 32, max_ts)
    st_i64(u + 40, base_offset)


cdef inline uint32_t zigzag32(int32_t v) noexcept nogil:
    return (<uint32_t>v << 1) ^ <uint32_t>(v >> 31)


cdef inline uint64_t zigzag64(int64_t v) noexcept nogil:
    return (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)


cdef inline unsigned char* put_uvarint(unsigned char* p, uint64_t u) noexcept nogil:
    while u >= 0x80:
        p[0] = <unsigned char>((u & 0x7F) | 0x80)
        p += 1
        u >>= 7
    p[0] = <unsigned char>u
    return p + 1


cdef extern from *:
    """
    #include <stdint.h>
    typedef uint32_t (*mqk_crc32c_fn)(uint32_t crc, const unsigned char *data, unsigned long length);
    /* Per kernel module: 0 = not looked up yet, 1 = the crc32c package's own C function is called directly,
       2 = calls go through the package's Python function. */
    static int mqk_crc32c_mode = 0;
    static mqk_crc32c_fn mqk_crc32c_native = NULL;
    static void mqk_crc32c_set(int mode, uintptr_t fn) { mqk_crc32c_mode = mode; mqk_crc32c_native = (mqk_crc32c_fn)fn; }
    """
    ctypedef uint32_t (*mqk_crc32c_fn)(uint32_t crc, const unsigned char* data, unsigned long length) noexcept nogil
    int mqk_crc32c_mode
    mqk_crc32c_fn mqk_crc32c_native
    void mqk_crc32c_set(int mode, uintptr_t fn)


# The crc32c package's Python call (argument parsing, buffer protocol, a memoryview to wrap raw memory) costs far
# more than the CRC of a small batch, so each module calls the very C function the package selected at import
# (hardware SSE4.2 / ARMv8, or its software fallback), found once through the package's exported `get_state`.
# Any surprise (symbol missing, other layout) falls back to the Python call; a self-test against the Python call
# guards the result.
cdef inline uint32_t _crc32c_native(mqk_crc32c_fn fn, const unsigned char* p, Py_ssize_t n) noexcept nogil:
    return fn(0xFFFFFFFFU, p, <unsigned long>n) ^ 0xFFFFFFFFU


cdef inline int _crc32c_resolve(object crc_fn) except -1:
    mqk_crc32c_set(2, 0)
    # (imported here, once per module: a .pxd's inline function has no module scope of its own; the function
    # answers 0 itself when the package's C function cannot be found, so any other error is a bug and raises)
    from mqk._fast import crc32c_native_address
    address = crc32c_native_address(crc_fn)
    if not address:
        return 0
    cdef mqk_crc32c_fn fn = <mqk_crc32c_fn><uintptr_t>address
    cdef bytes probe = bytes(range(256)) * 5
    cdef const unsigned char* p = probe
    cdef Py_ssize_t start, length
    for start in range(0, 8):
        for length in (0, 1, 7, 9, 63, 64, 65, 255, 1000):
            if _crc32c_native(fn, p + start, length) != crc_fn(probe[start:start + length]):
                return 0
    mqk_crc32c_set(1, address)
    return 0


cdef inline uint32_t crc32c_of(object crc_fn, const unsigned char* p, Py_ssize_t n) except? 0xFFFFFFFF:
    """CRC32C of [p, p+n), computed by the crc32c package: its C function directly once found, else its Python
    function on a memoryview over the memory itself (no copy; the view never outlives the caller's buffer).
    Like the package, the GIL is released for 32 KiB and more."""
    cdef uint32_t crc
    if mqk_crc32c_mode == 0:
        _crc32c_resolve(crc_fn)
    if mqk_crc32c_mode == 1:
        if n < 32768:
            return _crc32c_native(mqk_crc32c_native, p, n)
        with nogil:
            crc = _crc32c_native(mqk_crc32c_native, p, n)
        return crc
    return crc_fn(PyMemoryView_FromMemory(<char*>p, n, PyBUF_READ))


cdef inline uint32_t crc32c_of_two(object crc_fn, const unsigned char* p, Py_ssize_t n, const unsigned char* q,
                                   Py_ssize_t m) except? 0xFFFFFFFF:
    """CRC32C of [p, p+n) followed by [q, q+m), as if the two ranges were one (see crc32c_of)."""
    cdef uint32_t crc
    if mqk_crc32c_mode == 0:
        _crc32c_resolve(crc_fn)
    if mqk_crc32c_mode == 1:
        if n + m < 32768:
            return mqk_crc32c_native(mqk_crc32c_native(0xFFFFFFFFU, p, <unsigned long>n), q, <unsigned long>m) ^ 0xFFFFFFFFU
        with nogil:
            crc = mqk_crc32c_native(mqk_crc32c_native(0xFFFFFFFFU, p, <unsigned long>n), q, <unsigned long>m) ^ 0xFFFFFFFFU
        return crc
    return crc_fn(PyMemoryView_FromMemory(<char*>q, m, PyBUF_READ), crc_fn(PyMemoryView_FromMemory(<char*>p, n, PyBUF_READ)))


# Integer arguments are taken as Py_ssize_t (64-bit on every platform the kernels build for; each module refuses
# to import otherwise) because Cython converts Py_ssize_t through __index__, so a float is a TypeError exactly as
# in the twins, while its int32_t/int64_t conversions would silently truncate floats. Narrower fields are then
# range-checked here with the twins' OverflowError.
cdef inline int32_t as_i32(Py_ssize_t v) except? -1:
    if v < -2147483648 or v > 2147483647:
        raise OverflowError(f"integer {v} out of range [-2147483648, 2147483647]")
    return <int32_t>v


cdef inline int16_t as_i16(Py_ssize_t v) except? -1:
    if v < -32768 or v > 32767:
        raise OverflowError(f"integer {v} out of range [-32768, 32767]")
    return <int16_t>v
