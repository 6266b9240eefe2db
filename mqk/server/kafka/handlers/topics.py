"""Topic admin: CreateTopics (partitions, configs, validate_only), DeleteTopics (by name or id),
CreatePartitions, DeleteRecords. One broker: a replication factor above 1 is INVALID_REPLICATION_FACTOR and a
manual assignment must name this broker only. The broker's internal topics (mqk.broker.internal) cannot be
deleted, grown or trimmed by a client: TOPIC_AUTHORIZATION_FAILED, whoever asks.

Authorization as Kafka's: creating a topic asks CREATE on the cluster or the topic, deleting it DELETE, adding
partitions ALTER, deleting records DELETE on the topic (TOPIC_AUTHORIZATION_FAILED; a topic named by an id the
principal may not DESCRIBE is UNKNOWN_TOPIC_ID). CreateTopics returns a topic's configs only to a principal that may
DESCRIBE_CONFIGS it."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mqk import errors as E
from mqk.broker import topic_config
from mqk.broker.names import KAFKA
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import (
    NONE,
    TOPIC,
    ZERO_UUID,
    allowed,
    may_create_topic,
    partition_code,
    topic_by_id,
    topic_uuid,
)
from mqk.server.kafka.handlers.configs import topic_config_entries

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
    from mqk.protocol.kafka.messages.create_partitions import (
        CreatePartitionsRequest,
        CreatePartitionsResponse,
        CreatePartitionsTopicResult,
    )
    from mqk.protocol.kafka.messages.create_topics import (
        CreateTopicsRequest,
        CreateTopicsResponse,
        CreateTopicsResponseCreatableTopicResult,
    )
    from mqk.protocol.kafka.messages.delete_records import (
        DeleteRecordsPartitionResult,
        DeleteRecordsRequest,
        DeleteRecordsResponse,
        DeleteRecordsTopicResult,
    )
    from mqk.protocol.kafka.messages.delete_topics import (
        DeleteTopicsRequest,
        DeleteTopicsResponse,
        DeleteTopicsResponseDeletableTopicResult,
    )


def request_timeout(body: Mapping[str, Any]) -> float | None:
    """A topic request's `timeout_ms` as seconds: how long the broker waits for the controller before answering
    REQUEST_TIMED_OUT (the change may still happen, as with Kafka); none given (0 or less), the broker's own."""
    timeout_ms = body.get("timeout_ms", 0)
    return timeout_ms / 1000 if timeout_ms > 0 else None


