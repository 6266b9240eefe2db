"""The file engine's side of CommitLog replication (store/file/replica.py): a replica fed the master's bytes in
arbitrary pieces holds the same CommitLog, byte for byte, and serves the same batches at the same offsets; a
replica refuses local appends; a diverged tail is cut back with everything built on it."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
from helpers import commitlog_bytes

from mqk._fast import load
from mqk.config import StoreConfig, TopicConfig
from mqk.errors import Corrupt, NotMaster, kafka_code_for
from mqk.store.file.engine import FileEngine

rb = load("recbatch")
SEGMENT = 64 * 1024
KEYED = TopicConfig({"index.keys": "true"})


def a_batch(i: int, size: int = 300, key: bytes | None = None) -> bytes:
    recs = rb.encode_record(0, 0, key if key is not None else b"k%d" % i, bytes([i % 251]) * size, [])
    return bytes(rb.build_batch(0, 1000 + i, 1000 + i, recs, 1, 0))


def config(root: Path) -> StoreConfig:
    base = StoreConfig(data_dir=root, commitlog_segment_bytes=SEGMENT, cq_units_per_file=64)
    return dataclasses.replace(base, checkpoint_interval_ms=3_600_000)


async def engine_at(root: Path, writable: bool = True) -> FileEngine:
    engine = FileEngine(config(root), root)
    engine.set_writable(writable)
    await engine.start()
    return engine


async def stream(master: FileEngine, replica: FileEngine, rng: random.Random, topics: dict[str, int]) -> None:
    """Feed the replica the master's log from the replica's end, in random pieces, creating shards it asks for."""
    log = replica.replica_log
    log.reset()
    offset = replica.log_end
    while offset < master.log_end:
        chunk = master.read_log(offset, rng.randint(1, 9000))
        got = log.receive(offset, chunk)
        offset += len(chunk)
        while got.missing:
            topic, _queue = got.missing[0]
            await replica.create_shards(topic, topics[topic], KEYED)
            got = log.receive(offset, b"")


async def test_a_replica_fed_in_pieces_holds_the_same_log_and_serves_the_same_batches(tmp_path: Path) -> None:
    rng = random.Random(7)
    master = await engine_at(tmp_path / "m")
    replica = await engine_at(tmp_path / "r", writable=False)
    topics = {"a": 3, "b": 1}
    try:
        await master.create_shards("a", 3, KEYED)
        sent: dict[tuple[str, int], list[bytes]] = {}
        for i in range(400):  # several segments: every roll leaves a BLANK the replica must follow
            topic = "a" if i % 3 else "b"
            queue = i % topics[topic]
            if topic == "b" and "b" not in master.list_shards():
                await master.create_shards("b", 1, TopicConfig())
            batch = a_batch(i, rng.randint(50, 2000))
            await master.append(topic, queue, [batch])
            sent.setdefault((topic, queue), []).append(batch)
            if i % 97 == 0:
                await stream(master, replica, rng, topics)
        await stream(master, replica, rng, topics)
        assert master.clog.mfq.files[0].end_offset < master.log_end  # (it did roll)
        assert replica.log_end == master.log_end
        assert commitlog_bytes(replica) == commitlog_bytes(master)
        for (topic, queue), batches in sent.items():
            assert replica.end_offset(topic, queue) == master.end_offset(topic, queue) == len(batches)
            got = await replica.read(topic, queue, 0, 1 << 24)
            assert [bytes(b.data)[8:] for b in got.batches] == [b[8:] for b in batches]
        # the key index was fed too
        found = await replica.read_by_key("a", b"k1", 10)
        assert [(queue, batch.base_offset) for queue, batch in found] == [(1, 0)]
    finally:
        await master.close()
        await replica.close()


async def test_a_replica_refuses_local_appends_with_not_leader(tmp_path: Path) -> None:
    replica = await engine_at(tmp_path, writable=False)
    try:
        await replica.create_shards("t", 1, TopicConfig())
        with pytest.raises(NotMaster) as info:
            await replica.append("t", 0, [a_batch(1)])
        assert kafka_code_for(info.value) == 6  # NOT_LEADER_OR_FOLLOWER
        replica.set_writable(True)
        result = await replica.append("t", 0, [a_batch(1)])
        assert result.base_offset == 0
    finally:
        await replica.close()


async def test_bytes_that_are_not_the_stream_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    master = await engine_at(tmp_path / "m")
    replica = await engine_at(tmp_path / "r", writable=False)
    try:
        await master.create_shards("t", 1, TopicConfig())
        await replica.create_shards("t", 1, TopicConfig())
        await master.append("t", 0, [a_batch(1)])
        good = master.read_log(0, 1 << 20)
        log = replica.replica_log
        log.reset()
        with pytest.raises(Corrupt):
            log.receive(5, good)  # not where the stream stands
        damaged = bytearray(good)
        damaged[100] ^= 0xFF
        log.reset()
        with pytest.raises(Corrupt):
            log.receive(0, bytes(damaged))  # CRC
        log.reset()
        with pytest.raises(Corrupt):
            log.receive(0, b"\x00\x00\x10\x00garbage!" * 4)
        assert replica.log_end == 0 and replica.end_offset("t", 0) == 0
        log.reset()
        assert log.receive(0, good).end == master.log_end
        assert replica.end_offset("t", 0) == 1
    finally:
        await master.close()
        await replica.close()


async def test_a_diverged_tail_is_cut_with_its_units_and_index_entries_and_stays_cut(tmp_path: Path) -> None:
    engine = await engine_at(tmp_path)
    try:
        await engine.create_shards("t", 2, KEYED)
        for i in range(10):
            await engine.append("t", i % 2, [a_batch(i)])
        cut_at = engine.log_end
        for i in range(10, 30):
            await engine.append("t", i % 2, [a_batch(i, key=b"late%d" % i)])
        assert engine.end_offset("t", 0) == 15
        engine.set_writable(False)
        assert engine.truncate_log(cut_at) > 0
        assert engine.log_end == cut_at
        assert engine.end_offset("t", 0) == 5 and engine.end_offset("t", 1) == 5
        assert await engine.read_by_key("t", b"late10", 10) == []
        assert len(await engine.read_by_key("t", b"k3", 10)) == 1
        engine.set_writable(True)
        again = await engine.append("t", 0, [a_batch(99)])
        assert again.base_offset == 5
    finally:
        await engine.close()
    reopened = await engine_at(tmp_path)  # recovery agrees with the cut
    try:
        assert reopened.end_offset("t", 0) == 6 and reopened.end_offset("t", 1) == 5
        got = await reopened.read("t", 0, 5, 1 << 20)
        assert bytes(got.batches[0].data)[8:] == a_batch(99)[8:]
    finally:
        await reopened.close()


async def test_a_replica_left_behind_starts_over_at_the_masters_oldest_segment(tmp_path: Path) -> None:
    """restart_log: the replica's whole log goes (segments, units, index entries), each queue the master names starts
    at the master's first offset there, and the master's log copied from its oldest segment serves the same batches
    at the same offsets, also after a restart (recovery agrees)."""
    rng = random.Random(11)
    topics = {"t": 2}
    master = await engine_at(tmp_path / "m")
    replica = await engine_at(tmp_path / "r", writable=False)
    try:
        await master.create_shards("t", 2, KEYED)
        await master.create_shards("idle", 1, KEYED)  # written only before the master's oldest segment
        for i in range(6):
            await master.append("t", i % 2, [a_batch(i, 2000)])
        await stream(master, replica, rng, topics)  # the replica holds the first six batches, and no "idle" yet
        for i in range(3):
            await master.append("idle", 0, [a_batch(i)])
        for i in range(6, 200):  # the master goes on over several segments, then drops its head ones
            await master.append("t", i % 2, [a_batch(i, 2000, key=b"late%d" % i)])
        await master.checkpoint_now(flush_all=True)
        start = master.clog.mfq.files[3].start_offset
        master.clog.mfq.delete_before(start)
        assert master.log_start == start > replica.log_end
        starts = {(t, q): o for t, q, o in master.queue_starts_at(start)}
        assert sorted(starts) == [("idle", 0), ("t", 0), ("t", 1)] and all(o > 2 for o in starts.values())
        assert starts[("idle", 0)] == 3  # its end: nothing of it is left past the start

        assert replica.restart_log(start, starts) > 0
        assert replica.log_end == 0 and replica.clog.mfq.files == []
        assert await replica.read_by_key("t", b"k1", 10) == []  # the old entries' index entries went too
        for q in (0, 1):
            assert replica.end_offset("t", q) == starts[("t", q)] == replica.log_start_offset("t", q)
        replica.replica_log.reset(start)
        offset = start
        while offset < master.log_end:
            chunk = master.read_log(offset, rng.randint(1, 9000))
            got = replica.replica_log.receive(offset, chunk)
            assert not got.missing
            offset += len(chunk)
        assert (replica.log_start, replica.log_end) == (master.log_start, master.log_end)
        assert commitlog_bytes(replica) == commitlog_bytes(master)
        for q in (0, 1):
            assert replica.end_offset("t", q) == master.end_offset("t", q)
        first = starts[("t", 1)]
        got = await replica.read("t", 1, first, 1 << 20)
        assert got.batches[0].base_offset == first
        assert len(await replica.read_by_key("t", b"late199", 10)) == 1
        # a topic the replica did not hold starts at the master's offset when it is created (the metadata that
        # creates it may come after the copy), not at 0
        await replica.create_shards("idle", 1, KEYED)
        assert replica.end_offset("idle", 0) == replica.log_start_offset("idle", 0) == 3
    finally:
        await replica.close()
        await master.close()
    reopened = await engine_at(tmp_path / "r", writable=False)
    try:
        assert reopened.log_start == start and reopened.end_offset("t", 1) == 100
        assert reopened.log_start_offset("t", 1) == first
        assert reopened.end_offset("idle", 0) == reopened.log_start_offset("idle", 0) == 3
    finally:
        await reopened.close()


async def test_an_empty_replica_takes_the_masters_queue_starts_for_queues_with_nothing_left_to_copy(
    tmp_path: Path,
) -> None:
    replica = await engine_at(tmp_path, writable=False)
    try:
        await replica.create_shards("t", 2, KEYED)
        replica.adopt_queue_starts({("t", 0): 5, ("t", 1): 0, ("later", 0): 2})
        assert [replica.end_offset("t", q) for q in (0, 1)] == [5, 0]
        assert replica.log_start_offset("t", 0) == 5
        await replica.create_shards("later", 1, KEYED)  # its metadata comes after the copy started
        assert replica.end_offset("later", 0) == replica.log_start_offset("later", 0) == 2
    finally:
        await replica.close()
    reopened = await engine_at(tmp_path, writable=False)
    try:
        assert reopened.end_offset("t", 0) == 5 and reopened.end_offset("later", 0) == 2
    finally:
        await reopened.close()


async def test_a_queue_start_learned_before_its_topic_exists_survives_a_restart_of_the_replica(
    tmp_path: Path,
) -> None:
    """The replica learns where a queue starts (its master's START) before the topic's metadata reaches it, and
    is restarted in between: the start is in queues.json, so the queue starts there when it is created."""
    replica = await engine_at(tmp_path, writable=False)
    try:
        replica.adopt_queue_starts({("later", 0): 7})
    finally:
        await replica.close()
    reopened = await engine_at(tmp_path, writable=False)
    try:
        await reopened.create_shards("later", 1, KEYED)
        assert reopened.end_offset("later", 0) == reopened.log_start_offset("later", 0) == 7
    finally:
        await reopened.close()
    again = await engine_at(tmp_path, writable=False)
    try:  # taken, so no longer pending: the queue keeps its own positions
        assert again.registry.pending_starts == {} and again.end_offset("later", 0) == 7
    finally:
        await again.close()
