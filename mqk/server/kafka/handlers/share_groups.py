"""Share groups (KIP-932): ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch and ShareAcknowledge. The membership
and the record states are `mqk.groups.share.ShareGroups` (ctx.groups.share); this module runs the share sessions,
reads the records it hands out, and saves the states a request changed before it answers.

ShareFetch: the session's epoch checked (0 opens one with the partitions named, -1 closes it, any other must be the
one the previous request was told), the request's acknowledgements applied first, then records acquired for the
member from the session's partitions (released and expired ones before new ones), `max_records` of them, a soft
limit in the batch-optimised acquire mode (v1's, and v2's default: a stored batch begun is acquired whole, as Kafka
does, so no batch is sent for a part of it) and a hard one in v2's record-limit mode; with none to give it waits up
to `max_wait_ms` for new records. The records go out as the stored batches that hold them, with
the acquired offset ranges and their delivery counts (a client delivers only those). Control batches are never
handed out: their offsets are archived.

Authorization: READ on the group for all four (DESCRIBE for ShareGroupDescribe), READ on each topic fetched
(TOPIC_AUTHORIZATION_FAILED for that partition). The admin's offset APIs, as Kafka's: DescribeShareGroupOffsets needs
DESCRIBE on the group and the topics, AlterShareGroupOffsets READ on both, DeleteShareGroupOffsets DELETE on the group
and READ on the topics; the last two change only a group without members (NON_EMPTY_GROUP).

Cluster mode, as Kafka splits the work: ShareGroupHeartbeat and ShareGroupDescribe go to the group's coordinator
(placed as a consumer group's: NOT_COORDINATOR elsewhere), which keeps the membership and the assignment; ShareFetch
and ShareAcknowledge go to each partition's leader, which keeps that partition's record states in its broker
group's log (mqk.groups.share) and answers NOT_LEADER_OR_FOLLOWER for a partition it does not lead. A leader that
does not coordinate the group takes the member id it is given (its share session is what it checks), as Kafka's
share-partition leaders do; a departed member's records come back there when their locks end. The groups' configs
are the cluster's (mqk.broker.cluster.group_configs). The admin's offset APIs go to the coordinator, which asks
the masters holding the group's partitions (mqk.broker.cluster.share_ops).
"""

from __future__ import annotations

import uuid
from typing import Any

from mqk import errors as E
from mqk.groups.answers import heartbeat_answer, undescribed_group
from mqk.groups.share import ShareGroups, ShareSession
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import (
    GROUP,
    NONE,
    TOPIC,
    allowed,
    authorized_operations,
    coordinator_code,
    partition_code,
)
from mqk.server.kafka.handlers.metadata import brokers_and_controller

SHARE_SESSION_NOT_FOUND = 122
INVALID_SHARE_SESSION_EPOCH = 123
UNKNOWN_TOPIC_ID = 100
NO_LEADER = {"leader_id": -1, "leader_epoch": -1}
#: ShareFetch's acquire modes (v2, KIP-1206; v1 has only the first): whole stored batches, `max_records` a soft
#: limit; or `max_records` at most
BATCH_OPTIMIZED, RECORD_LIMIT = 0, 1


def _refusal(
    ctx: KafkaContext, peer: Peer, group_id: str, operation: str, *, at_coordinator: bool = True
) -> tuple[int, str | None]:
    """The operation on the group, and (`at_coordinator`: a request for the group's coordinator) NOT_COORDINATOR
    on a broker that does not coordinate it."""
    if not allowed(ctx, peer, operation, GROUP, group_id):
        return E.GroupAuthorizationFailedError.code, None
    if at_coordinator and (code := coordinator_code(ctx, group_id)):
        return code, None
    return NONE, None


def _leader(ctx: KafkaContext, topic: str, partition: int) -> dict[str, int]:
    """A partition's current leader as ShareFetch and ShareAcknowledge name it."""
    if ctx.cluster is None:
        return {"leader_id": ctx.node_id, "leader_epoch": 0}
    node_id, epoch = ctx.cluster.leader(topic, partition)
    return {"leader_id": node_id, "leader_epoch": epoch}


