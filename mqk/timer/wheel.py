"""The timer's compact bookkeeping: `SpillIndex` (far-future messages, off the Python heap) and `DoneSet` (delivered
offsets above the floor, one bit each).

`SpillIndex` is the timer's counterpart of RocketMQ's TimerLog and TimerWheel: a message due beyond the timer's
horizon is not kept as a Python object but as one fixed-size record (due, timer offset, position of the previous
record of its bucket) in a scratch file, with one small entry per bucket of due time (the position of its last
record and how many it chains). When a bucket comes within the horizon, `take` walks its chain back and hands the
pairs to the in-memory schedule. The index is derived data: the timer topic holds the messages and the state document
says which are delivered, so the file is recreated empty whenever the timer (re)reads its topic from the floor, and a
crash loses nothing. A store without a data directory (the memory engine) keeps the same records in a bytearray.

`DoneSet` keeps "delivered, above the floor" as a bitmap based just below the floor (shifted as the floor advances),
so messages delivered out of offset order cost one bit each instead of a Python int in a set.

`Coverage` keeps what the state document says about them small: messages go out in due order, not offset order, so
listing the delivered offsets above the floor (the floor stays at the oldest message still waiting) would list about
half of everything delivered while a random-order spread of due times drains; it says "due before T" instead.
"""

from __future__ import annotations

import heapq
import os
import re
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

_RECORD = struct.Struct("<qqq")  # due (ms), timer offset, position of the bucket's previous record (-1: none)
RECORD_SIZE = _RECORD.size
#: records buffered before a write to the scratch file (the buffer is also read while a chain is walked)
_FLUSH_BYTES = 1 << 16
#: the scratch file is rewritten with only its live records when it is this big and mostly taken already
_COMPACT_BYTES = 64 << 20


