"""The hand-written Fetch response encoder (mqk._fast.fetchresp, compiled and twin) against the generated one
(mqk.protocol.kafka.messages): for every Fetch version, the same bytes whenever it encodes, with record buffers
passed on uncopied; for any body that is not the usual answer it declines and leaves the output alone; and the
codec's frames are unchanged."""

from __future__ import annotations

import random
import struct
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqk._fast import compiled, twin
from mqk._fast.fetchresp_py import FIRST_VERSION, LAST_VERSION
from mqk._fast.handwritten import written
from mqk.protocol.kafka import messages
from mqk.protocol.kafka.codec import Declined, Request, encode_response

VERSIONS = range(4, 18)
IMPLS = [pytest.param(twin("fetchresp"), id="twin")]
if compiled("fetchresp") is not None:
    IMPLS.append(pytest.param(compiled("fetchresp"), id="compiled"))
_SETTINGS = settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
_I64 = st.integers(-(1 << 63), (1 << 63) - 1)
_I32 = st.integers(-(1 << 31), (1 << 31) - 1)
_BATCHY = st.binary(max_size=5000)
_RECORDS = (
    st.none()
    | _BATCHY
    | _BATCHY.map(bytearray)
    | _BATCHY.map(memoryview)
    | st.lists(_BATCHY.map(memoryview) | _BATCHY, max_size=3)
    | st.lists(_BATCHY, max_size=2).map(tuple)
)


def _generated(version: int, body) -> bytes | str:
    try:
        return b"".join(bytes(p) for p in messages.encode_response(1, version, body))
    except Exception as exc:  # noqa: BLE001 - its refusal, by type
        return type(exc).__name__


_answer = st.fixed_dictionaries(
    {"partition_index": _I32, "error_code": st.integers(-(1 << 15), (1 << 15) - 1), "high_watermark": _I64},
    optional={
        "last_stable_offset": _I64,
        "log_start_offset": _I64,
        "preferred_read_replica": _I32,
        "aborted_transactions": st.none()
        | st.lists(st.fixed_dictionaries({"producer_id": _I64, "first_offset": _I64}), max_size=2),
        "records": _RECORDS,
        "diverging_epoch": st.none(),
        "current_leader": st.none(),
        "snapshot_id": st.none(),
    },
)
_topic = st.fixed_dictionaries(
    {"partitions": st.lists(_answer, max_size=4)}, optional={"topic": st.text(max_size=200), "topic_id": st.uuids()}
)
_body = st.fixed_dictionaries(
    {"responses": st.lists(_topic, max_size=3)},
    optional={
        "throttle_time_ms": _I32,
        "error_code": st.integers(-(1 << 15), (1 << 15) - 1),
        "session_id": _I32,
        "node_endpoints": st.just([]),
    },
)


def _record_buffers(body) -> list:
    """The record buffers of `body` the encoder must pass on as they are: lists' items, and big bytes-likes."""
    found = []
    for topic in body["responses"]:
        for p in topic["partitions"]:
            records = p.get("records")
            if isinstance(records, (list, tuple)):
                found.extend(records)
            elif records is not None and len(records) >= 4096:
                found.append(records)
    return found


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("version", VERSIONS)
def test_the_usual_answer_is_encoded_as_the_generated_encoder_does(impl, version: int) -> None:
    @_SETTINGS
    @given(_body)
    def check(body) -> None:
        out = bytearray(b"head")
        parts = impl.encode_fetch_response(body, version, out)
        assert parts.__class__ is list and parts[0] is out
        assert b"".join(bytes(p) for p in parts) == b"head" + _generated(version, body)
        passed_on = [id(p) for p in parts[1:]]
        assert all(id(buf) in passed_on for buf in _record_buffers(body))  # never copied

    check()


