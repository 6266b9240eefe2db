"""Native consumers.

`PullConsumer`: the caller drives: queues of a topic, pull at an offset (optionally long-polling), committed
offsets, queue bounds, search by time.

`PopConsumer`: RocketMQ 5's POP consumption: the broker shares a topic's messages out among the group's consumers
(no rebalance on the client), each popped message is held for its invisible time and acknowledged one by one (or
handed back early by changing its invisible time), and one not acknowledged in time comes back, its attempt counted.
A POP group is a share group on mqk: a Kafka ShareConsumer of the same group id takes from the same records.

`PushConsumer`: RocketMQ's clustering push consumer: heart-beats its subscription, balances the topic's queues
(and its group's retry topic) across the group's members with average allocation, re-balancing on the broker's
NOTIFY_CONSUMER_IDS_CHANGED and periodically; one long-polling pull loop per owned queue calls the handler for
each message in order; a handler that raises or returns False has the message sent back (the broker re-delivers
it through `%RETRY%group` later, or dead-letters it after `max_reconsume_times`), and if the send-back fails the
client re-sends the message to the retry topic itself, as RocketMQ clients do. Consumed offsets are committed
every `commit_interval` seconds, when a queue is given up, and at stop. Messages from the retry topic are handed
to the handler with their original topic. `concurrency` > 1 handles each pulled batch's messages concurrently
(RocketMQ's concurrent consumption) at the cost of per-queue order.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from mqk.client.base import ClientBase, MessageQueue
from mqk.client.remoting import ClientError
from mqk.errors import MqkError
from mqk.protocol.native.codes import (
    AUTO_CREATE_TOPIC_KEY,
    DEFAULT_MAX_RECONSUME_TIMES,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    RETRY_GROUP_TOPIC_PREFIX,
    RequestCode,
    ResponseCode,
)
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.message import MessageExt, decode_messages, properties_to_string

log = logging.getLogger("mqk.client")

FOUND, NO_NEW_MSG, NO_MATCHED_MSG, OFFSET_ILLEGAL = "FOUND", "NO_NEW_MSG", "NO_MATCHED_MSG", "OFFSET_ILLEGAL"
_STATUS = {
    ResponseCode.SUCCESS: FOUND,
    ResponseCode.PULL_NOT_FOUND: NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: OFFSET_ILLEGAL,
}


@dataclass
class PullResult:
    status: str
    next_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt]


def allocate_averagely(queues: list[MessageQueue], consumers: list[str], me: str) -> list[MessageQueue]:
    """RocketMQ's AllocateMessageQueueAveragely: contiguous, as-even-as-possible shares in sorted order."""
    queues, consumers = sorted(queues), sorted(consumers)
    if me not in consumers or not queues:
        return []
    index, n, m = consumers.index(me), len(queues), len(consumers)
    mod = n % m
    if n <= m:
        size = 1
    elif mod > 0 and index < mod:
        size = n // m + 1
    else:
        size = n // m
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [queues[(start + i) % n] for i in range(max(0, min(size, n - start)))]