def _node_endpoints(ctx: KafkaContext, peer: Peer) -> list[dict[str, Any]]:
    """The brokers a ShareFetch or ShareAcknowledge answer names (every live one in cluster mode, so a client told
    NOT_LEADER_OR_FOLLOWER finds the leader)."""
    if ctx.cluster is None:
        return [{"node_id": ctx.node_id, "host": peer.advertised[0], "port": peer.advertised[1], "rack": None}]
    brokers, _controller = brokers_and_controller(ctx, peer)
    return [dict(b) for b in brokers]


def _topics_by_id(ctx: KafkaContext) -> dict[uuid.UUID, tuple[str, int]]:
    return {uuid.UUID(bytes=bytes(i.topic_id)): (name, i.queue_count) for name, i in ctx.topics.all().items()}


async def share_group_heartbeat(ctx: KafkaContext, peer: Peer, req: KafkaRequest[dict[str, Any]]) -> dict[str, Any]:
    b = req.body
    code, message = _refusal(ctx, peer, b["group_id"], "READ")
    if not code and (ctx.groups.classic_members(b["group_id"]) or ctx.groups.consumer.has_members(b["group_id"])):
        code, message = E.GroupIdNotFoundError.code, f"group {b['group_id']!r} is not a share group"
    if code:
        return heartbeat_answer(b["member_id"], b["member_epoch"], 0, code, message)
    share = ctx.groups.share
    await share.ensure_loaded(ctx.store)
    answer, changed = share.heartbeat(b, req.client_id or "", peer.client_host)
    await share.save(changed)
    return answer


async def share_group_describe(ctx: KafkaContext, peer: Peer, req: KafkaRequest[dict[str, Any]]) -> dict[str, Any]:
    names = {t: n for t, (n, _c) in _topics_by_id(ctx).items()}
    out = []
    for group_id in req.body["group_ids"]:
        code, message = _refusal(ctx, peer, group_id, "DESCRIBE")
        described = None if code else ctx.groups.share.describe(group_id, names.get)
        if described is None:
            if not code:
                code, message = E.GroupIdNotFoundError.code, f"group {group_id!r} is not a share group"
            out.append(undescribed_group(group_id, code, message, state="Dead"))
            continue
        if req.body.get("include_authorized_operations"):
            described["authorized_operations"] = authorized_operations(ctx, peer, GROUP, group_id)
        out.append(described)
    return {"throttle_time_ms": 0, "groups": out}


def _top(share: ShareGroups, group_id: str, code: int, message: str | None = None) -> dict[str, Any]:
    return {
        "throttle_time_ms": 0,
        "error_code": code,
        "error_message": message,
        "acquisition_lock_timeout_ms": share.lock_ms(group_id),
        "responses": [],
        "node_endpoints": [],
    }


def _session(
    share: ShareGroups, group_id: str, member_id: str, epoch: int, opening_allowed: bool
) -> tuple[ShareSession | None, int]:
    """The member's session for a request at `epoch` (moved on to the next epoch), or an error code."""
    key = (group_id, member_id)
    if epoch == 0:
        if not opening_allowed:
            return None, INVALID_SHARE_SESSION_EPOCH
        opened = share.sessions[key] = ShareSession(1)
        return opened, NONE
    session = share.sessions.get(key)
    if session is None:
        return None, SHARE_SESSION_NOT_FOUND
    if epoch == -1:
        del share.sessions[key]
        return session, NONE
    if epoch != session.epoch:
        return None, INVALID_SHARE_SESSION_EPOCH
    session.epoch = epoch + 1 if epoch < 2**31 - 1 else 1
    return session, NONE


def _acknowledge(
    ctx: KafkaContext,
    group_id: str,
    member_id: str,
    topics: list[dict[str, Any]],
    known: dict[uuid.UUID, tuple[str, int]],
) -> dict[tuple[uuid.UUID, int], int]:
    """Apply the acknowledgement batches of a request: an error code per partition that carried any."""
    share = ctx.groups.share
    out: dict[tuple[uuid.UUID, int], int] = {}
    for t in topics:
        for p in t["partitions"]:
            batches = p.get("acknowledgement_batches") or []
            if not batches:
                continue
            key = (t["topic_id"], p["partition_index"])
            if t["topic_id"] not in known:
                out[key] = UNKNOWN_TOPIC_ID
                continue
            name, _count = known[t["topic_id"]]
            if elsewhere := partition_code(ctx, name, p["partition_index"]):
                out[key] = elsewhere
                continue
            start, end = ctx.store.offset_bounds(name, p["partition_index"])
            part = share.partition(group_id, t["topic_id"], p["partition_index"], start, end)
            code = NONE
            for batch in batches:
                code = code or part.acknowledge(
                    member_id,
                    batch["first_offset"],
                    batch["last_offset"],
                    list(batch["acknowledge_types"]),
                    share.lock_deadline(group_id),
                    share.limit(group_id),
                )
            out[key] = code
    return out


