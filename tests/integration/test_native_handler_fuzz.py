"""Every RocketMQ request code the broker knows, sent with random ext fields (the names processors read, and the
single letters of SEND_MESSAGE_V2's compact header) holding edge values, and random bodies (bytes, heartbeat and
lock JSON, odd JSON), in both header serialisations, at a live file-store broker.

The property: each request is answered or its connection closed; no processor raises (nothing is logged at ERROR
level or with a traceback); the broker keeps serving. This found a bornTimestamp beyond a Java long reaching the
batch builder and failing there as an unexpected error; an ext field outside the 64-bit range is now a bad field.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import struct
from pathlib import Path

import pytest

from mqk.protocol.native.codes import RequestCode, SerializeType
from mqk.protocol.native.command import RemotingCommand
from mqk.runtime import BrokerRuntime
from mqk.testing import broker_config

FIELD_NAMES = [
    "batch",
    "beginTimestamp",
    "bornTimestamp",
    "clientID",
    "commitOffset",
    "commitOrRollback",
    "consumerGroup",
    "defaultTopic",
    "defaultTopicQueueNums",
    "delayLevel",
    "endTimestamp",
    "expressionType",
    "flag",
    "group",
    "key",
    "maxMsgNums",
    "maxNum",
    "maxReconsumeTimes",
    "msgId",
    "offset",
    "originMsgId",
    "originTopic",
    "perm",
    "producerGroup",
    "properties",
    "queueId",
    "queueOffset",
    "readQueueNums",
    "reconsumeTimes",
    "subscription",
    "suspendTimeoutMillis",
    "sysFlag",
    "timestamp",
    "topic",
    "topicFilterType",
    "tranStateTableOffset",
    "unitMode",
    "writeQueueNums",
    *list("abcdefghijklmn"),
]
FIELD_VALUES = [
    "fz",
    "",
    "-1",
    "0",
    "1",
    "3",
    "7",
    "2147483648",
    "99999999999999999999",
    "-9223372036854775809",
    "1.5",
    "true",
    "abc",
    "%RETRY%g",
    "%DLQ%g",
    "TBW102",
    "x" * 300,
    "*",
    "a || b",
    "\x00",
    "TAGS\x01a\x02KEYS\x01k\x02",
    "0A0B0C0D00002A9F0000000000000000",
]
#: requests that once reached a processor's unexpected-error path, sent before the random ones
FOUND = [
    (
        RequestCode.SEND_MESSAGE_V2,
        {"topic": "1.5", "producerGroup": "g", "bornTimestamp": "-9223372036854775809", "m": "2147483648"},
        b'"s"',
    ),
]
PER_CODE = 12
ANSWER_TIMEOUT_S = 5.0


def _body(rnd: random.Random) -> bytes | None:
    pick = rnd.randrange(6)
    if pick == 0:
        return None
    if pick == 1:
        return bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(64)))
    if pick == 2:
        return json.dumps(
            {
                "clientID": "c",
                "consumerDataSet": [
                    {
                        "groupName": rnd.choice(FIELD_VALUES),
                        "consumeType": rnd.choice(["CONSUME_PASSIVELY", "x", 1]),
                        "messageModel": rnd.choice(["CLUSTERING", "BROADCASTING", None]),
                        "subscriptionDataSet": [
                            {
                                "topic": rnd.choice(FIELD_VALUES),
                                "subString": rnd.choice(FIELD_VALUES),
                                "tagsSet": [],
                                "codeSet": [],
                                "subVersion": rnd.choice([0, -1, "x"]),
                            }
                        ],
                    }
                ],
                "producerDataSet": [{"groupName": rnd.choice(FIELD_VALUES)}],
            }
        ).encode()
    if pick == 3:
        return json.dumps(
            {
                "mqSet": [
                    {"topic": rnd.choice(FIELD_VALUES), "brokerName": "b", "queueId": rnd.choice([0, -1, 99, "x"])}
                ],
                "consumerGroup": rnd.choice(FIELD_VALUES),
                "clientId": "c",
            }
        ).encode()
    if pick == 4:
        return json.dumps(rnd.choice([[], {}, None, 1, "s", {"a": [1, {"b": None}]}])).encode()
    return b"hello " * rnd.randrange(50)


def _raised(records: list[logging.LogRecord]) -> list[str]:
    """What the broker logged at ERROR level or with a traceback."""
    return [r.getMessage() for r in records if r.levelno >= logging.ERROR or r.exc_info]


async def _exchange(address: tuple[str, int], frame: bytes) -> str:
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(frame)
        await writer.drain()
        try:
            head = await asyncio.wait_for(reader.readexactly(4), ANSWER_TIMEOUT_S)
            await asyncio.wait_for(reader.readexactly(struct.unpack(">i", head)[0]), ANSWER_TIMEOUT_S)
            return "answered"
        except asyncio.IncompleteReadError:
            return "closed"
    finally:
        writer.close()


@pytest.mark.parametrize("seed", [1, 2])
async def test_every_request_code_with_random_fields_is_answered_and_nothing_raises(tmp_path: Path, caplog, seed: int):
    runtime = BrokerRuntime(broker_config("file", tmp_path))
    await runtime.start()
    try:
        address = runtime.native_address
        assert address is not None
        rnd = random.Random(seed)
        codes = sorted(int(code) for code in RequestCode)
        outcomes: dict[str, int] = {}
        for code, fields, body in FOUND:
            logged = len(caplog.records)
            command = RemotingCommand(code=code, opaque=1, ext_fields=fields, body=body)
            assert await _exchange(address, command.encode()) == "answered"
            assert _raised(caplog.records[logged:]) == [], (code, fields)
        for code in codes:
            for i in range(PER_CODE):
                fields = {rnd.choice(FIELD_NAMES): rnd.choice(FIELD_VALUES) for _ in range(rnd.randrange(12))}
                command = RemotingCommand(
                    code=code,
                    opaque=i + 1,
                    ext_fields=fields,
                    body=_body(rnd),
                    serialize_type=rnd.choice([SerializeType.JSON, SerializeType.ROCKETMQ]),
                )
                logged = len(caplog.records)
                outcome = await _exchange(address, command.encode())
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                assert _raised(caplog.records[logged:]) == [], (code, fields, command.body)
        assert outcomes.get("answered", 0) > len(codes) * PER_CODE // 2, outcomes
        # still serving: a plain request on a new connection is answered
        probe = RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO, opaque=1)
        assert await _exchange(address, probe.encode()) == "answered"
    finally:
        await runtime.stop()
