"""recbatch kernels (Kafka record batch v2): round trips, CRC and truncation detection, bounds, and byte-for-byte
agreement with kafka-python's own batch builder. Every test runs on the twin and, when built, the compiled module."""

from __future__ import annotations

import struct
import warnings

import pytest
from crc32c import crc32c

with warnings.catch_warnings():
    # kafka-python 3 reads its JSON schemas through importlib.resources' deprecated legacy API at import time.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from mqk._fast import compiled, twin
from mqk.errors import Corrupt, OutOfBounds

IMPLS = [pytest.param(twin("recbatch"), id="twin")]
if compiled("recbatch") is not None:
    IMPLS.append(pytest.param(compiled("recbatch"), id="compiled"))


@pytest.fixture(params=IMPLS)
def rb(request):
    return request.param


def kafka_python_batch(records, base_offset=0, producer_id=-1, producer_epoch=-1, base_sequence=-1, transactional=0):
    """A batch built by kafka-python (a real client): records = [(offset_delta, timestamp, key, value, headers)]."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 24,
    )
    for offset, timestamp, key, value, headers in records:
        builder.append(offset, timestamp=timestamp, key=key, value=value, headers=headers)
    data = bytes(builder.build())
    return data[:0] + struct.pack(">q", base_offset) + data[8:]


SAMPLE = [
    (0, 1_700_000_000_000, b"key-0", b"value-0", [("trace", b"abc"), ("empty", b"")]),
    (1, 1_700_000_000_007, None, b"v" * 300, []),
    (2, 1_699_999_999_000, b"", None, [("null-header", None), ("ünï", b"\x00\xff")]),
]


def our_batch(rb, records=SAMPLE, base_offset=0, **kw):
    base_ts = records[0][1]
    encoded = b"".join(rb.encode_record(o, ts - base_ts, k, v, h) for o, ts, k, v, h in records)
    return rb.build_batch(
        base_offset,
        base_ts,
        max(r[1] for r in records),
        encoded,
        len(records),
        records[-1][0],
        partition_leader_epoch=0,
        **kw,
    )


def test_build_matches_kafka_python_byte_for_byte(rb):
    assert bytes(our_batch(rb)) == kafka_python_batch(SAMPLE)


def test_build_matches_kafka_python_idempotent_producer(rb):
    theirs = kafka_python_batch(SAMPLE, base_offset=42, producer_id=7, producer_epoch=3, base_sequence=11)
    ours = our_batch(rb, base_offset=42, producer_id=7, producer_epoch=3, base_sequence=11)
    assert bytes(ours) == theirs


@pytest.mark.parametrize("codec", [1, 3, 4])  # gzip, lz4, zstd (kafka-python needs python-snappy for 2)
def test_build_around_kafka_python_compressed_records(rb, codec):
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    for offset, timestamp, key, value, headers in SAMPLE:
        builder.append(offset, timestamp=timestamp, key=key, value=value, headers=headers)
    theirs = bytes(builder.build())
    h = rb.parse_header(theirs)
    assert h[5] & 0x07 == codec
    ours = rb.build_batch(h[0], h[7], h[8], theirs[61:], h[12], h[6], h[5], h[9], h[10], h[11], h[2])
    assert bytes(ours) == theirs
    assert rb.scan_batches(theirs)[0][5] == h[5]
    with pytest.raises(Corrupt, match="compressed"):
        rb.count_records(theirs, 0, len(theirs))


def test_kafka_python_reads_what_we_build(rb):
    batch = DefaultRecordBatch(bytes(our_batch(rb, base_offset=100)))
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    assert got == [(100 + o, ts, k, v, h) for o, ts, k, v, h in SAMPLE]


def test_parse_and_scan_kafka_python_batch(rb):
    data = kafka_python_batch(SAMPLE, base_offset=5, producer_id=9, producer_epoch=1, base_sequence=4)
    h = rb.parse_header(data)
    assert h[0] == 5 and h[1] == len(data) - 12 and h[3] == 2
    assert h[4] == crc32c(data[21:])
    assert h[6:] == (2, SAMPLE[0][1], SAMPLE[1][1], 9, 1, 4, 3)
    assert rb.scan_batches(data) == [(0, len(data), 2, SAMPLE[1][1], 3, 0, 9, 1, 4, SAMPLE[0][1], None)]
    assert rb.scan_batches(data, True, True)[0][10] is False  # walked: no header key among the (no) names
    assert rb.count_records(data, 0, len(data)) == 3
    decoded = rb.decode_records(data[61:], 3)
    assert decoded == [(0, ts - SAMPLE[0][1], o, k, v, h) for o, ts, k, v, h in SAMPLE]


def test_scan_concatenated_batches_and_offsets(rb):
    a = kafka_python_batch(SAMPLE)
    b = kafka_python_batch(SAMPLE[:1])
    buf = a + b + a
    scanned = rb.scan_batches(buf)
    assert [(s[0], s[1], s[4]) for s in scanned] == [(0, len(a), 3), (len(a), len(b), 1), (len(a) + len(b), len(a), 3)]
    assert rb.scan_batches(b"") == []
    assert rb.count_records(buf, len(a), len(b)) == 1


def test_scan_detects_every_single_byte_flip_in_crc_range(rb):
    data = bytearray(kafka_python_batch(SAMPLE))
    for i in range(21, len(data)):
        data[i] ^= 0x01
        with pytest.raises(Corrupt) as err:
            rb.scan_batches(data)
        assert err.value.position == 0
        rb.scan_batches(data, verify_crc=False) if i >= 61 else None
        data[i] ^= 0x01
    rb.scan_batches(data)


def test_scan_reports_position_of_the_bad_batch(rb):
    a = kafka_python_batch(SAMPLE)
    bad = bytearray(a)
    bad[-1] ^= 0xFF
    with pytest.raises(Corrupt) as err:
        rb.scan_batches(a + bytes(bad))
    assert err.value.position == len(a)


@pytest.mark.parametrize("cut", [1, 12, 60, 61, 100])
def test_scan_truncation_is_corrupt(rb, cut):
    data = kafka_python_batch(SAMPLE)
    with pytest.raises(Corrupt):
        rb.scan_batches(data + data[:cut])
    with pytest.raises(Corrupt):
        rb.scan_batches(data[: len(data) - cut])


def test_scan_rejects_bad_magic_short_length_negative_count(rb):
    data = bytearray(kafka_python_batch(SAMPLE))
    bad = bytearray(data)
    bad[16] = 1
    with pytest.raises(Corrupt, match="magic"):
        rb.scan_batches(bad)
    with pytest.raises(Corrupt, match="magic"):
        rb.parse_header(bad)
    bad = bytearray(data)
    struct.pack_into(">i", bad, 8, 48)
    with pytest.raises(Corrupt):
        rb.scan_batches(bad)
    bad = bytearray(data)
    struct.pack_into(">i", bad, 57, -1)
    struct.pack_into(">I", bad, 17, crc32c(bytes(bad[21:])))
    with pytest.raises(Corrupt, match="negative record count"):
        rb.scan_batches(bad)


def test_parse_header_needs_61_bytes(rb):
    data = kafka_python_batch(SAMPLE)
    with pytest.raises(Corrupt):
        rb.parse_header(data[:60])
    with pytest.raises(Corrupt):
        rb.parse_header(data, len(data) - 60)
    with pytest.raises(Corrupt):
        rb.parse_header(data, -1)
    assert rb.parse_header(b"\x00" * 3 + data, 3) == rb.parse_header(data)


def test_scan_batches_walk_records_checks_each_uncompressed_batch(rb):
    good = kafka_python_batch(SAMPLE)
    lying = bytearray(kafka_python_batch(SAMPLE))
    struct.pack_into(">i", lying, 57, 4)  # says 4 records, holds 3; CRC recomputed so only the walk can tell
    struct.pack_into(">I", lying, 17, crc32c(bytes(lying[21:])))
    data = good + bytes(lying)
    assert len(rb.scan_batches(data)) == 2  # framing and CRC alone pass it
    with pytest.raises(Corrupt, match="header says 4") as err:
        rb.scan_batches(data, True, True)
    assert err.value.position == len(good)
    assert [b[:10] for b in rb.scan_batches(good + good, True, True)] == [b[:10] for b in rb.scan_batches(good + good)]


# Records whose lengths all add up but whose fields do not: what a length walk accepts and Kafka's LogValidator
# (DefaultRecord.readFrom) refuses. Each body follows a record length varint; CRCs are computed by build_batch.
MALFORMED_RECORD_BODIES = {
    "negative header count": b"\x00\x00\x00\x02k\x02v\x01",  # header count -1
    "header key length": b"\x00\x00\x00\x02k\x02v\x02\x01",  # one header, key length -1 (null key)
    "record length does not match": b"\x00\x00\x00\x02k\x02v\x00\x00",  # a spare byte after the headers
    "bad value length": b"\x00\x00\x00\x02k\x03v\x00",  # value length -2
    "varlong longer": b"\x00" + b"\xff" * 10 + b"\x00\x00\x00",  # an 11-byte timestamp delta
}


def malformed_batch(rb, body: bytes) -> bytes:
    good = rb.encode_record(0, 0, b"k", b"v", [])
    records = good + bytes([2 * len(body)]) + body
    return bytes(rb.build_batch(0, 0, 0, records, 2, 1, 0))


@pytest.mark.parametrize("what", sorted(MALFORMED_RECORD_BODIES))
def test_produce_check_parses_every_record_field(rb, what):
    bad = malformed_batch(rb, MALFORMED_RECORD_BODIES[what])
    good = kafka_python_batch(SAMPLE)
    assert len(rb.scan_batches(good + bad, True, False)) == 2  # framing, CRC and the record lengths are fine
    with pytest.raises(Corrupt, match=what) as err:
        rb.scan_batches(good + bad, True, True)
    assert err.value.position >= len(good)  # inside the second batch
    with pytest.raises(Corrupt, match=what):
        rb.check_records(bad[61:], 2)
    with pytest.raises(Corrupt):
        rb.decode_records(bad[61:], 2)  # what a consumer decoding the batch would hit


def test_check_records_counts_and_positions(rb):
    data = kafka_python_batch(SAMPLE)
    section = data[61:]
    assert rb.check_records(section, 3) is False
    assert rb.check_records(b"", 0) is False
    with pytest.raises(Corrupt, match="header says 4") as err:
        rb.check_records(section, 4)
    assert err.value.position == 0
    with pytest.raises(Corrupt, match="bad record length"):
        rb.check_records(section[:-1], 3)  # the last record is cut
    with pytest.raises(Corrupt):
        rb.check_records(section + b"\x00", 3)  # a trailing byte is no record
    # a section handed over inside a larger buffer is read through any buffer shape
    assert rb.check_records(memoryview(bytearray(section)), 3) is False
    with pytest.raises(TypeError):
        rb.check_records(section, "3")
    with pytest.raises(TypeError):
        rb.check_records(section, 3, [b"DELAY"])


def test_produce_check_answers_whether_a_named_header_is_there(rb):
    """The produce check's walk tells, per uncompressed batch, whether some record carries a header of a given
    name (the timer's delay headers), so nothing walks the records a second time; compressed batches: None."""
    plain = [("trace", b"1")]
    with_delay = headers_batch(rb, [plain, [*plain, ("DELAY", b"3")], []])
    without = headers_batch(rb, [plain, [], [("delay", b"3")]])
    data = with_delay + without
    scanned = rb.scan_batches(data, True, True, DELAY_KEYS)
    assert [b[10] for b in scanned] == [True, False]
    assert [b[:10] for b in scanned] == [b[:10] for b in rb.scan_batches(data)]
    assert [b[10] for b in rb.scan_batches(data, True, False, DELAY_KEYS)] == [None, None]
    assert rb.check_records(with_delay[61:], 3, DELAY_KEYS) is True
    assert rb.check_records(without[61:], 3, DELAY_KEYS) is False
    compressed = bytearray(with_delay)
    compressed[22] |= 1
    struct.pack_into(">I", compressed, 17, crc32c(bytes(compressed[21:])))
    assert rb.scan_batches(bytes(compressed), True, True, DELAY_KEYS)[0][10] is None
    for bad in (None, [b"DELAY"], ("DELAY",)):
        with pytest.raises(TypeError):
            rb.scan_batches(data, True, True, bad)


def test_produce_check_requires_keys_when_asked(rb):
    """A compacted topic's rule, checked in the same walk: a record without a key is InvalidRecord."""
    from mqk.errors import InvalidRecord

    keyed = rb.build_batch(0, 0, 0, rb.encode_record(0, 0, b"k", b"v", []), 1, 0)
    keyless = rb.build_batch(
        0, 0, 0, rb.encode_record(0, 0, b"k", b"v", []) + rb.encode_record(1, 0, None, b"v", []), 2, 1
    )
    assert len(rb.scan_batches(keyed + keyless, True, True)) == 2
    assert len(rb.scan_batches(keyed, True, True, (), True)) == 1
    with pytest.raises(InvalidRecord, match="needs a key"):
        rb.scan_batches(keyed + keyless, True, True, (), True)
    assert rb.check_records(keyless[61:], 2) is False
    with pytest.raises(InvalidRecord, match="needs a key"):
        rb.check_records(keyless[61:], 2, (), True)
    # an empty key is a key
    empty = rb.build_batch(0, 0, 0, rb.encode_record(0, 0, b"", b"v", []), 1, 0)
    assert len(rb.scan_batches(empty, True, True, (), True)) == 1


def test_produce_check_holds_create_times_to_a_window(rb):
    """A CreateTime topic's rule (message.timestamp.before/after.max.ms), checked per record in the same walk:
    a record's time is the batch's base timestamp plus its delta; -1 (no timestamp) is exempt."""
    from mqk.errors import InvalidTimestamp

    recs = rb.encode_record(0, 0, b"k", b"a", []) + rb.encode_record(1, 500, b"k", b"b", [])
    batch = rb.build_batch(0, 10_000, 10_500, recs, 2, 1)
    assert len(rb.scan_batches(batch, True, True, (), False, (10_000, 10_500))) == 1
    with pytest.raises(InvalidTimestamp, match=r"timestamp 10500 of the record at position 7[0-9] is out of range"):
        rb.scan_batches(batch, True, True, (), False, (10_000, 10_499))
    with pytest.raises(InvalidTimestamp, match="timestamp 10000 "):
        rb.scan_batches(batch, True, True, (), False, (10_001, 20_000))
    assert rb.scan_batches(batch, True, False, (), False, (0, 1))[0][10] is None  # not walked: not checked
    untimed = rb.build_batch(0, -1, -1, rb.encode_record(0, 0, b"k", b"a", []), 1, 0)
    assert len(rb.scan_batches(untimed, True, True, (), False, (0, 1))) == 1  # -1: no timestamp, exempt
    # a decompressed section is checked against the base timestamp it is given
    assert rb.check_records(recs, 2, (), False, (10_000, 10_500), 10_000) is False
    with pytest.raises(InvalidTimestamp):
        rb.check_records(recs, 2, (), False, (10_000, 10_500), 10_001)
    for bad in ((1,), [1, 2], (1, "2"), (1, 2**64)):
        with pytest.raises((TypeError, OverflowError)):
            rb.scan_batches(batch, True, True, (), False, bad)


def test_count_records_mismatch_and_bounds(rb):
    data = bytearray(kafka_python_batch(SAMPLE))
    struct.pack_into(">i", data, 57, 4)
    with pytest.raises(Corrupt, match="header says 4"):
        rb.count_records(data, 0, len(data))
    data = kafka_python_batch(SAMPLE)
    with pytest.raises(Corrupt):
        rb.count_records(data + b"\x00", 0, len(data) + 1)  # a trailing byte is no record
    with pytest.raises(Corrupt):
        rb.count_records(data, 0, len(data) - 1)  # the last record is cut
    with pytest.raises(Corrupt):
        rb.count_records(data, 0, 60)
    with pytest.raises(OutOfBounds):
        rb.count_records(data, 1, len(data))
    with pytest.raises(OutOfBounds):
        rb.count_records(data, -1, 10)
    compressed = bytearray(data)
    compressed[22] |= 1
    with pytest.raises(Corrupt, match="compressed"):
        rb.count_records(compressed, 0, len(data))


def test_decode_records_rejects_bad_input(rb):
    rec = rb.encode_record(0, 0, b"k", b"v", [("h", b"x")])
    assert len(rb.decode_records(rec, 1)) == 1
    with pytest.raises(Corrupt):
        rb.decode_records(rec + b"\x00", 1)  # trailing bytes
    with pytest.raises(Corrupt):
        rb.decode_records(rec, 2)  # count too large for the data
    with pytest.raises(Corrupt):
        rb.decode_records(rec, -1)
    with pytest.raises(Corrupt):
        rb.decode_records(rec[:-1], 1)
    with pytest.raises(Corrupt):
        rb.decode_records(b"\xff\xff\xff\xff\xff\x01" + bytes(20), 1)  # 6-byte varint
    bad_utf8 = rb.encode_record(0, 0, None, None, [("h", b"")]).replace(b"\x02h", b"\x02\xff")
    with pytest.raises(Corrupt, match="UTF-8"):
        rb.decode_records(bad_utf8, 1)
    # key length -2 (zigzag 3) is neither null nor a length
    with pytest.raises(Corrupt):
        rb.decode_records(bytes([0x0C, 0, 0, 0, 0x03, 0, 0, 0]), 1)
    assert rb.decode_records(b"", 0) == []


def test_encode_record_extremes_round_trip(rb):
    for od, td in [(0, 0), (-1, -1), (2**31 - 1, 2**63 - 1), (-(2**31), -(2**63))]:
        rec = rb.encode_record(od, td, None, b"", [])
        assert rb.decode_records(rec, 1) == [(0, td, od, None, b"", [])]
    with pytest.raises(OverflowError):
        rb.encode_record(2**31, 0, None, None, [])
    with pytest.raises(OverflowError):
        rb.encode_record(0, 2**63, None, None, [])
    with pytest.raises(TypeError):
        rb.encode_record(0, 0, None, None, [(b"bytes-key", b"")])
    with pytest.raises(TypeError):
        rb.encode_record(0.5, 0, None, None, [])


def test_set_base_offset_keeps_crc_valid(rb):
    data = bytearray(kafka_python_batch(SAMPLE))
    buf = bytearray(7) + data
    rb.set_base_offset(buf, 7, 123456789)
    assert rb.parse_header(buf, 7)[0] == 123456789
    assert rb.scan_batches(memoryview(buf)[7:])[0][0] == 0
    with pytest.raises(OutOfBounds):
        rb.set_base_offset(buf, len(buf) - 60, 1)
    with pytest.raises(OutOfBounds):
        rb.set_base_offset(buf, -1, 1)


def test_set_log_append_time_matches_kafka_semantics(rb):
    data = bytearray(kafka_python_batch(SAMPLE))
    rb.set_log_append_time(data, 0, 1_800_000_000_000)
    h = rb.parse_header(data)
    assert h[5] & 0x08 and h[8] == 1_800_000_000_000 and h[7] == SAMPLE[0][1]
    rb.scan_batches(data)  # CRC recomputed
    batch = DefaultRecordBatch(bytes(data))
    assert batch.timestamp_type == 1
    assert all(r.timestamp == 1_800_000_000_000 for r in batch)
    with pytest.raises(OutOfBounds):
        rb.set_log_append_time(data, len(data) - 60, 1)
    short = bytearray(data[:-1])
    with pytest.raises(Corrupt):
        rb.set_log_append_time(short, 0, 1)


def test_build_batch_range_checks(rb):
    with pytest.raises(OverflowError):
        rb.build_batch(0, 0, 0, b"", 0, 0, attributes=1 << 15)
    with pytest.raises(OverflowError):
        rb.build_batch(1 << 63, 0, 0, b"", 0, 0)
    empty = rb.build_batch(0, 0, 0, b"", 0, 0)
    assert len(empty) == 61 and rb.scan_batches(empty)[0][4] == 0


# --- has_header: the timer's "does any record carry a delay header?" without decoding ----------------------------

DELAY_KEYS = (b"DELAY", b"__STARTDELIVERTIME", b"mqk-delay-ms")


def headers_batch(rb, per_record_headers, base_offset=0):
    records = b"".join(
        rb.encode_record(i, i, b"k%d" % i, b"v" * 100, headers) for i, headers in enumerate(per_record_headers)
    )
    n = len(per_record_headers)
    return bytes(rb.build_batch(base_offset, 0, 0, records, n, max(n - 1, 0)))


def test_has_header_finds_a_named_header_in_any_record_or_position(rb):
    plain = [("trace-id", b"x"), ("DELAYX", b"1"), ("DELA", None)]
    assert rb.has_header(headers_batch(rb, [plain] * 5), 0, len(headers_batch(rb, [plain] * 5)), DELAY_KEYS) is False
    for record in range(5):
        for at in range(len(plain) + 1):
            per = [list(plain) for _ in range(5)]
            per[record].insert(at, ("mqk-delay-ms", b"500"))
            data = headers_batch(rb, per)
            assert rb.has_header(data, 0, len(data), DELAY_KEYS) is True
            assert rb.has_header(data, 0, len(data), (b"mqk-delay-ms",)) is True
            assert rb.has_header(data, 0, len(data), (b"DELAY",)) is False
            assert rb.has_header(data, 0, len(data), ()) is False


def test_has_header_ignores_the_name_in_keys_values_and_header_values(rb):
    records = rb.encode_record(0, 0, b"DELAY", b"mqk-delay-ms", [("h", b"DELAY")]) + rb.encode_record(
        1, 0, b"\x0aDELAY", b"\x18mqk-delay-ms\x02", [("x", b"\x0aDELAY\x02")]
    )
    data = bytes(rb.build_batch(0, 0, 0, records, 2, 1))
    assert rb.has_header(data, 0, len(data), DELAY_KEYS) is False
    assert rb.has_header(data, 0, len(data), (b"h",)) is True


def test_has_header_long_names_empty_batch_and_offset(rb):
    long_name = "n" * 200
    data = headers_batch(rb, [[(long_name, b"")], []])
    assert rb.has_header(data, 0, len(data), (long_name.encode(),)) is True
    assert rb.has_header(data, 0, len(data), (b"n" * 199, b"n" * 201)) is False
    assert rb.has_header(headers_batch(rb, []), 0, 61, DELAY_KEYS) is False
    data = headers_batch(rb, [[("DELAY", b"3")]])
    buf = b"\xff" * 9 + data + b"\xff" * 5
    assert rb.has_header(buf, 9, len(data), DELAY_KEYS) is True
    assert rb.has_header(memoryview(buf)[9 : 9 + len(data)], 0, len(data), DELAY_KEYS) is True
    assert rb.has_header(bytearray(data), 0, len(data), (b"",)) is False
    assert rb.has_header(headers_batch(rb, [[("", None)]]), 0, len(headers_batch(rb, [[("", None)]])), (b"",))


def test_has_header_rejects_malformed_batches_and_bad_names(rb):
    data = headers_batch(rb, [[("DELAY", b"1")], [("a", b"b")]])
    for cut in (1, 5, 20):
        with pytest.raises(Corrupt):
            rb.has_header(data, 0, len(data) - cut, DELAY_KEYS)  # a header found early does not hide the cut
    with pytest.raises(Corrupt):
        rb.has_header(data + b"\x00", 0, len(data) + 1, DELAY_KEYS)
    wrong_count = bytearray(data)
    struct.pack_into(">i", wrong_count, 57, 3)
    with pytest.raises(Corrupt, match="header says 3"):
        rb.has_header(wrong_count, 0, len(data), DELAY_KEYS)
    compressed = bytearray(data)
    compressed[22] |= 2
    with pytest.raises(Corrupt, match="compressed"):
        rb.has_header(compressed, 0, len(data), DELAY_KEYS)
    with pytest.raises(Corrupt):
        rb.has_header(data, 0, 60, DELAY_KEYS)
    with pytest.raises(OutOfBounds):
        rb.has_header(data, 1, len(data), DELAY_KEYS)
    with pytest.raises(OutOfBounds):
        rb.has_header(data, -1, 10, DELAY_KEYS)
    # a header key length (2**20, zigzag 0x80 0x80 0x80 0x01) pointing past its record: refused, not read
    body = b"\x00\x00\x00\x01\x01\x02" + b"\x80\x80\x80\x01" + b"h\x00"
    bad = bytes(rb.build_batch(0, 0, 0, bytes([2 * len(body)]) + body, 1, 0))
    with pytest.raises(Corrupt, match="header key length"):
        rb.has_header(bad, 0, len(bad), DELAY_KEYS)
    for names in (None, [b"DELAY"], ("DELAY",), (b"DELAY", bytearray(b"x")), b"DELAY"):
        with pytest.raises(TypeError):
            rb.has_header(data, 0, len(data), names)


def test_compiled_module_calls_the_crc32c_packages_c_function_directly(rb):
    # Falling back to the Python call stays correct but costs most of a small batch's validation time.
    assert rb.crc32c_direct() is (rb is compiled("recbatch"))


@pytest.mark.parametrize("size", [0, 1, 61, 4095, 32767, 32768, 1 << 20])
def test_crc_of_large_and_small_batches_matches_the_crc32c_package(rb, size):
    # 32 KiB and more releases the GIL around the CRC, below it does not: both paths checked.
    records = [(0, 1_700_000_000_000, None, bytes(range(256)) * (size // 256) + b"x" * (size % 256), [])]
    batch = bytes(our_batch(rb, records))
    assert struct.unpack_from(">I", batch, 17)[0] == crc32c(batch[21:])
    assert rb.scan_batches(batch)[0][1] == len(batch)


def test_crc32c_native_address_refuses_what_is_not_the_package():
    from mqk._fast import crc32c_native_address

    assert crc32c_native_address(lambda data: 0) == 0


def test_crc32c_native_address_is_0_for_a_library_not_loaded_or_without_get_state(tmp_path):
    # the two ways ctypes fails there (OSError, AttributeError) mean "call the package's Python function"; nothing
    # else is caught, so a bug in the look-up raises at the first CRC instead of silently slowing every batch
    import types

    from mqk._fast import crc32c_native_address

    def with_module(path):
        fake = types.ModuleType("fake_crc32c")
        fake.__file__ = str(path)
        return types.MethodType(lambda self, data: 0, fake)

    assert crc32c_native_address(with_module(tmp_path / "not-loaded.so")) == 0
    assert crc32c_native_address(with_module("libc.so.6")) == 0  # loaded, but exports no get_state
    assert crc32c_native_address(crc32c) != 0  # the package itself
