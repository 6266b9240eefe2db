"""Produce-side record handling: codecs (incl. raw and xerial snappy), bounded decompression, batch validation
(CRC, size, record counts, compressed counts) and legacy message-set conversion."""

from __future__ import annotations

import contextlib
import gzip
import os
import struct
import warnings

import cramjam
import pytest

from mqk._fast import load
from mqk.errors import Corrupt, InvalidRecord, MessageTooLarge, UnsupportedCompressionTypeError, kafka_code_for
from mqk.protocol.kafka import records as R

recbatch = load("recbatch")


def build(n=5, codec=R.NONE, value=b"v" * 50, base_ts=1000, count_override=None, **kw) -> bytes:
    recs = b"".join(recbatch.encode_record(i, i, b"k%d" % i, value, [("h", b"x")]) for i in range(n))
    attrs = codec
    if codec != R.NONE:
        recs = R.compress(codec, recs)
    count = n if count_override is None else count_override
    return bytes(recbatch.build_batch(0, base_ts, base_ts + n - 1, recs, count, n - 1, attrs, **kw))


PAYLOAD = os.urandom(2000) * 20


@pytest.mark.parametrize("codec", [R.GZIP, R.SNAPPY, R.LZ4, R.ZSTD])
def test_compress_roundtrip(codec):
    assert R.decompress(codec, R.compress(codec, PAYLOAD)) == PAYLOAD
    assert R.decompress(codec, R.compress(codec, b"")) == b""


def test_snappy_raw_and_xerial_inputs():
    raw = bytes(cramjam.snappy.compress_raw(PAYLOAD))
    assert R.decompress(R.SNAPPY, raw) == PAYLOAD
    framed = R.compress(R.SNAPPY, PAYLOAD)
    assert framed.startswith(b"\x82SNAPPY\x00") and R.decompress(R.SNAPPY, framed) == PAYLOAD


def test_gzip_accepts_concatenated_members():
    assert R.decompress(R.GZIP, gzip.compress(b"ab") + gzip.compress(b"cd")) == b"abcd"


@pytest.mark.parametrize("codec", [R.GZIP, R.SNAPPY, R.LZ4, R.ZSTD])
def test_decompression_is_bounded(codec):
    bomb = R.compress(codec, b"\x00" * (8 << 20))  # 8 MiB of zeros: a few KiB compressed
    assert len(bomb) < 1 << 20
    with pytest.raises(MessageTooLarge):
        R.decompress(codec, bomb, max_size=1 << 20)
    assert len(R.decompress(codec, bomb, max_size=8 << 20)) == 8 << 20


@pytest.mark.parametrize("codec", [R.GZIP, R.SNAPPY, R.LZ4, R.ZSTD])
def test_garbage_compressed_data_is_corrupt(codec):
    with pytest.raises(Corrupt):
        R.decompress(codec, b"\x82SNAPPY\x00garbage-garbage" if codec == R.SNAPPY else b"not compressed at all")
    truncated = R.compress(codec, PAYLOAD)[:-7]
    with pytest.raises(Corrupt):
        R.decompress(codec, truncated)


def test_unknown_codec():
    with pytest.raises(UnsupportedCompressionTypeError):
        R.decompress(5, b"x")
    with pytest.raises(UnsupportedCompressionTypeError):
        R.validate_produce_records(
            build(codec=R.NONE, n=1)[:21] + b"\x00\x05" + build(n=1)[23:], 1 << 20, verify_crc=False
        )


@pytest.mark.parametrize("codec", [R.NONE, R.GZIP, R.SNAPPY, R.LZ4, R.ZSTD])
def test_validate_valid_batches(codec):
    data = build(7, codec) + build(3, codec, base_ts=5000)
    infos = R.validate_produce_records(data, 1 << 20)
    assert [i.record_count for i in infos] == [7, 3]
    assert all(i.compression == codec for i in infos)
    assert infos[0].data.obj is data or bytes(infos[0].data) == data[: infos[0].size]  # a view, no copy
    assert bytes(infos[0].data) + bytes(infos[1].data) == data
    assert infos[1].base_timestamp == 5000 and infos[1].max_timestamp == 5002
    assert [r[3] for r in R.batch_records(infos[0])] == [b"k%d" % i for i in range(7)]


def test_crc_error_is_corrupt():
    data = bytearray(build(3))
    data[-1] ^= 0xFF
    with pytest.raises(Corrupt) as e:
        R.validate_produce_records(bytes(data), 1 << 20)
    assert kafka_code_for(e.value) == 2  # CORRUPT_MESSAGE


def test_oversize_batch():
    data = build(20)
    with pytest.raises(MessageTooLarge) as e:
        R.validate_produce_records(data, len(data) - 1)
    assert kafka_code_for(e.value) == 10
    assert R.validate_produce_records(data, len(data))[0].size == len(data)


