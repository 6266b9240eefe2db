"""The hand-written Fetch request decoder (mqk._fast.fetchreq, compiled and twin) against the generated one
(mqk.protocol.kafka.messages): the same dict for every body the generated decoder accepts, a refusal for every body
it refuses, for every Fetch version; a body with a tagged field declined to the generated decoder; and the codec's
requests and MalformedMessage unchanged."""

from __future__ import annotations

import random
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqk._fast import compiled, twin
from mqk._fast.handwritten import DECLINE_FIELD
from mqk.protocol.kafka import messages
from mqk.protocol.kafka.codec import DECLINED, Declined, KafkaConnectionCodec, encode_request
from mqk.protocol.kafka.errors import MalformedMessage

VERSIONS = range(4, 18)
IMPLS = [pytest.param(twin("fetchreq"), id="twin")]
if compiled("fetchreq") is not None:
    IMPLS.append(pytest.param(compiled("fetchreq"), id="compiled"))
_SETTINGS = settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
_I32 = st.integers(-(1 << 31), (1 << 31) - 1)
_I64 = st.integers(-(1 << 63), (1 << 63) - 1)


def _request(version: int):
    partition = st.fixed_dictionaries(
        {
            "partition": _I32,
            "current_leader_epoch": _I32,
            "fetch_offset": _I64,
            "last_fetched_epoch": _I32,
            "log_start_offset": _I64,
            "partition_max_bytes": _I32,
        }
    )
    named = {"topic_id": st.uuids()} if version >= 13 else {"topic": st.text(max_size=20)}
    topic = st.fixed_dictionaries({**named, "partitions": st.lists(partition, max_size=4)})
    forgotten = st.fixed_dictionaries({**named, "partitions": st.lists(_I32, max_size=3)})
    return st.fixed_dictionaries(
        {
            "replica_id": _I32,
            "max_wait_ms": _I32,
            "min_bytes": _I32,
            "max_bytes": _I32,
            "isolation_level": st.integers(-128, 127),
            "session_id": _I32,
            "session_epoch": _I32,
            "topics": st.lists(topic, max_size=3),
            "forgotten_topics_data": st.lists(forgotten, max_size=2),
            "rack_id": st.text(max_size=10),
        }
    )


def _encoded(version: int, obj: dict) -> memoryview:
    return memoryview(b"".join(bytes(p) for p in messages.encode_request(1, version, obj)))


def _outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except (MalformedMessage, ValueError):
        return "refused", None


def _generated(version: int, body: memoryview):
    return messages.decode_request(1, version, body)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("version", VERSIONS)
def test_same_dict_as_the_generated_decoder(impl, version: int) -> None:
    @_SETTINGS
    @given(_request(version))
    def check(obj) -> None:
        body = _encoded(version, obj)
        expected = _generated(version, body)
        got = impl.decode_fetch_request(body, version)
        assert got == expected
        assert list(got) == list(expected)  # the same keys, in the same order
        for topic, want in zip(got["topics"], expected["topics"]):
            assert list(topic) == list(want)
            assert [list(p) for p in topic["partitions"]] == [list(p) for p in want["partitions"]]

    check()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("version", VERSIONS)
