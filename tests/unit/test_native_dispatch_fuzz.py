"""Every broker and name-server request code with hostile ext fields and bodies: the processors answer (or raise
the protocol's typed header error), never anything else, and never hang (memory store, no sockets)."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqk.config import BrokerConfig, StoreConfig
from mqk.errors import ProtocolError
from mqk.protocol.native.codes import RequestCode
from mqk.protocol.native.command import RemotingCommand
from mqk.server.native.namesrv import NameServer
from mqk.server.native.server import NativeServer
from mqk.store.manager import StoreManager

FIELD_NAMES = [
    "topic",
    "queueId",
    "queueOffset",
    "maxMsgNums",
    "sysFlag",
    "commitOffset",
    "suspendTimeoutMillis",
    "subscription",
    "consumerGroup",
    "group",
    "offset",
    "delayLevel",
    "maxReconsumeTimes",
    "key",
    "maxNum",
    "beginTimestamp",
    "endTimestamp",
    "timestamp",
    "clientID",
    "readQueueNums",
    "writeQueueNums",
    "properties",
    "bornTimestamp",
    "flag",
    "originTopic",
    "expressionType",
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    "g",
    "h",
    "i",
    "j",
    "l",
    "m",
]
VALUES = st.one_of(
    st.sampled_from(
        [
            "0",
            "1",
            "-1",
            "t",
            "%RETRY%g",
            "",
            "null",
            "9" * 30,
            "1e400",
            "nan",
            "A || B",
            "TAG",
            "SQL92",
            "*",
            "true",
            "x\x01y\x02",
            "-99999999999",
        ]
    ),
    st.text(max_size=12),
)


HOSTILE_BODIES = [
    b"{}",
    b"[]",
    b"null",
    b'{"mqSet": [1, {"queueId": "x"}, {"queueId": null}]}',
    b'{"mqSet": 7}',
    b'{"consumerDataSet": [{"groupName": "g"}]}',
    b'{"consumerDataSet": 5}',
    b'{"producerDataSet": "x"}',
    b'{"consumerDataSet": [{"groupName": "g", "subscriptionDataSet": 3}]}',
    b'{"consumerDataSet": [{"groupName": "g g", "subscriptionDataSet": [{"topic": "t", "subString": 5}]}]}',
    b'{"consumerDataSet": [{"groupName": "..", "messageModel": "CLUSTERING"}]}',
    b"\x00\x00\x00\x10" + b"\x00" * 12,
]


def test_known_hostile_cases() -> None:
    cases = [(RequestCode.LOCK_BATCH_MQ, {}, body) for body in HOSTILE_BODIES]
    cases += [(RequestCode.HEART_BEAT, {}, body) for body in HOSTILE_BODIES]
    cases += [
        (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": t, "readQueueNums": n}, None)
        for t in (".", "..", "t")
        for n in ("1", "99999999", "-3")
    ]
    cases += [(RequestCode.CONSUMER_SEND_MSG_BACK, {"offset": "0", "group": "bad group"}, None)]
    for code, ext, body in cases:
        asyncio.run(_exercise(int(code), ext, body))


class FakeConnection:
    def __init__(self) -> None:
        self.peer = ("127.0.0.1", 5555)
        self.id = 1
        self.closed = False
        self.on_close: list = []

    async def send(self, cmd: RemotingCommand) -> None:
        pass

    async def send_oneway(self, code: int, ext: dict, body: bytes | None = None) -> None:
        pass


async def _exercise(code: int, ext: dict[str, str], body: bytes | None) -> None:
    config = BrokerConfig(native_listen=("127.0.0.1", 0), store=StoreConfig(storage="memory"))
    store = StoreManager(config.store)
    await store.start()
    try:
        await store.create_topic("t", 2)
        broker = NativeServer(config, store)
        namesrv = NameServer(config, store, ("127.0.0.1", 1))
        conn = FakeConnection()
        for server in (broker, namesrv):
            cmd = RemotingCommand(code=code, opaque=1, ext_fields=dict(ext), body=body)
            try:
                response = await asyncio.wait_for(server.dispatch(conn, cmd), 5)  # type: ignore[arg-type]  # a fake connection
            except ProtocolError:
                continue  # a missing or malformed required field: answered SYSTEM_ERROR by the connection
            assert response is None or isinstance(response, RemotingCommand)
    finally:
        await store.close()


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    code=st.sampled_from([int(c) for c in RequestCode] + [9999]),
    ext=st.dictionaries(st.sampled_from(FIELD_NAMES), VALUES, max_size=10),
    body=st.none() | st.binary(max_size=64) | st.sampled_from(HOSTILE_BODIES),
)
def test_dispatch_never_raises_untyped(code: int, ext: dict[str, str], body: bytes | None) -> None:
    asyncio.run(_exercise(code, ext, body))
