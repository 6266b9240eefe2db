"""MappedFile warm-up ahead of the writer (follow_writer / populate) and range flushes (sync_range): what gets
populated and synced, the fallbacks, and that neither changes a byte of the file."""
from __future__ import annotations

import ctypes
import errno
import os
import threading
from pathlib import Path

import pytest

from mqk.store.file import mapped_file
from mqk.store.file.mapped_file import PAGE, MappedFile, MappedFileQueue, follow_writer, populate, segment_name

SIZE = 1 << 20


class FakeLibc:
    """Stands in for libc's madvise / msync: records (offset in the mapping, size, arg) per call."""

    def __init__(self, mf: MappedFile, fail_errno: int = 0) -> None:
        holder = ctypes.c_char.from_buffer(mf.mm)
        self.base = ctypes.addressof(holder)
        del holder
        self.fail_errno = fail_errno
        self.msyncs: list[tuple[int, int, int]] = []
        self.madvises: list[tuple[int, int, int]] = []

    def _record(self, calls, addr, size, arg) -> int:
        calls.append((addr - self.base, size, arg))
        if self.fail_errno:
            ctypes.set_errno(self.fail_errno)
            return -1
        return 0

    def msync(self, addr, size, arg) -> int:
        return self._record(self.msyncs, addr, size, arg)

    def madvise(self, addr, size, arg) -> int:
        return self._record(self.madvises, addr, size, arg)

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(mapped_file, "_libc", (ctypes, self.madvise, self.msync))


def _no_fdatasync(fd: int) -> None:
    raise AssertionError("fdatasync called although msync was available")


def test_flush_syncs_only_the_range_not_yet_flushed(tmp_path: Path, monkeypatch) -> None:
    mf = MappedFile(tmp_path / "f", SIZE, 0)
    try:
        fake = FakeLibc(mf)
        fake.install(monkeypatch)
        monkeypatch.setattr(mapped_file.os, "fdatasync", _no_fdatasync)
        mf.append(b"a" * 5000)
        assert mf.flush() == 5000
        mf.append(b"b" * 4000)
        assert mf.flush() == 9000
        assert mf.flush() == 9000  # nothing new: no call
        # from the page holding the flushed position (msync needs page alignment) to the write position
        assert fake.msyncs == [(0, 5000, 4), (PAGE, 9000 - PAGE, 4)]
        assert mf.flushed == 9000
    finally:
        mf.close()


def test_flush_falls_back_to_fdatasync_without_msync(tmp_path: Path, monkeypatch) -> None:
    mf = MappedFile(tmp_path / "f", SIZE, 0)
    calls = []
    try:
        monkeypatch.setattr(mapped_file, "_libc", None)
        monkeypatch.setattr(mapped_file.os, "fdatasync", calls.append)
        mf.append(b"x" * 10)
        assert mf.flush() == 10
        assert calls == [mf.fd]
        # a platform whose msync refuses the mapping (EINVAL) also falls back
        FakeLibc(mf, fail_errno=errno.EINVAL).install(monkeypatch)
        mf.append(b"y")
        assert mf.flush() == 11
        assert calls == [mf.fd, mf.fd]
    finally:
        mf.close()


def test_flush_io_error_is_raised_and_nothing_counts_as_flushed(tmp_path: Path, monkeypatch) -> None:
    mf = MappedFile(tmp_path / "f", SIZE, 0)
    try:
        FakeLibc(mf, fail_errno=errno.EIO).install(monkeypatch)
        monkeypatch.setattr(mapped_file.os, "fdatasync", _no_fdatasync)
        mf.append(b"x" * 10)
        with pytest.raises(OSError) as info:
            mf.flush()
        assert info.value.errno == errno.EIO
        assert mf.flushed == 0
    finally:
        mf.close()


def test_write_below_the_flushed_position_is_in_the_next_flush(tmp_path: Path, monkeypatch) -> None:
    mf = MappedFile(tmp_path / "f", SIZE, 0)
    try:
        fake = FakeLibc(mf)
        fake.install(monkeypatch)
        mf.append(b"a" * (3 * PAGE))
        mf.flush()
        mf.write_at(100, b"zz")
        mf.append(b"b")
        mf.flush()
        assert fake.msyncs[-1] == (0, 3 * PAGE + 1, 4)
    finally:
        mf.close()


def test_real_range_flush_keeps_the_bytes(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / "f", SIZE, 0)
    mf.append(b"first")
    mf.flush()
    mf.append(b"-second" * 1000)
    assert mf.flush() == 5 + 7000
    mf.close()
    data = (tmp_path / "f").read_bytes()
    assert data[:7005] == b"first" + b"-second" * 1000 and data[7005:] == bytes(SIZE - 7005)


