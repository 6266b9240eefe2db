"""MappedFile writes through the file descriptor (`write`, a pwritev) and flushes (fdatasync): where the bytes land,
what counts as flushed, and how failures are typed. The allocator's background segment creation is here too."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from mqk.errors import OutOfBounds, StorageError, StorageFull
from mqk.store.file import mapped_file
from mqk.store.file.mapped_file import PAGE, MappedFile, MappedFileQueue, segment_name

SIZE = 1 << 20


@pytest.fixture
def mf(tmp_path: Path):
    f = MappedFile(tmp_path / "f", SIZE, 0)
    yield f
    f.close()


def test_write_lands_and_the_mapping_sees_it(mf: MappedFile, tmp_path: Path) -> None:
    mf.write(0, memoryview(b"--tail bytes")[2:])
    assert mf.wrote == 0, "a write publishes nothing by itself"
    mf.advance(10)
    assert bytes(mf.view(0, 10)) == b"tail bytes"
    mf.write(10, bytearray(b"!"))
    mf.advance(1)
    mf.flush()
    assert (tmp_path / "f").read_bytes()[:12] == b"tail bytes!\x00"


def test_write_outside_the_file_is_refused_and_writes_nothing(mf: MappedFile) -> None:
    with pytest.raises(OutOfBounds):
        mf.write(SIZE - 3, b"abcd")
    with pytest.raises(OutOfBounds):
        mf.write(-1, b"a")
    assert bytes(mf.raw_view(SIZE - 3, 3)) == b"\x00\x00\x00"


def test_write_errors_are_typed(mf: MappedFile, monkeypatch) -> None:
    def fail(code):
        def pwrite(fd, data, pos):
            raise OSError(code, os.strerror(code))

        return pwrite

    monkeypatch.setattr(mapped_file.os, "pwrite", fail(errno.ENOSPC))
    with pytest.raises(StorageFull):
        mf.write(0, b"x")
    monkeypatch.setattr(mapped_file.os, "pwrite", fail(errno.EIO))
    with pytest.raises(StorageError) as info:
        mf.write(0, b"x")
    assert not isinstance(info.value, StorageFull) and "f" in str(info.value)


def test_a_short_write_is_finished(mf: MappedFile, monkeypatch) -> None:
    real = os.pwrite
    calls = []

    def short(fd, data, pos):  # the kernel stops after 3 bytes (a signal, say)
        calls.append(pos)
        return real(fd, bytes(data)[:3], pos)

    monkeypatch.setattr(mapped_file.os, "pwrite", short)
    mf.write(10, b"abcdefghij")
    mf.advance(20)
    assert calls == [10, 13, 16, 19]
    assert bytes(mf.view(10, 10)) == b"abcdefghij"


def test_flush_syncs_only_when_something_is_unflushed(mf: MappedFile, monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(mapped_file.os, "fdatasync", calls.append)
    mf.append(b"a" * 5000)
    assert mf.flush() == 5000
    assert mf.flush() == 5000  # nothing new: no call
    mf.write(5000, b"b" * 4000)
    mf.advance(4000)
    assert mf.flush() == 9000
    assert calls == [mf.fd, mf.fd]


def test_flush_io_error_is_raised_and_nothing_counts_as_flushed(mf: MappedFile, monkeypatch) -> None:
    def fail(fd):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(mapped_file.os, "fdatasync", fail)
    mf.append(b"x" * 10)
    with pytest.raises(OSError) as info:
        mf.flush()
    assert info.value.errno == errno.EIO
    assert mf.flushed == 0


def test_a_write_below_the_flushed_position_is_in_the_next_flush(mf: MappedFile, monkeypatch) -> None:
    mf.append(b"a" * (3 * PAGE))
    mf.flush()
    mf.write(100, b"zz")  # a repair through the descriptor
    assert mf.flushed == 100
    mf.flush()
    assert mf.flushed == 3 * PAGE
    mf.write_at(5, b"y")  # and through the mapping
    assert mf.flushed == 5


def test_flushed_bytes_read_back_from_the_file(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / "f", SIZE, 0)
    mf.append(b"first")
    mf.flush()
    mf.write(5, b"-second" * 1000)
    mf.advance(7000)
    assert mf.flush() == 5 + 7000
    mf.close()
    data = (tmp_path / "f").read_bytes()
    assert data[:7005] == b"first" + b"-second" * 1000 and data[7005:] == bytes(SIZE - 7005)


def test_the_allocator_creates_the_next_segment_ahead_and_close_removes_an_unused_one(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path / "log", SIZE)
    try:
        q.prepare_next()  # the first segment, created in the background
        first = q.roll(0)  # takes it, and asks for the one after
        assert first.start_offset == 0
        first.append(b"x" * 10)
        second_path = tmp_path / "log" / segment_name(SIZE)
        q._allocator._pending[SIZE].result(timeout=10)  # asked for by the roll, created in the allocator's thread
        assert second_path.exists(), "the next segment was not created ahead"
    finally:
        q.close()
    # the pre-allocated segment was never handed out, so a restart must not find it
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == [segment_name(0)]
