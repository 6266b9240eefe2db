"""FileOffsetStore: journal + snapshot durability of committed group offsets, torn tails, group commit, kill -9."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mqk.errors import Corrupt
from mqk.store.adapter import GroupOffset
from mqk.store.fsutil import atomic_write_bytes, atomic_write_json, read_json
from mqk.store.offsets import JOURNAL_NAME, SNAPSHOT_NAME, FileOffsetStore

REPO = Path(__file__).resolve().parents[2]


async def test_commit_fetch_delete_roundtrip(tmp_path: Path) -> None:
    store = FileOffsetStore(tmp_path)
    await store.commit_offsets("g1", {("t", 0): GroupOffset(5, "meta", 1000, 3), ("t", 1): GroupOffset(9)})
    await store.commit_offsets("g2", {("u", 0): GroupOffset(1)})
    await store.commit_offsets("g1", {("t", 0): GroupOffset(6)})
    assert store.fetch_offsets("g1") == {("t", 0): GroupOffset(6), ("t", 1): GroupOffset(9)}
    assert store.list_offset_groups() == ["g1", "g2"]
    await store.delete_offsets("g1", [("t", 0)])
    await store.delete_offsets("g2")
    await store.delete_offsets("nobody")
    assert store.fetch_offsets("g1") == {("t", 1): GroupOffset(9)}
    assert store.fetch_offsets("g2") == {}
    assert store.list_offset_groups() == ["g1"]
    await store.close()

    reopened = FileOffsetStore(tmp_path)
    assert reopened.fetch_offsets("g1") == {("t", 1): GroupOffset(9)}
    assert reopened.list_offset_groups() == ["g1"]
    await reopened.close()


async def test_fetch_returns_a_copy(tmp_path: Path) -> None:
    store = FileOffsetStore(tmp_path)
    await store.commit_offsets("g", {("t", 0): GroupOffset(1)})
    store.fetch_offsets("g")[("t", 0)] = GroupOffset(99)
    assert store.fetch_offsets("g") == {("t", 0): GroupOffset(1)}
    await store.close()


async def test_concurrent_commits_share_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs = 0
    real = os.fdatasync

    def counting(fd: int) -> None:
        nonlocal syncs
        syncs += 1
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    store = FileOffsetStore(tmp_path)
    await asyncio.gather(*(store.commit_offsets(f"g{i}", {("t", 0): GroupOffset(i)}) for i in range(200)))
    assert all(store.fetch_offsets(f"g{i}") == {("t", 0): GroupOffset(i)} for i in range(200))
    # 200 waiting commits: the first rides alone, the rest share a handful of syncs
    assert 1 <= syncs <= 10
    await store.close()


async def test_compaction_keeps_state_and_shrinks_journal(tmp_path: Path) -> None:
    store = FileOffsetStore(tmp_path, compact_bytes=2000)
    for i in range(300):
        await store.commit_offsets("g", {("t", i % 7): GroupOffset(i)})
    await store.delete_offsets("g", [("t", 0)])
    expected = store.fetch_offsets("g")
    assert (tmp_path / SNAPSHOT_NAME).exists()
    assert (tmp_path / JOURNAL_NAME).stat().st_size <= 4000
    await store.close()
    reopened = FileOffsetStore(tmp_path)
    assert reopened.fetch_offsets("g") == expected
    assert ("t", 0) not in expected and expected[("t", 6)] == GroupOffset(293)
    await reopened.close()


async def test_journal_records_already_in_snapshot_are_skipped(tmp_path: Path) -> None:
    """A crash between writing the snapshot and emptying the journal must not replay stale records on top."""
    store = FileOffsetStore(tmp_path)
    await store.commit_offsets("g", {("t", 0): GroupOffset(1)})
    await store.commit_offsets("g", {("t", 0): GroupOffset(2)})
    await store.close()
    journal = (tmp_path / JOURNAL_NAME).read_bytes()
    # snapshot says seq 2 with a newer value than the journal's last record; the journal must be ignored
    atomic_write_json(tmp_path / SNAPSHOT_NAME, {"version": 1, "seq": 2, "groups": {"g": [["t", 0, 50, "", -1, -1]]}})
    assert (tmp_path / JOURNAL_NAME).read_bytes() == journal
    reopened = FileOffsetStore(tmp_path)
    assert reopened.fetch_offsets("g") == {("t", 0): GroupOffset(50)}
    await reopened.commit_offsets("g", {("t", 0): GroupOffset(51)})
    await reopened.close()
    assert FileOffsetStore(tmp_path).fetch_offsets("g") == {("t", 0): GroupOffset(51)}


@pytest.mark.parametrize("damage", ["truncate", "flip", "huge_length", "garbage"])
async def test_torn_or_corrupt_tail_is_cut(tmp_path: Path, damage: str) -> None:
    store = FileOffsetStore(tmp_path)
    await store.commit_offsets("g", {("t", 0): GroupOffset(1)})
    await store.commit_offsets("g", {("t", 0): GroupOffset(2)})
    await store.close()
    path = tmp_path / JOURNAL_NAME
    raw = bytearray(path.read_bytes())
    first_len = len(raw) // 2  # both records have the same size
    if damage == "truncate":
        raw = raw[:-3]
    elif damage == "flip":
        raw[-2] ^= 0xFF
    elif damage == "huge_length":
        raw[first_len : first_len + 4] = (0xFFFFFFF0).to_bytes(4, "big")
    else:
        raw += b"\x00\x00\x00\x05\x01\x02"
    path.write_bytes(raw)

    reopened = FileOffsetStore(tmp_path)
    want = 2 if damage == "garbage" else 1
    assert reopened.fetch_offsets("g") == {("t", 0): GroupOffset(want)}
    assert reopened.torn_tail_bytes > 0
    # the cut journal accepts new records, and they are read back (not stuck behind garbage)
    await reopened.commit_offsets("g", {("t", 1): GroupOffset(7)})
    await reopened.close()
    again = FileOffsetStore(tmp_path)
    assert again.fetch_offsets("g") == {("t", 0): GroupOffset(want), ("t", 1): GroupOffset(7)}
    assert again.torn_tail_bytes == 0
    await again.close()


def test_malformed_snapshot_is_a_typed_error(tmp_path: Path) -> None:
    atomic_write_bytes(tmp_path / SNAPSHOT_NAME, b"{not json")
    with pytest.raises(Corrupt):
        FileOffsetStore(tmp_path)
    atomic_write_json(tmp_path / SNAPSHOT_NAME, {"version": 1})
    with pytest.raises(Corrupt):
        FileOffsetStore(tmp_path)


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "doc.json"
    atomic_write_json(target, {"a": 1})
    atomic_write_json(target, {"b": 2})
    assert read_json(target) == {"b": 2}
    assert read_json(tmp_path / "missing.json") is None
    assert [p.name for p in target.parent.iterdir()] == ["doc.json"]  # no temp files left behind


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from mqk.store.adapter import GroupOffset
    from mqk.store.offsets import FileOffsetStore

    async def worker(store, part, start):
        offset = start
        while True:
            offset += 1
            await store.commit_offsets("grp", {("t", part): GroupOffset(offset, "m" * (offset % 50))})
            sys.stdout.write(f"ack {part} {offset}\\n")
            sys.stdout.flush()

    async def main():
        store = FileOffsetStore(Path(sys.argv[1]), compact_bytes=3000)
        have = store.fetch_offsets("grp")
        await asyncio.gather(*(worker(store, p, have.get(("t", p), GroupOffset(0)).offset) for p in range(4)))

    asyncio.run(main())
    """
)


