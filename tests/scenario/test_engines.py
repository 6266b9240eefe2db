"""The StorageAdapter contract, written once and run against every engine (memory, rocksdb, file)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers import Harness, header_of, kafka_python_batch, rb, records_of, snappy_twin_batch, twin_batch

from mqk.config import TopicConfig
from mqk.errors import (
    InvalidPartitionsError,
    InvalidRecord,
    InvalidShardCount,
    InvalidShardName,
    InvalidTopicError,
    OffsetOutOfRange,
    StorageError,
    UnknownShard,
    kafka_code_for,
)
from mqk.store.adapter import MAX_SHARD_COUNT, GroupOffset

T = "orders"


async def _topic(h: Harness, queues: int = 1, topic: str = T) -> None:
    assert h.engine is not None
    await h.engine.create_shards(topic, queues, TopicConfig())


async def _read_all(
    h: Harness, queue: int = 0, offset: int | None = None, max_bytes: int = 1 << 30, topic: str = T
) -> list[tuple[int, int, bytes | None]]:
    """Every record from `offset` (default: log start) to the end, reading batch by batch."""
    engine = h.engine
    assert engine is not None
    offset = engine.log_start_offset(topic, queue) if offset is None else offset
    out = []
    while offset < engine.end_offset(topic, queue):
        result = await engine.read(topic, queue, offset, max_bytes)
        assert result.batches, f"no batch at {offset} below end {result.end_offset}"
        for batch in result.batches:
            out.extend(records_of(batch.data))
        offset = result.next_offset
    return out


# --- ordering, offsets, base offsets ---------------------------------------------------------------------


async def test_append_assigns_consecutive_offsets_and_sets_base_offsets(harness: Harness) -> None:
    await _topic(harness)
    engine = harness.engine
    sizes = [1, 3, 2, 5, 1]
    expected_values = []
    next_offset = 0
    for n, size in enumerate(sizes):
        values = [b"b%d-r%d" % (n, i) for i in range(size)]
        expected_values.extend(values)
        result = await engine.append(T, 0, [twin_batch(values)])
        assert (result.base_offset, result.last_offset) == (next_offset, next_offset + size - 1)
        next_offset += size
    assert engine.end_offset(T, 0) == next_offset == sum(sizes)
    assert engine.log_start_offset(T, 0) == 0

    result = await engine.read(T, 0, 0, 1 << 20)
    assert [b.base_offset for b in result.batches] == [0, 1, 4, 6, 11]
    assert [b.record_count for b in result.batches] == sizes
    for batch in result.batches:
        assert header_of(batch.data)[0] == batch.base_offset  # the base offset is set inside the bytes
        rb.scan_batches(bytes(batch.data), True)  # and the CRC still holds
    records = await _read_all(harness)
    assert [r[0] for r in records] == list(range(sum(sizes)))
    assert [r[2] for r in records] == expected_values


async def test_several_batches_in_one_append(harness: Harness) -> None:
    await _topic(harness)
    batches = [twin_batch([b"a", b"b"]), twin_batch([b"c"]), twin_batch([b"d", b"e", b"f"])]
    result = await harness.engine.append(T, 0, batches)
    assert (result.base_offset, result.last_offset) == (0, 5)
    assert [r[2] for r in await _read_all(harness)] == [b"a", b"b", b"c", b"d", b"e", b"f"]
    # the caller's buffers are not modified (the engine stamps its own copy)
    assert header_of(batches[2])[0] == 0


async def test_queues_and_topics_are_independent(harness: Harness) -> None:
    await _topic(harness, queues=3)
    await _topic(harness, queues=1, topic="other")
    engine = harness.engine
    for q, count in ((0, 2), (1, 5), (2, 1)):
        for i in range(count):
            await engine.append(T, q, [twin_batch([b"q%d-%d" % (q, i)])])
    await engine.append("other", 0, [twin_batch([b"x", b"y"])])
    assert [engine.end_offset(T, q) for q in range(3)] == [2, 5, 1]
    assert engine.end_offset("other", 0) == 2
    assert [r[2] for r in await _read_all(harness, 1)] == [b"q1-%d" % i for i in range(5)]
    assert engine.list_shards() == {T: 3, "other": 1}


async def test_append_many_answers_each_entry_as_its_own_append(harness: Harness) -> None:
    await _topic(harness, queues=3)
    engine = harness.engine
    good = twin_batch([b"ok"])
    results = await engine.append_many(
        T,
        [
            (0, [twin_batch([b"a", b"b"])]),
            (2, [twin_batch([b"c"]), twin_batch([b"d"])]),
            (7, [twin_batch([b"nowhere"])]),  # no such queue
            (0, [bytes(good[:40])]),  # not a batch: refused, nothing of it appended
            (0, [twin_batch([b"e"])]),  # the same queue again, after the first entry
        ],
    )
    assert [(r.base_offset, r.last_offset) for r in (results[0], results[1], results[4])] == [(0, 1), (0, 1), (2, 2)]
    assert isinstance(results[2], UnknownShard)
    assert isinstance(results[3], InvalidRecord)
    assert [engine.end_offset(T, q) for q in range(3)] == [3, 0, 2]
    assert [r[2] for r in await _read_all(harness, 0)] == [b"a", b"b", b"e"]
    assert [r[2] for r in await _read_all(harness, 2)] == [b"c", b"d"]
    assert await engine.append_many(T, []) == []


async def test_kafka_python_built_batches_round_trip(harness: Harness) -> None:
    await _topic(harness)
    engine = harness.engine
    sent = []
    for n in range(4):
        values = [b"kp-%d-%d" % (n, i) * 10 for i in range(7)]
        sent.extend(values)
        await engine.append(T, 0, [kafka_python_batch(values, [5_000 + n * 100 + i for i in range(7)], n % 2)])
    records = await _read_all(harness)
    assert [r[0] for r in records] == list(range(28))
    assert [r[2] for r in records] == sent


async def test_read_inside_a_batch_returns_the_whole_batch(harness: Harness) -> None:
    await _topic(harness)
    engine = harness.engine
    await engine.append(T, 0, [twin_batch([b"a", b"b", b"c"])])
    await engine.append(T, 0, [twin_batch([b"d", b"e"])])
    result = await engine.read(T, 0, 4, 1 << 20)
    assert [b.base_offset for b in result.batches] == [3]
    result = await engine.read(T, 0, 1, 1 << 20)
    assert [b.base_offset for b in result.batches] == [0, 3]
    assert result.next_offset == 5 and result.end_offset == 5 and result.log_start_offset == 0


async def test_read_at_end_is_empty_and_beyond_is_out_of_range(harness: Harness) -> None:
    await _topic(harness)
    engine = harness.engine
    assert (await engine.read(T, 0, 0, 100)).batches == []
    await engine.append(T, 0, [twin_batch([b"a", b"b"])])
    result = await engine.read(T, 0, 2, 100)
    assert result.batches == [] and result.end_offset == 2
    with pytest.raises(OffsetOutOfRange):
        await engine.read(T, 0, 3, 100)
    with pytest.raises(OffsetOutOfRange):
        await engine.read(T, 0, -1, 100)


async def test_max_bytes_gives_whole_batches_and_always_the_first(harness: Harness) -> None:
    await _topic(harness)
    engine = harness.engine
    for _ in range(6):
        await engine.append(T, 0, [twin_batch([b"v" * 200, b"w" * 100])])
    sizes = [len(b.data) for b in (await engine.read(T, 0, 0, 1 << 20)).batches]
    assert len(sizes) == 6
    one = await engine.read(T, 0, 0, 1)
    assert len(one.batches) == 1 and len(one.batches[0].data) == sizes[0]  # never a partial batch
    two = await engine.read(T, 0, 0, sizes[0] + sizes[1])
    assert [b.base_offset for b in two.batches] == [0, 2]
    almost_three = await engine.read(T, 0, 0, sizes[0] + sizes[1] + sizes[2] - 1)
    assert len(almost_three.batches) == 2
    zero = await engine.read(T, 0, 4, 0)
    assert [b.base_offset for b in zero.batches] == [4]


async def test_reads_across_segment_boundaries(harness: Harness) -> None:
    """~300 KB in 700-byte batches: with the file engine's 4 KiB segments that is dozens of segment rolls."""
    await _topic(harness, queues=2)
    engine = harness.engine
    expected = {0: [], 1: []}
    for i in range(400):
        q = i % 2
        values = [b"%05d-" % i + bytes([65 + i % 26]) * (300 + i % 37), b"%05d-tail" % i]
        expected[q].extend(values)
        await engine.append(T, q, [twin_batch(values, base_timestamp=10_000 + i)])
    for q in (0, 1):
        small = await _read_all(harness, q, max_bytes=900)
        assert [r[2] for r in small] == expected[q]
        assert [r[0] for r in small] == list(range(len(expected[q])))
        whole = await engine.read(T, q, 0, 1 << 30)
        assert sum(b.record_count for b in whole.batches) == len(expected[q])
    # a read that starts in the middle of the log, inside a batch
    middle = await engine.read(T, 1, 201, 2_000)
    assert middle.batches[0].base_offset == 200


