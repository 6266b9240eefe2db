"""Differential test: random operation sequences run on every engine at once must give identical answers.

The memory engine is the reference; rocksdb and file must return the same offsets, the same batch bytes, the same
timestamp answers and the same errors, including across restarts (where the memory engine cannot follow, the
durable engines are compared with each other and with what was acknowledged before)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from helpers import ENGINE_NAMES, Harness, kafka_python_batch, twin_batch

from mqk.config import TopicConfig
from mqk.errors import OffsetOutOfRange

T = "diff"


def _random_batch(rng: random.Random) -> bytes:
    n = rng.randint(1, 6)
    timestamps = [rng.randint(0, 2_000) for _ in range(n)]
    values = [bytes([rng.randint(97, 122)]) * rng.randint(0, 400) for _ in range(n)]
    if rng.random() < 0.3:
        return kafka_python_batch(values, timestamps, compression=rng.choice([0, 1]))
    return bytes(twin_batch(values, timestamps=timestamps))


async def _answer(engine, op: tuple) -> object:
    kind = op[0]
    try:
        if kind == "append":
            result = await engine.append(T, op[1], op[2])
            return result.base_offset, result.last_offset, result.log_start_offset
        if kind == "read":
            result = await engine.read(T, op[1], op[2], op[3])
            return (
                [(b.base_offset, b.record_count, bytes(b.data)) for b in result.batches],
                result.log_start_offset,
                result.end_offset,
            )
        if kind == "ts":
            return await engine.offset_for_timestamp(T, op[1], op[2])
        if kind == "max":
            return await engine.max_timestamp(T, op[1])
        if kind == "delete":
            return await engine.delete_before(T, op[1], op[2])
        if kind == "bounds":
            return engine.log_start_offset(T, op[1]), engine.end_offset(T, op[1])
    except OffsetOutOfRange as exc:
        return ("OffsetOutOfRange", exc.offset, exc.start, exc.end)
    raise AssertionError(kind)


def _random_op(rng: random.Random, end: dict[int, int]) -> tuple:
    queue = rng.randint(0, 1)
    roll = rng.random()
    if roll < 0.45:
        return ("append", queue, [_random_batch(rng) for _ in range(rng.choice([1, 1, 1, 2, 3]))])
    if roll < 0.7:
        return ("read", queue, rng.randint(-1, end[queue] + 1), rng.choice([0, 1, 300, 1_000, 5_000, 1 << 20]))
    if roll < 0.82:
        return ("ts", queue, rng.randint(-5, 2_100))
    if roll < 0.87:
        return ("max", queue)
    if roll < 0.94:
        return ("delete", queue, rng.randint(0, end[queue] + 1))
    return ("bounds", queue)


@pytest.mark.parametrize("seed", range(12))
async def test_engines_agree_on_random_operations(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    harnesses = [Harness(name, tmp_path / name) for name in ENGINE_NAMES]
    for h in harnesses:
        await h.open()
        await h.engine.create_shards(T, 2, TopicConfig())
    try:
        end = {0: 0, 1: 0}
        for step in range(60):
            op = _random_op(rng, end)
            answers = [await _answer(h.engine, op) for h in harnesses]
            for h, answer in zip(harnesses[1:], answers[1:]):
                assert answer == answers[0], f"seed {seed} step {step} {op[0]}: {h.name} differs from memory"
            end = {q: harnesses[0].engine.end_offset(T, q) for q in (0, 1)}
        # restart the durable engines: they must still agree with what the reference holds
        reference = harnesses[0].engine
        for h in harnesses[1:]:
            engine = await h.restart()
            for q in (0, 1):
                assert await _answer(engine, ("bounds", q)) == await _answer(reference, ("bounds", q))
                start = reference.log_start_offset(T, q)
                assert await _answer(engine, ("read", q, start, 1 << 30)) == await _answer(
                    reference, ("read", q, start, 1 << 30)
                )
                for ts in (-1, 500, 1_500):
                    assert await _answer(engine, ("ts", q, ts)) == await _answer(reference, ("ts", q, ts))
    finally:
        for h in harnesses:
            await h.close()
