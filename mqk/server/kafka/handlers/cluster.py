"""DescribeCluster, InitProducerId: small answers about this broker (and, in cluster mode, the brokers of its
cluster, at the addresses of the requesting client's listener: mqk.server.kafka.handlers.metadata).

InitProducerId hands out idempotent producer ids (mqk.server.kafka.idempotence). Transactions are not offered:
a transactional id is refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which clients report as fatal rather
than retrying forever."""

from __future__ import annotations

from mqk import errors as E
from mqk.protocol.kafka.messages.describe_cluster import DescribeClusterRequest, DescribeClusterResponse
from mqk.protocol.kafka.messages.init_producer_id import InitProducerIdRequest, InitProducerIdResponse
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import AUTHORIZED_OPS_OMITTED, NONE
from mqk.server.kafka.handlers.metadata import brokers_and_controller


async def describe_cluster(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[DescribeClusterRequest]
) -> DescribeClusterResponse:
    brokers, controller = brokers_and_controller(ctx, peer)
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
        "cluster_authorized_operations": AUTHORIZED_OPS_OMITTED,
    }


async def init_producer_id(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[InitProducerIdRequest]
) -> InitProducerIdResponse:
    b = req.body
    if b["transactional_id"] is not None:
        code, pid, epoch = E.TransactionalIdAuthorizationFailedError.code, -1, -1
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
