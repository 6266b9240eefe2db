"""The file engine's checkpoint and abort marker (RocketMQ's StoreCheckpoint and `abort` file).

`checkpoint` holds, behind a CRC, the CommitLog offset below which every entry is durable AND dispatched into
ConsumeQueue units that are durable too (`safe_offset`), and when that was true. Recovery replays the CommitLog
from there. It is rewritten atomically (fsutil: temp file, fsync, rename, fsync dir), so a crash leaves the old one
or the new one. A missing or unreadable checkpoint means "replay from the start of the oldest segment kept".

`abort` exists while the engine runs; a clean stop removes it after everything is flushed. Finding it at start
means the last run did not stop cleanly.
"""
from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

from crc32c import crc32c

from mqk.store.fsutil import atomic_write_bytes, fsync_dir

log = logging.getLogger(__name__)

_FORMAT = struct.Struct(">IqqqI")  # version, safe_offset, flushed_offset, timestamp_ms, crc32c of the rest
VERSION = 1


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.safe_offset = 0
        self.flushed_offset = 0
        self.timestamp = 0
        self.loaded = False

    def load(self) -> bool:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return False
        if len(data) != _FORMAT.size:
            log.error("checkpoint %s has %d bytes, expected %d; ignoring it", self.path, len(data), _FORMAT.size)
            return False
        version, safe, flushed, ts, crc = _FORMAT.unpack(data)
        if crc != crc32c(data[:-4]) or version != VERSION or safe < 0 or flushed < 0:
            log.error("checkpoint %s fails its check; ignoring it", self.path)
            return False
        self.safe_offset, self.flushed_offset, self.timestamp = safe, flushed, ts
        self.loaded = True
        return True

    @staticmethod
    def encode(safe_offset: int, flushed_offset: int, timestamp: int) -> bytes:
        head = _FORMAT.pack(VERSION, safe_offset, flushed_offset, timestamp, 0)[:-4]
        return head + struct.pack(">I", crc32c(head))

    def store(self, safe_offset: int, flushed_offset: int, timestamp: int) -> None:
        """Blocking (fsync): run off the event loop."""
        atomic_write_bytes(self.path, self.encode(safe_offset, flushed_offset, timestamp))
        self.safe_offset, self.flushed_offset, self.timestamp = safe_offset, flushed_offset, timestamp


class AbortMarker:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def exists(self) -> bool:
        return self.path.exists()

    def create(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(fd)
        fsync_dir(self.path.parent)

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.path.parent)
