"""The SASL and TLS fuzz targets (fuzz/fuzz_sasl.py, fuzz/fuzz_tls.py) over their fixed corpora, then a bounded
pseudo-random run of each: only the typed refusals escape, and only the valid SASL exchanges complete."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from mqk.broker.security.scram import ScramServer

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "fuzz" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sasl_corpus_completes_exactly_the_valid_exchanges():
    fuzz = _load("fuzz_sasl")
    valid = fuzz.valid()
    completed = [data for data in fuzz.corpus() if fuzz.run(data)]
    assert completed == valid and len(valid) == 4
    assert len(fuzz.corpus()) > 300  # every cut of every message is in it


def test_sasl_smoke():
    assert _load("fuzz_sasl").smoke(iterations=3000, seed=26) == 3000


def test_sasl_target_lets_only_authentication_failures_through(monkeypatch):
    fuzz = _load("fuzz_sasl")

    def broken(self, token):
        raise ValueError("not a typed refusal")

    monkeypatch.setattr(ScramServer, "evaluate", broken)
    with pytest.raises(ValueError):
        fuzz.test_one_input(fuzz.valid()[0])


def test_tls_corpus_and_smoke():
    fuzz = _load("fuzz_tls")
    corpus = fuzz.corpus()
    assert any(data[:1] == b"\x16" and len(data) > 100 for data in corpus)  # built around a real ClientHello
    for data in corpus:
        fuzz.test_one_input(data)
    assert fuzz.smoke(iterations=200, seed=26) == 200
