"""Helpers the Kafka handlers share: topic lookup with auto-creation, topic ids, error codes and messages.

Handlers never raise for a per-topic or per-partition problem: they answer it with the error code the API
has for it. Storage exceptions become codes only through `mqk.errors.kafka_code_for`.
"""
from __future__ import annotations

import logging
import re
import uuid
from typing import TYPE_CHECKING

from mqk import errors as E
from mqk.store.adapter import ShardInfo

if TYPE_CHECKING:
    from mqk.server.kafka.server import KafkaServer

log = logging.getLogger("mqk.kafka")

NONE = 0
ZERO_UUID = uuid.UUID(int=0)
#: Kafka's "authorized operations were not requested" sentinel
AUTHORIZED_OPS_OMITTED = -(1 << 31)
_TOPIC_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def valid_topic_name(name: str | None) -> bool:
    return bool(name) and name not in (".", "..") and bool(_TOPIC_RE.match(name))  # type: ignore[arg-type]


def topic_uuid(info: ShardInfo) -> uuid.UUID:
    return uuid.UUID(bytes=bytes(info.topic_id))


def topic_by_id(server: "KafkaServer", topic_id: uuid.UUID) -> ShardInfo | None:
    """The topic with this id. Fetch v13+ names every topic by id, so the id -> name map is cached on the
    server and rebuilt only when a lookup misses (a topic created or recreated since)."""
    wanted = topic_id.bytes
    names: dict[bytes, str] = server.topic_names_by_id
    name = names.get(wanted)
    if name is not None:
        info = server.store.topic(name)
        if info is not None and bytes(info.topic_id) == wanted:
            return info
    names.clear()
    for info in server.store.topics().values():
        names[bytes(info.topic_id)] = info.topic
    name = names.get(wanted)
    return server.store.topic(name) if name is not None else None


async def get_or_create_topic(
    server: "KafkaServer", name: str, allow_create: bool = True
) -> tuple[int, ShardInfo | None]:
    """(error code, topic). Creates the topic with the broker defaults when auto-creation is on and allowed."""
    info = server.store.topic(name)
    if info is not None:
        return NONE, info
    if not valid_topic_name(name):
        return E.InvalidTopicError.code, None
    if not (allow_create and server.config.auto_create_topics):
        return E.UnknownTopicOrPartitionError.code, None
    try:
        info = await server.store.create_topic(name, server.config.num_partitions)
        log.info("auto-created topic %s with %d partition(s)", name, info.queue_count)
    except E.ShardExists:
        info = server.store.topic(name)  # created concurrently by another request
    except Exception as exc:  # noqa: BLE001 - the client sees the code, the log the reason
        log.warning("auto-creating topic %s failed: %s", name, exc)
        return E.kafka_code_for(exc), None
    return (NONE, info) if info is not None else (E.UnknownTopicOrPartitionError.code, None)


def code_of(exc: BaseException) -> int:
    return E.kafka_code_for(exc)