class SpillIndex:
    """(due, timer offset) pairs by bucket of due time (`bucket_ms` wide), in `path` (or in memory when None)."""

    def __init__(self, path: Path | None, bucket_ms: int) -> None:
        self.path = path
        self.bucket_ms = bucket_ms
        self.count = 0
        self._heads: dict[int, tuple[int, int]] = {}  # bucket -> (position of its last record, records chained)
        self._buckets: list[int] = []  # heap of the buckets in _heads
        self._buf = bytearray()  # records not yet in the file (all of them without a file)
        self._flushed = 0  # bytes in the file
        self._fd: int | None = None

    def bucket(self, due: int) -> int:
        return due // self.bucket_ms

    def reset(self) -> None:
        """Forget every record (the timer re-reads its topic from the floor): the file is truncated."""
        self._heads.clear()
        self._buckets.clear()
        self._buf = bytearray()
        self._flushed = 0
        self.count = 0
        if self.path is not None:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            else:
                os.ftruncate(self._fd, 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._heads.clear()
        self._buckets.clear()
        self._buf = bytearray()
        self._flushed = 0
        self.count = 0

    def add(self, due: int, offset: int) -> None:
        if self.path is not None and self._fd is None:
            self.reset()
        bucket = due // self.bucket_ms
        head = self._heads.get(bucket)
        if head is None:
            head = (-1, 0)
            heapq.heappush(self._buckets, bucket)
        position = self._flushed + len(self._buf)
        self._buf += _RECORD.pack(due, offset, head[0])
        self._heads[bucket] = (position, head[1] + 1)
        self.count += 1
        if self._fd is not None and len(self._buf) >= _FLUSH_BYTES:
            self._flush()

    def first_bucket(self) -> int | None:
        """The earliest bucket holding records, or None."""
        return self._buckets[0] if self._buckets else None

    def bucket_size(self, bucket: int) -> int:
        head = self._heads.get(bucket)
        return 0 if head is None else head[1]

    def take_first(self) -> list[tuple[int, int]]:
        """Remove the earliest bucket and return its (due, timer offset) pairs (in no particular order)."""
        bucket = heapq.heappop(self._buckets)
        position, count = self._heads.pop(bucket)
        pairs = list(self._chain(position))
        self.count -= count
        if self.count == 0:
            self._truncate()
        else:
            held = self._flushed + len(self._buf)
            if held > _COMPACT_BYTES and self.count * RECORD_SIZE * 4 < held:
                self._compact()
        return pairs

    def peek(self, limit: int) -> list[tuple[int, int]]:
        """The `limit` pairs due first, soonest first, left in place (for listings)."""
        out: list[tuple[int, int]] = []
        for bucket in sorted(self._heads):
            if len(out) >= limit:
                break
            out.extend(sorted(self._chain(self._heads[bucket][0])))
        return out[:limit]

    def _chain(self, position: int) -> Iterator[tuple[int, int]]:
        while position >= 0:
            if position >= self._flushed:
                due, offset, position = _RECORD.unpack_from(self._buf, position - self._flushed)
            else:
                assert self._fd is not None
                due, offset, position = _RECORD.unpack(os.pread(self._fd, RECORD_SIZE, position))
            yield due, offset

    def _flush(self) -> None:
        assert self._fd is not None
        os.pwrite(self._fd, self._buf, self._flushed)
        self._flushed += len(self._buf)
        self._buf = bytearray()

    def _truncate(self) -> None:
        """Nothing left: the file starts again empty (its space is the disk's again)."""
        self._buf = bytearray()
        self._flushed = 0
        if self._fd is not None:
            os.ftruncate(self._fd, 0)

    def _compact(self) -> None:
        """Rewrite the records with only the chains still held, each bucket's records next to each other, so that
        under steady traffic the file (or buffer) stays a small multiple of what it holds."""
        heads: dict[int, tuple[int, int]] = {}
        if self._fd is None:  # in memory: a new buffer
            out = bytearray()
            for bucket, (position, count) in self._heads.items():
                previous = -1
                for due, offset in self._chain(position):
                    here = len(out)
                    out += _RECORD.pack(due, offset, previous)
                    previous = here
                heads[bucket] = (previous, count)
            self._heads, self._buf = heads, out
            return
        assert self.path is not None
        tmp = self.path.with_name(self.path.name + ".new")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        out = bytearray()
        written = 0
        try:
            for bucket, (position, count) in self._heads.items():
                previous = -1
                for due, offset in self._chain(position):
                    here = written + len(out)
                    out += _RECORD.pack(due, offset, previous)
                    previous = here
                    if len(out) >= _FLUSH_BYTES:
                        os.pwrite(fd, out, written)
                        written += len(out)
                        out = bytearray()
                heads[bucket] = (previous, count)
            os.pwrite(fd, out, written)
            written += len(out)
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            raise
        os.close(self._fd)
        self._fd = fd
        self._heads = heads
        self._flushed = written
        self._buf = bytearray()


_SET_BYTES = re.compile(rb"\xff+|[^\x00\xff]")


class DoneSet:
    """Offsets above a floor (the lowest offset not held), one bit each from `base` (a multiple of 8 at most the
    floor). The floor moves only through `advance`, which the owner calls when the offset at the floor is added."""

    def __init__(self) -> None:
        self._floor = 0  # (bits below it may still be set until their byte is dropped: they do not count)
        self._base = 0
        self._bits = bytearray()

    def clear(self, floor: int = 0) -> None:
        self._floor = floor
        self._base = floor - floor % 8
        self._bits = bytearray()

    def load(self, floor: int, runs: Iterable[tuple[int, int]]) -> None:
        """Start again from `floor` with the offsets of [first, last] `runs` (the state document's form)."""
        self.clear(floor)
        for first, last in runs:
            self.add_range(max(first, floor), last)

    def add_range(self, first: int, last: int) -> None:
        """Set first..last (inclusive): whole bytes at once, the ragged ends bit by bit."""
        first = max(first, self._floor)
        while first <= last and (first - self._base) & 7:
            self.add(first)
            first += 1
        while last >= first and (last - self._base + 1) & 7:
            self.add(last)
            last -= 1
        if first <= last:
            start, end = (first - self._base) >> 3, (last - self._base + 1) >> 3
            if end > len(self._bits):
                self._bits.extend(bytes(end - len(self._bits)))
            self._bits[start:end] = b"\xff" * (end - start)

    def add(self, offset: int) -> None:
        index = offset - self._base
        if offset < self._floor:
            return  # below the floor: delivered already
        byte = index >> 3
        if byte >= len(self._bits):
            self._bits.extend(bytes(byte + 1 - len(self._bits)))
        self._bits[byte] |= 1 << (index & 7)

    def __contains__(self, offset: int) -> bool:
        index = offset - self._base
        if offset < self._floor:
            return False
        byte = index >> 3
        return byte < len(self._bits) and bool(self._bits[byte] >> (index & 7) & 1)

    def advance(self, floor: int) -> int:
        """The floor moved past every offset from `floor` that is set; the bits below it are dropped."""
        bits = self._bits
        index = floor - self._base
        while True:
            byte = index >> 3
            if byte >= len(bits):
                break
            if bits[byte] == 0xFF and index & 7 == 0:
                index += 8
                continue
            if not bits[byte] >> (index & 7) & 1:
                break
            index += 1
        floor = self._floor = self._base + index
        drop = index >> 3
        if drop and (drop >= 4096 or drop * 2 >= len(bits)):  # shift rarely: a shift costs the bitmap's length
            del bits[:drop]
            self._base += drop * 8
        return floor

    def runs(self) -> list[list[int]]:
        """The offsets held (all above the floor), as [first, last] runs (ascending)."""
        runs: list[list[int]] = []
        base, floor = self._base, self._floor

        def extend(first: int, last: int) -> None:
            if first < floor:
                if last < floor:
                    return
                first = floor
            if runs and runs[-1][1] == first - 1:
                runs[-1][1] = last
            else:
                runs.append([first, last])

        for match in _SET_BYTES.finditer(self._bits):
            start, end = match.span()
            value = self._bits[start]
            if value == 0xFF:
                extend(base + start * 8, base + end * 8 - 1)
                continue
            for bit in range(8):
                if value >> bit & 1:
                    extend(base + start * 8 + bit, base + start * 8 + bit)
        return runs


#: the due time a skipped (unreadable) record is kept under: no rectangle covers it, so the document names it
NO_DUE = 1 << 62


class Coverage:
    """Which delivered timer messages above the floor the state document names by rule rather than one by one.

    A *rectangle* (scanned, below) says: every timer message at an offset below `scanned` and due before `below` is
    delivered. Once true it stays true (a delivered message stays delivered), and it is true whenever `below` is at
    most the due time of every message read (offsets below `scanned`) and not delivered yet: the head of the timer's
    schedule, so each save adds one. The rectangles kept form a staircase (offsets up, due times down): a new one drops
    those it contains, and while a message read late holds `below` back the older, higher ones stay (at most
    MAX_RECTANGLES; past that a new one is left out, which only leaves more messages named one by one).

    Delivered messages no rectangle covers are kept as (due, offset) pairs and saved as the document's `done` runs:
    with delivery in due order these are ties at the head's due time and messages read after later-due ones went out,
    a few, where listing every delivered offset above the floor grew with the spread.
    """

    MAX_RECTANGLES = 64

    def __init__(self) -> None:
        self.rectangles: list[tuple[int, int]] = []  # (scanned, below), scanned ascending, below descending
        self._uncovered: list[tuple[int, int]] = []  # (due, offset) delivered, in no rectangle (yet)

    def clear(self) -> None:
        self.rectangles = []
        self._uncovered = []

    def load(self, rectangles: Iterable[tuple[int, int]]) -> None:
        """Start again from the document's rectangles (its delivered offsets are loaded into the DoneSet)."""
        self.clear()
        for scanned, below in rectangles:
            self.add(scanned, below, 0)

    def covers(self, offset: int, due: int) -> bool:
        return any(offset < scanned and due < below for scanned, below in self.rectangles)

    def delivered(self, offset: int, due: int) -> None:
        """Delivered (or skipped, with NO_DUE): kept until a rectangle covers it or the floor passes it."""
        self._uncovered.append((due, offset))

    def add(self, scanned: int, below: int, floor: int) -> None:
        """Record rectangle (scanned, below), true now; forget what the floor has passed or a rectangle covers."""
        rectangles = [(s, b) for s, b in self.rectangles if s > floor]
        if scanned > floor and not any(scanned <= s and below <= b for s, b in rectangles):  # (else adds nothing)
            kept = [(s, b) for s, b in rectangles if not (s <= scanned and b <= below)]
            if len(kept) < self.MAX_RECTANGLES:
                rectangles = sorted([*kept, (scanned, below)])
        self.rectangles = rectangles
        self._uncovered = [(d, o) for d, o in self._uncovered if o >= floor and not self.covers(o, d)]

    def uncovered_runs(self) -> list[list[int]]:
        """The offsets delivered that no rectangle covers, as [first, last] runs (ascending)."""
        runs: list[list[int]] = []
        for offset in sorted({o for _, o in self._uncovered}):
            if runs and runs[-1][1] == offset - 1:
                runs[-1][1] = offset
            else:
                runs.append([offset, offset])
        return runs

    @property
    def uncovered(self) -> int:
        return len(self._uncovered)