@pytest.mark.parametrize("impl", IMPLS)
def test_anything_else_is_declined_untouched_or_encoded_identically(impl) -> None:
    """Random bodies, many of them odd (wrong types, out-of-range ints, tagged fields, odd records, non-UTF-8
    names): what the kernel encodes is byte for byte the generated encoding; what it declines it leaves alone."""
    rnd = random.Random(5)
    odd = [0, -1, 1 << 31, (1 << 31) - 1, -(1 << 31) - 1, 1 << 15, 1 << 63, -(1 << 63), True, None, "x", 2.0]
    encoded = declined = 0
    for _ in range(4000):
        version = rnd.randint(2, 18)
        parts = []
        for _ in range(rnd.randint(0, 3)):
            p = {
                k: rnd.choice(odd) if rnd.random() < 0.3 else rnd.randint(-1000, 1 << 40)
                for k in (
                    "partition_index",
                    "error_code",
                    "high_watermark",
                    "last_stable_offset",
                    "log_start_offset",
                    "preferred_read_replica",
                )
                if rnd.random() < 0.8
            }
            if rnd.random() < 0.5:
                p["aborted_transactions"] = rnd.choice(
                    [(), [], None, [{"producer_id": 1, "first_offset": 2}], [{"producer_id": 1 << 64}], ["x"], 5]
                )
            if rnd.random() < 0.7:
                p["records"] = rnd.choice(
                    [
                        None,
                        b"",
                        b"abc",
                        bytearray(b"xy"),
                        memoryview(b"z" * 5000),
                        [b"a", memoryview(b"bc")],
                        (b"q",),
                        ["s"],
                        7,
                        "text",
                        [b"a", 1],
                    ]
                )
            if rnd.random() < 0.1:
                p[rnd.choice(["diverging_epoch", "current_leader", "snapshot_id"])] = rnd.choice(
                    [None, {"epoch": -1, "end_offset": -1}, {"leader_id": 1}]
                )
            parts.append(p if rnd.random() < 0.97 else [p])
        topic = {"partitions": parts if rnd.random() < 0.9 else rnd.choice([tuple(parts), None])}
        if rnd.random() < 0.9:
            topic["topic"] = rnd.choice(["t", "", "x" * 40_000, None, b"t", "\ud800"])
        if rnd.random() < 0.5:
            topic["topic_id"] = rnd.choice([uuid.UUID(int=rnd.getrandbits(128)), b"0" * 16, None])
        body = {"responses": rnd.choice([[topic], [topic, topic], [], None, ({"x": 1},)])}
        for key in ("throttle_time_ms", "error_code", "session_id"):
            if rnd.random() < 0.7:
                body[key] = rnd.choice([0, 5, 1 << 31, None])
        if rnd.random() < 0.1:
            body["node_endpoints"] = rnd.choice([[], [{"node_id": 1}]])
        out = bytearray(b"head")
        result = impl.encode_fetch_response(body, version, out)
        if compiled("fetchresp") is not None:  # the two builds take the same bodies and decline the others alike
            decisions = {
                _decision(m.encode_fetch_response(body, version, bytearray()))
                for m in (twin("fetchresp"), compiled("fetchresp"))
            }
            assert len(decisions) == 1, (version, body, decisions)
        if result.__class__ is list:
            encoded += 1
            assert b"".join(bytes(p) for p in result) == b"head" + _generated(version, body), (version, body)
        else:
            declined += 1
            assert result in set(Declined), result
            assert out == b"head"
    assert encoded > 300 and declined > 300


def _decision(result: object) -> object:
    """'encoded', or the reason a build declined the body."""
    return "encoded" if result.__class__ is list else result


#: a body each reason is given for, at Fetch v12 (one partition answered, as the broker does)
_PART = {"partition_index": 0, "high_watermark": 5, "records": None}
DECLINES = [
    ("version", 3, {"responses": []}),
    ("shape", 12, {"responses": [[_PART]]}),
    ("shape", 12, {"responses": [{"topic": "t", "partitions": [{**_PART, "records": "r"}]}]}),
    ("value", 12, {"responses": [{"topic": "t", "partitions": [{**_PART, "high_watermark": 1 << 63}]}]}),
    ("value", 12, {"responses": [{"topic": "t", "partitions": [{**_PART, "error_code": 1.5}]}]}),
    ("value", 12, {"responses": [{"topic": "t", "partitions": [{**_PART, "preferred_read_replica": 1 << 40}]}]}),
    ("text", 12, {"responses": [{"topic": 7, "partitions": [_PART]}]}),
    ("text", 12, {"responses": [{"topic": "\ud800", "partitions": [_PART]}]}),
    ("field", 12, {"responses": [{"topic": "t", "partitions": [{**_PART, "current_leader": {"leader_id": 1}}]}]}),
    ("field", 16, {"responses": [], "node_endpoints": [{"node_id": 1}]}),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("reason", "version", "body"), DECLINES)
def test_each_declined_body_says_why(impl, reason: str, version: int, body: dict) -> None:
    out = bytearray(b"head")
    assert impl.encode_fetch_response(body, version, out) == Declined[reason.upper()]
    assert out == b"head"


def test_a_fault_in_a_writer_is_raised_not_declined() -> None:
    """Only a `Decline` becomes a reason: every field is checked before it is written, so another exception out of
    a writer is a fault of the writer's, and hiding it as a decline would only make the broker slower."""

    def broken(body: dict, version: int) -> list:
        raise struct.error("a writer packing what it did not check")

    with pytest.raises(struct.error):
        written(broken, {"responses": []}, 12, FIRST_VERSION, LAST_VERSION)


def test_codec_frames_are_unchanged() -> None:
    records = [memoryview(b"r" * 300), memoryview(b"s" * 9000)]
    body = {
        "throttle_time_ms": 0,
        "error_code": 0,
        "session_id": 0,
        "responses": [
            {
                "topic": "orders",
                "topic_id": uuid.UUID(int=7),
                "partitions": [
                    {
                        "partition_index": i,
                        "error_code": 0,
                        "high_watermark": 100 + i,
                        "last_stable_offset": 100 + i,
                        "log_start_offset": 0,
                        "aborted_transactions": None,
                        "preferred_read_replica": -1,
                        "records": records if i == 1 else b"",
                    }
                    for i in range(3)
                ],
            }
        ],
    }
    for version in VERSIONS:
        request = Request(1, version, 77, "c", {})
        parts = encode_response(request, body)
        frame = b"".join(bytes(p) for p in parts)
        flexible = version >= 12
        head = (len(frame) - 4).to_bytes(4, "big") + (77).to_bytes(4, "big") + (b"\x00" if flexible else b"")
        assert frame == head + _generated(version, body)
        assert any(p is records[1] for p in parts)  # the store's buffers go to writelines as they are
