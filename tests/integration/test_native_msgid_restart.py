"""Message ids outlive the broker process (file store): a message sent over remoting is found by the offset message
id its send returned after a clean stop (SIGTERM) and after kill -9, through VIEW_MESSAGE_BY_ID (body, topic,
tags, keys, queue offset) and CONSUMER_SEND_MSG_BACK (the message lands in the group's dead-letter topic).

The broker listens on a new port after each restart while the id keeps the old store address, so requests go to
the new address with the commit-log offset the id carries, as a RocketMQ admin would after a broker moved."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mqk.client import MessageQueue, Producer, PullConsumer
from mqk.client.admin import Admin
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.protocol.native.message import decode_message_id, decode_messages
from mqk.testing import BrokerProcess

TOPIC = "ids-restart"


def _ns(broker: BrokerProcess) -> str:
    assert broker.namesrv_address is not None
    return f"{broker.namesrv_address[0]}:{broker.namesrv_address[1]}"


async def _view(admin: Admin, broker: BrokerProcess, offset_msg_id: str):
    _host, _port, offset = decode_message_id(offset_msg_id)
    assert broker.native_address is not None
    resp = await admin.invoke(broker.native_address, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
    (msg,) = decode_messages(resp.body or b"")
    return msg


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "kill-9"])
async def test_view_and_send_back_by_id_after_restart(tmp_path: Path, kill: bool) -> None:
    broker = BrokerProcess(tmp_path / "data", storage="file").start()
    try:
        sent = []
        async with Producer(_ns(broker)) as producer:
            for i in range(30):
                result = await producer.send(
                    TOPIC, b"body-%d" % i, tags=f"tag{i % 3}", keys=[f"key-{i}", f"order-{i // 2}"]
                )
                assert result is not None
                sent.append((i, result))
        async with Admin(_ns(broker)) as admin:  # the ids work before the restart, of course
            msg = await _view(admin, broker, sent[0][1].offset_msg_id)
            assert msg.body == b"body-0"

        if kill:
            broker.kill()
            broker.start()
        else:
            assert broker.stop() == 0
            broker.start()

        async with Admin(_ns(broker)) as admin:
            for i, result in sent:
                msg = await _view(admin, broker, result.offset_msg_id)
                assert msg.topic == TOPIC and msg.body == b"body-%d" % i
                assert msg.tags == f"tag{i % 3}" and msg.keys == [f"key-{i}", f"order-{i // 2}"]
                assert (msg.queue_id, msg.queue_offset) == (result.queue.queue_id, result.queue_offset)
                assert msg.properties.get("UNIQ_KEY") == result.msg_id
            # an offset naming nothing is answered, not crashed on
            _h, _p, last = decode_message_id(sent[-1][1].offset_msg_id)
            assert broker.native_address is not None
            for bad in (last + 1, last + (1 << 40), 3 << 48):
                resp = await admin.invoke(
                    broker.native_address,
                    RequestCode.VIEW_MESSAGE_BY_ID,
                    {"offset": bad},
                    ok=(ResponseCode.SYSTEM_ERROR,),
                )
                assert "can not find message" in (resp.remark or "")

            # send-back by the id's offset: the broker finds the message itself (no client re-send)
            i, result = sent[7]
            _h, _p, offset = decode_message_id(result.offset_msg_id)
            await admin.invoke(
                broker.native_address,
                RequestCode.CONSUMER_SEND_MSG_BACK,
                {
                    "offset": offset,
                    "group": "g-restart",
                    "delayLevel": -1,
                    "originMsgId": result.msg_id,
                    "originTopic": TOPIC,
                    "maxReconsumeTimes": 16,
                },
            )
        async with PullConsumer(_ns(broker), "dlq-check") as consumer:
            mq = MessageQueue("%DLQ%g-restart", "mqk-broker-a", 0)
            deadline = time.monotonic() + 10
            dead = []
            while not dead and time.monotonic() < deadline:
                dead = (await consumer.pull(mq, 0)).messages
            assert [m.body for m in dead] == [b"body-7"]
            assert dead[0].tags == "tag1" and dead[0].keys == ["key-7", "order-3"]
    finally:
        broker.stop()
