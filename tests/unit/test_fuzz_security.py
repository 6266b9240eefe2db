"""The SASL, TLS and RocketMQ signature fuzz targets (fuzz/fuzz_sasl.py, fuzz/fuzz_tls.py, fuzz/fuzz_rocketmq_acl.py)
over their fixed corpora, then a bounded pseudo-random run of each: only the typed refusals escape, only the valid
SASL exchanges complete, and only correctly signed, granted RocketMQ requests pass."""

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


def test_rocketmq_acl_corpus_lets_in_exactly_the_signed_and_granted_requests():
    fuzz = _load("fuzz_rocketmq_acl")
    passed = []
    for data in fuzz.corpus():
        fuzz.test_one_input(data)  # the property holds for each (it asserts it)
        if data[0] % 3 == fuzz.SIGNED:
            cmd = fuzz.decode_frame(memoryview(data[5:]))
            fuzz.sign(cmd.ext_fields, cmd.body, fuzz.KEY, fuzz.SECRET)
            passed.append(fuzz.check(cmd) is None)
    # the corpus's requests in order, each in both serialisations: signed with the right secret, a request passes
    # when everything it names is granted (`ok...`) and is refused for a resource that is not: a send that would
    # create its topic, a pull from `secret`, a heartbeat naming group g2, broker config (the cluster). A heartbeat
    # body that is not JSON names no group (its processor refuses it), nor do the client config check and an
    # unknown code (answered as not supported).
    expected = [True, False, True, True, False, False, True, True, True, False, True, True, True, True]
    assert passed == [outcome for outcome in expected for _serialisation in (0, 1)]


def test_rocketmq_acl_smoke():
    assert _load("fuzz_rocketmq_acl").smoke(iterations=2000, seed=26) == 2000
