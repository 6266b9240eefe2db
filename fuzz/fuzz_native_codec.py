"""Fuzz target for the RocketMQ remoting decode path: FrameDecoder -> header (JSON or ROCKETMQ binary) -> command,
then what a processor would do with it: read typical ext fields, decode the body as a message list and as a batch
body, and encode the command again.

With atheris installed:  python fuzz/fuzz_native_codec.py [-atheris_runs=N] [corpus dir]
Without it, `smoke(iterations, seed)` runs the same target on pseudo-random and mutated-valid frames (the unit tests
call it). The property: every input either decodes or raises an `mqk.errors.MqkError` subclass; nothing else
escapes, nothing hangs, a declared frame size is never trusted before it is checked, and a command that decoded
encodes again into a frame that decodes to the same code, opaque, flag, ext fields and body.
"""

from __future__ import annotations

import contextlib
import random
import struct
import sys

from mqk.errors import MqkError
from mqk.protocol.native.codes import RequestCode, SerializeType
from mqk.protocol.native.command import FrameDecoder, RemotingCommand, decode_frame
from mqk.protocol.native.message import (
    BatchItem,
    MessageExt,
    decode_batch_body,
    decode_messages,
    encode_batch_body,
    encode_message_ext,
)

MAX_FRAME = 1 << 16
#: ext fields the processors read as numbers (a hostile value must give HeaderFieldError, not ValueError)
INT_FIELDS = ("queueId", "queueOffset", "maxMsgNums", "sysFlag", "offset", "delayLevel", "b", "e", "j")


def _exercise(cmd: RemotingCommand) -> None:
    for name in INT_FIELDS:
        with contextlib.suppress(MqkError):
            cmd.get_int(name)
    cmd.get_str("topic")
    cmd.get_bool("unitMode")
    if cmd.body:
        for decode in (decode_messages, decode_batch_body):
            with contextlib.suppress(MqkError):
                decode(cmd.body)
    try:
        again = decode_frame(memoryview(cmd.encode())[4:])
    except MqkError:
        return  # e.g. a header that no longer fits 24 bits once re-serialised: refused, typed
    assert (again.code, again.opaque, again.flag, again.ext_fields, again.body or b"") == (
        cmd.code,
        cmd.opaque,
        cmd.flag,
        cmd.ext_fields,
        cmd.body or b"",
    ), "re-encoded command differs"


def test_one_input(data: bytes) -> None:
    decoder = FrameDecoder(max_frame_bytes=MAX_FRAME)
    # feed in two uneven pieces so both the whole-frame and the split-frame paths run
    cut = data[0] % (len(data) + 1) if data else 0
    try:
        decoder.receive_data(data[:cut])
        decoder.receive_data(data[cut:])
        for _ in range(64):
            cmd = decoder.next_command()
            if cmd is None:
                break
            _exercise(cmd)
    except MqkError:
        pass


def _valid_frames() -> list[bytes]:
    msg = MessageExt(
        topic="t", body=b"hello", properties={"TAGS": "a", "KEYS": "k1 k2"}, queue_offset=3, commit_log_offset=1234
    )
    batch = encode_batch_body([BatchItem(b"one", {"TAGS": "x"}), BatchItem(b"two", {"KEYS": "y"})])
    out = []
    for serialize in (SerializeType.JSON, SerializeType.ROCKETMQ):
        out += [
            RemotingCommand(
                RequestCode.SEND_MESSAGE_V2,
                opaque=7,
                ext_fields={"a": "grp", "b": "t", "e": "0", "i": "TAGS\x01a\x02", "j": "0"},
                body=b"payload",
                serialize_type=serialize,
            ).encode(),
            RemotingCommand(
                RequestCode.PULL_MESSAGE,
                opaque=8,
                ext_fields={"topic": "t", "queueId": "1", "queueOffset": "0", "maxMsgNums": "32"},
                serialize_type=serialize,
            ).encode(),
            RemotingCommand(
                RequestCode.VIEW_MESSAGE_BY_ID, opaque=9, ext_fields={"offset": "1234"}, serialize_type=serialize
            ).encode(),
            RemotingCommand(
                0, opaque=8, flag=1, remark="ok", body=encode_message_ext(msg) * 2, serialize_type=serialize
            ).encode(),
            RemotingCommand(
                RequestCode.SEND_BATCH_MESSAGE, opaque=10, ext_fields={"b": "t"}, body=batch, serialize_type=serialize
            ).encode(),
        ]
    return out


def smoke(iterations: int = 2000, seed: int = 0) -> int:
    """Runs the target `iterations` times on bounded inputs (at most a few hundred bytes each); returns the count."""
    rng = random.Random(seed)
    valid = _valid_frames()
    for i in range(iterations):
        mode = i % 4
        if mode == 0:
            data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 64)))
            if rng.random() < 0.7:  # a plausible length and serialize word so the header decoders are reached
                header_len = rng.randrange(0, len(data) + 1)
                data = struct.pack(">iI", len(data) + 4, (rng.randrange(0, 2) << 24) | header_len) + data
        elif mode == 3:  # two valid frames back to back, the second one cut short
            a, b = rng.choice(valid), rng.choice(valid)
            data = a + b[: rng.randrange(0, len(b) + 1)]
        else:
            data = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 6)):
                pos = rng.randrange(8, len(data)) if mode == 1 else rng.randrange(0, len(data))
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
