"""Produce: validate each partition's record batches (mqk.protocol.kafka.records), enforce idempotence, append.

A topic internal to the broker (mqk.broker.internal: the timer's, the transaction topics, `__consumer_offsets`) is
refused as a whole with INVALID_TOPIC_EXCEPTION, as Kafka refuses appends to its internal topics; only the broker's
own services write them. Per partition, in order: topic (auto-created like Metadata) and partition exist → batches
valid (CRC, framing, every record's fields, size against the topic's max.message.bytes, whose default is the
broker's message.max.bytes as in Kafka: MESSAGE_TOO_LARGE above it; legacy message sets converted; on a compacted
topic a key on every record; on a CreateTime topic every record's timestamp within message.timestamp.before.max.ms
and message.timestamp.after.max.ms of the broker's clock, else INVALID_TIMESTAMP) → idempotent batches pass the
sequence check (a retry of a stored batch is answered with its original offset and not appended again) → append
(LogAppendTime applied by the store per topic config).

A topic whose `compression.type` names a codec (not `producer`, the default) has every batch in another codec
recompressed before the sequence check and the append, as Kafka's LogValidator does (`_prepare_recompressing`;
producer id, epoch and sequence stay, so idempotence sees the same batch). The default costs the hot path one
look at the cached topic limits per topic and request, nothing per partition or record.

A request is answered in two steps: `prepare` checks everything that needs no waiting (the batches, the topics'
limits, which partitions are idempotent) and `answer_prepared` appends and answers. The Kafka connection prepares
the Produce requests that arrive together (a client with several requests in flight, librdkafka sending one
partition per request) and answers them with one `answer_prepared` call: a topic's partitions without
idempotence, from all of those requests, reach the store in one `store.append_many` call (one write, one wake-up
of the fetch waiters, under sync flush one flush wait), each answered with its own result. Idempotent partitions
then go through the sequence check one by one, in request order.

Records cost no per-record Python work: scanning, CRC and the record walk (which also finds delay headers for the
timer's put hook and null keys for compacted topics) are `_fast` kernels, compressed batches are decompressed
once, and the batches reach the store as memoryviews into the request frame.

acks=0 gets no response (None), but a failure closes the connection, as Kafka does, so the producer notices and
refreshes its metadata; acks=1 and acks=-1 are the same on a single replica (an append completes once the data
is readable and, under sync flush, on disk).

With ACLs on (mqk.broker.security.acls), a topic the principal may not WRITE is answered TOPIC_AUTHORIZATION_FAILED
for each of its partitions (and not auto-created; creating one asks CREATE, on the cluster or the topic); with the
default ALLOW_ALL nothing is asked.

In cluster mode a partition this broker does not lead is answered NOT_LEADER_OR_FOLLOWER (the client refreshes its
metadata and sends it to the leader); the others go on as above.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, TypeAlias

from mqk import errors as E
from mqk.broker.internal import INTERNAL_TOPICS, client_change_refusal
from mqk.broker.security.authorizer import ALLOW_ALL
from mqk.config import FLUSH_SYNC, TopicConfig
from mqk.protocol.kafka import records as kafka_records
from mqk.protocol.kafka.messages.produce import (
    ProduceRequest,
    ProduceRequestPartitionProduceData,
    ProduceResponse,
    ProduceResponsePartitionProduceResponse,
    ProduceResponseTopicProduceResponse,
)
from mqk.protocol.kafka.records import BatchInfo
from mqk.server.kafka.context import CloseConnection, KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers import transactions
from mqk.server.kafka.handlers.common import (
    NONE,
    TOPIC,
    authorizer,
    get_or_create_topic,
    name_topics_by_id,
    partition_code,
)
from mqk.server.kafka.transactions import TRANSACTIONAL_ATTR
from mqk.store.adapter import AppendResult, Buffer, ShardInfo
from mqk.store.manager import StoreManager
from mqk.timer.delay import DELAY_HEADER_KEYS

# typing only: cluster mode's modules (etcd client, controller, replication) load with --cluster alone (start-up)
if TYPE_CHECKING:
    from mqk.broker.replication import Replication

log = logging.getLogger("mqk.kafka.produce")
plan_plain_appends = kafka_records.recbatch.plan_plain_appends
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_NO_LIMIT = _INT64_MAX  # a timestamp window bound that Kafka's default (Long.MAX_VALUE) leaves open

_Answer: TypeAlias = ProduceResponsePartitionProduceResponse
#: one topic's partition answers while its request is answered: None holds the place of a partition whose append
#: is still to come (answer_prepared puts its answer there before the body is sent)
_Slots: TypeAlias = list[_Answer | None]
#: one topic's plain partitions, appended in one call: (topic, [(partition, [batch, ...])], [delay header?],
#: [(answers, slots)], LogAppendTime?); entry i's answer goes to answers[slot] of the (answers, slots) pair it falls in
_PlainAppend: TypeAlias = tuple[str, list[tuple[int, list[Buffer]]], list[bool], list[tuple[_Slots, list[int]]], bool]
#: one idempotent partition: (topic, partition, batches, LogAppendTime?, answers, slot, transaction mode: what a
#: transactional batch for a partition its transaction has not added gets, by request version: TXN_EXPLICIT,
#: TXN_ABORTABLE or TXN_IMPLICIT)
_IdempotentAppend: TypeAlias = tuple[str, int, list[BatchInfo], bool, _Slots, int, int]
#: Produce v0-v10: INVALID_TXN_STATE; v11: TRANSACTION_ABORTABLE (KIP-890 part 1); v12+: the partition is added to
#: the transaction (part 2: a client of transaction version 2 sends no AddPartitionsToTxn)
TXN_EXPLICIT, TXN_ABORTABLE, TXN_IMPLICIT = 0, 1, 2


def _part(
    index: int,
    code: int,
    base_offset: int = -1,
    log_append_time: int = -1,
    log_start: int = -1,
    message: str | None = None,
) -> _Answer:
    # no record_errors: the encoders write an empty list for an absent one (v8+), and the answer stays one key
    # smaller to build and to copy (_STORED)
    return {
        "index": index,
        "error_code": code,
        "base_offset": base_offset,
        "log_append_time_ms": log_append_time,
        "log_start_offset": log_start,
        "error_message": message,
    }


#: a stored partition's answer before its index, offsets and (LogAppendTime) timestamp are set (_append_plain)
_STORED = _part(0, NONE)


class Prepared(NamedTuple):
    """A Produce request checked and ready to append: its answer with a None in place of every partition still
    to be appended, and what to append."""

    acks: int
    #: the response's `responses`, whose partition lists hold the None placeholders until answer_prepared
    responses: list[ProduceResponseTopicProduceResponse]
    #: per topic with plain partitions, its appends (_PlainAppend)
    appends: list[_PlainAppend]
    #: per idempotent partition, its append (_IdempotentAppend)
    idempotent: list[_IdempotentAppend]
    #: acks=all on a replicated group: the min.insync.replicas the answer waits for (0: no wait), and how long
    min_insync: int = 0
    timeout_ms: int = 0


async def handle(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[ProduceRequest]
) -> ProduceResponse | CloseConnection | None:
    """One Produce request on its own (a topic to auto-create first, or a request that arrived alone)."""
    if req.api_version >= 13:
        return (await answer_prepared(ctx, [_prepare_by_id(ctx, peer, req)]))[0]
    denied = _denied(ctx, peer, req.body)
    txn_refused = _txn_refusal(ctx, peer, req.body)
    prepared = prepare(ctx, req.body, denied=denied, txn_refused=txn_refused, version=req.api_version)
    if prepared is None:  # a topic it names does not exist (yet)
        prepared = await _prepare_creating_topics(ctx, peer, req.body, denied, txn_refused, req.api_version)
    return (await answer_prepared(ctx, [prepared]))[0]


def prepare_request(ctx: KafkaContext, peer: Peer, req: KafkaRequest[ProduceRequest]) -> Prepared | None:
    """`prepare` for the connection's grouping (KafkaServer.grouped)."""
    if req.api_version >= 13:
        return _prepare_by_id(ctx, peer, req)
    return prepare(
        ctx,
        req.body,
        denied=_denied(ctx, peer, req.body),
        txn_refused=_txn_refusal(ctx, peer, req.body),
        version=req.api_version,
    )


