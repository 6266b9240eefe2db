"""The bridge between RocketMQ messages and the store's Kafka record batches.

A RocketMQ message is stored as a record batch v2 holding one record: key = the first of its `KEYS`, value = its
body, timestamp = its born timestamp, headers = its properties (name, UTF-8 value) in order. The two per-message
numbers RocketMQ keeps outside properties ride along as headers only when they are not zero: `mqk.flag` (the
message flag) and `mqk.reconsume` (reconsume times, set on retry topics); the producer's address rides as
`mqk.born` (`host:port`). They are read back into their fields and never shown as properties. The batch's
tags code (for ConsumeQueue filtering) is the Java hashCode of `TAGS`.

The other way, any stored batch (also a Kafka producer's, possibly compressed, with many records) becomes one
`MessageExt` per record, its headers as properties (its key as `KEYS` when there is no `KEYS` header). The
commit-log offset each message reports is the entry's physical offset plus the record's offset delta (unique
inside the entry), or, for engines without a CommitLog, a synthetic value (`synthetic_offset`) that still names
topic, queue and offset so message ids stay stable.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from mqk._fast import load
from mqk._fast.api import BatchHeader, Record
from mqk.errors import Corrupt
from mqk.protocol.native.codes import PROPERTY_KEYS, PROPERTY_TAGS
from mqk.protocol.native.message import MessageExt

recbatch = load("recbatch")
cqunit = load("cqunit")

HEADER_FLAG = "mqk.flag"
HEADER_RECONSUME = "mqk.reconsume"
HEADER_BORN_HOST = "mqk.born"
#: ceiling on one decompressed records section, so a compression bomb is refused, not allocated
MAX_DECOMPRESSED = 64 * 1024 * 1024


def tags_code_for(properties: dict[str, str]) -> int:
    tags = properties.get(PROPERTY_TAGS)
    return cqunit.hash_tag(tags) if tags else 0


def keys_of(properties: dict[str, str]) -> list[bytes]:
    return [k.encode() for k in properties.get(PROPERTY_KEYS, "").split(" ") if k]


def message_to_batch(
    body: bytes,
    properties: dict[str, str],
    born_timestamp: int,
    flag: int = 0,
    reconsume_times: int = 0,
    born_host: tuple[str, int] | None = None,
) -> bytearray:
    keys = keys_of(properties)
    headers: list[tuple[str, bytes | None]] = [(k, v.encode()) for k, v in properties.items()]
    if born_host is not None:
        headers.append((HEADER_BORN_HOST, f"{born_host[0]}:{born_host[1]}".encode()))
    if flag:
        headers.append((HEADER_FLAG, str(flag).encode()))
    if reconsume_times:
        headers.append((HEADER_RECONSUME, str(reconsume_times).encode()))
    record = recbatch.encode_record(0, 0, keys[0] if keys else None, body, headers)
    return recbatch.build_batch(0, born_timestamp, born_timestamp, record, 1, 0)


_SYN_OFFSET_BITS = 29
_SYN_QUEUE_BITS = 8
_SYN_HASH_BITS = 15


def synthetic_offset(topic: str, queue: int, offset: int) -> int:
    """A stand-in commit-log offset for engines without one: 15 bits of topic hash, 8 of queue, 29 of offset
    (52 bits: JavaScript clients such as ali-ons turn it into a Number and must keep it exact). Stable across
    restarts; the broker checks the topic (and the full offset) before trusting a match."""
    topic_hash = zlib.crc32(topic.encode()) & ((1 << _SYN_HASH_BITS) - 1)
    return (
        (topic_hash << (_SYN_QUEUE_BITS + _SYN_OFFSET_BITS))
        | ((queue & 0xFF) << _SYN_OFFSET_BITS)
        | (offset & ((1 << _SYN_OFFSET_BITS) - 1))
    )


def synthetic_matches(value: int, topic: str, queue: int) -> bool:
    return value >> _SYN_OFFSET_BITS == synthetic_offset(topic, queue, 0) >> _SYN_OFFSET_BITS


def synthetic_queue_offset(value: int) -> int:
    """The queue offset a synthetic value names (exact below 2**29 records per queue)."""
    return value & ((1 << _SYN_OFFSET_BITS) - 1)


def decompress(codec: int, data: bytes) -> bytes:
    """A compressed records section (Kafka codecs 1 gzip, 2 snappy raw or xerial, 3 lz4 frame, 4 zstd), bounded."""
    try:
        if codec == 1:
            d = zlib.decompressobj(47)  # gzip or zlib header, auto-detected
            out = d.decompress(data, MAX_DECOMPRESSED)
            if d.unconsumed_tail:
                raise Corrupt("gzip records section larger than the decompression ceiling")
            return out
        if codec == 2:
            import cramjam

            if data.startswith(b"\x82SNAPPY\x00"):
                chunks, pos, total = [], 16, 0
                while pos + 4 <= len(data):
                    size = int.from_bytes(data[pos : pos + 4], "big")
                    chunk = bytes(cramjam.snappy.decompress_raw(data[pos + 4 : pos + 4 + size]))
                    total += len(chunk)
                    if total > MAX_DECOMPRESSED:
                        raise Corrupt("snappy records section larger than the decompression ceiling")
                    chunks.append(chunk)
                    pos += 4 + size
                return b"".join(chunks)
            return bytes(cramjam.snappy.decompress_raw(data))
        if codec == 3:
            import lz4.frame

            d4 = lz4.frame.LZ4FrameDecompressor()
            out4: bytes = d4.decompress(data, max_length=MAX_DECOMPRESSED)
            if not d4.eof and d4.needs_input is False:
                raise Corrupt("lz4 records section larger than the decompression ceiling")
            return out4
        if codec == 4:
            import zstandard

            return zstandard.ZstdDecompressor().decompress(data, max_output_size=MAX_DECOMPRESSED)
    except Corrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - every codec library has its own error types
        raise Corrupt(f"cannot decompress records (codec {codec}): {exc}") from None
    raise Corrupt(f"unknown compression codec {codec}")


def batch_records(data: bytes | bytearray | memoryview) -> tuple[BatchHeader, list[Record]]:
    """(parsed header, decoded records) of one stored batch."""
    header = recbatch.parse_header(data, 0)
    attributes, record_count = header[5], header[12]
    records_section = bytes(memoryview(data)[recbatch.HEADER_SIZE :])
    codec = attributes & 0x07
    if codec:
        records_section = decompress(codec, records_section)
    return header, recbatch.decode_records(records_section, record_count)


def batch_to_messages(
    data: bytes | bytearray | memoryview,
    topic: str,
    queue: int,
    store_timestamp: int,
    physical_offset: int,
    store_host: tuple[str, int],
    min_offset: int = 0,
) -> list[MessageExt]:
    """One MessageExt per record of a stored batch whose offset is >= `min_offset`."""
    header, records = batch_records(data)
    base_offset, base_timestamp = header[0], header[7]
    log_append = bool(header[5] & 0x08)
    out: list[MessageExt] = []
    for _attrs, ts_delta, offset_delta, key, value, headers in records:
        offset = base_offset + offset_delta
        if offset < min_offset:
            continue
        props: dict[str, str] = {}
        flag = reconsume = 0
        born_host = store_host
        for name, raw in headers:
            text = "" if raw is None else raw.decode("utf-8", "replace")
            if name == HEADER_FLAG:
                flag = _int_or_zero(text)
            elif name == HEADER_RECONSUME:
                reconsume = _int_or_zero(text)
            elif name == HEADER_BORN_HOST:
                host, _, port = text.rpartition(":")
                born_host = (host, _int_or_zero(port)) if host else store_host
            else:
                props[name] = text
        if key is not None and PROPERTY_KEYS not in props:  # a Kafka producer's key is the message's key
            props[PROPERTY_KEYS] = key.decode("utf-8", "replace")
        commit_offset = (
            physical_offset + offset_delta if physical_offset >= 0 else synthetic_offset(topic, queue, offset)
        )
        born = header[8] if log_append else base_timestamp + ts_delta
        out.append(
            MessageExt(
                topic=topic,
                body=value or b"",
                properties=props,
                queue_id=queue,
                flag=flag,
                queue_offset=offset,
                commit_log_offset=commit_offset,
                born_timestamp=born,
                born_host=born_host,
                store_timestamp=store_timestamp or born,
                store_host=store_host,
                reconsume_times=reconsume,
            )
        )
    return out


def _int_or_zero(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def matches_tags(message: MessageExt, tags: Iterable[str] | None) -> bool:
    """Exact tag match after the ConsumeQueue's hash filter (None = subscribe to everything)."""
    if tags is None:
        return True
    return message.properties.get(PROPERTY_TAGS) in set(tags)