async def test_bad_batches_are_refused_without_side_effects(harness: Harness) -> None:
    await _topic(harness)
    engine = harness.engine
    good = twin_batch([b"ok"])
    await engine.append(T, 0, [good])
    # every engine answers input that is not a record batch it can store with the same typed error
    with pytest.raises(InvalidRecord):
        await engine.append(T, 0, [bytes(good[:40])])  # shorter than a header
    with pytest.raises(InvalidRecord):
        await engine.append(T, 0, [bytes(good) + b"\x00\x00"])  # length field disagrees with the buffer
    with pytest.raises(InvalidRecord):
        await engine.append(T, 0, [good, bytes(good[:-1])])  # second batch truncated: nothing appended
    with pytest.raises(InvalidRecord):
        await engine.append(T, 0, [])  # no batch at all
    assert engine.end_offset(T, 0) == 1
    assert [r[2] for r in await _read_all(harness)] == [b"ok"]


async def test_unknown_shards_are_typed_errors(harness: Harness) -> None:
    await _topic(harness, queues=2)
    engine = harness.engine
    with pytest.raises(UnknownShard):
        await engine.append("nope", 0, [twin_batch([b"x"])])
    with pytest.raises(UnknownShard):
        await engine.append(T, 2, [twin_batch([b"x"])])
    with pytest.raises(UnknownShard):
        await engine.read(T, 5, 0, 10)
    with pytest.raises(UnknownShard):
        engine.end_offset("nope", 0)
    with pytest.raises(UnknownShard):
        await engine.offset_for_timestamp(T, -1, 0)


