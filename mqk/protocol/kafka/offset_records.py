"""The committed-offset records of Kafka's `__consumer_offsets` topic, in Kafka's own layout (sans-IO).

A record's key and value are Kafka's group-coordinator records; every integer is big-endian and a string is an
int16 length followed by its UTF-8 bytes:

    key   = version int16 | group string | topic string | partition int32
            versions 0 and 1 are offset commits (mqk writes 1, as Kafka does); 2 is a group's metadata and 3 and
            above are the new consumer protocol's records: not offset commits (`decode_key` answers None)
    value = version int16 | fields of that version:
            v0, v2  offset int64 | metadata string | commit timestamp int64
            v1      offset int64 | metadata string | commit timestamp int64 | expire timestamp int64
            v3      offset int64 | leader epoch int32 | metadata string | commit timestamp int64   (mqk writes 3)
            v4      v3's fields, flexible: metadata a compact string (unsigned varint length + 1), then tagged
                    fields

A deleted offset is its key with a null value (a tombstone), which compaction later removes. Reading any version
Kafka has written lets a log written by Kafka's tools, or by a later mqk, load; bytes that fit no version raise
`Corrupt`, so the reader can skip the record and say so.

`offsets_batch` builds the record batch v2 that holds one commit (one record per partition, one batch per commit,
so a commit lands whole or not at all), and `offset_records` reads the offset records back out of a stored batch.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from mqk._fast import load
from mqk.errors import Corrupt
from mqk.protocol.kafka.records import batch_records

recbatch = load("recbatch")

#: Kafka's internal topic of committed offsets (its partition, by the hash of a group id, places the group's
#: coordinator)
OFFSETS_TOPIC = "__consumer_offsets"
#: key versions of an offset commit (0 and 1 have one layout); mqk writes KEY_VERSION
OFFSET_KEY_VERSIONS = (0, 1)
KEY_VERSION = 1
#: the value version mqk writes: the newest one without tagged fields, the one Kafka writes for a commit without
#: an expire timestamp
VALUE_VERSION = 3
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_V3_HEAD = struct.Struct(">hqi")  # version, offset, leader epoch
_MAX_STRING = 0x7FFF


class OffsetKey(NamedTuple):
    group: str
    topic: str
    partition: int


class OffsetValue(NamedTuple):
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int


class OffsetRecord(NamedTuple):
    """One offset record of a stored batch: its offset in the partition, the key, and the value (None: a
    tombstone)."""

    offset: int
    key: OffsetKey
    value: OffsetValue | None


def _string(text: str) -> bytes:
    data = text.encode()
    if len(data) > _MAX_STRING:
        raise ValueError(f"string of {len(data)} bytes does not fit an int16 length")
    return _I16.pack(len(data)) + data


def encode_key(group: str, topic: str, partition: int) -> bytes:
    """The key of (group, topic, partition)'s committed offset (version 1)."""
    return _I16.pack(KEY_VERSION) + _string(group) + _string(topic) + _I32.pack(partition)


def encode_value(offset: int, leader_epoch: int, metadata: str, commit_timestamp: int) -> bytes:
    """A committed offset's value (version 3)."""
    return _V3_HEAD.pack(VALUE_VERSION, offset, leader_epoch) + _string(metadata) + _I64.pack(commit_timestamp)


