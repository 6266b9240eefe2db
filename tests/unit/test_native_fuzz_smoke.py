"""The remoting codec's fuzz target (fuzz/fuzz_native_codec.py) run as a bounded smoke test: random and mutated
frames give a command or a typed error, and decoded commands re-encode to the same command."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from mqk.protocol.native.command import FrameDecoder

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("fuzz_native_codec", ROOT / "fuzz" / "fuzz_native_codec.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_random_frames_smoke_only_typed_errors() -> None:
    fuzz = _load()
    assert fuzz.smoke(iterations=4000, seed=4321) == 4000


def test_valid_frames_of_the_smoke_decode_and_round_trip() -> None:
    """The seeds of the mutation really are frames (else the smoke would only ever test the error paths)."""
    fuzz = _load()
    frames = fuzz._valid_frames()
    decoder = FrameDecoder(max_frame_bytes=fuzz.MAX_FRAME)
    decoder.receive_data(b"".join(frames))
    commands = []
    while (cmd := decoder.next_command()) is not None:
        fuzz._exercise(cmd)
        commands.append(cmd)
    assert len(commands) == len(frames)
    assert {c.serialize_type for c in commands} == {0, 1}


def test_target_lets_only_typed_errors_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """The target swallows MqkError only: a decoder bug of any other type would surface."""
    fuzz = _load()

    def broken(self):
        raise ValueError("not a typed error")

    monkeypatch.setattr(FrameDecoder, "next_command", broken)
    with pytest.raises(ValueError):
        fuzz.test_one_input(b"\x00\x00\x00\x10")
