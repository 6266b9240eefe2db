"""Metadata: this broker is the whole cluster (node id, bound address, controller), every partition's leader.

Topics are auto-created (broker config `auto_create_topics` and, from v4, the request's
`allow_auto_topic_creation`). A null topic list (v1+) or an empty one in v0 means every topic; v12+ may name a
topic by id (a v10-11 topic without a name gets INVALID_REQUEST, as in Kafka). The leader epoch reported is 0 and
never changes: there is one replica and no elections. `is_internal` is the broker's (mqk.broker.internal): the
timer's and RocketMQ's transaction topics."""

from __future__ import annotations

import uuid

from mqk import errors as E
from mqk.broker.internal import is_internal
from mqk.protocol.kafka.messages.metadata import MetadataRequest, MetadataResponse, MetadataResponseTopic
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import (
    AUTHORIZED_OPS_OMITTED,
    NONE,
    ZERO_UUID,
    get_or_create_topic,
    topic_by_id,
    topic_uuid,
)
from mqk.store.adapter import ShardInfo

LEADER_EPOCH = 0


def topic_entry(ctx: KafkaContext, info: ShardInfo) -> MetadataResponseTopic:
    node = ctx.node_id
    return {
        "error_code": NONE,
        "name": info.topic,
        "topic_id": topic_uuid(info),
        "is_internal": is_internal(info.topic),
        "partitions": [
            {
                "error_code": NONE,
                "partition_index": p,
                "leader_id": node,
                "leader_epoch": LEADER_EPOCH,
                "replica_nodes": [node],
                "isr_nodes": [node],
                "offline_replicas": [],
            }
            for p in range(info.queue_count)
        ],
        "topic_authorized_operations": AUTHORIZED_OPS_OMITTED,
    }


def _error_entry(name: str | None, topic_id: uuid.UUID | None, code: int) -> MetadataResponseTopic:
    return {
        "error_code": code,
        "name": name,
        "topic_id": topic_id or ZERO_UUID,
        "is_internal": False,
        "partitions": [],
        "topic_authorized_operations": AUTHORIZED_OPS_OMITTED,
    }


async def handle(ctx: KafkaContext, peer: Peer, req: KafkaRequest[MetadataRequest]) -> MetadataResponse:
    body = req.body
    requested = body.get("topics")
    allow_create = body.get("allow_auto_topic_creation", True)
    topics: list[MetadataResponseTopic]
    if requested is None or (req.api_version == 0 and not requested):
        topics = [topic_entry(ctx, info) for info in ctx.topics.all().values()]
    else:
        topics = []
        for t in requested:
            name, topic_id = t.get("name"), t.get("topic_id")
            if name is None:
                if req.api_version < 12:
                    # v10-11 carry a topic_id field but name topics only by name (their answer's name cannot be
                    # null): refused as Kafka refuses it
                    topics.append(_error_entry("", topic_id, E.InvalidRequestError.code))
                    continue
                info = topic_by_id(ctx, topic_id) if topic_id and topic_id != ZERO_UUID else None
                topics.append(
                    topic_entry(ctx, info) if info else _error_entry(None, topic_id, E.UnknownTopicIdError.code)
                )
                continue
            code, info = await get_or_create_topic(ctx, name, allow_create)
            topics.append(topic_entry(ctx, info) if info else _error_entry(name, None, code))
    return {
        "throttle_time_ms": 0,
        "brokers": [{"node_id": ctx.node_id, "host": ctx.host, "port": ctx.port, "rack": None}],
        "cluster_id": ctx.cluster_id,
        "controller_id": ctx.node_id,
        "topics": topics,
        "cluster_authorized_operations": AUTHORIZED_OPS_OMITTED,
        "error_code": NONE,
    }
