"""Native Producer: send (one or a batch), oneway, tags, keys, properties, delay level or delivery time.

Routing as RocketMQ's DefaultMQProducer: the topic's route from the name server, or, for a topic that does not
exist yet, the auto-create key topic's route (the broker then creates the topic); queues are picked round robin
unless the caller names one. Each message gets a client-side unique id (`UNIQ_KEY`), which is its `msg_id`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from mqk.client.base import ClientBase, MessageQueue, TopicRoute
from mqk.client.remoting import ClientError
from mqk.config import parse_hostport
from mqk.errors import MqkError
from mqk.protocol.native.codes import (
    AUTO_CREATE_TOPIC_KEY,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_START_DELIVER_TIME,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
    SYSFLAG_TRANSACTION_PREPARED,
    RequestCode,
    ResponseCode,
)
from mqk.protocol.native.command import RemotingCommand, stringify_fields
from mqk.protocol.native.message import (
    BatchItem,
    MessageExt,
    decode_message_id,
    decode_messages,
    encode_batch_body,
    properties_to_string,
)

log = logging.getLogger("mqk.client")


@dataclass
class Message:
    topic: str
    body: bytes
    tags: str | None = None
    keys: Iterable[str] | str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    delay_level: int = 0
    deliver_at_ms: int | None = None
    flag: int = 0

    def wire_properties(self) -> dict[str, str]:
        props = dict(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        if self.keys:
            props[PROPERTY_KEYS] = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
        if self.delay_level:
            props[PROPERTY_DELAY_TIME_LEVEL] = str(self.delay_level)
        if self.deliver_at_ms is not None:
            props[PROPERTY_START_DELIVER_TIME] = str(self.deliver_at_ms)
        props.setdefault(PROPERTY_WAIT_STORE_MSG_OK, "true")
        props.setdefault(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uuid.uuid4().hex.upper())
        return props


@dataclass(frozen=True)
class SendResult:
    msg_id: str  #: the client-side unique id (UNIQ_KEY); comma-joined for a batch
    offset_msg_id: str  #: the broker's id: store host + commit-log offset
    queue: MessageQueue
    queue_offset: int


class Producer(ClientBase):
    def __init__(
        self,
        namesrv: str | tuple[str, int],
        group: str = "DEFAULT_PRODUCER",
        request_timeout: float = 30.0,
        default_topic_queue_nums: int = 4,
    ) -> None:
        super().__init__(namesrv, group, request_timeout)
        self.default_topic_queue_nums = default_topic_queue_nums
        self._next_queue = itertools.count()

    async def start(self) -> Producer:
        return self

    async def stop(self) -> None:
        await self.close()

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _publish_route(self, topic: str) -> tuple[TopicRoute, bool]:
        try:
            return await self.route(topic), False
        except ClientError as exc:
            if exc.code != ResponseCode.TOPIC_NOT_EXIST:
                raise
        default = await self.route(AUTO_CREATE_TOPIC_KEY, refresh=True)
        queues = [MessageQueue(topic, q.broker_name, q.queue_id) for q in default.queues]
        return TopicRoute(topic, queues, default.broker_addrs), True

    async def _pick(self, topic: str, queue_id: int | None) -> tuple[MessageQueue, tuple[str, int], bool]:
        route, via_default = await self._publish_route(topic)
        if not route.queues:
            raise ClientError(f"no queues to send to for topic {topic}")
        if queue_id is None:
            mq = route.queues[next(self._next_queue) % len(route.queues)]
        else:
            mq = MessageQueue(topic, route.queues[0].broker_name, queue_id)
        return mq, route.broker_addrs[mq.broker_name], via_default

    def _header(
        self, mq: MessageQueue, props: dict[str, str], flag: int, batch: bool, via_default: bool
    ) -> dict[str, object]:
        header: dict[str, object] = {
            "a": self.group,
            "b": mq.topic,
            "c": AUTO_CREATE_TOPIC_KEY,
            "d": self.default_topic_queue_nums,
            "e": mq.queue_id,
            "f": 0,
            "g": int(time.time() * 1000),
            "h": flag,
            "i": properties_to_string(props),
            "j": 0,
            "k": False,
        }
        if batch:
            header["m"] = True
        return header

    async def send(
        self,
        message: Message | str,
        body: bytes | None = None,
        *,
        queue_id: int | None = None,
        oneway: bool = False,
        **fields: Any,
    ) -> SendResult | None:
        """`send(Message(...))`, or `send(topic, body, tags=..., keys=..., delay_level=..., ...)`."""
        msg = message if isinstance(message, Message) else Message(message, body or b"", **fields)
        props = msg.wire_properties()
        mq, addr, via_default = await self._pick(msg.topic, queue_id)
        header = self._header(mq, props, msg.flag, False, via_default)
        if oneway:
            conn = await self._connection(addr)
            await conn.oneway(
                RemotingCommand(
                    code=RequestCode.SEND_MESSAGE_V2,
                    ext_fields=stringify_fields(header),
                    body=msg.body,
                    language="PYTHON",
                )
            )
            return None
        resp = await self.invoke(addr, RequestCode.SEND_MESSAGE_V2, header, msg.body)
        if via_default:
            self._routes.pop(msg.topic, None)
        return self._result(resp, mq, props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX])

    async def send_oneway(self, message: Message | str, body: bytes | None = None, **fields: Any) -> None:
        await self.send(message, body, oneway=True, **fields)

    async def send_batch(self, messages: list[Message], *, queue_id: int | None = None) -> SendResult:
        if not messages:
            raise ValueError("empty batch")
        topic = messages[0].topic
        if any(m.topic != topic for m in messages):
            raise ValueError("all messages of a batch go to one topic")
        if any(m.delay_level or m.deliver_at_ms is not None for m in messages):
            raise ValueError("batch messages cannot be delayed (as in RocketMQ)")
        items = [BatchItem(m.body, m.wire_properties(), m.flag) for m in messages]
        mq, addr, via_default = await self._pick(topic, queue_id)
        header = self._header(mq, {PROPERTY_WAIT_STORE_MSG_OK: "true"}, 0, True, via_default)
        resp = await self.invoke(addr, RequestCode.SEND_BATCH_MESSAGE, header, encode_batch_body(items))
        if via_default:
            self._routes.pop(topic, None)
        ids = ",".join(item.properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] for item in items)
        return self._result(resp, mq, ids)

    @staticmethod
    def _result(resp, mq: MessageQueue, msg_id: str) -> SendResult:
        queue_id = int(resp.ext_fields.get("queueId", mq.queue_id))
        return SendResult(
            msg_id=msg_id,
            offset_msg_id=resp.ext_fields.get("msgId", ""),
            queue=MessageQueue(mq.topic, mq.broker_name, queue_id),
            queue_offset=int(resp.ext_fields.get("queueOffset", -1)),
        )


COMMIT_MESSAGE, ROLLBACK_MESSAGE, UNKNOWN = "COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"
_TRANSACTION_CODES = {COMMIT_MESSAGE: 8, ROLLBACK_MESSAGE: 12, UNKNOWN: 0}

LocalTransaction = Callable[[SendResult], "str | Awaitable[str]"]
CheckListener = Callable[[MessageExt], "str | Awaitable[str]"]


class TransactionProducer(Producer):
    """RocketMQ's TransactionMQProducer: `send_in_transaction` stores a half message, runs the local transaction,
    then commits or rolls back; the broker later asks `check(message)` about half messages left UNKNOW. Both
    callables return COMMIT_MESSAGE, ROLLBACK_MESSAGE or UNKNOW (and may be coroutines). The producer heart-beats
    its group so the broker knows whom to ask."""

    def __init__(
        self,
        namesrv: str | tuple[str, int],
        group: str,
        check: CheckListener,
        heartbeat_interval: float = 5.0,
        request_timeout: float = 30.0,
    ) -> None:
        super().__init__(namesrv, group, request_timeout)
        self.check = check
        self.heartbeat_interval = heartbeat_interval
        self._heartbeat_task: asyncio.Task | None = None
        self._checks: set[asyncio.Task] = set()
        self.on_server_request = self._on_request

    async def start(self) -> TransactionProducer:
        await self._heartbeat()
        self._heartbeat_task = asyncio.create_task(self._heartbeat_loop())
        return self

    async def stop(self) -> None:
        tasks = [t for t in (self._heartbeat_task, *self._checks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await super().stop()

    async def _brokers(self) -> list[tuple[str, int]]:
        resp = await self.invoke(self.namesrv, RequestCode.GET_BROKER_CLUSTER_INFO)
        table = json.loads(resp.body or b"{}").get("brokerAddrTable", {})
        return [parse_hostport(b["brokerAddrs"]["0"]) for b in table.values() if "0" in b.get("brokerAddrs", {})]

    async def _heartbeat(self) -> None:
        body = json.dumps(
            {"clientID": self.client_id, "producerDataSet": [{"groupName": self.group}], "consumerDataSet": []}
        ).encode()
        for broker in await self._brokers():
            await self.invoke(broker, RequestCode.HEART_BEAT, body=body)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            with contextlib.suppress(ClientError):
                await self._heartbeat()

    async def send_in_transaction(
        self, message: Message, local: LocalTransaction, queue_id: int | None = None
    ) -> tuple[SendResult, str]:
        props = message.wire_properties()
        props[PROPERTY_TRANSACTION_PREPARED] = "true"
        props[PROPERTY_PRODUCER_GROUP] = self.group
        mq, addr, via_default = await self._pick(message.topic, queue_id)
        header = self._header(mq, props, message.flag, False, via_default)
        header["f"] = SYSFLAG_TRANSACTION_PREPARED
        resp = await self.invoke(addr, RequestCode.SEND_MESSAGE_V2, header, message.body)
        result = self._result(resp, mq, props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX])
        try:
            state = local(result)
            if inspect.isawaitable(state):
                state = await state
        except Exception:  # noqa: BLE001 - a failed local transaction is left for the broker's check
            state = UNKNOWN
        await self._end(addr, result.queue_offset, result.offset_msg_id, result.msg_id, str(state), False)
        return result, str(state)

    async def _end(
        self, addr: tuple[str, int], half_offset: int, offset_msg_id: str, msg_id: str, state: str, from_check: bool
    ) -> None:
        commit_log_offset = decode_message_id(offset_msg_id)[2] if offset_msg_id else 0
        conn = await self._connection(addr)
        await conn.oneway(
            RemotingCommand(
                code=RequestCode.END_TRANSACTION,
                language="PYTHON",
                ext_fields={
                    "producerGroup": self.group,
                    "tranStateTableOffset": str(half_offset),
                    "commitLogOffset": str(commit_log_offset),
                    "commitOrRollback": str(_TRANSACTION_CODES.get(state, 0)),
                    "fromTransactionCheck": "true" if from_check else "false",
                    "msgId": msg_id,
                    "transactionId": msg_id,
                },
            )
        )

    def _on_request(self, cmd: RemotingCommand) -> None:
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE and cmd.body:
            task = asyncio.create_task(self._answer_check(cmd))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

    async def _answer_check(self, cmd: RemotingCommand) -> None:
        try:
            (msg,) = decode_messages(cmd.body or b"")
            state = self.check(msg)
            if inspect.isawaitable(state):
                state = await state
            addr = msg.store_host
            await self._end(
                addr,
                int(cmd.ext_fields.get("tranStateTableOffset", "-1")),
                cmd.ext_fields.get("offsetMsgId", ""),
                msg.msg_id,
                str(state),
                True,
            )
        except (MqkError, ValueError):
            log.warning("cannot answer a transaction check", exc_info=True)
