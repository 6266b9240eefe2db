"""Which record batches belong to an aborted Kafka transaction: what a read_committed reader (a share group with
`share.isolation.level=read_committed`) skips and what the log cleaner drops. Sans-IO; the ranges come from the
transaction coordinator's aborted-transaction index (mqk.server.kafka.transactions), or, for a partition copied
from another broker group, from its records (`AbortedScan`)."""

from __future__ import annotations

import struct
from typing import Any

from mqk.protocol.kafka.records import batch_records

#: record batch v2 attributes (low byte at offset 22): bit 4 transactional, bit 5 control
_TRANSACTIONAL, _CONTROL = 0x10, 0x20
#: the producer id of a record batch v2 (bytes 43-50, big-endian)
_PRODUCER_ID = slice(43, 51)


class AbortedBatches:
    """Tells whether a transactional batch belongs to an aborted transaction: producer `pid`'s batch at `offset`
    did if an aborted transaction of `pid` spans it (first offset <= offset < marker offset)."""

    __slots__ = ("_by_pid",)

    def __init__(self, ranges: list[tuple[int, int, int]]) -> None:
        """`ranges`: (marker offset, producer id, first offset) of each aborted transaction."""
        self._by_pid: dict[int, list[tuple[int, int]]] = {}
        for marker, pid, first in ranges:
            self._by_pid.setdefault(pid, []).append((first, marker))

    def __bool__(self) -> bool:
        return bool(self._by_pid)

    def __contains__(self, batch: tuple[int, int]) -> bool:
        pid, offset = batch
        spans = self._by_pid.get(pid)
        return spans is not None and any(first <= offset < marker for first, marker in spans)

    def holds_batch(self, base_offset: int, data: Any) -> bool:
        """Whether the stored record batch `data` at `base_offset` is a data batch of an aborted transaction."""
        if len(data) < 61 or not data[22] & _TRANSACTIONAL or data[22] & _CONTROL:
            return False
        return (int.from_bytes(data[_PRODUCER_ID], "big", signed=True), base_offset) in self


NO_ABORTS = AbortedBatches([])

#: a control record's key: version, type (0: ABORT, 1: COMMIT)
_CONTROL_KEY = struct.Struct(">hh")
_ABORT = 0


class AbortedScan:
    """The aborted transactions a partition's records show, read batch by batch in offset order: a transaction
    begins at its producer's first transactional batch and ends at that producer's control batch; an ABORT marker
    makes (marker offset, producer id, first offset). A transaction begun before the first batch read begins, for
    this scan, at that batch's offset (`start`)."""

    __slots__ = ("_open", "aborted", "start")

    def __init__(self, start: int) -> None:
        self.start = start
        self._open: dict[int, int] = {}
        #: (marker offset, producer id, first offset), in marker order
        self.aborted: list[tuple[int, int, int]] = []

    def feed(self, base_offset: int, data: Any) -> None:
        """One stored record batch v2 (`data`, at `base_offset`)."""
        if len(data) < 61 or not data[22] & (_TRANSACTIONAL | _CONTROL):
            return
        pid = int.from_bytes(data[_PRODUCER_ID], "big", signed=True)
        if not data[22] & _CONTROL:
            self._open.setdefault(pid, base_offset)
            return
        first = self._open.pop(pid, self.start)
        records = batch_records(bytes(data))
        key = records[0][3] if records else None
        if key is not None and len(key) >= _CONTROL_KEY.size and _CONTROL_KEY.unpack_from(key)[1] == _ABORT:
            self.aborted.append((base_offset, pid, min(first, base_offset)))