async def create_topics(ctx: KafkaContext, peer: Peer, req: KafkaRequest[CreateTopicsRequest]) -> CreateTopicsResponse:
    b = req.body
    names = [t["name"] for t in b["topics"]]
    results: list[CreateTopicsResponseCreatableTopicResult] = []
    for t in b["topics"]:
        name = t["name"]
        res: CreateTopicsResponseCreatableTopicResult = {
            "name": name,
            "topic_id": ZERO_UUID,
            "error_code": NONE,
            "error_message": None,
            "topic_config_error_code": NONE,
            "num_partitions": -1,
            "replication_factor": -1,
            "configs": None,
        }
        results.append(res)

        def fail(code: int, message: str, res: CreateTopicsResponseCreatableTopicResult = res) -> None:
            res["error_code"] = code
            res["error_message"] = message

        partitions, rf = t["num_partitions"], t["replication_factor"]
        assignments = t["assignments"]
        if names.count(name) > 1:
            fail(E.InvalidRequestError.code, f"topic {name!r} is named more than once in the request")
            continue
        if not may_create_topic(ctx, peer, name):
            fail(E.TopicAuthorizationFailedError.code, f"not authorized to create topic {name!r}")
            continue
        reason = KAFKA.error(name)
        if reason:
            fail(E.InvalidTopicError.code, reason)
            continue
        if ctx.topics.get(name) is not None:
            fail(E.TopicAlreadyExistsError.code, f"topic {name!r} already exists")
            continue
        if assignments:
            if partitions != -1 or rf != -1:
                fail(E.InvalidRequestError.code, "give either assignments or partitions/replication factor")
                continue
            if ctx.cluster is not None:
                fail(E.InvalidReplicaAssignmentError.code, "in cluster mode the controller places partitions")
                continue
            if any(a["broker_ids"] != [ctx.node_id] for a in assignments) or sorted(
                a["partition_index"] for a in assignments
            ) != list(range(len(assignments))):
                fail(E.InvalidReplicaAssignmentError.code, f"only broker {ctx.node_id} exists")
                continue
            partitions = len(assignments)
        if partitions == -1:
            partitions = ctx.config.num_partitions  # CreateTopics' default, as Kafka's num.partitions
        if partitions <= 0:
            fail(E.InvalidPartitionsError.code, f"number of partitions must be positive, not {partitions}")
            continue
        if rf == 0 or rf < -1 or (ctx.cluster is None and rf not in (-1, 1) and not assignments):
            fail(
                E.InvalidReplicationFactorError.code,
                f"replication factor {rf} is larger than the number of brokers (1)"
                if rf > 1
                else f"replication factor must be positive (or -1 for the default), not {rf}",
            )
            continue
        overrides = {c["name"]: c["value"] for c in t["configs"]}
        reason = topic_config.check_all(overrides)
        if reason:
            fail(E.InvalidConfigError.code, reason)
            continue
        config = topic_config.config_of(overrides)
        if not b["validate_only"]:
            try:
                info = await ctx.topics.create(
                    name, partitions, overrides, names=KAFKA, replication_factor=rf, timeout=request_timeout(b)
                )
            except Exception as exc:  # noqa: BLE001 - the topic's answer carries the code
                fail(E.kafka_code_for(exc), str(exc))
                continue
            res["topic_id"] = topic_uuid(info)
        res["num_partitions"] = partitions
        res["replication_factor"] = 1
        if ctx.cluster is not None and not b["validate_only"]:
            # every broker of the group a partition lives in holds it: the smallest such group is the topic's
            res["replication_factor"] = min((len(ctx.cluster.replicas(name, p)) for p in range(partitions)), default=1)
        elif ctx.cluster is not None and rf > 0:
            res["replication_factor"] = rf
        if not allowed(ctx, peer, "DESCRIBE_CONFIGS", TOPIC, name):
            res["topic_config_error_code"] = E.TopicAuthorizationFailedError.code
            continue
        res["configs"] = [
            {
                "name": c["name"],
                "value": c["value"],
                "read_only": c["read_only"],
                "config_source": c["config_source"],
                "is_sensitive": c["is_sensitive"],
            }
            for c in topic_config_entries(config, message_max_bytes=ctx.config.message_max_bytes)
        ]
    return {"throttle_time_ms": 0, "topics": results}


async def delete_topics(ctx: KafkaContext, peer: Peer, req: KafkaRequest[DeleteTopicsRequest]) -> DeleteTopicsResponse:
    b = req.body
    targets: list[tuple[str | None, uuid.UUID]] = []
    if req.api_version >= 6:
        targets = [(t["name"], t["topic_id"]) for t in b["topics"]]
    else:
        targets = [(n, ZERO_UUID) for n in b["topic_names"]]
    responses: list[DeleteTopicsResponseDeletableTopicResult] = []
    for name, topic_id in targets:
        entry: DeleteTopicsResponseDeletableTopicResult = {
            "name": name,
            "topic_id": topic_id,
            "error_code": NONE,
            "error_message": None,
        }
        responses.append(entry)
        if name is None:
            info = topic_by_id(ctx, topic_id) if topic_id != ZERO_UUID else None
            if info is not None and not allowed(ctx, peer, "DESCRIBE", TOPIC, info.topic):
                info = None
            if info is None:
                entry["error_code"] = E.UnknownTopicIdError.code
                entry["error_message"] = "unknown topic id"
                continue
            name = entry["name"] = info.topic
        else:
            info = ctx.topics.get(name)
            if info is not None:
                entry["topic_id"] = topic_uuid(info)
        if not allowed(ctx, peer, "DELETE", TOPIC, name):
            entry["error_code"] = E.TopicAuthorizationFailedError.code
            entry["error_message"] = f"not authorized to delete topic {name!r}"
            continue
        try:
            await ctx.topics.delete(name, request_timeout(b))
        except Exception as exc:  # noqa: BLE001 - the topic's answer carries the code
            entry["error_code"] = E.kafka_code_for(exc)
            entry["error_message"] = str(exc)
            continue
        ctx.producers.forget_topic(name)
        if ctx.transactions is not None:
            ctx.transactions.forget_topic(name)
        await ctx.groups.forget_topic(name)
    return {"throttle_time_ms": 0, "responses": responses}


