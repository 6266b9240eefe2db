"""Helpers the Kafka handlers share: topic lookup with auto-creation, topic ids, error codes, authorization.

Handlers never raise for a per-topic or per-partition problem: they answer it with the error code the API
has for it. Storage exceptions become codes only through `mqk.errors.kafka_code_for`. Topic policy (names,
auto-creation, settings) is the broker's (mqk.broker.topics); this module only turns its answers into codes.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from mqk import errors as E
from mqk.broker.names import KAFKA
from mqk.broker.security.acls import OPERATION_CODES, SUPPORTED_OPERATIONS
from mqk.broker.security.authorizer import ALLOW_ALL, Authorizer
from mqk.groups.answers import AUTHORIZED_OPS_OMITTED as AUTHORIZED_OPS_OMITTED  # (the handlers import it from here)
from mqk.server.kafka.context import KafkaContext, Peer
from mqk.store.adapter import ShardInfo

NONE = 0
ZERO_UUID = uuid.UUID(int=0)


# --- authorization (mqk.broker.security.authorizer: Kafka's resource types and operations by name) ------------

TOPIC = "TOPIC"
GROUP = "GROUP"
CLUSTER = "CLUSTER"
TRANSACTIONAL_ID = "TRANSACTIONAL_ID"
CLUSTER_NAME = "kafka-cluster"


def authorizer(ctx: KafkaContext) -> Authorizer:
    """The broker's authorizer (`ALLOW_ALL` unless ACLs are on: a hot path may skip asking when it is that)."""
    security = ctx.security
    return ALLOW_ALL if security is None else security.authorizer


def allowed(ctx: KafkaContext, peer: Peer, operation: str, resource_type: str, name: str) -> bool:
    """May the peer's principal, from its host, `operation` the resource?"""
    auth = authorizer(ctx)
    if auth is ALLOW_ALL:
        return True
    return auth.authorize(peer.principal, peer.client_host.lstrip("/"), operation, resource_type, name)


def allowed_cluster(ctx: KafkaContext, peer: Peer, operation: str) -> bool:
    return allowed(ctx, peer, operation, CLUSTER, CLUSTER_NAME)


def may_create_topic(ctx: KafkaContext, peer: Peer, name: str) -> bool:
    """CREATE on the cluster or on the topic (Kafka asks either)."""
    return allowed_cluster(ctx, peer, "CREATE") or allowed(ctx, peer, "CREATE", TOPIC, name)


def authorized_operations(ctx: KafkaContext, peer: Peer, resource_type: str, name: str) -> int:
    """Kafka's AuthorizedOperations bit field: bit n set for each operation (code n) the resource type has that the
    peer may perform on it."""
    bits = 0
    for operation in SUPPORTED_OPERATIONS[resource_type]:
        if allowed(ctx, peer, operation, resource_type, name):
            bits |= 1 << OPERATION_CODES[operation]
    return bits


def valid_topic_name(name: str | None) -> bool:
    """A name Kafka's front door may create a topic under (mqk.broker.names.KAFKA)."""
    return KAFKA.allows(name)


def topic_uuid(info: ShardInfo) -> uuid.UUID:
    return uuid.UUID(bytes=bytes(info.topic_id))


def topic_by_id(ctx: KafkaContext, topic_id: uuid.UUID) -> ShardInfo | None:
    """The topic with this id (Fetch v13+, Metadata v12+ and DeleteTopics v6+ may name topics by id)."""
    return ctx.topics.by_id(topic_id.bytes)


def name_topics_by_id(ctx: KafkaContext, topics: Sequence[Any]) -> dict[str, uuid.UUID]:
    """Requests of topic-id versions (Produce v13, OffsetCommit and OffsetFetch v10) name topics by `topic_id`:
    each topic entry gets the `name` of its id's topic, or a name no topic can have, which the returned dict maps
    to the id asked for (the handler answers those UNKNOWN_TOPIC_ID)."""
    unknown = {}
    for t in topics:
        info = topic_by_id(ctx, t["topic_id"]) if t["topic_id"] != ZERO_UUID else None
        if info is None:
            t["name"] = f"<unknown topic id {t['topic_id']}>"
            unknown[t["name"]] = t["topic_id"]
        else:
            t["name"] = info.topic
    return unknown


