"""Fuzz target for the RocketMQ signature and ACL check (mqk.server.native.acl's NativeAcl, with
mqk.protocol.native.signature): what a request's ext fields and body do to the check every request passes before
its processor runs, when the authorizer is on.

An input is `mode byte + remoting frame` (a frame as mqk.protocol.native.command decodes it). Mode 0 checks the
command as it came; mode 1 signs it first with a known access key; mode 2 signs it and then changes one byte of the
body or of a field value (a signature that no longer fits). Frames that do not decode are refused before the check,
as the server does.

With atheris installed:  python fuzz/fuzz_rocketmq_acl.py [-atheris_runs=N] [corpus dir]
Without it, `corpus()` is a fixed set of inputs (signed and unsigned requests of the codes the check reads fields or
bodies of, with odd field values) and `smoke(iterations, seed)` mutates them; the unit tests run both. The property:
the check answers None or a NO_PERMISSION response and nothing escapes it; it answers None only for a request whose
signature the key's secret makes and whose every need the authorizer grants.
"""

from __future__ import annotations

import json
import random
import struct
import sys
from types import SimpleNamespace

from mqk.broker.security.access_keys import AccessKeys
from mqk.broker.security.principal import USER, Principal
from mqk.errors import MqkError
from mqk.protocol.native.codes import RequestCode, ResponseCode, SerializeType
from mqk.protocol.native.command import RemotingCommand, decode_frame
from mqk.protocol.native.signature import ACCESS_KEY, SIGNATURE, sign, verify
from mqk.server.native.acl import NativeAcl, needs

KEY, SECRET = "fuzzer", "fuzz-secret"
PEER = ("127.0.0.1", 4242)
AS_IS, SIGNED, SIGNED_THEN_CHANGED = 0, 1, 2


class _Authorizer:
    """Grants what is named `ok...` (and nothing on the cluster): both answers of the ACL check are reached."""

    def authorize(self, principal, host, operation, resource_type, name) -> bool:
        return str(name).startswith("ok")


def check(cmd: RemotingCommand) -> RemotingCommand | None:
    """The broker's check of `cmd` (authorizer on, one access key)."""
    keys = AccessKeys(None)
    keys.set(KEY, SECRET)
    security = SimpleNamespace(
        authorizer=_Authorizer(), access_keys=keys, access_key_principal=lambda key: Principal(USER, key)
    )
    acl = NativeAcl(True, security, lambda topic: topic.startswith("ok"))  # type: ignore[arg-type]
    return acl.check(PEER, cmd)


def _change(cmd: RemotingCommand, pick: int) -> None:
    fields = [k for k in cmd.ext_fields if k not in (SIGNATURE, ACCESS_KEY)]
    if cmd.body and (pick % 2 or not fields):
        body = bytearray(cmd.body)
        body[pick % len(body)] ^= 0x01
        cmd.body = bytes(body)
    elif fields:
        name = fields[pick % len(fields)]
        cmd.ext_fields[name] = cmd.ext_fields[name] + "x"
    else:
        cmd.ext_fields["extra"] = "x"


def test_one_input(data: bytes) -> None:
    if len(data) < 5:
        return
    mode, pick = data[0] % 3, data[0] // 3
    try:
        cmd = decode_frame(memoryview(data[5:]))  # (bytes 1..4: the frame's length word, which the decoder checks)
    except MqkError:
        return  # refused as a frame before any check
    if mode != AS_IS:
        sign(cmd.ext_fields, cmd.body, KEY, SECRET)
        if mode == SIGNED_THEN_CHANGED:
            _change(cmd, pick)
    answer = check(cmd)
    if answer is not None:
        assert answer.code == ResponseCode.NO_PERMISSION, answer
        return
    assert cmd.ext_fields.get(ACCESS_KEY) == KEY and verify(cmd.ext_fields, cmd.body, SECRET), "let in unsigned"
    for _operation, _resource_type, name in needs(cmd):
        assert str(name).startswith("ok"), f"let in without {name}"


def _frame(code: int, fields: dict[str, str], body: bytes = b"", serialize: int = SerializeType.JSON) -> bytes:
    """A whole frame: its length word, then what decode_frame reads."""
    return RemotingCommand(code, opaque=1, ext_fields=fields, body=body, serialize_type=serialize).encode()


def corpus() -> list[bytes]:
    heartbeat = json.dumps({"clientID": "c", "consumerDataSet": [{"groupName": "okg"}, {"groupName": "g2"}]})
    requests = [
        (RequestCode.SEND_MESSAGE_V2, {"a": "okpg", "b": "oktopic", "e": "0"}, b"payload"),
        (RequestCode.SEND_MESSAGE_V2, {"a": "okpg", "b": "newtopic", "e": "0"}, b"payload"),  # needs CREATE
        (RequestCode.SEND_MESSAGE, {"producerGroup": "p", "topic": "%RETRY%okg"}, b"x"),
        (RequestCode.PULL_MESSAGE, {"topic": "oktopic", "consumerGroup": "okg", "queueId": "1"}, b""),
        (RequestCode.PULL_MESSAGE, {"topic": "secret", "consumerGroup": "okg"}, b""),
        (RequestCode.HEART_BEAT, {}, heartbeat.encode()),
        (RequestCode.HEART_BEAT, {}, b"{not json"),
        (RequestCode.LOCK_BATCH_MQ, {}, b'{"consumerGroup": "okg", "mqSet": []}'),
        (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "oknew"}, b""),
        (RequestCode.GET_BROKER_CONFIG, {}, b""),
        (RequestCode.GET_CONSUME_STATS, {"consumerGroup": "okg", "topic": ""}, b""),
        (RequestCode.CHECK_CLIENT_CONFIG, {}, b""),
        (RequestCode.SEND_MESSAGE_V2, {"b": "oktopic", "\u00e9": "\u00ff"}, b"\x00\xff"),
        (9999, {"topic": ""}, b""),
    ]
    out = []
    for code, fields, body in requests:
        for serialize in (SerializeType.JSON, SerializeType.ROCKETMQ):
            frame = _frame(code, fields, body, serialize)
            out += [bytes([mode]) + frame for mode in (AS_IS, SIGNED, SIGNED_THEN_CHANGED, 3 + SIGNED_THEN_CHANGED)]
    # a signature from another secret, and an access key with no signature
    other = RemotingCommand(RequestCode.PULL_MESSAGE, opaque=1, ext_fields={"topic": "oktopic", "consumerGroup": "okg"})
    sign(other.ext_fields, None, KEY, "not-the-secret")
    out.append(bytes([AS_IS]) + other.encode())
    out.append(bytes([AS_IS]) + _frame(RequestCode.PULL_MESSAGE, {ACCESS_KEY: KEY, "topic": "oktopic"}))
    out.append(bytes([AS_IS]) + struct.pack(">ii", 4, 0))
    return out


def smoke(iterations: int = 1000, seed: int = 0) -> int:
    rng = random.Random(seed)
    seeds = corpus()
    for _ in range(iterations):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.getrandbits(8)
        test_one_input(bytes(data))
    return iterations


if __name__ == "__main__":  # pragma: no cover - needs atheris
    import logging

    import atheris

    logging.getLogger("mqk.native").setLevel(logging.ERROR)  # refusal lines would drown the fuzzer's own
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
