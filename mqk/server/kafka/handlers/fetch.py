"""Fetch: whole batches from the store, long polling, no copies of record bytes.

- Each partition reads at most min(partition_max_bytes, what is left of max_bytes); as in Kafka (KIP-74) the first
  non-empty partition returns at least one whole batch even if it is larger than the limits, so a consumer
  always makes progress. A fetch offset inside a batch returns that whole batch (the client skips the head).
- Long poll: while fewer than `min_bytes` were found and `max_wait_ms` has not elapsed, the request sleeps on the
  broker's wake-up hub for its partitions (mqk.broker.hub) and reads again when woken; the deadline is on the
  broker's clock.
- `records` is a list of the store's buffers (memoryviews into mapped segments for the file engine); the codec
  emits them as separate buffers for `transport.writelines`, so record bytes are never copied in Python.
- Offsets: high watermark = end offset (in a replicated group: what every in-sync replica holds); last stable
  offset = the first offset of the earliest transaction under way on the partition, else the high watermark
  (mqk.server.kafka.transactions); log start offset. OFFSET_OUT_OF_RANGE below the log start or above the end.
- read_committed (isolation level 1) reads below the last stable offset only and names the aborted transactions
  whose records the answer may hold (`aborted_transactions`: producer id and first offset; the client drops that
  producer's batches from there to its ABORT marker). read_uncommitted reads up to the high watermark; both see
  the markers (control batches), which clients skip. A partition no transaction has touched costs a read one
  dictionary lookup (none while no transaction has written anything).
- Fetch sessions (KIP-227): every answer has session id 0, which tells the client that no session was created,
  so it keeps sending full fetch requests. A request naming a session we never gave out gets
  FETCH_SESSION_ID_NOT_FOUND, and the client falls back to a full fetch.
- v13+ names topics by id: unknown ids get UNKNOWN_TOPIC_ID.
- ACLs: a topic the principal may not READ answers TOPIC_AUTHORIZATION_FAILED for each of its partitions.
- Cluster mode: a partition this broker does not lead answers NOT_LEADER_OR_FOLLOWER, and a `current_leader_epoch`
  older or newer than the leader's FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH (KIP-320), at once, without waiting.
- Fetching from followers (KIP-392), with `replica_selector_class` set to the rack-aware selector: the leader
  answers a consumer (Fetch v11+, read_uncommitted) whose `rack_id` is not the leader's rack but an in-sync
  replica's with that replica as `preferred_read_replica` and no records, at once; the client fetches the partition
  from there. A replica serves such a consumer (any v11+ read_uncommitted fetch) below its own high watermark, the
  commit offset its master last told it. read_committed fetches stay with the leader: the last stable offset and
  the aborted transactions are the master's.
"""

from __future__ import annotations

import struct
from typing import TypeAlias

from mqk import errors as E
from mqk.broker.security.authorizer import ALLOW_ALL
from mqk.broker.stats import Traffic
from mqk.protocol.kafka.messages.fetch import (
    FetchableTopicResponse,
    FetchRequest,
    FetchResponse,
    FetchResponsePartitionData,
    FetchTopic,
)
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import (
    NONE,
    TOPIC,
    ZERO_UUID,
    authorizer,
    epoch_code,
    partition_code,
    topic_by_id,
)
from mqk.store.adapter import Buffer, ShardInfo

_EMPTY = b""
#: where a record batch v2 keeps its record count (after base offset .. base sequence), for the traffic counters
RECORD_COUNT_AT = 57
_RECORD_COUNT = struct.Struct(">i")

#: a requested topic, resolved once per request: (its request entry, the topic or None, the error code of a
#: partition when it is None, [(partition, fetch offset, partition max bytes)], the codes of partitions refused
#: outright (cluster mode: not led here, or a leader epoch that does not match) or None)
_Plan: TypeAlias = list[tuple[FetchTopic, ShardInfo | None, int, list[tuple[int, int, int]], dict[int, int] | None]]


def _error_partition(index: int, code: int, hw: int = -1, log_start: int = -1) -> FetchResponsePartitionData:
    return {
        "partition_index": index,
        "error_code": code,
        "high_watermark": hw,
        "last_stable_offset": hw,
        "log_start_offset": log_start,
        "aborted_transactions": None,
        "preferred_read_replica": -1,
        "records": _EMPTY,
    }


