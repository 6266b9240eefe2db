"""Kafka record batch v2 kernels, pure Python: the twin of `recbatch.pyx`, same API, byte-identical results.

Owns the byte layout of a record batch (magic 2) and of the records inside it: header parse, scanning a buffer of
concatenated batches with CRC32C checks, counting, checking (`check_records`: every field of every record, as a
broker validates a produced batch) and decoding records, encoding records and whole batches, and the two in-place
edits the broker makes (base offset, log-append time), and finding a header by name without decoding
(`has_header`, the timer's test for delay headers). It does no I/O and knows nothing of topics.

Layout (big-endian):
  0 base_offset i64 | 8 batch_length i32 | 12 partition_leader_epoch i32 | 16 magic i8 | 17 crc u32 (CRC32C of
  [21, end)) | 21 attributes i16 | 23 last_offset_delta i32 | 27 base_timestamp i64 | 35 max_timestamp i64 |
  43 producer_id i64 | 51 producer_epoch i16 | 53 base_sequence i32 | 57 record_count i32 | 61 records...
A batch occupies 12 + batch_length bytes. A record is: length varint, attributes i8, timestamp_delta varlong,
offset_delta varint, key (varint length, -1 = null), value (same), header count varint, headers (key: varint
length + UTF-8, value: varint length, -1 = null). Varints are zigzag (Kafka's ByteUtils): at most 5 bytes for a
varint and 10 for a varlong; bits above 32 / 64 are dropped as Java drops them.

Errors: bad bytes raise `Corrupt(message, position)`; writing outside the buffer raises `OutOfBounds`; an integer
argument outside its field's range raises OverflowError and a non-integer TypeError (what the compiled module's typed
arguments raise), so both implementations fail the same way.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, SupportsIndex

from mqk._fast.api import BatchHeader, Record, RecordHeader, ScannedBatch
from mqk._fast.crc import crc32c
from mqk.errors import Corrupt, InvalidRecord, InvalidTimestamp, OutOfBounds

if TYPE_CHECKING:
    from typing_extensions import Buffer

HEADER_SIZE = 61
MAGIC = 2
# batch_length counts the bytes after the length field: the header from offset 12 on, then the records.
MIN_BATCH_LENGTH = HEADER_SIZE - 12
CRC_START = 21
ATTR_COMPRESSION_MASK = 0x07
ATTR_LOG_APPEND_TIME = 0x08
# A record's body is at least attributes + timestamp delta + offset delta + key length + value length + header count.
MIN_RECORD_BODY = 6

_HEADER = struct.Struct(">qiibIhiqqqhii")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT16_MIN, _INT16_MAX = -(1 << 15), (1 << 15) - 1
_SSIZE_MIN, _SSIZE_MAX = _INT64_MIN, _INT64_MAX


#: a control batch's attribute bit (transaction markers: written by the broker only)
_ATTR_CONTROL = 0x20

# why plan_plain_appends stopped before a partition, in the order it checks a partition
PLAN_END = 0  #: every partition from `start` on was planned
PLAN_SHAPE = 1  #: not a dict whose `index` is an int and whose `records` is a 1-D, byte-item, contiguous memoryview
PLAN_NO_QUEUE = 2  #: `index` is no queue of the topic
PLAN_LEGACY = 3  #: no record batch: empty, or a legacy message set (magic 0 or 1)
PLAN_IDEMPOTENT = 4  #: the first batch carries a producer id and a sequence (the idempotence check takes it)
PLAN_INVALID = 5  #: a batch fails its check (length, CRC, record walk, keys, timestamps); the caller says which
PLAN_COMPRESSED = 6  #: a batch is compressed (the caller decompresses and walks it)
PLAN_TOO_LARGE = 7  #: a batch is over the topic's max.message.bytes
PLAN_CONTROL = 8  #: a control batch (only a broker writes those: the caller refuses it)


def _int(value: SupportsIndex, lo: int, hi: int) -> int:
    """Coerce like a typed Cython argument: TypeError for non-integers, OverflowError outside [lo, hi]."""
    n = operator.index(value)
    if n < lo or n > hi:
        raise OverflowError(f"integer {n} out of range [{lo}, {hi}]")
    return n


def _i64(v: SupportsIndex) -> int:
    return _int(v, _INT64_MIN, _INT64_MAX)


def _i32(v: SupportsIndex) -> int:
    return _int(v, _INT32_MIN, _INT32_MAX)


def _i16(v: SupportsIndex) -> int:
    return _int(v, _INT16_MIN, _INT16_MAX)


def _ssize(v: SupportsIndex) -> int:
    return _int(v, _SSIZE_MIN, _SSIZE_MAX)


def _view(buf: Buffer) -> memoryview:
    """A flat byte view of `buf`, accepting exactly what the compiled module borrows (PyObject_GetBuffer with
    PyBUF_SIMPLE): any C-contiguous buffer, seen as its bytes."""
    mv = memoryview(buf)
    if not mv.c_contiguous:
        raise BufferError("memoryview: underlying buffer is not C-contiguous")
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


def _writable(buf: Buffer) -> memoryview:
    mv = _view(buf)
    if mv.readonly:
        raise BufferError("Object is not writable.")
    return mv


# --- varints -------------------------------------------------------------------------------------------


def _read_zigzag(buf: memoryview, p: int, end: int, max_bytes: int, bits: int, name: str) -> tuple[int, int]:
    """Zigzag varint of at most `max_bytes` bytes at p, not reading at or past `end`; (value, next position)."""
    if p < end:
        b = buf[p]
        if b < 0x80:  # one byte: most lengths, deltas and counts (the general loop below costs more for them)
            return (b >> 1) ^ -(b & 1), p + 1
    raw = 0
    shift = 0
    start = p
    while True:
        if p >= end:
            raise Corrupt(f"truncated {name}", start)
        b = buf[p]
        p += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift >= 7 * max_bytes:
            raise Corrupt(f"{name} longer than {max_bytes} bytes", start)
    raw &= (1 << bits) - 1
    return (raw >> 1) ^ -(raw & 1), p


def _read_varint(buf: memoryview, p: int, end: int) -> tuple[int, int]:
    """Zigzag varint (int32) at p, not reading at or past `end`. Returns (value, next position)."""
    return _read_zigzag(buf, p, end, 5, 32, "varint")


def _read_varlong(buf: memoryview, p: int, end: int) -> tuple[int, int]:
    """Zigzag varlong (int64) at p, not reading at or past `end`. Returns (value, next position)."""
    return _read_zigzag(buf, p, end, 10, 64, "varlong")


def _put_uvarint(out: bytearray, u: int) -> None:
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)


def _put_varint(out: bytearray, v: int) -> None:
    _put_uvarint(out, ((v << 1) ^ (v >> 31)) & 0xFFFFFFFF)


def _put_varlong(out: bytearray, v: int) -> None:
    _put_uvarint(out, ((v << 1) ^ (v >> 63)) & 0xFFFFFFFFFFFFFFFF)


# --- header --------------------------------------------------------------------------------------------


def crc32c_direct() -> bool:
    """The compiled module may call the crc32c package's C function directly; the twin always uses its Python call."""
    return False