@pytest.mark.timeout(60)
def test_acknowledged_commits_survive_sigkill(tmp_path: Path) -> None:
    rng = random.Random(1234)
    acked: dict[int, int] = {}
    started = time.monotonic()
    kills = 0
    env = dict(os.environ, PYTHONPATH=str(REPO))
    while kills < 8 and time.monotonic() - started < 15:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, env=env, cwd=REPO
        )
        assert child.stdout is not None
        wanted = rng.randint(5, 400)
        seen = 0
        try:
            while seen < wanted:
                line = child.stdout.readline()
                if not line:
                    break
                _, part, offset = line.split()
                acked[int(part)] = max(acked.get(int(part), 0), int(offset))
                seen += 1
        finally:
            child.send_signal(signal.SIGKILL)
            rest = child.stdout.read()
            child.wait()
            child.stdout.close()
        for line in rest.decode().splitlines(keepends=True):
            if line.endswith("\n"):  # a half-printed line was not acknowledged
                _, part, offset = line.split()
                acked[int(part)] = max(acked.get(int(part), 0), int(offset))
        assert seen == wanted, "child stopped early"
        kills += 1

        store = FileOffsetStore(tmp_path)
        got = store.fetch_offsets("grp")
        for part, offset in acked.items():
            assert got[("t", part)].offset >= offset, f"acknowledged commit lost: part {part} offset {offset}"
            assert got[("t", part)].metadata == "m" * (got[("t", part)].offset % 50)
        store.close_sync()
    assert kills >= 3
    assert sum(acked.values()) > 0