class PullConsumer(ClientBase):
    def __init__(self, namesrv: str | tuple[str, int], group: str, request_timeout: float = 30.0) -> None:
        super().__init__(namesrv, group, request_timeout)

    async def start(self) -> PullConsumer:
        return self

    async def stop(self) -> None:
        await self.close()

    async def __aenter__(self) -> PullConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def queues(self, topic: str) -> list[MessageQueue]:
        return list((await self.route(topic, refresh=True)).queues)

    async def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int = 32,
        expression: str = "*",
        suspend_ms: int = 0,
        commit_offset: int | None = None,
    ) -> PullResult:
        flag = PULL_FLAG_SUBSCRIPTION | (PULL_FLAG_SUSPEND if suspend_ms > 0 else 0)
        if commit_offset is not None:
            flag |= PULL_FLAG_COMMIT_OFFSET
        header = {
            "consumerGroup": self.group,
            "topic": mq.topic,
            "queueId": mq.queue_id,
            "queueOffset": offset,
            "maxMsgNums": max_nums,
            "sysFlag": flag,
            "commitOffset": commit_offset or 0,
            "suspendTimeoutMillis": suspend_ms,
            "subscription": expression,
            "subVersion": 0,
            "expressionType": "TAG",
        }
        resp = await self.invoke(
            await self.broker_of(mq),
            RequestCode.PULL_MESSAGE,
            header,
            timeout=self.request_timeout + suspend_ms / 1000,
            ok=tuple(_STATUS),
        )
        ext = resp.ext_fields
        messages = decode_messages(resp.body) if resp.code == ResponseCode.SUCCESS and resp.body else []
        return PullResult(
            _STATUS[ResponseCode(resp.code)],
            int(ext.get("nextBeginOffset", offset)),
            int(ext.get("minOffset", 0)),
            int(ext.get("maxOffset", 0)),
            messages,
        )

    async def _queue_call(
        self, code: int, mq: MessageQueue, extra: dict | None = None, ok: tuple[int, ...] = (ResponseCode.SUCCESS,)
    ) -> RemotingCommand:
        header = {"topic": mq.topic, "queueId": mq.queue_id, **(extra or {})}
        return await self.invoke(await self.broker_of(mq), code, header, ok=ok)

    async def committed_offset(self, mq: MessageQueue) -> int | None:
        resp = await self._queue_call(
            RequestCode.QUERY_CONSUMER_OFFSET,
            mq,
            {"consumerGroup": self.group},
            ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND),
        )
        return int(resp.ext_fields["offset"]) if resp.code == ResponseCode.SUCCESS else None

    async def commit_offset(self, mq: MessageQueue, offset: int) -> None:
        await self._queue_call(
            RequestCode.UPDATE_CONSUMER_OFFSET, mq, {"consumerGroup": self.group, "commitOffset": offset}
        )

    async def max_offset(self, mq: MessageQueue) -> int:
        return int((await self._queue_call(RequestCode.GET_MAX_OFFSET, mq)).ext_fields["offset"])

    async def min_offset(self, mq: MessageQueue) -> int:
        return int((await self._queue_call(RequestCode.GET_MIN_OFFSET, mq)).ext_fields["offset"])

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        resp = await self._queue_call(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq, {"timestamp": timestamp_ms})
        return int(resp.ext_fields["offset"])

    async def send_back(
        self, msg: MessageExt, delay_level: int = 0, max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES
    ) -> None:
        """CONSUMER_SEND_MSG_BACK, falling back to re-sending the message to the retry topic ourselves."""
        addr: tuple[str, int] | None = None
        try:
            route = await self.route(msg.topic)
            addr = next(iter(route.broker_addrs.values()))
            await self.invoke(
                addr,
                RequestCode.CONSUMER_SEND_MSG_BACK,
                {
                    "offset": msg.commit_log_offset,
                    "group": self.group,
                    "delayLevel": delay_level,
                    "originMsgId": msg.msg_id,
                    "originTopic": msg.properties.get(PROPERTY_RETRY_TOPIC, msg.topic),
                    "unitMode": False,
                    "maxReconsumeTimes": max_reconsume_times,
                },
            )
            return
        except ClientError as exc:
            if addr is None:
                raise
            log.info("send-back of %s failed (%s); re-sending to the retry topic", msg.msg_id, exc)
        props = dict(msg.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, msg.topic)
        props[PROPERTY_RECONSUME_TIME] = str(msg.reconsume_times + 1)
        props[PROPERTY_DELAY_TIME_LEVEL] = str(3 + msg.reconsume_times)
        header = {
            "a": self.group,
            "b": RETRY_GROUP_TOPIC_PREFIX + self.group,
            "c": "TBW102",
            "d": 1,
            "e": 0,
            "f": 0,
            "g": msg.born_timestamp,
            "h": msg.flag,
            "i": properties_to_string(props),
            "j": msg.reconsume_times + 1,
            "k": False,
            "l": max_reconsume_times,
        }
        await self.invoke(addr, RequestCode.SEND_MESSAGE_V2, header, msg.body)


Handler = Callable[[MessageExt], Awaitable[bool | None] | bool | None]


@dataclass(frozen=True)
class PoppedMessage:
    """A message a pop handed out, with the receipt (RocketMQ's `POP_CK` extraInfo) that acknowledges it."""

    message: MessageExt
    receipt: str
    broker: tuple[str, int]

    @property
    def attempt(self) -> int:
        """Its delivery attempt: 1 the first time it is handed out."""
        return self.message.reconsume_times + 1


