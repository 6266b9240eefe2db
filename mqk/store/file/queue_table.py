"""The file engine's queue table: every queue's positions in one flat buffer the append kernel reads and writes.

One row of `ROW_FIELDS` native int64 per queue (a *slot*; layout in `mqk._fast.clentry`: end offset, running max
timestamp, write position and reserved end of the queue's last ConsumeQueue file, the dirty-since marks the
checkpoint reads, the log start offset, and the kernel's staging scratch). The append kernel (`clentry.AppendRun`)
is handed the buffer, a per-topic map from queue id to slot, and `unit_bufs` (slot -> the writable mapping of the
queue's last ConsumeQueue file); it never reaches into Python objects.

This module owns two invariants:
- the row is the truth for a queue's positions: `ConsumeQueue` reads and writes its end offset, running max
  timestamp and dirty marks here, and its last file (a `UnitFile`) keeps its write position and reservation here
  while it is the last one (`bind` / `unbind`); older files keep their own;
- a queue's write positions (end offset, running max timestamp, ConsumeQueue write position) move forward only in
  `publish_unit` (dispatch of entries already in the CommitLog: recovery) and in the kernel's `AppendRun.publish`
  (appends, called from append.py's `_publish`), each after the bytes they cover are in place; only recovery sets
  them otherwise (cutting a queue back: `ConsumeQueue.recover`, `truncate_to_phys`; an empty queue's numbering from
  the metadata). The log start moves through `ShardRegistry.set_log_start` (the engine's delete_before, which then
  saves queues.json).

A row is released when its queue is closed; `unit_bufs[slot]` is None while the slot has no writable file, so the
kernel declines it (STOP_UNIT_ROOM) rather than writing into a mapping that is gone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from mqk._fast import load
from mqk.store.file.mapped_file import MappedFile

if TYPE_CHECKING:
    from pathlib import Path

clentry = load("clentry")

ROW_FIELDS: int = clentry.ROW_FIELDS
ROW_BYTES: int = clentry.ROW_BYTES
END: int = clentry.ROW_END
MAX_TS: int = clentry.ROW_MAX_TS
CQ_WROTE: int = clentry.ROW_CQ_WROTE
CQ_RESERVED: int = clentry.ROW_CQ_RESERVED
DIRTY_PHYS: int = clentry.ROW_DIRTY_PHYS
DIRTY_MS: int = clentry.ROW_DIRTY_MS
LOG_START: int = clentry.ROW_LOG_START
STAGED: int = clentry.ROW_STAGED

#: a fresh row: end 0, no timestamp yet, no writable file, nothing dirty, log start 0, nothing staged
_FRESH_ROW = (0, -1, 0, 0, -1, 0, 0, 0)
assert len(_FRESH_ROW) == ROW_FIELDS and ROW_BYTES == ROW_FIELDS * 8


class QueueTable:
    """The rows, the free list, and the writable unit buffer of each slot's last ConsumeQueue file."""

    __slots__ = ("_free", "cols", "rows", "unit_bufs")

    def __init__(self, capacity: int = 64) -> None:
        self.rows = bytearray(max(1, capacity) * ROW_BYTES)
        #: the rows as int64 values: table.cols[slot * ROW_FIELDS + FIELD]
        self.cols = memoryview(self.rows).cast("q")
        self.unit_bufs: list[memoryview | None] = [None] * max(1, capacity)
        self._free = list(range(max(1, capacity) - 1, -1, -1))

    @property
    def capacity(self) -> int:
        return len(self.unit_bufs)

    def allocate(self) -> int:
        """A fresh row's slot (the table doubles when full: the kernel is handed `rows` anew at every call)."""
        if not self._free:
            old = self.capacity
            rows = bytearray(old * 2 * ROW_BYTES)
            rows[: len(self.rows)] = self.rows
            self.cols.release()
            self.rows = rows
            self.cols = memoryview(rows).cast("q")
            self.unit_bufs.extend([None] * old)
            self._free = list(range(old * 2 - 1, old - 1, -1))
        slot = self._free.pop()
        at = slot * ROW_FIELDS
        for field, value in enumerate(_FRESH_ROW):
            self.cols[at + field] = value
        self.unit_bufs[slot] = None
        return slot

    def release(self, slot: int) -> None:
        self.unit_bufs[slot] = None
        self._free.append(slot)

    def get(self, slot: int, field: int) -> int:
        return self.cols[slot * ROW_FIELDS + field]

    def set(self, slot: int, field: int, value: int) -> None:
        self.cols[slot * ROW_FIELDS + field] = value

    def publish_unit(
        self, slot: int, unit_end: int, end_offset: int, running_max_ts: int, phys: int, store_ts: int
    ) -> bool:
        """Publish one unit written (and its entry in the CommitLog) at the queue's write position: the write
        position moves to `unit_end`, the end offset and running max timestamp to theirs, and the dirty marks are
        set if none were. Returns whether the queue became dirty (the caller tells the checkpoint). The kernel's
        `AppendRun.publish` does the same for a run."""
        cols = self.cols
        at = slot * ROW_FIELDS
        cols[at + CQ_WROTE] = unit_end
        cols[at + END] = end_offset
        cols[at + MAX_TS] = running_max_ts
        if cols[at + DIRTY_PHYS] < 0:
            cols[at + DIRTY_PHYS] = phys
            cols[at + DIRTY_MS] = store_ts
            return True
        return False