async def create_partitions(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[CreatePartitionsRequest]
) -> CreatePartitionsResponse:
    b = req.body
    results: list[CreatePartitionsTopicResult] = []
    for t in b["topics"]:
        name, count = t["name"], t["count"]
        entry: CreatePartitionsTopicResult = {"name": name, "error_code": NONE, "error_message": None}
        results.append(entry)
        if not allowed(ctx, peer, "ALTER", TOPIC, name):
            entry["error_code"] = E.TopicAuthorizationFailedError.code
            entry["error_message"] = f"not authorized to alter topic {name!r}"
            continue
        info = ctx.topics.get(name)
        if info is None:
            entry["error_code"] = E.UnknownTopicOrPartitionError.code
            entry["error_message"] = f"unknown topic {name!r}"
            continue
        refusal = ctx.topics.client_change_refusal(name)  # (validate_only too: it would not be done)
        if refusal:
            entry["error_code"], entry["error_message"] = E.TopicAuthorizationFailedError.code, refusal
            continue
        if count <= info.queue_count:
            entry["error_code"] = E.InvalidPartitionsError.code
            entry["error_message"] = f"topic has {info.queue_count} partitions; cannot change to {count}"
            continue
        assignments = t["assignments"]
        if assignments is not None and ctx.cluster is not None:
            entry["error_code"] = E.InvalidReplicaAssignmentError.code
            entry["error_message"] = "in cluster mode the controller places partitions"
            continue
        if assignments is not None and (
            len(assignments) != count - info.queue_count or any(a["broker_ids"] != [ctx.node_id] for a in assignments)
        ):
            entry["error_code"] = E.InvalidReplicaAssignmentError.code
            entry["error_message"] = f"only broker {ctx.node_id} exists"
            continue
        if b["validate_only"]:
            continue
        try:
            await ctx.topics.add_partitions(name, count, request_timeout(b))
        except Exception as exc:  # noqa: BLE001 - the topic's answer carries the code
            entry["error_code"] = E.kafka_code_for(exc)
            entry["error_message"] = str(exc)
    return {"throttle_time_ms": 0, "results": results}


async def delete_records(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[DeleteRecordsRequest]
) -> DeleteRecordsResponse:
    store = ctx.store
    topics: list[DeleteRecordsTopicResult] = []
    for t in req.body["topics"]:
        info = ctx.topics.get(t["name"])
        parts: list[DeleteRecordsPartitionResult] = []
        denied = not allowed(ctx, peer, "DELETE", TOPIC, t["name"])
        for p in t["partitions"]:
            index = p["partition_index"]
            entry: DeleteRecordsPartitionResult = {"partition_index": index, "low_watermark": -1, "error_code": NONE}
            refused = E.TopicAuthorizationFailedError.code if denied else partition_code(ctx, t["name"], index)
            if ctx.topics.client_change_refusal(t["name"]):  # records of internal topics go by their owner's rules
                entry["error_code"] = E.TopicAuthorizationFailedError.code
            elif refused:
                entry["error_code"] = refused
            elif info is None or not 0 <= index < info.queue_count:
                entry["error_code"] = E.UnknownTopicOrPartitionError.code
            else:
                offset = p["offset"]
                try:
                    if offset == -1:  # Kafka: -1 means up to the high watermark
                        offset = store.end_offset(info.topic, index)
                    entry["low_watermark"] = await store.delete_before(info.topic, index, offset)
                except Exception as exc:  # noqa: BLE001 - the partition's answer carries the code
                    entry["error_code"] = E.kafka_code_for(exc)
            parts.append(entry)
        topics.append({"name": t["name"], "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}
