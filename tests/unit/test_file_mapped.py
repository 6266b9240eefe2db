"""MappedFile and MappedFileQueue: bounds checks, positions, segment naming, pre-allocation, truncation, reload,
dropping flushed pages from the page cache."""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

import pytest
from helpers import cached_pages

from mqk.errors import OutOfBounds, StorageError
from mqk.store.file.mapped_file import (
    CACHE_DROP_ALIGN,
    PAGE,
    MappedFile,
    MappedFileQueue,
    data_regions,
    segment_name,
)

SIZE = 8192


def test_segment_names_are_20_digit_offsets() -> None:
    assert segment_name(0) == "0" * 20
    assert segment_name(1 << 30) == "00000000001073741824"


def test_new_file_has_its_size_and_empty_positions(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / segment_name(SIZE), SIZE, SIZE)
    try:
        assert os.path.getsize(mf.path) == SIZE
        assert (mf.wrote, mf.committed, mf.flushed) == (0, 0, 0)
        assert mf.start_offset == SIZE and mf.end_offset == 2 * SIZE
        assert mf.available() == SIZE
    finally:
        mf.close()


def test_append_view_and_bounds(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / "f", SIZE, 0)
    try:
        assert mf.append(b"hello") == 0
        assert mf.append(b"world") == 5
        assert mf.wrote == mf.committed == 10
        assert bytes(mf.view(0, 10)) == b"helloworld"
        # reads past the write position, below zero, or negative sizes are refused
        for pos, size in ((5, 6), (-1, 2), (0, -1), (11, 0)):
            with pytest.raises(OutOfBounds):
                mf.view(pos, size)
        # a write that does not fit leaves the position where it was
        with pytest.raises(OutOfBounds):
            mf.append(b"x" * (SIZE - 9))
        assert mf.wrote == 10
        mf.append(b"y" * (SIZE - 10))
        assert mf.is_full() and mf.available() == 0
        with pytest.raises(OutOfBounds):
            mf.append(b"z")
        with pytest.raises(OutOfBounds):
            mf.write_at(SIZE - 2, b"abc")
        with pytest.raises(OutOfBounds):
            mf.advance(1)
        with pytest.raises(OutOfBounds):
            mf.raw_view(SIZE - 1, 2)
        with pytest.raises(OutOfBounds):
            mf.set_positions(SIZE + 1)
    finally:
        mf.close()


def test_advance_publishes_bytes_written_in_place(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / "f", SIZE, 0)
    try:
        mf.buf[0:3] = b"abc"
        with pytest.raises(OutOfBounds):
            mf.view(0, 3)  # not published yet
        mf.advance(3)
        assert bytes(mf.view(0, 3)) == b"abc"
        with pytest.raises(OutOfBounds):
            mf.advance(-1)
    finally:
        mf.close()


def test_flush_and_reopen_keeps_bytes(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / "f", SIZE, 0)
    mf.append(b"durable")
    assert mf.flush() == 7 and mf.flushed == 7
    mf.close()
    again = MappedFile(tmp_path / "f", SIZE, 0)
    try:
        assert bytes(again.raw_view(0, 7)) == b"durable"
    finally:
        again.close()


def test_zero_from_cuts_the_tail(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / "f", SIZE, 0)
    try:
        mf.append(b"a" * 100)
        mf.zero_from(40)
        assert mf.wrote == 40
        assert bytes(mf.raw_view(40, 60)) == bytes(60)
        assert bytes(mf.raw_view(0, 40)) == b"a" * 40
    finally:
        mf.close()