async def _acquire(
    ctx: KafkaContext,
    group_id: str,
    member_id: str,
    topic_id: uuid.UUID,
    partition: int,
    name: str,
    budget: int,
    batch_size: int | None,
) -> tuple[bytes, list[dict[str, int]], int]:
    """Acquire up to `budget` records of one partition for the member: (the batches holding them, the acquired
    ranges with their delivery counts, how many were acquired). `batch_size` None: the record-limit mode; else the
    batch-optimised one, which acquires to the end of the last stored batch begun and, as Kafka does, starts a new
    acquired range at a stored batch's start once the current one holds `batch_size` records (the ranges a client
    acknowledges in)."""
    chosen = await ctx.groups.share.acquire_from_log(
        ctx.store, group_id, member_id, topic_id, partition, name, budget, whole_batches=batch_size is not None
    )
    split_at = batch_size if batch_size is not None and batch_size > 0 else None
    ranges: list[dict[str, int]] = []
    taken = 0
    for first, last, count in sorted(got for _batch, gots in chosen for got in gots):
        taken += last - first + 1
        current = ranges[-1] if ranges else None
        if (
            current is not None
            and current["last_offset"] == first - 1
            and current["delivery_count"] == count
            and (split_at is None or current["last_offset"] - current["first_offset"] + 1 < split_at)
        ):
            current["last_offset"] = last
        else:
            ranges.append({"first_offset": first, "last_offset": last, "delivery_count": count})
    return b"".join(bytes(batch.data) for batch, _got in chosen), ranges, taken


async def _enter(
    ctx: KafkaContext, peer: Peer, group_id: str, member_id: str, epoch: int, opening_allowed: bool
) -> tuple[ShareSession | None, set[str], dict[str, Any]]:
    """What ShareFetch and ShareAcknowledge check first: the group's READ, the membership, the session's epoch.
    (the member's session, the groups whose states expiry changed, the refusal to answer when there is no session)"""
    share = ctx.groups.share
    code, message = _refusal(ctx, peer, group_id, "READ", at_coordinator=False)
    if code:
        return None, set(), _top(share, group_id, code, message)
    await share.ensure_loaded(ctx.store)
    changed = share.expire()
    # (only the coordinator knows the members: a partition leader elsewhere goes by the share session)
    if not coordinator_code(ctx, group_id) and not share.is_member(group_id, member_id):
        await share.save(changed)
        message = f"member {member_id!r} is not in share group {group_id!r}"
        return None, changed, _top(share, group_id, E.UnknownMemberIdError.code, message)
    session, code = _session(share, group_id, member_id, epoch, opening_allowed)
    return session, changed, _top(share, group_id, code)