def parse_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """The 13 header fields of the batch at `pos`. Corrupt if fewer than 61 bytes remain or magic != 2."""
    pos = _ssize(pos)
    mv = _view(buf)
    if pos < 0 or mv.nbytes - pos < HEADER_SIZE:
        raise Corrupt("truncated record batch header", pos)
    fields: BatchHeader = _HEADER.unpack_from(mv, pos)
    if fields[3] != MAGIC:
        raise Corrupt(f"unsupported record batch magic {fields[3]}", pos)
    return fields


def _timestamps(timestamps: object) -> tuple[int, int] | None:
    """The (low, high) create-time window, checked as the compiled kernel checks it."""
    if timestamps is None:
        return None
    if type(timestamps) is not tuple or len(timestamps) != 2:
        raise TypeError("timestamps must be a (low, high) tuple")
    return _ssize(timestamps[0]), _ssize(timestamps[1])


def scan_batches(
    buf: Buffer,
    verify_crc: bool = True,
    walk_records: bool = False,
    names: tuple[bytes, ...] = (),
    require_keys: bool = False,
    timestamps: tuple[int, int] | None = None,
) -> list[ScannedBatch]:
    """Walk concatenated batches that fill `buf` exactly; one tuple per batch:
    (pos, size, last_offset_delta, max_timestamp, record_count, attributes, producer_id, producer_epoch,
    base_sequence, base_timestamp, named). Corrupt on truncation, batch_length < 49, magic != 2, record_count < 0,
    or (with verify_crc) a CRC mismatch. With walk_records, each uncompressed batch's records are also parsed
    field by field right after its CRC, as `check_records` does (a broker's whole check of a produced batch in
    one call, what Kafka's LogValidator does by iterating the records), and `named` says whether some record has
    a header whose key is one of `names` (a tuple of bytes); for a batch not walked (compressed, or walk_records
    off) `named` is None. With require_keys, a walked record without a key raises InvalidRecord (a compacted
    topic's rule); with `timestamps` (low, high), a walked record whose create time (the batch's base timestamp
    plus its delta; -1, no timestamp, is exempt) lies outside [low, high] raises InvalidTimestamp."""
    verify_crc, walk_records, require_keys = bool(verify_crc), bool(walk_records), bool(require_keys)
    names = _names(names)
    window = _timestamps(timestamps)
    mv = _view(buf)
    n = mv.nbytes
    out: list[ScannedBatch] = []
    pos = 0
    unpack = _HEADER.unpack_from
    while pos < n:
        if n - pos < HEADER_SIZE:
            raise Corrupt("truncated record batch header", pos)
        (
            _,
            batch_length,
            _,
            magic,
            crc,
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            record_count,
        ) = unpack(mv, pos)
        if magic != MAGIC:
            raise Corrupt(f"unsupported record batch magic {magic}", pos)
        if batch_length < MIN_BATCH_LENGTH:
            raise Corrupt(f"record batch length {batch_length} below minimum", pos)
        size = batch_length + 12
        if size > n - pos:
            raise Corrupt("truncated record batch", pos)
        if record_count < 0:
            raise Corrupt(f"negative record count {record_count}", pos)
        if verify_crc and crc32c(mv[pos + CRC_START : pos + size]) != crc:
            raise Corrupt("record batch CRC mismatch", pos)
        named: bool | None = None
        if walk_records and not attributes & ATTR_COMPRESSION_MASK:
            count, named = _walk_section(mv, pos + HEADER_SIZE, pos + size, names, require_keys, window, base_timestamp)
            if count != record_count:
                raise Corrupt(f"batch holds {count} records, header says {record_count}", pos)
        out.append(
            (
                pos,
                size,
                last_offset_delta,
                max_timestamp,
                record_count,
                attributes,
                producer_id,
                producer_epoch,
                base_sequence,
                base_timestamp,
                named,
            )
        )
        pos += size
    return out