@pytest.mark.parametrize("reserve_step", [0, PAGE], ids=["preallocated", "sparse"])
def test_zero_from_finds_bytes_left_anywhere_past_the_cut_and_looks_only_at_data(
    tmp_path: Path, reserve_step: int
) -> None:
    """After a crash, bytes past the log's end may be anywhere in the segment: written through the descriptor
    (flushed), or still dirty in the page cache through the mapping. zero_from finds every one, though it looks
    only at the data regions the kernel reports (a preallocated or sparse segment's holes read as zeros)."""
    size = 8 << 20
    mf = MappedFile(tmp_path / "f", size, 0, reserve_step)
    try:
        mf.append(b"a" * 100)
        with mf.descriptor() as fd:
            os.pwrite(fd, b"old", 3 << 20)  # on disk
            os.pwrite(fd, b"z", size - 1)
        mf.buf[5 << 20 : (5 << 20) + 4] = b"torn"  # dirty in the page cache only
        with mf.descriptor() as fd:
            regions = list(data_regions(fd, 50, size))
        for position in (50, 3 << 20, 5 << 20, size - 1):
            assert any(start <= position < end for start, end in regions), (position, regions)
        assert mf.zero_from(50) is True
        assert bytes(mf.raw_view(0, 50)) == b"a" * 50
        for position in (50, 3 << 20, 5 << 20, size - 8):
            assert bytes(mf.raw_view(position, 8)) == bytes(8)
        assert mf.zero_from(50) is False  # nothing left to change
    finally:
        mf.close()


def test_larger_file_is_refused_shorter_is_extended(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"\x01" * (SIZE + 1))
    with pytest.raises(StorageError):
        MappedFile(big, SIZE, 0)
    short = tmp_path / "short"
    short.write_bytes(b"\x02" * 100)
    mf = MappedFile(short, SIZE, 0)
    try:
        assert os.path.getsize(short) == SIZE
        assert bytes(mf.raw_view(0, 101)) == b"\x02" * 100 + b"\x00"
    finally:
        mf.close()


def test_close_with_live_views_does_not_fail(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / "f", SIZE, 0)
    mf.append(b"held")
    view = mf.view(0, 4)
    mf.destroy()  # readers' zero-copy views keep the mapping alive; the file goes
    assert bytes(view) == b"held"
    assert not (tmp_path / "f").exists()


def test_queue_rolls_named_segments_and_finds_offsets(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path / "log", SIZE)
    try:
        first = q.get_last_for_write()
        assert first.path.name == segment_name(0)
        first.append(b"a" * SIZE)
        second = q.get_last_for_write()
        assert second.start_offset == SIZE and second.path.name == segment_name(SIZE)
        second.append(b"bc")
        assert q.max_offset == SIZE + 2
        assert q.find(0) is first and q.find(SIZE - 1) is first and q.find(SIZE) is second
        assert bytes(q.view(SIZE, 2)) == b"bc"
        with pytest.raises(OutOfBounds):
            q.find(2 * SIZE)
        with pytest.raises(OutOfBounds):
            q.find(-1)
        # the next segment is being created in the background before anyone needs it
        q._allocator._pending[2 * SIZE].result(timeout=10)
        assert (tmp_path / "log" / segment_name(2 * SIZE)).exists()
        third = q.roll()
        assert third.start_offset == 2 * SIZE and second.is_full()
    finally:
        q.close()
    # the pre-allocated, never used segment is removed at close
    names = sorted(p.name for p in (tmp_path / "log").iterdir())
    assert names == [segment_name(0), segment_name(SIZE), segment_name(2 * SIZE)]


def test_queue_truncate_and_reload(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path / "log", SIZE, preallocate=False)
    for i in range(3):
        q.get_last_for_write().append(bytes([i + 1]) * SIZE)
    q.truncate(SIZE + 100)
    assert len(q.files) == 2 and q.max_offset == SIZE + 100
    assert bytes(q.files[1].raw_view(100, 10)) == bytes(10)
    assert not (tmp_path / "log" / segment_name(2 * SIZE)).exists()
    q.flush()
    q.close()
    again = MappedFileQueue(tmp_path / "log", SIZE, preallocate=False)
    again.load()
    try:
        assert [f.start_offset for f in again.files] == [0, SIZE]
        assert bytes(again.files[1].raw_view(0, 100)) == b"\x02" * 100
        assert again.delete_before(SIZE) == 1
        assert again.min_offset == SIZE
        assert again.delete_before(10 * SIZE) == 0  # never the last segment
    finally:
        again.close()