def _prepare_by_id(ctx: KafkaContext, peer: Peer, req: KafkaRequest[ProduceRequest]) -> Prepared:
    """Produce v13+ names each topic by its id: the ids are resolved to names (an unknown one answers
    UNKNOWN_TOPIC_ID, never auto-creates), the request is prepared as one naming them, and each topic's answer
    carries its id back."""
    body = req.body
    unknown = name_topics_by_id(ctx, body["topic_data"])
    prepared = prepare(
        ctx,
        body,
        dict.fromkeys(unknown, E.UnknownTopicIdError.code),
        denied=_denied(ctx, peer, body),
        txn_refused=_txn_refusal(ctx, peer, body),
        version=req.api_version,
    )
    assert prepared is not None  # (`missing` given: nothing is created)
    for t, answer in zip(body["topic_data"], prepared.responses, strict=True):
        answer["topic_id"] = t["topic_id"]
    return prepared


def _txn_refusal(ctx: KafkaContext, peer: Peer, body: ProduceRequest) -> int:
    """The code every partition of a transactional request gets when its transactional id may not be used (no
    coordinator, or no WRITE on it), else 0."""
    transactional_id = body.get("transactional_id")
    return 0 if transactional_id is None else transactions.refusal(ctx, peer, transactional_id)


def _denied(ctx: KafkaContext, peer: Peer, body: ProduceRequest) -> frozenset[str] | None:
    """The topics of the request the peer may not WRITE (None: every one may be written, or nobody asks)."""
    auth = authorizer(ctx)
    if auth is ALLOW_ALL:
        return None
    principal, host = peer.principal, peer.client_host.lstrip("/")
    denied = None
    for t in body["topic_data"]:
        if not auth.authorize(principal, host, "WRITE", TOPIC, t["name"]):
            denied = (denied or frozenset()) | {t["name"]}
    return denied