def plan_plain_appends(
    partitions: list[Any],
    start: int,
    queue_count: int,
    max_batch_bytes: int,
    names: tuple[bytes, ...],
    require_keys: bool,
    timestamps: tuple[int, int] | None,
    entries: list[tuple[int, list[Any]]],
    delays: list[bool],
    slots: list[int],
    answers: list[Any],
) -> tuple[int, int]:
    """The Produce handler's common case, one topic's `partition_data` dicts at a time from `start`: a partition
    whose `index` is a queue below `queue_count` and whose `records` (a 1-byte-item memoryview, as the request
    decoder gives) are v2 batches that pass scan_batches' whole check (CRC, record walk, `require_keys`,
    `timestamps`), none compressed, none over `max_batch_bytes`, the first without an idempotent producer id and
    sequence, is planned for one append: (index, [batch views]) onto `entries`, whether a record carries a
    header named in `names` onto `delays`, len(answers) onto `slots` and None onto `answers` (its answer's place).
    Stops at the first partition that is not such and returns (its position, why), or (len(partitions),
    PLAN_END) when all were planned; the caller takes that partition on. A partition is checked in the order of
    the PLAN_* codes: its shape, its queue, the first batch's magic, then its length and producer fields, then
    each batch in turn (its check, compression, size, control flag); the first that fails names the stop."""
    if type(partitions) is not list:
        raise TypeError("partitions must be a list")
    for out in (entries, delays, slots, answers):
        if type(out) is not list:
            raise TypeError("entries, delays, slots and answers must be lists")
    start, queue_count, max_batch_bytes = _ssize(start), _ssize(queue_count), _ssize(max_batch_bytes)
    require_keys = bool(require_keys)
    names = _names(names)
    window = _timestamps(timestamps)
    if start < 0:
        raise ValueError("start must not be negative")
    i = start
    while i < len(partitions):
        planned = _plan_partition(partitions[i], queue_count, max_batch_bytes, names, require_keys, window)
        if isinstance(planned, int):
            return i, planned
        index, views, named = planned
        entries.append((index, views))
        delays.append(named)
        slots.append(len(answers))
        answers.append(None)
        i += 1
    return i, PLAN_END