async def share_fetch(ctx: KafkaContext, peer: Peer, req: KafkaRequest[dict[str, Any]]) -> dict[str, Any]:
    b = req.body
    share = ctx.groups.share
    group_id, member_id, epoch = b["group_id"] or "", b["member_id"] or "", b["share_session_epoch"]
    mode = b.get("share_acquire_mode", BATCH_OPTIMIZED)
    if mode not in (BATCH_OPTIMIZED, RECORD_LIMIT):
        return _top(share, group_id, E.InvalidRequestError.code, f"share acquire mode {mode} is unknown")
    session, changed, refused = await _enter(ctx, peer, group_id, member_id, epoch, opening_allowed=True)
    if session is None:
        return refused
    known = _topics_by_id(ctx)
    for t in b["topics"]:
        session.partitions.update((t["topic_id"], p["partition_index"]) for p in t["partitions"])
    for t in b["forgotten_topics_data"]:
        session.partitions.difference_update((t["topic_id"], p) for p in t["partitions"])
    acks = _acknowledge(ctx, group_id, member_id, b["topics"], known)
    if acks:
        changed.add(group_id)
    results: dict[tuple[uuid.UUID, int], dict[str, Any]] = {}
    if epoch == -1:  # the session closes: what the member still holds goes back to the others
        if share.release(group_id, member_id):
            changed.add(group_id)
    elif not b.get("is_renew_ack"):  # (v2: a request that only renews acquisitions fetches nothing)
        budget = max(1, b["max_records"]) if b["max_records"] > 0 else 500
        batch_size = b["batch_size"] if mode == BATCH_OPTIMIZED else None
        for attempt in range(2):
            for key in sorted(session.partitions, key=str):
                topic_id, partition = key
                if topic_id not in known:
                    results[key] = {"error_code": UNKNOWN_TOPIC_ID}
                    continue
                name, count = known[topic_id]
                if not 0 <= partition < count:
                    results[key] = {"error_code": E.UnknownTopicOrPartitionError.code}
                    continue
                if not allowed(ctx, peer, "READ", TOPIC, name):
                    results[key] = {"error_code": E.TopicAuthorizationFailedError.code}
                    continue
                if elsewhere := partition_code(ctx, name, partition):
                    results[key] = {"error_code": elsewhere}
                    continue
                if budget <= 0:
                    continue
                records, ranges, n = await _acquire(
                    ctx, group_id, member_id, topic_id, partition, name, budget, batch_size
                )
                if n:
                    budget -= n
                    changed.add(group_id)
                    results[key] = {"records": records, "acquired_records": ranges}
            got = any(r.get("acquired_records") for r in results.values())
            if got or acks or attempt or b["max_wait_ms"] <= 0 or not session.partitions:
                break
            wait_on = [(known[t][0], p) for t, p in session.partitions if t in known]
            # (a held record whose lock ends meanwhile is one to take: the wait ends with the lock)
            await ctx.hub.wait(wait_on, share.wait_for(group_id, session.partitions, b["max_wait_ms"] / 1000))
    await share.save(changed)
    keys = (
        set(results)
        | set(acks)
        | (
            {(t["topic_id"], p["partition_index"]) for t in b["topics"] for p in t["partitions"]}
            if epoch == 0
            else set()
        )
    )
    by_topic: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for topic_id, partition in sorted(keys, key=str):
        entry = results.get((topic_id, partition), {})
        by_topic.setdefault(topic_id, []).append(
            {
                "partition_index": partition,
                "error_code": entry.get("error_code", NONE),
                "error_message": None,
                "acknowledge_error_code": acks.get((topic_id, partition), NONE),
                "acknowledge_error_message": None,
                "current_leader": _leader(ctx, known[topic_id][0], partition) if topic_id in known else NO_LEADER,
                "records": entry.get("records", b""),
                "acquired_records": entry.get("acquired_records", []),
            }
        )
    answer = _top(share, group_id, NONE)
    answer["responses"] = [{"topic_id": t, "partitions": parts} for t, parts in by_topic.items()]
    answer["node_endpoints"] = _node_endpoints(ctx, peer)
    return answer


async def share_acknowledge(ctx: KafkaContext, peer: Peer, req: KafkaRequest[dict[str, Any]]) -> dict[str, Any]:
    b = req.body
    share = ctx.groups.share
    group_id, member_id, epoch = b["group_id"] or "", b["member_id"] or "", b["share_session_epoch"]
    session, changed, refused = await _enter(ctx, peer, group_id, member_id, epoch, opening_allowed=False)
    if session is None:
        return refused
    known = _topics_by_id(ctx)
    acks = _acknowledge(ctx, group_id, member_id, b["topics"], known)
    if acks:
        changed.add(group_id)
    if epoch == -1 and share.release(group_id, member_id):  # the session closes, as in ShareFetch
        changed.add(group_id)
    await share.save(changed)
    by_topic: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for (topic_id, partition), ack in sorted(acks.items(), key=str):
        by_topic.setdefault(topic_id, []).append(
            {
                "partition_index": partition,
                "error_code": ack,
                "error_message": None,
                "current_leader": _leader(ctx, known[topic_id][0], partition) if topic_id in known else NO_LEADER,
            }
        )
    answer = _top(share, group_id, NONE)
    answer["responses"] = [{"topic_id": t, "partitions": parts} for t, parts in by_topic.items()]
    answer["node_endpoints"] = _node_endpoints(ctx, peer)
    return answer