def test_load_ignores_foreign_and_misplaced_files(tmp_path: Path) -> None:
    d = tmp_path / "log"
    d.mkdir()
    (d / segment_name(0)).write_bytes(b"\x00" * SIZE)
    (d / segment_name(3 * SIZE)).write_bytes(b"\x00" * SIZE)  # a hole before it: not addressable
    (d / "notes.txt").write_text("not a segment")
    q = MappedFileQueue(d, SIZE, preallocate=False)
    q.load()
    try:
        assert [f.start_offset for f in q.files] == [0]
        # the misplaced file is set aside under another name, so a new segment can take its place
        assert (d / (segment_name(3 * SIZE) + ".unusable")).exists()
        assert (d / "notes.txt").exists()
    finally:
        q.close()


def test_load_refuses_segments_larger_than_configured_when_strict(tmp_path: Path) -> None:
    d = tmp_path / "log"
    d.mkdir()
    (d / segment_name(0)).write_bytes(b"\x01" * (2 * SIZE))
    with pytest.raises(StorageError, match="configured segment size"):
        MappedFileQueue(d, SIZE, preallocate=False).load(strict_size=True)
    assert (d / segment_name(0)).read_bytes() == b"\x01" * (2 * SIZE)  # untouched
    lenient = MappedFileQueue(d, SIZE, preallocate=False)
    lenient.load()
    assert lenient.files == [] and (d / (segment_name(0) + ".unusable")).exists()


@pytest.mark.parametrize("preallocate", [True, False])
def test_flush_fsyncs_the_directories_a_new_segment_appeared_in(tmp_path: Path, monkeypatch, preallocate) -> None:
    # fdatasync of a new file does not make its directory entry durable: without the directory fsync a crash can
    # lose a whole segment whose bytes the flush (and a sync-mode acknowledgement) said were on disk
    import mqk.store.file.mapped_file as mapped_file

    synced: list[Path] = []
    monkeypatch.setattr(mapped_file, "fsync_dir", lambda d: synced.append(Path(d)))
    root = tmp_path / "consumequeue"
    q = MappedFileQueue(root / "topic" / "0", SIZE, preallocate=preallocate)
    try:
        q.get_last_for_write().append(b"x" * 10)
        assert synced == []  # nothing before the flush: the append path never waits for a directory fsync
        q.flush()
        # the segment's directory, and each directory created on the way to it, deepest first
        assert synced == [root / "topic" / "0", root / "topic", root, tmp_path]
        synced.clear()
        q.get_last_for_write().append(b"y")
        q.flush()
        assert synced == []  # no new entry, no directory fsync
        q.last.wrote = SIZE  # full: the next write rolls to a new segment in the existing directory
        q.get_last_for_write().append(b"z")
        q.flush()
        assert synced == [root / "topic" / "0"]
    finally:
        q.close()


def test_sync_marks_claim_only_what_was_written_before_the_sync(tmp_path: Path, monkeypatch) -> None:
    """A filesystem-wide sync covers what was written before it started: note_synced moves each segment's flushed
    position to its write position at sync_marks time, never to a later write's, and clears only the directories
    noted by then."""
    import mqk.store.file.mapped_file as mapped_file

    monkeypatch.setattr(mapped_file, "fsync_dir", lambda d: None)
    q = MappedFileQueue(tmp_path / "cq" / "0", SIZE, preallocate=False)
    try:
        mf = q.get_last_for_write()
        mf.append(b"x" * 10)
        marks = q.sync_marks()
        assert marks == ([(mf, 10)], {tmp_path / "cq" / "0", tmp_path / "cq", tmp_path})
        assert mf.device == os.stat(tmp_path).st_dev
        mf.append(b"y" * 5)  # written while the sync runs: not covered
        q.note_synced(marks)
        assert mf.flushed == 10 and q.dirty_bytes() == 5
        assert q.sync_marks() == ([(mf, 15)], set())  # the directories were synced with the filesystem
        q.note_synced(([(mf, 8)], set()))  # an older mark never moves flushed back
        assert mf.flushed == 10
    finally:
        q.close()


