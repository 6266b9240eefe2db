"""Consumer-group APIs (classic protocol; ListGroups, DescribeGroups and DeleteGroups also show the KIP-848 groups of
handlers/consumer_groups.py): FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
DescribeGroups, ListGroups, DeleteGroups, OffsetDelete. Translation only: the state machine is
`mqk.groups.coordinator.GroupCoordinator` (ctx.groups).

Cluster mode: a group's coordinator is the leader of its partition of the offsets topic (Kafka's rule: the group
id's hash modulo that topic's partition count), which FindCoordinator names (creating the offsets topic on first use,
as Kafka does); every other group API sent to another broker answers NOT_COORDINATOR, and ListGroups lists the
groups this broker coordinates (admin clients ask every broker).

Authorization as Kafka's (GROUP_AUTHORIZATION_FAILED): FindCoordinator asks DESCRIBE on the group; JoinGroup,
SyncGroup, Heartbeat and LeaveGroup READ; DescribeGroups DESCRIBE (and fills the authorized operations when asked);
DeleteGroups and OffsetDelete DELETE (OffsetDelete also READ on each topic: TOPIC_AUTHORIZATION_FAILED); ListGroups
lists every group with DESCRIBE on the cluster, else the groups the principal may DESCRIBE."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqk import errors as E
from mqk.groups.coordinator import DEAD
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import (
    AUTHORIZED_OPS_OMITTED,
    GROUP,
    NONE,
    TOPIC,
    TRANSACTIONAL_ID,
    allowed,
    allowed_cluster,
    authorized_operations,
    coordinator_code,
)

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
    from mqk.protocol.kafka.messages.delete_groups import (
        DeleteGroupsRequest,
        DeleteGroupsResponse,
        DeleteGroupsResponseDeletableGroupResult,
    )
    from mqk.protocol.kafka.messages.describe_groups import (
        DescribeGroupsRequest,
        DescribeGroupsResponse,
        DescribeGroupsResponseDescribedGroup,
    )
    from mqk.protocol.kafka.messages.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
    from mqk.protocol.kafka.messages.heartbeat import HeartbeatRequest, HeartbeatResponse
    from mqk.protocol.kafka.messages.join_group import JoinGroupRequest, JoinGroupResponse
    from mqk.protocol.kafka.messages.leave_group import LeaveGroupRequest, LeaveGroupResponse
    from mqk.protocol.kafka.messages.list_groups import ListGroupsRequest, ListGroupsResponse
    from mqk.protocol.kafka.messages.offset_delete import (
        OffsetDeleteRequest,
        OffsetDeleteResponse,
        OffsetDeleteResponseTopic,
    )
    from mqk.protocol.kafka.messages.sync_group import SyncGroupRequest, SyncGroupResponse

GROUP_KEY, TRANSACTION_KEY = 0, 1


async def find_coordinator(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[FindCoordinatorRequest]
) -> FindCoordinatorResponse:
    body = req.body
    key_type = body.get("key_type", GROUP_KEY)
    keys = body["coordinator_keys"] if req.api_version >= 4 else [body["key"]]
    found = [await _coordinator(ctx, peer, key, key_type) for key in keys]
    if req.api_version >= 4:
        return {
            "throttle_time_ms": 0,
            "coordinators": [
                {"key": key, "node_id": node, "host": host, "port": port, "error_code": code, "error_message": message}
                for key, (code, message, node, host, port) in zip(keys, found, strict=True)
            ],
        }
    code, message, node, host, port = found[0]
    return {
        "throttle_time_ms": 0,
        "error_code": code,
        "error_message": message,
        "node_id": node,
        "host": host,
        "port": port,
    }


async def _coordinator(ctx: KafkaContext, peer: Peer, key: str, key_type: int) -> tuple[int, str | None, int, str, int]:
    """(error code, message, node id, host, port) of the coordinator of `key`, on the requesting client's listener."""
    if key_type != GROUP_KEY:
        if not allowed(ctx, peer, "DESCRIBE", TRANSACTIONAL_ID, key):
            return E.TransactionalIdAuthorizationFailedError.code, None, -1, "", -1
    elif not allowed(ctx, peer, "DESCRIBE", GROUP, key):
        return E.GroupAuthorizationFailedError.code, None, -1, "", -1
    cluster = ctx.cluster
    if cluster is None:  # this broker coordinates every group and transactional id
        return NONE, None, ctx.node_id, *peer.advertised
    # (a transactional id is placed as a group id is: by the leader of its offsets partition)
    await cluster.ensure_offsets_topic()
    node = cluster.coordinator(key)
    record = cluster.view.broker(node) if node >= 0 else None
    if node == ctx.node_id:
        address: tuple[str, int] | None = peer.advertised
    else:
        address = record.address(peer.listener.key) if record is not None else None
    if address is None:
        return E.CoordinatorNotAvailableError.code, "the coordinator is not available now", -1, "", -1
    return NONE, None, node, address[0], address[1]


