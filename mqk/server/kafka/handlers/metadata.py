"""Metadata: the brokers, the controller, and every partition's leader, replicas and in-sync replicas.

On a broker on its own, it is the whole cluster (its node id and advertised address, the controller, every
partition's only replica, leader epoch 0). In cluster mode the answer comes from the cluster's metadata view
(mqk.broker.cluster): every live broker with its advertised Kafka listener, the elected controller, and per
partition the master of the group it is placed in as leader (epoch: the group's master epoch), the group's members
as replicas; a partition whose group has no master now answers LEADER_NOT_AVAILABLE (retriable).

Topics are auto-created (broker config `auto_create_topics` and, from v4, the request's
`allow_auto_topic_creation`). A null topic list (v1+) or an empty one in v0 means every topic; v12+ may name a
topic by id (a v10-11 topic without a name gets INVALID_REQUEST, as in Kafka). `is_internal` is the broker's list
(mqk.broker.internal). A request for every topic leaves out the names Kafka's alphabet cannot spell (RocketMQ's
`%RETRY%group`, `%DLQ%group`, `ns%topic`): a Kafka client could not have made them, and tools that list topics
would trip over them; asked for by name (or id) they are answered like any other.

Authorization as Kafka's: a listing of every topic leaves out the topics the principal may not DESCRIBE; a topic
asked for by name that it may not DESCRIBE is answered TOPIC_AUTHORIZATION_FAILED (by id: UNKNOWN_TOPIC_ID, saying
nothing of its existence); a missing topic is auto-created only with CREATE on the cluster or the topic. The
authorized operations are filled in when the request asks for them (v8+).

DescribeTopicPartitions (Kafka 4's admin tools) answers from the same partition entries, in pages."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from mqk import errors as E
from mqk.broker.internal import is_internal, listed_to_kafka
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import (
    AUTHORIZED_OPS_OMITTED,
    CLUSTER,
    CLUSTER_NAME,
    NONE,
    TOPIC,
    ZERO_UUID,
    allowed,
    authorized_operations,
    get_or_create_topic,
    topic_by_id,
    topic_uuid,
)
from mqk.store.adapter import ShardInfo

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
    from mqk.protocol.kafka.messages.describe_topic_partitions import (
        DescribeTopicPartitionsRequest,
        DescribeTopicPartitionsResponse,
        DescribeTopicPartitionsResponseCursor,
        DescribeTopicPartitionsResponseTopic,
    )
    from mqk.protocol.kafka.messages.metadata import (
        MetadataRequest,
        MetadataResponse,
        MetadataResponseBroker,
        MetadataResponsePartition,
        MetadataResponseTopic,
    )

LEADER_EPOCH = 0


def topic_entry(ctx: KafkaContext, info: ShardInfo) -> MetadataResponseTopic:
    node = ctx.node_id
    if ctx.cluster is not None:
        return _cluster_topic_entry(ctx, info)
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


def _cluster_topic_entry(ctx: KafkaContext, info: ShardInfo) -> MetadataResponseTopic:
    cluster = ctx.cluster
    assert cluster is not None
    local = cluster.topic(info.topic) is None  # a topic local by nature (the timer's): this broker's own
    partitions: list[MetadataResponsePartition] = []
    for p in range(info.queue_count):
        if local:
            leader, epoch, replicas = ctx.node_id, 0, [ctx.node_id]
        else:
            (leader, epoch), replicas = cluster.leader(info.topic, p), cluster.replicas(info.topic, p)
        partitions.append(
            {
                "error_code": NONE if leader >= 0 else E.LeaderNotAvailableError.code,
                "partition_index": p,
                "leader_id": leader,
                "leader_epoch": epoch,
                "replica_nodes": replicas,
                "isr_nodes": (cluster.isr(info.topic, p) if not local else [leader]) if leader >= 0 else [],
                "offline_replicas": [n for n in replicas if n != leader and cluster.view.broker(n) is None],
            }
        )
    return {
        "error_code": NONE,
        "name": info.topic,
        "topic_id": topic_uuid(info),
        "is_internal": is_internal(info.topic),
        "partitions": partitions,
        "topic_authorized_operations": AUTHORIZED_OPS_OMITTED,
    }


def brokers_and_controller(ctx: KafkaContext, peer: Peer) -> tuple[list[MetadataResponseBroker], int]:
    """The live brokers with their advertised address on the listener `peer` came in through (Kafka's rule: a
    broker without a listener of that name is left out), and the node id admin clients send controller requests
    to."""
    cluster = ctx.cluster
    if cluster is None:
        host, port = peer.advertised
        return [{"node_id": ctx.node_id, "host": host, "port": port, "rack": ctx.config.broker_rack}], ctx.node_id
    brokers: list[MetadataResponseBroker] = []
    key = peer.listener.key
    for record in cluster.brokers():
        address = peer.advertised if record.node_id == ctx.node_id else record.address(key)
        if address is not None:
            brokers.append({"node_id": record.node_id, "host": address[0], "port": address[1], "rack": record.rack})
    # Any broker takes admin writes (it forwards them to the etcd controller), so the controller a client is
    # told of is the elected one when listed, else this broker: never -1 while one serves, for librdkafka's
    # admin client waits for a controller until its request times out rather than asking again (seen when the
    # view had not yet caught up with an election at start-up). KRaft brokers likewise name any live broker.
    listed = [b["node_id"] for b in brokers]
    controller = cluster.controller_id()
    if controller not in listed:
        controller = ctx.node_id if ctx.node_id in listed else (listed[0] if listed else -1)
    return brokers, controller


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
        topics = [
            topic_entry(ctx, info)
            for name, info in ctx.topics.all().items()
            if listed_to_kafka(name) and allowed(ctx, peer, "DESCRIBE", TOPIC, info.topic)
        ]
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
                if info is not None and not allowed(ctx, peer, "DESCRIBE", TOPIC, info.topic):
                    info = None
                topics.append(
                    topic_entry(ctx, info) if info else _error_entry(None, topic_id, E.UnknownTopicIdError.code)
                )
                continue
            if not allowed(ctx, peer, "DESCRIBE", TOPIC, name):
                topics.append(_error_entry(name, None, E.TopicAuthorizationFailedError.code))
                continue
            code, info = await get_or_create_topic(ctx, name, allow_create, peer)
            topics.append(topic_entry(ctx, info) if info else _error_entry(name, None, code))
    if body.get("include_topic_authorized_operations"):
        for topic in topics:
            if topic["error_code"] == NONE and topic["name"]:
                topic["topic_authorized_operations"] = authorized_operations(ctx, peer, TOPIC, topic["name"])
    cluster_ops = AUTHORIZED_OPS_OMITTED
    if body.get("include_cluster_authorized_operations"):
        cluster_ops = authorized_operations(ctx, peer, CLUSTER, CLUSTER_NAME)
    brokers, controller = brokers_and_controller(ctx, peer)
    return {
        "throttle_time_ms": 0,
        "brokers": brokers,
        "cluster_id": ctx.cluster_id,
        "controller_id": controller,
        "topics": topics,
        "cluster_authorized_operations": cluster_ops,
        "error_code": NONE,
    }


#: Kafka's `max.request.partition.size.limit`: the most partitions one DescribeTopicPartitions answer holds
MAX_PARTITIONS_PER_ANSWER = 2000


async def describe_topic_partitions(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[DescribeTopicPartitionsRequest]
) -> DescribeTopicPartitionsResponse:
    """DescribeTopicPartitions (KIP-966; what Kafka 4's admin tools describe topics with): the topics asked for, or
    every topic the principal may DESCRIBE, in name order, from the request's cursor on, with at most
    `response_partition_limit` partitions (capped at MAX_PARTITIONS_PER_ANSWER); `next_cursor` names the partition
    the next request starts at when more are left. Never auto-creates; a topic asked for that does not exist is
    UNKNOWN_TOPIC_OR_PARTITION, one the principal may not DESCRIBE TOPIC_AUTHORIZATION_FAILED. No partition has an
    eligible-leader set here (empty lists)."""
    body = req.body
    limit = min(max(body["response_partition_limit"], 1), MAX_PARTITIONS_PER_ANSWER)
    cursor = body.get("cursor")
    start_name, start_partition = (cursor["topic_name"], cursor["partition_index"]) if cursor else ("", 0)
    if body["topics"]:
        names = sorted({t["name"] for t in body["topics"]})
    else:
        names = sorted(
            name
            for name, info in ctx.topics.all().items()
            if listed_to_kafka(name) and allowed(ctx, peer, "DESCRIBE", TOPIC, info.topic)
        )
    topics: list[DescribeTopicPartitionsResponseTopic] = []
    next_cursor: DescribeTopicPartitionsResponseCursor | None = None
    left = limit
    for name in names:
        if name < start_name:
            continue
        first = start_partition if name == start_name else 0
        info = ctx.topics.get(name)
        if not allowed(ctx, peer, "DESCRIBE", TOPIC, name) or info is None:
            code = E.UnknownTopicOrPartitionError.code if info is None else E.TopicAuthorizationFailedError.code
            topics.append(
                {
                    "error_code": code,
                    "name": name,
                    "topic_id": ZERO_UUID,
                    "is_internal": False,
                    "partitions": [],
                    "topic_authorized_operations": AUTHORIZED_OPS_OMITTED,
                }
            )
            continue
        if left == 0:
            next_cursor = {"topic_name": name, "partition_index": first}
            break
        entry = topic_entry(ctx, info)
        partitions = entry["partitions"][first : first + left]
        left -= len(partitions)
        topics.append(
            {
                "error_code": NONE,
                "name": name,
                "topic_id": entry["topic_id"],
                "is_internal": entry["is_internal"],
                "partitions": [
                    {**p, "eligible_leader_replicas": [], "last_known_elr": []}  # type: ignore[typeddict-item]
                    for p in partitions
                ],
                "topic_authorized_operations": authorized_operations(ctx, peer, TOPIC, name),
            }
        )
        if first + len(partitions) < info.queue_count:
            next_cursor = {"topic_name": name, "partition_index": first + len(partitions)}
            break
    return {"throttle_time_ms": 0, "topics": topics, "next_cursor": next_cursor}
