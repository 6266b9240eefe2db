"""Fuzz target for the Kafka request path: frame codec -> header -> body decoders (Produce: the _fast kernel).

With atheris installed:  python fuzz/fuzz_kafka_codec.py [-atheris_runs=N] [corpus dir]
Without it, `smoke(iterations, seed)` runs the same target on pseudo-random and mutated-valid inputs (the unit tests
call it). The property: every input either decodes or raises an `mqk.errors.MqkError` subclass; nothing else
escapes, nothing hangs, and a declared frame size is never allocated before it is checked.
"""

from __future__ import annotations

import random
import struct
import sys

from mqk.errors import MqkError
from mqk.protocol.kafka import api, codec

MAX_FRAME = 1 << 16


def test_one_input(data: bytes) -> None:
    conn = codec.KafkaConnectionCodec(max_request_bytes=MAX_FRAME)
    # feed in two uneven pieces so both the contiguous and the spanning frame paths run
    cut = data[0] % (len(data) + 1) if data else 0
    try:
        conn.receive_data(data[:cut])
        conn.receive_data(data[cut:])
        for _ in range(64):
            req = conn.next_request()
            if req is None:
                break
            body = api.api_versions_unsupported_body() if req.unsupported else {}
            b"".join(bytes(p) for p in codec.encode_response(req, body))
    except MqkError:
        pass


def _valid_frames() -> list[bytes]:
    samples = [
        (18, 3, {"client_software_name": "fuzz", "client_software_version": "1"}),
        (3, 12, {"topics": [{"name": "t"}], "allow_auto_topic_creation": True}),
        (
            0,
            9,
            {
                "acks": -1,
                "timeout_ms": 5,
                "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"\x00" * 70}]}],
            },
        ),
        (
            1,
            12,
            {
                "max_wait_ms": 1,
                "min_bytes": 1,
                "topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 3}]}],
            },
        ),
        (
            11,
            5,
            {
                "group_id": "g",
                "session_timeout_ms": 1,
                "member_id": "",
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b"abc"}],
            },
        ),
    ]
    return [b"".join(bytes(p) for p in codec.encode_request(k, v, 1, "c", body)) for k, v, body in samples]


def smoke(iterations: int = 2000, seed: int = 0) -> int:
    rng = random.Random(seed)
    valid = _valid_frames()
    for i in range(iterations):
        mode = i % 3
        if mode == 0:
            data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 64)))
            if rng.random() < 0.5:  # a plausible size prefix so the header/body decoders are reached
                data = struct.pack(">i", len(data)) + data
        else:
            data = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 6)):
                pos = rng.randrange(4, len(data)) if mode == 1 else rng.randrange(0, len(data))
                data[pos] = rng.getrandbits(8)
            if rng.random() < 0.3:
                data = data[: rng.randrange(0, len(data))]
            data = bytes(data)
        test_one_input(data)
    return iterations


if __name__ == "__main__":  # pragma: no cover - needs atheris
    import atheris

    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
