"""OffsetCommit and OffsetFetch: committed offsets (with metadata and leader epoch) kept by the store's group
offsets through the coordinator, so they survive a broker restart. Partitions of unknown topics are answered
with UNKNOWN_TOPIC_OR_PARTITION on commit, and with offset -1 on fetch (as Kafka does).

Authorization as Kafka's: committing asks READ on the group (GROUP_AUTHORIZATION_FAILED for every partition) and
READ on each topic (TOPIC_AUTHORIZATION_FAILED for its partitions); fetching asks DESCRIBE on the group
(GROUP_AUTHORIZATION_FAILED) and DESCRIBE on each topic named (TOPIC_AUTHORIZATION_FAILED for its partitions; when
every committed offset is asked for, the topics it may not describe are left out)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from mqk import errors as E
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import (
    GROUP,
    NONE,
    TOPIC,
    allowed,
    coordinator_code,
    name_topics_by_id,
    topic_id_of,
)
from mqk.store.adapter import GroupOffset

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
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


async def offset_commit(ctx: KafkaContext, peer: Peer, req: KafkaRequest[OffsetCommitRequest]) -> OffsetCommitResponse:
    b = req.body
    by_id = req.api_version >= 10
    unknown = name_topics_by_id(ctx, b["topics"]) if by_id else {}
    refused = NONE
    if not allowed(ctx, peer, "READ", GROUP, b["group_id"]):
        refused = E.GroupAuthorizationFailedError.code
    refused = refused or coordinator_code(ctx, b["group_id"])
    codes, wanted = sort_commit(ctx, peer, b["topics"], refused)
    for tp in codes:
        if tp[0] in unknown and codes[tp] == E.UnknownTopicOrPartitionError.code:
            codes[tp] = E.UnknownTopicIdError.code
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
    return {"throttle_time_ms": 0, "topics": commit_answer(b["topics"], codes, by_id)}


def sort_commit(
    ctx: KafkaContext, peer: Peer, topics: Sequence[Any], refused: int
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], tuple[int, int, str | None]]]:
    """An OffsetCommit's or TxnOffsetCommit's partitions: (the codes of those refused, the (offset, leader epoch,
    metadata) of the others). `refused` refuses them all; a topic the peer may not READ is
    TOPIC_AUTHORIZATION_FAILED, an unknown partition UNKNOWN_TOPIC_OR_PARTITION."""
    wanted: dict[tuple[str, int], tuple[int, int, str | None]] = {}
    codes: dict[tuple[str, int], int] = {}
    for t in topics:
        info = ctx.topics.get(t["name"])
        denied = not refused and not allowed(ctx, peer, "READ", TOPIC, t["name"])
        for p in t["partitions"]:
            tp = (t["name"], p["partition_index"])
            if refused:
                codes[tp] = refused
            elif denied:
                codes[tp] = E.TopicAuthorizationFailedError.code
            elif info is None or not 0 <= tp[1] < info.queue_count:
                codes[tp] = E.UnknownTopicOrPartitionError.code
            else:
                wanted[tp] = (p["committed_offset"], p.get("committed_leader_epoch", -1), p["committed_metadata"])
    return codes, wanted


def commit_answer(topics: Sequence[Any], codes: dict[tuple[str, int], int], by_id: bool = False) -> list[Any]:
    """The answer's topics of an OffsetCommit or TxnOffsetCommit: each partition with its code (`by_id`: each
    topic named by its id, OffsetCommit v10)."""
    return [
        {
            "name": t["name"],
            **({"topic_id": t["topic_id"]} if by_id else {}),
            "partitions": [
                {"partition_index": p["partition_index"], "error_code": codes[(t["name"], p["partition_index"])]}
                for p in t["partitions"]
            ],
        }
        for t in topics
    ]


def _fetch_group(
    ctx: KafkaContext,
    peer: Peer,
    group_id: str,
    topics: Sequence[OffsetFetchRequestTopic] | Sequence[OffsetFetchRequestTopics] | None,
    require_stable: bool = False,
) -> list[OffsetFetchResponseTopics]:
    """The answer's topics for one group, in the v8+ structs (whose keys the v1-v7 ones share; see
    offset_fetch). `topics` None means every partition with a committed offset. With `require_stable` (v7+, a
    read_committed consumer's question) a partition a transaction under way will commit an offset for answers
    UNSTABLE_OFFSET_COMMIT (the client asks again)."""
    found = _fetch_committed(ctx, peer, group_id, topics)
    if require_stable and ctx.transactions is not None:
        pending = ctx.transactions.pending_offsets(group_id)
        if pending:
            for topic in found:
                for part in topic["partitions"]:
                    if (topic["name"], part["partition_index"]) in pending:
                        part.update(_partition(part["partition_index"], None))
                        part["error_code"] = E.UnstableOffsetCommitError.code
    return found


def _fetch_committed(
    ctx: KafkaContext,
    peer: Peer,
    group_id: str,
    topics: Sequence[OffsetFetchRequestTopic] | Sequence[OffsetFetchRequestTopics] | None,
) -> list[OffsetFetchResponseTopics]:
    if topics is None:
        committed = ctx.groups.fetch_offsets(group_id)
        by_topic: dict[str, list[OffsetFetchResponsePartitions]] = {}
        for (topic, part), off in sorted(committed.items()):
            if off is not None:
                by_topic.setdefault(topic, []).append(_partition(part, off))
        return [
            {"name": topic, "partitions": parts}
            for topic, parts in by_topic.items()
            if allowed(ctx, peer, "DESCRIBE", TOPIC, topic)
        ]
    denied = {t["name"] for t in topics if not allowed(ctx, peer, "DESCRIBE", TOPIC, t["name"])}
    wanted = [(t["name"], p) for t in topics if t["name"] not in denied for p in t["partition_indexes"]]
    committed = ctx.groups.fetch_offsets(group_id, wanted)
    return [
        {
            "name": t["name"],
            "partitions": [
                _partition(p, committed.get((t["name"], p)))
                if t["name"] not in denied
                else {**_partition(p, None), "error_code": E.TopicAuthorizationFailedError.code}
                for p in t["partition_indexes"]
            ],
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


def _name_by_id(ctx: KafkaContext, topics: list[OffsetFetchResponseTopics], unknown: dict[str, uuid.UUID]) -> None:
    """OffsetFetch v10 names each topic of its answer by id; a requested id no topic has answers
    UNKNOWN_TOPIC_ID for each of its partitions."""
    for topic in topics:
        topic["topic_id"] = unknown.get(topic["name"]) or topic_id_of(ctx, topic["name"])
        if topic["name"] in unknown:
            for part in topic["partitions"]:
                part["error_code"] = E.UnknownTopicIdError.code


async def offset_fetch(ctx: KafkaContext, peer: Peer, req: KafkaRequest[OffsetFetchRequest]) -> OffsetFetchResponse:
    b = req.body
    if req.api_version >= 8:
        groups: list[OffsetFetchResponseGroup] = []
        for g in b["groups"]:
            code = coordinator_code(ctx, g["group_id"]) if g["group_id"] else E.InvalidGroupIdError.code
            if not allowed(ctx, peer, "DESCRIBE", GROUP, g["group_id"]):
                code = E.GroupAuthorizationFailedError.code
            if code == NONE and req.api_version >= 9:  # a consumer-protocol member asks with its member epoch
                code = ctx.groups.consumer.fetch_check(g["group_id"], g.get("member_id"), g.get("member_epoch", -1))
            unknown = name_topics_by_id(ctx, g["topics"]) if req.api_version >= 10 and g["topics"] else {}
            found = (
                _fetch_group(ctx, peer, g["group_id"], g["topics"], b.get("require_stable", False))
                if code == NONE
                else []
            )
            if req.api_version >= 10:
                _name_by_id(ctx, found, unknown)
            groups.append({"group_id": g["group_id"], "topics": found, "error_code": code})
        return {"throttle_time_ms": 0, "groups": groups}
    if not b["group_id"]:
        return {"throttle_time_ms": 0, "topics": [], "error_code": E.InvalidGroupIdError.code}
    refused = coordinator_code(ctx, b["group_id"])
    if not allowed(ctx, peer, "DESCRIBE", GROUP, b["group_id"]):
        refused = E.GroupAuthorizationFailedError.code
    if refused:
        return {"throttle_time_ms": 0, "topics": [], "error_code": refused}
    # v1-v7 topics and partitions have a subset of the v8+ structs' keys, of the same types (a topic is named here)
    topics = cast(
        "list[OffsetFetchResponseTopic]",
        _fetch_group(ctx, peer, b["group_id"], b["topics"], b.get("require_stable", False)),
    )
    return {"throttle_time_ms": 0, "topics": topics, "error_code": NONE}
