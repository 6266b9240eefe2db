"""The append pipeline's order, plan -> write -> publish, under injected faults.

`FileEngine.fault` is called between the steps (append.STAGE_PLANNED: the run is staged, nothing written;
STAGE_WRITTEN: its bytes are in the segment, nothing published). In process, each stage is checked from outside: no
reader, listener, position or dirty mark may see the run before its bytes are in place. Across a kill -9, the child
reports what a reader sees at a stage (which must be nothing of the run: a pipeline that published before writing
fails here), forces a checkpoint there (queues and CommitLog flushed, the safe offset recorded, as the checkpoint
thread could at any moment) and kills itself. The restarted store must come back with every acknowledged batch,
intact, every unit it serves pointing at a whole entry, and the killed run absent (killed before its write) or whole
(killed after it, its bytes found by recovery).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mqk._fast import compiled, load, twin
from mqk.config import StoreConfig, TopicConfig
from mqk.store.file import append as append_mod
from mqk.store.file.engine import FileEngine

rb = load("recbatch")
REPO = Path(__file__).resolve().parents[2]
TOPIC = "faults"
QUEUES = 3
KERNELS = [m for m in (compiled("clentry"), twin("clentry")) if m is not None]


def a_batch(i: int, size: int = 300) -> bytes:
    recs = rb.encode_record(0, 0, b"k%d" % i, bytes([i % 251]) * size, [])
    return bytes(rb.build_batch(0, 1000 + i, 1000 + i, recs, 1, 0))


def config(root: Path, **changes: object) -> StoreConfig:
    base = StoreConfig(
        data_dir=root, commitlog_segment_bytes=64 * 1024, cq_units_per_file=64, checkpoint_interval_ms=3_600_000
    )
    return dataclasses.replace(base, **changes)


def stored_tail(body: bytes) -> str:
    """What the store must keep of a batch: everything after its base offset (the store sets that)."""
    return hashlib.sha256(bytes(body)[8:]).hexdigest()


@pytest.mark.parametrize("kernels", KERNELS, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
async def test_nothing_is_visible_before_its_bytes_are_written(tmp_path: Path, kernels) -> None:
    engine = FileEngine(config(tmp_path), tmp_path)
    await engine.start()
    engine.appender.run = kernels.AppendRun(append_mod.RUN_CAPACITY)
    try:
        await engine.create_shards(TOPIC, QUEUES, TopicConfig())
        await engine.append_many(TOPIC, [(q, [a_batch(q)]) for q in range(QUEUES)])
        await engine.checkpoint_now(flush_all=True)  # every queue clean: a dirty mark now would be the run's
        heard: list[object] = []
        engine.listeners.append(lambda topic, ends: heard.append((topic, list(ends))))
        seen: dict[str, tuple] = {}
        segment = engine.clog.mfq.files[-1]

        def visible() -> tuple:
            cqs = [engine.registry.get(TOPIC, q).cq for q in range(QUEUES)]
            return (
                engine.clog.max_offset,
                engine.dispatcher.dispatched,
                [cq.end_offset for cq in cqs],
                [cq.mfq.files[-1].wrote for cq in cqs],
                [cq.dirty_since_phys for cq in cqs],
                len(engine.appender.dirty),
                list(heard),
                engine.stats.puts,
            )

        before = visible()

        def fault(stage: str) -> None:
            run = engine.appender.run
            written = os.pread(segment.fd, run.end_pos - run.pos, run.pos)
            seen[stage] = (visible(), written)

        engine.fault = fault
        results = await engine.append_many(TOPIC, [(q, [a_batch(10 + q)]) for q in range(QUEUES)])
        engine.fault = None
    finally:
        await engine.close()
    assert set(seen) == {append_mod.STAGE_PLANNED, append_mod.STAGE_WRITTEN}
    at_plan, at_write = seen[append_mod.STAGE_PLANNED], seen[append_mod.STAGE_WRITTEN]
    # planned: nothing written yet (the segment is zeros there) and nothing published
    assert at_plan[1] == bytes(len(at_plan[1])) and at_plan[0] == before
    # written: the run's entries are in the file, whole and CRC-valid, yet still nothing published
    assert at_write[0] == before
    entries, pos = [], 0
    while pos < len(at_write[1]):
        entry = load("clentry").read_entry(at_write[1], pos, len(at_write[1]), True)
        entries.append(entry)
        pos += entry[1]
    assert [(e[0], e[2], e[4]) for e in entries] == [(1, q, 1) for q in range(QUEUES)]
    # published only after: every entry answered at the offsets the file holds
    assert [r.base_offset for r in results] == [1] * QUEUES


CHILD = r"""
import asyncio, hashlib, os, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from test_file_append_faults import QUEUES, TOPIC, a_batch, config, stored_tail
from mqk.config import TopicConfig
from mqk.store.file.engine import FileEngine