class PopConsumer(ClientBase):
    """RocketMQ 5's POP consumer over remoting (POP_MESSAGE, ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME)."""

    def __init__(self, namesrv: str | tuple[str, int], group: str, request_timeout: float = 30.0) -> None:
        super().__init__(namesrv, group, request_timeout)
        self._next_broker = 0

    async def __aenter__(self) -> PopConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def pop(
        self,
        topic: str,
        max_messages: int = 32,
        invisible_ms: int = 60_000,
        poll_ms: int = 0,
        expression: str = "*",
        order: bool = False,
    ) -> list[PoppedMessage]:
        """Up to `max_messages` (at most 32) messages of the topic's queues on one of its brokers (the brokers taken
        in turn), each held for `invisible_ms`; with nothing to give, the broker waits up to `poll_ms` for some.
        `order`: RocketMQ's orderly pop (a queue's next messages only once its held ones are settled)."""
        route = await self.route(topic)
        if not route.broker_addrs:
            route = await self.route(topic, refresh=True)
        names = sorted(route.broker_addrs)
        if not names:
            raise ClientError(f"topic {topic} has no broker")
        name = names[self._next_broker % len(names)]
        self._next_broker += 1
        broker = route.broker_addrs[name]
        header = {
            "consumerGroup": self.group,
            "topic": topic,
            "queueId": -1,
            "maxMsgNums": max_messages,
            "invisibleTime": invisible_ms,
            "pollTime": poll_ms,
            "bornTime": _now_ms(),
            "initMode": 0,
            "expType": "TAG",
            "exp": expression,
            "order": order,
        }
        resp = await self.invoke(
            broker,
            RequestCode.POP_MESSAGE,
            header,
            timeout=self.request_timeout + poll_ms / 1000,
            ok=(ResponseCode.SUCCESS, ResponseCode.POLLING_TIMEOUT, ResponseCode.NO_MESSAGE),
        )
        if resp.code != ResponseCode.SUCCESS or not resp.body:
            return []
        ext = resp.ext_fields
        starts = _offset_info(ext.get("startOffsetInfo", ""))
        head = f"{ext.get('popTime')} {ext.get('invisibleTime')} {ext.get('reviveQid')}"
        out = []
        for message in decode_messages(resp.body):
            start = starts.get(message.queue_id, message.queue_offset)
            # ExtraInfoUtil's receipt: ck start offset, popTime, invisibleTime, reviveQid, retry flag, broker name,
            # queue, offset
            receipt = f"{start} {head} 0 {name} {message.queue_id} {message.queue_offset}"
            out.append(PoppedMessage(message, receipt, broker))
        return out

    def _settle_header(self, popped: PoppedMessage) -> dict[str, object]:
        m = popped.message
        return {
            "consumerGroup": self.group,
            "topic": m.topic,
            "queueId": m.queue_id,
            "extraInfo": popped.receipt,
            "offset": m.queue_offset,
        }

    async def ack(self, popped: PoppedMessage) -> None:
        """Acknowledge a popped message: it is done for the group (a receipt whose hold ran out settles nothing:
        the message comes back regardless, as with RocketMQ)."""
        await self.invoke(popped.broker, RequestCode.ACK_MESSAGE, self._settle_header(popped))

    async def change_invisible_time(self, popped: PoppedMessage, invisible_ms: int) -> PoppedMessage:
        """Hold the message `invisible_ms` from now instead (0: hand it back now); the new receipt, since the old
        one no longer settles it. ClientError (NO_MESSAGE) when the receipt no longer holds it."""
        header = {**self._settle_header(popped), "invisibleTime": invisible_ms}
        resp = await self.invoke(popped.broker, RequestCode.CHANGE_MESSAGE_INVISIBLETIME, header)
        ext = resp.ext_fields
        fields = popped.receipt.split(" ")
        fields[1:4] = [str(ext.get("popTime")), str(ext.get("invisibleTime")), str(ext.get("reviveQid"))]
        return PoppedMessage(popped.message, " ".join(fields), popped.broker)


def _offset_info(info: str) -> dict[int, int]:
    """startOffsetInfo (`RETRY QUEUE OFFSET;...`) -> {queue: first offset} (normal-topic entries only)."""
    out: dict[int, int] = {}
    for part in info.split(";"):
        fields = part.split(" ")
        if len(fields) == 3 and fields[0] == "0" and fields[1].isdigit() and fields[2].lstrip("-").isdigit():
            out[int(fields[1])] = int(fields[2])
    return out


