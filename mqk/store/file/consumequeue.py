"""ConsumeQueue: the per topic-queue index over the CommitLog (RocketMQ's batch ConsumeQueue).

Owns the files under `consumequeue/<topic>/<queue>/`: fixed 48-byte units (layout in `mqk._fast.cqunit`), one per
stored batch, in mapped files of `units_per_file` units named by the 20-digit byte offset of their first unit
(unit index * 48, RocketMQ's naming). A unit says where the batch lives in the CommitLog (physical offset and
entry size), which queue offsets it covers (base offset, offset span), its tags code, store timestamp and the
queue's running maximum record timestamp, so timestamp lookup can bisect.

Lookups choose the file first (bisect over each file's first unit), then bisect inside it with `cqunit`.
Units are written by the append kernel (`clentry.AppendRun`) and by `put` (dispatch at recovery); recovery cuts them
back to what the CommitLog holds. The queue's positions (end offset, running max timestamp, dirty marks, and its last
file's write position and reservation) live in its row of the engine's queue table (queue_table.py): this class is
their Python face, and keeps its last file bound to the row whenever the files change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from mqk._fast import load
from mqk._fast.api import Unit
from mqk.errors import OutOfBounds
from mqk.store.file.mapped_file import MappedFileQueue
from mqk.store.file.queue_table import DIRTY_MS, DIRTY_PHYS, END, MAX_TS, ROW_FIELDS, QueueTable, UnitFile

cqunit = load("cqunit")
UNIT = cqunit.UNIT_SIZE
#: disk blocks of a ConsumeQueue file are reserved ahead of the writer, doubling from one page up to this many
#: bytes at a time (MappedFile.ensure_reserved)
RESERVE_STEP = 64 * 1024
log = logging.getLogger(__name__)


class ConsumeQueue:
    __slots__ = ("_at", "_bound", "_pack", "_unpack", "dir", "mfq", "slot", "table", "units_per_file")

    def __init__(self, directory: Path, units_per_file: int, table: QueueTable | None = None) -> None:
        """`table`: the engine's queue table, where this queue takes a row (a queue of its own, for tools and
        tests, gets a table of one)."""
        self.dir = Path(directory)
        self.units_per_file = units_per_file
        # blocks are reserved at most 64 KiB (1,365 units) at a time: a thousand quiet queues must not pin gigabytes;
        # units are stored through the mapping, so a file needs no descriptor of its own (one per partition, not two)
        self.mfq = MappedFileQueue(
            self.dir,
            units_per_file * UNIT,
            preallocate=False,
            reserve_step=RESERVE_STEP,
            hold_fd=False,
            file_type=UnitFile,
        )
        self.table = table if table is not None else QueueTable(1)
        self.slot = self.table.allocate()
        self._at = self.slot * ROW_FIELDS
        self._bound: UnitFile | None = None
        self._pack = cqunit.pack_unit
        self._unpack = cqunit.unpack_unit

    # --- positions (the queue table's row) ---------------------------------------------------------------

    @property
    def end_offset(self) -> int:
        """Queue offset the next batch gets (one past the last unit's span)."""
        return self.table.cols[self._at + END]

    @end_offset.setter
    def end_offset(self, value: int) -> None:
        self.table.cols[self._at + END] = value

    @property
    def max_ts(self) -> int:
        """Running maximum record timestamp over the queue (what the next unit's max_timestamp builds on)."""
        return self.table.cols[self._at + MAX_TS]

    @max_ts.setter
    def max_ts(self, value: int) -> None:
        self.table.cols[self._at + MAX_TS] = value

    @property
    def dirty_since_phys(self) -> int:
        """CommitLog offset of the first entry whose unit is not yet flushed (-1: none); the engine's checkpoint
        decides from it (and `dirty_since_ms`, its store time) whether this queue is worth an msync yet."""
        return self.table.cols[self._at + DIRTY_PHYS]

    @dirty_since_phys.setter
    def dirty_since_phys(self, value: int) -> None:
        self.table.cols[self._at + DIRTY_PHYS] = value

    @property
    def dirty_since_ms(self) -> int:
        return self.table.cols[self._at + DIRTY_MS]

    @dirty_since_ms.setter
    def dirty_since_ms(self, value: int) -> None:
        self.table.cols[self._at + DIRTY_MS] = value

    def _rebind(self) -> None:
        """Bind the queue's last file to its row (after any change of the file list)."""
        files = self.mfq.files
        last = files[-1] if files else None
        if last is self._bound:
            return
        assert last is None or isinstance(last, UnitFile)  # (the queue's files are UnitFiles: its file_type)
        if self._bound is not None:
            self._bound.unbind()
        self._bound = last
        if last is not None:
            last.bind(self.table, self.slot)

    def make_room(self, units: int) -> bool:
        """Give the next `units` units reserved room in one file (rolling to a new file when the last one is full;
        StorageFull on a full disk, before anything of the append is written). False when they cannot share a
        file (the last one has room for some of them only): the caller then appends them one at a time. The append
        kernel declines a queue without room (STOP_UNIT_ROOM); the engine calls this and plans again."""
        need = units * UNIT
        last = self._bound
        if last is None or last.wrote >= last.file_size:
            self.mfq.roll(0)  # (a queue's first file holds unit 0)
            self._rebind()
            last = self._bound
            assert last is not None
        if last.wrote + need > last.file_size:
            return False
        if last.wrote + need > last.reserved:
            last.ensure_reserved(last.wrote + need)
        return True

    # --- sizes -----------------------------------------------------------------------------------------

    @property
    def min_unit(self) -> int:
        return self.mfq.min_offset // UNIT

    @property
    def max_unit(self) -> int:
        """One past the last unit's index."""
        return self.mfq.max_offset // UNIT

    def __len__(self) -> int:
        return self.max_unit - self.min_unit

    # --- writing (dispatch only) -----------------------------------------------------------------------

    def put(
        self, phys: int, size: int, count: int, tags_code: int, store_ts: int, batch_max_ts: int, base_offset: int
    ) -> bool:
        """Dispatch one entry already in the CommitLog (recovery): write its unit, then publish it. Returns whether
        the queue became dirty."""
        files = self.mfq.files
        mf = files[-1] if files else None
        if mf is None or mf.wrote >= mf.file_size:
            mf = self.mfq.roll(0)  # a queue's first file holds unit 0
            self._rebind()
        running = max(self.max_ts, batch_max_ts)
        pos = mf.wrote
        if pos + UNIT > mf.reserved:
            mf.ensure_reserved(pos + UNIT)
        self._pack(mf.buf, pos, phys, size, count, tags_code, store_ts, running, base_offset)  # (OutOfBounds: unmoved)
        return self.table.publish_unit(self.slot, pos + UNIT, base_offset + count, running, phys, store_ts)

    # --- reading ---------------------------------------------------------------------------------------

    def unit(self, index: int) -> Unit:
        """(physical_offset, size, record_count, tags_code, store_ts, max_ts, base_offset) of unit `index`."""
        at = index * UNIT
        mf = self.mfq.find(at)
        pos = at - mf.start_offset
        if pos + UNIT > mf.wrote:
            raise OutOfBounds(f"unit {index} is not written in {self.dir}")
        return self._unpack(mf.buf, pos)

    def search_offset(self, offset: int) -> int:
        """Index of the unit holding `offset` (or the next one after a gap); max_unit if past the end;
        min_unit if below the first unit."""
        files = self.mfq.files
        if not files:
            return 0
        # last file whose first unit's base <= offset
        lo, hi = 0, len(files)
        while lo < hi:
            mid = (lo + hi) >> 1
            mf = files[mid]
            if mf.wrote >= UNIT and self._unpack(mf.buf, 0)[6] <= offset:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return self.min_unit
        mf = files[lo - 1]
        n = mf.wrote // UNIT
        i = cqunit.search_offset(mf.buf, n, offset)
        i = max(i, 0)
        return mf.start_offset // UNIT + i

    def search_timestamp(self, ts: int) -> int:
        """Index of the first unit whose running max timestamp >= ts, or max_unit."""
        files = self.mfq.files
        # first file whose last unit's max_ts >= ts
        lo, hi = 0, len(files)
        while lo < hi:
            mid = (lo + hi) >> 1
            mf = files[mid]
            n = mf.wrote // UNIT
            if n == 0 or self._unpack(mf.buf, (n - 1) * UNIT)[5] < ts:
                lo = mid + 1
            else:
                hi = mid
        if lo == len(files):
            return self.max_unit
        mf = files[lo]
        return mf.start_offset // UNIT + cqunit.search_timestamp(mf.buf, mf.wrote // UNIT, ts)

    # --- recovery --------------------------------------------------------------------------------------

    def load(self) -> None:
        self.mfq.load()
        self._rebind()

    def recover(self, phys_limit: int) -> None:
        """Keep the units of entries below CommitLog offset `phys_limit` (their units are durable and intact),
        cut everything after, and restore end offset and running max timestamp.

        Units are appended in CommitLog order, so "written and below the limit" is a prefix of the queue;
        bisect for its end. Unit boundaries never split the physical-offset and size fields across a page, so
        a torn unit never shows a plausible (offset, size) pair that was not written."""
        lo, hi = self.min_unit, self.max_unit
        while lo < hi:
            mid = (lo + hi) >> 1
            phys, size = self._raw_unit(mid)[:2]
            if size > 0 and 0 <= phys < phys_limit:
                lo = mid + 1
            else:
                hi = mid
        self.truncate_units(lo)

    def _raw_unit(self, index: int) -> Unit:
        at = index * UNIT
        mf = self.mfq.find(at)
        return self._unpack(mf.buf, at - mf.start_offset)

    def truncate_units(self, count_end: int) -> None:
        """Make unit index `count_end` the end of the queue."""
        count_end = max(count_end, self.min_unit)
        self.mfq.truncate(count_end * UNIT)
        self._rebind()
        if count_end > self.min_unit:
            last = self._raw_unit(count_end - 1)
            self.end_offset = last[6] + last[2]
            self.max_ts = last[5]
        else:
            # an empty queue keeps its numbering: the first file's name says where it starts; the caller
            # (engine) restores end_offset from its own metadata when the queue has no unit at all
            self.max_ts = -1

    def first_unit_past(self, phys_end: int) -> int:
        """Index of the first unit whose CommitLog entry does not end at or before `phys_end` (max_unit if none)."""
        lo, hi = self.min_unit, self.max_unit
        while lo < hi:
            mid = (lo + hi) >> 1
            phys, size = self._raw_unit(mid)[:2]
            if phys + size <= phys_end:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def truncate_to_phys(self, phys_end: int) -> None:
        """Cut units whose CommitLog entry does not end at or before `phys_end`."""
        lo = self.first_unit_past(phys_end)
        if lo < self.max_unit:
            self.truncate_units(lo)

    def offset_at_phys(self, phys_end: int) -> int:
        """The queue offset below which every entry ends at or before CommitLog offset `phys_end`."""
        if self.last_unit_end_phys() <= phys_end:
            return self.end_offset
        return self._raw_unit(self.first_unit_past(phys_end))[6]

    def last_unit_end_phys(self) -> int:
        """CommitLog offset just past the last unit's entry, or -1 when there is none."""
        if self.max_unit == self.min_unit:
            return -1
        phys, size = self._raw_unit(self.max_unit - 1)[:2]
        return phys + size

    # --- durability / life cycle ---------------------------------------------------------------------

    def flush(self) -> None:
        self.mfq.flush()

    def close(self) -> None:
        """Close the files and give the row back (the queue is not used afterwards)."""
        self._close_files(self.mfq.close)

    def destroy(self) -> None:
        self._close_files(self.mfq.destroy)

    def _close_files(self, how: Callable[[], None]) -> None:
        if self.slot < 0:
            return
        if self._bound is not None:
            self._bound.unbind()
            self._bound = None
        how()
        self.table.release(self.slot)
        self.slot = -1
