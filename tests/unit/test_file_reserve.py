"""ConsumeQueue files reserve disk blocks in steps ahead of the writer, CommitLog segments all at once."""
from __future__ import annotations

import os

import pytest

from mqk.errors import OutOfBounds
from mqk.store.file.consumequeue import RESERVE_STEP
from mqk.store.file.mapped_file import MappedFile


def _allocated(path) -> int:
    return os.stat(path).st_blocks * 512


def test_stepped_file_holds_only_what_it_reserved(tmp_path):
    mf = MappedFile(tmp_path / "cq", 4 << 20, 0, reserve_step=RESERVE_STEP)
    try:
        assert _allocated(mf.path) <= RESERVE_STEP
        mf.ensure_reserved(RESERVE_STEP + 1)
        assert mf.reserved == 2 * RESERVE_STEP
        assert RESERVE_STEP < _allocated(mf.path) <= 2 * RESERVE_STEP
        mf.ensure_reserved(10)  # already reserved: nothing changes
        assert mf.reserved == 2 * RESERVE_STEP
        with pytest.raises(OutOfBounds):
            mf.ensure_reserved(mf.file_size + 1)
    finally:
        mf.close()


def test_whole_file_reserved_by_default(tmp_path):
    mf = MappedFile(tmp_path / "seg", 1 << 20, 0)
    try:
        assert mf.reserved == mf.file_size
        assert _allocated(mf.path) >= mf.file_size
    finally:
        mf.close()


async def test_a_thousand_quiet_queues_pin_little_disk(tmp_path):
    from mqk.config import StoreConfig, TopicConfig
    from mqk.store.manager import StoreManager
    from mqk.server.kafka.rawclient import make_batch

    store = StoreManager(StoreConfig(data_dir=tmp_path, storage="file", commitlog_segment_bytes=1 << 20))
    await store.start()
    try:
        await store.create_topic("many", 200, TopicConfig())
        for q in range(200):
            await store.append("many", q, [make_batch([b"x"])])
        cq_files = [p for p in (tmp_path / "consumequeue").rglob("*") if p.is_file()]
        assert len(cq_files) >= 200
        cq_bytes = sum(_allocated(p) for p in cq_files)
        assert cq_bytes <= 200 * RESERVE_STEP, cq_bytes
    finally:
        await store.close()
