"""The hand-written Produce response encoder (mqk._fast.produceresp, compiled and twin) against the generated one
(mqk.protocol.kafka.messages): for every Produce version, the same bytes whenever it encodes; for any body that is
not the usual answer it declines and leaves the output alone; and the codec's frames are unchanged."""

from __future__ import annotations

import random
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqk._fast import compiled, twin
from mqk._fast.handwritten import DECLINE_NONE
from mqk.protocol.kafka import messages
from mqk.protocol.kafka.codec import DECLINED, Declined, Request, encode_response

VERSIONS = range(3, 14)
IMPLS = [pytest.param(twin("produceresp"), id="twin")]
if compiled("produceresp") is not None:
    IMPLS.append(pytest.param(compiled("produceresp"), id="compiled"))
_SETTINGS = settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
_I64 = st.integers(-(1 << 63), (1 << 63) - 1)


def _generated(version: int, body) -> bytes | str:
    try:
        return b"".join(bytes(p) for p in messages.encode_response(0, version, body))
    except Exception as exc:  # noqa: BLE001 - its refusal, by type
        return type(exc).__name__


_answer = st.fixed_dictionaries(
    {
        "index": st.integers(-(1 << 31), (1 << 31) - 1),
        "error_code": st.integers(-(1 << 15), (1 << 15) - 1),
        "base_offset": _I64,
    },
    optional={
        "log_append_time_ms": _I64,
        "log_start_offset": _I64,
        "record_errors": st.just(()) | st.just([]),
        "error_message": st.none() | st.text(max_size=300),
        "current_leader": st.none(),
    },
)
_topic = st.fixed_dictionaries(
    {"partition_responses": st.lists(_answer, max_size=4)},
    optional={"name": st.text(max_size=200), "topic_id": st.uuids()},
)
_body = st.fixed_dictionaries(
    {"responses": st.lists(_topic, max_size=3)},
    optional={"throttle_time_ms": st.integers(-(1 << 31), (1 << 31) - 1), "node_endpoints": st.just([])},
)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("version", VERSIONS)
def test_the_usual_answer_is_encoded_as_the_generated_encoder_does(impl, version: int) -> None:
    @_SETTINGS
    @given(_body)
    def check(body) -> None:
        out = bytearray(b"head")
        assert impl.encode_produce_response(body, version, out) == DECLINE_NONE
        assert bytes(out) == b"head" + _generated(version, body)

    check()


@pytest.mark.parametrize("impl", IMPLS)
def test_anything_else_is_declined_untouched_or_encoded_identically(impl) -> None:
    """Random bodies, many of them odd (wrong types, out-of-range ints, record errors, tagged fields, non-UTF-8
    strings): what the kernel encodes is byte for byte the generated encoding; what it declines it leaves alone."""
    rnd = random.Random(3)
    odd = [0, -1, 1 << 31, (1 << 31) - 1, -(1 << 31) - 1, 1 << 15, 1 << 63, -(1 << 63), True, None, "x", 2.0]
    encoded = declined = 0
    for _ in range(4000):
        version = rnd.randint(1, 14)
        parts = []
        for _ in range(rnd.randint(0, 3)):
            p = {
                k: rnd.choice(odd) if rnd.random() < 0.3 else rnd.randint(-1000, 1 << 40)
                for k in ("index", "error_code", "base_offset", "log_append_time_ms", "log_start_offset")
                if rnd.random() < 0.8
            }
            if rnd.random() < 0.5:
                p["record_errors"] = rnd.choice([(), [], None, [{"batch_index": 1}]])
            if rnd.random() < 0.5:
                p["error_message"] = rnd.choice([None, "", "boom", "é" * 200, b"x", "\ud800"])
            if rnd.random() < 0.1:
                p["current_leader"] = rnd.choice([None, {"leader_id": -1, "leader_epoch": -1}, {"leader_id": 1}])
            parts.append(p if rnd.random() < 0.97 else [p])
        topic = {"partition_responses": parts if rnd.random() < 0.9 else rnd.choice([tuple(parts), None])}
        if rnd.random() < 0.9:
            topic["name"] = rnd.choice(["t", "", "x" * 40_000, None, b"t", "\ud800"])
        if rnd.random() < 0.5:
            topic["topic_id"] = rnd.choice([uuid.UUID(int=rnd.getrandbits(128)), b"0" * 16, None])
        body = {"responses": rnd.choice([[topic], [topic, topic], [], None, ({"x": 1},)])}
        if rnd.random() < 0.8:
            body["throttle_time_ms"] = rnd.choice([0, 5, 1 << 31, None])
        if rnd.random() < 0.1:
            body["node_endpoints"] = rnd.choice([[], [{"node_id": 1}]])
        out = bytearray(b"head")
        reason = impl.encode_produce_response(body, version, out)
        if compiled("produceresp") is not None:  # the two builds take the same bodies and decline the others alike
            reasons = {
                m.encode_produce_response(body, version, bytearray())
                for m in (twin("produceresp"), compiled("produceresp"))
            }
            assert len(reasons) == 1, (version, body, reasons)
        if reason == DECLINE_NONE:
            encoded += 1
            assert bytes(out) == b"head" + _generated(version, body), (version, body)
        else:
            declined += 1
            assert reason in set(Declined), reason
            assert out == b"head"
    assert encoded > 300 and declined > 300