def test_refuses_what_the_generated_decoder_refuses(impl, version: int) -> None:
    """Truncations, byte flips and random bodies: accepted by both with the same dict, refused by both, or (a
    tagged field) declined by the kernel, which leaves the body to the generated decoder."""
    rnd = random.Random(version)
    valid = bytes(
        _encoded(
            version,
            {
                "replica_id": -1,
                "max_wait_ms": 500,
                "min_bytes": 1,
                "max_bytes": 52428800,
                "isolation_level": 1,
                "session_id": 0,
                "session_epoch": -1,
                "rack_id": "r1",
                "topics": [
                    {
                        "topic": "orders",
                        "topic_id": uuid.UUID(int=7),
                        "partitions": [
                            {"partition": p, "fetch_offset": 100 * p, "partition_max_bytes": 1 << 20} for p in range(3)
                        ],
                    }
                ],
                "forgotten_topics_data": [{"topic": "old", "topic_id": uuid.UUID(int=8), "partitions": [4, 5]}],
            },
        )
    )
    bodies = [valid[:cut] for cut in range(len(valid))] + [valid + b"\x00trailing"]
    for _ in range(400):
        flipped = bytearray(valid)
        for _ in range(rnd.randint(1, 3)):
            flipped[rnd.randrange(len(flipped))] = rnd.choice([0, 1, 0x7F, 0x80, 0xFF, rnd.randrange(256)])
        bodies.append(bytes(flipped))
        bodies.append(
            bytes(rnd.choice([0, 0, 1, 2, 0x7F, 0x80, 0xFF, rnd.randrange(256)]) for _ in range(rnd.randint(0, 60)))
        )
    declined = 0
    for data in bodies:
        body = memoryview(data)
        got = _outcome(impl.decode_fetch_request, body, version)
        if compiled("fetchreq") is not None:  # the two builds decode, decline and refuse the same bodies
            builds = (twin("fetchreq"), compiled("fetchreq"))
            outcomes = [_outcome(m.decode_fetch_request, body, version) for m in builds]
            assert outcomes[0] == outcomes[1], data
        if got == ("ok", DECLINE_FIELD):  # (the only reason it declines a request: a tagged field)
            declined += 1
            assert version >= 12  # only a flexible version has tagged fields
            continue
        assert got == _outcome(_generated, version, body), data
    assert declined < len(bodies) // 2


@pytest.mark.parametrize("impl", IMPLS)
def test_a_tagged_field_is_left_to_the_generated_decoder(impl) -> None:
    obj = {
        "max_wait_ms": 500,
        "min_bytes": 1,
        "max_bytes": 1000,
        "cluster_id": "c1",
        "topics": [
            {
                "topic_id": uuid.UUID(int=3),
                "partitions": [
                    {
                        "partition": 0,
                        "fetch_offset": 5,
                        "partition_max_bytes": 9,
                        "replica_directory_id": uuid.UUID(int=4),
                    }
                ],
            }
        ],
    }
    for version in range(12, 18):
        assert impl.decode_fetch_request(_encoded(version, obj), version) == DECLINE_FIELD
        plain = {k: v for k, v in obj.items() if k != "cluster_id"}
        plain["topics"] = [
            {
                **obj["topics"][0],
                "partitions": [
                    {k: v for k, v in obj["topics"][0]["partitions"][0].items() if k != "replica_directory_id"}
                ],
            }
        ]
        body = _encoded(version, plain)
        assert impl.decode_fetch_request(body, version) == _generated(version, body)
        # an empty tag section spelt in two bytes (0x80 0x00) is read by the generated decoder, declined here
        assert bytes(body[-1:]) == b"\x00"
        longer = memoryview(bytes(body[:-1]) + b"\x80\x00")
        assert impl.decode_fetch_request(longer, version) == DECLINE_FIELD
        assert _generated(version, longer) == _generated(version, body)


def test_codec_decodes_fetch_with_the_kernel_and_falls_back_for_tagged_fields() -> None:
    codec = KafkaConnectionCodec()
    declined = DECLINED[(1, Declined.FIELD)]
    for version, cluster_id in ((12, None), (17, None), (17, "c1")):
        body = {
            "max_wait_ms": 500,
            "min_bytes": 1,
            "max_bytes": 1000,
            "cluster_id": cluster_id,
            "topics": [
                {
                    "topic": "t",
                    "topic_id": uuid.UUID(int=3),
                    "partitions": [{"partition": 2, "fetch_offset": 5, "partition_max_bytes": 9}],
                }
            ],
        }
        codec.receive_data(b"".join(bytes(p) for p in encode_request(1, version, 42, "c", body)))
        req = codec.next_request()
        assert req.correlation_id == 42 and req.body["cluster_id"] == cluster_id
        assert req.body["topics"][0]["partitions"][0]["fetch_offset"] == 5
    # only the request with a cluster_id (a tagged field) went to the generated decoder, counted with its reason
    assert DECLINED[(1, Declined.FIELD)] == declined + 1
    frame = b"".join(bytes(p) for p in encode_request(1, 12, 43, "c", body))
    truncated = bytearray(frame[:-3])
    truncated[0:4] = (len(truncated) - 4).to_bytes(4, "big")
    codec.receive_data(truncated)
    with pytest.raises(MalformedMessage) as info:
        codec.next_request()
    assert info.value.api_key == 1 and info.value.api_version == 12 and info.value.correlation_id == 43