async def handle(ctx: KafkaContext, peer: Peer, req: KafkaRequest[FetchRequest]) -> FetchResponse:
    body = req.body
    if body.get("session_id", 0) != 0:
        return {
            "throttle_time_ms": 0,
            "error_code": E.FetchSessionIdNotFoundError.code,
            "session_id": 0,
            "responses": [],
        }
    by_id = req.api_version >= 13
    isolation_committed = body.get("isolation_level", 0) == 1
    # resolve topics once: (response topic dict, ShardInfo or None, [(partition, offset, max_bytes)])
    plan: _Plan = []
    cluster = ctx.cluster
    #: cluster mode, a consumer that may read from a follower (KIP-392): its rack ("" if it named none), else None
    rack = _follower_reader_rack(req, isolation_committed) if cluster is not None else None
    auth = authorizer(ctx)
    host = peer.client_host.lstrip("/") if auth is not ALLOW_ALL else ""
    for t in body["topics"]:
        if by_id:
            info = topic_by_id(ctx, t["topic_id"]) if t["topic_id"] != ZERO_UUID else None
            missing = E.UnknownTopicIdError.code
        else:
            info = ctx.store.topic(t["topic"]) if cluster is None else ctx.topics.get(t["topic"])
            missing = E.UnknownTopicOrPartitionError.code
        if auth is not ALLOW_ALL:
            name = info.topic if info is not None else t["topic"]
            if (name or not by_id) and not auth.authorize(peer.principal, host, "READ", TOPIC, name):
                info, missing = None, E.TopicAuthorizationFailedError.code
        parts = [(p["partition"], p["fetch_offset"], p["partition_max_bytes"]) for p in t["partitions"]]
        refused = None
        if cluster is not None and info is not None:
            refused = _refused(ctx, info.topic, t, rack is not None)
            if refused:
                parts = [part for part in parts if part[0] not in refused] + [(i, 0, 0) for i in refused]
        plan.append((t, info, missing, parts, refused))

    max_bytes = body.get("max_bytes", 0x7FFFFFFF)
    if max_bytes <= 0:
        max_bytes = 0x7FFFFFFF
    min_bytes = body["min_bytes"]
    clock = ctx.clock
    deadline = clock.monotonic() + max(0, body["max_wait_ms"]) / 1000
    elsewhere = _preferred_replicas(ctx, plan, rack) if rack and ctx.config.rack_aware_fetching else None
    watch = [
        (info.topic, p[0])
        for _t, info, _m, parts, refused in plan
        if info is not None
        for p in parts
        if not refused or p[0] not in refused
    ]

    responses: list[FetchableTopicResponse] | None = None
    while True:
        responses, total, answer_now = await _read_all(ctx, plan, max_bytes, isolation_committed, responses, elsewhere)
        if total >= min_bytes or answer_now or not watch:
            break
        remaining = deadline - clock.monotonic()
        if remaining <= 0 or peer.closed:
            break
        await ctx.hub.wait(watch, remaining)
    if ctx.traffic is not None and total:
        _count_out(ctx.traffic, plan, responses)
    return {"throttle_time_ms": 0, "error_code": NONE, "session_id": 0, "responses": responses}


def _count_out(traffic: Traffic, plan: _Plan, responses: list[FetchableTopicResponse]) -> None:
    """Add what the answer serves to the topics' traffic counters (the last pass's records: an earlier pass that
    found too little was read again)."""
    for (_t, info, _m, _parts, _refused), topic in zip(plan, responses, strict=True):
        if info is None:
            continue
        counts = None
        for p in topic["partitions"]:
            records = p["records"]
            if records.__class__ is not list or not records:  # (_EMPTY: nothing served)
                continue
            if counts is None:
                counts = traffic.topic(info.topic, info.queue_count)
            index = p["partition_index"]
            for data in records:  # a list (checked above) of the store's buffers
                counts.bytes_out[index] += len(data)
                counts.records_out[index] += _RECORD_COUNT.unpack_from(data, RECORD_COUNT_AT)[0]


