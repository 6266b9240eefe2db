"""The answer shapes that the KIP-848 consumer groups (mqk.groups.consumer) and the KIP-932 share groups
(mqk.groups.share) have in common: a heartbeat's answer and a group's description. Kafka's two heartbeat APIs and
two describe APIs answer with the same fields, so the state machines and their handlers build them here, once."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

NONE = 0
FENCED_MEMBER_EPOCH = 110
#: authorized_operations when the request did not ask for them (Kafka's INT32 minimum)
AUTHORIZED_OPS_OMITTED = -(1 << 31)


def heartbeat_answer(
    member_id: str | None, member_epoch: int, heartbeat_interval_ms: int, code: int = NONE, message: str | None = None
) -> dict[str, Any]:
    """A ConsumerGroupHeartbeat / ShareGroupHeartbeat answer with no assignment (the caller adds one)."""
    return {
        "throttle_time_ms": 0,
        "error_code": code,
        "error_message": message,
        "member_id": member_id or None,
        "member_epoch": member_epoch,
        "heartbeat_interval_ms": heartbeat_interval_ms,
        "assignment": None,
    }


def described_partitions(
    parts: dict[uuid.UUID, frozenset[int]], topic_name: Callable[[uuid.UUID], str | None]
) -> dict[str, Any]:
    """A member's assignment as the describe APIs give it: by topic id and name, partitions sorted."""
    return {
        "topic_partitions": [
            {"topic_id": t, "topic_name": topic_name(t) or "", "partitions": sorted(ps)}
            for t, ps in sorted(parts.items(), key=str)
        ]
    }


def described_group(
    group_id: str,
    *,
    state: str,
    group_epoch: int,
    assignment_epoch: int,
    assignor: str,
    members: Iterable[dict[str, Any]] = (),
    code: int = NONE,
    message: str | None = None,
) -> dict[str, Any]:
    """One group of a ConsumerGroupDescribe / ShareGroupDescribe answer (an error code for a group not described)."""
    return {
        "error_code": code,
        "error_message": message,
        "group_id": group_id,
        "group_state": state,
        "group_epoch": group_epoch,
        "assignment_epoch": assignment_epoch,
        "assignor_name": assignor,
        "members": list(members),
        "authorized_operations": AUTHORIZED_OPS_OMITTED,
    }


def undescribed_group(group_id: str, code: int, message: str | None, state: str = "") -> dict[str, Any]:
    """A group the describe APIs could not describe: its error, and nothing else."""
    return described_group(
        group_id, state=state, group_epoch=-1, assignment_epoch=-1, assignor="", code=code, message=message
    )


__all__ = [
    "AUTHORIZED_OPS_OMITTED",
    "FENCED_MEMBER_EPOCH",
    "NONE",
    "described_group",
    "described_partitions",
    "heartbeat_answer",
    "undescribed_group",
]