def prepare(
    ctx: KafkaContext,
    body: ProduceRequest,
    missing: dict[str, int] | None = None,
    denied: frozenset[str] | None = None,
    txn_refused: int = 0,
    version: int = 9,
) -> Prepared | None:
    """Check a Produce request without waiting for anything: answers for what is refused, the rest planned for
    `answer_prepared`. None if a topic it names does not exist and `missing` does not say that topic's error
    code (`handle` creates the topic and prepares again). The `denied` topics are answered
    TOPIC_AUTHORIZATION_FAILED."""
    acks = body["acks"]
    if acks not in (0, 1, -1):
        return Prepared(acks, _refuse_all(body, E.InvalidRequiredAcksError.code), [], [])
    if txn_refused:
        return Prepared(acks, _refuse_all(body, txn_refused, "the transactional id may not be used here"), [], [])
    responses: list[ProduceResponseTopicProduceResponse] = []
    appends: list[_PlainAppend] = []
    idempotent: list[_IdempotentAppend] = []
    store = ctx.store
    cluster = ctx.cluster
    min_insync = 0
    if acks == -1 and ctx.replication is not None:
        min_insync = _min_insync(store, body, denied)
        try:
            ctx.replication.check_insync(min_insync)
        except E.NotEnoughReplicasError as exc:
            return Prepared(acks, _refuse_all(body, exc.code, str(exc)), [], [])
    for topic in body["topic_data"]:
        name = topic["name"]
        partition_data = topic["partition_data"]
        if denied is not None and name in denied:
            refusal = E.TopicAuthorizationFailedError.code
            responses.append(
                {"name": name, "partition_responses": [_part(p["index"], refusal) for p in partition_data]}
            )
            continue
        info = store.topic(name)
        parts: _Slots = []
        if name in INTERNAL_TOPICS:
            # only the broker's own services write its internal topics (Kafka: "cannot append to internal topic")
            reason = client_change_refusal(name)
            parts.extend(_part(p["index"], E.InvalidTopicError.code, message=reason) for p in partition_data)
            responses.append({"name": name, "partition_responses": parts})  # type: ignore[typeddict-item]  # no Nones
            continue
        if cluster is not None:
            # cluster mode: a partition another broker leads (or none does) is answered now; the rest are this
            # broker's (whose store may not have the topic yet, placed here a moment ago: then as a missing one)
            led = cluster.led_partitions(name)
            refused = (
                []
                if all(p["index"] in led for p in partition_data)
                else [(p["index"], partition_code(ctx, name, p["index"])) for p in partition_data]
            )
            if any(code for _index, code in refused):
                parts.extend(_part(index, code) for index, code in refused if code)
                partition_data = [p for p, (_index, code) in zip(partition_data, refused, strict=True) if not code]
        if info is None and partition_data:
            if missing is None:
                return None
            code = missing.get(name, E.UnknownTopicOrPartitionError.code)
            parts.extend(_part(p["index"], code) for p in partition_data)
        elif partition_data:
            assert info is not None
            _prepare_topic(ctx, name, info, partition_data, parts, appends, idempotent)
        answers: list[_Answer] = parts  # type: ignore[assignment]  # answer_prepared replaces its Nones
        responses.append({"name": name, "partition_responses": answers})
    if version >= 11 and body.get("transactional_id") is not None:
        mode = TXN_IMPLICIT if version >= 12 else TXN_ABORTABLE
        idempotent = [(*entry[:6], mode) for entry in idempotent]
    return Prepared(acks, responses, appends, idempotent, min_insync, body["timeout_ms"])