async def test_every_engine_raises_the_same_error_for_the_same_fault(harness: Harness) -> None:
    """Storage errors are protocol-neutral and alike across engines: the front doors map each one to their own
    code in one place (mqk.errors), whatever engine a topic lives on."""
    engine = harness.engine
    for count in (0, -1, MAX_SHARD_COUNT + 1):
        with pytest.raises(InvalidShardCount):
            await engine.create_shards(T, count, TopicConfig())
    assert T not in engine.list_shards()
    await _topic(harness, queues=2)
    with pytest.raises(InvalidShardCount):
        await engine.create_shards(T, MAX_SHARD_COUNT + 1, TopicConfig())
    assert engine.list_shards() == {T: 2}
    with pytest.raises(UnknownShard):
        await engine.delete_shards("nope")
    await engine.append(T, 0, [twin_batch([b"x"])])
    with pytest.raises(OffsetOutOfRange):
        await engine.read(T, 0, 2, 100)
    with pytest.raises(OffsetOutOfRange):
        await engine.delete_before(T, 0, 5)
    assert kafka_code_for(InvalidShardCount("x")) == InvalidPartitionsError.code
    assert kafka_code_for(InvalidShardName("x")) == InvalidTopicError.code


async def test_create_more_queues_and_delete_topic(harness: Harness) -> None:
    await _topic(harness, queues=1)
    engine = harness.engine
    await engine.append(T, 0, [twin_batch([b"keep"])])
    await engine.create_shards(T, 3, TopicConfig())
    assert engine.list_shards() == {T: 3}
    assert engine.end_offset(T, 0) == 1 and engine.end_offset(T, 2) == 0
    await engine.append(T, 2, [twin_batch([b"new"])])
    await engine.delete_shards(T)
    assert T not in engine.list_shards()
    with pytest.raises(UnknownShard):
        await engine.read(T, 0, 0, 10)
    await engine.create_shards(T, 1, TopicConfig())  # a new topic of the same name starts empty
    assert engine.end_offset(T, 0) == 0


