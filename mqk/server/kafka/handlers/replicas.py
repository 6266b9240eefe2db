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
- ListPartitionReassignments (DESCRIBE on the cluster): no reassignment is ever in progress (see Alter), so the
  answer lists none.
- AlterPartitionReassignments (ALTER on the cluster): moving a partition to another broker group is not built. A
  target replica set equal to the partition's current replicas (its group's members) is answered NONE (nothing to
  move, as Kafka completes such a reassignment at once); cancelling (null replicas) NO_REASSIGNMENT_IN_PROGRESS;
  any other target INVALID_REPLICA_ASSIGNMENT, with a message saying why.
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
    return {"throttle_time_ms": 0, "error_code": NONE, "error_message": None, "topics": []}


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
            elif target is None:
                code, message = E.NoReassignmentInProgressError.code, f"no reassignment of {name}-{index} to cancel"
            else:
                current = _replicas(ctx, name, index)
                if sorted(set(target)) != current or len(target) != len(current):
                    code = E.InvalidReplicaAssignmentError.code
                    message = (
                        f"{name}-{index}'s replicas are the members of its broker group, {current}; moving a "
                        "partition to another broker group is not supported by this broker"
                    )
            result["partitions"].append({"partition_index": index, "error_code": code, "error_message": message})
        responses.append(result)
    return {
        "throttle_time_ms": 0,
        "allow_replication_factor_change": body.get("allow_replication_factor_change", True),
        "error_code": NONE,
        "error_message": None,
        "responses": responses,
    }


def _replicas(ctx: KafkaContext, topic: str, partition: int) -> list[int]:
    if ctx.cluster is None:
        return [ctx.node_id]
    return sorted(ctx.cluster.replicas(topic, partition))