class _Reader:
    """Bounds-checked reads over one key or value; running past its end is `Corrupt`."""

    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes | bytearray | memoryview, what: str) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.what = what

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise Corrupt(f"{self.what}: {n} bytes wanted at {self.pos} of {len(self.data)}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def int16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def int32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def int64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise Corrupt(f"{self.what}: unsigned varint longer than 5 bytes")

    def _text(self, n: int) -> str:
        try:
            return bytes(self._take(n)).decode()
        except UnicodeDecodeError:
            raise Corrupt(f"{self.what}: a string is not UTF-8") from None

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise Corrupt(f"{self.what}: null string")
        return self._text(n)

    def compact_string(self) -> str:
        n = self.uvarint() - 1
        if n < 0:
            raise Corrupt(f"{self.what}: null string")
        return self._text(n)

    def tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self._take(self.uvarint())

    def end(self) -> None:
        if self.pos != len(self.data):
            raise Corrupt(f"{self.what}: {len(self.data) - self.pos} bytes left over")


def decode_key(data: bytes | bytearray | memoryview) -> OffsetKey | None:
    """The (group, topic, partition) of an offset-commit key; None for a key of another record type (a group's
    metadata, the new consumer protocol's records). Corrupt for bytes that fit no layout."""
    r = _Reader(data, "offset key")
    version = r.int16()
    if version not in OFFSET_KEY_VERSIONS:
        if version < 0:
            raise Corrupt(f"offset key: negative version {version}")
        return None
    key = OffsetKey(r.string(), r.string(), r.int32())
    r.end()
    return key


def decode_value(data: bytes | bytearray | memoryview) -> OffsetValue:
    """A committed offset's value, of any version 0-4 (leader epoch -1 where the version has none). Corrupt for
    bytes that fit no version."""
    r = _Reader(data, "offset value")
    version = r.int16()
    if version in (0, 2):
        value = OffsetValue(r.int64(), -1, r.string(), r.int64())
    elif version == 1:
        value = OffsetValue(r.int64(), -1, r.string(), r.int64())
        r.int64()  # the expire timestamp (Kafka stopped honouring it; so does mqk)
    elif version == 3:
        offset, epoch = r.int64(), r.int32()
        value = OffsetValue(offset, epoch, r.string(), r.int64())
    elif version == 4:
        offset, epoch = r.int64(), r.int32()
        value = OffsetValue(offset, epoch, r.compact_string(), r.int64())
        r.tagged_fields()
    else:
        raise Corrupt(f"offset value: unknown version {version}")
    r.end()
    return value


def offsets_batch(
    entries: Sequence[tuple[OffsetKey, OffsetValue | None]], timestamp: int, leader_epoch: int = -1
) -> bytearray:
    """One uncompressed record batch v2 with a record per entry (a None value: a tombstone), every record at
    `timestamp` (Kafka stamps a commit's records with its commit time). The store sets the base offset."""
    if not entries:
        raise ValueError("an offsets batch needs at least one record")
    records = bytearray()
    for i, (key, value) in enumerate(entries):
        encoded_value = (
            None
            if value is None
            else encode_value(value.offset, value.leader_epoch, value.metadata, value.commit_timestamp)
        )
        records += recbatch.encode_record(i, 0, encode_key(*key), encoded_value, [])
    count = len(entries)
    return recbatch.build_batch(
        0, timestamp, timestamp, bytes(records), count, count - 1, partition_leader_epoch=leader_epoch
    )


def offset_records(batch: bytes | bytearray | memoryview) -> Iterator[OffsetRecord | Corrupt]:
    """The offset records of one stored batch, in order; a record whose key or value fits no layout comes out as
    the Corrupt error saying why (the caller logs and skips it), records of other types not at all. A batch
    whose records cannot be read at all raises Corrupt."""
    base = recbatch.parse_header(batch, 0)[0]
    for _attributes, _ts_delta, delta, key, value, _headers in batch_records(batch):
        try:
            if key is None:
                raise Corrupt("offset record without a key")
            decoded = decode_key(key)
            if decoded is None:
                continue
            yield OffsetRecord(base + delta, decoded, None if value is None else decode_value(value))
        except Corrupt as exc:
            yield Corrupt(f"record at offset {base + delta}: {exc}")


__all__ = [
    "KEY_VERSION",
    "OFFSETS_TOPIC",
    "VALUE_VERSION",
    "OffsetKey",
    "OffsetRecord",
    "OffsetValue",
    "decode_key",
    "decode_value",
    "encode_key",
    "encode_value",
    "offset_records",
    "offsets_batch",
]