def _plan_partition(
    part: Any,
    queue_count: int,
    max_batch_bytes: int,
    names: tuple[bytes, ...],
    require_keys: bool,
    window: tuple[int, int] | None,
) -> int | tuple[int, list[memoryview], bool]:
    """plan_plain_appends for one partition: (index, [view of each batch], whether a record carries a named
    header) when it is plain, else why not (PLAN_*)."""
    if type(part) is not dict:
        return PLAN_SHAPE
    index, records = part.get("index"), part.get("records")
    if type(index) is not int or type(records) is not memoryview or records.ndim != 1 or records.itemsize != 1:
        return PLAN_SHAPE
    if not 0 <= index < queue_count:
        return PLAN_NO_QUEUE
    if not records.c_contiguous:
        return PLAN_SHAPE
    n = records.nbytes
    mv = _view(records)
    if n <= 16 or mv[16] != MAGIC:  # nothing, or a legacy message set
        return PLAN_LEGACY
    if n < HEADER_SIZE:
        return PLAN_INVALID
    if _I64.unpack_from(mv, 43)[0] >= 0 and _I32.unpack_from(mv, 53)[0] >= 0:
        return PLAN_IDEMPOTENT
    views: list[memoryview] = []
    named = False
    pos = 0
    while pos < n:
        size = _I32.unpack_from(mv, pos + 8)[0] + 12 if n - pos >= HEADER_SIZE else 0
        if size < HEADER_SIZE or size > n - pos:
            return PLAN_INVALID  # truncated, or a length below the minimum (scan_batches would say which)
        try:
            ((_, _, _, _, _, attributes, _, _, _, _, batch_named),) = scan_batches(
                mv[pos : pos + size], True, True, names, require_keys, window
            )
        except (Corrupt, InvalidRecord):  # (InvalidTimestamp too) the caller's own check says what is wrong
            return PLAN_INVALID
        if batch_named is None:
            return PLAN_COMPRESSED
        if size > max_batch_bytes:
            return PLAN_TOO_LARGE
        if attributes & _ATTR_CONTROL:
            return PLAN_CONTROL
        named = named or batch_named
        views.append(records[pos : pos + size])
        pos += size
    return index, [records] if len(views) == 1 else views, named


def _uncompressed_batch(mv: memoryview, pos: int, size: int, what: str) -> int:
    """The record count the header of the uncompressed batch at [pos, pos+size) declares, after the checks every
    record walk starts with: OutOfBounds outside `mv`, Corrupt if shorter than a header or compressed."""
    if pos < 0 or size < 0 or size > mv.nbytes - pos:
        raise OutOfBounds(f"batch [{pos}, +{size}) outside buffer of {mv.nbytes} bytes")
    if size < HEADER_SIZE:
        raise Corrupt("record batch smaller than its header", pos)
    if _I16.unpack_from(mv, pos + 21)[0] & ATTR_COMPRESSION_MASK:
        raise Corrupt(f"{what} on a compressed batch", pos)
    count: int = _I32.unpack_from(mv, pos + 57)[0]
    return count


def count_records(buf: Buffer, pos: int, size: int) -> int:
    """Number of records in the UNCOMPRESSED batch at [pos, pos+size), found by walking the record lengths.
    Corrupt if they do not fill the batch exactly, the count differs from the header's, or the batch is compressed;
    OutOfBounds if the range is outside `buf`."""
    pos = _ssize(pos)
    size = _ssize(size)
    mv = _view(buf)
    expected = _uncompressed_batch(mv, pos, size, "count_records")
    end = pos + size
    p = pos + HEADER_SIZE
    count = 0
    while p < end:
        length, q = _read_varint(mv, p, end)
        if length < MIN_RECORD_BODY or length > end - q:
            raise Corrupt(f"bad record length {length}", p)
        p = q + length
        count += 1
    if count != expected:
        raise Corrupt(f"batch holds {count} records, header says {expected}", pos)
    return count