def _now_ms() -> int:
    return int(time.time() * 1000)


class PushConsumer(PullConsumer):
    def __init__(
        self,
        namesrv: str | tuple[str, int],
        group: str,
        topic: str,
        handler: Handler,
        expression: str = "*",
        *,
        max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
        pull_batch_size: int = 32,
        suspend_ms: int = 5000,
        rebalance_interval: float = 5.0,
        commit_interval: float = 1.0,
        consume_from_last: bool = False,
        concurrency: int = 1,
    ) -> None:
        super().__init__(namesrv, group)
        self.topic = topic
        self.handler = handler
        #: messages of one pulled batch handled at once; 1 keeps each queue's order. The consumed offset moves
        #: past a batch only when all of it is handled, so a crash re-delivers rather than loses.
        self.concurrency = max(1, concurrency)
        self.expression = expression
        self.max_reconsume_times = max_reconsume_times
        self.pull_batch_size = pull_batch_size
        self.suspend_ms = suspend_ms
        self.rebalance_interval = rebalance_interval
        self.commit_interval = commit_interval
        self.consume_from_last = consume_from_last
        self.retry_topic = RETRY_GROUP_TOPIC_PREFIX + group
        self._owned: dict[MessageQueue, asyncio.Task] = {}
        self._consumed: dict[MessageQueue, int] = {}
        self._committed: dict[MessageQueue, int] = {}
        self._rebalance_now = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._running = False
        self.on_server_request = self._server_notification

    @property
    def assigned(self) -> list[MessageQueue]:
        return sorted(self._owned)

    def _server_notification(self, cmd: RemotingCommand) -> None:
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            self._rebalance_now.set()

    async def start(self) -> PushConsumer:
        self._running = True
        await self._heartbeat()
        await self.rebalance()
        self._tasks = [asyncio.create_task(self._background())]
        return self

    async def stop(self) -> None:
        self._running = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for mq in list(self._owned):
            await self._release(mq)
        try:
            broker = await self._broker()
            await self.invoke(
                broker,
                RequestCode.UNREGISTER_CLIENT,
                {"clientID": self.client_id, "consumerGroup": self.group},
                timeout=5,
            )
        except ClientError:
            pass
        await self.close()

    async def _broker(self) -> tuple[str, int]:
        """The broker to heart-beat and ask for the member list: the topic's, or, while the topic does not exist
        yet, the auto-create key topic's (the consumer then waits for the topic at each rebalance)."""
        try:
            route = await self.route(self.topic)
        except ClientError as exc:
            if exc.code != ResponseCode.TOPIC_NOT_EXIST:
                raise
            route = await self.route(AUTO_CREATE_TOPIC_KEY)
        if not route.broker_addrs:
            raise ClientError(f"no broker serves topic {self.topic}")
        return next(iter(route.broker_addrs.values()))

    async def _heartbeat(self) -> None:
        subs = [
            {
                "topic": t,
                "subString": e,
                "tagsSet": [],
                "codeSet": [],
                "subVersion": 0,
                "classFilterMode": False,
                "expressionType": "TAG",
            }
            for t, e in ((self.topic, self.expression), (self.retry_topic, "*"))
        ]
        data = {
            "clientID": self.client_id,
            "producerDataSet": [],
            "consumerDataSet": [
                {
                    "groupName": self.group,
                    "consumeType": "CONSUME_PASSIVELY",
                    "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET"
                    if self.consume_from_last
                    else "CONSUME_FROM_FIRST_OFFSET",
                    "subscriptionDataSet": subs,
                    "unitMode": False,
                }
            ],
        }
        await self.invoke(await self._broker(), RequestCode.HEART_BEAT, body=json.dumps(data).encode())

    async def _background(self) -> None:
        last_heartbeat = asyncio.get_running_loop().time()
        while self._running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rebalance_now.wait(), self.commit_interval)
            try:
                now = asyncio.get_running_loop().time()
                if now - last_heartbeat >= self.rebalance_interval:
                    last_heartbeat = now
                    await self._heartbeat()
                    self._rebalance_now.set()
                if self._rebalance_now.is_set():
                    self._rebalance_now.clear()
                    await self.rebalance()
                await self.commit_consumed()
            except (MqkError, ValueError, KeyError, OSError) as exc:  # keep consuming; the next round retries
                log.warning("push consumer %s: %s", self.group, exc)
                await asyncio.sleep(self.commit_interval)

    async def rebalance(self) -> None:
        broker = await self._broker()
        resp = await self.invoke(
            broker,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP,
            {"consumerGroup": self.group},
            ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR),
        )
        consumers = json.loads(resp.body or b"{}").get("consumerIdList", []) if resp.code == 0 else []
        wanted: set[MessageQueue] = set()
        for topic in (self.topic, self.retry_topic):
            try:
                queues = (await self.route(topic, refresh=True)).queues
            except ClientError:
                continue
            wanted.update(allocate_averagely(queues, consumers, self.client_id))
        for mq in [mq for mq in self._owned if mq not in wanted]:
            await self._release(mq)
        for mq in sorted(wanted - set(self._owned)):
            self._owned[mq] = asyncio.create_task(self._pull_loop(mq))

    async def _release(self, mq: MessageQueue) -> None:
        task = self._owned.pop(mq, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._commit(mq)
        self._consumed.pop(mq, None)

    async def _commit(self, mq: MessageQueue) -> None:
        offset = self._consumed.get(mq)
        if offset is not None and self._committed.get(mq) != offset:
            try:
                await self.commit_offset(mq, offset)
                self._committed[mq] = offset
            except ClientError as exc:
                log.warning("commit of %s failed: %s", mq, exc)

    async def commit_consumed(self) -> None:
        for mq in list(self._consumed):
            await self._commit(mq)

    async def _start_offset(self, mq: MessageQueue) -> int:
        committed = await self.committed_offset(mq)
        if committed is not None:
            return committed
        return await self.max_offset(mq) if self.consume_from_last else await self.min_offset(mq)

    async def _pull_loop(self, mq: MessageQueue) -> None:
        expression = self.expression if mq.topic == self.topic else "*"
        offset = -1
        while self._running:
            try:
                if offset < 0:
                    offset = await self._start_offset(mq)
                    self._consumed[mq] = offset
                result = await self.pull(mq, offset, self.pull_batch_size, expression, self.suspend_ms)
            except (MqkError, ValueError, KeyError, OSError) as exc:  # incl. a malformed answer: retry, don't die
                log.warning("pull from %s failed: %s", mq, exc)
                await asyncio.sleep(1)
                continue
            if self.concurrency == 1:
                for msg in result.messages:
                    await self._consume(msg)
                    self._consumed[mq] = msg.queue_offset + 1
            elif result.messages:
                gate = asyncio.Semaphore(self.concurrency)
                await asyncio.gather(*(self._consume_gated(m, gate) for m in result.messages))
                self._consumed[mq] = result.messages[-1].queue_offset + 1
            if result.status == OFFSET_ILLEGAL:
                self._consumed[mq] = result.next_offset
                await self._commit(mq)
            elif result.status != FOUND:
                self._consumed[mq] = max(self._consumed.get(mq, 0), result.next_offset)
            offset = result.next_offset

    async def _consume_gated(self, msg: MessageExt, gate: asyncio.Semaphore) -> None:
        async with gate:
            await self._consume(msg)

    async def _consume(self, msg: MessageExt) -> None:
        retry_of = msg.properties.get(PROPERTY_RETRY_TOPIC)
        delivered = msg
        if msg.topic == self.retry_topic and retry_of:
            delivered = MessageExt(**{**msg.__dict__, "topic": retry_of})
        try:
            outcome = self.handler(delivered)
            if inspect.isawaitable(outcome):
                outcome = await outcome
            ok = outcome is not False
        except asyncio.CancelledError:
            raise
        except Exception:  # a failing handler means "retry later", as in RocketMQ
            log.info("handler failed on %s; sending it back for retry", msg.msg_id, exc_info=True)
            ok = False
        if not ok:
            while self._running:
                try:
                    await self.send_back(msg, 0, self.max_reconsume_times)
                    return
                except ClientError as exc:
                    log.warning("cannot send %s back: %s", msg.msg_id, exc)
                    await asyncio.sleep(1)