def _min_insync(store: StoreManager, body: ProduceRequest, denied: frozenset[str] | None) -> int:
    """The largest min.insync.replicas of the replicated topics a request writes to (0 when it writes to none:
    topics of other engines are not replicated, and `denied` ones are not written)."""
    wanted = 0
    for topic in body["topic_data"]:
        if denied is not None and topic["name"] in denied:
            continue
        info = store.topic(topic["name"])
        if info is not None and info.engine == "file":
            wanted = max(wanted, info.config.get_int("min.insync.replicas"))
    return wanted


def _refuse_all(
    body: ProduceRequest, code: int, message: str | None = None
) -> list[ProduceResponseTopicProduceResponse]:
    """The answer of a request refused as a whole: every partition gets `code`."""
    return [
        {
            "name": t["name"],
            "partition_responses": [_part(p["index"], code, message=message) for p in t["partition_data"]],
        }
        for t in body["topic_data"]
    ]


async def _prepare_creating_topics(
    ctx: KafkaContext, peer: Peer, body: ProduceRequest, denied: frozenset[str] | None, txn_refused: int, version: int
) -> Prepared:
    """Create (when auto-creation allows) the topics the request names that do not exist, then prepare it; the
    topics that could not be created are answered with the reason."""
    missing: dict[str, int] = {}
    for topic in body["topic_data"]:
        name = topic["name"]
        if denied is not None and name in denied:
            continue
        if ctx.store.topic(name) is None:
            code, info = await get_or_create_topic(ctx, name, peer=peer)
            if info is None:
                missing[name] = code
            elif ctx.cluster is not None and not await ctx.cluster.reconciler.ensure(name):
                missing[name] = E.NotLeaderOrFollowerError.code  # (its store here is not made: not placed here)
    prepared = prepare(ctx, body, missing, denied, txn_refused, version)
    assert prepared is not None
    return prepared