_WRAP64 = 1 << 63
_MASK64 = (1 << 64) - 1


def _names(names: object) -> tuple[bytes, ...]:
    if type(names) is not tuple or any(type(name) is not bytes for name in names):
        raise TypeError("names must be a tuple of bytes")
    return names


def _skip_bytes_or_none(mv: memoryview, p: int, end: int, what: str) -> int:
    """Position after the length-prefixed bytes field (-1 = None) at p, its content not looked at."""
    length, p2 = _read_varint(mv, p, end)
    if length == -1:
        return p2
    if length < 0 or length > end - p2:
        raise Corrupt(f"bad {what} length {length}", p)
    return p2 + length


def has_header(buf: Buffer, pos: int, size: int, names: tuple[bytes, ...]) -> bool:
    """True iff some record of the UNCOMPRESSED batch at [pos, pos+size) has a header whose key (raw UTF-8 bytes)
    equals one of `names` (a tuple of bytes). Keys, values and header values are skipped by their lengths, never
    read, so the cost is per record and per header, not per byte. The whole batch is walked and checked as
    count_records and decode_records check it (the match does not end the walk, so the outcome does not depend on
    where a header sits), except that header keys are not checked for UTF-8: Corrupt on any bad length, varint or
    count, or on a compressed batch; OutOfBounds if the range is outside `buf`; TypeError for bad `names`."""
    pos = _ssize(pos)
    size = _ssize(size)
    mv = _view(buf)
    names = _names(names)
    expected = _uncompressed_batch(mv, pos, size, "has_header")
    count, found = _walk_section(mv, pos + HEADER_SIZE, pos + size, names, False, None, 0)
    if count != expected:
        raise Corrupt(f"batch holds {count} records, header says {expected}", pos)
    return found


def check_records(
    data: Buffer,
    expected: int,
    names: tuple[bytes, ...] = (),
    require_keys: bool = False,
    timestamps: tuple[int, int] | None = None,
    base_timestamp: int = 0,
) -> bool:
    """Parse the records section `data` (a batch's records after its 61-byte header, decompressed if it was
    compressed) field by field, as Kafka's DefaultRecord.readFrom does; return whether some record has a header
    whose key is one of `names` (a tuple of bytes). Corrupt (with the position in `data`) on any bad length or
    varint, a null header key, a record whose fields do not fill its declared length exactly, or a record count
    other than `expected`; InvalidRecord, with `require_keys`, for a record without a key; InvalidTimestamp,
    with `timestamps` (low, high), for a create time (`base_timestamp` plus the record's delta) outside them."""
    expected = _ssize(expected)
    require_keys = bool(require_keys)
    base_timestamp = _ssize(base_timestamp)
    names = _names(names)
    window = _timestamps(timestamps)
    mv = _view(data)
    count, found = _walk_section(mv, 0, mv.nbytes, names, require_keys, window, base_timestamp)
    if count != expected:
        raise Corrupt(f"batch holds {count} records, header says {expected}", 0)
    return found


