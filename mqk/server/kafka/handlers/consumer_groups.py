"""The KIP-848 consumer group protocol's APIs: ConsumerGroupHeartbeat and ConsumerGroupDescribe. Translation only:
the state machine is `mqk.groups.consumer.ConsumerGroups` (ctx.groups.consumer); the codecs are
mqk.protocol.kafka.newer's (plain dicts with Kafka's snake_case names, durations in milliseconds).

As for the classic APIs: the group's coordinator answers (NOT_COORDINATOR elsewhere in cluster mode), a heartbeat
needs READ on the group (and the subscription DESCRIBE on the topics it names, as Kafka checks), a describe DESCRIBE.
A heartbeat for a classic group with members answers GROUP_ID_NOT_FOUND, as Kafka's coordinator does when it
cannot convert the group."""

from __future__ import annotations

from typing import Any

from mqk import errors as E
from mqk.groups.answers import heartbeat_answer, undescribed_group
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import (
    GROUP,
    NONE,
    TOPIC,
    allowed,
    authorized_operations,
    coordinator_code,
)


async def consumer_group_heartbeat(ctx: KafkaContext, peer: Peer, req: KafkaRequest[dict[str, Any]]) -> dict[str, Any]:
    b = req.body
    group_id = b["group_id"]

    def refused(code: int, message: str | None = None) -> dict[str, Any]:
        return heartbeat_answer(b["member_id"], b["member_epoch"], 0, code, message)

    if not allowed(ctx, peer, "READ", GROUP, group_id):
        return refused(E.GroupAuthorizationFailedError.code)
    names = b.get("subscribed_topic_names") or ()
    denied = [t for t in names if not allowed(ctx, peer, "DESCRIBE", TOPIC, t)]
    if denied:
        return refused(E.TopicAuthorizationFailedError.code, f"not authorized to describe topics {denied}")
    code = coordinator_code(ctx, group_id)
    if code:
        return refused(code)
    if ctx.groups.classic_members(group_id):
        return refused(E.GroupIdNotFoundError.code, f"group {group_id!r} is a classic group with members")
    return ctx.groups.consumer.heartbeat(b, req.api_version, req.client_id or "", peer.client_host)


async def consumer_group_describe(ctx: KafkaContext, peer: Peer, req: KafkaRequest[dict[str, Any]]) -> dict[str, Any]:
    b = req.body
    names = {bytes(info.topic_id): name for name, info in ctx.topics.all().items()}
    out = []
    for group_id in b["group_ids"]:
        code = NONE if allowed(ctx, peer, "DESCRIBE", GROUP, group_id) else E.GroupAuthorizationFailedError.code
        code = code or coordinator_code(ctx, group_id)
        described = None if code else ctx.groups.consumer.describe(group_id, lambda t: names.get(t.bytes))
        if described is None:
            code = code or E.GroupIdNotFoundError.code
            message = f"group {group_id!r} is not a consumer group" if code == E.GroupIdNotFoundError.code else None
            out.append(undescribed_group(group_id, code, message))
            continue
        if b.get("include_authorized_operations"):
            described["authorized_operations"] = authorized_operations(ctx, peer, GROUP, group_id)
        if req.api_version < 1:
            for member in described["members"]:
                member.pop("member_type", None)
        out.append(described)
    return {"throttle_time_ms": 0, "groups": out}
