"""SendMessageProcessor: SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE and CONSUMER_SEND_MSG_BACK.

Each RocketMQ message is stored as one record batch (see `mqk.protocol.native.records`) with its tags code and
keys, so a Kafka consumer reads it and the ConsumeQueue can filter by tag. Delayed messages (DELAY and the timer
properties) are appended like any other: the timer's put-hook on the store reroutes them.

RocketMQ behaviours kept: a negative queue id picks a queue (round robin here); sending to an unknown topic
creates it under the broker's auto-creation policy (mqk.broker.topics: when `auto_create_topics`, with
`min(defaultTopicQueueNums, num_partitions)` queues; a group's retry and dead-letter topics always, with one); a
send to a retry topic whose reconsume count reached the maximum goes to the group's dead-letter topic; compressed
bodies (sys flag bit 0, zlib) are inflated on arrival so Kafka consumers see the real body; a body (inflated) over
the broker's `native_max_message_size` is MESSAGE_ILLEGAL; a send to an internal topic (mqk.broker.internal) or one of
RocketMQ's system topics is NO_PERMISSION ("Sending message to topic[...] is forbidden."), as in RocketMQ.
A topic whose compression.type is not `producer` gets every message's batch in its codec, as Kafka recompresses
every append (mqk.protocol.kafka.records.recompress).
"""

from __future__ import annotations

import itertools
import zlib
from typing import Any

from mqk import errors as E
from mqk.broker.internal import DLQ_PREFIX, RETRY_PREFIX, dlq_topic, retry_topic, rocketmq_send_refusal
from mqk.broker.names import ROCKETMQ
from mqk.config import SYNC_MASTER
from mqk.errors import MqkError, StorageError
from mqk.protocol.kafka import records as kafka_records
from mqk.protocol.native.codes import (
    DEFAULT_MAX_RECONSUME_TIMES,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MSG_REGION,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TRACE_SWITCH,
    PROPERTY_TRANSACTION_PREPARED,
    SYSFLAG_COMPRESSED,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    RequestCode,
    ResponseCode,
)
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.errors import response_code_for
from mqk.protocol.native.message import (
    MessageFormatError,
    decode_batch_body,
    encode_message_id,
    string_to_properties,
)
from mqk.protocol.native.records import keys_of, message_to_batch, synthetic_offset, tags_code_for
from mqk.server.native.context import BrokerContext
from mqk.server.native.recall import Recalls
from mqk.server.native.remoting import Connection
from mqk.server.native.transaction import TransactionService

MAX_BATCH_MESSAGES = 10_000
#: SEND_MESSAGE_V2 carries its header fields under one-letter names
_V2_NAMES = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
    "n": "brokerName",
}


def normalize_send_header(cmd: RemotingCommand) -> RemotingCommand:
    if cmd.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE) and "b" in cmd.ext_fields:
        cmd.ext_fields = {_V2_NAMES.get(k, k): v for k, v in cmd.ext_fields.items()}
    return cmd


class SendProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self._round_robin = itertools.count()
        #: the half-message service; None refuses transactional sends
        self.transactions: TransactionService | None = None
        #: recall handles for delayed messages (NativeServer sets it)
        self.recalls: Recalls | None = None

    async def send(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        cmd = normalize_send_header(cmd)
        topic = cmd.get_str("topic", required=True) or ""
        props = string_to_properties(cmd.get_str("properties"))
        sys_flag = cmd.get_int("sysFlag", 0) or 0
        flag = cmd.get_int("flag", 0) or 0
        born = cmd.get_int("bornTimestamp", 0) or self.ctx.now_ms()
        reconsume = cmd.get_int("reconsumeTimes", 0) or 0
        batch = cmd.code == RequestCode.SEND_BATCH_MESSAGE or cmd.get_bool("batch")

        prepared = (
            sys_flag & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_PREPARED
            or props.get(PROPERTY_TRANSACTION_PREPARED) == "true"
        )
        if prepared and (self.transactions is None or batch):
            # refuse as a RocketMQ broker with rejectTransactionMessage does, rather than make a half message
            # visible before its commit
            return cmd.response(ResponseCode.NO_PERMISSION, "sending transaction message is forbidden")
        if not ROCKETMQ.allows(topic):
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"the topic[{topic[:300]}] is not a valid topic name")
        refusal = rocketmq_send_refusal(topic)  # the broker's internal topics and RocketMQ's system ones
        if refusal:
            return cmd.response(ResponseCode.NO_PERMISSION, refusal)
        body = cmd.body or b""
        # RocketMQ's maxMessageSize, for the body as stored
        limit = self.ctx.config.native_max_message_size
        if sys_flag & SYSFLAG_COMPRESSED and not batch:
            try:
                inflater = zlib.decompressobj()
                body = inflater.decompress(body, limit + 1)
            except zlib.error:
                return cmd.response(ResponseCode.MESSAGE_ILLEGAL, "compressed body does not inflate")
        if len(body) > limit:
            return cmd.response(ResponseCode.MESSAGE_ILLEGAL, f"the message body size over max value, MAX: {limit}")

        if topic.startswith(RETRY_PREFIX):
            max_times = cmd.get_int("maxReconsumeTimes", DEFAULT_MAX_RECONSUME_TIMES)
            if max_times is not None and reconsume >= max_times:
                topic = DLQ_PREFIX + topic[len(RETRY_PREFIX) :]
                cmd.ext_fields["queueId"] = "0"

        topics = self.ctx.topics
        queues = self.ctx.queue_count(topic)
        if queues == 0 and topics.queue_count(topic) == 0:
            if not topics.may_auto_create(topic):
                return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
            count = topics.auto_create_partitions(topic, cmd.get_int("defaultTopicQueueNums", 0) or 0)
            try:
                queues = await self.ctx.ensure_topic(topic, count)
            except MqkError as exc:  # the store refuses the name or the count
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"cannot create topic {topic}: {exc}")
        if queues == 0:  # cluster mode: none of the topic's queues lives on this broker
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"topic[{topic}] has no queue on this broker")
        queue = cmd.get_int("queueId", -1)
        if queue is None or queue < 0:
            queue = next(self._round_robin) % queues
        elif queue >= queues:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR, f"request queueId[{queue}] is illegal, topic {topic} has {queues} queues"
            )
        client_queue, queue = queue, self.ctx.to_partition(topic, queue)

        if prepared:
            assert self.transactions is not None
            return await self.transactions.prepare(cmd, topic, queue, body, props, flag, born, conn.peer)
        if batch:
            try:
                items = decode_batch_body(body, MAX_BATCH_MESSAGES)
            except MessageFormatError as exc:
                return cmd.response(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}")
            if not items:
                return cmd.response(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
            messages = [(item.body, item.properties, item.flag) for item in items]
        else:
            messages = [(body, props, flag)]

        try:
            ids, first_offset = await self.append(topic, queue, messages, born, reconsume, conn.peer)
        except StorageError as exc:
            return cmd.response(response_code_for(exc), str(exc))
        ext: dict[str, Any] = {
            "msgId": ",".join(ids),
            "queueId": client_queue,
            "queueOffset": first_offset,
            PROPERTY_MSG_REGION: "DefaultRegion",
            PROPERTY_TRACE_SWITCH: "false",
        }
        if not batch and self.recalls is not None and cmd.code != RequestCode.CONSUMER_SEND_MSG_BACK:
            handle = self.recalls.handle_for(topic, props)
            if handle:
                ext["recallHandle"] = handle
        return cmd.response(await self._replicated(topic), ext=ext)

    async def _replicated(self, topic: str) -> ResponseCode:
        """A SYNC_MASTER answers once the group's in-sync replicas hold the message (RocketMQ's HA wait): stored
        here but not there in time is FLUSH_SLAVE_TIMEOUT, fewer in-sync replicas than min.insync.replicas is
        SLAVE_NOT_AVAILABLE (the message is stored on the master either way, as RocketMQ answers)."""
        replication = self.ctx.replication
        info = self.ctx.store.topic(topic)
        if replication is None or info is None or info.engine != "file":
            return ResponseCode.SUCCESS
        if self.ctx.config.native_broker_role != SYNC_MASTER:
            return ResponseCode.SUCCESS
        min_insync = info.config.get_int("min.insync.replicas")
        try:
            await replication.wait_replicated(
                replication.engine.log_end, min_insync, self.ctx.config.native_sync_replica_timeout_ms / 1000
            )
        except (E.NotEnoughReplicasAfterAppendError, E.NotEnoughReplicasError):
            return ResponseCode.SLAVE_NOT_AVAILABLE
        except E.RequestTimedOutError:
            return ResponseCode.FLUSH_SLAVE_TIMEOUT
        except E.NotLeaderOrFollowerError:
            return ResponseCode.SERVICE_NOT_AVAILABLE  # (it stopped being master: the message may be cut)
        return ResponseCode.SUCCESS

    async def append(
        self,
        topic: str,
        queue: int,
        messages: list[tuple[bytes, dict[str, str], int]],
        born: int,
        reconsume: int,
        born_host: tuple[str, int],
    ) -> tuple[list[str], int]:
        """Append messages in order; runs of equal tags code without keys share one append call (keys are
        indexed per append, so a keyed message gets its own)."""
        ids: list[str] = []
        first_offset = -1
        info = self.ctx.store.topic(topic)
        codec = kafka_records.TOPIC_CODECS.get(info.config.get("compression.type")) if info is not None else None
        i = 0
        while i < len(messages):
            body, props, flag = messages[i]
            code = tags_code_for(props)
            keys = keys_of(props)
            run = [message_to_batch(body, props, born, flag, reconsume, born_host)]
            j = i + 1
            while not keys and j < len(messages):
                nbody, nprops, nflag = messages[j]
                if keys_of(nprops) or tags_code_for(nprops) != code:
                    break
                run.append(message_to_batch(nbody, nprops, born, nflag, reconsume, born_host))
                j += 1
            if codec is not None:
                run = [_compressed(batch, codec) for batch in run]
            # the properties let the timer's put-hook see a delay without decoding the batch
            result = await self.ctx.store.append(
                topic, queue, run, tags_code=code, keys=keys, properties=props if len(run) == 1 else None
            )
            if first_offset < 0:
                first_offset = result.base_offset
            positions = [synthetic_offset(topic, queue, result.base_offset + k) for k in range(len(run))]
            if result.physical_offset >= 0:
                positions[0] = result.physical_offset
                if len(run) > 1:
                    # the append reports only the first entry's CommitLog position; the ids a pull will show for
                    # the others come from reading them back (zero-copy views on every engine that has one)
                    positions = await self._positions(topic, queue, result.base_offset, run, positions)
            for k, commit in enumerate(positions):
                if result.physical_offset < 0 or commit < 0:  # else the store's read_at finds it, durably
                    self.ctx.remember(commit, topic, queue, result.base_offset + k)
                ids.append(encode_message_id(self.ctx.host[0], self.ctx.host[1], commit))
            i = j
        return ids, first_offset

    async def _positions(
        self, topic: str, queue: int, base: int, run: list[bytearray], fallback: list[int]
    ) -> list[int]:
        try:
            read = await self.ctx.store.read(topic, queue, base, sum(len(b) for b in run))
        except StorageError:
            return fallback
        found = {b.base_offset: b.physical_offset for b in read.batches if b.physical_offset >= 0}
        return [found.get(base + k, fallback[k]) for k in range(len(run))]

    async def send_back(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """CONSUMER_SEND_MSG_BACK: re-deliver a message the consumer failed on, later, via the group's retry
        topic (delay level 3 + reconsume times unless the client chose one), or to its dead-letter topic once it
        was retried `maxReconsumeTimes` times (or the client asks with a negative delay level)."""
        commit_offset = cmd.get_int("offset", required=True)
        group = cmd.get_str("group", required=True) or ""
        delay_level = cmd.get_int("delayLevel", 0) or 0
        origin_id = cmd.get_str("originMsgId")
        max_times = cmd.get_int("maxReconsumeTimes", DEFAULT_MAX_RECONSUME_TIMES)
        if max_times is None:
            max_times = DEFAULT_MAX_RECONSUME_TIMES
        assert commit_offset is not None
        origin_topic = cmd.get_str("originTopic")
        hint = None if not origin_topic else {origin_topic, retry_topic(group)}
        msg = await self.ctx.resolve(commit_offset, hint)
        if msg is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {commit_offset}")
        props = dict(msg.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, msg.topic)
        props[PROPERTY_ORIGIN_MESSAGE_ID] = origin_id or msg.msg_id
        times = msg.reconsume_times
        if times >= max_times or delay_level < 0:
            target = dlq_topic(group)
            props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        else:
            target = retry_topic(group)
            props[PROPERTY_DELAY_TIME_LEVEL] = str(delay_level if delay_level > 0 else 3 + times)
        try:
            await self.ctx.ensure_topic(target, 1)
        except MqkError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"cannot create topic {target}: {exc}")
        try:
            await self.ctx.store.append(
                target,
                0,
                [message_to_batch(msg.body, props, msg.born_timestamp, msg.flag, times + 1, msg.born_host)],
                tags_code=tags_code_for(props),
                keys=keys_of(props),
                properties=props,
            )
        except StorageError as exc:
            return cmd.response(response_code_for(exc), str(exc))
        return cmd.response(ResponseCode.SUCCESS)


def _compressed(batch: bytearray, codec: int) -> bytearray:
    """A message's batch in the topic's compression.type codec (what Kafka's LogValidator does to every append
    when the topic's compression.type is not `producer`: Kafka consumers then read the topic in one codec)."""
    (info,) = kafka_records.validate_produce_records(batch, len(batch))
    return bytearray(kafka_records.recompress(info, codec).data)