def _prepare_topic(
    ctx: KafkaContext,
    name: str,
    info: ShardInfo,
    partitions: Sequence[ProduceRequestPartitionProduceData],
    parts: _Slots,
    appends: list[_PlainAppend],
    idempotent: list[_IdempotentAppend],
) -> None:
    """One topic's partitions: an answer (error) or a None placeholder onto `parts` for each, the plain ones onto
    `appends` as one entry list, the idempotent ones onto `idempotent`."""
    # what every partition of the topic shares, looked up once per topic rather than once per partition
    queue_count = info.queue_count
    max_batch_bytes, compacted, log_append_time, before_ms, after_ms, codec = _limits(ctx, info.config)
    timestamps = None  # CreateTime: the window a record's timestamp must lie in (Kafka's LogValidator)
    if not log_append_time and (before_ms < _NO_LIMIT or after_ms < _NO_LIMIT):
        now = ctx.clock.time_ms()
        timestamps = (max(_INT64_MIN, now - before_ms), min(_INT64_MAX, now + after_ms))
    if codec is not None:
        _prepare_recompressing(
            name,
            info,
            partitions,
            codec,
            (max_batch_bytes, compacted, log_append_time, timestamps),
            parts,
            appends,
            idempotent,
        )
        return
    validate = kafka_records.validate_produce_records
    plain: list[tuple[int, list[Buffer]]] = []
    delays: list[bool] = []  # per plain entry: does a record carry a delay header (PutContext)
    slots: list[int] = []
    if partitions.__class__ is not list:
        partitions = list(partitions)
    i, count = 0, len(partitions)
    while i < count:
        # one kernel call takes the plain partitions (valid, uncompressed, not idempotent) from i on, as the
        # loop below would; the loop takes the one it stopped at
        i, stop = plan_plain_appends(
            partitions,
            i,
            queue_count,
            max_batch_bytes,
            DELAY_HEADER_KEYS,
            compacted,
            timestamps,
            plain,
            delays,
            slots,
            parts,
        )
        if i == count:
            break
        general_path = ctx.produce_general_path
        if general_path is not None:
            general_path[stop] = general_path.get(stop, 0) + 1
        p = partitions[i]
        i += 1
        index = p["index"]
        if not 0 <= index < queue_count:
            parts.append(_part(index, E.UnknownTopicOrPartitionError.code))
            continue
        try:
            # the record check also says whether a record carries a delay header, so the timer's put hook need
            # not walk (or decompress and decode) the batches again
            batches = validate(
                p["records"],
                max_batch_bytes,
                header_names=DELAY_HEADER_KEYS,
                require_keys=compacted,
                timestamps=timestamps,
            )
        except Exception as exc:  # noqa: BLE001 - that partition's answer (_refused says which)
            parts.append(_refused(index, exc, p["records"], compacted, timestamps))
            continue
        first = batches[0]
        if first.producer_id < 0 or first.base_sequence < 0:
            slots.append(len(parts))
            parts.append(None)
            if len(batches) == 1:
                plain.append((index, [first.data]))
                delays.append(first.named_header)
            else:
                plain.append((index, [b.data for b in batches]))
                delays.append(any(b.named_header for b in batches))
        else:
            idempotent.append((name, index, batches, log_append_time, parts, len(parts), TXN_EXPLICIT))
            parts.append(None)
    if plain:
        appends.append((name, plain, delays, [(parts, slots)], log_append_time))


def _prepare_recompressing(
    name: str,
    info: ShardInfo,
    partitions: Sequence[ProduceRequestPartitionProduceData],
    codec: int,
    limits: tuple[int, bool, bool, tuple[int, int] | None],
    parts: _Slots,
    appends: list[_PlainAppend],
    idempotent: list[_IdempotentAppend],
) -> None:
    """`_prepare_topic` for a topic whose compression.type is `codec`: every partition through the record check,
    then each batch in another codec recompressed (the kernel's plain plan takes only uncompressed batches, so it
    would keep them as they came)."""
    max_batch_bytes, compacted, log_append_time, timestamps = limits
    plain: list[tuple[int, list[Buffer]]] = []
    delays: list[bool] = []
    slots: list[int] = []
    for p in partitions:
        index = p["index"]
        if not 0 <= index < info.queue_count:
            parts.append(_part(index, E.UnknownTopicOrPartitionError.code))
            continue
        try:
            batches = [
                kafka_records.recompress(batch, codec)
                for batch in kafka_records.validate_produce_records(
                    p["records"],
                    max_batch_bytes,
                    header_names=DELAY_HEADER_KEYS,
                    require_keys=compacted,
                    timestamps=timestamps,
                )
            ]
        except Exception as exc:  # noqa: BLE001 - that partition's answer (_refused says which)
            parts.append(_refused(index, exc, p["records"], compacted, timestamps))
            continue
        first = batches[0]
        if first.producer_id < 0 or first.base_sequence < 0:
            slots.append(len(parts))
            parts.append(None)
            plain.append((index, [b.data for b in batches]))
            delays.append(any(b.named_header for b in batches))
        else:
            idempotent.append((name, index, batches, log_append_time, parts, len(parts), TXN_EXPLICIT))
            parts.append(None)
    if plain:
        appends.append((name, plain, delays, [(parts, slots)], log_append_time))


