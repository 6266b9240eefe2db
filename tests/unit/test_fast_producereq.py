"""The hand-written Produce request decoder (mqk._fast.producereq, compiled and twin) against the generated one
(mqk.protocol.kafka.messages): the same dict for every body the generated decoder accepts, a refusal for every body
it refuses, for every Produce version; records as zero-copy views; and the codec's MalformedMessage for bad bytes."""

from __future__ import annotations

import random
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqk._fast import compiled, twin
from mqk.protocol.kafka import messages
from mqk.protocol.kafka.codec import KafkaConnectionCodec, encode_request
from mqk.protocol.kafka.errors import MalformedMessage

VERSIONS = range(3, 14)
IMPLS = [pytest.param(twin("producereq"), id="twin")]
if compiled("producereq") is not None:
    IMPLS.append(pytest.param(compiled("producereq"), id="compiled"))
_SETTINGS = settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _request(version: int):
    topic = {
        "partition_data": st.lists(
            st.fixed_dictionaries(
                {
                    "index": st.integers(-(1 << 31), (1 << 31) - 1),
                    # lengths around the one- and two-byte varint boundaries too
                    "records": st.none() | st.binary(max_size=40) | st.integers(120, 20_000).map(lambda n: b"r" * n),
                }
            ),
            max_size=4,
        )
    }
    if version >= 13:
        topic["topic_id"] = st.uuids()
    else:
        topic["name"] = st.text(max_size=20)
    return st.fixed_dictionaries(
        {
            "transactional_id": st.none() | st.text(max_size=10),
            "acks": st.integers(-(1 << 15), (1 << 15) - 1),
            "timeout_ms": st.integers(-(1 << 31), (1 << 31) - 1),
            "topic_data": st.lists(st.fixed_dictionaries(topic), max_size=3),
        }
    )


def _plain(x):
    """Values comparable across implementations: views as bytes."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, memoryview):
        return ("view", bytes(x))
    return x


def _outcome(fn, *args):
    try:
        return "ok", _plain(fn(*args))
    except (MalformedMessage, ValueError):
        return "refused", None


def _generated(version: int, body: memoryview):
    return messages.decode_request(0, version, body)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("version", VERSIONS)
def test_same_dict_as_the_generated_decoder(impl, version: int) -> None:
    @_SETTINGS
    @given(_request(version))
    def check(obj) -> None:
        body = memoryview(b"".join(bytes(p) for p in messages.encode_request(0, version, obj)))
        expected = _generated(version, body)
        got = impl.decode_produce_request(body, version)
        assert _plain(got) == _plain(expected)
        assert list(got) == list(expected)  # the same keys, in the same order
        for topic in got["topic_data"]:
            assert isinstance(topic["topic_id"], uuid.UUID)
            for part in topic["partition_data"]:
                if part["records"] is not None:  # a view into the request, never a copy
                    assert isinstance(part["records"], memoryview) and part["records"].obj is body.obj

    check()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("version", VERSIONS)
def test_refuses_what_the_generated_decoder_refuses(impl, version: int) -> None:
    """Truncations, byte flips and random bodies: accepted by both with the same dict, or refused by both."""
    rnd = random.Random(version)
    valid = b"".join(
        bytes(p)
        for p in messages.encode_request(
            0,
            version,
            {
                "transactional_id": "tx",
                "acks": -1,
                "timeout_ms": 30_000,
                "topic_data": [
                    {
                        "name": "orders",
                        "topic_id": uuid.UUID(int=7),
                        "partition_data": [
                            {"index": 0, "records": b"x" * 200},
                            {"index": 1, "records": None},
                            {"index": 2, "records": b"y"},
                        ],
                    }
                ],
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
            bytes(rnd.choice([0, 0, 1, 2, 0x7F, 0x80, 0xFF, rnd.randrange(256)]) for _ in range(rnd.randint(0, 40)))
        )
    for data in bodies:
        body = memoryview(data)
        assert _outcome(impl.decode_produce_request, body, version) == _outcome(_generated, version, body), data


def test_codec_decodes_produce_with_the_kernel_and_refuses_bad_bytes_as_malformed() -> None:
    body = {
        "transactional_id": None,
        "acks": 1,
        "timeout_ms": 1000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 3, "records": b"batch"}]}],
    }
    frame = b"".join(bytes(p) for p in encode_request(0, 9, 42, "c", body))
    codec = KafkaConnectionCodec()
    codec.receive_data(frame)
    req = codec.next_request()
    assert req.correlation_id == 42 and bytes(req.body["topic_data"][0]["partition_data"][0]["records"]) == b"batch"
    assert req.body["topic_data"][0]["partition_data"][0]["index"] == 3
    truncated = bytearray(frame[:-3])
    truncated[0:4] = (len(truncated) - 4).to_bytes(4, "big")
    codec.receive_data(truncated)
    with pytest.raises(MalformedMessage) as info:
        codec.next_request()
    assert info.value.api_key == 0 and info.value.api_version == 9 and info.value.correlation_id == 42