async def _read_all(
    ctx: KafkaContext,
    plan: _Plan,
    max_bytes: int,
    isolation_committed: bool,
    previous: list[FetchableTopicResponse] | None = None,
    elsewhere: dict[tuple[str, int], int] | None = None,
) -> tuple[list[FetchableTopicResponse], int, bool]:
    """One pass over the request's partitions: (responses, bytes of records found, whether to answer without
    waiting: a partition erred or is to be read elsewhere). `previous` is the last pass of the same request, which
    found too little and waited: a partition it answered with offsets only keeps that answer (the same dict) while
    its offsets have not moved, so the pass after a wake-up costs a consumer of many partitions little more than
    reading the one that woke it. `elsewhere`: (topic, partition) -> the replica the consumer is sent to."""
    store = ctx.store
    responses: list[FetchableTopicResponse] = []
    total = 0
    answer_now = False
    left = max_bytes
    replication = ctx.replication
    #: the partitions transactions have touched (empty while none has written anything)
    txn_partitions = ctx.transactions.partitions if ctx.transactions is not None else None
    for k, (t, info, missing, parts, refused) in enumerate(plan):
        out: list[FetchResponsePartitionData] = []
        bounds = None
        unknown = missing if info is None else E.UnknownTopicOrPartitionError.code
        topic = ""  # read only when the bounds were found, so when info is not None
        #: a replicated group's partitions are read below their high watermark (what every in-sync replica holds)
        replicated = replication is not None and info is not None and info.engine == "file"
        if info is not None:
            topic = info.topic
            try:
                # both offsets of every partition with one routing; None for a partition the topic does not have
                bounds = store.offset_bounds_many(topic, [p[0] for p in parts])
            except Exception as exc:  # noqa: BLE001 - every partition of the topic answers with its code
                unknown = E.kafka_code_for(exc)
        earlier = previous[k]["partitions"] if previous is not None else None
        for i, (index, offset, partition_max) in enumerate(parts):
            if refused and index in refused:
                out.append(_error_partition(index, refused[index]))
                answer_now = True
                continue
            known = bounds[i] if bounds is not None else None
            if known is None:
                out.append(_error_partition(index, unknown))
                answer_now = True
                continue
            log_start, hw = known
            if not log_start <= offset <= hw:
                out.append(_error_partition(index, E.OffsetOutOfRangeError.code, hw, log_start))
                answer_now = True
                continue
            if replicated:
                assert replication is not None
                hw = replication.committed_end(topic, index, hw)
                if offset > hw:
                    offset = hw  # (between the high watermark and the log end: nothing to read yet)
            txns = txn_partitions.get((topic, index)) if txn_partitions else None
            stable = hw if txns is None else txns.last_stable(hw)
            if elsewhere and (replica := elsewhere.get((topic, index))) is not None:
                redirect = _offsets_only(index, hw, log_start, isolation_committed, stable)
                redirect["preferred_read_replica"] = replica
                out.append(redirect)
                answer_now = True
                continue
            readable = stable if isolation_committed else hw
            limit = min(partition_max, left)
            if offset >= readable or (limit <= 0 and total > 0):
                # nothing new (a consumer of many partitions waits on most of them), or the response is full:
                # offsets only, as Kafka does, without a store read
                answer = earlier[i] if earlier is not None else None
                if (
                    answer is None
                    or answer["records"] is not _EMPTY
                    or answer["error_code"]
                    or answer["high_watermark"] != hw
                    or answer["log_start_offset"] != log_start
                    or answer["last_stable_offset"] != stable
                ):
                    answer = _offsets_only(index, hw, log_start, isolation_committed, stable)
                out.append(answer)
                continue
            try:
                result = await store.read(topic, index, offset, max(limit, 1))
                hw, log_start, batches = result.end_offset, result.log_start_offset, result.batches
                if replicated:
                    assert replication is not None
                    hw = replication.committed_end(topic, index, hw)
                    if batches and batches[-1].base_offset >= hw:
                        batches = [b for b in batches if b.base_offset < hw]
                stable = hw if txns is None else txns.last_stable(hw)
                if isolation_committed and batches and batches[-1].base_offset >= stable:
                    batches = [b for b in batches if b.base_offset < stable]
            except Exception as exc:  # noqa: BLE001 - per-partition error code, as the protocol wants
                code = E.kafka_code_for(exc)
                hw = log_start = -1
                if isinstance(exc, E.OffsetOutOfRange):
                    hw, log_start = exc.end, exc.start
                out.append(_error_partition(index, code, hw, log_start))
                answer_now = True
                continue
            data: list[Buffer] | bytes
            if batches:
                data = [b.data for b in batches]
                size = 0
                for cut, d in enumerate(data):
                    if total > 0 and size + len(d) > left:
                        # only the first partition with data may exceed the limits (KIP-74)
                        del data[cut:]
                        break
                    size += len(d)
                total += size
                left -= size
                if not data:
                    data = _EMPTY
            else:
                data = _EMPTY
            answer = _offsets_only(index, hw, log_start, isolation_committed, stable)
            answer["records"] = data
            if isolation_committed and txns is not None and data is not _EMPTY and txns.aborted:
                answer["aborted_transactions"] = [
                    {"producer_id": pid, "first_offset": first}
                    for pid, first in txns.aborted_overlapping(offset, stable)
                ]
            out.append(answer)
        responses.append({"topic": t["topic"], "topic_id": t["topic_id"], "partitions": out})
    return responses, total, answer_now