async def answer_prepared(
    ctx: KafkaContext, prepared: list[Prepared]
) -> list[ProduceResponse | CloseConnection | None]:
    """Append what the prepared requests planned and answer each (a response body, None for acks=0, or
    CloseConnection for a failed acks=0): every topic's plain partitions of all of them in one append_many call
    (in request order), then the idempotent partitions."""
    store = ctx.store
    if len(prepared) == 1:
        appends, idempotent = prepared[0].appends, prepared[0].idempotent
    else:
        appends, idempotent = _merged(prepared), [entry for p in prepared for entry in p.idempotent]
    cluster = ctx.cluster
    if cluster is not None:
        epoch = cluster.leader_epoch()
        if epoch > 0:
            _stamp(cluster.epoch_bases, epoch, appends, idempotent)
    for topic, entries, delays, answers, log_append_time in appends:
        await _append_plain(store, topic, entries, delays, answers, log_append_time)
    if idempotent:
        if ctx.config.store.flush_mode == FLUSH_SYNC:
            # under sync flush each idempotent append waits for its fsync: run them concurrently so they share the
            # group commit (one partition's batches still go one by one inside _produce_idempotent)
            results = await asyncio.gather(
                *(
                    _produce_idempotent(ctx, topic, index, batches, lat, mode)
                    for topic, index, batches, lat, _parts, _slot, mode in idempotent
                )
            )
            for (_t, _i, _b, _l, parts, slot, _m), answer in zip(idempotent, results, strict=True):
                parts[slot] = answer
        else:
            for topic, index, batches, lat, parts, slot, mode in idempotent:
                parts[slot] = await _produce_idempotent(ctx, topic, index, batches, lat, mode)
    if ctx.replication is not None:
        replicated = [p for p in prepared if p.min_insync]
        if replicated:
            await _wait_replicated(ctx.replication, replicated)
    return [_body(p) for p in prepared]


def _stamp(
    epoch_bases: Callable[[str], Sequence[int]],
    epoch: int,
    appends: list[_PlainAppend],
    idempotent: list[_IdempotentAppend],
) -> None:
    """Every batch to append carries its partition's leader epoch: this master's epoch plus the partition's base
    (`epoch_bases(topic)`, non-zero for a partition that moved here from another group). A broker on its own
    leaves what producers wrote: it has one epoch, 0, and answers OffsetForLeaderEpoch with its log end for it."""
    stamp = kafka_records.stamp_leader_epoch
    for topic, entries, _delays, _answers, _lat in appends:
        bases = epoch_bases(topic)
        for index, buffers in entries:
            leader_epoch = epoch + bases[index] if index < len(bases) else epoch
            for i, buf in enumerate(buffers):
                buffers[i] = stamp(buf, leader_epoch)
    for topic, index, batches, _lat, _parts, _slot, _mode in idempotent:
        bases = epoch_bases(topic)
        leader_epoch = epoch + bases[index] if index < len(bases) else epoch
        for i, batch in enumerate(batches):
            stamped = stamp(batch.data, leader_epoch)
            if stamped is not batch.data:
                batches[i] = batch._replace(data=stamped)


async def _wait_replicated(replication: Replication, prepared: list[Prepared]) -> None:
    """acks=all: answer once every in-sync replica holds what was appended (the CommitLog end now covers it);
    if they do not in time (or the set shrank, or this broker stopped being master) the partitions stored here
    are answered with that error, and the producer retries (an idempotent one without duplicates)."""
    target = replication.engine.log_end
    try:
        await replication.wait_replicated(
            target, max(p.min_insync for p in prepared), max(1, min(p.timeout_ms for p in prepared)) / 1000
        )
    except E.KafkaError as exc:
        for p in prepared:
            for topic in p.responses:
                for answer in topic["partition_responses"]:
                    if answer["error_code"] == NONE:
                        answer["error_code"] = exc.code
                        answer["error_message"] = str(exc)
                        answer["base_offset"] = -1


