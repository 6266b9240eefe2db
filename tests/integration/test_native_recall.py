"""RECALL_MESSAGE over remoting (code 370) on a full broker (mqk_broker) on a FakeClock: a delayed send's answer
carries a recall handle, a recall with it keeps the message from being delivered, and bad recalls get RocketMQ's
codes (TOPIC_NOT_EXIST, ILLEGAL_OPERATION). The gRPC door's RecallMessage is tested with the RocketMQ 5 SDK in
compat/test_rocketmq5_clients.py."""

from __future__ import annotations

import base64

import pytest
from helpers import wait_until

from mqk.client.remoting import RemotingConnection
from mqk.clock import FakeClock
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.message import properties_to_string
from mqk.protocol.native.records import batch_to_messages
from mqk.server.native.recall import RecallHandle
from mqk.testing import ThreadedBroker


@pytest.fixture
def mqk_clock(mqk_fake_clock: FakeClock) -> FakeClock:
    return mqk_fake_clock


async def _send(conn: RemotingConnection, topic: str, body: bytes, props: dict[str, str]) -> RemotingCommand:
    ext = {"producerGroup": "p", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "1"}
    ext |= {"queueId": "0", "sysFlag": "0", "bornTimestamp": "0", "flag": "0"}
    ext["properties"] = properties_to_string(props)
    answer = await conn.invoke(RemotingCommand(code=RequestCode.SEND_MESSAGE, ext_fields=ext, body=body), timeout=10)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return answer


async def _recall(conn: RemotingConnection, topic: str, handle: str) -> RemotingCommand:
    ext = {"producerGroup": "p", "topic": topic, "recallHandle": handle}
    return await conn.invoke(RemotingCommand(code=RequestCode.RECALL_MESSAGE, ext_fields=ext), timeout=10)


def _bodies(broker: ThreadedBroker, topic: str) -> list[bytes]:
    result = broker.call(broker.store.read(topic, 0, 0, 1 << 20))
    out: list[bytes] = []
    for batch in result.batches:
        out += [m.body for m in batch_to_messages(batch.data, topic, 0, 0, -1, ("127.0.0.1", 1))]
    return out


async def test_a_recalled_delayed_message_is_never_delivered(mqk_broker: ThreadedBroker, mqk_clock: FakeClock) -> None:
    conn = RemotingConnection(mqk_broker.native_address)
    await conn.connect()
    try:
        due = mqk_clock.time_ms() + 10_000
        now = await _send(conn, "rc", b"now", {"UNIQ_KEY": "N1"})
        assert "recallHandle" not in now.ext_fields  # not delayed: nothing to recall
        kept = await _send(conn, "rc", b"kept", {"UNIQ_KEY": "K1", "TIMER_DELIVER_MS": str(due)})
        gone = await _send(conn, "rc", b"recalled", {"UNIQ_KEY": "R1", "TIMER_DELIVER_MS": str(due)})
        handle = RecallHandle.decode(gone.ext_fields["recallHandle"])
        assert (handle.topic, handle.unique_key, handle.due_ms) == ("rc", "R1", due)
        assert RecallHandle.decode(kept.ext_fields["recallHandle"]).unique_key == "K1"

        await _send(conn, "other", b"x", {})
        other_broker = RecallHandle("rc", "elsewhere", due, "R1").encode()
        past_due = RecallHandle("rc", handle.broker_name, due - 20_000, "K1").encode()
        illegal = ResponseCode.ILLEGAL_OPERATION
        refusals = [
            (await _recall(conn, "missing", gone.ext_fields["recallHandle"]), ResponseCode.TOPIC_NOT_EXIST),
            (await _recall(conn, "other", gone.ext_fields["recallHandle"]), illegal),
            (await _recall(conn, "rc", "not a handle"), illegal),
            (await _recall(conn, "rc", other_broker), illegal),
            (await _recall(conn, "rc", past_due), illegal),
        ]
        assert [answer.code for answer, _ in refusals] == [code for _, code in refusals], [
            a.remark for a, _ in refusals
        ]
        assert refusals[1][0].remark == "recall failed, topic not match"
        assert refusals[4][0].remark == "recall failed, timestamp invalid"

        answer = await _recall(conn, "rc", gone.ext_fields["recallHandle"])
        assert answer.code == ResponseCode.SUCCESS and answer.ext_fields["msgId"] == "R1"
        # a handle that is valid but names no message still succeeds, as RocketMQ's blind marker does
        unknown = RecallHandle("rc", handle.broker_name, due, "NOPE").encode()
        assert (await _recall(conn, "rc", unknown)).code == ResponseCode.SUCCESS

        mqk_broker.advance(9.9)
        assert _bodies(mqk_broker, "rc") == [b"now"]
        mqk_broker.advance(0.2)
        wait_until(lambda: mqk_broker.store.end_offset("rc", 0) >= 2, timeout=10)
        mqk_broker.advance(60)
        assert _bodies(mqk_broker, "rc") == [b"now", b"kept"]
        assert mqk_broker.runtime.timer.recalled == 1
        # past its due time a handle can no longer recall
        late = await _recall(conn, "rc", kept.ext_fields["recallHandle"])
        assert late.code == ResponseCode.ILLEGAL_OPERATION and late.remark == "recall failed, timestamp invalid"
        assert base64.urlsafe_b64decode(kept.ext_fields["recallHandle"]).startswith(b"v1 rc ")
    finally:
        await conn.close()
