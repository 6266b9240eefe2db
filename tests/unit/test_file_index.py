"""The file engine's key index (mqk.store.file.index): collisions, many keys, file roll-over, time bounds, Kafka
record keys on `index.keys` topics, torn-tail recovery, and restarts that re-read only the CommitLog tail."""

from __future__ import annotations

import dataclasses
import gzip
import shutil
import struct
from pathlib import Path

import pytest

from mqk._fast import load
from mqk.config import StoreConfig, TopicConfig
from mqk.errors import Corrupt, OutOfBounds, UnknownShard
from mqk.store.file import engine as engine_mod
from mqk.store.file import index as index_mod
from mqk.store.file.engine import FileEngine
from mqk.store.file.index import HEADER_SIZE, IndexFile, batch_keys

rb = load("recbatch")
T = "orders"


def msg(value: bytes, keys: str | None = None, record_key: bytes | None = None, ts: int = 1000) -> bytearray:
    """A RocketMQ-style message (KEYS header) or a Kafka record (record key)."""
    headers = [("KEYS", keys.encode())] if keys is not None else []
    rec = rb.encode_record(0, 0, record_key, value, headers)
    return rb.build_batch(0, ts, ts, rec, 1, 0)


def kafka_batch(pairs: list[tuple[bytes | None, bytes]], ts: int = 1000) -> bytearray:
    recs = b"".join(rb.encode_record(i, 0, k, v, []) for i, (k, v) in enumerate(pairs))
    return rb.build_batch(0, ts, ts, recs, len(pairs), len(pairs) - 1)


def config(root: Path, **changes) -> StoreConfig:
    # no background checkpoint: the tests decide when the index checkpoint is written
    base = StoreConfig(
        data_dir=root,
        commitlog_segment_bytes=64 * 1024,
        cq_units_per_file=64,
        flush_interval_ms=20,
        checkpoint_interval_ms=3_600_000,
    )
    return dataclasses.replace(base, **changes)


async def open_engine(root: Path, slots: int | None = None, max_entries: int | None = None) -> FileEngine:
    e = FileEngine(config(root), root)
    if slots is not None:
        e.index.slots = slots
    if max_entries is not None:
        e.index.max_entries = max_entries
    await e.start()
    return e


def values(hits) -> list[bytes]:
    out = []
    for _q, b in hits:
        h = rb.parse_header(b.data)
        out.extend(r[4] for r in rb.decode_records(bytes(b.data[rb.HEADER_SIZE :]), h[12]))
    return out


async def send(e: FileEngine, value: bytes, keys: str, queue: int = 0, topic: str = T) -> None:
    """What the RocketMQ server does: KEYS in the record header and passed as `keys`."""
    await e.append(topic, queue, [msg(value, keys)], keys=[k.encode() for k in keys.split()])


def crash_copy(src: Path, dst: Path) -> Path:
    """The data dir as a kill -9 leaves it: copied while the engine runs (abort marker present; the mapped
    pages are what the files hold), the index checkpoint being whatever was last written."""
    shutil.copytree(src, dst)
    assert (dst / "abort").exists()
    return dst


# --- lookups ------------------------------------------------------------------------------------------------


async def test_many_keys_newest_first_and_max_count(tmp_path: Path) -> None:
    e = await open_engine(tmp_path)
    await e.create_shards(T, 3, TopicConfig())
    for i in range(600):
        await send(e, b"m%d" % i, f"k{i} group{i % 7}", queue=i % 3)
    for i in (0, 1, 299, 599):
        assert values(await e.read_by_key(T, b"k%d" % i, 10)) == [b"m%d" % i]
    hits = await e.read_by_key(T, b"group3", 1000)
    expected = [b"m%d" % i for i in reversed(range(600)) if i % 7 == 3]
    assert values(hits) == expected
    assert [q for q, _ in hits] == [int(v[1:]) % 3 for v in expected]
    assert values(await e.read_by_key(T, b"group3", 5)) == expected[:5]
    assert await e.read_by_key(T, b"absent", 10) == []
    assert await e.read_by_key(T, b"k1", 0) == []
    with pytest.raises(UnknownShard):
        await e.read_by_key("nope", b"k1", 1)
    await e.close()


