"""Leader epochs of this broker's group: when each began, and where each partition's log stood then (Kafka's
leader-epoch checkpoint, RocketMQ 5's epoch file).

Every time this broker becomes its group's master (a new master epoch, node.py), `begin` records the epoch with the
end offset of every partition it holds. `end_offset_for` then answers OffsetForLeaderEpoch as Kafka does: for a
requested epoch, the largest epoch this log knows that is not above it, and the offset where that epoch ended (the
start of the next one) or the log end for the current epoch; (-1, -1) for an epoch older than the first one known
or newer than the current. A partition created after an epoch began started that epoch at offset 0.

Kept in `<data-dir>/cluster/leader-epochs.json` (written atomically before the epoch is served), the last
`KEEP` epochs.
"""

from __future__ import annotations

from pathlib import Path

from mqk.store.fsutil import atomic_write_json, read_json

KEEP = 32
UNDEFINED = (-1, -1)


class EpochHistory:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        #: (epoch, topic -> each partition's end offset when it began), oldest first
        self.epochs: list[tuple[int, dict[str, list[int]]]] = []

    def load(self) -> None:
        if self.path is None:
            return
        doc = read_json(self.path) or {}
        epochs = []
        for item in doc.get("epochs", []):
            if isinstance(item, list) and len(item) == 2 and isinstance(item[0], int) and isinstance(item[1], dict):
                starts = {
                    str(t): [int(o) for o in offsets] for t, offsets in item[1].items() if isinstance(offsets, list)
                }
                epochs.append((item[0], starts))
        self.epochs = sorted(epochs, key=lambda e: e[0])

    @property
    def current(self) -> int:
        return self.epochs[-1][0] if self.epochs else -1

    def begin(self, epoch: int, ends: dict[str, list[int]]) -> None:
        """Epoch `epoch` starts now, every partition's log ending at `ends` (blocking: writes the file)."""
        if self.epochs and epoch <= self.epochs[-1][0]:
            return
        self.epochs.append((epoch, {t: list(o) for t, o in ends.items()}))
        del self.epochs[:-KEEP]
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.path, {"version": 1, "epochs": [[e, s] for e, s in self.epochs]})

    def end_offset_for(self, topic: str, partition: int, requested: int, log_end: int) -> tuple[int, int]:
        """(epoch, end offset) for OffsetForLeaderEpoch (see the module docstring)."""
        if not self.epochs or requested < self.epochs[0][0] or requested > self.epochs[-1][0]:
            return UNDEFINED
        if requested == self.epochs[-1][0]:
            return requested, log_end
        found = UNDEFINED
        for i, (epoch, _starts) in enumerate(self.epochs):
            if epoch > requested:
                break
            following = self.epochs[i + 1][1] if i + 1 < len(self.epochs) else None
            end = log_end if following is None else _start(following, topic, partition)
            found = (epoch, end)
        return found


def _start(starts: dict[str, list[int]], topic: str, partition: int) -> int:
    offsets = starts.get(topic, [])
    return offsets[partition] if partition < len(offsets) else 0


__all__ = ["UNDEFINED", "EpochHistory"]
