"""RocksEngine specifics the scenario suite cannot reach: write failures, a second opener, many shards."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mqk._fast import twin
from mqk.config import StoreConfig, TopicConfig
from mqk.errors import StorageError
from mqk.store.rocksdb import RocksEngine

rb = twin("recbatch")
REPO = Path(__file__).resolve().parents[2]


def _batch(value: bytes) -> bytearray:
    return rb.build_batch(0, 1_000, 1_000, rb.encode_record(0, 0, None, value, []), 1, 0)


class _FailingWrites:
    """Wraps the Rdict: reads pass through, every write fails (a full or broken disk)."""

    def __init__(self, db) -> None:
        self.inner = db

    def write(self, *args, **kwargs):
        raise RuntimeError("IO error: No space left on device")

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("flush_mode", ["async", "sync"])
async def test_write_failure_is_typed_and_leaves_no_hole(tmp_path: Path, flush_mode: str) -> None:
    engine = RocksEngine(StoreConfig(data_dir=tmp_path, storage="rocksdb", flush_mode=flush_mode), tmp_path)
    await engine.start()
    await engine.create_shards("t", 1, TopicConfig())
    await engine.append("t", 0, [_batch(b"before")])
    real = engine._db
    engine._db = _FailingWrites(real)
    try:
        outcomes = await asyncio.gather(
            *(engine.append("t", 0, [_batch(b"x")]) for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(o, StorageError) for o in outcomes), outcomes
        assert engine.end_offset("t", 0) == 1
        result = await engine.read("t", 0, 0, 1 << 20)  # reads go on
        assert [b.base_offset for b in result.batches] == [0]
    finally:
        engine._db = real
    if flush_mode == "async":  # nothing was handed out: appends resume at the same offset
        assert (await engine.append("t", 0, [_batch(b"after")])).base_offset == 1
    else:  # offsets were handed out to queued writers: appends stay refused until restart
        with pytest.raises(StorageError):
            await engine.append("t", 0, [_batch(b"after")])
    await engine.close()
    again = RocksEngine(StoreConfig(data_dir=tmp_path, storage="rocksdb"), tmp_path)
    await again.start()
    assert again.end_offset("t", 0) == (2 if flush_mode == "async" else 1)
    assert (await again.append("t", 0, [_batch(b"fresh")])).base_offset == again.end_offset("t", 0) - 1
    await again.close()


async def test_second_opener_gets_a_typed_error(tmp_path: Path) -> None:
    first = RocksEngine(StoreConfig(data_dir=tmp_path, storage="rocksdb"), tmp_path)
    await first.start()
    second = RocksEngine(StoreConfig(data_dir=tmp_path, storage="rocksdb"), tmp_path)
    with pytest.raises(StorageError):
        await second.start()
    await first.close()
    with pytest.raises(StorageError):
        await first.append("t", 0, [_batch(b"closed")])


async def test_many_topics_with_prefix_names_stay_apart(tmp_path: Path) -> None:
    """Topic keys are length-prefixed: "a" and "a\\x00..."-like neighbours and queue numbers never overlap."""
    engine = RocksEngine(StoreConfig(data_dir=tmp_path, storage="rocksdb"), tmp_path)
    await engine.start()
    names = ["a", "ab", "a.b", "b", "a" * 200]
    for n, name in enumerate(names):
        await engine.create_shards(name, 3, TopicConfig())
        for q in range(3):
            for i in range(n + q + 1):
                await engine.append(name, q, [_batch(b"%s/%d/%d" % (name.encode(), q, i))])
    await engine.delete_shards("ab")
    await engine.close()
    engine = RocksEngine(StoreConfig(data_dir=tmp_path, storage="rocksdb"), tmp_path)
    await engine.start()
    assert engine.list_shards() == {name: 3 for name in names if name != "ab"}
    for n, name in enumerate(names):
        if name == "ab":
            continue
        for q in range(3):
            assert engine.end_offset(name, q) == n + q + 1
            result = await engine.read(name, q, 0, 1 << 30)
            assert len(result.batches) == n + q + 1
    await engine.close()


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from mqk._fast import twin
    from mqk.config import StoreConfig, TopicConfig
    from mqk.store.adapter import GroupOffset
    from mqk.store.rocksdb import RocksEngine

    rb = twin("recbatch")

    async def writer(engine, w):
        i = engine.fetch_offsets("g").get(("t", w), GroupOffset(0)).offset  # commits only move forward
        while True:
            i += 1
            value = b"%d-%d" % (w, i)
            batch = rb.build_batch(0, 1000, 1000, rb.encode_record(0, 0, None, value, []), 1, 0)
            result = await engine.append("t", w % 2, [batch])
            await engine.commit_offsets("g", {("t", w): GroupOffset(i)})
            sys.stdout.write(f"ack {w % 2} {result.base_offset} {value.decode()} {w} {i}\\n")
            sys.stdout.flush()

    async def main():
        root = Path(sys.argv[1])
        engine = RocksEngine(StoreConfig(data_dir=root, storage="rocksdb", flush_mode="sync"), root)
        await engine.start()
        await engine.create_shards("t", 2, TopicConfig())
        await asyncio.gather(*(writer(engine, w) for w in range(4)))

    asyncio.run(main())
    """
)


@pytest.mark.timeout(60)
async def test_acknowledged_appends_and_commits_survive_sigkill(tmp_path: Path) -> None:
    rng = random.Random(7)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    acked: dict[tuple[int, int], bytes] = {}  # (queue, offset) -> value
    commits: dict[int, int] = {}
    started = time.monotonic()
    kills = 0
    while kills < 5 and time.monotonic() - started < 15:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, str(tmp_path), stdout=asyncio.subprocess.PIPE, env=env, cwd=REPO
        )
        assert child.stdout is not None
        wanted, seen = rng.randint(5, 200), 0

        def take(line: bytes) -> None:
            _, queue, offset, value, w, i = line.decode().split()
            key = (int(queue), int(offset))
            assert acked.get(key, value.encode()) == value.encode(), "one offset acknowledged twice"
            acked[key] = value.encode()
            commits[int(w)] = max(commits.get(int(w), 0), int(i))

        while seen < wanted:
            line = await asyncio.wait_for(child.stdout.readline(), 20)
            if not line:
                break
            take(line)
            seen += 1
        child.send_signal(signal.SIGKILL)
        for line in (await child.stdout.read()).splitlines(keepends=True):
            if line.endswith(b"\n"):
                take(line)
        await child.wait()
        assert seen == wanted, "child stopped early"
        kills += 1

        engine = RocksEngine(StoreConfig(data_dir=tmp_path, storage="rocksdb"), tmp_path)
        await engine.start()
        try:
            for queue in (0, 1):
                result = await engine.read("t", queue, 0, 1 << 30)
                stored = {b.base_offset: records_value(b.data) for b in result.batches}
                assert sorted(stored) == list(range(engine.end_offset("t", queue)))  # no holes
                for (q, offset), value in acked.items():
                    if q == queue:
                        assert stored.get(offset) == value, f"acknowledged batch lost: {q}/{offset}"
            got = engine.fetch_offsets("g")
            for w, i in commits.items():
                assert got[("t", w)].offset >= i
        finally:
            await engine.close()
    assert kills >= 2 and acked


def records_value(data) -> bytes:
    header = rb.parse_header(bytes(data), 0)
    return rb.decode_records(bytes(data)[rb.HEADER_SIZE :], header[12])[0][4]