def _walk_section(
    mv: memoryview,
    p: int,
    end: int,
    names: tuple[bytes, ...],
    require_keys: bool,
    window: tuple[int, int] | None,
    base_timestamp: int,
) -> tuple[int, bool]:
    """(record count, whether a header key equals one of `names`) of the records section [p, end) of `mv`,
    parsed field by field; Corrupt (positions absolute in `mv`) unless every length fits and each record's fields
    fill exactly its declared length; with `require_keys`, InvalidRecord for a null key; with `window`,
    InvalidTimestamp for a create time outside it (base + delta wrapping as Java's long does; -1 is exempt)."""
    # only keys of a wanted length are compared, as the compiled kernel does
    lengths = {len(name) for name in names}
    found = False
    count = 0
    while p < end:
        start = p
        length, p = _read_varint(mv, p, end)
        if length < MIN_RECORD_BODY or length > end - p:
            raise Corrupt(f"bad record length {length}", start)
        record_end = p + length
        p += 1  # attributes
        timestamp_delta, p = _read_varlong(mv, p, record_end)
        if window is not None:
            timestamp = ((base_timestamp + timestamp_delta + _WRAP64) & _MASK64) - _WRAP64
            if timestamp != -1 and not window[0] <= timestamp <= window[1]:
                raise InvalidTimestamp(
                    f"timestamp {timestamp} of the record at position {start} is out of range: "
                    f"it should be within [{window[0]}, {window[1]}]"
                )
        _, p = _read_varint(mv, p, record_end)  # offset delta
        if require_keys and _read_varint(mv, p, record_end)[0] == -1:
            raise InvalidRecord(f"compacted topic: every record needs a key (record at position {start})")
        p = _skip_bytes_or_none(mv, p, record_end, "key")
        p = _skip_bytes_or_none(mv, p, record_end, "value")
        n_headers, q = _read_varint(mv, p, record_end)
        if n_headers < 0:
            raise Corrupt(f"negative header count {n_headers}", p)
        p = q
        for _ in range(n_headers):
            klen, q = _read_varint(mv, p, record_end)
            if klen < 0 or klen > record_end - q:
                raise Corrupt(f"bad header key length {klen}", p)
            if not found and klen in lengths and bytes(mv[q : q + klen]) in names:
                found = True
            p = _skip_bytes_or_none(mv, q + klen, record_end, "header value")
        if p != record_end:
            raise Corrupt("record length does not match its fields", start)
        count += 1
    return count, found


# --- records -------------------------------------------------------------------------------------------


def _read_bytes_or_none(mv: memoryview, p: int, end: int, what: str) -> tuple[bytes | None, int]:
    length, p2 = _read_varint(mv, p, end)
    if length == -1:
        return None, p2
    if length < 0 or length > end - p2:
        raise Corrupt(f"bad {what} length {length}", p)
    return bytes(mv[p2 : p2 + length]), p2 + length


def decode_records(data: Buffer, count: int) -> list[Record]:
    """Decode `count` records filling `data` (a decompressed records section) exactly. Per record:
    (attributes, timestamp_delta, offset_delta, key, value, headers: list[(str, bytes | None)])."""
    count = _i32(count)
    mv = _view(data)
    n = mv.nbytes
    # Every record takes at least 7 bytes; refuse an impossible count before doing any work.
    if count < 0 or count > n // (MIN_RECORD_BODY + 1):
        raise Corrupt(f"record count {count} impossible for {n} bytes", 0)
    out: list[Record] = []
    p = 0
    for _ in range(count):
        start = p
        length, p = _read_varint(mv, p, n)
        if length < MIN_RECORD_BODY or length > n - p:
            raise Corrupt(f"bad record length {length}", start)
        end = p + length
        attributes = mv[p]
        p += 1
        timestamp_delta, p = _read_varlong(mv, p, end)
        offset_delta, p = _read_varint(mv, p, end)
        key, p = _read_bytes_or_none(mv, p, end, "key")
        value, p = _read_bytes_or_none(mv, p, end, "value")
        n_headers, q = _read_varint(mv, p, end)
        if n_headers < 0:
            raise Corrupt(f"negative header count {n_headers}", p)
        p = q
        headers: list[RecordHeader] = []
        for _ in range(n_headers):
            klen, q = _read_varint(mv, p, end)
            if klen < 0 or klen > end - q:
                raise Corrupt(f"bad header key length {klen}", p)
            try:
                hkey = str(mv[q : q + klen], "utf-8")
            except UnicodeDecodeError:
                raise Corrupt("header key is not UTF-8", q) from None
            p = q + klen
            hvalue, p = _read_bytes_or_none(mv, p, end, "header value")
            headers.append((hkey, hvalue))
        if p != end:
            raise Corrupt("record length does not match its fields", start)
        out.append((attributes, timestamp_delta, offset_delta, key, value, headers))
    if p != n:
        raise Corrupt("trailing bytes after the last record", p)
    return out


