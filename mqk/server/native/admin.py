"""Topic administration and message queries over remoting: UPDATE_AND_CREATE_TOPIC, DELETE_TOPIC_IN_BROKER,
GET_ALL_TOPIC_CONFIG, QUERY_MESSAGE (by key, through the store's key index, bounded by time range and count) and
VIEW_MESSAGE_BY_ID (the id's commit-log offset, resolved through the broker context, then authorized on the
message's own topic: mqk.server.native.acl, `check_viewed`). Topic names and
creation follow the broker's topic registry (mqk.broker.topics), in RocketMQ's alphabet; the broker's internal
topics (mqk.broker.internal) are neither created nor deleted through it (SYSTEM_ERROR, RocketMQ's answer for its
system topics)."""

from __future__ import annotations

import json

from mqk.broker.internal import is_internal
from mqk.broker.names import ROCKETMQ
from mqk.errors import MqkError, NotSupported, StorageError, UnknownShard
from mqk.protocol.native.codes import ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.errors import response_code_for
from mqk.protocol.native.message import encode_message_ext
from mqk.server.native.acl import NativeAcl
from mqk.server.native.context import BrokerContext
from mqk.server.native.remoting import Connection

MAX_QUERY_MESSAGES = 64  # RocketMQ's defaultQueryMaxNum


class AdminProcessor:
    def __init__(self, ctx: BrokerContext, acl: NativeAcl) -> None:
        """`acl`: the listener's ACL check (VIEW_MESSAGE_BY_ID is authorized here, once its message is found)."""
        self.ctx = ctx
        self.acl = acl

    async def create_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = cmd.get_str("topic", required=True) or ""
        if not ROCKETMQ.allows(topic):
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"the topic[{topic[:300]}] is not a valid topic name")
        if is_internal(topic):
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic.")
        queues = max(cmd.get_int("readQueueNums", 0) or 0, cmd.get_int("writeQueueNums", 0) or 0, 1)
        topics = self.ctx.topics
        try:
            info = topics.get(topic)
            if info is None:
                await topics.ensure(topic, queues)
            elif queues > info.queue_count:
                await topics.add_partitions(topic, queues)
        except StorageError as exc:
            return cmd.response(response_code_for(exc), str(exc))
        except MqkError as exc:  # the store's own refusals (too many queues, a name it rejects)
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        return cmd.response(ResponseCode.SUCCESS)

    async def delete_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = cmd.get_str("topic", required=True) or ""
        if is_internal(topic):  # RocketMQ's answer for its system topics
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic.")
        try:
            await self.ctx.topics.delete(topic)
        except UnknownShard:
            pass  # RocketMQ answers SUCCESS for a topic it does not have
        except StorageError as exc:
            return cmd.response(response_code_for(exc), str(exc))
        return cmd.response(ResponseCode.SUCCESS)

    async def all_topic_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        table = {
            name: self.ctx.topic_config(name, self.ctx.queue_count(name))
            for name, _info in sorted(self.ctx.topics.all().items())
        }
        body = {"topicConfigTable": table, "dataVersion": {"timestamp": self.ctx.now_ms(), "counter": len(table)}}
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())

    async def query_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = cmd.get_str("topic", required=True) or ""
        key = cmd.get_str("key", required=True) or ""
        max_num = max(1, min(cmd.get_int("maxNum", MAX_QUERY_MESSAGES) or MAX_QUERY_MESSAGES, MAX_QUERY_MESSAGES))
        begin = cmd.get_int("beginTimestamp", 0) or 0
        end = cmd.get_int("endTimestamp", 1 << 62) or (1 << 62)
        try:
            found = await self.ctx.store.read_by_key(topic, key.encode(), max_num, begin, end)
        except NotSupported as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"query by key is not available: {exc}")
        except StorageError as exc:
            return cmd.response(response_code_for(exc), str(exc))
        parts: list[bytes] = []
        for queue, batch in found:
            for msg in self.ctx.to_messages(topic, queue, batch):
                if key in msg.keys and len(parts) < max_num:
                    parts.append(encode_message_ext(msg))
        if not parts:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct")
        ext = {"indexLastUpdateTimestamp": self.ctx.now_ms(), "indexLastUpdatePhyoffset": 0}
        return cmd.response(ResponseCode.SUCCESS, ext=ext, body=b"".join(parts))

    async def view_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        offset = cmd.get_int("offset", required=True)
        assert offset is not None
        msg = await self.ctx.resolve(offset)
        # the request names no topic: the message's own is authorized, so the lookup comes first (the signature
        # was checked before it, with every request's)
        refused = self.acl.check_viewed(conn.peer, cmd, None if msg is None else msg.topic)
        if refused is not None:
            return refused
        if msg is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return cmd.response(ResponseCode.SUCCESS, body=encode_message_ext(msg))