def _not_coordinator(ctx: KafkaContext, peer: Peer, group_id: str, operation: str) -> int:
    """GROUP_AUTHORIZATION_FAILED when the peer may not `operation` the group, else the coordinator's code."""
    if not allowed(ctx, peer, operation, GROUP, group_id):
        return E.GroupAuthorizationFailedError.code
    return coordinator_code(ctx, group_id)


async def join_group(ctx: KafkaContext, peer: Peer, req: KafkaRequest[JoinGroupRequest]) -> JoinGroupResponse:
    b = req.body
    code = _not_coordinator(ctx, peer, b["group_id"], "READ")
    if code:
        return {
            "throttle_time_ms": 0,
            "error_code": code,
            "generation_id": -1,
            "protocol_type": None,
            "protocol_name": None if req.api_version >= 7 else "",
            "leader": "",
            "skip_assignment": False,
            "member_id": b["member_id"],
            "members": [],
        }
    result = await ctx.groups.join(
        b["group_id"],
        b["member_id"],
        b["protocol_type"],
        [(p["name"], bytes(p["metadata"])) for p in b["protocols"]],
        session_timeout_ms=b["session_timeout_ms"],
        rebalance_timeout_ms=b.get("rebalance_timeout_ms", -1),
        group_instance_id=b.get("group_instance_id"),
        require_known_member_id=req.api_version >= 4,
        client_id=req.client_id or "",
        client_host=peer.client_host,
    )
    return {
        "throttle_time_ms": 0,
        "error_code": result.error,
        "generation_id": result.generation_id,
        "protocol_type": result.protocol_type,
        # before v7 the protocol name is not nullable
        "protocol_name": result.protocol_name if req.api_version >= 7 else (result.protocol_name or ""),
        "leader": result.leader,
        "skip_assignment": result.skip_assignment,
        "member_id": result.member_id,
        "members": [{"member_id": m, "group_instance_id": i, "metadata": md} for m, i, md in result.members],
    }


async def sync_group(ctx: KafkaContext, peer: Peer, req: KafkaRequest[SyncGroupRequest]) -> SyncGroupResponse:
    b = req.body
    code = _not_coordinator(ctx, peer, b["group_id"], "READ")
    if code:
        return {
            "throttle_time_ms": 0,
            "error_code": code,
            "protocol_type": None,
            "protocol_name": None,
            "assignment": b"",
        }
    result = await ctx.groups.sync(
        b["group_id"],
        b["generation_id"],
        b["member_id"],
        {a["member_id"]: bytes(a["assignment"]) for a in b["assignments"]},
        group_instance_id=b.get("group_instance_id"),
        protocol_type=b.get("protocol_type"),
        protocol_name=b.get("protocol_name"),
    )
    return {
        "throttle_time_ms": 0,
        "error_code": result.error,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name,
        "assignment": result.assignment,
    }


async def heartbeat(ctx: KafkaContext, peer: Peer, req: KafkaRequest[HeartbeatRequest]) -> HeartbeatResponse:
    b = req.body
    code = _not_coordinator(ctx, peer, b["group_id"], "READ") or ctx.groups.heartbeat(
        b["group_id"], b["generation_id"], b["member_id"], b.get("group_instance_id")
    )
    return {"throttle_time_ms": 0, "error_code": code}


async def leave_group(ctx: KafkaContext, peer: Peer, req: KafkaRequest[LeaveGroupRequest]) -> LeaveGroupResponse:
    b = req.body
    if req.api_version >= 3:
        members = [(m["member_id"], m.get("group_instance_id")) for m in b["members"]]
    else:
        members = [(b["member_id"], None)]
    refused = _not_coordinator(ctx, peer, b["group_id"], "READ")
    if refused:
        return {"throttle_time_ms": 0, "error_code": refused, "members": []}
    code, per_member = ctx.groups.leave(b["group_id"], members)
    if req.api_version < 3 and code == NONE:
        code = per_member[0]
    return {
        "throttle_time_ms": 0,
        "error_code": code,
        "members": [
            {"member_id": m, "group_instance_id": i, "error_code": c}
            for (m, i), c in zip(members, per_member, strict=True)
        ],
    }