def test_syncfs_syncs_a_filesystem_or_says_it_cannot(tmp_path: Path, monkeypatch) -> None:
    import errno

    from mqk.store import fsutil

    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"data")
        assert fsutil.syncfs(fd) is True
    finally:
        os.close(fd)
    with pytest.raises(OSError) as info:
        fsutil.syncfs(fd)  # closed
    assert info.value.errno == errno.EBADF
    monkeypatch.setattr(fsutil, "_syncfs", None)  # a platform without syncfs(2)
    assert fsutil.syncfs(0) is False


def _filled_queue(directory: Path, segment: int, segments: int) -> MappedFileQueue:
    """A queue of `segments` full segments written through the descriptor, read back through the mapping (so
    its pages are mapped, as a Fetch's views map them) and flushed."""
    q = MappedFileQueue(directory, segment, preallocate=False)
    for i in range(segments):
        mf = q.get_last_for_write()
        data = bytes([65 + i]) * segment
        mf.write(0, data)
        mf.advance(segment)
        assert bytes(mf.view(0, segment)) == data
    q.flush()
    return q


def test_drop_cache_below_lets_flushed_pages_go_and_reads_fault_them_back(tmp_path: Path) -> None:
    segment = 2 * CACHE_DROP_ALIGN
    per_align = CACHE_DROP_ALIGN // PAGE
    q = _filled_queue(tmp_path / "log", segment, 3)
    try:
        first, second, third = q.files
        assert all(cached_pages(first)) and all(cached_pages(second))
        upto = segment + CACHE_DROP_ALIGN + 5 * PAGE + 123  # rounded down to the second segment's middle
        assert q.drop_point(upto) == segment + CACHE_DROP_ALIGN
        assert q.drop_cache_below(0, upto, budget=1 << 30) == segment + CACHE_DROP_ALIGN
        assert not any(cached_pages(first))
        assert cached_pages(second) == [False] * per_align + [True] * per_align
        assert all(cached_pages(third))
        # the bytes come back from the file, through views taken before the drop as well
        assert bytes(q.view(0, segment)) == b"A" * segment
        assert bytes(q.view(segment, segment)) == b"B" * segment
    finally:
        q.close()


def test_drop_cache_below_stops_at_its_budget_and_goes_on_from_there(tmp_path: Path) -> None:
    segment = 2 * CACHE_DROP_ALIGN
    per_align = CACHE_DROP_ALIGN // PAGE
    q = _filled_queue(tmp_path / "log", segment, 2)
    try:
        first, second = q.files
        done = q.drop_cache_below(0, 2 * segment, budget=CACHE_DROP_ALIGN)
        assert done == CACHE_DROP_ALIGN
        assert cached_pages(first) == [False] * per_align + [True] * per_align
        assert q.drop_cache_below(done, 2 * segment, budget=2 * CACHE_DROP_ALIGN) == segment + CACHE_DROP_ALIGN
        assert not any(cached_pages(first))
        assert cached_pages(second) == [False] * per_align + [True] * per_align
        second.close()  # a segment deleted under the flusher: nothing to drop, no error
        assert q.drop_cache_below(segment + CACHE_DROP_ALIGN, 2 * segment, budget=1 << 30) == 2 * segment
    finally:
        q.close()


