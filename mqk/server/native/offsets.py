"""Consumer offsets and queue bounds over remoting: QUERY_CONSUMER_OFFSET / UPDATE_CONSUMER_OFFSET (the store's
group offsets, the very ones Kafka groups commit), GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP,
GET_EARLIEST_MSG_STORETIME.

QUERY_CONSUMER_OFFSET for a queue the group never committed answers as a 4.x master does: offset 0 when the
queue still starts at 0 (the group then reads from the beginning), else QUERY_NOT_FOUND so the client applies its
consumeFromWhere.
"""

from __future__ import annotations

from mqk.errors import KafkaError, StorageError
from mqk.protocol.native.codes import ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.errors import response_code_for
from mqk.server.native.context import BrokerContext
from mqk.server.native.remoting import Connection
from mqk.store.adapter import GroupOffset


class OffsetProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def _queue(self, cmd: RemotingCommand) -> tuple[str, int, RemotingCommand | None]:
        topic = cmd.get_str("topic", required=True) or ""
        queue = cmd.get_int("queueId", required=True)
        assert queue is not None
        count = self.ctx.queue_count(topic)
        if count == 0:
            return topic, queue, cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        if not 0 <= queue < count:
            return topic, queue, cmd.response(ResponseCode.SYSTEM_ERROR, f"queueId[{queue}] is illegal")
        return topic, self.ctx.to_partition(topic, queue), None

    async def query_consumer_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.get_str("consumerGroup", required=True) or ""
        topic, queue, error = self._queue(cmd)
        if error is not None:
            return error
        committed = self.ctx.store.fetch_offsets(group).get((topic, queue))
        if committed is not None and committed.offset >= 0:
            return cmd.response(ResponseCode.SUCCESS, ext={"offset": committed.offset})
        if self.ctx.store.log_start_offset(topic, queue) <= 0:
            return cmd.response(ResponseCode.SUCCESS, ext={"offset": 0})
        return cmd.response(ResponseCode.QUERY_NOT_FOUND, "Not found, maybe this group consumer boot first")

    async def update_consumer_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.get_str("consumerGroup", required=True) or ""
        offset = cmd.get_int("commitOffset", required=True)
        topic, queue, error = self._queue(cmd)
        if error is not None:
            return error
        assert offset is not None
        current = self.ctx.store.fetch_offsets(group).get((topic, queue))
        if current is not None and current.offset == offset:
            return cmd.response(ResponseCode.SUCCESS)  # (sent every few seconds, mostly unchanged: no record)
        try:
            await self.ctx.store.commit_offsets(group, {(topic, queue): GroupOffset(offset, "", self.ctx.now_ms())})
        except (StorageError, KafkaError) as exc:  # (cluster mode: NOT_COORDINATOR on a broker that is no master)
            return cmd.response(response_code_for(exc), str(exc))
        return cmd.response(ResponseCode.SUCCESS)

    async def get_max_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic, queue, error = self._queue(cmd)
        if error is not None:
            return error
        return cmd.response(ResponseCode.SUCCESS, ext={"offset": self.ctx.store.end_offset(topic, queue)})

    async def get_min_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic, queue, error = self._queue(cmd)
        if error is not None:
            return error
        return cmd.response(ResponseCode.SUCCESS, ext={"offset": self.ctx.store.log_start_offset(topic, queue)})

    async def search_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        timestamp = cmd.get_int("timestamp", required=True)
        topic, queue, error = self._queue(cmd)
        if error is not None:
            return error
        assert timestamp is not None
        found = await self.ctx.store.offset_for_timestamp(topic, queue, timestamp)
        offset = found[0] if found is not None else self.ctx.store.end_offset(topic, queue)
        return cmd.response(ResponseCode.SUCCESS, ext={"offset": offset})

    async def earliest_store_time(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic, queue, error = self._queue(cmd)
        if error is not None:
            return error
        start = self.ctx.store.log_start_offset(topic, queue)
        timestamp = -1
        try:
            read = await self.ctx.store.read(topic, queue, start, 1)
            if read.batches:
                timestamp = read.batches[0].store_timestamp
        except StorageError:
            pass
        if timestamp < 0:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "no message in queue")
        return cmd.response(ResponseCode.SUCCESS, ext={"timestamp": timestamp})
