"""The transaction APIs: InitProducerId with a transactional id, AddPartitionsToTxn (v0-v5, the batched and
verify-only forms of KIP-890 part 1 included), AddOffsetsToTxn, EndTxn, TxnOffsetCommit, DescribeTransactions and
ListTransactions. Translation only: the state machine is mqk.server.kafka.transactions (ctx.transactions).

Authorization as Kafka's: WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED) for InitProducerId,
AddPartitionsToTxn, AddOffsetsToTxn and EndTxn; WRITE on each topic added (TOPIC_AUTHORIZATION_FAILED, the other
partitions OPERATION_NOT_ATTEMPTED); READ on the group for AddOffsetsToTxn and TxnOffsetCommit
(GROUP_AUTHORIZATION_FAILED) and READ on each topic committed; DESCRIBE on the transactional id to describe or list
it. A verify-only AddPartitionsToTxn (broker to broker) asks CLUSTER_ACTION on the cluster.

In cluster mode a transactional id's requests go to its coordinator (FindCoordinator TRANSACTION: the leader of
the id's `__consumer_offsets` partition); another broker answers NOT_COORDINATOR, and the coordinator
COORDINATOR_LOAD_IN_PROGRESS until it has read its state. TxnOffsetCommit goes to the consumer group's
coordinator, as an OffsetCommit does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqk import errors as E
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import (
    GROUP,
    NONE,
    TOPIC,
    TRANSACTIONAL_ID,
    allowed,
    allowed_cluster,
    coordinator_code,
)
from mqk.server.kafka.handlers.offsets import commit_answer, sort_commit
from mqk.server.kafka.transactions import STATES, GroupOffsets

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
    from mqk.protocol.kafka.messages.add_offsets_to_txn import AddOffsetsToTxnRequest, AddOffsetsToTxnResponse
    from mqk.protocol.kafka.messages.add_partitions_to_txn import (
        AddPartitionsToTxnRequest,
        AddPartitionsToTxnResponse,
        AddPartitionsToTxnTopic,
        AddPartitionsToTxnTopicResult,
    )
    from mqk.protocol.kafka.messages.describe_transactions import (
        DescribeTransactionsRequest,
        DescribeTransactionsResponse,
        DescribeTransactionsResponseTransactionState,
    )
    from mqk.protocol.kafka.messages.end_txn import EndTxnRequest, EndTxnResponse
    from mqk.protocol.kafka.messages.list_transactions import (
        ListTransactionsRequest,
        ListTransactionsResponse,
        ListTransactionsResponseTransactionState,
    )
    from mqk.protocol.kafka.messages.txn_offset_commit import TxnOffsetCommitRequest, TxnOffsetCommitResponse

_NOT_OFFERED = E.TransactionalIdAuthorizationFailedError.code


def fenced_code(code: int, version: int, since: int = 2) -> int:
    """PRODUCER_FENCED as a request of `version` knows it: INVALID_PRODUCER_EPOCH before the version that
    introduced it (`since`: v2 of AddPartitionsToTxn, AddOffsetsToTxn and EndTxn, v4 of InitProducerId)."""
    if code == E.ProducerFencedError.code and version < since:
        return E.InvalidProducerEpochError.code
    return code


def refusal(ctx: KafkaContext, peer: Peer, transactional_id: str) -> int:
    """Why the peer may not use `transactional_id` (0 if it may)."""
    if ctx.transactions is None or not allowed(ctx, peer, "WRITE", TRANSACTIONAL_ID, transactional_id):
        return _NOT_OFFERED
    return NONE


def coordinator_refusal(ctx: KafkaContext, peer: Peer, transactional_id: str) -> int:
    """`refusal`, or why this broker does not coordinate `transactional_id` now: NOT_COORDINATOR (another broker
    does, cluster mode), COORDINATOR_LOAD_IN_PROGRESS (its state is not read yet)."""
    return refusal(ctx, peer, transactional_id) or serving_code(ctx, transactional_id)


def serving_code(ctx: KafkaContext, transactional_id: str) -> int:
    """NONE if this broker coordinates `transactional_id` and has its state, else the code saying why not."""
    cluster = ctx.cluster
    if cluster is not None and not cluster.coordinates(transactional_id):
        return E.NotCoordinatorError.code
    if ctx.transactions is None or not ctx.transactions.active:
        return E.CoordinatorLoadInProgressError.code
    return NONE


async def add_partitions_to_txn(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[AddPartitionsToTxnRequest]
) -> AddPartitionsToTxnResponse:
    b = req.body
    if req.api_version <= 3:
        results = await _add_partitions(
            ctx,
            peer,
            b["v3_and_below_transactional_id"],
            b["v3_and_below_producer_id"],
            b["v3_and_below_producer_epoch"],
            b["v3_and_below_topics"],
            verify_only=False,
            version=req.api_version,
        )
        return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": results}
    if not allowed_cluster(ctx, peer, "CLUSTER_ACTION"):
        return {
            "throttle_time_ms": 0,
            "error_code": E.ClusterAuthorizationFailedError.code,
            "results_by_transaction": [],
        }
    return {
        "throttle_time_ms": 0,
        "error_code": NONE,
        "results_by_transaction": [
            {
                "transactional_id": t["transactional_id"],
                "topic_results": await _add_partitions(
                    ctx,
                    peer,
                    t["transactional_id"],
                    t["producer_id"],
                    t["producer_epoch"],
                    t["topics"],
                    verify_only=t["verify_only"],
                    version=req.api_version,
                ),
            }
            for t in b["transactions"]
        ],
    }


async def _add_partitions(
    ctx: KafkaContext,
    peer: Peer,
    transactional_id: str,
    producer_id: int,
    epoch: int,
    topics: list[AddPartitionsToTxnTopic],
    *,
    verify_only: bool,
    version: int,
) -> list[AddPartitionsToTxnTopicResult]:
    codes: dict[tuple[str, int], int] = {}
    code = coordinator_refusal(ctx, peer, transactional_id)
    wanted = [(t["name"], p) for t in topics for p in t["partitions"]]
    if code:
        codes = dict.fromkeys(wanted, code)
    else:
        for topic, index in wanted:
            info = ctx.topics.get(topic)
            if not allowed(ctx, peer, "WRITE", TOPIC, topic):
                codes[(topic, index)] = E.TopicAuthorizationFailedError.code
            elif info is None or not 0 <= index < info.queue_count:
                codes[(topic, index)] = E.UnknownTopicOrPartitionError.code
        if codes:  # one bad partition and none is added (Kafka: the others OPERATION_NOT_ATTEMPTED)
            for tp in wanted:
                codes.setdefault(tp, E.OperationNotAttemptedError.code)
        else:
            assert ctx.transactions is not None
            code, missing = await ctx.transactions.add_partitions(
                transactional_id, producer_id, epoch, wanted, verify_only
            )
            code = fenced_code(code, version)
            codes = {tp: code or (E.InvalidTxnStateError.code if tp in missing else NONE) for tp in wanted}
    return [
        {
            "name": t["name"],
            "results_by_partition": [
                {"partition_index": p, "partition_error_code": codes[(t["name"], p)]} for p in t["partitions"]
            ],
        }
        for t in topics
    ]


async def add_offsets_to_txn(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[AddOffsetsToTxnRequest]
) -> AddOffsetsToTxnResponse:
    b = req.body
    code = coordinator_refusal(ctx, peer, b["transactional_id"])
    if not code and not allowed(ctx, peer, "READ", GROUP, b["group_id"]):
        code = E.GroupAuthorizationFailedError.code
    if not code:
        assert ctx.transactions is not None
        code = fenced_code(
            await ctx.transactions.add_offsets(
                b["transactional_id"], b["producer_id"], b["producer_epoch"], b["group_id"]
            ),
            req.api_version,
        )
    return {"throttle_time_ms": 0, "error_code": code}


async def end_txn(ctx: KafkaContext, peer: Peer, req: KafkaRequest[EndTxnRequest]) -> EndTxnResponse:
    b = req.body
    code = coordinator_refusal(ctx, peer, b["transactional_id"])
    pid = epoch = -1
    if not code and req.api_version >= 5:  # transaction version 2: the epoch moves on at every end
        assert ctx.transactions is not None
        code, pid, epoch = await ctx.transactions.end_txn_v2(
            b["transactional_id"], b["producer_id"], b["producer_epoch"], b["committed"]
        )
    elif not code:
        assert ctx.transactions is not None
        code = fenced_code(
            await ctx.transactions.end_txn(
                b["transactional_id"], b["producer_id"], b["producer_epoch"], b["committed"]
            ),
            req.api_version,
        )
    return {"throttle_time_ms": 0, "error_code": code, "producer_id": pid, "producer_epoch": epoch}


async def txn_offset_commit(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[TxnOffsetCommitRequest]
) -> TxnOffsetCommitResponse:
    b = req.body
    group = b["group_id"]
    code = NONE
    if ctx.transactions is None:
        code = _NOT_OFFERED
    elif not allowed(ctx, peer, "READ", GROUP, group):
        code = E.GroupAuthorizationFailedError.code
    elif not ctx.transactions.active:
        code = E.CoordinatorLoadInProgressError.code
    else:
        code = coordinator_code(ctx, group) or ctx.groups.txn_commit_check(
            group, b.get("generation_id", -1), b.get("member_id", ""), b.get("group_instance_id")
        )
    codes, wanted = sort_commit(ctx, peer, b["topics"], code)
    offsets: GroupOffsets = {tp: (o, e, m or "") for tp, (o, e, m) in wanted.items()}
    if offsets:
        assert ctx.transactions is not None
        result = await ctx.transactions.txn_offset_commit(
            b["transactional_id"], b["producer_id"], b["producer_epoch"], group, offsets, implicit=req.api_version >= 5
        )
        codes.update(dict.fromkeys(offsets, result))
    return {"throttle_time_ms": 0, "topics": commit_answer(b["topics"], codes)}


async def describe_transactions(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[DescribeTransactionsRequest]
) -> DescribeTransactionsResponse:
    states: list[DescribeTransactionsResponseTransactionState] = []
    txns = ctx.transactions
    for name in req.body["transactional_ids"]:
        txn = txns.txns.get(name) if txns is not None else None
        entry: DescribeTransactionsResponseTransactionState = {
            "error_code": NONE,
            "transactional_id": name,
            "transaction_state": "",
            "transaction_timeout_ms": 0,
            "transaction_start_time_ms": -1,
            "producer_id": -1,
            "producer_epoch": -1,
            "topics": [],
        }
        if not allowed(ctx, peer, "DESCRIBE", TRANSACTIONAL_ID, name):
            entry["error_code"] = E.TransactionalIdAuthorizationFailedError.code
        elif serving_code(ctx, name):
            entry["error_code"] = serving_code(ctx, name)
        elif txn is None:
            entry["error_code"] = E.TransactionalIdNotFoundError.code
        else:
            by_topic: dict[str, list[int]] = {}
            for topic, index in sorted(txn.partitions):
                by_topic.setdefault(topic, []).append(index)
            entry["transaction_state"] = txn.state
            entry["transaction_timeout_ms"] = txn.timeout_ms
            entry["transaction_start_time_ms"] = txn.start_ms
            entry["producer_id"] = txn.producer_id
            entry["producer_epoch"] = txn.producer_epoch
            entry["topics"] = [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]
        states.append(entry)
    return {"throttle_time_ms": 0, "transaction_states": states}


async def list_transactions(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[ListTransactionsRequest]
) -> ListTransactionsResponse:
    b = req.body
    wanted_states = set(b["state_filters"])
    unknown = sorted(s for s in wanted_states if s not in STATES)
    pids = set(b["producer_id_filters"])
    min_duration = b.get("duration_filter", -1)
    pattern = b.get("transactional_id_pattern")
    matcher = None
    if pattern:
        import re

        try:
            matcher = re.compile(pattern)
        except re.error:
            return {
                "throttle_time_ms": 0,
                "error_code": E.InvalidRequestError.code,
                "unknown_state_filters": [],
                "transaction_states": [],
            }
    now = ctx.clock.time_ms()
    found: list[ListTransactionsResponseTransactionState] = []
    for txn in ctx.transactions.txns.values() if ctx.transactions is not None else ():
        if wanted_states and txn.state not in wanted_states:
            continue
        if pids and txn.producer_id not in pids:
            continue
        if min_duration >= 0 and (txn.start_ms < 0 or now - txn.start_ms < min_duration):
            continue
        if matcher is not None and not matcher.fullmatch(txn.transactional_id):
            continue
        if not allowed(ctx, peer, "DESCRIBE", TRANSACTIONAL_ID, txn.transactional_id):
            continue
        found.append(
            {"transactional_id": txn.transactional_id, "producer_id": txn.producer_id, "transaction_state": txn.state}
        )
    return {"throttle_time_ms": 0, "error_code": NONE, "unknown_state_filters": unknown, "transaction_states": found}
