"""Master epochs of this broker's group: when each began, in the CommitLog and in every partition (Kafka's
leader-epoch checkpoint, RocketMQ 5's epoch file).

Every time a broker becomes its group's master (a new master epoch, node.py), `begin` records the epoch with the
CommitLog offset where it starts and the end offset of every partition it holds. Replicas take the master's whole
history when they connect (`adopt`), so every member of a group holds the same one.

Two questions are answered from it:
- OffsetForLeaderEpoch (`end_offset_for`), as Kafka does: for a requested epoch, the largest epoch this log knows
  that is not above it, and the offset where that epoch ended (the start of the next one) or the log end for the
  current epoch; (-1, -1) for an epoch newer than the current. An epoch older than the first one known is that of
  batches no master stamped (producers write 0) or of one dropped from the history: the answer is the log end,
  so a consumer's position is not taken for a truncation. A partition created after an epoch began started that
  epoch at offset 0;
- where a replica's CommitLog stops agreeing with its master's (`truncation_point`): the end, in both logs, of the
  last epoch they share. Bytes past it on the replica were written by a master that lost its mastership before
  they reached the in-sync replicas; the replica cuts them before it pulls.

Kept in `<data-dir>/cluster/leader-epochs.json` (written atomically before the epoch is served), the last
`KEEP` epochs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mqk.store.fsutil import atomic_write_json, read_json

KEEP = 32
UNDEFINED = (-1, -1)


class Epoch:
    __slots__ = ("epoch", "log_start", "starts")

    def __init__(self, epoch: int, log_start: int, starts: dict[str, list[int]]) -> None:
        self.epoch = epoch
        #: the CommitLog offset of the epoch's first entry (-1: recorded before mqk kept it)
        self.log_start = log_start
        #: topic -> each partition's end offset when the epoch began
        self.starts = starts


class EpochHistory:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        #: oldest first
        self.epochs: list[Epoch] = []

    def load(self) -> None:
        if self.path is None:
            return
        self.epochs = _parse(read_json(self.path) or {})

    @property
    def current(self) -> int:
        return self.epochs[-1].epoch if self.epochs else -1

    def begin(self, epoch: int, log_start: int, ends: dict[str, list[int]]) -> None:
        """Epoch `epoch` starts now, the CommitLog ending at `log_start` and every partition's log at `ends`
        (blocking: writes the file)."""
        if self.epochs and epoch <= self.epochs[-1].epoch:
            return
        self.epochs.append(Epoch(epoch, log_start, {t: list(o) for t, o in ends.items()}))
        del self.epochs[:-KEEP]
        self._save()

    def document(self) -> dict[str, Any]:
        """The history as it is stored (and sent to replicas)."""
        return {"version": 2, "epochs": [[e.epoch, e.starts, e.log_start] for e in self.epochs]}

    def adopt(self, doc: dict[str, Any]) -> None:
        """Take the master's history as this broker's own (blocking: writes the file)."""
        self.epochs = _parse(doc)
        self._save()

    def log_starts(self) -> list[list[int]]:
        """[[epoch, CommitLog start], ...] of the epochs whose start is known."""
        return [[e.epoch, e.log_start] for e in self.epochs if e.log_start >= 0]

    def _save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.path, self.document())

    def end_offset_for(self, topic: str, partition: int, requested: int, log_end: int) -> tuple[int, int]:
        """(epoch, end offset) for OffsetForLeaderEpoch (see the module docstring)."""
        if not self.epochs or requested > self.epochs[-1].epoch:
            return UNDEFINED
        if requested < self.epochs[0].epoch:
            # no master stamped what a consumer read with such an epoch (producers write 0; masters stamp their
            # own, from 1) or its epoch left the history: the log holds it as far as this broker can tell, and a
            # consumer reads below the high watermark, which every in-sync replica holds
            return requested, log_end
        if requested == self.epochs[-1].epoch:
            return requested, log_end
        found = UNDEFINED
        for i, e in enumerate(self.epochs):
            if e.epoch > requested:
                break
            following = self.epochs[i + 1].starts if i + 1 < len(self.epochs) else None
            end = log_end if following is None else _start(following, topic, partition)
            found = (e.epoch, end)
        return found


def truncation_point(master: list[list[int]], master_end: int, replica: list[list[int]], replica_end: int) -> int:
    """Where a replica's CommitLog must be cut before it pulls: the end of the last epoch both histories
    ([[epoch, CommitLog start], ...], oldest first) share, in whichever log ends it first, and never past either
    log's end. A replica with data but no history has nothing known to agree: it starts again from the master's
    first known epoch (0 when the master knows none)."""
    if replica_end == 0:
        return 0
    if not replica:
        return min(replica_end, master[0][1] if master else 0, master_end)
    last = replica[-1][0]
    shared = [e for e, _start in master if e <= last]
    if not shared:
        # the replica's epochs are all older than the master remembers: trust what came before the master's first
        return min(replica_end, master[0][1] if master else master_end, master_end)
    epoch = shared[-1]
    master_next = [start for e, start in master if e > epoch]
    replica_next = [start for e, start in replica if e > epoch]
    end = min(master_next[0] if master_next else master_end, replica_next[0] if replica_next else replica_end)
    return max(0, min(end, replica_end, master_end))


def _parse(doc: dict[str, Any]) -> list[Epoch]:
    epochs = []
    for item in doc.get("epochs", []) if isinstance(doc, dict) else []:
        if not (isinstance(item, list) and len(item) in (2, 3) and isinstance(item[0], int)):
            continue
        if not isinstance(item[1], dict):
            continue
        starts = {str(t): [int(o) for o in offsets] for t, offsets in item[1].items() if isinstance(offsets, list)}
        log_start = item[2] if len(item) == 3 and isinstance(item[2], int) else -1
        epochs.append(Epoch(item[0], log_start, starts))
    return sorted(epochs, key=lambda e: e.epoch)


def _start(starts: dict[str, list[int]], topic: str, partition: int) -> int:
    offsets = starts.get(topic, [])
    return offsets[partition] if partition < len(offsets) else 0


__all__ = ["UNDEFINED", "EpochHistory", "truncation_point"]