# --- timestamps ------------------------------------------------------------------------------------------


async def test_offset_for_timestamp_with_record_level_refinement(harness: Harness) -> None:
    await _topic(harness)
    engine = harness.engine
    # batch 0: offsets 0-3 at 100,110,120,130; batch 1: 4-6 at 200,205,210; batch 2: 7-8 at 150,160 (older!)
    await engine.append(T, 0, [twin_batch([b"a"] * 4, timestamps=[100, 110, 120, 130])])
    await engine.append(T, 0, [twin_batch([b"b"] * 3, timestamps=[200, 205, 210])])
    await engine.append(T, 0, [twin_batch([b"c"] * 2, timestamps=[150, 160])])
    await engine.append(T, 0, [twin_batch([b"d"] * 2, timestamps=[300, 290])])
    lookup = engine.offset_for_timestamp
    assert await lookup(T, 0, 0) == (0, 100)
    assert await lookup(T, 0, 100) == (0, 100)
    assert await lookup(T, 0, 111) == (2, 120)  # inside the first batch
    assert await lookup(T, 0, 131) == (4, 200)  # first record at or after: batch 1, not the older batch 2
    assert await lookup(T, 0, 206) == (6, 210)
    assert await lookup(T, 0, 211) == (9, 300)
    assert await lookup(T, 0, 295) == (9, 300)
    assert await lookup(T, 0, 301) is None
    assert await engine.max_timestamp(T, 0) == (9, 300)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "snappy-xerial", "lz4", "zstd"])
async def test_offset_for_timestamp_on_compressed_batches(harness: Harness, codec: str) -> None:
    await _topic(harness)
    engine = harness.engine

    def build(values: list[bytes], timestamps: list[int]) -> bytes:
        if codec.startswith("snappy"):
            return snappy_twin_batch(values, timestamps, xerial=codec == "snappy-xerial")
        return kafka_python_batch(values, timestamps, {"gzip": 1, "lz4": 3, "zstd": 4}[codec])

    await engine.append(T, 0, [build([b"x" * 50] * 5, [1000, 1010, 1020, 1030, 1040])])
    await engine.append(T, 0, [build([b"y" * 50] * 5, [2000, 2010, 2020, 2030, 2040])])
    assert header_of((await engine.read(T, 0, 0, 1)).batches[0].data)[5] & 0x07 != 0
    assert await engine.offset_for_timestamp(T, 0, 1015) == (2, 1020)
    assert await engine.offset_for_timestamp(T, 0, 2040) == (9, 2040)
    assert await engine.offset_for_timestamp(T, 0, 2041) is None


async def test_empty_shard_has_no_timestamps(harness: Harness) -> None:
    await _topic(harness)
    assert await harness.engine.offset_for_timestamp(T, 0, -1) is None
    assert await harness.engine.max_timestamp(T, 0) is None