# --- the admin's offsets: Describe-, Alter- and DeleteShareGroupOffsets ---------------------------------------
#
# Each is answered by the group's coordinator. On a broker on its own it holds every partition's state; in
# cluster mode the masters of the broker groups holding the partitions do, and the coordinator asks them through
# etcd (mqk.broker.cluster.share_ops): `perform_share_op` is their side, `_at_holders` the coordinator's.

#: how long a coordinator waits for the masters holding a group's partitions to answer
HOLDERS_TIMEOUT_S = 5.0


def _group_refusal(ctx: KafkaContext, peer: Peer, group_id: str, operation: str) -> tuple[int, str | None]:
    """What the offset APIs check of a group: the operation on it, that this broker coordinates it, and that it
    is no classic or consumer group."""
    code, message = _refusal(ctx, peer, group_id, operation)
    if not code and (ctx.groups.classic_members(group_id) or ctx.groups.consumer.has_members(group_id)):
        code, message = E.GroupIdNotFoundError.code, f"group {group_id!r} is not a share group"
    return code, message


def _holder(ctx: KafkaContext, name: str, partition: int) -> str | None:
    """Cluster mode: the broker group holding a partition's states (None: the cluster has no such partition)."""
    assert ctx.cluster is not None
    record = ctx.cluster.topic(name)
    if record is None or not 0 <= partition < len(record.partitions):
        return None
    return record.partitions[partition][0]


async def _at_holders(
    ctx: KafkaContext, groups: set[str], op: dict[str, Any]
) -> tuple[list[dict[str, Any]], int, str | None]:
    """Cluster mode: `op` asked of each of these broker groups' masters; (their answers, and the error of the
    whole request when one did not answer)."""
    assert ctx.share_ops is not None
    try:
        answers = await ctx.share_ops.ask(groups, op, HOLDERS_TIMEOUT_S)
    except E.MetaUnavailable as exc:
        return [], E.CoordinatorNotAvailableError.code, f"the cluster's metadata store: {exc}"
    missing = sorted(groups - set(answers))
    failed = sorted(g for g, a in answers.items() if "error" in a)
    if missing or failed:
        message = f"the masters of {', '.join(missing + failed)} did not answer for group {op['group']!r}; try again"
        return [], E.CoordinatorNotAvailableError.code, message
    return list(answers.values()), NONE, None


async def perform_share_op(ctx: KafkaContext, op: dict[str, Any]) -> dict[str, Any]:
    """One share offset operation on this broker's states of the partitions it holds (in cluster mode: those of
    its group, asked by a share group's coordinator); what came of it."""
    share = ctx.groups.share
    await share.ensure_loaded(ctx.store)
    group_id, kind = str(op["group"]), op["op"]
    if kind == "describe":
        return {"exists": share.exists(group_id), "states": _held_states(ctx, group_id)}
    if kind == "alter":
        errors = [[name, p, _reset_here(ctx, group_id, name, p, start)] for name, p, start in op["partitions"]]
        if any(error == NONE for _name, _p, error in errors):
            await share.save([group_id])
        return {"errors": errors}
    if kind == "delete":
        forgot = [name for name in op["topics"] if _forget_here(ctx, group_id, name)]
        if forgot:
            await share.save([group_id])
        return {"forgot": forgot}
    raise ValueError(f"share operation {kind!r} is unknown")


def _held_states(ctx: KafkaContext, group_id: str) -> list[list[Any]]:
    """[topic, partition, start offset, lag] of every partition of the group whose state this broker holds."""
    group = ctx.groups.share.groups.get(group_id)
    by_id = _topics_by_id(ctx)
    out = []
    for (topic_id, p), part in group.partitions.items() if group is not None else ():
        name = by_id.get(topic_id, (None, 0))[0]
        if name is not None and (ctx.cluster is None or ctx.cluster.leads(name, p)):
            out.append([name, p, part.spso, part.lag(ctx.store.end_offset(name, p))])
    return out


def _reset_here(ctx: KafkaContext, group_id: str, name: str, partition: int, start: int) -> int:
    """Start the group over at `start` on a partition this broker holds; the partition's error code."""
    if ctx.cluster is not None and not ctx.cluster.leads(name, partition):
        return E.NotLeaderOrFollowerError.code
    info = ctx.topics.get(name)
    if info is None or not 0 <= partition < info.queue_count:
        return E.UnknownTopicOrPartitionError.code
    low, high = ctx.store.offset_bounds(name, partition)
    if not low <= start <= high:
        return E.OffsetOutOfRangeError.code
    ctx.groups.share.reset(group_id, uuid.UUID(bytes=bytes(info.topic_id)), partition, start)
    return NONE