def _merged(prepared: list[Prepared]) -> list[_PlainAppend]:
    """The requests' appends with one entry list per topic (and LogAppendTime setting), in request order."""
    by_topic: dict[tuple[str, bool], _PlainAppend] = {}
    for p in prepared:
        for append in p.appends:
            topic, entries, delays, answers, log_append_time = append
            key = (topic, log_append_time)
            merged = by_topic.get(key)
            if merged is None:
                by_topic[key] = (topic, list(entries), list(delays), list(answers), log_append_time)
            else:
                merged[1].extend(entries)
                merged[2].extend(delays)
                merged[3].extend(answers)
    return list(by_topic.values())


def _body(prepared: Prepared) -> ProduceResponse | CloseConnection | None:
    if prepared.acks == 0:
        failed = [
            (t["name"], p["index"], p["error_code"])
            for t in prepared.responses
            for p in t["partition_responses"]
            if p["error_code"]
        ]
        if failed:
            return CloseConnection(f"acks=0 produce failed for {failed[:3]}")
        return None
    return {"responses": prepared.responses, "throttle_time_ms": 0}


def _limits(ctx: KafkaContext, config: TopicConfig) -> tuple[int, bool, bool, int, int, int | None]:
    """(max batch bytes, compacted, log append time, message.timestamp.before.max.ms,
    message.timestamp.after.max.ms, the codec compression.type asks for or None for `producer`) of a topic config,
    computed once per config object (configs are frozen; a changed topic gets a new one) and kept in the context."""
    cache = ctx.produce_limits
    entry = cache.get(id(config))
    if entry is not None and entry[0] is config:
        return entry[1]
    # a topic without its own max.message.bytes takes the broker's message.max.bytes (Kafka's default rule)
    own = config.overrides.get("max.message.bytes")
    limits = (
        min(int(own) if own is not None else ctx.config.message_max_bytes, ctx.config.socket_request_max_bytes),
        config.compacted,
        config.log_append_time,
        config.get_int("message.timestamp.before.max.ms"),
        config.get_int("message.timestamp.after.max.ms"),
        kafka_records.TOPIC_CODECS.get(config.get("compression.type")),
    )
    if len(cache) > 10_000:
        cache.clear()
    cache[id(config)] = (config, limits)
    return limits


def _refused(
    index: int,
    exc: Exception,
    records: object = None,
    compacted: bool = False,
    timestamps: tuple[int, int] | None = None,
) -> _Answer:
    """The answer of a partition whose records the check refused. A record the topic's rules refuse (a null key
    on a compacted topic, a timestamp outside the window) is named in `record_errors` with every other such record
    of its batch (KIP-467), so a client can tell which of its records failed."""
    if (
        isinstance(exc, E.InvalidRecord)
        and isinstance(records, (bytes, bytearray, memoryview))
        and (compacted or timestamps is not None)
    ):
        answer = _part(index, E.kafka_code_for(exc), message=str(exc))
        errors = _record_errors(records, compacted, timestamps)
        if errors:
            answer["record_errors"] = [
                {"batch_index": i, "batch_index_error_message": message} for i, message in errors
            ]
        return answer
    if isinstance(exc, E.MqkError):
        return _part(index, E.kafka_code_for(exc), message=str(exc))
    # bytes we cannot judge are corrupt, never a crash
    return _part(index, E.CorruptMessageError.code, message=f"undecodable records: {exc}")


def _record_errors(records: Buffer, compacted: bool, timestamps: tuple[int, int] | None) -> list[tuple[int, str]]:
    """(index in its batch, why) of every record the topic's rules refuse, in the first batch that has one. Only
    on the error path: the records are decoded in Python, one by one (undecodable bytes: none named)."""
    try:
        view = memoryview(records)
        for pos, size, *_ in kafka_records.recbatch.scan_batches(view, False):
            batch = view[pos : pos + size]
            base_ts = kafka_records.recbatch.parse_header(batch, 0)[7]
            errors = []
            for i, (_attrs, ts_delta, _delta, key, _value, _headers) in enumerate(kafka_records.batch_records(batch)):
                if compacted and key is None:
                    errors.append((i, "compacted topic: every record needs a key"))
                elif timestamps is not None:
                    ts = base_ts + ts_delta
                    if ts != -1 and not timestamps[0] <= ts <= timestamps[1]:
                        errors.append((i, f"timestamp {ts} is out of range [{timestamps[0]}, {timestamps[1]}]"))
            if errors:
                return errors
    except (E.MqkError, ValueError):  # bytes this pass cannot read: the code and message say enough
        return []
    return []