async def test_collisions_are_resolved_by_the_commitlog_entry(tmp_path: Path, monkeypatch) -> None:
    # every key gets the same two hashes: one slot, one chain, every entry a candidate for every key
    monkeypatch.setattr(index_mod, "key_hashes", lambda ikey: (7, 7))
    e = await open_engine(tmp_path, slots=1)
    await e.create_shards(T, 1, TopicConfig())
    await e.create_shards("other", 1, TopicConfig())
    for i in range(40):
        await send(e, b"m%d" % i, f"k{i}")
    await send(e, b"other-topic", "k5", topic="other")
    assert values(await e.read_by_key(T, b"k5", 10)) == [b"m5"]
    assert values(await e.read_by_key("other", b"k5", 10)) == [b"other-topic"]
    assert values(await e.read_by_key(T, b"k39", 1)) == [b"m39"]
    assert await e.read_by_key(T, b"k40", 10) == []
    # all 41 entries sit in slot 0's one chain
    f = e.index.files[-1]
    assert f.used_slots == 1 and f.count == 41
    await e.close()


async def test_slot_sharing_without_full_hash_collision(tmp_path: Path) -> None:
    e = await open_engine(tmp_path, slots=3)
    await e.create_shards(T, 1, TopicConfig())
    for i in range(100):
        await send(e, b"m%d" % i, f"k{i}")
    for i in range(100):
        assert values(await e.read_by_key(T, b"k%d" % i, 5)) == [b"m%d" % i]
    await e.close()


async def test_file_roll_over_and_lookups_across_files(tmp_path: Path) -> None:
    e = await open_engine(tmp_path, slots=8, max_entries=16)
    await e.create_shards(T, 1, TopicConfig())
    for i in range(100):
        await send(e, b"m%d" % i, f"k{i} even" if i % 2 == 0 else f"k{i}")
    assert len(e.index.files) == (100 + 50 + 15) // 16
    assert [f.seq for f in e.index.files] == list(range(1, len(e.index.files) + 1))
    assert values(await e.read_by_key(T, b"k3", 5)) == [b"m3"]
    assert values(await e.read_by_key(T, b"even", 100)) == [b"m%d" % i for i in range(98, -1, -2)]
    await e.close()
    e = await open_engine(tmp_path)  # the files describe their own geometry
    assert e.index.recovery_report["scanned"] == 0
    assert values(await e.read_by_key(T, b"even", 3)) == [b"m98", b"m96", b"m94"]
    await send(e, b"late", "even")
    assert values(await e.read_by_key(T, b"even", 1)) == [b"late"]
    await e.close()


async def test_time_bounds_filter_entries_and_skip_files(tmp_path: Path, monkeypatch) -> None:
    clock = {"ms": 1_000_000}
    monkeypatch.setattr(engine_mod, "time_ns", lambda: clock["ms"] * 1_000_000)
    e = await open_engine(tmp_path, max_entries=4)
    await e.create_shards(T, 1, TopicConfig())
    for i in range(12):  # 3 files of 4 entries: [1_000_000..1_003_000], [1_004_000..], [1_008_000..]
        clock["ms"] = 1_000_000 + i * 1000
        await send(e, b"m%d" % i, "k")
    assert len(e.index.files) == 3
    assert [(f.begin_ts, f.end_ts) for f in e.index.files] == [
        (1_000_000, 1_003_000),
        (1_004_000, 1_007_000),
        (1_008_000, 1_011_000),
    ]
    looked = []
    real_lookup = IndexFile.lookup

    def counting(self, *args):
        looked.append(self.seq)
        return real_lookup(self, *args)

    monkeypatch.setattr(IndexFile, "lookup", counting)
    hits = await e.read_by_key(T, b"k", 100, 1_005_000, 1_006_000)
    assert values(hits) == [b"m6", b"m5"]
    assert [b.store_timestamp for _, b in hits] == [1_006_000, 1_005_000]
    assert looked == [2]  # the files outside the range were never opened
    assert values(await e.read_by_key(T, b"k", 100, end_ms=1_000_999)) == [b"m0"]
    assert values(await e.read_by_key(T, b"k", 100, begin_ms=1_010_500)) == [b"m11"]
    assert await e.read_by_key(T, b"k", 100, begin_ms=2_000_000) == []
    await e.close()


async def test_kafka_record_keys_only_on_index_keys_topics(tmp_path: Path) -> None:
    e = await open_engine(tmp_path)
    await e.create_shards("keyed", 1, TopicConfig({"index.keys": "true"}))
    await e.create_shards("plain", 1, TopicConfig())
    await e.append("keyed", 0, [kafka_batch([(b"user-1", b"a"), (None, b"b"), (b"user-2", b"c")])])
    await e.append("plain", 0, [kafka_batch([(b"user-1", b"x")])])
    hits = await e.read_by_key("keyed", b"user-2", 10)
    assert [(q, b.base_offset, b.record_count) for q, b in hits] == [(0, 0, 3)]
    assert await e.read_by_key("plain", b"user-1", 10) == []
    # the setting can be switched on later (alter configs): from then on keys are indexed
    await e.update_config("plain", TopicConfig({"index.keys": "true"}))
    await e.append("plain", 0, [kafka_batch([(b"user-1", b"y")])])
    assert values(await e.read_by_key("plain", b"user-1", 10)) == [b"y"]
    await e.close()
    # known before the broker re-sends topic configs: the tail rebuilt at start indexes record keys too
    assert (tmp_path / "index" / "topics.json").exists()


