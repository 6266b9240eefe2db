"""The cleaner's rewrite of a compressed batch keeps the batch's codec (as Kafka's cleaner does), so a topic whose
compression.type names a codec stays in it after compaction."""

from __future__ import annotations

import pytest

from mqk._fast import load
from mqk.protocol.kafka import records as R
from mqk.services.compaction import CleanStats, OffsetMap, filter_batches, key_digest
from mqk.store.adapter import StoredBatch

recbatch = load("recbatch")


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_a_rewritten_batch_keeps_its_codec_and_its_retained_records(codec: int) -> None:
    records = b"".join(recbatch.encode_record(i, i, b"k%d" % (i % 2), b"v%d" % i, []) for i in range(4))
    section = R.compress(codec, records) if codec else records
    batch = bytes(recbatch.build_batch(10, 1000, 1003, section, 4, 3, codec, 5, 0, 0, 2))
    offsets = OffsetMap(1 << 20)
    offsets.put(key_digest(b"k0"), 12)  # the latest of each key: offsets 12 and 13 stay, 10 and 11 go
    offsets.put(key_digest(b"k1"), 13)
    (rewritten,) = filter_batches([StoredBatch(10, 4, batch)], offsets, 0, {}, CleanStats())
    header = recbatch.parse_header(rewritten, 0)
    assert header[5] & 0x07 == codec and header[12] == 2
    assert [(r[2], r[4]) for r in R.batch_records(rewritten)] == [(2, b"v2"), (3, b"v3")]
    # its CRC holds (a rewritten batch spans more offsets than it holds records: no Produce would take it, a
    # Fetch serves it)
    ((_pos, _size, last_delta, _max_ts, count, attributes, *_rest),) = recbatch.scan_batches(
        memoryview(rewritten), True
    )
    assert (count, last_delta, attributes & 0x07) == (2, 3, codec)
