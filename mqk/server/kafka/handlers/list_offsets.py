"""ListOffsets: earliest (-2), latest (-1), max timestamp (-3), earliest-local (-4, same as earliest here: there is
no tiered storage), and by timestamp (the ConsumeQueue's time index via `store.offset_for_timestamp`).

No record at or after the timestamp → offset -1, timestamp -1, as Kafka answers. With isolation_level
READ_COMMITTED (1) the latest offset is the partition's last stable offset (mqk.server.kafka.transactions), as a
read_committed consumer's end. In cluster mode only the partition's leader
answers (else NOT_LEADER_OR_FOLLOWER), and a `current_leader_epoch` must match its epoch (KIP-320). A topic the
principal may not DESCRIBE answers TOPIC_AUTHORIZATION_FAILED for each of its partitions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqk import errors as E
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import NONE, TOPIC, allowed, epoch_code, leader_epoch, partition_code
from mqk.store.manager import StoreManager

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
    from mqk.protocol.kafka.messages.list_offsets import (
        ListOffsetsPartitionResponse,
        ListOffsetsRequest,
        ListOffsetsResponse,
        ListOffsetsTopicResponse,
    )

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, EARLIEST_PENDING_UPLOAD, LATEST_TIERED = -1, -2, -3, -4, -5, -6


async def lookup(store: StoreManager, topic: str, index: int, timestamp: int) -> tuple[int, int]:
    """(offset, timestamp) for one ListOffsets query."""
    if timestamp == LATEST:
        return store.end_offset(topic, index), -1
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return store.log_start_offset(topic, index), -1
    if timestamp in (EARLIEST_PENDING_UPLOAD, LATEST_TIERED):
        return -1, -1  # nothing is tiered
    if timestamp == MAX_TIMESTAMP:
        hit = await store.max_timestamp(topic, index)
    elif timestamp < 0:
        raise E.InvalidRequestError(f"unknown special timestamp {timestamp}")
    else:
        hit = await store.offset_for_timestamp(topic, index, timestamp)
    return hit if hit is not None else (-1, -1)


async def handle(ctx: KafkaContext, peer: Peer, req: KafkaRequest[ListOffsetsRequest]) -> ListOffsetsResponse:
    store = ctx.store
    topics: list[ListOffsetsTopicResponse] = []
    committed_only = req.body.get("isolation_level", 0) == 1
    for t in req.body["topics"]:
        name = t["name"]
        info = store.topic(name)
        cluster = ctx.cluster
        parts: list[ListOffsetsPartitionResponse] = []
        denied = not allowed(ctx, peer, "DESCRIBE", TOPIC, name)
        for p in t["partitions"]:
            index = p["partition_index"]
            entry: ListOffsetsPartitionResponse = {
                "partition_index": index,
                "error_code": NONE,
                "old_style_offsets": [],
                "timestamp": -1,
                "offset": -1,
                "leader_epoch": -1,
            }
            refused = E.TopicAuthorizationFailedError.code if denied else NONE
            if cluster is not None and not refused:
                refused = partition_code(ctx, name, index) or epoch_code(
                    ctx, name, index, p.get("current_leader_epoch", -1)
                )
            if refused:
                entry["error_code"] = refused
            elif info is None or not 0 <= index < info.queue_count:
                entry["error_code"] = E.UnknownTopicOrPartitionError.code
            else:
                try:
                    offset, ts = await lookup(store, name, index, p["timestamp"])
                    replication = ctx.replication
                    if replication is not None and info.engine == "file" and offset >= 0:
                        # a replicated partition's latest offset is its high watermark; nothing past it is told
                        offset = min(offset, replication.committed_end(name, index, store.end_offset(name, index)))
                    if committed_only and p["timestamp"] == LATEST and ctx.transactions is not None:
                        offset = ctx.transactions.last_stable(name, index, offset)
                    entry["offset"] = offset
                    entry["timestamp"] = ts
                    entry["old_style_offsets"] = [offset]
                    entry["leader_epoch"] = leader_epoch(ctx, name, index) if offset >= 0 else -1
                except Exception as exc:  # noqa: BLE001 - the partition's answer carries the code
                    entry["error_code"] = E.kafka_code_for(exc)
            parts.append(entry)
        topics.append({"name": name, "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}