def test_follow_writer_stays_ahead_of_the_writer_and_never_behind(tmp_path: Path, monkeypatch) -> None:
    mf = MappedFile(tmp_path / "f", SIZE, 0)
    ahead, step = 256 << 10, 64 << 10
    lead = ahead // 4
    calls = []  # (start, size, write position when called)

    def fake_populate(target, pos, size, advice=mapped_file._MADV_POPULATE_WRITE):
        assert target is mf and advice == 23
        calls.append((pos, size, mf.wrote))
        return True

    def writer_moves() -> bool:  # the "writer" advances 40,000 bytes whenever the follower looks
        mf.wrote = min(SIZE, mf.wrote + 40_000)
        return False

    monkeypatch.setattr(mapped_file, "populate", fake_populate)
    monkeypatch.setattr(mapped_file, "_WARM_POLL_MIN", 0.0001)
    try:
        mf.wrote = 0
        assert follow_writer(mf, writer_moves, ahead, step) is True
        assert calls, "nothing was populated"
        end = 0
        for pos, size, wrote in calls:
            assert pos % PAGE == 0 and 0 < size <= step
            assert pos >= end  # each page once
            assert pos >= -(-wrote // PAGE) * PAGE  # never at or behind the writer's page
            assert pos + size <= wrote - wrote % PAGE + ahead  # no more than `ahead` past it
            if end < wrote:  # the writer had overtaken the warm-up: it resumes `lead` past it
                assert pos >= wrote + lead
            end = pos + size
        assert end == SIZE  # covered to the end of the segment before the writer got there
        # the writer moved before the first look (to 40,000), so the warm-up started `lead` past it
        assert calls[0] == (-(-(40_000 + lead) // PAGE) * PAGE, step, 40_000)
        assert len({wrote for _, _, wrote in calls}) > 3  # it followed the writer over several looks
    finally:
        mf.close()


def test_follow_writer_resumes_ahead_of_a_writer_that_overtook_it(tmp_path: Path, monkeypatch) -> None:
    mf = MappedFile(tmp_path / "f", SIZE, 0)
    ahead, step = 256 << 10, 64 << 10
    calls = []

    def fake_populate(target, pos, size, advice=mapped_file._MADV_POPULATE_WRITE):
        calls.append((pos, size, mf.wrote))
        mf.wrote = min(SIZE, mf.wrote + 300_000)  # a writer faster than the warm-up
        return True

    monkeypatch.setattr(mapped_file, "populate", fake_populate)
    try:
        mf.wrote = 10_000
        assert follow_writer(mf, lambda: False, ahead, step) is True
        assert calls[0][0] == -(-(10_000 + ahead // 4) // PAGE) * PAGE  # a head start, not beside the writer
        for pos, _size, wrote in calls:
            assert pos >= wrote + ahead // 4 and pos % PAGE == 0
    finally:
        mf.close()


def test_follow_writer_gives_up_where_populate_is_unsupported(tmp_path: Path, monkeypatch) -> None:
    mf = MappedFile(tmp_path / "f", SIZE, 0)
    try:
        FakeLibc(mf, fail_errno=errno.EINVAL).install(monkeypatch)  # a kernel before 5.14
        assert follow_writer(mf, lambda: False, 256 << 10, 64 << 10) is False
        mf.wrote = SIZE
        assert follow_writer(mf, lambda: False) is True  # a full segment needs nothing
    finally:
        mf.close()


def test_populate_changes_no_byte(tmp_path: Path) -> None:
    path = tmp_path / "f"
    mf = MappedFile(path, SIZE, 0)
    try:
        mf.append(b"data" * 1000)
        ok = populate(mf, 0, SIZE)
        assert isinstance(ok, bool)
        assert bytes(mf.raw_view(0, 4000)) == b"data" * 1000
        assert bytes(mf.raw_view(4000, SIZE - 4000)) == bytes(SIZE - 4000)
        mf.flush()
    finally:
        mf.close()
    assert path.read_bytes() == b"data" * 1000 + bytes(SIZE - 4000)
    assert os.path.getsize(path) == SIZE


def test_background_allocator_follows_the_segment_being_written(tmp_path: Path, monkeypatch) -> None:
    followed = []
    heads = []
    first_head, second_head = threading.Event(), threading.Event()

    def fake_follow(mf, stop, *args):
        followed.append(mf.start_offset)
        return True

    def fake_populate(mf, pos, size, advice=mapped_file._MADV_POPULATE_WRITE):
        heads.append((mf.start_offset, pos, size))
        (second_head if first_head.is_set() else first_head).set()
        return True

    monkeypatch.setattr(mapped_file, "follow_writer", fake_follow)
    monkeypatch.setattr(mapped_file, "populate", fake_populate)
    q = MappedFileQueue(tmp_path / "log", SIZE)
    try:
        q.prepare_next()  # at start with no segment: nothing to follow yet, the new one's head is warmed
        assert first_head.wait(5)
        first = q.roll(0)
        first.append(b"x" * 10)
        assert second_head.wait(5)
    finally:
        q.close()
    assert followed == [0]  # creating segment 1 MiB, the thread then follows segment 0 (being written)
    assert (0, 0, SIZE) in heads and (SIZE, 0, SIZE) in heads
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == [segment_name(0)]
