"""PullMessageProcessor: PULL_MESSAGE with tag filtering and long polling, answered the way a RocketMQ 4.x master
answers (DefaultMessageStore.getMessage status → response code):

- unknown topic → TOPIC_NOT_EXIST; bad queue id → SYSTEM_ERROR;
- empty queue → PULL_NOT_FOUND (next 0) when asked for offset 0, else PULL_OFFSET_MOVED with next 0;
- offset below the log start → PULL_OFFSET_MOVED, next = min offset;
- offset == max offset → PULL_NOT_FOUND, next = offset (this is the one that long-polls);
- offset beyond max → PULL_OFFSET_MOVED, next = min offset if that is 0, else max offset;
- messages found → SUCCESS with the stored messages as the body;
- nothing matched the subscription in what was scanned → PULL_RETRY_IMMEDIATELY, next = past the scanned part.

Tag filtering is two-step as in RocketMQ: the store filters batches by tags code (read_by_tags, from the
ConsumeQueue), then each message's TAGS must equal one of the subscribed tags (hash collisions). With the
suspend flag, PULL_NOT_FOUND waits (at most the client's suspendTimeoutMillis) on the broker's wake-up hub.
Every answer carries nextBeginOffset, minOffset, maxOffset and suggestWhichBrokerId.

Reads from replicas (RocketMQ's slaveReadEnable, `native_slave_read_enable`, cluster mode): a pull that served
messages while its consumer is more than `native_access_message_in_memory_max_ratio` percent of the machine's
memory behind the CommitLog's end suggests brokerId 1, the group's first replica (RocketMQ's
whichBrokerWhenConsumeSlowly); any other answer suggests the master (0). A client takes the suggestion for its next
pull of that queue. A replica serves pulls from its copy of the CommitLog with the same rules (it suggests the
master back once the consumer has caught up), and never stores the offset a pull carries: offsets are the master's,
as on a RocketMQ SLAVE. Without slave reads every answer suggests the master.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass

from mqk._fast import load
from mqk.errors import KafkaError, OffsetOutOfRange, StorageError
from mqk.groups.share import ShareGroups
from mqk.protocol.native.codes import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    ResponseCode,
)
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.errors import response_code_for
from mqk.protocol.native.message import MessageExt, encode_message_ext
from mqk.server.native.clients import ClientManager, parse_subscription
from mqk.server.native.context import BrokerContext
from mqk.server.native.remoting import Connection
from mqk.server.native.subscriptions import paused
from mqk.store.adapter import GroupOffset

log = logging.getLogger("mqk.native")

cqunit = load("cqunit")

#: RocketMQ's brokerSuspendMaxTimeMillis: the longest a pull is held, whatever the client asks
MAX_SUSPEND_MS = 15_000
#: per pull: RocketMQ's maxTransferCountOnMessageInMemory is 32; clients may ask for more, this caps it
MAX_MESSAGES = 1024
MAX_BODY_BYTES = 4 * 1024 * 1024
#: RocketMQ's MixAll.MASTER_ID, and the replica a consumer far behind is sent to (its whichBrokerWhenConsumeSlowly)
MASTER_ID, SLOW_CONSUMER_BROKER_ID = 0, 1
#: store bytes read per pull: enough for `maxMsgNums` small messages, capped like RocketMQ's 256 KiB per transfer
#: (a pull that gets fewer messages than asked simply pulls again from its next offset)
READ_BYTES_PER_MESSAGE = 512
READ_BYTES_MIN, READ_BYTES_MAX = 16 << 10, 256 << 10


@dataclass
class PullResult:
    code: int
    next_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt]
    remark: str | None = None


class PullProcessor:
    def __init__(self, ctx: BrokerContext, clients: ClientManager) -> None:
        self.ctx = ctx
        self.clients = clients
        #: the share groups, where subscription group configs live (a paused group pulls nothing); set by the server
        self.share: ShareGroups | None = None
        config = ctx.config
        #: how far behind the CommitLog's end (bytes) a consumer is sent to a replica; None: slave reads are off
        self.far_behind_bytes: int | None = None
        if config.native_slave_read_enable:
            memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            self.far_behind_bytes = memory * config.native_access_message_in_memory_max_ratio // 100

    async def pull(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.get_str("consumerGroup", required=True) or ""
        topic = cmd.get_str("topic", required=True) or ""
        queue = cmd.get_int("queueId", required=True)
        offset = cmd.get_int("queueOffset", required=True)
        max_nums = max(1, min(cmd.get_int("maxMsgNums", 32) or 32, MAX_MESSAGES))
        sys_flag = cmd.get_int("sysFlag", 0) or 0
        commit_offset = cmd.get_int("commitOffset", -1)
        suspend_ms = min(cmd.get_int("suspendTimeoutMillis", 0) or 0, MAX_SUSPEND_MS)
        assert queue is not None and offset is not None
        share = self.share
        cluster = self.ctx.broker.cluster
        # (in cluster mode the configs are the master's: a replica's copy of them is not kept current in memory)
        if share is not None and (cluster is None or cluster.node.leading):
            if share.saved_unread(self.ctx.store):
                await share.ensure_loaded(self.ctx.store)
            why = paused(share, group)
            if why is not None:
                return cmd.response(ResponseCode.NO_PERMISSION, why)

        queues = self.ctx.queue_count(topic)
        if queues == 0:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not 0 <= queue < queues:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue}] is illegal, topic:[{topic}] topicConfig.readQueueNums:[{queues}]",
            )
        client_queue, queue = queue, self.ctx.to_partition(topic, queue)
        expression_type = (cmd.get_str("expressionType") or "TAG").upper()
        if expression_type != "TAG":
            return cmd.response(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"expression type {expression_type} is not supported; use TAG"
            )
        if sys_flag & PULL_FLAG_SUBSCRIPTION:
            tags = parse_subscription(cmd.get_str("subscription"))
        else:
            _, tags = self.clients.subscription(group, topic)

        if (
            sys_flag & PULL_FLAG_COMMIT_OFFSET
            and (cluster is None or cluster.node.leading)  # (a replica stores no offsets: RocketMQ's SLAVE neither)
            and commit_offset is not None
            and commit_offset >= 0
            and not _committed_already(self.ctx, group, topic, queue, commit_offset)
        ):
            committed = GroupOffset(commit_offset, "", self.ctx.now_ms())
            try:
                await self.ctx.store.commit_offsets(group, {(topic, queue): committed})
            except (StorageError, KafkaError) as exc:  # the pull is served all the same; the client commits again
                log.warning("group %s: offset commit with a pull of %s-%d failed: %s", group, topic, queue, exc)

        clock = self.ctx.clock
        deadline = clock.monotonic() + suspend_ms / 1000
        looked_again = False
        while True:
            try:
                result = await self.get_messages(topic, queue, offset, max_nums, tags)
            except StorageError as exc:
                return cmd.response(response_code_for(exc), str(exc))
            remaining = deadline - clock.monotonic()
            if result.code != ResponseCode.PULL_NOT_FOUND or not sys_flag & PULL_FLAG_SUSPEND or remaining <= 0:
                break
            if self.ctx.store.end_offset(topic, queue) > offset:
                # data arrived since the look: look once more; if still nothing is servable (a gap), answer now
                # rather than spin
                if looked_again:
                    break
                looked_again = True
                continue
            looked_again = False
            await self.ctx.hub.wait(((topic, queue),), remaining)

        ext = {
            "suggestWhichBrokerId": self._suggested_broker(result.messages),
            "nextBeginOffset": result.next_offset,
            "minOffset": result.min_offset,
            "maxOffset": result.max_offset,
        }
        body = None
        if result.messages:
            messages = result.messages
            if client_queue != queue:  # (cluster mode: the client knows the partition by its queue id here)
                messages = [dataclasses.replace(m, queue_id=client_queue) for m in messages]
            body = b"".join(encode_message_ext(m) for m in messages)
            self.ctx.count_out(topic, queue, len(messages), len(body), group)
        return cmd.response(result.code, result.remark, ext, body)

    def _suggested_broker(self, messages: list[MessageExt]) -> int:
        """Which broker of the group the consumer should pull this queue from next (see the module docstring)."""
        replication = self.ctx.replication
        if self.far_behind_bytes is None or not messages or replication is None:
            return MASTER_ID
        if replication.is_master and len(replication.tracker.isr) < 2:
            return MASTER_ID  # (no replica in sync to send the consumer to)
        behind = replication.engine.log_end - messages[-1].commit_log_offset
        return SLOW_CONSUMER_BROKER_ID if behind > self.far_behind_bytes else MASTER_ID

    async def get_messages(
        self, topic: str, queue: int, offset: int, max_nums: int, tags: frozenset[str] | None
    ) -> PullResult:
        store = self.ctx.store
        low, high = store.offset_bounds(topic, queue)

        def answer(code: int, next_offset: int, remark: str | None = None) -> PullResult:
            return PullResult(code, next_offset, low, high, [], remark)

        if high == 0:
            return answer(
                ResponseCode.PULL_NOT_FOUND if offset == 0 else ResponseCode.PULL_OFFSET_MOVED, 0, "no message in queue"
            )
        if offset < low:
            return answer(ResponseCode.PULL_OFFSET_MOVED, low, "offset too small")
        if offset == high:
            return answer(ResponseCode.PULL_NOT_FOUND, offset, "no new message")
        if offset > high:
            return answer(ResponseCode.PULL_OFFSET_MOVED, low if low == 0 else high, "offset overflow badly")

        try:
            if tags is None:
                budget = min(READ_BYTES_MAX, max(READ_BYTES_MIN, max_nums * READ_BYTES_PER_MESSAGE))
                read = await store.read(topic, queue, offset, budget)
                scanned_to = read.next_offset if read.batches else read.end_offset
            else:
                codes = {cqunit.hash_tag(t) for t in tags}
                read = await store.read_by_tags(topic, queue, offset, codes, max_nums)
                scanned_to = read.end_offset if len(read.batches) < max_nums else read.next_offset
        except OffsetOutOfRange as exc:  # moved between the bounds check and the read
            return answer(ResponseCode.PULL_OFFSET_MOVED, max(exc.start, min(offset, exc.end)))
        messages: list[MessageExt] = []
        size = 0
        full = False
        for batch in read.batches:
            for msg in self.ctx.to_messages(topic, queue, batch, offset):
                if tags is not None and msg.properties.get("TAGS") not in tags:
                    continue
                messages.append(msg)
                size += len(msg.body) + 200
                if len(messages) >= max_nums or size >= MAX_BODY_BYTES:
                    full = True
                    break
            if full:
                break
        # a full answer goes on after its last message, else after what the read scanned
        next_offset = messages[-1].queue_offset + 1 if full else max(scanned_to, offset)
        if messages:
            return PullResult(ResponseCode.SUCCESS, next_offset, low, high, messages, "FOUND")
        if next_offset <= offset:
            return answer(ResponseCode.PULL_NOT_FOUND, offset, "no new message")
        return answer(ResponseCode.PULL_RETRY_IMMEDIATELY, next_offset, "no matched message")


def _committed_already(ctx: BrokerContext, group: str, topic: str, queue: int, offset: int) -> bool:
    """Whether `offset` is what `group` has committed for the queue already: a push consumer sends its offset with
    every pull, mostly unchanged, and each commit costs a record in the log (cluster mode) or a journal write."""
    current = ctx.store.fetch_offsets(group).get((topic, queue))
    return current is not None and current.offset == offset