async def test_log_append_time_stamps_the_batch(harness: Harness) -> None:
    await _topic(harness)
    engine = harness.engine
    result = await engine.append(T, 0, [twin_batch([b"a", b"b"], timestamps=[5, 6])], log_append_time=True)
    assert result.log_append_time > 1_600_000_000_000
    batch = (await engine.read(T, 0, 0, 1 << 20)).batches[0]
    header = header_of(batch.data)
    assert header[5] & 0x08  # timestamp type: LogAppendTime
    assert header[8] == result.log_append_time
    rb.scan_batches(bytes(batch.data), True)
    assert await engine.offset_for_timestamp(T, 0, 7) == (0, result.log_append_time)


# --- delete-before and log start -------------------------------------------------------------------------


async def test_delete_before_moves_the_log_start(harness: Harness) -> None:
    await _topic(harness)
    engine = harness.engine
    for i in range(5):  # offsets 3i .. 3i+2 at timestamps 100i ..
        await engine.append(T, 0, [twin_batch([b"%d-%d" % (i, j) for j in range(3)], base_timestamp=100 * i)])
    assert await engine.delete_before(T, 0, 4) == 4
    assert engine.log_start_offset(T, 0) == 4
    assert engine.end_offset(T, 0) == 15
    with pytest.raises(OffsetOutOfRange):
        await engine.read(T, 0, 3, 100)
    result = await engine.read(T, 0, 4, 1 << 20)
    assert result.log_start_offset == 4
    assert result.batches[0].base_offset == 3  # the batch holding the new log start is served whole
    # timestamp lookups never answer below the log start
    assert await engine.offset_for_timestamp(T, 0, 0) == (4, 101)
    assert await engine.delete_before(T, 0, 2) == 4  # going backwards changes nothing
    with pytest.raises(OffsetOutOfRange):
        await engine.delete_before(T, 0, 16)
    assert await engine.delete_before(T, 0, 15) == 15
    assert (await engine.read(T, 0, 15, 100)).batches == []
    assert await engine.offset_for_timestamp(T, 0, 0) is None
    # appends continue from the end
    result = await engine.append(T, 0, [twin_batch([b"after"])])
    assert result.base_offset == 15 and result.log_start_offset == 15
    assert [r[2] for r in await _read_all(harness)] == [b"after"]


async def test_offset_bounds_many_answers_each_queue_as_the_single_calls_do(harness: Harness) -> None:
    await _topic(harness, queues=3)
    engine = harness.engine
    for i in range(4):
        await engine.append(T, 1, [twin_batch([b"%d" % i, b"x"])])
    await engine.append(T, 2, [twin_batch([b"y"])])
    assert await engine.delete_before(T, 1, 2) == 2
    queues = [2, 0, 1, 1, 3, -1]  # any order, repeats, and queues the topic does not have
    assert engine.offset_bounds_many(T, queues) == [(0, 1), (0, 0), (2, 8), (2, 8), None, None]
    assert [engine.offset_bounds_many(T, [q])[0] for q in range(3)] == [
        (engine.log_start_offset(T, q), engine.end_offset(T, q)) for q in range(3)
    ]
    assert engine.offset_bounds_many("nope", [0, 1]) == [None, None]
    await engine.delete_shards(T)
    assert engine.offset_bounds_many(T, [0]) == [None]


# --- tags ------------------------------------------------------------------------------------------------


async def test_read_by_tags_filters_batches(harness: Harness) -> None:
    await _topic(harness)
    engine = harness.engine
    for i in range(6):
        await engine.append(T, 0, [twin_batch([b"m%d" % i])], tags_code=i % 3)
    result = await engine.read_by_tags(T, 0, 0, [1, 2], 10)
    assert [b.base_offset for b in result.batches] == [1, 2, 4, 5]
    assert all(b.tags_code in (1, 2) for b in result.batches)
    limited = await engine.read_by_tags(T, 0, 2, [1], 10)
    assert [b.base_offset for b in limited.batches] == [4]


# --- group offsets ---------------------------------------------------------------------------------------


