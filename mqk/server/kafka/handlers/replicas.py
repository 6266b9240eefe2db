"""Replica administration: ElectLeaders, DescribeProducers, ListPartitionReassignments, AlterPartitionReassignments.

mqk replicates broker groups, not single partitions: a partition's replicas are the members of the broker group it
is placed in, its leader is the group's master (docs/architecture.md, "Replication").

- ElectLeaders (ALTER on the cluster): PREFERRED or UNCLEAN, run per broker group (mqk.broker.cluster.elections).
  An election asked for a partition moves its whole group's mastership, so every partition of one group named in a
  request gets the same answer, and partitions of that group not named move too. A null topic list asks for every
  partition; as in Kafka, the partitions whose election was not needed are then left out of the answer. A broker
  that is the whole cluster leads every partition with its only replica: ELECTION_NOT_NEEDED.
- DescribeProducers (READ on the topic): a partition's active idempotent producers, from this broker's producer
  state (mqk.server.kafka.idempotence; a partition's state is rebuilt from its log tail when first asked). Only the
  partition's leader answers (NOT_LEADER_OR_FOLLOWER elsewhere). A transactional producer's transaction under way
  in the partition gives its start offset (mqk.server.kafka.transactions), else -1.
- AlterPartitionReassignments (ALTER on the cluster): a partition's replicas are the members of one broker group, so
  a target replica set names a group: every member of it, no one else. The partition then moves there (copy, catch
  up, seal, switch, delete: mqk.broker.moves); the answer comes once the controller recorded the move, as Kafka
  answers once the reassignment is under way. A target equal to the partition's current replicas is answered NONE
  at once (nothing to move); null replicas cancel a move (NO_REASSIGNMENT_IN_PROGRESS without one); a move
  whose source is sealed cannot be sent to a third group (REASSIGNMENT_IN_PROGRESS); a target that is not one
  group's members INVALID_REPLICA_ASSIGNMENT, with a message saying why. A broker on its own has one replica per
  partition.
- ListPartitionReassignments (DESCRIBE on the cluster): the moves under way, as Kafka lists reassignments: the
  target group's members then the source's as replicas, the target's as adding and the source's as removing. Their
  progress (the offsets the copy still lacks) is DescribeLogDirs' offset lag on the target group's master.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from mqk import errors as E
from mqk.broker.security.authorizer import ALTER, CLUSTER, CLUSTER_NAME, DESCRIBE, READ, TOPIC
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import NONE, allowed, partition_code
from mqk.server.kafka.transactions import COORDINATOR_EPOCH

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
    from mqk.broker.cluster.elections import ElectionType
    from mqk.protocol.kafka.messages.alter_partition_reassignments import (
        AlterPartitionReassignmentsRequest,
        AlterPartitionReassignmentsResponse,
        AlterPartitionReassignmentsResponseReassignableTopicResponse,
    )
    from mqk.protocol.kafka.messages.describe_producers import (
        DescribeProducersRequest,
        DescribeProducersResponse,
        DescribeProducersResponsePartitionResponse,
        DescribeProducersResponseTopicResponse,
    )
    from mqk.protocol.kafka.messages.elect_leaders import (
        ElectLeadersRequest,
        ElectLeadersResponse,
        ElectLeadersResponsePartitionResult,
        ElectLeadersResponseReplicaElectionResult,
    )
    from mqk.protocol.kafka.messages.list_partition_reassignments import (
        ListPartitionReassignmentsRequest,
        ListPartitionReassignmentsResponse,
        ListPartitionReassignmentsResponseOngoingPartitionReassignment,
        ListPartitionReassignmentsResponseOngoingTopicReassignment,
    )

log = logging.getLogger("mqk.kafka")


def _partitions(ctx: KafkaContext, topic: str) -> int:
    """How many partitions `topic` has (the cluster's record in cluster mode, else the store's), 0 if unknown."""
    if ctx.cluster is not None:
        record = ctx.cluster.topic(topic)
        return len(record.partitions) if record is not None else 0
    info = ctx.store.topic(topic)
    return info.queue_count if info is not None else 0


# --- ElectLeaders -------------------------------------------------------------------------------------------------


async def elect_leaders(ctx: KafkaContext, peer: Peer, req: KafkaRequest[ElectLeadersRequest]) -> ElectLeadersResponse:
    if not allowed(ctx, peer, ALTER, CLUSTER, CLUSTER_NAME):
        return {
            "throttle_time_ms": 0,
            "error_code": E.ClusterAuthorizationFailedError.code,
            "replica_election_results": [],
        }
    body = req.body
    asked = body["topic_partitions"]
    every = asked is None
    wanted: list[tuple[str, list[int]]]
    if asked is None:
        names = ctx.cluster.topics() if ctx.cluster is not None else ctx.store.topics()
        wanted = [(name, list(range(_partitions(ctx, name)))) for name in sorted(names)]
    else:
        wanted = [(t["topic"], list(t["partitions"])) for t in asked]
    # imported with the first ElectLeaders: the elections belong to cluster mode, whose modules a broker on its own
    # does not load (start-up)
    from mqk.broker.cluster.elections import ELECTION_TYPES

    kind = ELECTION_TYPES.get(body.get("election_type", 0))
    results: list[ElectLeadersResponseReplicaElectionResult] = []
    #: one election per broker group: its outcome answers every partition of the group
    by_group: dict[str, tuple[int, str | None]] = {}
    for topic, partitions in wanted:
        count = _partitions(ctx, topic)
        answers: list[ElectLeadersResponsePartitionResult] = []
        for p in partitions:
            message: str | None
            if kind is None:
                code, message = E.InvalidRequestError.code, f"unknown election type {body.get('election_type')}"
            elif not 0 <= p < count:
                code, message = E.UnknownTopicOrPartitionError.code, f"no partition {topic}-{p}"
            else:
                code, message = await _elect_partition(ctx, topic, p, kind, by_group)
            if every and code == E.ElectionNotNeededError.code:
                continue
            answers.append({"partition_id": p, "error_code": code, "error_message": message})
        if answers or not every:
            results.append({"topic": topic, "partition_result": answers})
    return {"throttle_time_ms": 0, "error_code": NONE, "replica_election_results": results}


async def _elect_partition(
    ctx: KafkaContext, topic: str, partition: int, kind: ElectionType, by_group: dict[str, tuple[int, str | None]]
) -> tuple[int, str | None]:
    cluster = ctx.cluster
    if cluster is None:
        return E.ElectionNotNeededError.code, "a broker on its own is every partition's only replica and leader"
    record = cluster.topic(topic)
    if record is None:  # (deleted since the request was read)
        return E.UnknownTopicOrPartitionError.code, f"no partition {topic}-{partition}"
    group = record.partitions[partition][0]
    done = by_group.get(group)
    if done is None:
        from mqk.broker.cluster.elections import elect  # (cluster mode: see elect_leaders)

        try:
            epoch = await elect(cluster.node, group, kind)
            done = (NONE, None)
            log.info(
                "ElectLeaders %s: group %s (for %s-%d) now in master epoch %d", kind, group, topic, partition, epoch
            )
        except E.KafkaError as exc:
            done = (exc.code, str(exc) or None)
        except Exception as exc:  # noqa: BLE001 - etcd unreachable, a lease gone: the partitions say so, retriably
            log.warning("ElectLeaders %s for group %s failed: %s", kind, group, exc)
            done = (E.RequestTimedOutError.code, f"the election could not run: {exc}")
        by_group[group] = done
    return done


# --- DescribeProducers --------------------------------------------------------------------------------------------


async def describe_producers(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[DescribeProducersRequest]
) -> DescribeProducersResponse:
    topics: list[DescribeProducersResponseTopicResponse] = []
    for t in req.body["topics"]:
        name = t["name"]
        permitted = allowed(ctx, peer, READ, TOPIC, name)
        count = _partitions(ctx, name)
        partitions: list[DescribeProducersResponsePartitionResponse] = []
        for p in t["partition_indexes"]:
            entry: DescribeProducersResponsePartitionResponse = {
                "partition_index": p,
                "error_code": NONE,
                "error_message": None,
                "active_producers": [],
            }
            if not permitted:
                entry["error_code"] = E.TopicAuthorizationFailedError.code
            elif not 0 <= p < count:
                entry["error_code"] = E.UnknownTopicOrPartitionError.code
            elif refused := partition_code(ctx, name, p):
                entry["error_code"] = refused
            else:
                try:
                    producers = await ctx.producers.describe(name, p)
                except Exception as exc:  # noqa: BLE001 - the partition's answer carries the code
                    entry["error_code"] = E.kafka_code_for(exc)
                    entry["error_message"] = str(exc) or None
                else:
                    txns = ctx.transactions
                    entry["active_producers"] = [
                        {
                            "producer_id": pid,
                            "producer_epoch": epoch,
                            "last_sequence": last_seq,
                            "last_timestamp": last_ms,
                            # (a transactional producer's: the coordinator that writes its markers; else -1)
                            "coordinator_epoch": COORDINATOR_EPOCH if txns is not None and pid in txns.by_pid else -1,
                            # the first offset of its transaction under way here (-1: none)
                            "current_txn_start_offset": -1 if txns is None else txns.open_first_offset(name, p, pid),
                        }
                        for pid, epoch, last_seq, last_ms in producers
                    ]
            partitions.append(entry)
        topics.append({"name": name, "partitions": partitions})
    return {"throttle_time_ms": 0, "topics": topics}


# --- partition reassignments --------------------------------------------------------------------------------------


async def list_partition_reassignments(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[ListPartitionReassignmentsRequest]
) -> ListPartitionReassignmentsResponse:
    if not allowed(ctx, peer, DESCRIBE, CLUSTER, CLUSTER_NAME):
        return {
            "throttle_time_ms": 0,
            "error_code": E.ClusterAuthorizationFailedError.code,
            "error_message": "not authorized to describe partition reassignments",
            "topics": [],
        }
    topics: list[ListPartitionReassignmentsResponseOngoingTopicReassignment] = []
    cluster = ctx.cluster
    if cluster is not None:
        asked = req.body["topics"]
        wanted = (
            dict.fromkeys(cluster.topics())
            if asked is None
            else {t["name"]: set(t["partition_indexes"]) for t in asked}
        )
        for name, partitions in sorted(wanted.items()):
            record = cluster.topic(name)
            if record is None or not record.moves:
                continue
            ongoing: list[ListPartitionReassignmentsResponseOngoingPartitionReassignment] = []
            for move in sorted(record.moves, key=lambda m: m.partition):
                if partitions is not None and move.partition not in partitions:
                    continue
                source = cluster.view.members_of(record.partitions[move.partition][0])
                target = cluster.view.members_of(move.target)
                ongoing.append(
                    {
                        "partition_index": move.partition,
                        # Kafka's way: the target replicas first, then those leaving
                        "replicas": target + [n for n in source if n not in target],
                        "adding_replicas": [n for n in target if n not in source],
                        "removing_replicas": [n for n in source if n not in target],
                    }
                )
            if ongoing:
                topics.append({"name": name, "partitions": ongoing})
    return {"throttle_time_ms": 0, "error_code": NONE, "error_message": None, "topics": topics}


async def alter_partition_reassignments(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[AlterPartitionReassignmentsRequest]
) -> AlterPartitionReassignmentsResponse:
    body = req.body
    if not allowed(ctx, peer, ALTER, CLUSTER, CLUSTER_NAME):
        return {
            "throttle_time_ms": 0,
            "allow_replication_factor_change": body.get("allow_replication_factor_change", True),
            "error_code": E.ClusterAuthorizationFailedError.code,
            "error_message": "not authorized to reassign partitions",
            "responses": [],
        }
    timeout = body["timeout_ms"] / 1000 if body["timeout_ms"] > 0 else None
    responses: list[AlterPartitionReassignmentsResponseReassignableTopicResponse] = []
    for t in body["topics"]:
        name = t["name"]
        count = _partitions(ctx, name)
        result: AlterPartitionReassignmentsResponseReassignableTopicResponse = {"name": name, "partitions": []}
        for p in t["partitions"]:
            index, target = p["partition_index"], p["replicas"]
            code, message = NONE, None
            if not 0 <= index < count:
                code, message = E.UnknownTopicOrPartitionError.code, f"no partition {name}-{index}"
            else:
                try:
                    await _reassign(ctx, name, index, target, timeout)
                except E.MqkError as exc:
                    code, message = E.kafka_code_for(exc), str(exc)
            result["partitions"].append({"partition_index": index, "error_code": code, "error_message": message})
        responses.append(result)
    return {
        "throttle_time_ms": 0,
        "allow_replication_factor_change": body.get("allow_replication_factor_change", True),
        "error_code": NONE,
        "error_message": None,
        "responses": responses,
    }


async def _reassign(
    ctx: KafkaContext,
    topic: str,
    partition: int,
    target: list[int] | None,
    timeout: float | None,  # noqa: ASYNC109 - the request's timeout_ms: the wait for the controller's answer
) -> None:
    """Start moving the partition to the broker group whose members are `target` (None: cancel its move), through
    the controller (mqk.broker.moves); nothing when it is there already. An mqk error says why not."""
    cluster = ctx.cluster
    if cluster is None:
        if target is None:
            raise E.NoReassignmentInProgressError(f"no reassignment of {topic}-{partition} to cancel")
        if target != [ctx.node_id]:
            raise E.InvalidReplicaAssignmentError(f"only broker {ctx.node_id} exists")
        return
    if target is None:
        await cluster.change_topic("move", topic, timeout, partitions=partition, group="")
        return
    if not target or len(set(target)) != len(target):
        raise E.InvalidReplicaAssignmentError(f"replicas {target}: a non-empty list without duplicates is needed")
    view = cluster.view
    groups = {view.group_of(node) for node in target}
    if None in groups:
        unknown = [node for node in target if view.group_of(node) is None]
        raise E.InvalidReplicaAssignmentError(f"brokers {unknown} are not in the cluster")
    if len(groups) > 1:
        raise E.InvalidReplicaAssignmentError(
            f"replicas {target} are in broker groups {sorted(g for g in groups if g)}: a partition's replicas are the "
            "members of one broker group"
        )
    group = groups.pop()
    assert group is not None
    members = view.members_of(group)
    if sorted(target) != members:
        raise E.InvalidReplicaAssignmentError(
            f"a partition's replicas are all the members of its broker group: {group!r} has {members}, not {target}"
        )
    record = cluster.topic(topic)
    if record is not None and record.partitions[partition][0] == group and record.move_of(partition) is None:
        return  # (there already: done at once, as Kafka completes a reassignment to the current replicas)
    if ctx.moves is None:
        raise E.InvalidReplicaAssignmentError(
            "moving a partition to another broker group needs the file engine's replication (--storage file)"
        )
    for g in {group, record.partitions[partition][0]} if record is not None else {group}:
        master = view.master_of(g)
        broker = view.broker(master.node_id) if master is not None else None
        if broker is None or broker.address("replication") is None:
            raise E.InvalidReplicaAssignmentError(f"broker group {g!r} has no master with a replication listener")
    await cluster.change_topic("move", topic, timeout, partitions=partition, group=group)