async def test_deleted_topic_and_log_start_hide_entries(tmp_path: Path) -> None:
    e = await open_engine(tmp_path)
    await e.create_shards(T, 1, TopicConfig())
    await send(e, b"old", "k")
    await send(e, b"second", "k")
    await e.delete_before(T, 0, 1)
    assert values(await e.read_by_key(T, b"k", 10)) == [b"second"]
    await e.delete_shards(T)
    with pytest.raises(UnknownShard):
        await e.read_by_key(T, b"k", 10)
    await e.create_shards(T, 1, TopicConfig())  # a new incarnation does not see the old one's messages
    assert await e.read_by_key(T, b"k", 10) == []
    await send(e, b"new", "k")
    assert values(await e.read_by_key(T, b"k", 10)) == [b"new"]
    await e.close()


def test_batch_keys_reads_headers_and_record_keys() -> None:
    assert batch_keys(msg(b"v", "a  b", record_key=b"a"), True) == {b"a", b"b"}
    assert batch_keys(msg(b"v", None, record_key=b"rk"), False) == set()
    assert batch_keys(kafka_batch([(b"x", b"1"), (b"y", b"2")]), True) == {b"x", b"y"}
    assert batch_keys(b"\x00" * 10, True) == set()  # undecodable: no keys, no crash
    recs = b"".join(rb.encode_record(i, 0, b"gz%d" % i, b"v", []) for i in range(3))
    gzipped = rb.build_batch(0, 1000, 1000, gzip.compress(recs), 3, 2, attributes=1)
    assert batch_keys(gzipped, True) == {b"gz0", b"gz1", b"gz2"}  # compressed Kafka batches too


# --- restart and recovery -----------------------------------------------------------------------------------


async def test_clean_restart_reads_no_commitlog_entry(tmp_path: Path) -> None:
    e = await open_engine(tmp_path)
    await e.create_shards(T, 1, TopicConfig())
    for i in range(300):
        await send(e, b"m%d" % i, f"k{i}")
    await e.close()
    e = await open_engine(tmp_path)
    assert e.index.recovery_report["scanned"] == 0
    assert e.index.recovery_report["checkpoint"] is True
    assert e.recovery_report["entries"] > 0  # the engine's own replay ran; the index did not need it
    for i in (0, 150, 299):
        assert values(await e.read_by_key(T, b"k%d" % i, 5)) == [b"m%d" % i]
    await e.close()


async def test_crash_rebuilds_only_the_tail_after_the_index_checkpoint(tmp_path: Path) -> None:
    src = tmp_path / "run"
    e = await open_engine(src)
    await e.create_shards(T, 1, TopicConfig())
    await e.create_shards("keyed", 1, TopicConfig({"index.keys": "true"}))
    for i in range(400):
        await send(e, b"m%d" % i, f"k{i} all")
    await e.checkpoint_now()
    for i in range(400, 407):  # after the checkpoint: only these 7 entries (plus a Kafka one) must be re-read
        await send(e, b"m%d" % i, f"k{i} all")
    await e.append("keyed", 0, [kafka_batch([(b"user-9", b"kafka")])])
    written = e.index.entries_written
    crashed = crash_copy(src, tmp_path / "crashed")
    await e.close()

    e = await open_engine(crashed)
    report = e.index.recovery_report
    assert report["scanned"] == 8
    assert report["cut_entries"] == 7 * 2 + 1  # the entries after the checkpoint were cut, then rebuilt
    assert report["indexed"] == 7 * 2 + 1
    assert e.recovery_report["abnormal"] is True
    assert e.index.entries_written == report["indexed"] < written
    for i in (0, 399, 400, 406):
        assert values(await e.read_by_key(T, b"k%d" % i, 5)) == [b"m%d" % i]
    assert len(await e.read_by_key(T, b"all", 1000)) == 407  # nothing lost, nothing twice
    assert values(await e.read_by_key("keyed", b"user-9", 5)) == [b"kafka"]
    await e.close()


