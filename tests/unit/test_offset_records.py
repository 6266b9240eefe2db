"""`__consumer_offsets` records (mqk.protocol.kafka.offset_records): Kafka's byte layout for a known commit, round
trips of every value version, tombstones, records of other types, and malformed bytes."""

from __future__ import annotations

import struct
import warnings

import pytest
from helpers import records_of

from mqk._fast import load
from mqk.errors import Corrupt
from mqk.protocol.kafka import offset_records as R

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # (kafka-python's schema loading, see tests/helpers.py)
    from kafka.record.default_records import DefaultRecordBatch

recbatch = load("recbatch")

# group "g1", topic "t", partition 3 committed at offset 42, leader epoch 7, metadata "m", at 1700000000000 ms,
# written out field by field from Kafka's OffsetCommitKey (v1) and OffsetCommitValue (v3) schemas
KNOWN_KEY = bytes.fromhex(
    "0001"  # key version 1
    "0002" + b"g1".hex() +  # group
    "0001" + b"t".hex() +  # topic
    "00000003"  # partition
)  # fmt: skip
KNOWN_VALUE = bytes.fromhex(
    "0003"  # value version 3
    "000000000000002a"  # offset 42
    "00000007"  # leader epoch 7
    "0001" + b"m".hex() +  # metadata
    "0000018bcfe56800"  # commit timestamp 1700000000000
)  # fmt: skip


def test_known_commit_has_kafkas_bytes() -> None:
    assert R.encode_key("g1", "t", 3) == KNOWN_KEY
    assert R.encode_value(42, 7, "m", 1_700_000_000_000) == KNOWN_VALUE
    assert R.decode_key(KNOWN_KEY) == R.OffsetKey("g1", "t", 3)
    assert R.decode_value(KNOWN_VALUE) == R.OffsetValue(42, 7, "m", 1_700_000_000_000)


@pytest.mark.parametrize("group", ["", "g", "grüppe-ü", "x" * 300])
@pytest.mark.parametrize("offset", [0, 1, 2**63 - 1, -1])
def test_round_trip(group: str, offset: int) -> None:
    key = R.encode_key(group, "topic.a-b", 2**31 - 1)
    value = R.encode_value(offset, -1, "meta" * 10, 123)
    assert R.decode_key(key) == R.OffsetKey(group, "topic.a-b", 2**31 - 1)
    assert R.decode_value(value) == R.OffsetValue(offset, -1, "meta" * 10, 123)


def _s(text: str) -> bytes:
    return struct.pack(">h", len(text.encode())) + text.encode()


def test_every_value_version_kafka_wrote_decodes() -> None:
    v0 = struct.pack(">hq", 0, 5) + _s("a") + struct.pack(">q", 9)
    v1 = struct.pack(">hq", 1, 5) + _s("a") + struct.pack(">qq", 9, 99)
    v2 = struct.pack(">hq", 2, 5) + _s("a") + struct.pack(">q", 9)
    v4 = struct.pack(">hqi", 4, 5, 3) + bytes([2]) + b"a" + struct.pack(">q", 9) + bytes([1, 0, 2]) + b"xy"
    assert R.decode_value(v0) == R.OffsetValue(5, -1, "a", 9)
    assert R.decode_value(v1) == R.OffsetValue(5, -1, "a", 9)
    assert R.decode_value(v2) == R.OffsetValue(5, -1, "a", 9)
    assert R.decode_value(v4) == R.OffsetValue(5, 3, "a", 9)
    v0_key = struct.pack(">h", 0) + _s("g") + _s("t") + struct.pack(">i", 1)
    assert R.decode_key(v0_key) == R.OffsetKey("g", "t", 1)


def test_other_record_types_are_not_offsets() -> None:
    group_metadata_key = struct.pack(">h", 2) + _s("g")
    assert R.decode_key(group_metadata_key) is None
    assert R.decode_key(struct.pack(">h", 7) + b"anything") is None


@pytest.mark.parametrize(
    "key",
    [
        b"",
        b"\x00",
        KNOWN_KEY[:-1],  # partition cut short
        KNOWN_KEY + b"\x00",  # bytes left over
        struct.pack(">h", 1) + struct.pack(">h", -1),  # null group
        struct.pack(">h", 1) + struct.pack(">h", 2) + b"\xff\xfe" + _s("t") + b"\x00\x00\x00\x00",  # not UTF-8
        struct.pack(">h", -3),
    ],
)
def test_malformed_keys_are_corrupt(key: bytes) -> None:
    with pytest.raises(Corrupt):
        R.decode_key(key)


@pytest.mark.parametrize(
    "value",
    [b"", KNOWN_VALUE[:-3], KNOWN_VALUE + b"\x01", struct.pack(">hq", 9, 1), struct.pack(">hq", 3, 1) + b"\x00"],
)
def test_malformed_values_are_corrupt(value: bytes) -> None:
    with pytest.raises(Corrupt):
        R.decode_value(value)


def test_batch_holds_one_record_per_partition_and_tombstones() -> None:
    entries = [
        (R.OffsetKey("g1", "t", 3), R.OffsetValue(42, 7, "m", 1_700_000_000_000)),
        (R.OffsetKey("g1", "t", 4), None),
    ]
    batch = R.offsets_batch(entries, 1_700_000_000_000)
    recbatch.set_base_offset(batch, 0, 100)
    # an independent decoder (kafka-python) reads the batch as Kafka's tools would
    decoded = DefaultRecordBatch(bytes(batch))
    assert decoded.validate_crc()
    records = list(decoded)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in records] == [
        (100, 1_700_000_000_000, KNOWN_KEY, KNOWN_VALUE),
        (101, 1_700_000_000_000, R.encode_key("g1", "t", 4), None),
    ]
    assert [r.value for r in records] == [v for _o, _t, v in records_of(batch)]
    assert list(R.offset_records(batch)) == [
        R.OffsetRecord(100, *entries[0]),
        R.OffsetRecord(101, entries[1][0], None),
    ]
    with pytest.raises(ValueError):
        R.offsets_batch([], 0)


def test_malformed_record_in_a_batch_comes_out_as_its_error() -> None:
    records = (
        recbatch.encode_record(0, 0, KNOWN_KEY, b"\x00\x03broken", [])
        + recbatch.encode_record(1, 0, struct.pack(">h", 2) + _s("g"), b"group metadata", [])
        + recbatch.encode_record(2, 0, None, b"no key", [])
        + recbatch.encode_record(3, 0, KNOWN_KEY, KNOWN_VALUE, [])
    )
    batch = recbatch.build_batch(10, 0, 0, records, 4, 3)
    out = list(R.offset_records(batch))
    assert len(out) == 3
    assert isinstance(out[0], Corrupt) and "offset 10" in str(out[0])
    assert isinstance(out[1], Corrupt) and "offset 12" in str(out[1])
    assert out[2] == R.OffsetRecord(13, R.OffsetKey("g1", "t", 3), R.OffsetValue(42, 7, "m", 1_700_000_000_000))


def test_strings_longer_than_an_int16_are_refused() -> None:
    with pytest.raises(ValueError):
        R.encode_key("g" * 40_000, "t", 0)
