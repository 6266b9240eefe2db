"""RocketMQ POP consumption on the share-state engine: what both RocketMQ 5 front doors (the remoting protocol's
POP_MESSAGE family here, the gRPC MessagingService in mqk.server.rocketmq5) do to a consumer group's messages.

A RocketMQ consumer group consuming by POP is a share group (mqk.groups.share): a pop acquires records of the
topic's queues for the group with a lock of the request's invisible time, an ack accepts one, a change of the
invisible time moves its lock's end, and a lock that runs out makes the message visible again with its delivery
attempt counted; at the group's delivery limit the message goes to `%DLQ%group` instead. A Kafka share group of the
same name shares the same records.

`PopConsumption` owns that part, whatever the protocol: acquiring (round robin over the queues so none starves, a
tag filter applied to the records: a record the group's filter refuses is done for the group), settling one held
message, the dead letters, the long-poll wait and the periodic expiry of locks nobody renews.

`PopProcessor` is the remoting front door (RocketMQ 5 brokers' PopMessageProcessor, AckMessageProcessor,
ChangeInvisibleTimeProcessor, NotificationProcessor, PollingInfoProcessor), as RocketMQ's Java client calls it:

- POP_MESSAGE: up to maxMsgNums (at most 32) messages of one queue, or of every queue (queueId -1), each with its
  attempt count as reconsumeTimes; the answer's popTime, invisibleTime, reviveQid and startOffsetInfo /
  msgOffsetInfo (`0 QUEUE OFFSET`, `;`-separated) are what the client builds each message's receipt (its
  `POP_CK` extraInfo) from. Nothing to give: the pop waits up to pollTime for new messages (or for a held one whose
  lock ends), then answers POLLING_TIMEOUT. A new group starts at a queue's first message while the queue still
  holds every message it ever had, else at its end (initMode is RocketMQ's default; the broker decides).
- ACK_MESSAGE and BATCH_ACK_MESSAGE: accept the messages a receipt names. A receipt is the pop that delivered the
  message (its popTime): an ack from a pop whose lock ran out, the message since delivered again, does not settle
  the new delivery, and is answered SUCCESS as RocketMQ answers it (the message comes back regardless).
- CHANGE_MESSAGE_INVISIBLETIME: the lock ends `invisibleTime` ms from now; the answer's popTime is the new receipt's
  (the old one no longer settles the message). A receipt that no longer holds the message: NO_MESSAGE.
- NOTIFICATION: whether the group has a message to pop now, waiting up to pollTime for one. POLLING_INFO: how
  many pops of the group wait on the queue.

Ordered pops (`order=true`, as RocketMQ's orderly POP consumers send, or any pop of a group whose subscription
config says `consumeMessageOrderly`: mqk.server.native.subscriptions) take nothing from a queue while a message of
it is held, so a queue's messages (one message group's among them) go out one batch at a time, in order; their
answers carry reviveQid 999 and orderCountInfo (each message's earlier deliveries), as RocketMQ's do. Where
RocketMQ keeps a retry topic per group (`%RETRY%group_topic`), mqk delivers the same record again: a
redelivered message keeps its topic, queue and offset.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from mqk.broker.internal import dlq_topic
from mqk.broker.names import ROCKETMQ
from mqk.errors import MqkError
from mqk.groups.share import ACCEPT, RENEW, ShareGroups
from mqk.protocol.native.codes import PROPERTY_TAGS, RequestCode, ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.message import MessageExt, encode_message_ext
from mqk.server.native.clients import parse_subscription
from mqk.server.native.context import BrokerContext
from mqk.server.native.remoting import Connection
from mqk.server.native.send import SendProcessor
from mqk.server.native.subscriptions import paused
from mqk.services import BackgroundTask

log = logging.getLogger("mqk.native")

#: RocketMQ's POP bounds: at most 32 messages a pop; an invisible time up to 12 hours
MAX_POP_MESSAGES = 32
MAX_INVISIBLE_MS = 12 * 3600 * 1000
#: the longest a pop or a notification is held (RocketMQ's popPollingTimeout bounds it likewise)
MAX_POLL_MS = 30_000
#: how often locks nobody renews are expired and dead letters forwarded with no consumer asking
EXPIRY_PERIOD_S = 5.0
#: `reviveQid` in answers: RocketMQ's revive queue of the checkpoint (mqk has none; 0 is a normal pop's, 999 an
#: ordered one's: KeyBuilder.POP_ORDER_REVIVE_QUEUE)
REVIVE_QID, ORDERED_REVIVE_QID = 0, 999
#: the topic mark of a receipt (`0`: the message's own topic; RocketMQ's 1 and 2 name its retry topics)
NORMAL_TOPIC = "0"
#: the largest bit set a batch ack may carry (65,536 offsets past its start; a pop hands out at most 32 a queue)
MAX_BIT_SET_BYTES = 8192
#: a pop's owner token in the share-state engine: each pop's records are held under its own popTime
POP_OWNER = "rmq-pop:"


@dataclass(frozen=True, slots=True)
class PopRequest:
    """What a pop asks for: up to `budget` messages of the client's `queues` of `topic` for `group`, held by
    `member` for `lock_ms`, those of the tag filter `tags` (None: all); `ordered`: see
    ShareGroups.acquire_from_log (a group whose config says so is ordered anyway)."""

    group: str
    topic: str
    queues: Sequence[int]
    member: str
    budget: int
    lock_ms: int
    tags: frozenset[str] | None
    ordered: bool = False


@dataclass(frozen=True, slots=True)
class Popped:
    """One message a pop acquired: the client's queue id, the message, its delivery attempt (1 = first)."""

    queue: int
    message: MessageExt
    delivery_count: int