class UnitFile(MappedFile):
    """A ConsumeQueue file. While it is its queue's last file it is *bound* to the queue's row: its write position
    (`wrote`, and `committed`, always equal) and reservation (`reserved`) are the row's, so the append kernel moves
    them without touching this object; unbound, it keeps its own."""

    __slots__ = ("_at", "_table")

    def __init__(
        self, path: Path, file_size: int, start_offset: int, reserve_step: int = 0, *, hold_fd: bool = True
    ) -> None:
        self._table: QueueTable | None = None
        self._at = 0
        super().__init__(path, file_size, start_offset, reserve_step, hold_fd=hold_fd)

    # (the base class's slots hold the values while unbound)
    @property
    def wrote(self) -> int:
        table = self._table
        return _own_wrote.__get__(self) if table is None else table.cols[self._at + CQ_WROTE]

    @wrote.setter
    def wrote(self, value: int) -> None:
        table = self._table
        if table is None:
            _own_wrote.__set__(self, value)
        else:
            table.cols[self._at + CQ_WROTE] = value

    @property
    def committed(self) -> int:
        return self.wrote

    @committed.setter
    def committed(self, value: int) -> None:
        self.wrote = value

    @property
    def reserved(self) -> int:
        table = self._table
        return _own_reserved.__get__(self) if table is None else table.cols[self._at + CQ_RESERVED]

    @reserved.setter
    def reserved(self, value: int) -> None:
        table = self._table
        if table is None:
            _own_reserved.__set__(self, value)
        else:
            table.cols[self._at + CQ_RESERVED] = value

    def bind(self, table: QueueTable, slot: int) -> None:
        """Become `slot`'s last file: its positions move into the row, its mapping into `unit_bufs`."""
        wrote, reserved = self.wrote, self.reserved
        self._table = table
        self._at = slot * ROW_FIELDS
        self.wrote = wrote
        self.reserved = reserved
        table.unit_bufs[slot] = self.buf

    def unbind(self) -> None:
        """Stop being the last file: the row's positions are kept here from now on."""
        table = self._table
        if table is None:
            return
        wrote, reserved = self.wrote, self.reserved
        slot = self._at // ROW_FIELDS
        if table.unit_bufs[slot] is self.buf:
            table.unit_bufs[slot] = None
        table.cols[self._at + CQ_WROTE] = 0
        table.cols[self._at + CQ_RESERVED] = 0
        self._table = None
        self.wrote = wrote
        self.reserved = reserved

    def close(self) -> None:
        self.unbind()  # the kernel must never be handed a mapping that is closed
        super().close()


class _IntSlot(Protocol):
    """A slot of MappedFile holding an int (its member descriptor)."""

    def __get__(self, instance: MappedFile, owner: type | None = None, /) -> int: ...
    def __set__(self, instance: MappedFile, value: int, /) -> None: ...


# the slot descriptors UnitFile's properties fall back to
_own_wrote: _IntSlot = MappedFile.__dict__["wrote"]
_own_reserved: _IntSlot = MappedFile.__dict__["reserved"]


__all__ = ["QueueTable", "UnitFile"]
