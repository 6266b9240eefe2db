"""Topic admin: CreateTopics (partitions, configs, validate_only), DeleteTopics (by name or id),
CreatePartitions, DeleteRecords. One broker: a replication factor above 1 is INVALID_REPLICATION_FACTOR and a
manual assignment must name this broker only."""

from __future__ import annotations

import uuid

from mqk import errors as E
from mqk.broker import topic_config
from mqk.broker.names import KAFKA
from mqk.protocol.kafka.codec import Request
from mqk.server.kafka.context import KafkaContext, Peer
from mqk.server.kafka.handlers.common import NONE, ZERO_UUID, topic_by_id, topic_uuid
from mqk.server.kafka.handlers.configs import topic_config_entries


async def create_topics(ctx: KafkaContext, peer: Peer, req: Request) -> dict:
    b = req.body
    names = [t["name"] for t in b["topics"]]
    results = []
    for t in b["topics"]:
        name = t["name"]
        res = {
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

        def fail(code: int, message: str, res=res) -> None:
            res.update(error_code=code, error_message=message)

        partitions, rf = t["num_partitions"], t["replication_factor"]
        assignments = t["assignments"]
        if names.count(name) > 1:
            fail(E.InvalidRequestError.code, f"topic {name!r} is named more than once in the request")
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
        if rf not in (-1, 1) and not assignments:
            fail(
                E.InvalidReplicationFactorError.code,
                f"replication factor {rf} is larger than the number of brokers (1)",
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
                info = await ctx.topics.create(name, partitions, overrides, names=KAFKA)
            except Exception as exc:  # noqa: BLE001
                fail(E.kafka_code_for(exc), str(exc))
                continue
            res["topic_id"] = topic_uuid(info)
        res.update(
            num_partitions=partitions,
            replication_factor=1,
            configs=[
                {
                    "name": c["name"],
                    "value": c["value"],
                    "read_only": c["read_only"],
                    "config_source": c["config_source"],
                    "is_sensitive": c["is_sensitive"],
                }
                for c in topic_config_entries(config)
            ],
        )
    return {"throttle_time_ms": 0, "topics": results}


async def delete_topics(ctx: KafkaContext, peer: Peer, req: Request) -> dict:
    b = req.body
    targets: list[tuple[str | None, uuid.UUID]] = []
    if req.api_version >= 6:
        targets = [(t["name"], t["topic_id"]) for t in b["topics"]]
    else:
        targets = [(n, ZERO_UUID) for n in b["topic_names"]]
    responses = []
    for name, topic_id in targets:
        entry = {"name": name, "topic_id": topic_id, "error_code": NONE, "error_message": None}
        responses.append(entry)
        if name is None:
            info = topic_by_id(ctx, topic_id) if topic_id != ZERO_UUID else None
            if info is None:
                entry.update(error_code=E.UnknownTopicIdError.code, error_message="unknown topic id")
                continue
            name = entry["name"] = info.topic
        else:
            info = ctx.topics.get(name)
            if info is not None:
                entry["topic_id"] = topic_uuid(info)
        try:
            await ctx.topics.delete(name)
        except Exception as exc:  # noqa: BLE001
            entry.update(error_code=E.kafka_code_for(exc), error_message=str(exc))
            continue
        ctx.producers.forget_topic(name)
        await ctx.groups.forget_topic(name)
    return {"throttle_time_ms": 0, "responses": responses}


async def create_partitions(ctx: KafkaContext, peer: Peer, req: Request) -> dict:
    b = req.body
    results = []
    for t in b["topics"]:
        name, count = t["name"], t["count"]
        entry = {"name": name, "error_code": NONE, "error_message": None}
        results.append(entry)
        info = ctx.topics.get(name)
        if info is None:
            entry.update(error_code=E.UnknownTopicOrPartitionError.code, error_message=f"unknown topic {name!r}")
            continue
        if count <= info.queue_count:
            entry.update(
                error_code=E.InvalidPartitionsError.code,
                error_message=f"topic has {info.queue_count} partitions; cannot change to {count}",
            )
            continue
        assignments = t["assignments"]
        if assignments is not None and (
            len(assignments) != count - info.queue_count or any(a["broker_ids"] != [ctx.node_id] for a in assignments)
        ):
            entry.update(
                error_code=E.InvalidReplicaAssignmentError.code, error_message=f"only broker {ctx.node_id} exists"
            )
            continue
        if b["validate_only"]:
            continue
        try:
            await ctx.topics.add_partitions(name, count)
        except Exception as exc:  # noqa: BLE001
            entry.update(error_code=E.kafka_code_for(exc), error_message=str(exc))
    return {"throttle_time_ms": 0, "results": results}


async def delete_records(ctx: KafkaContext, peer: Peer, req: Request) -> dict:
    store = ctx.store
    topics = []
    for t in req.body["topics"]:
        info = ctx.topics.get(t["name"])
        parts = []
        for p in t["partitions"]:
            index = p["partition_index"]
            entry = {"partition_index": index, "low_watermark": -1, "error_code": NONE}
            if info is None or not 0 <= index < info.queue_count:
                entry["error_code"] = E.UnknownTopicOrPartitionError.code
            else:
                offset = p["offset"]
                try:
                    if offset == -1:  # Kafka: -1 means up to the high watermark
                        offset = store.end_offset(info.topic, index)
                    entry["low_watermark"] = await store.delete_before(info.topic, index, offset)
                except Exception as exc:  # noqa: BLE001
                    entry["error_code"] = E.kafka_code_for(exc)
            parts.append(entry)
        topics.append({"name": t["name"], "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}