def _refused(ctx: KafkaContext, topic: str, t: FetchTopic, follower_may_serve: bool) -> dict[int, int] | None:
    """Cluster mode: the topic's partitions this broker cannot serve to this request, with their codes. With
    `follower_may_serve` (a consumer that may read from a follower) a replica of the partition serves it too."""
    refused = {}
    cluster = ctx.cluster
    assert cluster is not None
    for p in t["partitions"]:
        index = p["partition"]
        code = partition_code(ctx, topic, index)
        if code == E.NotLeaderOrFollowerError.code and follower_may_serve and ctx.node_id in cluster.isr(topic, index):
            code = NONE
        code = code or epoch_code(ctx, topic, index, p.get("current_leader_epoch", -1))
        if code:
            refused[index] = code
    return refused or None


def _follower_reader_rack(req: KafkaRequest[FetchRequest], isolation_committed: bool) -> str | None:
    """The rack of a consumer that may read from a follower (KIP-392: Fetch v11+, which carries the client's rack;
    here read_uncommitted only), "" if it named none; None for any other fetch."""
    body = req.body
    if req.api_version < 11 or isolation_committed:
        return None
    state = body.get("replica_state")
    replica_id = body.get("replica_id", -1)  # (v15+ names a replica in replica_state)
    if replica_id >= 0 or (state is not None and state["replica_id"] >= 0):
        return None
    return body.get("rack_id") or ""


def _preferred_replicas(ctx: KafkaContext, plan: _Plan, rack: str) -> dict[tuple[str, int], int] | None:
    """The rack-aware replica selector (KIP-392): for each partition led here, the in-sync replica in the consumer's
    `rack` it should fetch from instead, when this broker is not in that rack (the lowest node id of those)."""
    cluster = ctx.cluster
    if cluster is None:
        return None
    here = cluster.view.broker(ctx.node_id)
    if here is not None and here.rack == rack:
        return None
    elsewhere = {}
    for _t, info, _missing, parts, refused in plan:
        if info is None:
            continue
        for index, _offset, _max in parts:
            if (refused and index in refused) or not cluster.leads(info.topic, index):
                continue
            for node in sorted(cluster.isr(info.topic, index)):
                record = cluster.view.broker(node) if node != ctx.node_id else None
                if record is not None and record.rack == rack:
                    elsewhere[(info.topic, index)] = node
                    break
    return elsewhere or None


def _offsets_only(
    index: int, hw: int, log_start: int, isolation_committed: bool, stable: int
) -> FetchResponsePartitionData:
    """A partition's answer without records (the records field is set by the caller when there are some)."""
    return {
        "partition_index": index,
        "error_code": NONE,
        "high_watermark": hw,
        "last_stable_offset": stable,
        "log_start_offset": log_start,
        "aborted_transactions": [] if isolation_committed else None,
        "preferred_read_replica": -1,
        "records": _EMPTY,
    }
