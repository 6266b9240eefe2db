"""Produce request bodies decoded by hand, pure Python: the twin of `producereq.pyx` (same API, identical results).

The broker's hottest request is decoded here rather than by the generated codec (hot paths may be written by hand
in `_fast`, docs/architecture.md): the compiled twin walks the partitions in C, which matters when a request
spreads its records over many partitions. Both twins answer exactly what the generated decoder
(mqk.protocol.kafka.messages.decode_request) answers for Produce v3..v13, the same dict for the bytes it accepts,
and refuse what it refuses (tests/unit/test_fast_producereq.py holds them to that):

- v3..v8: int16-length strings, int32-length arrays and records, any negative length is null;
- v9..v12 (flexible): unsigned-varint lengths + 1 (0 is null), a tagged-field section after every struct, whose
  fields are skipped (Produce defines none);
- v13: each topic is named by its 16-byte topic id instead of its name (`name` is then "", as the generated
  decoder's default; before v13 `topic_id` is the zero UUID).

Records come back as slices of the input memoryview (never copied). Trailing bytes after the body are ignored, as
the generated decoder ignores them. Malformed bytes raise ValueError (UnicodeDecodeError for a name that is not
UTF-8); the protocol layer turns that into MalformedMessage. This module knows nothing of the rest of Kafka.
"""

from __future__ import annotations

import struct
from typing import Any
from uuid import UUID

ZERO_UUID = UUID(int=0)
FIRST_VERSION = 3
LAST_VERSION = 13

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class Cursor:
    """A read position over a request body and the Kafka wire primitives read from it (the twins' side of
    _cursor.pxd; fetchreq_py uses it too)."""

    __slots__ = ("buf", "n", "pos")

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.n = len(buf)
        self.pos = 0

    def need(self, k: int) -> None:
        if k > self.n - self.pos:
            raise ValueError(f"truncated at byte {self.pos}")

    def i8(self) -> int:
        self.need(1)
        self.pos += 1
        v: int = _I8.unpack_from(self.buf, self.pos - 1)[0]
        return v

    def i16(self) -> int:
        self.need(2)
        self.pos += 2
        v: int = _I16.unpack_from(self.buf, self.pos - 2)[0]
        return v

    def i32(self) -> int:
        self.need(4)
        self.pos += 4
        v: int = _I32.unpack_from(self.buf, self.pos - 4)[0]
        return v

    def i64(self) -> int:
        self.need(8)
        self.pos += 8
        v: int = _I64.unpack_from(self.buf, self.pos - 8)[0]
        return v

    def raw16(self) -> bytes:
        """The 16 bytes of a uuid."""
        self.need(16)
        self.pos += 16
        return bytes(self.buf[self.pos - 16 : self.pos])

    def uvarint(self) -> int:
        # the generated decoder's _uv: at most five bytes, the last one's high bits kept
        result = shift = 0
        while True:
            self.need(1)
            byte = self.buf[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result
            shift += 7
            if shift > 28:
                raise ValueError("varint too long")

    def length(self, compact: bool) -> int:
        """A string length: negative for null."""
        return self.uvarint() - 1 if compact else self.i16()

    def length32(self, compact: bool) -> int:
        """A bytes / array length: negative for null."""
        return self.uvarint() - 1 if compact else self.i32()

    def array_length(self, compact: bool, what: str) -> int:
        """The element count of a non-nullable array: ValueError for null, or for more elements than bytes left."""
        count = self.length32(compact)
        if count < 0:
            raise ValueError(f"null {what}")
        if count > self.n - self.pos:
            raise ValueError("truncated or oversized length")
        return count

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            size = self.uvarint()  # read before pos is: `pos += uvarint()` would drop the varint's own advance
            self.pos += size
            if self.pos > self.n:
                raise ValueError("truncated or oversized length")

    def string(self, size: int) -> str:
        if size > self.n - self.pos:
            raise ValueError("truncated or oversized length")
        self.pos += size
        return str(self.buf[self.pos - size : self.pos], "utf-8")


def decode_produce_request(buf: memoryview, version: int) -> dict[str, Any]:
    """A Produce request body (no frame size, no request header) of `version` (3..13) -> the same dict as the
    generated decoder's: transactional_id, acks, timeout_ms, topic_data [name, topic_id, partition_data
    [index, records (a memoryview into `buf`, or None)]]. `buf` must be a one-dimensional byte memoryview (the
    records are slices of it). Malformed bytes raise ValueError."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        raise ValueError(f"Produce v{version} is not decoded here")
    compact = version >= 9
    by_id = version >= 13
    c = Cursor(buf)
    size = c.length(compact)
    transactional_id = None if size < 0 else c.string(size)
    acks = c.i16()
    timeout_ms = c.i32()
    topics = c.array_length(compact, "topic_data")
    topic_data = []
    for _ in range(topics):
        if by_id:
            topic_id = UUID(bytes=c.raw16())
            name = ""
        else:
            size = c.length(compact)
            if size < 0:
                raise ValueError("null name")
            name = c.string(size)
            topic_id = ZERO_UUID
        partitions = c.array_length(compact, "partition_data")
        partition_data = []
        for _ in range(partitions):
            index = c.i32()
            size = c.length32(compact)
            if size < 0:
                records = None
            else:
                if size > c.n - c.pos:
                    raise ValueError("truncated or oversized length")
                records = buf[c.pos : c.pos + size]
                c.pos += size
            if compact:
                c.skip_tags()
            partition_data.append({"index": index, "records": records})
        if compact:
            c.skip_tags()
        topic_data.append({"name": name, "topic_id": topic_id, "partition_data": partition_data})
    if compact:
        c.skip_tags()
    return {"transactional_id": transactional_id, "acks": acks, "timeout_ms": timeout_ms, "topic_data": topic_data}
