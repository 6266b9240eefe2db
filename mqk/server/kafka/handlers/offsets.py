"""OffsetCommit and OffsetFetch: committed offsets (with metadata and leader epoch) kept by the store's group
offsets through the coordinator, so they survive a broker restart. Partitions of unknown topics are answered
with UNKNOWN_TOPIC_OR_PARTITION on commit, and with offset -1 on fetch (as Kafka does)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from mqk import errors as E
from mqk.protocol.kafka.messages.offset_commit import OffsetCommitRequest, OffsetCommitResponse
from mqk.protocol.kafka.messages.offset_fetch import (
    OffsetFetchRequest,
    OffsetFetchRequestTopic,
    OffsetFetchRequestTopics,
    OffsetFetchResponse,
    OffsetFetchResponseGroup,
    OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
)
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import NONE
from mqk.store.adapter import GroupOffset


async def offset_commit(ctx: KafkaContext, peer: Peer, req: KafkaRequest[OffsetCommitRequest]) -> OffsetCommitResponse:
    b = req.body
    store = ctx.store
    wanted: dict[tuple[str, int], tuple[int, int, str | None]] = {}
    codes: dict[tuple[str, int], int] = {}
    for t in b["topics"]:
        info = store.topic(t["name"])
        for p in t["partitions"]:
            tp = (t["name"], p["partition_index"])
            if info is None or not 0 <= tp[1] < info.queue_count:
                codes[tp] = E.UnknownTopicOrPartitionError.code
            else:
                wanted[tp] = (p["committed_offset"], p.get("committed_leader_epoch", -1), p["committed_metadata"])
    if wanted:
        codes.update(
            await ctx.groups.commit_offsets(
                b["group_id"],
                b.get("generation_id_or_member_epoch", -1),
                b.get("member_id", ""),
                wanted,
                group_instance_id=b.get("group_instance_id"),
            )
        )
    return {
        "throttle_time_ms": 0,
        "topics": [
            {
                "name": t["name"],
                "partitions": [
                    {"partition_index": p["partition_index"], "error_code": codes[(t["name"], p["partition_index"])]}
                    for p in t["partitions"]
                ],
            }
            for t in b["topics"]
        ],
    }


def _fetch_group(
    ctx: KafkaContext,
    group_id: str,
    topics: Sequence[OffsetFetchRequestTopic] | Sequence[OffsetFetchRequestTopics] | None,
) -> list[OffsetFetchResponseTopics]:
    """The answer's topics for one group, in the v8+ structs (whose keys the v1-v7 ones share; see
    offset_fetch). `topics` None means every partition with a committed offset."""
    if topics is None:
        committed = ctx.groups.fetch_offsets(group_id)
        by_topic: dict[str, list[OffsetFetchResponsePartitions]] = {}
        for (topic, part), off in sorted(committed.items()):
            if off is not None:
                by_topic.setdefault(topic, []).append(_partition(part, off))
        return [{"name": topic, "partitions": parts} for topic, parts in by_topic.items()]
    wanted = [(t["name"], p) for t in topics for p in t["partition_indexes"]]
    committed = ctx.groups.fetch_offsets(group_id, wanted)
    return [
        {
            "name": t["name"],
            "partitions": [_partition(p, committed.get((t["name"], p))) for p in t["partition_indexes"]],
        }
        for t in topics
    ]


def _partition(index: int, off: GroupOffset | None) -> OffsetFetchResponsePartitions:
    if off is None:
        return {
            "partition_index": index,
            "committed_offset": -1,
            "committed_leader_epoch": -1,
            "metadata": "",
            "error_code": NONE,
        }
    return {
        "partition_index": index,
        "committed_offset": off.offset,
        "committed_leader_epoch": off.leader_epoch,
        "metadata": off.metadata,
        "error_code": NONE,
    }


async def offset_fetch(ctx: KafkaContext, peer: Peer, req: KafkaRequest[OffsetFetchRequest]) -> OffsetFetchResponse:
    b = req.body
    if req.api_version >= 8:
        groups: list[OffsetFetchResponseGroup] = []
        for g in b["groups"]:
            code = NONE if g["group_id"] else E.InvalidGroupIdError.code
            found = _fetch_group(ctx, g["group_id"], g["topics"]) if code == NONE else []
            groups.append({"group_id": g["group_id"], "topics": found, "error_code": code})
        return {"throttle_time_ms": 0, "groups": groups}
    if not b["group_id"]:
        return {"throttle_time_ms": 0, "topics": [], "error_code": E.InvalidGroupIdError.code}
    # v1-v7 topics and partitions have a subset of the v8+ structs' keys, of the same types (a topic is named here)
    topics = cast("list[OffsetFetchResponseTopic]", _fetch_group(ctx, b["group_id"], b["topics"]))
    return {"throttle_time_ms": 0, "topics": topics, "error_code": NONE}
