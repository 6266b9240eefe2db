"""Produce-side record handling for the Kafka protocol: compression codecs and validation of the record bytes of
one partition in a Produce request, before they reach the store. Sans-IO; the byte layout of a v2 batch belongs
to `mqk._fast.recbatch` (scan, CRC, count, build), which this module drives.

Codecs (attributes bits 0-2): 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.
- gzip: RFC 1952 members (several concatenated members are accepted, as Java's GZIPInputStream does).
- snappy: raw blocks and xerial-framed streams (magic `\\x82SNAPPY\\0`, what Java producers write) on input;
  `compress` writes xerial framing, which every client reads.
- lz4: the LZ4 frame format (KIP-57), via the `lz4` package.
- zstd: via `zstandard`.
Decompression is bounded: output beyond `max_size` raises `MessageTooLarge` without ever materialising more than
`max_size + 1` bytes, so a compression bomb cannot exhaust memory. Broken compressed data raises `Corrupt`.

Validation (`validate_produce_records`): every batch's CRC32C and framing, its size against the topic's
max.message.bytes (`MessageTooLarge`), and its records, parsed field by field as Kafka's LogValidator does by
iterating them (recbatch.check_records): every length and varint in range, no null header key, each record's
fields filling exactly its declared length, and the header's record count. For uncompressed batches all of it is
one recbatch.scan_batches call; for compressed ones the records section is decompressed (bounded) and then
checked. A batch whose CRC is right but whose records are malformed (a client bug) is refused with
CORRUPT_MESSAGE, so it never reaches a consumer. Valid batches are returned as memoryviews into the request
frame: the bytes the store keeps, unchanged.

Legacy message sets (magic 0 and 1, from clients older than Kafka 0.11): CONVERTED to one v2 batch, never
refused. Each legacy message (including the inner messages of compressed wrappers) becomes a v2 record with the
same key, value and timestamp (magic 0 carries none: -1, Kafka's NO_TIMESTAMP) and no headers; the new batch is
uncompressed, with offset deltas 0..n-1 (the broker assigns offsets anyway). Legacy CRC32 checksums are verified.
The converted batch is a fresh buffer, so `BatchInfo.converted` is True for it.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from mqk._fast import load
from mqk._fast.api import Record
from mqk.errors import Corrupt, InvalidRecord, MessageTooLarge, UnsupportedCompressionTypeError
from mqk.protocol.kafka.messages._runtime import Records

if TYPE_CHECKING:
    from typing_extensions import Buffer

recbatch = load("recbatch")

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
COMPRESSION_MASK = 0x07
_ATTR_CONTROL = 0x20
DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16  # magic (8) + version (4) + compatible version (4)
_I32 = struct.Struct(">i")
_RECORDS_POS = 61  # recbatch.HEADER_SIZE
_new_tuple = tuple.__new__


class PlanStop(enum.IntEnum):
    """Why recbatch.plan_plain_appends left a produced partition to the Produce handler's general path (the
    kernel's PLAN_* codes; recbatch_py says each one). /metrics counts them by name, so a partition that a client
    sends plain but the kernel no longer takes (a renamed field, a changed decoder) shows as SHAPE there."""

    END = recbatch.PLAN_END
    SHAPE = recbatch.PLAN_SHAPE
    NO_QUEUE = recbatch.PLAN_NO_QUEUE
    LEGACY = recbatch.PLAN_LEGACY
    IDEMPOTENT = recbatch.PLAN_IDEMPOTENT
    INVALID = recbatch.PLAN_INVALID
    COMPRESSED = recbatch.PLAN_COMPRESSED
    TOO_LARGE = recbatch.PLAN_TOO_LARGE
    CONTROL = recbatch.PLAN_CONTROL


class BatchInfo(NamedTuple):
    data: memoryview  # the whole batch, as the store will keep it
    size: int
    last_offset_delta: int
    max_timestamp: int
    record_count: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    base_timestamp: int
    compression: int
    converted: bool = False  # built here from a legacy (magic 0/1) message set
    #: whether some record has a header whose key is one of the `header_names` the check was asked about
    named_header: bool = False


# --- compression ---------------------------------------------------------------------------------------


def _too_big(max_size: int) -> MessageTooLarge:
    return MessageTooLarge(f"decompressed records exceed {max_size} bytes")


def _gunzip(data: Buffer, max_size: int) -> bytes:
    out = bytearray()
    rest = bytes(data)
    while rest:
        d = zlib.decompressobj(wbits=47)  # 32 + 15: gzip or zlib header, detected
        try:
            chunk = d.decompress(rest, max_size + 1 - len(out))
        except zlib.error as e:
            raise Corrupt(f"gzip: {e}") from None
        out += chunk
        if len(out) > max_size:
            raise _too_big(max_size)
        if not d.eof:
            if d.unconsumed_tail:  # stopped by the size bound with more to come
                raise _too_big(max_size)
            raise Corrupt("gzip: truncated stream")
        rest = d.unused_data
        if rest and not rest.startswith(b"\x1f\x8b"):
            break  # trailing garbage after the last member is ignored, like Java
    return bytes(out)


# The codec packages (cramjam, lz4, zstandard) are imported by the functions that use them, to keep start-up cheap:
# a broker whose clients never compress loads none of them; after the first call an import is a sys.modules lookup.


def _unsnappy_raw(data: Buffer, max_size: int) -> bytes:
    import cramjam

    try:
        n = cramjam.snappy.decompress_raw_len(bytes(data))
    except cramjam.DecompressionError as e:
        raise Corrupt(f"snappy: {e}") from None
    if n > max_size:
        raise _too_big(max_size)
    try:
        return bytes(cramjam.snappy.decompress_raw(bytes(data)))
    except cramjam.DecompressionError as e:
        raise Corrupt(f"snappy: {e}") from None


def _unsnappy(data: Buffer, max_size: int) -> bytes:
    view = memoryview(data)
    if bytes(view[:8]) != _XERIAL_MAGIC:
        return _unsnappy_raw(view, max_size)
    pos, out = _XERIAL_HEADER, bytearray()
    if len(view) < pos:
        raise Corrupt("snappy: truncated xerial header")
    while pos < len(view):
        if pos + 4 > len(view):
            raise Corrupt("snappy: truncated xerial block length")
        (n,) = _I32.unpack_from(view, pos)
        pos += 4
        if n < 0 or pos + n > len(view):
            raise Corrupt("snappy: xerial block beyond the data")
        out += _unsnappy_raw(view[pos : pos + n], max_size - len(out))
        pos += n
    return bytes(out)


def _unlz4(data: Buffer, max_size: int) -> bytes:
    import lz4.frame

    d = lz4.frame.LZ4FrameDecompressor()
    try:
        out: bytes = d.decompress(bytes(data), max_length=max_size + 1)
    except RuntimeError as e:
        raise Corrupt(f"lz4: {e}") from None
    if len(out) > max_size or (not d.eof and not d.needs_input):
        raise _too_big(max_size)
    if not d.eof:
        raise Corrupt("lz4: truncated frame")
    return out


def _unzstd(buf: Buffer, max_size: int) -> bytes:
    import zstandard

    data = bytes(buf)
    dctx = zstandard.ZstdDecompressor()
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as e:
        raise Corrupt(f"zstd: {e}") from None
    if declared > max_size:
        raise _too_big(max_size)
    try:
        # one-shot decoding refuses truncated frames; without a declared size, max_output_size bounds the output
        return dctx.decompress(data, max_output_size=max_size if declared < 0 else 0)
    except zstandard.ZstdError as e:
        error = e
    # Either corrupt/truncated or (size undeclared) larger than the bound: a bounded streaming read tells which.
    try:
        with dctx.stream_reader(data) as reader:
            total = 0
            while True:
                chunk = reader.read(min(1 << 20, max_size + 1 - total))
                if not chunk:
                    break
                total += len(chunk)
                if total > max_size:
                    raise _too_big(max_size)
    except zstandard.ZstdError:
        pass
    raise Corrupt(f"zstd: {error}") from None


_DECOMPRESSORS: dict[int, Callable[[Buffer, int], bytes]] = {
    GZIP: _gunzip,
    SNAPPY: _unsnappy,
    LZ4: _unlz4,
    ZSTD: _unzstd,
}


def decompress(codec_id: int, data: Buffer, max_size: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    if codec_id == NONE:
        if memoryview(data).nbytes > max_size:
            raise _too_big(max_size)
        return bytes(data)
    fn = _DECOMPRESSORS.get(codec_id)
    if fn is None:
        raise UnsupportedCompressionTypeError(f"unknown compression codec {codec_id}")
    return fn(data, max_size)


def compress(codec_id: int, buf: Buffer) -> bytes:
    data = bytes(buf)
    if codec_id == NONE:
        return data
    if codec_id == GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, 31)  # 16 + 15: gzip wrapper
        return c.compress(data) + c.flush()
    if codec_id == SNAPPY:
        import cramjam

        # xerial framing in blocks of 32 KiB, as snappy-java's SnappyOutputStream writes it
        out = bytearray(_XERIAL_MAGIC + _I32.pack(1) + _I32.pack(1))
        for i in range(0, len(data), 32768):
            block = bytes(cramjam.snappy.compress_raw(data[i : i + 32768]))
            out += _I32.pack(len(block)) + block
        return bytes(out)
    if codec_id == LZ4:
        import lz4.frame

        framed: bytes = lz4.frame.compress(data)
        return framed
    if codec_id == ZSTD:
        import zstandard

        return zstandard.ZstdCompressor().compress(data)
    raise UnsupportedCompressionTypeError(f"unknown compression codec {codec_id}")


# --- validation ----------------------------------------------------------------------------------------


def validate_produce_records(
    buf: Records | None,
    max_batch_bytes: int,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
    verify_crc: bool = True,
    header_names: tuple[bytes, ...] = (),
    require_keys: bool = False,
    timestamps: tuple[int, int] | None = None,
) -> list[BatchInfo]:
    """Check the record bytes of one partition of a Produce request; see the module docstring.
    Raises Corrupt (CORRUPT_MESSAGE), MessageTooLarge (MESSAGE_TOO_LARGE), InvalidRecord (INVALID_RECORD),
    UnsupportedCompressionTypeError. The same parse answers, per batch, whether some record carries a header
    named in `header_names` (`BatchInfo.named_header`; the Kafka produce handler asks about the timer's delay
    headers, so a put hook need not walk, decompress or decode the batch again). `require_keys` (a compacted
    topic) refuses a record without a key with InvalidRecord (INVALID_RECORD), and `timestamps` (low, high: a
    CreateTime topic's window around now) a record whose timestamp lies outside with InvalidTimestamp
    (INVALID_TIMESTAMP), both in the same walk."""
    if not buf:  # None or no bytes
        raise InvalidRecord("produce request without records")
    if isinstance(buf, (list, tuple)):  # (the encoder's form of a records field; a decoder never gives it)
        raise InvalidRecord("produce records as a list of buffers")
    view = buf if isinstance(buf, memoryview) else memoryview(buf)  # the decoder hands over views already
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    whole = len(view)
    if whole > 16 and view[16] in (0, 1):
        converted = convert_legacy(view, max_batch_bytes, max_decompressed_bytes)
        if require_keys or timestamps is not None:
            recbatch.check_records(
                converted.data[_RECORDS_POS:],
                converted.record_count,
                (),
                require_keys,
                timestamps,
                converted.base_timestamp,
            )
        return [converted]
    out: list[BatchInfo] = []
    # one kernel call checks every batch's framing and CRC and walks the records of the uncompressed ones
    for (
        pos,
        size,
        last_offset_delta,
        max_ts,
        count,
        attributes,
        producer_id,
        producer_epoch,
        base_sequence,
        base_ts,
        named,
    ) in recbatch.scan_batches(view, verify_crc, True, header_names, require_keys, timestamps):
        if size > max_batch_bytes:
            raise MessageTooLarge(f"record batch of {size} bytes exceeds the limit of {max_batch_bytes}")
        if attributes & _ATTR_CONTROL:
            raise InvalidRecord("clients may not write control batches (transaction markers are the broker's)")
        codec = attributes & COMPRESSION_MASK
        if codec != NONE:
            inner = decompress(codec, view[pos + _RECORDS_POS : pos + size], max_decompressed_bytes)
            named = recbatch.check_records(inner, count, header_names, require_keys, timestamps, base_ts)
        if count != last_offset_delta + 1:  # (Kafka's rule for a produced batch; stores keep compaction's empty ones)
            raise InvalidRecord(f"record batch of {count} records spans {last_offset_delta + 1} offsets")
        # a partition's records are most often exactly one batch: then the batch is the view itself, no slice
        data = view if size == whole else view[pos : pos + size]
        # tuple.__new__ straight away: the NamedTuple's generated __new__ is a Python call per batch
        out.append(
            _new_tuple(
                BatchInfo,
                (
                    data,
                    size,
                    last_offset_delta,
                    max_ts,
                    count,
                    attributes,
                    producer_id,
                    producer_epoch,
                    base_sequence,
                    base_ts,
                    codec,
                    False,
                    named,
                ),
            )
        )
    return out


#: Kafka's topic `compression.type` values that name a codec (`producer`, the default, keeps the producer's)
#: where a v2 batch keeps its partitionLeaderEpoch (after baseOffset and batchLength; outside the batch's CRC)
_LEADER_EPOCH_POS = 12


def stamp_leader_epoch(buf: bytes | bytearray | memoryview, epoch: int) -> memoryview:
    """`buf` (one or more checked v2 record batches) with every batch's partitionLeaderEpoch set to `epoch`, as a
    Kafka leader stamps what it appends: consumers keep the epoch of what they read and, after a failover, ask the
    new leader where that epoch ended (OffsetForLeaderEpoch) to tell a truncated log from a sound one. The CRC does
    not cover the field, so it stays valid. In place when `buf` is writable (the receive buffer), else in a copy;
    a view of what was stamped is returned (`buf` itself when it is a writable memoryview)."""
    view = buf if buf.__class__ is memoryview else memoryview(buf)
    if view.readonly:
        view = memoryview(bytearray(view))
    pack, size = _I32.pack_into, _I32.unpack_from
    pos, end = 0, len(view)
    while pos + _RECORDS_POS <= end:
        pack(view, pos + _LEADER_EPOCH_POS, epoch)
        pos += 12 + size(view, pos + 8)[0]
    return view


TOPIC_CODECS = {"uncompressed": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}


def recompress(info: BatchInfo, codec: int, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED) -> BatchInfo:
    """`info`'s batch with its records section compressed with `codec` (Kafka's LogValidator when a topic's
    compression.type is not the producer's): every header field but the attributes' codec bits, the length and
    the CRC stays (producer id, epoch and sequence too, so idempotence sees the same batch); the records are not
    decoded, since a v2 batch's compressed section is its records' bytes compressed. A batch already in `codec`
    and a control batch are returned as they are."""
    if info.compression == codec or info.attributes & _ATTR_CONTROL:
        return info
    data = info.data
    section: Buffer = data[_RECORDS_POS : info.size]
    if info.compression != NONE:
        section = decompress(info.compression, section, max_decompressed_bytes)
    header = recbatch.parse_header(data, 0)
    attributes = (info.attributes & ~COMPRESSION_MASK) | codec
    rebuilt = recbatch.build_batch(
        header[0],
        info.base_timestamp,
        info.max_timestamp,
        compress(codec, section),
        info.record_count,
        info.last_offset_delta,
        attributes,
        info.producer_id,
        info.producer_epoch,
        info.base_sequence,
        header[2],
    )
    return info._replace(data=memoryview(rebuilt), size=len(rebuilt), attributes=attributes, compression=codec)


def batch_records(info_or_batch: BatchInfo | Buffer) -> list[Record]:
    """Decoded records of one v2 batch (decompressing if needed): recbatch.decode_records tuples."""
    data = memoryview(info_or_batch.data if isinstance(info_or_batch, BatchInfo) else info_or_batch)
    header = recbatch.parse_header(data, 0)
    attributes, count = header[5], header[12]
    size = 12 + header[1]
    records: memoryview | bytes = data[_RECORDS_POS:size]
    codec = attributes & COMPRESSION_MASK
    if codec != NONE:
        records = decompress(codec, records)
    return recbatch.decode_records(records, count)


# --- legacy message sets (magic 0/1) -------------------------------------------------------------------

_LEGACY_HEAD = struct.Struct(">qiIbb")  # offset, message_size, crc, magic, attributes
_I64 = struct.Struct(">q")


def _legacy_bytes(view: memoryview, pos: int, end: int) -> tuple[bytes | None, int]:
    if pos + 4 > end:
        raise Corrupt("legacy message: truncated length", pos)
    (n,) = _I32.unpack_from(view, pos)
    pos += 4
    if n < 0:
        return None, pos
    if pos + n > end:
        raise Corrupt("legacy message: field beyond the message", pos)
    return bytes(view[pos : pos + n]), pos + n


def _legacy_messages(
    view: memoryview, max_decompressed: int, depth: int, out: list[tuple[int, bytes | None, bytes | None]]
) -> None:
    """Append (timestamp, key, value) for each message of a legacy message set, unwrapping compressed ones."""
    pos, end = 0, len(view)
    while pos < end:
        if end - pos < 26:  # offset, size, crc, magic, attributes, key length, value length
            raise Corrupt("legacy message: truncated", pos)
        _offset, size, crc, magic, attributes = _LEGACY_HEAD.unpack_from(view, pos)
        if size < 14 or pos + 12 + size > end:
            raise Corrupt("legacy message: bad size", pos)
        body = view[pos + 16 : pos + 12 + size]  # magic .. end, the CRC32 range
        if zlib.crc32(body) != crc:
            raise Corrupt("legacy message: CRC32 mismatch", pos)
        if magic not in (0, 1):
            raise Corrupt(f"legacy message: magic {magic}", pos)
        p = pos + 18
        stop = pos + 12 + size
        timestamp = -1
        if magic == 1:
            if p + 8 > stop:
                raise Corrupt("legacy message: truncated timestamp", pos)
            (timestamp,) = _I64.unpack_from(view, p)
            p += 8
        key, p = _legacy_bytes(view, p, stop)
        value, p = _legacy_bytes(view, p, stop)
        codec = attributes & COMPRESSION_MASK
        if codec == NONE:
            out.append((timestamp, key, value))
        else:
            if depth > 0 or value is None:
                raise Corrupt("legacy message: nested or empty compressed wrapper", pos)
            inner = decompress(codec, value, max_decompressed)
            first = len(out)
            _legacy_messages(memoryview(inner), max_decompressed, depth + 1, out)
            if magic == 1 and attributes & 0x08:  # LogAppendTime on the wrapper: its timestamp applies to all
                out[first:] = [(timestamp, k, v) for _t, k, v in out[first:]]
        pos = stop


def convert_legacy(
    view: memoryview, max_batch_bytes: int, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED
) -> BatchInfo:
    """A magic 0/1 message set -> one uncompressed v2 batch (see the module docstring)."""
    msgs: list[tuple[int, bytes | None, bytes | None]] = []
    _legacy_messages(view, max_decompressed_bytes, 0, msgs)
    if not msgs:
        raise InvalidRecord("legacy message set without a complete message")
    timestamps = [t for t, _k, _v in msgs]
    base_ts = timestamps[0]
    max_ts = max(timestamps)
    records = bytearray()
    total = 0
    for i, (ts, key, value) in enumerate(msgs):
        rec = recbatch.encode_record(i, ts - base_ts, key, value, [])
        total += len(rec)
        if total > max_batch_bytes:
            raise MessageTooLarge(f"converted legacy message set exceeds {max_batch_bytes} bytes")
        records += rec
    batch = recbatch.build_batch(0, base_ts, max_ts, bytes(records), len(msgs), len(msgs) - 1)
    if len(batch) > max_batch_bytes:
        raise MessageTooLarge(f"converted legacy message set exceeds {max_batch_bytes} bytes")
    return BatchInfo(
        memoryview(batch), len(batch), len(msgs) - 1, max_ts, len(msgs), 0, -1, -1, -1, base_ts, NONE, True
    )
