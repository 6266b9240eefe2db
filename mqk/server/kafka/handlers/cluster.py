"""DescribeCluster, InitProducerId: small answers about this broker (and, in cluster mode, the brokers of its
cluster, at the addresses of the requesting client's listener: mqk.server.kafka.handlers.metadata).

InitProducerId hands out idempotent producer ids (mqk.server.kafka.idempotence); with a transactional id the
transaction coordinator answers (mqk.server.kafka.transactions: the id's producer id, its epoch bumped), asking
WRITE on the transactional id; in cluster mode only the id's coordinator answers (NOT_COORDINATOR elsewhere).

Authorization as Kafka's: DescribeCluster asks DESCRIBE on the cluster (CLUSTER_AUTHORIZATION_FAILED) and fills the
cluster's authorized operations when asked; an idempotent producer's InitProducerId asks IDEMPOTENT_WRITE on the
cluster or WRITE on some topic (CLUSTER_AUTHORIZATION_FAILED)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqk import errors as E
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import (
    AUTHORIZED_OPS_OMITTED,
    CLUSTER,
    CLUSTER_NAME,
    NONE,
    TOPIC,
    allowed_cluster,
    authorized_operations,
    authorizer,
)
from mqk.server.kafka.handlers.metadata import brokers_and_controller
from mqk.server.kafka.handlers.transactions import coordinator_refusal, fenced_code

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
    from mqk.protocol.kafka.messages.describe_cluster import DescribeClusterRequest, DescribeClusterResponse
    from mqk.protocol.kafka.messages.init_producer_id import InitProducerIdRequest, InitProducerIdResponse


async def describe_cluster(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[DescribeClusterRequest]
) -> DescribeClusterResponse:
    if not allowed_cluster(ctx, peer, "DESCRIBE"):
        return {
            "throttle_time_ms": 0,
            "error_code": E.ClusterAuthorizationFailedError.code,
            "error_message": "not authorized to describe the cluster",
            "endpoint_type": req.body.get("endpoint_type", 1),
            "cluster_id": ctx.cluster_id,
            "controller_id": -1,
            "brokers": [],
            "cluster_authorized_operations": AUTHORIZED_OPS_OMITTED,
        }
    brokers, controller = brokers_and_controller(ctx, peer)
    operations = AUTHORIZED_OPS_OMITTED
    if req.body.get("include_cluster_authorized_operations"):
        operations = authorized_operations(ctx, peer, CLUSTER, CLUSTER_NAME)
    return {
        "throttle_time_ms": 0,
        "error_code": NONE,
        "error_message": None,
        "endpoint_type": req.body.get("endpoint_type", 1),
        "cluster_id": ctx.cluster_id,
        "controller_id": controller,
        "brokers": [
            {"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": b["rack"], "is_fenced": False}
            for b in brokers
        ],
        "cluster_authorized_operations": operations,
    }


async def init_producer_id(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[InitProducerIdRequest]
) -> InitProducerIdResponse:
    b = req.body
    if b["transactional_id"] is not None:
        code, pid, epoch = coordinator_refusal(ctx, peer, b["transactional_id"]), -1, -1
        if not code:
            assert ctx.transactions is not None
            code, pid, epoch = await ctx.transactions.init_producer_id(
                b["transactional_id"],
                b["transaction_timeout_ms"],
                b.get("producer_id", -1),
                b.get("producer_epoch", -1),
            )
            code = fenced_code(code, req.api_version, since=4)
    elif not allowed_cluster(ctx, peer, "IDEMPOTENT_WRITE") and not authorizer(ctx).authorize_any(
        peer.principal, peer.client_host.lstrip("/"), "WRITE", TOPIC
    ):
        code, pid, epoch = E.ClusterAuthorizationFailedError.code, -1, -1
    else:
        # the producer_id / producer_epoch an idempotent producer may send (v3+) ask for a fresh id, as in Kafka
        code, pid, epoch = await ctx.producers.init_producer_id()
    return {
        "throttle_time_ms": 0,
        "error_code": code,
        "producer_id": pid,
        "producer_epoch": epoch,
        "ongoing_txn_producer_id": -1,
        "ongoing_txn_producer_epoch": -1,
    }
