"""Helpers the Kafka handlers share: topic lookup with auto-creation, topic ids, error codes.

Handlers never raise for a per-topic or per-partition problem: they answer it with the error code the API
has for it. Storage exceptions become codes only through `mqk.errors.kafka_code_for`. Topic policy (names,
auto-creation, settings) is the broker's (mqk.broker.topics); this module only turns its answers into codes.
"""

from __future__ import annotations

import uuid

from mqk import errors as E
from mqk.broker.names import KAFKA
from mqk.server.kafka.context import KafkaContext
from mqk.store.adapter import ShardInfo

NONE = 0
ZERO_UUID = uuid.UUID(int=0)
#: Kafka's "authorized operations were not requested" sentinel
AUTHORIZED_OPS_OMITTED = -(1 << 31)


def valid_topic_name(name: str | None) -> bool:
    """A name Kafka's front door may create a topic under (mqk.broker.names.KAFKA)."""
    return KAFKA.allows(name)


def topic_uuid(info: ShardInfo) -> uuid.UUID:
    return uuid.UUID(bytes=bytes(info.topic_id))


def topic_by_id(ctx: KafkaContext, topic_id: uuid.UUID) -> ShardInfo | None:
    """The topic with this id (Fetch v13+, Metadata v12+ and DeleteTopics v6+ may name topics by id)."""
    return ctx.topics.by_id(topic_id.bytes)


async def get_or_create_topic(ctx: KafkaContext, name: str, allow_create: bool = True) -> tuple[int, ShardInfo | None]:
    """(error code, topic). Creates a missing topic when the broker's auto-creation policy and `allow_create`
    (Metadata's allow_auto_topic_creation) allow it."""
    info = ctx.store.topic(name)
    if info is not None:
        return NONE, info
    try:
        return NONE, await ctx.topics.auto_create(name, names=KAFKA, client_allows=allow_create)
    except Exception as exc:  # noqa: BLE001 - the client sees the code (the registry logs a failed creation)
        return E.kafka_code_for(exc), None
