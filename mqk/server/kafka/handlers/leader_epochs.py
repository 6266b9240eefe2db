"""OffsetForLeaderEpoch: where a leader epoch ended in a partition's log (KIP-101, KIP-320).

A consumer that saw a new leader (or a follower) asks, for the last epoch it fetched in, the offset at which that
epoch ended, to find out whether the log it read was cut back. The answer is the largest epoch the log knows that
is not above the one asked, and the offset where it ended (the start of the next one), the log end for the current
epoch, or (-1, -1) for an epoch the log does not know (mqk.broker.cluster.epochs). A partition that moved from
another broker group keeps epochs that only go up (TopicRecord.epoch_bases); an epoch from before its move ended,
as far as this log can tell, where the partition arrived. On a broker on its own there is
one epoch, 0, for all time. In cluster mode only the partition's leader answers (else NOT_LEADER_OR_FOLLOWER), and a
`current_leader_epoch` must match its epoch (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqk import errors as E
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import TOPIC, allowed, epoch_code, partition_code

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
    from mqk.protocol.kafka.messages.offset_for_leader_epoch import (
        OffsetForLeaderEpochRequest,
        OffsetForLeaderEpochResponse,
        OffsetForLeaderEpochResponseEpochEndOffset,
        OffsetForLeaderEpochResponseOffsetForLeaderTopicResult,
    )

UNDEFINED = (-1, -1)


async def handle(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[OffsetForLeaderEpochRequest]
) -> OffsetForLeaderEpochResponse:
    store = ctx.store
    cluster = ctx.cluster
    topics: list[OffsetForLeaderEpochResponseOffsetForLeaderTopicResult] = []
    for t in req.body["topics"]:
        name = t["topic"]
        info = store.topic(name)
        parts: list[OffsetForLeaderEpochResponseEpochEndOffset] = []
        denied = not allowed(ctx, peer, "DESCRIBE", TOPIC, name)
        for p in t["partitions"]:
            index = p["partition"]
            code = E.TopicAuthorizationFailedError.code if denied else 0
            code = code or partition_code(ctx, name, index) or epoch_code(ctx, name, index, p["current_leader_epoch"])
            epoch, end = UNDEFINED
            if not code and (info is None or not 0 <= index < info.queue_count):
                code = E.UnknownTopicOrPartitionError.code
            if not code:
                try:
                    log_end = store.end_offset(name, index)
                except Exception as exc:  # noqa: BLE001 - the partition's answer carries the code
                    code = E.kafka_code_for(exc)
                else:
                    requested = p["leader_epoch"]
                    record = cluster.topic(name) if cluster is not None else None
                    if cluster is not None and record is not None:
                        arrival = record.arrival(index)
                        if arrival is not None and requested < arrival[0]:
                            # an epoch of the group the partition moved from: the copy here holds that group's
                            # log as it was up to where the partition arrived
                            epoch, end = requested, min(arrival[1], log_end)
                        else:
                            base = record.epoch_base(index)
                            epoch, end = cluster.epochs.end_offset_for(name, index, requested - base, log_end)
                            if epoch >= 0:
                                epoch += base
                    elif requested == 0:
                        epoch, end = 0, log_end
            parts.append({"error_code": code, "partition": index, "leader_epoch": epoch, "end_offset": end})
        topics.append({"topic": name, "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}


__all__ = ["handle"]