def test_record_count_mismatch_uncompressed_and_compressed():
    with pytest.raises(Corrupt):
        R.validate_produce_records(build(4, count_override=5), 1 << 20)
    for codec in (R.GZIP, R.ZSTD):
        with pytest.raises(Corrupt):
            R.validate_produce_records(build(4, codec, count_override=3), 1 << 20)
        with pytest.raises(Corrupt):
            R.validate_produce_records(build(4, codec, count_override=6), 1 << 20)


@pytest.mark.parametrize("codec", [R.NONE, R.GZIP, R.SNAPPY, R.LZ4, R.ZSTD])
def test_malformed_records_under_a_valid_crc_are_corrupt(codec):
    """A client bug Kafka's LogValidator catches: every length adds up and the CRC matches, but a record's fields
    do not parse (here a header with a null key, which a consumer's decoder refuses)."""
    good = recbatch.encode_record(0, 0, b"k", b"v", [("h", b"x")])
    body = b"\x00\x02\x02\x02k\x02v\x02\x01"  # attributes, deltas, key, value, 1 header whose key length is -1
    recs = good + bytes([2 * len(body)]) + body
    attrs = codec
    if codec != R.NONE:
        recs = R.compress(codec, recs)
    data = bytes(recbatch.build_batch(0, 1000, 1001, recs, 2, 1, attrs))
    with pytest.raises(Corrupt, match="header key length") as e:
        R.validate_produce_records(data, 1 << 20)
    assert kafka_code_for(e.value) == 2  # CORRUPT_MESSAGE


@pytest.mark.parametrize("codec", [R.NONE, R.GZIP, R.SNAPPY, R.LZ4, R.ZSTD])
def test_the_check_says_which_batches_carry_a_named_header(codec):
    from mqk.timer.delay import DELAY_HEADER_KEYS

    def batch(headers):
        recs = b"".join(recbatch.encode_record(i, i, None, b"v", h) for i, h in enumerate(headers))
        if codec != R.NONE:
            recs = R.compress(codec, recs)
        return bytes(recbatch.build_batch(0, 0, 0, recs, len(headers), len(headers) - 1, codec))

    data = batch([[("trace", b"1")], [("mqk-delay-ms", b"5")]]) + batch([[("trace", b"1")], []])
    assert [i.named_header for i in R.validate_produce_records(data, 1 << 20, header_names=DELAY_HEADER_KEYS)] == [
        True,
        False,
    ]
    assert [i.named_header for i in R.validate_produce_records(data, 1 << 20)] == [False, False]


@pytest.mark.parametrize("codec", [R.NONE, R.GZIP, R.SNAPPY, R.LZ4, R.ZSTD])
def test_a_compacted_topic_needs_a_key_on_every_record(codec):
    recs = recbatch.encode_record(0, 0, b"k", b"v", []) + recbatch.encode_record(1, 0, None, b"v", [])
    if codec != R.NONE:
        recs = R.compress(codec, recs)
    data = bytes(recbatch.build_batch(0, 0, 0, recs, 2, 1, codec))
    assert len(R.validate_produce_records(data, 1 << 20)) == 1
    with pytest.raises(InvalidRecord, match="needs a key") as e:
        R.validate_produce_records(data, 1 << 20, require_keys=True)
    assert kafka_code_for(e.value) == 87  # INVALID_RECORD
    keyed = bytes(recbatch.build_batch(0, 0, 0, recbatch.encode_record(0, 0, b"k", b"v", []), 1, 0))
    assert R.validate_produce_records(keyed, 1 << 20, require_keys=True)[0].record_count == 1


@pytest.mark.parametrize("codec", [R.NONE, R.GZIP, R.SNAPPY, R.LZ4, R.ZSTD])
def test_create_times_outside_the_window_are_invalid_timestamps(codec):
    from mqk.errors import InvalidTimestamp

    data = build(4, codec, base_ts=50_000)  # records at 50,000 .. 50,003
    assert len(R.validate_produce_records(data, 1 << 20, timestamps=(50_000, 50_003))) == 1
    for window in ((50_001, 60_000), (0, 50_002)):
        with pytest.raises(InvalidTimestamp) as e:
            R.validate_produce_records(data, 1 << 20, timestamps=window)
        assert kafka_code_for(e.value) == 32  # INVALID_TIMESTAMP


def test_compressed_bomb_in_a_batch_is_refused():
    recs = R.compress(R.ZSTD, b"\x00" * (4 << 20))
    data = bytes(recbatch.build_batch(0, 0, 0, recs, 1, 0, R.ZSTD))
    with pytest.raises(MessageTooLarge):
        R.validate_produce_records(data, 1 << 20, max_decompressed_bytes=1 << 20)


