"""Batch helpers of mqk.store.memory (shared by the memory, rocksdb and file engines): preparation, record times,
bounded decompression."""

from __future__ import annotations

import gzip

import pytest

import mqk.store.batches as batches
from mqk._fast import twin
from mqk.errors import Corrupt, InvalidRecord

rb = twin("recbatch")


def _gzip_batch(records: bytes, count: int, timestamps: tuple[int, int]) -> bytes:
    return bytes(
        rb.build_batch(0, timestamps[0], timestamps[1], gzip.compress(records), count, count - 1, attributes=1)
    )


def test_prepare_batches_sets_offsets_without_touching_the_input() -> None:
    record = rb.encode_record(0, 0, None, b"v", [])
    original = rb.build_batch(0, 10, 10, record, 1, 0)
    frozen = bytes(original)
    prepared = batches.prepare_batches([original, original], 40, None)
    assert [p.base_offset for p in prepared] == [40, 41]
    assert rb.parse_header(prepared[1].data, 0)[0] == 41
    assert bytes(original) == frozen
    stamped = batches.prepare_batches([original], 0, 5_000)[0]
    assert stamped.max_timestamp == 5_000 and rb.parse_header(stamped.data, 0)[5] & 0x08
    rb.scan_batches(stamped.data, True)
    with pytest.raises(InvalidRecord):
        batches.prepare_batches([], 0, None)
    with pytest.raises(InvalidRecord):  # input, not stored bytes: every engine says InvalidRecord
        batches.prepare_batches([frozen[:-1]], 0, None)


def test_record_times_of_compressed_and_log_append_time_batches() -> None:
    records = b"".join(rb.encode_record(i, ts, None, b"x", []) for i, ts in enumerate((0, 7, 3)))
    batch = _gzip_batch(records, 3, (100, 107))
    assert batches.record_times(batch) == [(0, 100), (1, 107), (2, 103)]
    assert batches.first_record_at_or_after(batch, 104, 0) == (1, 107)
    assert batches.first_record_at_or_after(batch, 101, 2) == (2, 103)
    assert batches.first_record_at_or_after(batch, 108, 0) is None
    stamped = batches.prepare_batches([batch], 0, 9_000)[0]
    assert batches.record_times(stamped.data) == [(0, 9_000), (1, 9_000), (2, 9_000)]


def test_decompression_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    records = b"".join(rb.encode_record(i, i, None, b"z" * 5_000, []) for i in range(20))
    batch = _gzip_batch(records, 20, (100, 119))  # ~100 KB of records in a few hundred bytes
    assert len(batches.record_times(batch)) == 20
    monkeypatch.setattr(batches, "MAX_DECOMPRESSED_BYTES", 10_000)
    with pytest.raises(Corrupt):
        batches.decompress(1, batch[rb.HEADER_SIZE :])
    # beyond the bound the lookup still answers, at batch granularity, instead of allocating
    assert batches.record_times(batch) is None
    assert batches.first_record_at_or_after(batch, 105, 3) == (3, 119)


def test_garbage_records_fall_back_to_the_batch() -> None:
    batch = bytes(rb.build_batch(0, 100, 150, b"\x7f" * 30, 2, 1))
    assert batches.record_times(batch) is None
    assert batches.first_record_at_or_after(batch, 120, 0) == (0, 150)
    with pytest.raises(Corrupt):
        batches.decompress(6, b"")
