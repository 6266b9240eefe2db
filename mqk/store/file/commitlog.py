"""CommitLog: the one append-only log of every topic and queue, in fixed-size mapped segments.

Owns `commitlog/` and the entry placement rules: an entry (layout in `mqk._fast.clentry`) is written at the end of
the last segment as its head (header, topic, base offset, CRC over the whole entry) and the producer's batch from
its 9th byte on (the append pipeline, append.py, writes runs of them with pwritev and moves the write position once
they are in place).
An entry never spans segments: when the next one would leave fewer than `clentry.BLANK_MIN_SIZE` bytes, the rest of
the segment becomes a BLANK entry and the entry goes to the next (pre-allocated) segment.

Also owns the recovery scan: walk entries from a safe point, verify each CRC, stop at the first end-of-data or bad
entry, and cut the log there. It does not know about queues: dispatch turns scanned entries into ConsumeQueue units.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from mqk._fast import load
from mqk._fast.api import LogEntry
from mqk.errors import Corrupt, MessageTooLarge, OutOfBounds
from mqk.store.file.mapped_file import MappedFile, MappedFileQueue

clentry = load("clentry")
log = logging.getLogger(__name__)

FIXED = clentry.FIXED_HEADER_SIZE
BLANK_MIN = getattr(clentry, "BLANK_MIN_SIZE", 8)
KIND_END, KIND_MESSAGE, KIND_BLANK = 0, 1, 2
#: what `fault_in` has the kernel read ahead past a reader's last entry
FAULT_IN_AHEAD = 16 << 20


class CommitLog:
    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self.dir = Path(directory)
        self.segment_bytes = segment_bytes
        self.mfq = MappedFileQueue(self.dir, segment_bytes, preallocate=True)

    # --- positions -------------------------------------------------------------------------------------

    @property
    def max_offset(self) -> int:
        return self.mfq.max_offset

    @property
    def current(self) -> MappedFile | None:
        """The segment being appended to (the last one)."""
        files = self.mfq.files
        return files[-1] if files else None

    @property
    def min_offset(self) -> int:
        return self.mfq.min_offset

    # --- append ----------------------------------------------------------------------------------------

    def roll_for(self, size: int) -> MappedFile:
        """End the current segment with a BLANK and open the next one, for an entry of `size` bytes that does not
        fit what is left (MessageTooLarge if it would not fit an empty segment either)."""
        if size + BLANK_MIN > self.segment_bytes:
            raise MessageTooLarge(f"entry of {size} bytes does not fit a {self.segment_bytes}-byte CommitLog segment")
        files = self.mfq.files
        mf = files[-1] if files else None
        if mf is None:
            return self.mfq.roll(0)
        rest = mf.file_size - mf.wrote
        if rest > 0:
            mf.write(mf.wrote, clentry.blank_head(rest))
            mf.advance(rest)
        return self.mfq.roll()

    def body_view(self, phys: int, size: int, topic_len: int) -> memoryview:
        """Zero-copy view of the record batch inside the entry at `phys` of `size` bytes."""
        mf = self.mfq.find(phys)
        pos = phys - mf.start_offset
        return mf.view(pos + FIXED + topic_len, size - FIXED - topic_len)

    def read_entry(self, phys: int, verify: bool = True) -> LogEntry:
        mf = self.mfq.find(phys)
        return clentry.read_entry(mf.buf, phys - mf.start_offset, mf.wrote, verify)

    # --- recovery --------------------------------------------------------------------------------------

    def load(self) -> None:
        self.mfq.load(strict_size=True)

    def scan(self, start: int) -> Iterator[tuple[int, LogEntry, MappedFile]]:
        """Yield (physical offset, read_entry tuple, segment) for every valid message entry from `start`, which
        must be an entry boundary (or a segment start). Afterwards `self.scan_end` is where valid data ends,
        and `self.scan_error` the Corrupt that stopped it (None at a clean end of data)."""
        self.scan_end = start
        self.scan_error: Corrupt | None = None
        files = self.mfq.files
        if not files:
            return
        try:
            idx = self.mfq.files.index(self.mfq.find(start))
        except OutOfBounds:
            # the safe point lies past every segment we have (they were lost): scan from the last one's start
            idx = len(files) - 1
            start = files[idx].start_offset
            self.scan_end = start
        read = clentry.read_entry
        pos = start - files[idx].start_offset
        while idx < len(files):
            mf = files[idx]
            buf = mf.buf
            limit = mf.file_size
            while True:
                try:
                    entry = read(buf, pos, limit, True)
                except Corrupt as exc:
                    self.scan_error = Corrupt(str(exc).split(" at position")[0], mf.start_offset + pos)
                    self.scan_end = mf.start_offset + pos
                    return
                kind = entry[0]
                if kind == KIND_MESSAGE:
                    size = entry[1]
                    if entry[5] != mf.start_offset + pos:
                        # a valid CRC over a wrong self-address: bytes copied from elsewhere (never ours to serve)
                        self.scan_error = Corrupt(f"entry claims physical offset {entry[5]}", mf.start_offset + pos)
                        self.scan_end = mf.start_offset + pos
                        return
                    yield mf.start_offset + pos, entry, mf
                    pos += size
                    self.scan_end = mf.start_offset + pos
                elif kind == KIND_BLANK:
                    self.scan_end = mf.end_offset
                    break
                else:
                    # end of data; a clean end lies in the last segment
                    self.scan_end = mf.start_offset + pos
                    return
            idx += 1
            pos = 0

    def truncate(self, offset: int, zero_tail: bool = True) -> None:
        self.mfq.truncate(offset, zero_tail)

    def claimed_size(self, offset: int) -> int:
        """The size field of the (possibly damaged) entry at `offset`, if it is plausible; else 8."""
        try:
            mf = self.mfq.find(offset)
        except OutOfBounds:
            return BLANK_MIN
        pos = offset - mf.start_offset
        if mf.file_size - pos < 4:
            return BLANK_MIN
        size = int.from_bytes(mf.buf[pos : pos + 4], "big", signed=True)
        return size if BLANK_MIN <= size <= mf.file_size - pos else BLANK_MIN

    def has_data_after(self, offset: int) -> bool:
        """Whether any non-zero byte lies at or after `offset` (tells a torn tail from damage in the middle)."""
        for mf in self.mfq.files:
            if mf.end_offset <= offset:
                continue
            pos = max(0, offset - mf.start_offset)
            step = 1 << 20
            while pos < mf.file_size:
                chunk = mf.buf[pos : min(pos + step, mf.file_size)]
                if chunk.tobytes().strip(b"\x00"):
                    return True
                pos += step
        return False

    # --- durability / life cycle -----------------------------------------------------------------------

    def flush(self) -> int:
        return self.mfq.flush()

    def drop_point(self, offset: int) -> int:
        return self.mfq.drop_point(offset)

    def drop_cache_below(self, start: int, upto: int, budget: int) -> int:
        """See MappedFileQueue.drop_cache_below: the flusher lets the page cache of old flushed bytes go."""
        return self.mfq.drop_cache_below(start, upto, budget)

    def fault_in(self, entries: list[tuple[int, int]], ahead: bool = True) -> None:
        """Read the entries at (physical offset, size), in log order, into the page cache (blocking: call from a
        worker thread); entries side by side are read as one range. Unless `ahead` is false the kernel is asked to
        read FAULT_IN_AHEAD bytes past the last one in the background, where a reader going on through the log
        reads next."""
        ranges: list[list[int]] = []
        for phys, size in entries:
            if ranges and ranges[-1][1] == phys:
                ranges[-1][1] = phys + size
            else:
                ranges.append([phys, phys + size])
        for i, (start, end) in enumerate(ranges):
            self.mfq.fault_in(start, end, FAULT_IN_AHEAD if ahead and i == len(ranges) - 1 else 0)

    def fault_in_at(self, offsets: list[int]) -> None:
        """`fault_in` for entries known only by where they start (sorted CommitLog offsets), each entry's size read
        from its first four bytes here (blocking: call from a worker thread). An offset that is stale or not an
        entry start reads any four bytes: what is read is bounded by its segment's written end."""
        files = self.mfq.snapshot()
        starts = [mf.start_offset for mf in files]
        entries = []
        for phys in offsets:
            i = bisect.bisect_right(starts, phys) - 1
            if i < 0:
                continue
            mf = files[i]
            pos = phys - mf.start_offset
            if pos + 4 > mf.wrote:
                continue
            try:
                size = int.from_bytes(os.pread(mf.fd, 4, pos), "big", signed=True)
            except OSError:  # the segment was closed meanwhile: nothing to read back
                continue
            entries.append((phys, max(4, min(size, mf.wrote - pos))))
        self.fault_in(entries)

    def close(self) -> None:
        self.mfq.close()
