"""RocketMQ 5's MessagingService over gRPC, on the broker's store and its share-state engine.

What the official RocketMQ 5 SDKs (rocketmq-python-client, the Java and Go clients) call, and what each does here:

- QueryRoute: the topic's queues, readable and writable, taking NORMAL, FIFO, DELAY and TRANSACTION messages: all
  on this broker (id 0, the master); in cluster mode each group's queues on its master, at the gRPC address the
  master registered (a client sends, receives and acknowledges at a queue's own broker; QueryAssignment names
  every master holding some of the topic); a missing topic is created under the broker's auto-creation policy, as
  a remoting send creates it. Heartbeat and NotifyClientTermination keep track of which clients are alive (a terminating
  consumer's held messages become visible again at once).
- Telemetry: the settings handshake. The broker answers a client's settings with its own: the largest body
  (`native_max_message_size`), the retry back-off, a consumer's maximum delivery attempts (the group's
  `share.delivery.count.limit`; else its subscription group config's `retryMaxTimes` retries after the first
  delivery; else the share groups' `group_share_delivery_count_limit`: past it a message is no longer delivered,
  and goes to `%DLQ%group`). A group whose config says `consumeEnable` false receives nothing (FORBIDDEN).
- SendMessage: each message stored as a remoting send stores it (mqk.server.native.send), on a queue picked round
  robin or, for a FIFO message, by its message group's hash (so one group's messages keep their order in one
  queue). A delivery time goes to the timer, and the answer carries a recall handle: RecallMessage with it keeps
  the message from being delivered (mqk.server.native.recall, shared with the remoting door). A transactional
  message is a half message (mqk.server.native.transaction, shared with the remoting front door) until
  EndTransaction commits or rolls it back; one left open is checked with the producers of its topic connected
  here: a RecoverOrphanedTransactionCommand on their Telemetry stream, which they answer with EndTransaction.
- ReceiveMessage, AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue, QueryAssignment: POP
  consumption. A RocketMQ consumer group is a share group (mqk.groups.share): a receive acquires records from the
  topic's queues for the group with a lock of the request's invisible duration, an ack accepts them, a change of
  the invisible duration moves the lock's end (the message comes back after it, with its delivery attempt counted),
  a forward copies the message into `%DLQ%group` and archives it. A Kafka share group of the same name shares the
  same records. A receive with nothing to give waits up to its long-polling timeout for new messages. With
  `auto_renew` (push consumers) the broker renews the locks itself while the client stays alive (heart-beating)
  and for at most RENEW_MAX_MS. Tag filters (`*`, `a||b`) are applied to the records: a record the group's filter
  refuses is done for the group. SQL92 filters are refused. A new group starts at a queue's first message while the
  queue still holds every message it ever had, else at its end (RocketMQ 5's POP defaults). The POP part common to
  both RocketMQ 5 front doors is mqk.server.native.pop. A FIFO group (its subscription config's
  consumeMessageOrderly: mqk.server.native.subscriptions) is told `fifo` in its settings, and its receives take a
  queue's messages one batch at a time, in order.

Authentication and authorization with the authorizer on: each call carries RocketMQ 5's `authorization` header
(MQv2-HMAC-SHA1 over `x-mq-date-time` with an access key's secret, mqk.broker.security.access_keys); the access
key NAME is `User:NAME` for Kafka's ACLs, which decide as for the remoting front door (mqk.server.native.acl):
WRITE on a topic to send, READ on the topic and the group to receive, READ on the group to settle. A call that
fails is answered UNAUTHORIZED or FORBIDDEN in its status.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import itertools
import logging
import re
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from hashlib import sha1
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as pbs
from rocketmq.grpc_protocol import service_pb2_grpc as pbs_grpc

from mqk.broker.internal import rocketmq_send_refusal, rocketmq_system_refusal
from mqk.broker.names import ROCKETMQ
from mqk.errors import MqkError
from mqk.groups.share import ACCEPT, REJECT, RENEW, ShareGroups
from mqk.protocol.native.codes import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    ResponseCode,
)
from mqk.server.native.pop import PopRequest
from mqk.server.native.recall import RecallRefused
from mqk.server.native.server import NativeServer
from mqk.server.native.subscriptions import paused
from mqk.server.rocketmq5.messages import (
    ReceiptHandle,
    duration_ms,
    stored_properties,
    tag_filter,
    to_protocol,
)
from mqk.services import BackgroundTask

log = logging.getLogger("mqk.rocketmq5")

Code = pb.Code
#: a receive without an invisible duration (a push consumer's, renewed by the broker) locks for this long
DEFAULT_INVISIBLE_MS = 30_000
#: the invisible durations a receive may ask for (RocketMQ's upper bound; its 10 s lower bound is a proxy setting,
#: and a second keeps tests of redelivery short)
MIN_INVISIBLE_MS, MAX_INVISIBLE_MS = 1_000, 12 * 3600 * 1000
#: most messages one receive returns
MAX_BATCH = 1024
#: auto-renewed locks: how often they are renewed, how long a client may stay silent and still count as alive (its
#: heartbeat comes every 10 s), and how long one message's lock is renewed at most
RENEW_PERIOD_S = 5.0
CLIENT_ALIVE_MS = 30_000
RENEW_MAX_MS = 3600 * 1000
#: the retry back-off a push consumer is told (RocketMQ's delay levels from the third on)
CONSUMER_BACKOFF_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
#: a transaction id is this and the half message's offset in the half topic
TRANSACTION_PREFIX = "mqk-half-"
_AUTHORIZATION = re.compile(r"Credential=([^,\s]+),\s*SignedHeaders=([^,\s]+),\s*Signature=([0-9a-fA-F]+)")


def _half_offset(transaction_id: str) -> int | None:
    """The half message's offset a transaction id names (TRANSACTION_PREFIX + offset), or None."""
    digits = transaction_id.removeprefix(TRANSACTION_PREFIX)
    return int(digits) if transaction_id.startswith(TRANSACTION_PREFIX) and digits.isdigit() else None