async def test_group_offsets_commit_fetch_delete(harness: Harness) -> None:
    engine = harness.engine
    assert engine.fetch_offsets("g") == {}
    await engine.commit_offsets("g", {(T, 0): GroupOffset(10, "meta", 123, 2), (T, 1): GroupOffset(20)})
    await engine.commit_offsets("g", {(T, 0): GroupOffset(11)})
    await engine.commit_offsets("h", {("other", 3): GroupOffset(1)})
    assert engine.fetch_offsets("g") == {(T, 0): GroupOffset(11), (T, 1): GroupOffset(20)}
    assert engine.list_offset_groups() == ["g", "h"]
    await engine.delete_offsets("g", [(T, 1)])
    assert engine.fetch_offsets("g") == {(T, 0): GroupOffset(11)}
    await engine.delete_offsets("h")
    assert engine.list_offset_groups() == ["g"]
    await engine.delete_offsets("never-seen")
    await engine.commit_offsets("empty", {})  # nothing to commit creates no group
    assert engine.list_offset_groups() == ["g"]


# --- listeners -------------------------------------------------------------------------------------------


async def test_listeners_hear_new_end_offsets(harness: Harness) -> None:
    await _topic(harness, queues=2)
    engine = harness.engine
    heard: list[tuple[str, int, int]] = []
    engine.listeners.append(lambda topic, ends: heard.extend((topic, queue, end) for queue, end in ends))
    await engine.append(T, 1, [twin_batch([b"a", b"b"])])
    await engine.append(T, 0, [twin_batch([b"c"])])
    assert (T, 1, 2) in heard and (T, 0, 1) in heard
    # a listener hears an end offset only once the records are readable
    assert all(engine.end_offset(t, q) >= end for t, q, end in heard)


# --- restart ---------------------------------------------------------------------------------------------


async def test_restart_keeps_data_and_offsets_on_durable_engines(harness: Harness) -> None:
    await _topic(harness, queues=2)
    engine = harness.engine
    for i in range(30):
        await engine.append(T, i % 2, [twin_batch([b"r%d" % i, b"s%d" % i], base_timestamp=1_000 + i)])
    await engine.delete_before(T, 0, 6)
    await engine.commit_offsets("g", {(T, 0): GroupOffset(7, "m"), (T, 1): GroupOffset(3)})
    before = {q: await _read_all(harness, q) for q in (0, 1)}

    engine = await harness.restart()
    if not harness.durable:
        assert engine.list_shards() == {}
        assert engine.fetch_offsets("g") == {}
        return
    assert engine.list_shards() == {T: 2}
    assert [engine.end_offset(T, q) for q in (0, 1)] == [30, 30]
    assert engine.log_start_offset(T, 0) == 6
    assert {q: await _read_all(harness, q) for q in (0, 1)} == before
    assert engine.fetch_offsets("g") == {(T, 0): GroupOffset(7, "m"), (T, 1): GroupOffset(3)}
    assert await engine.offset_for_timestamp(T, 1, 1_011) == (10, 1_011)
    # and appends continue where they left off
    result = await engine.append(T, 0, [twin_batch([b"after-restart"])])
    assert result.base_offset == 30


async def test_closed_engine_refuses_work_with_a_typed_error(harness: Harness) -> None:
    await _topic(harness)
    engine = harness.engine
    await harness.close()
    with pytest.raises((StorageError, UnknownShard)):
        await engine.append(T, 0, [twin_batch([b"late"])])


async def test_max_timestamp_only_counts_retained_records(harness: Harness) -> None:
    await _topic(harness)
    engine = harness.engine
    await engine.append(T, 0, [twin_batch([b"a", b"b"], timestamps=[900, 100])])  # offsets 0-1
    await engine.append(T, 0, [twin_batch([b"c", b"d"], timestamps=[300, 400])])  # offsets 2-3
    await engine.append(T, 0, [twin_batch([b"e"], timestamps=[250])])  # offset 4
    assert await engine.max_timestamp(T, 0) == (0, 900)
    await engine.delete_before(T, 0, 1)  # the 900 record is gone, its batch stays
    assert await engine.max_timestamp(T, 0) == (3, 400)
    await engine.delete_before(T, 0, 2)
    assert await engine.max_timestamp(T, 0) == (3, 400)
    assert await engine.offset_for_timestamp(T, 0, 350) == (3, 400)
    await engine.delete_before(T, 0, 4)
    assert await engine.max_timestamp(T, 0) == (4, 250)