def _forget_here(ctx: KafkaContext, group_id: str, name: str) -> bool:
    info = ctx.topics.get(name)
    return info is not None and ctx.groups.share.forget(group_id, uuid.UUID(bytes=bytes(info.topic_id)))


async def _states(
    ctx: KafkaContext, group_id: str, wanted: dict[str, list[int]] | None
) -> tuple[bool, dict[tuple[str, int], tuple[int, int]], int, str | None]:
    """Whether the group has states anywhere, and (topic, partition) -> (start offset, lag) of those of `wanted`
    (None: all of them); then the error of the whole request."""
    if ctx.cluster is None:
        answers = [await perform_share_op(ctx, {"op": "describe", "group": group_id})]
    else:
        if wanted is None:
            holders = set(ctx.cluster.view.live_groups())
        else:
            holders = {g for name, ps in wanted.items() for p in ps if (g := _holder(ctx, name, p)) is not None}
        answers, code, message = await _at_holders(ctx, holders, {"op": "describe", "group": group_id})
        if code:
            return False, {}, code, message
    states = {(str(n), int(p)): (int(spso), int(lag)) for a in answers for n, p, spso, lag in a["states"]}
    return any(a["exists"] for a in answers) or ctx.groups.share.exists(group_id), states, NONE, None


async def describe_share_group_offsets(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[dict[str, Any]]
) -> dict[str, Any]:
    """Each group's share-partition start offsets (SPSO; -1 where the group has not started the partition) and,
    v1, its lag; topics null: every partition the group has a state for."""
    share = ctx.groups.share
    await share.ensure_loaded(ctx.store)
    by_id = _topics_by_id(ctx)
    ids = {name: topic_id for topic_id, (name, _count) in by_id.items()}
    out = []
    for g in req.body["groups"]:
        group_id = g["group_id"]
        asked = g["topics"]
        wanted = None if asked is None else {t["topic_name"]: list(t["partitions"]) for t in asked}
        code, message = _group_refusal(ctx, peer, group_id, "DESCRIBE")
        if not code:
            exists, states, code, message = await _states(ctx, group_id, wanted)
            if not code and not exists:
                code, message = E.GroupIdNotFoundError.code, f"share group {group_id!r} does not exist"
        if code:
            out.append({"group_id": group_id, "topics": [], "error_code": code, "error_message": message})
            continue
        if wanted is None:
            wanted = {}
            for name, p in sorted(states):
                wanted.setdefault(name, []).append(p)
        topics = []
        for name, partitions in wanted.items():
            topic_id = ids.get(name)
            rows = []
            for p in sorted(partitions):
                row: dict[str, Any] = {"partition_index": p, "start_offset": -1, "leader_epoch": -1, "lag": -1}
                if not allowed(ctx, peer, "DESCRIBE", TOPIC, name):
                    row.update(error_code=E.TopicAuthorizationFailedError.code, error_message=None)
                elif topic_id is None or not 0 <= p < by_id[topic_id][1]:
                    row.update(error_code=E.UnknownTopicOrPartitionError.code, error_message=None)
                else:
                    row.update(error_code=NONE, error_message=None, leader_epoch=0)
                    if (name, p) in states:
                        spso, lag = states[(name, p)]
                        row.update(start_offset=spso, lag=lag)
                rows.append(row)
            topics.append({"topic_name": name, "topic_id": topic_id, "partitions": rows})
        out.append({"group_id": group_id, "topics": topics, "error_code": NONE, "error_message": None})
    return {"throttle_time_ms": 0, "groups": out}


async def _empty_group_change(
    ctx: KafkaContext, peer: Peer, group_id: str, operation: str
) -> tuple[ShareGroups, int, str | None]:
    """What Alter- and DeleteShareGroupOffsets check first: the group's operation, and that it has no members."""
    share = ctx.groups.share
    await share.ensure_loaded(ctx.store)
    code, message = _group_refusal(ctx, peer, group_id, operation)
    if not code and share.has_members(group_id):
        code, message = E.NonEmptyGroupError.code, f"share group {group_id!r} has members: stop them first"
    return share, code, message


