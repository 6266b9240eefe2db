"""Record-batch helpers the storage engines share: preparing batches for storage and reading record times.

Owns what an engine needs to know of a Kafka record batch v2 beyond its header, read only through
`mqk._fast.recbatch`: copying and stamping a batch for storage (`prepare_batches`), decompressing its records
section within a bound (`decompress`), and the record-level timestamp answers every engine gives alike
(`record_times`, `first_record_at_or_after`, `max_retained_timestamp`). No engine state lives here.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mqk._fast import load
from mqk.errors import Corrupt, InvalidRecord
from mqk.store.adapter import Buffer, StoredBatch

recbatch = load("recbatch")

_ATTR_COMPRESSION = 0x07
_ATTR_LOG_APPEND_TIME = 0x08


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """A batch copied and stamped for storage: base offset set, LogAppendTime applied if asked."""

    data: bytes
    base_offset: int
    record_count: int  #: offsets the batch covers (last_offset_delta + 1)
    max_timestamp: int  #: the batch's own max timestamp (after LogAppendTime)


def prepare_batches(batches: Sequence[Buffer], first_offset: int, log_append_time: int | None) -> list[PreparedBatch]:
    """Check the framing of each batch, copy it, set its base offset (consecutive from `first_offset`) and, when
    `log_append_time` is given, the LogAppendTime bit and max timestamp (CRC recomputed). Nothing is changed if any
    batch is bad: InvalidRecord (what every engine raises for input that is not a record batch v2 it can store)."""
    if not batches:
        raise InvalidRecord("append of no batches")
    out = []
    offset = first_offset
    for buf in batches:
        view = memoryview(buf)
        try:
            header = recbatch.parse_header(view, 0)
        except Corrupt as exc:
            raise InvalidRecord(f"not a record batch v2: {exc}") from None
        batch_length, last_offset_delta, max_timestamp, record_count = header[1], header[6], header[8], header[12]
        if batch_length + 12 != view.nbytes:
            raise InvalidRecord(f"record batch length {batch_length} does not match its {view.nbytes} bytes")
        # (an empty batch is one: Kafka's compaction leaves them, and a partition copied to another broker group
        # keeps its gaps with them; a Produce refuses them before it reaches a store)
        if last_offset_delta < 0 or record_count < 0:
            raise InvalidRecord("record batch of a negative size")
        copy = bytearray(view)
        recbatch.set_base_offset(copy, 0, offset)
        if log_append_time is not None:
            recbatch.set_log_append_time(copy, 0, log_append_time)
            max_timestamp = log_append_time
        out.append(PreparedBatch(bytes(copy), offset, last_offset_delta + 1, max_timestamp))
        offset += last_offset_delta + 1
    return out


#: a records section that inflates beyond this is not decoded (answers fall back to batch level): a compressed
#: batch must never make the broker allocate without bound
MAX_DECOMPRESSED_BYTES = 64 << 20


def _snappy_raw_length(data: bytes | memoryview) -> int:
    """The uncompressed length a raw snappy block declares (its uvarint preamble)."""
    value = shift = 0
    for i in range(min(5, len(data))):
        value |= (data[i] & 0x7F) << shift
        if not data[i] & 0x80:
            return value
        shift += 7
    raise Corrupt("bad snappy preamble")


def decompress(codec: int, data: bytes) -> bytes:
    """The records section of a compressed batch (Kafka codecs: 1 gzip, 2 snappy, 3 lz4 frame, 4 zstd), never
    more than MAX_DECOMPRESSED_BYTES (Corrupt beyond)."""
    cap = MAX_DECOMPRESSED_BYTES
    if codec == 1:
        out = zlib.decompressobj(31).decompress(data, cap + 1)
    elif codec == 2:
        import cramjam

        if data.startswith(b"\x82SNAPPY\x00"):  # xerial framing (the Java client's SnappyOutputStream)
            chunks, pos, total = [], 16, 0
            while pos + 4 <= len(data):
                size = int.from_bytes(data[pos : pos + 4], "big")
                chunk = data[pos + 4 : pos + 4 + size]
                total += _snappy_raw_length(chunk)
                if total > cap:
                    raise Corrupt("snappy data inflates beyond the limit")
                chunks.append(bytes(cramjam.snappy.decompress_raw(chunk)))
                pos += 4 + size
            out = b"".join(chunks)
        else:
            if _snappy_raw_length(data) > cap:
                raise Corrupt("snappy data inflates beyond the limit")
            out = bytes(cramjam.snappy.decompress_raw(data))
    elif codec == 3:
        import lz4.frame

        out = lz4.frame.LZ4FrameDecompressor().decompress(data, max_length=cap + 1)
    elif codec == 4:
        import zstandard

        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
            out = reader.read(cap + 1)
    else:
        raise Corrupt(f"unknown compression codec {codec}")
    if len(out) > cap:
        raise Corrupt("compressed records inflate beyond the limit")
    return out


def record_times(data: Buffer) -> list[tuple[int, int]] | None:
    """(offset, timestamp) of every record in the batch `data` (decompressing if needed; every record of a
    LogAppendTime batch carries the batch's max timestamp), or None if the records cannot be decoded."""
    header = recbatch.parse_header(data, 0)
    base, attributes, base_ts, max_ts, count = header[0], header[5], header[7], header[8], header[12]
    try:
        section = bytes(memoryview(data)[recbatch.HEADER_SIZE :])
        codec = attributes & _ATTR_COMPRESSION
        if codec:
            section = decompress(codec, section)
        records = recbatch.decode_records(section, count)
    except Exception:  # noqa: BLE001 - undecodable records: callers fall back to batch-level answers
        return None
    if attributes & _ATTR_LOG_APPEND_TIME:
        return [(base + r[2], max_ts) for r in records]
    return [(base + r[2], base_ts + r[1]) for r in records]


def max_retained_timestamp(
    batches: Iterable[StoredBatch], min_offset: int, best: tuple[int, int] | None = None
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record holding the largest timestamp at or above `min_offset`; `best` is
    the answer over earlier batches, for a caller that walks a queue in steps."""
    for batch in batches:
        if batch.next_offset <= min_offset or (best is not None and batch.max_timestamp <= best[1]):
            continue
        times = record_times(batch.data)
        if times is None:  # batch-level answer, as an index-only store would give
            times = [(max(batch.base_offset, min_offset), batch.max_timestamp)]
        for offset, ts in times:
            if offset >= min_offset and (best is None or ts > best[1]):
                best = (offset, ts)
    return best


def first_record_at_or_after(data: Buffer, timestamp: int, min_offset: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record of the batch `data` with timestamp >= `timestamp` and offset >=
    `min_offset`, or None. If the records cannot be decoded, falls back to the batch's first eligible offset with
    its max timestamp, which is what an index-only lookup would answer."""
    header = recbatch.parse_header(data, 0)
    base, last, max_ts = header[0], header[0] + header[6], header[8]
    if max_ts < timestamp or last < min_offset:
        return None
    times = record_times(data)
    if times is None:
        return max(base, min_offset), max_ts
    for offset, ts in times:
        if offset >= min_offset and ts >= timestamp:
            return offset, ts
    return None


__all__ = [
    "MAX_DECOMPRESSED_BYTES",
    "PreparedBatch",
    "decompress",
    "first_record_at_or_after",
    "max_retained_timestamp",
    "prepare_batches",
    "record_times",
]