def _descriptors_of(path: Path) -> int:
    """How many of this process's open descriptors are `path` (the mapping's own duplicate included)."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the descriptor listdir itself used, closed by now
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    return links.count(str(path))


def test_a_file_without_its_own_descriptor_keeps_only_the_mappings(tmp_path: Path, monkeypatch) -> None:
    """hold_fd=False (ConsumeQueue files): one descriptor per file, the mapping's; a reservation and a flush open
    the file for their call and close it again, and the flush syncs that file."""
    import mqk.store.file.mapped_file as mapped_file

    synced = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fdatasync(fd)

    monkeypatch.setattr(mapped_file.os, "fdatasync", fdatasync)
    held = MappedFile(tmp_path / "held", 1 << 16, 0, reserve_step=PAGE)
    mf = MappedFile(tmp_path / "mapped", 1 << 16, 0, reserve_step=PAGE, hold_fd=False)
    try:
        assert (_descriptors_of(held.path), _descriptors_of(mf.path), mf.fd) == (2, 1, -1)
        mf.ensure_reserved(3 * PAGE)
        mf.append(b"unit" * 5)
        assert mf.flush() == 20 and synced == [str(mf.path)]
        assert mf.reserved == 3 * PAGE and os.stat(mf.path).st_blocks * 512 >= 3 * PAGE
        assert _descriptors_of(mf.path) == 1
        reopened = MappedFile(tmp_path / "mapped", 1 << 16, 0, hold_fd=False)
        assert bytes(reopened.raw_view(0, 20)) == b"unit" * 5
        reopened.close()
    finally:
        held.close()
        mf.close()
    assert _descriptors_of(mf.path) == 0
    mf.datasync()  # closed (a deleted segment): nothing left to sync, no error


def test_a_file_without_its_own_descriptor_reports_a_full_disk_and_leaks_nothing(tmp_path: Path, monkeypatch) -> None:
    import errno

    import mqk.store.file.mapped_file as mapped_file
    from mqk.errors import StorageFull

    mf = MappedFile(tmp_path / "mapped", 1 << 16, 0, reserve_step=PAGE, hold_fd=False)
    try:

        def no_space(*_args):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(mapped_file.os, "pwrite", no_space)
        with pytest.raises(StorageFull):
            mf.ensure_reserved(PAGE)
        assert mf.reserved == 0 and _descriptors_of(mf.path) == 1
        monkeypatch.undo()
        mf.append(b"x")  # (the disk is not really full: a store into the mapping works)
        mf.path.unlink()  # gone while open and not closed: a flush that cannot reach it says so
        with pytest.raises(FileNotFoundError):
            mf.flush()
    finally:
        mf.close()


def test_pages_are_dropped_without_the_gil_and_never_from_a_closed_mapping(tmp_path: Path, monkeypatch) -> None:
    """drop_cache's madvise is libc's through ctypes.CDLL, which releases the GIL (mmap.madvise holds it for the
    whole call); a close waits for a madvise of the mapping under way, and no madvise starts on a closed one (its
    addresses may belong to another mapping by then)."""
    import threading

    import mqk.store.file.mapped_file as mapped_file

    real = mapped_file._madvise
    assert real is not None and not real._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # a CDLL function: no GIL held
    q = _filled_queue(tmp_path / "log", 2 * CACHE_DROP_ALIGN, 1)
    mf = q.files[0]
    entered, release, calls = threading.Event(), threading.Event(), []

    def slow_madvise(address, length, advice):
        calls.append((address, length))
        entered.set()
        release.wait(10)
        return real(address, length, advice)

    monkeypatch.setattr(mapped_file, "_madvise", slow_madvise)
    dropper = threading.Thread(target=mf.drop_cache, args=(0, CACHE_DROP_ALIGN))
    closer = threading.Thread(target=mf.close)
    try:
        dropper.start()
        assert entered.wait(10)
        closer.start()
        closer.join(0.2)
        assert closer.is_alive() and not mf._closed  # the close waits for the madvise
        release.set()
        dropper.join(10)
        closer.join(10)
        assert not closer.is_alive() and mf._closed
        assert len(calls) == 1 and calls[0][1] == CACHE_DROP_ALIGN
        mf.drop_cache(0, CACHE_DROP_ALIGN)  # closed: no madvise at all
        assert len(calls) == 1
    finally:
        release.set()
        q.close()