root, stage = Path(sys.argv[1]), sys.argv[2]

async def main():
    engine = FileEngine(config(root), root)
    await engine.start()
    await engine.create_shards(TOPIC, QUEUES, TopicConfig())
    i = 0
    while engine.clog.max_offset < 6 * 64 * 1024:  # past the segments recovery re-verifies anyway
        batches = [a_batch(i + q) for q in range(QUEUES)]
        results = await engine.append_many(TOPIC, [(q, [b]) for q, b in enumerate(batches)])
        for q, (result, body) in enumerate(zip(results, batches)):
            print("ack", q, result.base_offset, stored_tail(body), flush=True)
        i += QUEUES

    def fault(at):
        if at != stage:
            return
        # what a reader sees at this point, for the parent to check: nothing of the run may be visible yet
        print("visible", engine.clog.max_offset, engine.dispatcher.dispatched,
              *[engine.end_offset(TOPIC, q) for q in range(QUEUES)], flush=True)
        # a checkpoint now, as the checkpoint thread could run it: the safe offset is what was dispatched,
        # the queues' published units flushed with it
        safe = engine.dispatcher.dispatched
        engine.checkpoints._flush_and_store(safe, [s.cq for s in engine.registry.shards.values()])
        print("killed", at, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    engine.fault = fault
    batches = [a_batch(i + q, 2000) for q in range(QUEUES)]
    for q, body in enumerate(batches):
        print("run", q, stored_tail(body), flush=True)
    await engine.append_many(TOPIC, [(q, [b]) for q, b in enumerate(batches)])
    print("not killed", flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("stage", [append_mod.STAGE_PLANNED, append_mod.STAGE_WRITTEN])
async def test_kill_between_the_steps_serves_only_what_was_written(tmp_path: Path, stage: str) -> None:
    root = tmp_path / "store"
    child = subprocess.run(  # noqa: ASYNC221 - the test waits for the child's whole run; nothing shares its loop
        [sys.executable, "-c", CHILD, str(root), stage, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    lines = [line.split() for line in child.stdout.splitlines()]
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert lines[-1] == ["killed", stage]
    acked = {(int(q), int(base)): digest for _kind, q, base, digest in (ln for ln in lines if ln[0] == "ack")}
    ends = {q: 1 + max(base for (qq, base) in acked if qq == q) for q in range(QUEUES)}
    visible = [int(v) for v in next(ln for ln in lines if ln[0] == "visible")[1:]]
    # at either stage the run was not published: readers saw the acknowledged ends and the log's old end
    assert visible[2:] == [ends[q] for q in range(QUEUES)] and visible[0] == visible[1]
    killed_run = {int(q): digest for _kind, q, digest in (ln for ln in lines if ln[0] == "run")}
    assert len(acked) > 100 and len(killed_run) == QUEUES

    engine = FileEngine(config(root), root)
    await engine.start()
    try:
        assert engine.recovery_report["abnormal"] is True
        assert engine.recovery_report["scan_start"] > 0  # the checkpoint in the child was taken into account
        assert engine.clog.max_offset >= visible[0]
        for q in range(QUEUES):
            result = await engine.read(TOPIC, q, 0, 1 << 30)
            stored = {b.base_offset: stored_tail(b.data) for b in result.batches}
            # every unit the store serves points at a whole entry (its CRC checked here)
            for b in result.batches:
                assert engine.clog.read_entry(b.physical_offset, verify=True)[0] == 1
                assert rb.scan_batches(bytes(b.data))[0][4] == 1
            for (qq, base), digest in acked.items():
                if qq == q:
                    assert stored.get(base) == digest, f"acknowledged {q}@{base} lost or damaged"
            if stage == append_mod.STAGE_PLANNED:
                assert result.end_offset == ends[q], "a run killed before its write came back"
            else:  # its bytes were in the file: recovery found them, whole
                assert result.end_offset == ends[q] + 1 and stored[ends[q]] == killed_run[q]
    finally:
        await engine.close()