def encode_record(
    offset_delta: int,
    timestamp_delta: int,
    key: Buffer | None,
    value: Buffer | None,
    headers: Sequence[tuple[str, Buffer | None]],
) -> bytes:
    """One record (length prefix included), attributes 0.
    key/value: bytes-like or None; headers: [(str, bytes-like | None)]."""
    offset_delta = _i32(offset_delta)
    timestamp_delta = _i64(timestamp_delta)
    body = bytearray(b"\x00")
    _put_varlong(body, timestamp_delta)
    _put_varint(body, offset_delta)
    for field in (key, value):
        if field is None:
            _put_varint(body, -1)
        else:
            raw = bytes(memoryview(field))
            _put_varint(body, len(raw))
            body += raw
    _put_varint(body, len(headers))
    for hkey, hvalue in headers:
        if not isinstance(hkey, str):
            raise TypeError("header key must be str")
        raw = hkey.encode("utf-8")
        _put_varint(body, len(raw))
        body += raw
        if hvalue is None:
            _put_varint(body, -1)
        else:
            value_raw = bytes(memoryview(hvalue))
            _put_varint(body, len(value_raw))
            body += value_raw
    if len(body) > _INT32_MAX:
        raise OverflowError("record larger than 2 GiB")
    out = bytearray()
    _put_varint(out, len(body))
    out += body
    return bytes(out)


def build_batch(
    base_offset: int,
    base_timestamp: int,
    max_timestamp: int,
    records: Buffer,
    record_count: int,
    last_offset_delta: int,
    attributes: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
) -> bytearray:
    """A complete batch around an already encoded (and possibly compressed) records section, CRC computed."""
    base_offset = _i64(base_offset)
    base_timestamp = _i64(base_timestamp)
    max_timestamp = _i64(max_timestamp)
    record_count = _i32(record_count)
    last_offset_delta = _i32(last_offset_delta)
    attributes = _i16(attributes)
    producer_id = _i64(producer_id)
    producer_epoch = _i16(producer_epoch)
    base_sequence = _i32(base_sequence)
    partition_leader_epoch = _i32(partition_leader_epoch)
    section = _view(records)
    if section.nbytes > _INT32_MAX - MIN_BATCH_LENGTH:
        raise OverflowError("record batch larger than 2 GiB")
    out = bytearray(HEADER_SIZE + section.nbytes)
    _HEADER.pack_into(
        out,
        0,
        base_offset,
        MIN_BATCH_LENGTH + section.nbytes,
        partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )
    out[HEADER_SIZE:] = section
    _U32.pack_into(out, 17, crc32c(memoryview(out)[CRC_START:]))
    return out


# --- in-place edits ------------------------------------------------------------------------------------


def set_base_offset(buf: Buffer, pos: int, base_offset: int) -> None:
    """Write the base offset of the batch at `pos` (it lies outside the CRC, so nothing else changes)."""
    pos = _ssize(pos)
    base_offset = _i64(base_offset)
    mv = _writable(buf)
    if pos < 0 or mv.nbytes - pos < HEADER_SIZE:
        raise OutOfBounds(f"batch header at {pos} outside buffer of {mv.nbytes} bytes")
    _I64.pack_into(mv, pos, base_offset)


def set_log_append_time(buf: Buffer, pos: int, ts: int) -> None:
    """Mark the batch at `pos` as LogAppendTime with max_timestamp `ts`, and recompute its CRC (as Kafka does)."""
    pos = _ssize(pos)
    ts = _i64(ts)
    mv = _writable(buf)
    if pos < 0 or mv.nbytes - pos < HEADER_SIZE:
        raise OutOfBounds(f"batch header at {pos} outside buffer of {mv.nbytes} bytes")
    batch_length: int = _I32.unpack_from(mv, pos + 8)[0]
    if batch_length < MIN_BATCH_LENGTH or batch_length + 12 > mv.nbytes - pos:
        raise Corrupt(f"bad record batch length {batch_length}", pos)
    attributes = _I16.unpack_from(mv, pos + 21)[0] | ATTR_LOG_APPEND_TIME
    _I16.pack_into(mv, pos + 21, attributes)
    _I64.pack_into(mv, pos + 35, ts)
    _U32.pack_into(mv, pos + 17, crc32c(mv[pos + CRC_START : pos + 12 + batch_length]))


def new_buffer(size: int) -> bytearray:
    """A bytearray of `size` bytes whose contents are unspecified (the compiled twin skips the zero fill): for
    receive buffers, whose bytes are all written before they are read."""
    return bytearray(_int(size, 0, _SSIZE_MAX))