class PopConsumption:
    """POP on the share-state engine, for both RocketMQ 5 front doors (see the module docstring)."""

    def __init__(self, ctx: BrokerContext, send: SendProcessor, share: ShareGroups) -> None:
        self.ctx = ctx
        self.send = send
        self.share = share
        self._round_robin = itertools.count()
        self._expirer = BackgroundTask("mqk-pop-expiry")
        #: (group, topic, client queue or -1) -> pops and notifications waiting there now (POLLING_INFO)
        self.waiting: dict[tuple[str, str, int], int] = {}
        #: topic ids as UUIDs by their stored bytes (asked per pop and per ack)
        self._topic_ids: dict[bytes, uuid.UUID] = {}

    def start(self) -> None:
        self._expirer.start(self._expire_loop)

    async def stop(self) -> None:
        await self._expirer.stop()

    def topic_id(self, topic: str) -> uuid.UUID | None:
        info = self.ctx.store.topic(topic)
        if info is None:
            return None
        raw = bytes(info.topic_id)
        found = self._topic_ids.get(raw)
        if found is None:
            if len(self._topic_ids) > 10_000:  # (topics come and go: a bound, not an eviction policy)
                self._topic_ids.clear()
            found = self._topic_ids[raw] = uuid.UUID(bytes=raw)
        return found

    async def prepare(self, group: str) -> None:
        """Before a group's first POP call: its saved record states are read, its dead letters kept."""
        await self.share.ensure_loaded(self.ctx.store)
        self.share.keep_dead_letters(group)

    async def _acquire(self, request: PopRequest) -> tuple[list[Popped], bool]:
        """Acquire up to the request's budget of messages of its queues for its group, starting at a queue that
        moves round robin: the messages, and whether any record state changed (to save)."""
        group, topic, queues, member = request.group, request.topic, request.queues, request.member
        budget, lock_ms, tags = request.budget, request.lock_ms, request.tags
        topic_id = self.topic_id(topic)
        if topic_id is None or not queues:
            return [], False
        out: list[Popped] = []
        changed = False
        first = next(self._round_robin)
        for i in range(len(queues)):
            queue = queues[(first + i) % len(queues)]
            partition = self.ctx.to_partition(topic, queue)
            decoded: dict[int, list[MessageExt]] = {}

            def wanted(batch: Any, queue: int = queue, decoded: dict[int, list[MessageExt]] = decoded) -> bool:
                assert tags is not None
                messages = decoded[batch.base_offset] = self.ctx.to_messages(topic, queue, batch)
                return any(m.properties.get(PROPERTY_TAGS) in tags for m in messages)

            before = self._progress(group)
            chosen = await self.share.acquire_from_log(
                self.ctx.store,
                group,
                member,
                topic_id,
                partition,
                topic,
                budget - len(out),
                lock_ms=lock_ms,
                wanted=wanted if tags is not None else None,  # (no filter: only what is taken is decoded)
                reset=self._reset(topic, partition),
                ordered=request.ordered,
            )
            changed = changed or bool(chosen) or self._progress(group) != before
            nbytes = 0
            taken = 0
            for batch, got in chosen:
                for msg in decoded.get(batch.base_offset) or self.ctx.to_messages(topic, queue, batch):
                    delivery_count = next((c for lo, hi, c in got if lo <= msg.queue_offset <= hi), None)
                    if delivery_count is not None:
                        out.append(Popped(queue, msg, delivery_count))
                        nbytes += len(msg.body)
                        taken += 1
            if chosen:
                self.ctx.count_out(topic, partition, taken, nbytes, group)
            if len(out) >= budget:
                break
        return out, changed

    async def pop(self, request: PopRequest, wait_s: float = 0.0) -> list[Popped]:
        """Acquire what the request asks for, and while there is nothing, wait (up to `wait_s` in all) for new
        messages on its queues or for a held one whose lock ends, then try again; the group's dead letters are
        forwarded and its state saved on the way."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait_s
        while True:
            popped, changed = await self._acquire(request)
            changed = await self.forward_dead_letters(request.group) or changed
            if changed:
                await self.share.save([request.group])
            if popped or loop.time() >= until:
                return popped
            await self.wait(request.group, request.topic, request.queues, until - loop.time())

    async def wait(self, group: str, topic: str, queues: Sequence[int], seconds: float) -> None:
        """Wait up to `seconds` for new messages on these queues, or for a held one whose lock ends; counted in
        `waiting` meanwhile (POLLING_INFO)."""
        partitions = [self.ctx.to_partition(topic, q) for q in queues]
        topic_id = self.topic_id(topic)
        keys = [] if topic_id is None else [(topic_id, p) for p in partitions]
        key = (group, topic, queues[0] if len(queues) == 1 else -1)
        self.waiting[key] = self.waiting.get(key, 0) + 1
        try:
            await self.ctx.hub.wait([(topic, p) for p in partitions], self.share.wait_for(group, keys, seconds))
        finally:
            left = self.waiting[key] - 1
            if left:
                self.waiting[key] = left
            else:
                del self.waiting[key]

    def _reset(self, topic: str, partition: int) -> str:
        """Where a new consumer group starts on a queue: at its first message while the queue still holds every
        message it ever had (RocketMQ's initPopOffsetByCheckMsgInMem: a group made after its topic's first sends
        still gets them), else at its end (RocketMQ's ConsumeInitMode.MAX)."""
        start, _end = self.ctx.store.offset_bounds(topic, partition)
        return "earliest" if start == 0 else "latest"

    def _progress(self, group: str) -> tuple[int, ...]:
        """Where the group's partitions stand (to tell whether an acquisition archived anything to save)."""
        found = self.share.groups.get(group)
        if found is None:
            return ()
        return tuple(p.spso for p in found.partitions.values()) + tuple(
            p.next_offset for p in found.partitions.values()
        )

    def settle(
        self,
        group: str,
        topic: str,
        queue: int,
        offset: int,
        member: str,
        delivery_count: int | None,
        kind: int,
        lock_ms: int = 0,
        new_member: str | None = None,
    ) -> str | None:
        """Apply ACCEPT, REJECT or RENEW (a lock `lock_ms` from now, held by `new_member` from then on when given)
        to the message `member` holds at `offset` of the client's queue `queue` (from its `delivery_count`-th
        delivery, when given); None when done, else why not."""
        topic_id = self.topic_id(topic)
        found = self.share.groups.get(group)
        if topic_id is None or found is None or not 0 <= queue < self.ctx.queue_count(topic):
            return f"no message of group {group} on topic {topic} is held"
        part = found.partitions.get((topic_id, self.ctx.to_partition(topic, queue)))
        if part is None or not part.holds(offset, member, delivery_count):
            return "the message was settled, or delivered again after its lock ran out"
        code = part.acknowledge(member, offset, offset, [kind], self.share.now() + lock_ms, self.share.limit(group))
        if code:
            return "the message is not held"
        if kind == RENEW and new_member is not None:
            part.hand_over(offset, member, new_member)
        return None

    def takeable(self, group: str, topic: str, queue: int) -> int:
        """How many messages of the client's queue `queue` a pop of the group could take now (ignoring its tag
        filter, as RocketMQ's counts do): for a group that has not read the queue yet, by where it would start."""
        partition = self.ctx.to_partition(topic, queue)
        start, end = self.ctx.store.offset_bounds(topic, partition)
        topic_id = self.topic_id(topic)
        found = self.share.groups.get(group)
        part = None if found is None or topic_id is None else found.partitions.get((topic_id, partition))
        if part is None:
            return end - start if self._reset(topic, partition) == "earliest" else 0
        return part.takeable(end, self.share.now())

    # --- dead letters and expiry ---------------------------------------------------------------------------------

    async def message_at(self, topic: str, partition: int, offset: int) -> MessageExt | None:
        found = await self.ctx.read_messages(topic, partition, offset, 1)
        return next((m for m in found if m.queue_offset == offset), None)

    async def write_dead_letter(self, group: str, topic: str, message: MessageExt, attempts: int) -> None:
        """Copy a message into the group's dead-letter topic `%DLQ%group` (made on first use, one queue), with
        where it came from in RocketMQ's properties."""
        dead = dlq_topic(group)
        await self.ctx.ensure_topic(dead, 1)
        props = {**message.properties, "ORIGIN_MESSAGE_ID": message.msg_id, "RETRY_TOPIC": topic}
        stored = [(message.body, props, message.flag)]
        await self.send.append(dead, 0, stored, message.born_timestamp, attempts, message.born_host)

    async def forward_dead_letters(self, group: str) -> bool:
        """Move the messages the group archived at its delivery limit to its dead-letter topic (before their
        archived state is saved, so a crash in between delivers them once more rather than losing them); whether
        there were any."""
        dead = self.share.take_dead_letters(group)
        if not dead:
            return False
        names = {uuid.UUID(bytes=bytes(info.topic_id)): name for name, info in self.ctx.topics.all().items()}
        for (topic_id, partition), offsets in dead.items():
            topic = names.get(topic_id)
            if topic is None:  # (deleted meanwhile)
                continue
            for offset in offsets:
                message = await self.message_at(topic, partition, offset)
                if message is None:  # (retention removed it meanwhile)
                    continue
                try:
                    await self.write_dead_letter(group, topic, message, self.share.limit(group))
                except MqkError as exc:
                    log.warning(
                        "pop: dead letter of group %s at %s-%d:%d not written: %s", group, topic, partition, offset, exc
                    )
        return True

    async def expire(self) -> None:
        """Locks that ran out with nobody popping: their messages are visible again, their dead letters due now
        (not at the group's next pop)."""
        changed = self.share.expire()
        for group in list(self.share.dead_letter_groups):
            if await self.forward_dead_letters(group):
                changed.add(group)
        if changed:
            await self.share.save(changed)

    async def _expire_loop(self) -> None:
        while True:
            await self.ctx.clock.sleep(EXPIRY_PERIOD_S)
            try:
                await self.expire()
            except MqkError as exc:  # (a store that refuses now may take the next round)
                log.warning("pop: expiring locks failed: %s", exc)


# --- the remoting front door ---------------------------------------------------------------------------------------


class PopProcessor:
    """POP_MESSAGE, ACK_MESSAGE, BATCH_ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME, NOTIFICATION and POLLING_INFO
    (see the module docstring)."""

    def __init__(self, pop: PopConsumption) -> None:
        self.pop = pop
        self.ctx = pop.ctx
        self._last_pop_time = 0

    def handlers(self) -> dict[int, Callable[[Connection, RemotingCommand], Any]]:
        return {
            RequestCode.POP_MESSAGE: self.pop_message,
            RequestCode.ACK_MESSAGE: self.ack_message,
            RequestCode.BATCH_ACK_MESSAGE: self.batch_ack_message,
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME: self.change_invisible_time,
            RequestCode.NOTIFICATION: self.notification,
            RequestCode.POLLING_INFO: self.polling_info,
        }

    def _pop_time(self) -> int:
        """Now in ms, and never the same twice: a pop's popTime names its deliveries (the owner of what it took)."""
        self._last_pop_time = max(self.ctx.now_ms(), self._last_pop_time + 1)
        return self._last_pop_time

    def _target(self, cmd: RemotingCommand, *, all_queues: bool) -> tuple[str, str, list[int]] | RemotingCommand:
        """(group, topic, the client queue ids asked about) of a request, or the refusal to answer it with."""
        group = cmd.get_str("consumerGroup", required=True) or ""
        topic = cmd.get_str("topic", required=True) or ""
        queue = cmd.get_int("queueId", required=True)
        assert queue is not None
        if not ROCKETMQ.allows(group):
            return cmd.response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"consumer group [{group[:300]}] is not valid"
            )
        count = self.ctx.queue_count(topic)
        if count == 0:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if queue == -1 and all_queues:
            return group, topic, list(range(count))
        if not 0 <= queue < count:
            why = f"queueId[{queue}] is illegal, topic:[{topic}] topicConfig.readQueueNums:[{count}]"
            return cmd.response(ResponseCode.INVALID_PARAMETER if all_queues else ResponseCode.MESSAGE_ILLEGAL, why)
        return group, topic, [queue]

    async def pop_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        target = self._target(cmd, all_queues=True)
        if isinstance(target, RemotingCommand):
            return target
        group, topic, queues = target
        budget = cmd.get_int("maxMsgNums", required=True) or 0
        lock_ms = cmd.get_int("invisibleTime", required=True) or 0
        poll_ms = min(max(0, cmd.get_int("pollTime", 0) or 0), MAX_POLL_MS)
        if not 1 <= budget <= MAX_POP_MESSAGES:
            return cmd.response(
                ResponseCode.INVALID_PARAMETER, f"maxMsgNums {budget} is outside [1, {MAX_POP_MESSAGES}]"
            )
        if not 0 < lock_ms <= MAX_INVISIBLE_MS:
            return cmd.response(
                ResponseCode.INVALID_PARAMETER, f"invisibleTime {lock_ms} is outside (0, {MAX_INVISIBLE_MS}]"
            )
        expression_type = (cmd.get_str("expType") or "TAG").upper()
        if expression_type != "TAG":
            return cmd.response(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"expression type {expression_type} is not supported; use TAG"
            )
        tags = parse_subscription(cmd.get_str("exp"))
        await self.pop.prepare(group)
        why = paused(self.pop.share, group)
        if why is not None:
            return cmd.response(ResponseCode.NO_PERMISSION, why)
        ordered = cmd.get_bool("order") or self.pop.share.orderly(group)
        # (one popTime for the whole long poll: it names this pop's deliveries, as the owner of what it takes)
        pop_time = self._pop_time()
        request = PopRequest(group, topic, queues, POP_OWNER + str(pop_time), budget, lock_ms, tags, ordered)
        popped = await self.pop.pop(request, poll_ms / 1000)
        ext: dict[str, Any] = {
            "popTime": pop_time,
            "invisibleTime": lock_ms,
            "reviveQid": ORDERED_REVIVE_QID if ordered else REVIVE_QID,
            "restNum": self._rest(group, topic, queues),
        }
        if not popped:
            return cmd.response(ResponseCode.POLLING_TIMEOUT, "NO_MESSAGE_IN_QUEUE", ext)
        by_queue: dict[int, list[Popped]] = {}
        for item in popped:
            by_queue.setdefault(item.queue, []).append(item)
        starts: list[str] = []
        offsets: list[str] = []
        messages: list[MessageExt] = []
        for queue, items in sorted(by_queue.items()):
            items.sort(key=lambda p: p.message.queue_offset)
            starts.append(f"{NORMAL_TOPIC} {queue} {items[0].message.queue_offset}")
            offsets.append(f"{NORMAL_TOPIC} {queue} " + ",".join(str(p.message.queue_offset) for p in items))
            for p in items:  # (each pop decodes its own messages: they are this answer's to change)
                p.message.queue_id, p.message.reconsume_times = queue, p.delivery_count - 1
                messages.append(p.message)
        ext["startOffsetInfo"] = ";".join(starts)
        ext["msgOffsetInfo"] = ";".join(offsets)
        if ordered:  # each message's earlier deliveries, keyed by queue and offset (ExtraInfoUtil's `qo` keys)
            ext["orderCountInfo"] = ";".join(
                f"{NORMAL_TOPIC} qo{m.queue_id}%{m.queue_offset} {m.reconsume_times}" for m in messages
            )
        return cmd.response(ResponseCode.SUCCESS, "FOUND", ext, b"".join(encode_message_ext(m) for m in messages))

    def _held(self, cmd: RemotingCommand) -> tuple[str, str, int, int, str] | RemotingCommand:
        """(group, topic, queue, offset, the owner its receipt names) of an ack or a change of invisible time, or
        the refusal to answer it with."""
        target = self._target(cmd, all_queues=False)
        if isinstance(target, RemotingCommand):
            return target
        group, topic, (queue,) = target
        offset = cmd.get_int("offset", required=True)
        assert offset is not None
        receipt = _receipt(cmd.get_str("extraInfo", required=True) or "")
        if receipt is None:
            return cmd.response(ResponseCode.MESSAGE_ILLEGAL, "extraInfo is not a receipt of a pop")
        return group, topic, queue, offset, POP_OWNER + str(receipt[1])

    async def ack_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        held = self._held(cmd)
        if isinstance(held, RemotingCommand):
            return held
        group, topic, queue, offset, owner = held
        await self.pop.prepare(group)
        why = self.pop.settle(group, topic, queue, offset, owner, None, ACCEPT)
        if why is None:
            await self.pop.share.save([group])
        else:
            log.debug("pop: ack of %s-%d:%d by %s of group %s left alone: %s", topic, queue, offset, owner, group, why)
        return cmd.response(ResponseCode.SUCCESS)

    async def batch_ack_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        acks = _batch_acks(cmd.body)
        if acks is None:
            return cmd.response(ResponseCode.MESSAGE_ILLEGAL, "the body is not a BatchAckMessageRequestBody")
        if not acks:
            return cmd.response(ResponseCode.NO_MESSAGE, "no ack in the body")
        changed = set()
        for ack in acks:
            if ack.retry != NORMAL_TOPIC or not 0 <= ack.queue < self.ctx.queue_count(ack.topic):
                continue  # (RocketMQ skips an ack of a queue it does not have)
            await self.pop.prepare(ack.group)
            for offset in ack.offsets:
                owner = POP_OWNER + str(ack.pop_time)
                if self.pop.settle(ack.group, ack.topic, ack.queue, offset, owner, None, ACCEPT) is None:
                    changed.add(ack.group)
        if changed:
            await self.pop.share.save(changed)
        return cmd.response(ResponseCode.SUCCESS)

    async def change_invisible_time(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        held = self._held(cmd)
        if isinstance(held, RemotingCommand):
            return held
        group, topic, queue, offset, owner = held
        lock_ms = cmd.get_int("invisibleTime", required=True)
        assert lock_ms is not None
        if not 0 <= lock_ms <= MAX_INVISIBLE_MS:
            return cmd.response(
                ResponseCode.INVALID_PARAMETER, f"invisibleTime {lock_ms} is outside [0, {MAX_INVISIBLE_MS}]"
            )
        await self.pop.prepare(group)
        pop_time = self._pop_time()
        new_owner = POP_OWNER + str(pop_time)
        why = self.pop.settle(group, topic, queue, offset, owner, None, RENEW, lock_ms, new_owner)
        if why is not None:
            return cmd.response(ResponseCode.NO_MESSAGE, why)
        await self.pop.share.save([group])
        ext = {"popTime": pop_time, "invisibleTime": lock_ms, "reviveQid": _revive_qid(cmd)}
        return cmd.response(ResponseCode.SUCCESS, None, ext)

    async def notification(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        target = self._target(cmd, all_queues=True)
        if isinstance(target, RemotingCommand):
            return target
        group, topic, queues = target
        poll_ms = min(max(0, cmd.get_int("pollTime", 0) or 0), MAX_POLL_MS)
        await self.pop.prepare(group)
        loop = asyncio.get_running_loop()
        until = loop.time() + poll_ms / 1000
        while not (has := self._has_message(group, topic, queues)) and loop.time() < until:
            await self.pop.wait(group, topic, queues, until - loop.time())
        return cmd.response(ResponseCode.SUCCESS, None, {"hasMsg": has, "pollingFull": False})

    def _rest(self, group: str, topic: str, queues: Sequence[int]) -> int:
        """How many messages of these queues the group could still take (RocketMQ's restNum)."""
        return sum(self.pop.takeable(group, topic, q) for q in queues)

    def _has_message(self, group: str, topic: str, queues: Sequence[int]) -> bool:
        """Whether a pop of the group would find something on these queues now."""
        return any(self.pop.takeable(group, topic, q) for q in queues)

    async def polling_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        target = self._target(cmd, all_queues=False)
        if isinstance(target, RemotingCommand):
            return target
        group, topic, (queue,) = target
        return cmd.response(ResponseCode.SUCCESS, None, {"pollingNum": self.pop.waiting.get((group, topic, queue), 0)})


def _revive_qid(cmd: RemotingCommand) -> int:
    """The reviveQid of the receipt a request carries (a new receipt keeps it)."""
    fields = (cmd.get_str("extraInfo") or "").split(" ")
    return ORDERED_REVIVE_QID if len(fields) > 3 and fields[3] == str(ORDERED_REVIVE_QID) else REVIVE_QID


def _receipt(extra_info: str) -> tuple[int, int] | None:
    """(ck start offset, popTime) of a receipt (ExtraInfoUtil's `START POPTIME INVISIBLE REVIVEQID RETRY BROKER
    QUEUE [OFFSET]`), or None when it is not one."""
    fields = extra_info.split(" ")
    if len(fields) < 7:
        return None
    try:
        return int(fields[0]), int(fields[1])
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class BatchAck:
    """One entry of a BATCH_ACK_MESSAGE body (RocketMQ's BatchAck: its offsets are a bit set over startOffset)."""

    group: str
    topic: str
    retry: str
    queue: int
    pop_time: int
    offsets: tuple[int, ...]


def _set_bits(bits: int) -> Iterator[int]:
    """The positions of the set bits of `bits`, lowest first (as many steps as bits set, not as bits)."""
    while bits:
        low = bits & -bits
        yield low.bit_length() - 1
        bits ^= low


def _batch_acks(body: bytes | None) -> list[BatchAck] | None:
    """The acks of a BatchAckMessageRequestBody (fastjson: short or long field names, the bit set as base64 of
    Java's BitSet.toByteArray, little-endian), or None when the body is not one (or a bit set is larger than
    MAX_BIT_SET_BYTES)."""
    try:
        doc = json.loads(body or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    entries = doc.get("acks") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        return None if entries is not None else []
    out = []
    for entry in entries:
        if not isinstance(entry, dict):
            return None

        def field(short: str, long: str, entry: dict[str, Any] = entry) -> Any:
            return entry.get(short, entry.get(long))

        bits = field("b", "bitSet")
        try:
            raw = base64.b64decode(bits, validate=True) if isinstance(bits, str) else bytes(bits or b"")
            if len(raw) > MAX_BIT_SET_BYTES:
                return None
            start = int(field("so", "startOffset"))
            out.append(
                BatchAck(
                    str(field("c", "consumerGroup")),
                    str(field("t", "topic")),
                    str(field("r", "retry") or NORMAL_TOPIC),
                    int(field("q", "queueId")),
                    int(field("pt", "popTime")),
                    tuple(start + i for i in _set_bits(int.from_bytes(raw, "little"))),
                )
            )
        except (TypeError, ValueError):
            return None
    return out