def topic_id_of(ctx: KafkaContext, name: str) -> uuid.UUID:
    """The id of topic `name` (the zero UUID for an unknown one)."""
    info = ctx.topics.get(name)
    return uuid.UUID(bytes=info.topic_id) if info is not None else ZERO_UUID


async def get_or_create_topic(
    ctx: KafkaContext, name: str, allow_create: bool = True, peer: Peer | None = None
) -> tuple[int, ShardInfo | None]:
    """(error code, topic). Creates a missing topic when the broker's auto-creation policy and `allow_create`
    (Metadata's allow_auto_topic_creation) allow it, and (when `peer` is given) the peer may CREATE it, on the
    cluster or on the topic (TOPIC_AUTHORIZATION_FAILED otherwise, as Kafka answers)."""
    info = ctx.topics.get(name)
    if info is not None:
        return NONE, info
    if peer is not None and not may_create_topic(ctx, peer, name):
        return E.TopicAuthorizationFailedError.code, None
    try:
        return NONE, await ctx.topics.auto_create(name, names=KAFKA, client_allows=allow_create)
    except Exception as exc:  # noqa: BLE001 - the client sees the code (the registry logs a failed creation)
        return E.kafka_code_for(exc), None


# --- cluster mode: who serves what ---------------------------------------------------------------------------


def partition_code(ctx: KafkaContext, topic: str, partition: int) -> int:
    """NONE if this broker serves the partition's data (always, on a broker that is the whole cluster), else the
    code that sends the client elsewhere: NOT_LEADER_OR_FOLLOWER (the partition exists, another broker leads it or
    none does now), UNKNOWN_TOPIC_OR_PARTITION (the cluster has no such partition). A topic local by nature (the
    timer's) is this broker's own."""
    cluster = ctx.cluster
    if cluster is None or cluster.leads(topic, partition):
        return NONE
    record = cluster.topic(topic)
    if record is None:
        return NONE if ctx.topics.is_local(topic) else E.UnknownTopicOrPartitionError.code
    if not 0 <= partition < len(record.partitions):
        return E.UnknownTopicOrPartitionError.code
    return E.NotLeaderOrFollowerError.code


def leader_epoch(ctx: KafkaContext, topic: str, partition: int) -> int:
    """The partition's leader epoch as Metadata and the offset APIs report it (0 on a broker on its own: one
    replica, no elections)."""
    cluster = ctx.cluster
    return 0 if cluster is None else cluster.leader(topic, partition)[1]


def epoch_code(ctx: KafkaContext, topic: str, partition: int, current: int) -> int:
    """A request's `current_leader_epoch` against ours (KIP-320): FENCED_LEADER_EPOCH when the client's is older,
    UNKNOWN_LEADER_EPOCH when newer (this broker has not caught up), NONE when equal or not given (-1)."""
    if current < 0:
        return NONE
    ours = leader_epoch(ctx, topic, partition)
    if current < ours:
        return E.FencedLeaderEpochError.code
    if current > ours:
        return E.UnknownLeaderEpochError.code
    return NONE


def coordinator_code(ctx: KafkaContext, group_id: str) -> int:
    """NONE if this broker coordinates `group_id` (always, on a broker on its own), else NOT_COORDINATOR;
    COORDINATOR_LOAD_IN_PROGRESS while the group's committed offsets are not loaded from the log yet."""
    cluster = ctx.cluster
    if cluster is None:
        return NONE
    if not cluster.coordinates(group_id):
        return E.NotCoordinatorError.code
    return E.CoordinatorLoadInProgressError.code if cluster.loading(group_id) else NONE
