"""ConsumeQueue files reserve disk blocks in steps ahead of the writer, CommitLog segments all at once."""

from __future__ import annotations

import os

import pytest

from mqk.errors import OutOfBounds
from mqk.store.file.consumequeue import RESERVE_STEP, UNIT
from mqk.store.file.mapped_file import PAGE, MappedFile


def _allocated(path) -> int:
    return os.stat(path).st_blocks * 512


def _block_rounded(directory, size: int) -> int:
    """`size` rounded up to the filesystem's allocation unit, what a file of `size` written bytes may take."""
    block = os.statvfs(directory).f_bsize
    return -(-size // block) * block


def test_stepped_file_reserves_from_one_page_doubling_up_to_the_step(tmp_path):
    mf = MappedFile(tmp_path / "cq", 4 << 20, 0, reserve_step=RESERVE_STEP)
    try:
        assert mf.reserved == 0 and _allocated(mf.path) == 0
        mf.ensure_reserved(UNIT)  # a new queue's first unit: one page, not a whole step
        assert mf.reserved == PAGE
        assert 0 < _allocated(mf.path) <= _block_rounded(tmp_path, PAGE)
        grown = []
        while mf.reserved < 3 * RESERVE_STEP:
            mf.ensure_reserved(mf.reserved + UNIT)
            grown.append(mf.reserved)
        assert 16 * PAGE == RESERVE_STEP  # (the list below assumes 4 KiB pages and a 64 KiB step)
        assert grown == [2 * PAGE, 4 * PAGE, 8 * PAGE, RESERVE_STEP, 2 * RESERVE_STEP, 3 * RESERVE_STEP]
        assert RESERVE_STEP * 2 < _allocated(mf.path) <= _block_rounded(tmp_path, 3 * RESERVE_STEP)
        mf.ensure_reserved(10)  # already reserved: nothing changes
        assert mf.reserved == 3 * RESERVE_STEP
        mf.ensure_reserved(10 * RESERVE_STEP + 1)  # a jump ahead rounds up to the step, not beyond
        assert mf.reserved == 11 * RESERVE_STEP
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
    from mqk.server.kafka.rawclient import make_batch
    from mqk.store.manager import StoreManager

    store = StoreManager(StoreConfig(data_dir=tmp_path, storage="file", commitlog_segment_bytes=1 << 20))
    await store.start()
    try:
        await store.create_topic("many", 200, TopicConfig())
        for q in range(200):
            await store.append("many", q, [make_batch([b"x"])])
        cq_files = [p for p in (tmp_path / "consumequeue").rglob("*") if p.is_file()]
        assert len(cq_files) >= 200
        cq_bytes = sum(_allocated(p) for p in cq_files)
        assert cq_bytes <= 200 * _block_rounded(tmp_path, PAGE), cq_bytes  # a page each, not a 64 KiB step
    finally:
        await store.close()