def status(code: int, message: str = "") -> Any:
    return pb.Status(code=code, message=message or pb.Code.Name(code))


OK = Code.OK
#: a refused recall's RocketMQ response code -> its gRPC status code
_RECALL_CODES: dict[int, Any] = {
    ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    ResponseCode.ILLEGAL_OPERATION: Code.BAD_REQUEST,
    ResponseCode.SERVICE_NOT_AVAILABLE: Code.INTERNAL_SERVER_ERROR,
}


@dataclass
class Stream:
    """A client's open Telemetry stream: what the broker sends it, and what its settings said it is."""

    outbox: asyncio.Queue[Any]
    producer: bool = False
    #: the topics a producer said it publishes to
    topics: set[str] = field(default_factory=set)


@dataclass
class Renewal:
    """A message a push consumer holds whose lock the broker renews (auto_renew)."""

    group: str
    topic: str
    handle: ReceiptHandle
    lock_ms: int
    since_ms: int


class MessagingService(pbs_grpc.MessagingServiceServicer):  # type: ignore[misc]  # (generated, untyped)
    def __init__(self, native: NativeServer, share: ShareGroups) -> None:
        self.native = native
        self.ctx = native.ctx
        self.config = native.ctx.config
        self.share = share
        #: POP consumption on the share groups' records (shared with the remoting front door)
        self.pop = native.pop
        #: what QueryRoute names as every queue's broker address (set once the listener is bound)
        self.endpoints = pb.Endpoints(scheme=pb.AddressScheme.IPv4)
        #: client id -> when it was last heard of (ms on the broker's clock)
        self.seen: dict[str, int] = {}
        self.renewing: dict[tuple[str, str, int, int], Renewal] = {}
        #: client id -> its Telemetry stream
        self.streams: dict[str, Stream] = {}
        self._asked = itertools.count()
        native.transactions.other_checks.append(self._ask_about_transaction)
        self._round_robin = itertools.count()
        self._renewer = BackgroundTask("rocketmq5-renew")

    def start(self) -> None:
        self._renewer.start(self._renew_loop)

    async def stop(self) -> None:
        await self._renewer.stop()

    # --- who is calling ------------------------------------------------------------------------------------------

    def _client(self, context: Any) -> str:
        """The calling client's id (its x-mq-client-id header, else its address), marked alive."""
        client_id = ""
        for key, value in context.invocation_metadata() or ():
            if key == "x-mq-client-id":
                client_id = value
        if not client_id:
            client_id = context.peer()
        self.seen[client_id] = self.ctx.now_ms()
        return client_id

    @staticmethod
    def _peer_host(context: Any) -> str:
        peer = context.peer() or ""
        kind, _, rest = peer.partition(":")
        if kind == "ipv6":
            return rest.rpartition(":")[0].strip("[]")
        return rest.rpartition(":")[0] or rest

    def _refusal(self, context: Any, needs: list[tuple[str, str, str]]) -> Any:
        """None when the caller may do what `needs` names ((operation, resource type, name)), else the status
        refusing it."""
        if not self.config.authorizer:
            return None
        headers = dict(context.invocation_metadata() or ())
        match = _AUTHORIZATION.search(headers.get("authorization", ""))
        signed_at = headers.get("x-mq-date-time", "")
        if match is None or not signed_at:
            return self._refuse(context, Code.UNAUTHORIZED, "", "the request is not signed")
        access_key, _signed_headers, signature = match.groups()
        security = self.native.ctx.broker.security
        secret = security.access_keys.secret(access_key)
        if secret is None:
            return self._refuse(context, Code.UNAUTHORIZED, access_key, f"unknown access key {access_key}")
        expected = hmac.new(secret.encode(), signed_at.encode(), sha1).hexdigest()
        if not hmac.compare_digest(expected, signature.lower()):
            return self._refuse(context, Code.UNAUTHORIZED, access_key, "the signature does not match")
        principal = security.access_key_principal(access_key)
        host = self._peer_host(context)
        for operation, resource_type, name in needs:
            if not security.authorizer.authorize(principal, host, operation, resource_type, name):
                return self._refuse(
                    context,
                    Code.FORBIDDEN,
                    access_key,
                    f"{principal} is not allowed {operation} on {resource_type} {name}",
                )
        return None

    def _entry(self, context: Any, response: Any, needs: list[tuple[str, str, str]]) -> Any:
        """What a call does first: mark its client alive and check its rights; the refusing answer (a `response`)
        or None."""
        self._client(context)
        refused = self._refusal(context, needs)
        return None if refused is None else response(status=refused)

    def _refuse(self, context: Any, code: int, access_key: str, why: str) -> Any:
        log.warning(
            "rocketmq5: %s from %s%s: %s",
            Code.Name(code),
            context.peer(),
            f" ({access_key})" if access_key else "",
            why,
        )
        return status(code, why)

    # --- routes, clients, settings -------------------------------------------------------------------------------

    async def _queues(self, topic: str, *, create: bool, anywhere: bool = False) -> tuple[int, Any]:
        """The topic's queue count here (`anywhere`: in the whole cluster), or 0 and the status saying why there is
        none."""
        if not topic or not ROCKETMQ.allows(topic):
            return 0, status(Code.ILLEGAL_TOPIC, f"the topic[{topic[:300]}] is not a valid topic name")
        system = rocketmq_system_refusal(topic)  # (never routed, created, sent to nor read from)
        if system:
            return 0, status(Code.ILLEGAL_TOPIC, system)
        topics = self.ctx.topics
        count = topics.queue_count(topic) if anywhere else self.ctx.queue_count(topic)
        if count == 0 and create and topics.may_auto_create(topic):
            try:
                await self.ctx.ensure_topic(topic, topics.auto_create_partitions(topic, 0))
            except MqkError as exc:
                return 0, status(Code.INTERNAL_ERROR, f"cannot create topic {topic}: {exc}")
            count = topics.queue_count(topic) if anywhere else self.ctx.queue_count(topic)
        if count == 0:
            return 0, status(Code.TOPIC_NOT_FOUND, f"topic[{topic}] does not exist")
        return count, None

    async def QueryRoute(self, request: Any, context: Any) -> Any:
        topic = request.topic.name
        refused = self._entry(context, pbs.QueryRouteResponse, [("DESCRIBE", "TOPIC", topic)])
        if refused is not None:
            return refused
        count, failed = await self._queues(topic, create=True, anywhere=True)
        if failed is not None:
            return pbs.QueryRouteResponse(status=failed)
        answer = pbs.QueryRouteResponse(status=status(OK))
        for broker, endpoints, queues in self._brokers_of(topic, count):
            for queue in range(queues):
                answer.message_queues.append(self._message_queue(request.topic, queue, broker, endpoints))
        return answer

    def _brokers_of(self, topic: str, count: int) -> list[tuple[str, Any, int]]:
        """(broker name, its gRPC endpoints, how many of the topic's queues it has) of each broker a RocketMQ 5 client
        reaches the topic through: this one on its own; in cluster mode each group's master holding some of the
        topic, at the gRPC address it registered (a group whose master has none is left out, as unreachable)."""
        cluster = self.ctx.broker.cluster
        record = cluster.topic(topic) if cluster is not None else None
        if cluster is None or record is None:
            return [(self.config.group_name, self.endpoints, count)]
        view = cluster.view
        out = []
        for group in sorted({g for g, _queue in record.partitions}):
            master = view.master_of(group)
            broker = view.broker(master.node_id) if master is not None else None
            address = broker.address("grpc") if broker is not None else None
            if address is not None:
                endpoints = pb.Endpoints(scheme=pb.AddressScheme.IPv4)
                endpoints.addresses.add(host=address[0], port=address[1])
                out.append((group, endpoints, len(record.queues_of(group))))
        return out

    def _message_queue(self, topic: Any, queue: int, broker: str, endpoints: Any) -> Any:
        mq = pb.MessageQueue(id=queue, permission=pb.Permission.READ_WRITE)
        mq.topic.CopyFrom(topic)
        mq.broker.name = broker
        mq.broker.id = 0
        mq.broker.endpoints.CopyFrom(endpoints)
        kinds = [pb.MessageType.NORMAL, pb.MessageType.FIFO, pb.MessageType.DELAY, pb.MessageType.TRANSACTION]
        mq.accept_message_types.extend(kinds)
        return mq

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        self._client(context)
        return pbs.HeartbeatResponse(status=status(OK))

    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        client_id = self._client(context)
        self.seen.pop(client_id, None)
        group = request.group.name
        if group and self.share.release(group, client_id):
            await self.share.save([group])
        for key in [k for k, r in self.renewing.items() if r.handle.member_id == client_id]:
            del self.renewing[key]
        return pbs.NotifyClientTerminationResponse(status=status(OK))

    async def Telemetry(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        """The client's settings stream: each settings command answered with the broker's settings; and the
        broker's own commands to the client (a producer asked about an open transaction) on the same stream."""
        client_id = self._client(context)
        outbox: asyncio.Queue[Any] = asyncio.Queue()
        stream = self.streams[client_id] = Stream(outbox)

        async def read() -> None:
            try:
                async for command in request_iterator:
                    if command.HasField("settings"):
                        asked = command.settings
                        stream.producer = asked.client_type == pb.ClientType.PRODUCER
                        stream.topics = {t.name for t in asked.publishing.topics}
                        outbox.put_nowait(pbs.TelemetryCommand(status=status(OK), settings=self._settings(asked)))
            finally:
                outbox.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while (command := await outbox.get()) is not None:
                yield command
        finally:
            reader.cancel()
            if self.streams.get(client_id) is stream:
                del self.streams[client_id]

    def _settings(self, asked: Any) -> Any:
        """The broker's answer to a client's settings: the client's, with the broker's limits and policies."""
        settings = pb.Settings()
        settings.CopyFrom(asked)
        if asked.client_type == pb.ClientType.PRODUCER:
            settings.publishing.max_body_size = self.config.native_max_message_size
            settings.publishing.validate_message_type = True
            settings.backoff_policy.max_attempts = 3
            backoff = settings.backoff_policy.exponential_backoff
            backoff.initial.nanos = 10_000_000
            backoff.max.seconds = 1
            backoff.multiplier = 2.0
        else:
            attempts = self.share.limit(asked.subscription.group.name)
            settings.subscription.fifo = self.share.orderly(asked.subscription.group.name)
            settings.subscription.receive_batch_size = 32
            if not asked.subscription.HasField("long_polling_timeout"):
                settings.subscription.long_polling_timeout.seconds = 20
            settings.backoff_policy.max_attempts = attempts
            for seconds in CONSUMER_BACKOFF_S[: max(1, attempts - 1)]:
                settings.backoff_policy.customized_backoff.next.add(seconds=seconds)
        return settings

    # --- sending -------------------------------------------------------------------------------------------------

    async def SendMessage(self, request: Any, context: Any) -> Any:
        self._client(context)
        answer = pbs.SendMessageResponse()
        if not request.messages:
            answer.status.CopyFrom(status(Code.BAD_REQUEST, "no message to send"))
            return answer
        for message in request.messages:
            entry = answer.entries.add()
            outcome, message_id, offset, transaction_id, recall_handle = await self._send_one(message, context)
            entry.status.CopyFrom(outcome)
            entry.message_id = message_id
            entry.offset = offset
            entry.transaction_id = transaction_id
            entry.recall_handle = recall_handle
        codes = {e.status.code for e in answer.entries}
        if len(codes) == 1:
            answer.status.CopyFrom(answer.entries[0].status)
        else:
            answer.status.CopyFrom(status(Code.MULTIPLE_RESULTS, "the messages had different outcomes"))
        return answer

    async def _send_one(self, message: Any, context: Any) -> tuple[Any, str, int, str, str]:
        """(status, message id, offset, transaction id, recall handle) of one message sent."""
        topic = message.topic.name
        message_id = message.system_properties.message_id
        refused = self._refusal(context, [("WRITE", "TOPIC", topic)])
        if refused is not None:
            return refused, message_id, -1, "", ""
        refusal = rocketmq_send_refusal(topic)
        if refusal:
            return status(Code.FORBIDDEN, refusal), message_id, -1, "", ""
        sp = message.system_properties
        if "|" in sp.tag:
            return status(Code.ILLEGAL_MESSAGE_TAG, f"tag {sp.tag!r} contains '|'"), message_id, -1, "", ""
        limit = self.config.native_max_message_size
        body = message.body
        if sp.body_encoding == pb.Encoding.GZIP:
            try:
                inflater = zlib.decompressobj(wbits=31)
                body = inflater.decompress(body, limit + 1)
            except zlib.error:
                return status(Code.MESSAGE_CORRUPTED, "the GZIP body does not inflate"), message_id, -1, "", ""
        if not body:
            return status(Code.MESSAGE_BODY_EMPTY, "the message body is empty"), message_id, -1, "", ""
        if len(body) > limit:
            why = f"the message body is larger than {limit} bytes"
            return status(Code.MESSAGE_BODY_TOO_LARGE, why), message_id, -1, "", ""
        count, failed = await self._queues(topic, create=True)
        if failed is not None:
            return failed, message_id, -1, "", ""
        # one message group's messages go to one queue, in order
        by_group = zlib.crc32(sp.message_group.encode()) if sp.message_group else next(self._round_robin)
        queue = by_group % count
        partition = self.ctx.to_partition(topic, queue)
        born = self.ctx.now_ms()
        if sp.HasField("born_timestamp"):
            born = sp.born_timestamp.seconds * 1000 + sp.born_timestamp.nanos // 1_000_000 or born
        born_host = (self._peer_host(context) or "127.0.0.1", 0)
        props = stored_properties(message)
        try:
            if sp.message_type == pb.MessageType.TRANSACTION:  # a half message, visible once committed
                half, offset_id = await self.native.transactions.store_half(
                    topic, partition, body, props, 0, born, born_host
                )
                return status(OK), message_id or offset_id, -1, f"{TRANSACTION_PREFIX}{half}", ""
            ids, offset = await self.native.send.append(topic, partition, [(body, props, 0)], born, 0, born_host)
        except MqkError as exc:
            return status(Code.INTERNAL_ERROR, str(exc)), message_id, -1, "", ""
        return status(OK), message_id or ids[0], offset, "", self.native.recalls.handle_for(topic, props)

    # --- receiving -----------------------------------------------------------------------------------------------

    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        topic, group = request.topic.name, request.group.name
        refused = self._entry(
            context, pbs.QueryAssignmentResponse, [("READ", "TOPIC", topic), ("READ", "GROUP", group)]
        )
        if refused is not None:
            return refused
        count, failed = await self._queues(topic, create=False, anywhere=True)
        if failed is not None:
            return pbs.QueryAssignmentResponse(status=failed)
        # POP: every consumer of the group receives from every queue (-1) of every broker holding some (in cluster
        # mode each master shares out its own queues' records), one acquisition at a time
        answer = pbs.QueryAssignmentResponse(status=status(OK))
        for broker, endpoints, _queues in self._brokers_of(topic, count):
            answer.assignments.add().message_queue.CopyFrom(self._message_queue(request.topic, -1, broker, endpoints))
        return answer

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        member = self._client(context)
        group, topic = request.group.name, request.message_queue.topic.name
        failed = self._receive_refusal(request, context)
        count = 0
        if failed is None:
            count, failed = await self._queues(topic, create=False)
        if failed is not None:
            yield pbs.ReceiveMessageResponse(status=failed)
            return
        tags = tag_filter(request.filter_expression.type, request.filter_expression.expression, pb.FilterType.SQL)
        lock_ms = DEFAULT_INVISIBLE_MS
        if request.HasField("invisible_duration"):
            lock_ms = duration_ms(request.invisible_duration)
        budget = request.batch_size or 32
        poll_s = duration_ms(request.long_polling_timeout) / 1000 if request.HasField("long_polling_timeout") else 0.0
        remaining = context.time_remaining()
        if remaining is not None:  # answer before the client's deadline
            poll_s = min(poll_s, max(0.0, remaining - 0.5))
        await self.pop.prepare(group)
        why = paused(self.share, group)
        if why is not None:
            yield pbs.ReceiveMessageResponse(status=status(Code.FORBIDDEN, why))
            return
        # (a FIFO group's acquisitions are ordered: ShareGroups.orderly, set by its subscription config)
        popped = await self.pop.pop(PopRequest(group, topic, range(count), member, budget, lock_ms, tags), poll_s)
        if not popped:
            yield pbs.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        handles = [ReceiptHandle(p.queue, p.message.queue_offset, p.delivery_count, member) for p in popped]
        messages = [to_protocol(pb, p.message, p.queue, h, lock_ms) for p, h in zip(popped, handles, strict=True)]
        now = self.ctx.now_ms()
        if request.auto_renew:
            for handle in handles:
                key = (group, topic, handle.queue, handle.offset)
                self.renewing[key] = Renewal(group, topic, handle, lock_ms, now)
        yield pbs.ReceiveMessageResponse(status=status(OK))
        delivered = pbs.ReceiveMessageResponse()
        delivered.delivery_timestamp.seconds, millis = divmod(now, 1000)
        delivered.delivery_timestamp.nanos = millis * 1_000_000
        yield delivered
        for message in messages:
            yield pbs.ReceiveMessageResponse(message=message)

    def _receive_refusal(self, request: Any, context: Any) -> Any:
        """The status refusing a receive's arguments or its caller, or None."""
        group, topic = request.group.name, request.message_queue.topic.name
        if not group or not ROCKETMQ.allows(group):
            return status(Code.ILLEGAL_CONSUMER_GROUP, f"consumer group {group[:300]!r} is not valid")
        refused = self._refusal(context, [("READ", "TOPIC", topic), ("READ", "GROUP", group)])
        if refused is not None:
            return refused
        try:
            tag_filter(request.filter_expression.type, request.filter_expression.expression, pb.FilterType.SQL)
        except ValueError as exc:
            return status(Code.ILLEGAL_FILTER_EXPRESSION, str(exc))
        if request.HasField("invisible_duration"):
            lock_ms = duration_ms(request.invisible_duration)
            if not MIN_INVISIBLE_MS <= lock_ms <= MAX_INVISIBLE_MS:
                why = f"invisible duration {lock_ms} ms is outside [{MIN_INVISIBLE_MS}, {MAX_INVISIBLE_MS}]"
                return status(Code.ILLEGAL_INVISIBLE_TIME, why)
        if not 0 <= request.batch_size <= MAX_BATCH:
            return status(Code.BAD_REQUEST, f"batch size {request.batch_size} is outside [1, {MAX_BATCH}]")
        return None

    # --- settling ------------------------------------------------------------------------------------------------

    def _settle(
        self, group: str, topic: str, text: str, kind: int, lock_ms: int = 0
    ) -> tuple[Any, ReceiptHandle | None]:
        """Apply ACCEPT, REJECT or RENEW (for `lock_ms` from now) to the message a receipt handle names."""
        handle = ReceiptHandle.decode(text)
        if handle is None:
            return status(Code.INVALID_RECEIPT_HANDLE, "not a receipt handle of this broker"), None
        why = self.pop.settle(
            group, topic, handle.queue, handle.offset, handle.member_id, handle.delivery_count, kind, lock_ms
        )
        if why is not None:
            return status(Code.INVALID_RECEIPT_HANDLE, why), None
        if kind != RENEW:
            self.renewing.pop((group, topic, handle.queue, handle.offset), None)
        return status(OK), handle

    async def AckMessage(self, request: Any, context: Any) -> Any:
        self._client(context)
        group, topic = request.group.name, request.topic.name
        answer = pbs.AckMessageResponse()
        refused = self._refusal(context, [("READ", "GROUP", group)])
        await self.share.ensure_loaded(self.ctx.store)
        for entry in request.entries:
            outcome = refused if refused is not None else self._settle(group, topic, entry.receipt_handle, ACCEPT)[0]
            answer.entries.add(message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=outcome)
        await self.share.save([group])
        codes = {e.status.code for e in answer.entries}
        if len(codes) == 1:
            answer.status.CopyFrom(answer.entries[0].status)
        elif not answer.entries:
            answer.status.CopyFrom(status(Code.BAD_REQUEST, "no entry to acknowledge"))
        else:
            answer.status.CopyFrom(status(Code.MULTIPLE_RESULTS, "some acknowledgements were refused"))
        return answer

    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        group, topic = request.group.name, request.topic.name
        refused = self._entry(context, pbs.ChangeInvisibleDurationResponse, [("READ", "GROUP", group)])
        if refused is not None:
            return refused
        lock_ms = duration_ms(request.invisible_duration)
        if not 0 <= lock_ms <= MAX_INVISIBLE_MS:
            why = f"invisible duration {lock_ms} ms is outside [0, {MAX_INVISIBLE_MS}]"
            return pbs.ChangeInvisibleDurationResponse(status=status(Code.ILLEGAL_INVISIBLE_TIME, why))
        await self.share.ensure_loaded(self.ctx.store)
        outcome, handle = self._settle(group, topic, request.receipt_handle, RENEW, lock_ms)
        if handle is not None:
            # the client decides from now on (a push consumer's retry back-off): the broker stops renewing
            self.renewing.pop((group, topic, handle.queue, handle.offset), None)
            await self.share.save([group])
        return pbs.ChangeInvisibleDurationResponse(
            status=outcome, receipt_handle=handle.encode() if handle is not None else request.receipt_handle
        )

    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        group, topic = request.group.name, request.topic.name
        refused = self._entry(context, pbs.ForwardMessageToDeadLetterQueueResponse, [("READ", "GROUP", group)])
        if refused is not None:
            return refused
        await self.share.ensure_loaded(self.ctx.store)
        handle = ReceiptHandle.decode(request.receipt_handle)
        if handle is None or handle.queue >= self.ctx.queue_count(topic):
            failed = status(Code.INVALID_RECEIPT_HANDLE, "not a receipt handle of this broker")
            return pbs.ForwardMessageToDeadLetterQueueResponse(status=failed)
        message = await self.pop.message_at(topic, self.ctx.to_partition(topic, handle.queue), handle.offset)
        if message is None:
            failed = status(Code.MESSAGE_NOT_FOUND, f"no message at offset {handle.offset} of queue {handle.queue}")
            return pbs.ForwardMessageToDeadLetterQueueResponse(status=failed)
        outcome, settled = self._settle(group, topic, request.receipt_handle, REJECT)
        if settled is None:
            return pbs.ForwardMessageToDeadLetterQueueResponse(status=outcome)
        try:
            await self.pop.write_dead_letter(group, topic, message, handle.delivery_count)
        except MqkError as exc:
            return pbs.ForwardMessageToDeadLetterQueueResponse(status=status(Code.INTERNAL_ERROR, str(exc)))
        await self.share.save([group])
        return pbs.ForwardMessageToDeadLetterQueueResponse(status=status(OK))

    async def _renew_loop(self) -> None:
        """Every RENEW_PERIOD_S: renew the auto_renew locks of live clients (see the module docstring; the locks
        nobody renews run out in mqk.server.native.pop)."""
        while True:
            await self.ctx.clock.sleep(RENEW_PERIOD_S)
            now = self.ctx.now_ms()
            for key, renewal in list(self.renewing.items()):
                alive = now - self.seen.get(renewal.handle.member_id, -CLIENT_ALIVE_MS) < CLIENT_ALIVE_MS
                if not alive or now - renewal.since_ms > RENEW_MAX_MS:
                    del self.renewing[key]
                    continue
                outcome, _handle = self._settle(
                    renewal.group, renewal.topic, renewal.handle.encode(), RENEW, renewal.lock_ms
                )
                if outcome.code != OK:  # settled or lost meanwhile
                    self.renewing.pop(key, None)

    # --- transactions -------------------------------------------------------------------------------------------

    async def EndTransaction(self, request: Any, context: Any) -> Any:
        """Commit or roll back a transactional message (the producer's decision, or its answer to a check)."""
        topic = request.topic.name
        refused = self._entry(context, pbs.EndTransactionResponse, [("WRITE", "TOPIC", topic)])
        if refused is not None:
            return refused
        half_offset = _half_offset(request.transaction_id)
        half = None if half_offset is None else await self.native.transactions.half_message(half_offset)
        props = {} if half is None else half.properties
        if (
            half_offset is None
            or props.get(PROPERTY_REAL_TOPIC) != topic
            or props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, request.message_id) != request.message_id
        ):
            why = f"transaction {request.transaction_id!r} of message {request.message_id!r} is not open on {topic!r}"
            return pbs.EndTransactionResponse(status=status(Code.INVALID_TRANSACTION_ID, why))
        if request.resolution not in (pb.TransactionResolution.COMMIT, pb.TransactionResolution.ROLLBACK):
            why = "the resolution is neither COMMIT nor ROLLBACK"
            return pbs.EndTransactionResponse(status=status(Code.BAD_REQUEST, why))
        try:
            await self.native.transactions.resolve(half_offset, request.resolution == pb.TransactionResolution.COMMIT)
        except MqkError as exc:
            return pbs.EndTransactionResponse(status=status(Code.INTERNAL_ERROR, str(exc)))
        return pbs.EndTransactionResponse(status=status(OK))

    async def _ask_about_transaction(self, half: Any) -> bool:
        """The transaction check of a half message no remoting producer can be asked about: a producer of its topic
        connected here is sent a RecoverOrphanedTransactionCommand (it answers with EndTransaction). Whether one
        was asked."""
        topic = half.properties.get(PROPERTY_REAL_TOPIC, "")
        producers = [s for s in self.streams.values() if s.producer and (not s.topics or topic in s.topics)]
        if not producers:
            return False
        try:
            queue = int(half.properties.get(PROPERTY_REAL_QUEUE_ID, "0"))
        except ValueError:
            queue = 0
        shown = dataclasses.replace(half, topic=topic, queue_id=queue)
        command = pbs.TelemetryCommand(status=status(OK))
        command.recover_orphaned_transaction_command.message.CopyFrom(to_protocol(pb, shown, queue))
        command.recover_orphaned_transaction_command.transaction_id = f"{TRANSACTION_PREFIX}{half.queue_offset}"
        producers[next(self._asked) % len(producers)].outbox.put_nowait(command)
        return True

    # --- what this broker does not offer ---------------------------------------------------------------------

    async def _unsupported(self, response: Any, what: str, context: Any) -> Any:
        self._client(context)
        return response(status=status(Code.UNSUPPORTED, f"{what} is not offered by this broker"))

    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self._client(context)
        yield pbs.PullMessageResponse(status=status(Code.UNSUPPORTED, "PullMessage (lite pull) is not offered"))

    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        return await self._unsupported(pbs.UpdateOffsetResponse, "UpdateOffset (lite pull)", context)

    async def GetOffset(self, request: Any, context: Any) -> Any:
        return await self._unsupported(pbs.GetOffsetResponse, "GetOffset (lite pull)", context)

    async def QueryOffset(self, request: Any, context: Any) -> Any:
        return await self._unsupported(pbs.QueryOffsetResponse, "QueryOffset (lite pull)", context)

    async def RecallMessage(self, request: Any, context: Any) -> Any:
        topic = request.topic.name
        refused = self._entry(context, pbs.RecallMessageResponse, [("WRITE", "TOPIC", topic)])
        if refused is not None:
            return refused
        try:
            message_id = await self.native.recalls.recall(topic, request.recall_handle)
        except RecallRefused as exc:
            code = _RECALL_CODES.get(exc.code, Code.INTERNAL_ERROR)
            return pbs.RecallMessageResponse(status=status(code, str(exc)))
        return pbs.RecallMessageResponse(status=status(OK), message_id=message_id)

    async def SyncLiteSubscription(self, request: Any, context: Any) -> Any:
        return await self._unsupported(pbs.SyncLiteSubscriptionResponse, "SyncLiteSubscription (lite topics)", context)


__all__ = ["MessagingService"]