async def _append_plain(
    store: StoreManager,
    topic: str,
    entries: list[tuple[int, list[Buffer]]],
    delays: list[bool],
    answers: list[tuple[_Slots, list[int]]],
    log_append_time: bool,
) -> None:
    """Append the entries (partition, batches) in one call and put each partition's answer in its place: entry i
    belongs to the i-th slot of the (answer list, slots) pairs taken in order."""
    try:
        results = await store.append_many(topic, entries, log_append_time=log_append_time, delay_headers=delays)
    except Exception as exc:  # noqa: BLE001 - the store answers per entry; anything else fails them all
        results = [exc] * len(entries)
    # each answer is a copy of a template with three fields set: a dict display of its keys costs more than the copy
    copy = _STORED.copy
    i = 0
    for parts, slots in answers:
        for slot in slots:
            result = results[i]
            index = entries[i][0]
            i += 1
            if result.__class__ is AppendResult:
                answer = parts[slot] = copy()
                answer["index"] = index
                answer["base_offset"] = result.base_offset
                answer["log_start_offset"] = result.log_start_offset
                if log_append_time:
                    answer["log_append_time_ms"] = result.log_append_time
            else:
                parts[slot] = _storage_failure(topic, index, result)  # type: ignore[arg-type]  # not an AppendResult


async def _produce_idempotent(
    ctx: KafkaContext, topic: str, index: int, batches: list[BatchInfo], log_append_time: bool, txn_mode: int
) -> _Answer:
    store = ctx.store
    # idempotent producer: one batch at a time through the sequence check
    first_offset = -1
    last = None
    txns = ctx.transactions
    for batch in batches:
        if batch.attributes & TRANSACTIONAL_ATTR:
            if txns is None:
                code = E.TransactionalIdAuthorizationFailedError.code
            else:
                code = 0
                if txn_mode == TXN_IMPLICIT:
                    code = await txns.add_implicitly(topic, index, batch.producer_id, batch.producer_epoch)
                code = code or await txns.check_write(topic, index, batch.producer_id, batch.producer_epoch)
                if code == E.InvalidTxnStateError.code and txn_mode == TXN_ABORTABLE:
                    code = E.TransactionAbortableError.code
            if code:
                return _part(index, code, message="the batch's transaction may not write to this partition now")
            if batch.named_header:
                return _part(
                    index,
                    E.InvalidRecordError.code,
                    message="delayed delivery headers cannot be used inside a Kafka transaction",
                )
        decision = await ctx.producers.begin(
            topic, index, batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.last_offset_delta
        )
        if decision.error:
            return _part(index, decision.error, message="producer sequence check failed")
        if decision.duplicate is not None:
            entry = decision.duplicate
            if not await ctx.producers.settle(entry):
                return _part(index, E.KafkaStorageError.code, message="the original append failed; retry")
            if first_offset < 0:
                first_offset = entry.base_offset
            last = (entry.log_append_time, store.log_start_offset(topic, index))
            continue
        try:
            if batch.attributes & TRANSACTIONAL_ATTR:
                assert txns is not None
                # before the append: a read_committed fetch must never find the batch ahead of the partition's LSO
                await txns.will_write(topic, index, batch.producer_id, store.end_offset(topic, index))
            result = await store.append(topic, index, [batch.data], delay_headers=batch.named_header)
        except Exception as exc:  # noqa: BLE001 - the partition's answer carries the code (_storage_failure)
            ctx.producers.abort(decision)
            return _storage_failure(topic, index, exc)
        ts = result.log_append_time if log_append_time else -1
        ctx.producers.complete(decision, result.base_offset, ts)
        if first_offset < 0:
            first_offset = result.base_offset
        last = (ts, result.log_start_offset)
    assert last is not None
    return _part(index, NONE, first_offset, last[0], last[1])


def _storage_failure(topic: str, index: int, exc: BaseException) -> _Answer:
    code = E.kafka_code_for(exc)
    if code in (E.KafkaStorageError.code, E.UnknownServerError.code):
        log.warning("append to %s/%d failed: %r", topic, index, exc)
    return _part(index, code, message=str(exc) or type(exc).__name__)