async def test_entries_with_nothing_to_index_skip_the_hook_but_count_as_indexed(tmp_path: Path) -> None:
    """Kafka appends to a topic that does not index record keys never reach the index's hook (a call per append
    for nothing), yet the index checkpoint moves past them, so a crash re-reads only what came after it."""
    src = tmp_path / "run"
    e = await open_engine(src)
    await e.create_shards("plain", 1, TopicConfig())
    await e.create_shards("keyed", 1, TopicConfig({"index.keys": "true"}))
    calls = []
    real = e.index.dispatch
    counting = e.appender._index_hook = lambda *a: (calls.append(a[0]), real(*a))  # the index's hook, counted
    e.dispatcher.hooks[:] = [counting]
    for i in range(50):
        await e.append("plain", 0, [kafka_batch([(b"user-%d" % i, b"x")])])  # keys=(): nothing to index
    await e.append_many("plain", [(0, [kafka_batch([(b"u", b"y")])])])
    await e.append_many("plain", [(0, [kafka_batch([(b"u", b"a")]), kafka_batch([(b"u", b"b")])])])  # general path
    assert calls == []
    await e.append("keyed", 0, [kafka_batch([(b"user-1", b"k")])])  # a keyed topic still reaches it
    await send(e, b"native", "nk", topic="plain")  # and so do explicit keys
    assert calls == ["keyed", "plain"]
    await e.append("plain", 0, [kafka_batch([(b"late", b"z")])])
    assert calls == ["keyed", "plain"]
    seen = []  # a lone hook that is not the index's sees every entry
    e.dispatcher.hooks[:] = [lambda *a: seen.append(a[0])]
    await e.append("plain", 0, [kafka_batch([(b"other", b"o")])])
    assert seen == ["plain"]
    e.dispatcher.hooks[:] = [counting]
    await e.checkpoint_now()
    assert e.index.indexed_offset == e.clog.max_offset
    for i in range(5):  # after the checkpoint
        await e.append("plain", 0, [kafka_batch([(b"after", b"%d" % i)])])
    crashed = crash_copy(src, tmp_path / "crashed")
    await e.close()

    e = await open_engine(crashed)
    assert e.index.recovery_report["scanned"] == 5  # not the 54 skipped entries before the checkpoint
    assert values(await e.read_by_key("keyed", b"user-1", 5)) == [b"k"]
    assert values(await e.read_by_key("plain", b"nk", 5)) == [b"native"]
    assert await e.read_by_key("plain", b"user-3", 5) == []
    await e.close()


async def test_lost_checkpoint_means_a_full_rebuild(tmp_path: Path) -> None:
    e = await open_engine(tmp_path)
    await e.create_shards(T, 1, TopicConfig())
    for i in range(50):
        await send(e, b"m%d" % i, f"k{i}")
    await e.close()
    (tmp_path / "index" / "checkpoint").write_bytes(b"garbage")
    e = await open_engine(tmp_path)
    assert e.index.recovery_report["scanned"] == 50  # the counter really counts CommitLog reads
    assert values(await e.read_by_key(T, b"k7", 5)) == [b"m7"]
    await e.close()


async def test_torn_commitlog_tail_cuts_index_entries_past_the_end(tmp_path: Path) -> None:
    src = tmp_path / "run"
    e = await open_engine(src)
    await e.create_shards(T, 1, TopicConfig())
    for i in range(20):
        await send(e, b"m%d" % i, f"k{i} same")
    last_phys = e.index.files[-1].entry(e.index.files[-1].count)[2]  # the newest entry's CommitLog offset
    await e.checkpoint_now()  # the index checkpoint covers the entry that will be torn
    crashed = crash_copy(src, tmp_path / "crashed")
    await e.close()
    # tear the last CommitLog entry: a byte in its body flipped, as a half-written page would leave it
    seg = crashed / "commitlog" / f"{0:020d}"
    with open(seg, "r+b") as fh:  # noqa: ASYNC230 - the test's own file surgery; no broker shares its loop
        fh.seek(last_phys + 80)
        b = fh.read(1)
        fh.seek(last_phys + 80)
        fh.write(bytes([b[0] ^ 0xFF]))

    e = await open_engine(crashed)
    assert e.recovery_report["torn_tail"] is True
    assert e.clog.max_offset == last_phys
    assert e.index.recovery_report["cut_entries"] == 2  # k19 and "same" of the torn entry
    assert e.index.recovery_report["scanned"] == 0
    assert await e.read_by_key(T, b"k19", 5) == []
    assert values(await e.read_by_key(T, b"k18", 5)) == [b"m18"]
    # the torn entry's place is reused: the new message is found once, the old one never
    await send(e, b"again", "k19 same")
    assert values(await e.read_by_key(T, b"k19", 5)) == [b"again"]
    assert values(await e.read_by_key(T, b"same", 3)) == [b"again", b"m18", b"m17"]
    await e.close()
    e = await open_engine(crashed)
    assert values(await e.read_by_key(T, b"same", 100))[:2] == [b"again", b"m18"]
    assert len(await e.read_by_key(T, b"same", 100)) == 20
    await e.close()