async def describe_groups(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[DescribeGroupsRequest]
) -> DescribeGroupsResponse:
    out: list[DescribeGroupsResponseDescribedGroup] = []
    with_operations = req.body.get("include_authorized_operations", False)
    for group_id in req.body["groups"]:
        refused = _not_coordinator(ctx, peer, group_id, "DESCRIBE")
        if refused:
            out.append(
                {
                    "error_code": refused,
                    "error_message": None,
                    "group_id": group_id,
                    "group_state": "",
                    "protocol_type": "",
                    "protocol_data": "",
                    "members": [],
                    "authorized_operations": AUTHORIZED_OPS_OMITTED,
                }
            )
            continue
        desc = ctx.groups.describe(group_id)
        if desc is None:
            # v6+ says GROUP_ID_NOT_FOUND; older versions answer a Dead group without error, like Kafka
            code = E.GroupIdNotFoundError.code if req.api_version >= 6 else NONE
            desc = {"group_id": group_id, "group_state": DEAD, "protocol_type": "", "protocol_data": "", "members": []}
        else:
            code = NONE
        out.append(
            {
                "error_code": code,
                "error_message": None,
                "group_id": desc["group_id"],
                "group_state": desc["group_state"],
                "protocol_type": desc["protocol_type"],
                "protocol_data": desc["protocol_data"],
                "members": desc["members"],
                "authorized_operations": authorized_operations(ctx, peer, GROUP, group_id)
                if with_operations
                else AUTHORIZED_OPS_OMITTED,
            }
        )
    return {"throttle_time_ms": 0, "groups": out}


async def list_groups(ctx: KafkaContext, peer: Peer, req: KafkaRequest[ListGroupsRequest]) -> ListGroupsResponse:
    b = req.body
    types = {t.lower() for t in b.get("types_filter") or ()}
    groups = ctx.groups
    listed = [
        (g, p, s, groups.group_type(g))
        for g, p, s in groups.list_groups(b.get("states_filter") or None)
        if not types or groups.group_type(g) in types
    ]
    if not allowed_cluster(ctx, peer, "DESCRIBE"):
        listed = [entry for entry in listed if allowed(ctx, peer, "DESCRIBE", GROUP, entry[0])]
    return {
        "throttle_time_ms": 0,
        "error_code": NONE,
        "groups": [{"group_id": g, "protocol_type": p, "group_state": s, "group_type": t} for g, p, s, t in listed],
    }


async def delete_groups(ctx: KafkaContext, peer: Peer, req: KafkaRequest[DeleteGroupsRequest]) -> DeleteGroupsResponse:
    results: list[DeleteGroupsResponseDeletableGroupResult] = []
    for group_id in req.body["groups_names"]:
        code = _not_coordinator(ctx, peer, group_id, "DELETE") or await ctx.groups.delete_group(group_id)
        results.append({"group_id": group_id, "error_code": code})
    return {"throttle_time_ms": 0, "results": results}


async def offset_delete(ctx: KafkaContext, peer: Peer, req: KafkaRequest[OffsetDeleteRequest]) -> OffsetDeleteResponse:
    b = req.body
    refused = _not_coordinator(ctx, peer, b["group_id"], "DELETE")
    if refused:
        return {"error_code": refused, "throttle_time_ms": 0, "topics": []}
    wanted: list[tuple[str, int]] = []
    unknown: dict[tuple[str, int], int] = {}
    for t in b["topics"]:
        info = ctx.topics.get(t["name"])
        denied = not allowed(ctx, peer, "READ", TOPIC, t["name"])
        for p in t["partitions"]:
            tp = (t["name"], p["partition_index"])
            if denied:
                unknown[tp] = E.TopicAuthorizationFailedError.code
            elif info is None or not 0 <= tp[1] < info.queue_count:
                unknown[tp] = E.UnknownTopicOrPartitionError.code
            else:
                wanted.append(tp)
    code, per = await ctx.groups.delete_offsets(b["group_id"], wanted)
    per.update(unknown)
    if code != NONE:
        return {"error_code": code, "throttle_time_ms": 0, "topics": []}
    topics: list[OffsetDeleteResponseTopic] = []
    for t in b["topics"]:
        topics.append(
            {
                "name": t["name"],
                "partitions": [
                    {
                        "partition_index": p["partition_index"],
                        "error_code": per.get((t["name"], p["partition_index"]), NONE),
                    }
                    for p in t["partitions"]
                ],
            }
        )
    return {"error_code": NONE, "throttle_time_ms": 0, "topics": topics}
