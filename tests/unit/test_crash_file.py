"""kill -9 while appending under `sync` flush: every acknowledged batch survives, intact, with no garbage tail.

A child process appends from four concurrent producers (so group commit is what is being killed), by single
batches, by several queues at once (append_many) and by several batches at once, and prints one line per
acknowledged batch: queue, base offset, and a hash of the batch bytes the store must keep (everything after
the base offset). The parent kills it with SIGKILL at a random moment (after a random number of acknowledgements,
with appends in flight), reopens the store (abnormal recovery), checks
every acknowledgement seen so far, and starts the child again on the same data: 20 rounds under `sync` (6 more
under `async`), bounded in time.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import wait_until

from mqk._fast import load
from mqk.config import StoreConfig
from mqk.store.file.engine import FileEngine

rb = load("recbatch")
REPO = Path(__file__).resolve().parents[2]
ROUNDS = 20
TOPIC = "crash"

CHILD = r"""
import asyncio, hashlib, random, sys
from pathlib import Path
from mqk._fast import load
from mqk.config import StoreConfig, TopicConfig
from mqk.store.file.engine import FileEngine

rb = load("recbatch")
root, seed, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

async def main():
    # a kept tail of two segments: the flusher drops older pages while the kill can land
    engine = FileEngine(StoreConfig(data_dir=root, flush_mode=mode, commitlog_segment_bytes=64 * 1024,
                                    cq_units_per_file=64, checkpoint_interval_ms=40,
                                    commitlog_cache_bytes=128 * 1024), root)
    await engine.start()
    if "crash" not in engine.list_shards():
        await engine.create_shards("crash", 2, TopicConfig())
    print("ready", flush=True)
    rng = random.Random(seed)

    def a_batch():
        n = rng.randrange(1, 6)
        recs = b"".join(rb.encode_record(k, k, None, rng.randbytes(rng.randrange(10, 3000)), []) for k in range(n))
        return rb.build_batch(0, 1000, 1000, recs, n, n - 1), n

    def ack(queue, base, batch):
        sys.stdout.write(f"ack {queue} {base} {hashlib.sha1(bytes(batch[8:])).hexdigest()}\n")

    async def producer():
        # a single batch, a Produce spread over the queues (append_many: one pwritev for the run) or several
        # batches in one append (one pwritev for all of them): the kill lands in each way of writing
        while True:
            way = rng.randrange(3)
            if way == 0:
                queue = rng.randrange(2)
                batch, _n = a_batch()
                ack(queue, (await engine.append("crash", queue, [batch])).base_offset, batch)
            elif way == 1:
                entries = [(rng.randrange(2), [a_batch()[0]]) for _ in range(rng.randrange(2, 5))]
                for (queue, (batch,)), result in zip(entries, await engine.append_many("crash", entries)):
                    ack(queue, result.base_offset, batch)
            else:
                queue = rng.randrange(2)
                made = [a_batch() for _ in range(rng.randrange(2, 4))]
                base = (await engine.append("crash", queue, [batch for batch, _n in made])).base_offset
                for batch, n in made:
                    ack(queue, base, batch)
                    base += n
            sys.stdout.flush()

    await asyncio.gather(*(producer() for _ in range(4)))

asyncio.run(main())
"""


def config(root: Path) -> StoreConfig:
    return StoreConfig(data_dir=root, flush_mode="sync", commitlog_segment_bytes=64 * 1024, cq_units_per_file=64)


def run_child_until_killed(
    root: Path, seed: int, out_path: Path, rng: random.Random, mode: str
) -> list[tuple[int, int, str]]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), str(seed), mode],
            stdout=out,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env=env,
        )

        def printed(text: bytes, count: int = 1) -> bool:
            if proc.poll() is not None:
                pytest.fail(f"child exited early: {proc.stderr.read().decode(errors='replace')[-2000:]}")
            return out_path.read_bytes().count(text) >= count

        try:
            wait_until(lambda: printed(b"ready"), 20, "the child to start")
            wanted = rng.randrange(1, 200)
            wait_until(lambda: printed(b"\nack ", wanted), 30, f"{wanted} acknowledgements")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            proc.stderr.close()
    acks = []
    text = out_path.read_bytes().decode()
    for line in text.split("\n")[:-1]:  # the last piece has no newline: possibly cut by the kill
        if line.startswith("ack "):
            _, queue, base, digest = line.split()
            acks.append((int(queue), int(base), digest))
    return acks


async def verify(root: Path, acks: dict[tuple[int, int], str]) -> dict:
    engine = FileEngine(config(root), root)
    await engine.start()
    try:
        report = dict(engine.recovery_report)
        assert report["abnormal"]
        for (queue, base), digest in acks.items():
            result = await engine.read(TOPIC, queue, base, 1)
            assert result.batches, f"acknowledged batch {queue}/{base} is gone"
            stored = result.batches[0]
            assert stored.base_offset == base
            rb.scan_batches(stored.data, True)
            assert hashlib.sha1(bytes(stored.data[8:])).hexdigest() == digest, f"batch {queue}/{base} differs"
        # no garbage tail: the whole CommitLog scans clean to its end, and nothing but zeros follows
        entries = sum(1 for _ in engine.clog.scan(engine.clog.min_offset))
        assert engine.clog.scan_error is None and engine.clog.scan_end == engine.clog.max_offset
        assert not engine.clog.has_data_after(engine.clog.max_offset)
        # every queue is a gap-free run of batches that accounts for every entry
        batches = 0
        for queue in (0, 1):
            offset, end = 0, engine.end_offset(TOPIC, queue)
            while offset < end:
                result = await engine.read(TOPIC, queue, offset, 1 << 20)
                for b in result.batches:
                    assert b.base_offset == offset
                    offset = b.next_offset
                    batches += 1
        assert batches == entries
        report["entries"] = entries
        return report
    finally:
        await engine.close()


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "rounds"), [("sync", ROUNDS), ("async", 6)])
def test_sigkill_during_appends_loses_nothing_acknowledged(tmp_path: Path, mode: str, rounds: int) -> None:
    """`sync` is the contract (acknowledged = on disk). `async` is checked too because a killed process (unlike a
    lost machine) leaves the page cache behind: what was acknowledged is there, and the tail must be clean."""
    root = tmp_path / "store"
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    acked: dict[tuple[int, int], str] = {}
    started = time.monotonic()
    rounds_with_acks = 0
    for round_no in range(rounds):
        acks = run_child_until_killed(root, round_no, tmp_path / f"acks-{round_no}.txt", rng, mode)
        for queue, base, digest in acks:
            assert (queue, base) not in acked or acked[(queue, base)] == digest, "an offset was handed out twice"
            acked[(queue, base)] = digest
        rounds_with_acks += bool(acks)
        report = asyncio.run(verify(root, acked))
        assert report["entries"] >= len(acked)
        assert time.monotonic() - started < 90, "crash test is running too long"
    assert rounds_with_acks >= rounds // 2, "the child rarely got to acknowledge anything"
    assert len(acked) > 100
    print(f"crash test ({mode}): {len(acked)} acknowledged batches over {rounds} kills")