#: a body each reason is given for, at Produce v10 (one partition answered, as the broker does)
_PART = {"index": 0, "error_code": 0, "base_offset": 5}
DECLINES = [
    ("version", 2, {"responses": []}),
    ("shape", 10, {"responses": [[_PART]]}),
    ("value", 10, {"responses": [{"name": "t", "partition_responses": [{**_PART, "index": 1 << 31}]}]}),
    ("text", 10, {"responses": [{"name": b"t", "partition_responses": [_PART]}]}),
    ("text", 10, {"responses": [{"name": "t", "partition_responses": [{**_PART, "error_message": "\ud800"}]}]}),
    ("field", 10, {"responses": [{"name": "t", "partition_responses": [{**_PART, "record_errors": [{}]}]}]}),
    ("field", 10, {"responses": [], "node_endpoints": [{"node_id": 1}]}),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("reason", "version", "body"), DECLINES)
def test_each_declined_body_says_why(impl, reason: str, version: int, body: dict) -> None:
    out = bytearray(b"head")
    assert impl.encode_produce_response(body, version, out) == Declined[reason.upper()]
    assert out == b"head"


def test_codec_frames_are_unchanged() -> None:
    body = {
        "responses": [
            {
                "name": "orders",
                "partition_responses": [
                    {
                        "index": i,
                        "error_code": 0,
                        "base_offset": 100 + i,
                        "log_append_time_ms": -1,
                        "log_start_offset": 0,
                        "record_errors": (),
                        "error_message": None,
                    }
                    for i in range(3)
                ],
            }
        ],
        "throttle_time_ms": 0,
    }
    for version in VERSIONS:
        request = Request(0, version, 77, "c", {})
        frame = b"".join(bytes(p) for p in encode_response(request, body))
        flexible = version >= 9
        head = (len(frame) - 4).to_bytes(4, "big") + (77).to_bytes(4, "big") + (b"\x00" if flexible else b"")
        assert frame == head + _generated(version, body)
    # an answer the kernel declines is encoded by the generated encoder, and counted with why
    declined = DECLINED[(0, Declined.FIELD)]
    erred = {
        **body,
        "responses": [
            {
                **body["responses"][0],
                "partition_responses": [
                    {
                        **body["responses"][0]["partition_responses"][0],
                        "record_errors": [{"batch_index": 1, "batch_index_error_message": None}],
                    }
                ],
            }
        ],
    }
    frame = b"".join(bytes(p) for p in encode_response(Request(0, 9, 78, "c", {}), erred))
    assert frame[9:] == _generated(9, erred)
    assert DECLINED[(0, Declined.FIELD)] == declined + 1