async def test_max_timestamp_counts_the_retained_records_of_a_batch_whose_maximum_was_deleted(harness: Harness) -> None:
    await _topic(harness)
    engine = harness.engine
    await engine.append(T, 0, [twin_batch([b"a", b"b"], timestamps=[900, 500])])  # offsets 0-1
    await engine.append(T, 0, [twin_batch([b"c"], timestamps=[300])])  # offset 2
    await engine.delete_before(T, 0, 1)  # the 900 record goes; the 500 one, in the same batch, stays
    assert await engine.max_timestamp(T, 0) == (1, 500)


# --- sync flush: concurrent appends ----------------------------------------------------------------------


@pytest.fixture
async def sync_harness(engine_name: str, tmp_path: Path):
    h = Harness(engine_name, tmp_path / "sync-data", flush_mode="sync")
    await h.open()
    try:
        yield h
    finally:
        await h.close()


async def test_concurrent_appends_under_sync_flush(sync_harness: Harness) -> None:
    """Many writers at once (group commit): every append gets its own contiguous offsets, readers never see a
    gap, and after a restart every acknowledged batch is there."""
    h = sync_harness
    await _topic(h, queues=2)
    engine = h.engine
    seen_ends: list[int] = []
    engine.listeners.append(lambda topic, ends: seen_ends.extend(end for queue, end in ends if queue == 0))

    async def writer(w: int) -> list[tuple[int, int, bytes]]:
        got = []
        for i in range(10):
            values = [b"w%d-%d-%d" % (w, i, j) for j in range(1 + (w + i) % 3)]
            result = await engine.append(T, w % 2, [twin_batch(values)])
            assert result.last_offset - result.base_offset + 1 == len(values)
            got.extend((w % 2, result.base_offset + j, v) for j, v in enumerate(values))
        return got

    results = await asyncio.gather(*(writer(w) for w in range(8)))
    acked = sorted(x for r in results for x in r)
    for q in (0, 1):
        offsets = [o for qq, o, _ in acked if qq == q]
        assert offsets == list(range(len(offsets)))  # unique and contiguous
        assert engine.end_offset(T, q) == len(offsets)
    assert seen_ends == sorted(seen_ends)  # the high watermark only moves forward
    expected = {q: [v for qq, _, v in acked if qq == q] for q in (0, 1)}
    engine = await h.restart()
    if not h.durable:
        assert engine.list_shards() == {}
        return
    for q in (0, 1):
        assert [r[2] for r in await _read_all(h, q)] == expected[q]


# --- key index --------------------------------------------------------------------------------------------


async def test_read_by_key_newest_first(harness: Harness) -> None:
    await _topic(harness, queues=2)
    engine = harness.engine
    await engine.append(T, 0, [twin_batch([b"one"])], keys=[b"order-1"])
    await engine.append(T, 1, [twin_batch([b"two"])], keys=[b"order-1", b"order-2"])
    await engine.append(T, 0, [twin_batch([b"three"])], keys=[b"order-2"])
    await engine.append(T, 1, [twin_batch([b"four"])], keys=[b"order-1"])
    hits = await engine.read_by_key(T, b"order-1", 10)
    assert [(q, records_of(b.data)[0][2]) for q, b in hits] == [(1, b"four"), (1, b"two"), (0, b"one")]
    assert len(await engine.read_by_key(T, b"order-1", 2)) == 2
    assert await engine.read_by_key(T, b"order-3", 10) == []
    assert await engine.read_by_key(T, b"order-1", 10, end_ms=0) == []
    await engine.delete_before(T, 1, 1)  # "two" is gone
    hits = await engine.read_by_key(T, b"order-1", 10)
    assert [records_of(b.data)[0][2] for _, b in hits] == [b"four", b"one"]
    with pytest.raises(UnknownShard):
        await engine.read_by_key("nope", b"x", 1)