# --- the file format: bounds and damage ---------------------------------------------------------------------


def test_index_file_bounds_and_damage(tmp_path: Path) -> None:
    path = tmp_path / f"{1:020d}"
    f = IndexFile(path, 1, 4, 8, create=True)
    for i in range(8):
        f.put(100 + i, 7, 1000 + i * 10, 5000 + i)
    assert f.is_full(5010)
    with pytest.raises(OutOfBounds):
        f.put(1, 1, 99_999, 6000)
    with pytest.raises(OutOfBounds):
        f.entry(9)
    with pytest.raises(OutOfBounds):
        f.entry(0)
    assert list(f.lookup(101, 7, 0, 1 << 62)) == [(1010, 5001)]
    assert list(f.lookup(101, 8, 0, 1 << 62)) == []  # the second hash differs
    assert f.last_below(1035) == 4
    f.cut(4)
    assert f.count == 4 and list(f.lookup(105, 7, 0, 1 << 62)) == [] and list(f.lookup(103, 7, 0, 9999))
    # a slot pointing past the published entries is damage, reported as Corrupt
    struct.pack_into(">I", f.mf.buf, HEADER_SIZE + (105 % 4) * 4, 7)
    with pytest.raises(Corrupt):
        list(f.lookup(105, 7, 0, 1 << 62))
    f.close()
    raw = bytearray(path.read_bytes())
    raw[0] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(Corrupt):
        IndexFile(path, 1, 4, 8, create=False)
    path.write_bytes(b"short")
    with pytest.raises(Corrupt):
        IndexFile(path, 1, 4, 8, create=False)


async def test_damaged_index_file_is_rebuilt_from_the_one_before(tmp_path: Path, caplog) -> None:
    e = await open_engine(tmp_path, slots=8, max_entries=10)
    await e.create_shards(T, 1, TopicConfig())
    for i in range(25):
        await send(e, b"m%d" % i, f"k{i}")
    await e.close()
    files = sorted((tmp_path / "index").glob("0" * 19 + "*"))
    assert len(files) == 3
    files[-1].write_bytes(b"\x00" * files[-1].stat().st_size)  # the last file's header is gone
    e = await open_engine(tmp_path)
    assert 0 < e.index.recovery_report["scanned"] <= 5
    for i in (0, 19, 24):
        assert values(await e.read_by_key(T, b"k%d" % i, 5)) == [b"m%d" % i]
    await e.close()


async def test_a_checkpoint_that_cannot_be_written_at_start_up_does_not_stop_the_start(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """On a full disk (ENOSPC from the checkpoint's write) recovery still finishes: the index answers, the old
    checkpoint stays on disk, and the next start, with room again, recovers from it to the same index."""
    import errno

    src = tmp_path / "run"
    e = await open_engine(src)
    await e.create_shards(T, 1, TopicConfig())
    for i in range(50):
        await send(e, b"m%d" % i, f"k{i} all")
    await e.checkpoint_now()
    for i in range(50, 60):
        await send(e, b"m%d" % i, f"k{i} all")
    crashed = crash_copy(src, tmp_path / "crashed")
    await e.close()
    stored = (crashed / "index" / "checkpoint").read_bytes()

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(index_mod, "atomic_write_bytes", full)
    e = await open_engine(crashed)
    assert "key index checkpoint not written at start-up" in caplog.text
    assert e.index.recovery_report["scanned"] == 10
    assert len(await e.read_by_key(T, b"all", 1000)) == 60
    assert (crashed / "index" / "checkpoint").read_bytes() == stored
    monkeypatch.undo()
    crashed_again = crash_copy(crashed, tmp_path / "crashed-again")
    await e.close()
    e = await open_engine(crashed_again)
    try:
        assert e.index.recovery_report["scanned"] == 10  # from the old checkpoint, as after the first crash
        assert values(await e.read_by_key(T, b"k55", 5)) == [b"m55"]
        assert len(await e.read_by_key(T, b"all", 1000)) == 60
    finally:
        await e.close()
