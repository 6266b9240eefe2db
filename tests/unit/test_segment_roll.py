"""Kafka's roll rules as the compactor applies them to a shard's batches (mqk.services.compaction
`active_segment_start`): a batch starts a new segment when the current one plus the batch would exceed
segment.bytes, or when it comes more than segment.ms after the segment's first batch."""

from __future__ import annotations

from mqk.services.compaction import active_segment_start
from mqk.store.adapter import BatchInfo


def infos(*batches: tuple[int, int]) -> list[BatchInfo]:
    """(size, timestamp) per batch, one offset each."""
    return [BatchInfo(i, i + 1, size, ts) for i, (size, ts) in enumerate(batches)]


def test_time_rolls_only_past_segment_ms_from_the_segments_first_batch() -> None:
    quiet = infos((10, 1000), (10, 1150), (10, 1200))
    assert active_segment_start(quiet, 1 << 30, 200) == 0  # 200 ms after the first: not more than segment.ms
    rolled = infos((10, 1000), (10, 1150), (10, 1201), (10, 1300), (10, 1402))
    # 1201 starts a segment (201 ms after 1000); 1402 starts the next (201 ms after 1201), not measured from 1300
    assert active_segment_start(rolled, 1 << 30, 200) == 4


def test_size_rolls_when_the_batch_would_not_fit() -> None:
    batches = infos((60, 0), (40, 0), (1, 0), (100, 0), (100, 0))
    assert active_segment_start(batches, 100, 1 << 62) == 4  # [60, 40] [1] ... : 1 + 100 > 100 rolls again
    assert active_segment_start(infos((500, 0)), 100, 1) == 0  # one batch larger than a segment is its own