async def alter_share_group_offsets(ctx: KafkaContext, peer: Peer, req: KafkaRequest[dict[str, Any]]) -> dict[str, Any]:
    """Start an empty share group's partitions over at the given offsets (what `kafka-share-groups
    --reset-offsets` sends); an offset outside the partition's log is OFFSET_OUT_OF_RANGE."""
    b = req.body
    group_id = b["group_id"]
    _share, code, message = await _empty_group_change(ctx, peer, group_id, "READ")
    if code:
        return {"throttle_time_ms": 0, "error_code": code, "error_message": message, "responses": []}
    errors: dict[tuple[str, int], int] = {}
    todo: list[list[Any]] = []
    for t in b["topics"]:
        name = t["topic_name"]
        info = ctx.topics.get(name)
        for p in t["partitions"]:
            index = p["partition_index"]
            if not allowed(ctx, peer, "READ", TOPIC, name):
                errors[(name, index)] = E.TopicAuthorizationFailedError.code
            elif info is None or not 0 <= index < info.queue_count:
                errors[(name, index)] = E.UnknownTopicOrPartitionError.code
            else:
                todo.append([name, index, p["start_offset"]])
    answers = []
    if todo and ctx.cluster is None:
        answers.append(await perform_share_op(ctx, {"op": "alter", "group": group_id, "partitions": todo}))
    elif todo:
        by_holder: dict[str, list[list[Any]]] = {}
        for item in todo:
            by_holder.setdefault(_holder(ctx, item[0], item[1]) or "", []).append(item)
        for holder, items in by_holder.items():  # (one at a time: a holder that fails fails its partitions only)
            got, failed, _why = await _at_holders(
                ctx, {holder}, {"op": "alter", "group": group_id, "partitions": items}
            )
            answers += got
            errors.update({(name, index): failed for name, index, _start in items} if failed else {})
    errors.update({(name, int(index)): int(error) for a in answers for name, index, error in a["errors"]})
    responses = []
    for t in b["topics"]:
        name = t["topic_name"]
        rows = [
            {"partition_index": index, "error_code": errors[(name, index)], "error_message": None}
            for index in (p["partition_index"] for p in t["partitions"])
        ]
        responses.append({"topic_name": name, "topic_id": _topic_id(ctx, name), "partitions": rows})
    return {"throttle_time_ms": 0, "error_code": NONE, "error_message": None, "responses": responses}


def _topic_id(ctx: KafkaContext, name: str) -> uuid.UUID | None:
    info = ctx.topics.get(name)
    return None if info is None else uuid.UUID(bytes=bytes(info.topic_id))


async def delete_share_group_offsets(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[dict[str, Any]]
) -> dict[str, Any]:
    """Drop an empty share group's states of the named topics: its next fetch starts them afresh."""
    b = req.body
    group_id = b["group_id"]
    share, code, message = await _empty_group_change(ctx, peer, group_id, "DELETE")
    errors: dict[str, int] = {}
    names: list[str] = []
    for t in b["topics"] if not code else ():
        name = t["topic_name"]
        if not allowed(ctx, peer, "READ", TOPIC, name):
            errors[name] = E.TopicAuthorizationFailedError.code
        elif ctx.topics.get(name) is None:
            errors[name] = E.UnknownTopicOrPartitionError.code
        else:
            names.append(name)
    if not code:
        op = {"op": "delete", "group": group_id, "topics": names}
        if ctx.cluster is None:
            answers = [await perform_share_op(ctx, op)]
        else:
            holders: set[str] = set()
            for name in names:
                record = ctx.cluster.topic(name)
                if record is not None:
                    holders.update(g for g, _queue in record.partitions)
            answers, code, message = await _at_holders(ctx, holders, op)
        forgot = {name for a in answers for name in a["forgot"]}
        if not code and not forgot and not share.exists(group_id):
            code, message = E.GroupIdNotFoundError.code, f"share group {group_id!r} does not exist"
    responses = []
    for t in b["topics"] if not code else ():
        name = t["topic_name"]
        error = errors.get(name, NONE)
        responses.append(
            {"topic_name": name, "topic_id": _topic_id(ctx, name), "error_code": error, "error_message": None}
        )
    return {"throttle_time_ms": 0, "error_code": code, "error_message": message, "responses": responses}
