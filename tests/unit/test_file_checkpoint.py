"""Checkpoint (CRC-checked, atomically replaced) and the abort marker."""

from __future__ import annotations

from pathlib import Path

from mqk.store.file.checkpoint import AbortMarker, Checkpoint


def test_checkpoint_round_trip_and_rejects_damage(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint")
    assert not cp.load() and not cp.loaded
    cp.store(4096, 8192, 1_700_000_000_000)
    again = Checkpoint(tmp_path / "checkpoint")
    assert again.load()
    assert (again.safe_offset, again.flushed_offset, again.timestamp) == (4096, 8192, 1_700_000_000_000)
    data = bytearray((tmp_path / "checkpoint").read_bytes())
    data[6] ^= 1  # inside safe_offset: the CRC no longer matches
    (tmp_path / "checkpoint").write_bytes(bytes(data))
    damaged = Checkpoint(tmp_path / "checkpoint")
    assert not damaged.load() and damaged.safe_offset == 0
    (tmp_path / "checkpoint").write_bytes(b"short")
    assert not Checkpoint(tmp_path / "checkpoint").load()
    assert not list(tmp_path.glob(".*tmp"))  # atomic replace leaves no temp files behind


def test_abort_marker(tmp_path: Path) -> None:
    marker = AbortMarker(tmp_path / "abort")
    assert not marker.exists()
    marker.create()
    assert marker.exists()
    marker.remove()
    marker.remove()  # idempotent
    assert not marker.exists()