def test_empty_and_truncated():
    with pytest.raises(InvalidRecord):
        R.validate_produce_records(b"", 100)
    with pytest.raises(Corrupt):
        R.validate_produce_records(build(3)[:-5], 1 << 20)
    # a batch whose record count is not its offset range, as Kafka refuses one (an empty batch, as compaction
    # leaves, included): stores take those, a Produce does not
    with pytest.raises(InvalidRecord):
        R.validate_produce_records(bytes(recbatch.build_batch(0, 0, 0, b"", 0, 9)), 1 << 20)
    record = recbatch.encode_record(0, 0, None, b"v", [])
    with pytest.raises(InvalidRecord):
        R.validate_produce_records(bytes(recbatch.build_batch(0, 0, 0, bytes(record), 1, 4)), 1 << 20)


def test_random_garbage_raises_typed_errors_only():
    import random

    from mqk.errors import MqkError

    rng = random.Random(7)
    good = build(3, R.GZIP)
    for _ in range(500):
        data = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.getrandbits(8)
        with contextlib.suppress(MqkError):
            R.validate_produce_records(bytes(data), 1 << 20, verify_crc=rng.random() < 0.5)


# --- legacy message sets -------------------------------------------------------------------------------


def _legacy(magic, codec, n=6):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.record.legacy_records import LegacyRecordBatchBuilder
    b = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=2000 + i if magic else None, key=b"k%d" % i if i % 2 else None, value=b"v%d" % i)
    return bytes(b.build())


@pytest.mark.parametrize("magic,codec", [(0, 0), (0, 1), (1, 0), (1, 1), (1, 3)])
def test_legacy_message_sets_are_converted_to_v2(magic, codec):
    info = R.validate_produce_records(_legacy(magic, codec), 1 << 20)[0]
    assert info.converted and info.record_count == 6 and info.compression == R.NONE
    assert recbatch.scan_batches(info.data)[0][4] == 6  # a valid v2 batch with a good CRC
    recs = R.batch_records(info)
    assert [(r[3], r[4]) for r in recs] == [(b"k%d" % i if i % 2 else None, b"v%d" % i) for i in range(6)]
    if magic == 1:
        assert info.base_timestamp == 2000 and info.max_timestamp == 2005
        assert [info.base_timestamp + r[1] for r in recs] == [2000 + i for i in range(6)]
    else:
        assert info.base_timestamp == -1


def test_legacy_keyless_messages_are_refused_by_a_compacted_topic():
    with pytest.raises(InvalidRecord, match="needs a key"):
        R.validate_produce_records(_legacy(1, 0), 1 << 20, require_keys=True)  # every other message has no key


def test_legacy_create_times_are_held_to_the_window_too():
    from mqk.errors import InvalidTimestamp

    assert R.validate_produce_records(_legacy(1, 0), 1 << 20, timestamps=(2000, 2005))[0].record_count == 6
    with pytest.raises(InvalidTimestamp):
        R.validate_produce_records(_legacy(1, 0), 1 << 20, timestamps=(2000, 2004))
    # magic 0 carries no timestamps (-1): nothing to hold
    assert R.validate_produce_records(_legacy(0, 0), 1 << 20, timestamps=(2000, 2004))[0].record_count == 6


def test_legacy_crc_checked():
    data = bytearray(_legacy(1, 0))
    data[-1] ^= 1
    with pytest.raises(Corrupt):
        R.validate_produce_records(bytes(data), 1 << 20)


def test_legacy_converted_size_limit():
    data = _legacy(1, 0, n=50)
    with pytest.raises(MessageTooLarge):
        R.validate_produce_records(data, 200)


def test_legacy_truncated():
    data = _legacy(1, 0)
    with pytest.raises(Corrupt):
        R.validate_produce_records(data[:-3], 1 << 20)
    with pytest.raises(Corrupt):
        R.validate_produce_records(data + struct.pack(">q", 1), 1 << 20)


@pytest.mark.parametrize("source", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("target", [0, 1, 2, 3, 4])
def test_recompress_keeps_every_header_field_but_the_codec_and_the_records_read_the_same(source, target):
    records = b"".join(recbatch.encode_record(i, i * 3, b"k%d" % i, b"v%d" % i * 20, [("h", b"x")]) for i in range(5))
    section = records if source == 0 else R.compress(source, records)
    batch = recbatch.build_batch(7, 1000, 1012, section, 5, 4, source, 42, 3, 17, 9)
    (info,) = R.validate_produce_records(memoryview(batch), 1 << 20)
    again = R.recompress(info, target)
    if source == target:
        assert again is info
    header, before = recbatch.parse_header(again.data, 0), recbatch.parse_header(batch, 0)
    assert header[5] & 0x07 == target and again.compression == target and again.size == len(again.data)
    # base offset, leader epoch, last offset delta, timestamps, producer id / epoch / sequence, count: unchanged
    for field in (0, 2, 6, 7, 8, 9, 10, 11, 12):
        assert header[field] == before[field]
    assert R.batch_records(again) == R.batch_records(info)
    assert R.validate_produce_records(again.data, 1 << 20)[0].compression == target  # a valid batch (CRC)
