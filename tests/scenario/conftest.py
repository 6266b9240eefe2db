"""Scenario suite fixtures: one harness per engine (`memory`, `rocksdb`, `file`) and record batch builders.

Every test in tests/scenario takes `harness` and runs once per engine. The file engine runs with tiny CommitLog
segments (4 KiB) and ConsumeQueue files (16 units) so ordinary tests cross segment and file boundaries.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from mqk._fast import twin
from mqk.config import StoreConfig
from mqk.store.adapter import StorageAdapter

with warnings.catch_warnings():
    # kafka-python 3 reads its JSON schemas with importlib.resources' deprecated legacy API at import time; the
    # warning is attributed to importlib, so setup.cfg's `kafka.*` filter does not catch it.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

rb = twin("recbatch")

ENGINE_NAMES = ["memory", "rocksdb", "file"]
SMALL_SEGMENT = 4096


def store_config(engine: str, data_dir: Path, **changes: object) -> StoreConfig:
    base = StoreConfig(data_dir=data_dir, storage=engine, commitlog_segment_bytes=SMALL_SEGMENT, cq_units_per_file=16,
                       flush_interval_ms=20, checkpoint_interval_ms=50)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def new_engine(engine: str, config: StoreConfig) -> StorageAdapter:
    if engine == "memory":
        from mqk.store.memory import MemoryEngine

        return MemoryEngine()
    if engine == "rocksdb":
        from mqk.store.rocksdb import RocksEngine

        return RocksEngine(config, config.data_dir)
    from mqk.store.file.engine import FileEngine

    return FileEngine(config, config.data_dir)


class Harness:
    """An engine under test plus the means to restart it on the same data."""

    def __init__(self, name: str, data_dir: Path, **config_changes: object) -> None:
        self.name = name
        self.config = store_config(name, data_dir, **config_changes)
        self.engine: StorageAdapter | None = None

    @property
    def durable(self) -> bool:
        return self.name != "memory"

    async def open(self) -> StorageAdapter:
        self.engine = new_engine(self.name, self.config)
        await self.engine.start()
        return self.engine

    async def restart(self) -> StorageAdapter:
        assert self.engine is not None
        await self.engine.close()
        return await self.open()

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()
            self.engine = None


@pytest.fixture(params=ENGINE_NAMES)
def engine_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def harness(engine_name: str, tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(engine_name, tmp_path / "data")
    await h.open()
    try:
        yield h
    finally:
        await h.close()


# --- batch builders ------------------------------------------------------------------------------------


def twin_batch(values: Sequence[bytes], base_timestamp: int = 1_000, ts_step: int = 1,
               timestamps: Sequence[int] | None = None, keys: Sequence[bytes | None] | None = None) -> bytearray:
    """An uncompressed batch built with the recbatch twin; record i has value values[i] and timestamp
    timestamps[i] (or base_timestamp + i * ts_step)."""
    if timestamps is None:
        timestamps = [base_timestamp + i * ts_step for i in range(len(values))]
    base_ts = timestamps[0]
    records = b"".join(
        rb.encode_record(i, ts - base_ts, None if keys is None else keys[i], value, [("h", b"x")])
        for i, (ts, value) in enumerate(zip(timestamps, values)))
    return rb.build_batch(0, base_ts, max(timestamps), records, len(values), len(values) - 1)


def kafka_python_batch(values: Sequence[bytes], timestamps: Sequence[int], compression: int = 0) -> bytes:
    """A batch built by kafka-python's own producer-side builder (compression: 0 none, 1 gzip, 2 snappy, 3 lz4,
    4 zstd)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, (value, ts) in enumerate(zip(values, timestamps)):
        builder.append(i, timestamp=ts, key=b"key-%d" % i, value=value, headers=[])
    return bytes(builder.build())


def records_of(data: bytes | bytearray | memoryview) -> list[tuple[int, int, bytes | None]]:
    """(offset, timestamp, value) of every record in a stored batch, decoded independently by kafka-python."""
    batch = DefaultRecordBatch(bytes(data))
    assert batch.validate_crc(), "stored batch has a bad CRC"
    return [(r.offset, r.timestamp, r.value) for r in batch]


def header_of(data: bytes | bytearray | memoryview) -> tuple:
    return rb.parse_header(bytes(data), 0)


def snappy_twin_batch(values: Sequence[bytes], timestamps: Sequence[int], xerial: bool = False) -> bytes:
    """A snappy-compressed batch (kafka-python needs python-snappy for that; cramjam is what we have), raw or in
    the xerial framing the Java client writes."""
    import cramjam

    base_ts = timestamps[0]
    records = b"".join(rb.encode_record(i, ts - base_ts, b"key-%d" % i, value, [])
                       for i, (ts, value) in enumerate(zip(timestamps, values)))
    block = bytes(cramjam.snappy.compress_raw(records))
    if xerial:
        half = len(records) // 2  # two chunks, to exercise the chunk walk
        chunks = [bytes(cramjam.snappy.compress_raw(part)) for part in (records[:half], records[half:])]
        block = b"\x82SNAPPY\x00" + (1).to_bytes(4, "big") * 2 + b"".join(
            len(c).to_bytes(4, "big") + c for c in chunks)
    return bytes(rb.build_batch(0, base_ts, max(timestamps), block, len(values), len(values) - 1, attributes=2))
