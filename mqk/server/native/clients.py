"""Who is connected: producer and consumer groups from heartbeats (ClientManageProcessor's job), consumer
subscriptions (used by pulls that do not carry their own), NOTIFY_CONSUMER_IDS_CHANGED to a group's members
when one joins or leaves, expiry of clients that stop heart-beating, and the queue locks orderly consumers take
(LOCK_BATCH_MQ / UNLOCK_BATCH_MQ).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from mqk.broker.internal import ON_DEMAND_QUEUES, retry_topic
from mqk.errors import MqkError
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.server.native.context import BrokerContext
from mqk.server.native.remoting import Connection

log = logging.getLogger("mqk.native")

#: RocketMQ's channelExpiredTimeout: a client silent this long is dropped
CLIENT_EXPIRY_S = 120.0
#: RocketMQ's rebalance lock max live time
LOCK_EXPIRY_S = 60.0


def parse_subscription(expression: str | None) -> frozenset[str] | None:
    """`*` (or empty) = everything (None); else `tagA || tagB`."""
    if expression is None:
        return None
    text = expression.strip()
    if text in ("", "*"):
        return None
    tags = frozenset(t.strip() for t in text.split("||") if t.strip())
    return tags or None


@dataclass
class ConsumerClient:
    client_id: str
    conn: Connection
    last_seen: float
    language: str = "JAVA"
    version: int = 0


@dataclass
class ConsumerGroup:
    name: str
    clients: dict[str, ConsumerClient] = field(default_factory=dict)
    subscriptions: dict[str, frozenset[str] | None] = field(default_factory=dict)
    message_model: str = "CLUSTERING"
    consume_type: str = "CONSUME_PASSIVELY"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    #: as the clients sent them (for admin tools)
    raw_subscriptions: list[dict[str, Any]] = field(default_factory=list)


class ClientManager:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self.groups: dict[str, ConsumerGroup] = {}
        self.producers: dict[str, dict[str, tuple[Connection, float]]] = {}
        self._locks: dict[tuple[str, str, int], tuple[str, float]] = {}  # (group, topic, queue) -> (client, ts)
        self._expiry_task: asyncio.Task[None] | None = None
        self._tracked: set[int] = set()
        self._background: set[asyncio.Task[None]] = set()  # notifications in flight (held so they are not collected)

    def start(self) -> None:
        self._expiry_task = asyncio.create_task(self._expire_loop())

    async def stop(self) -> None:
        if self._expiry_task is not None:
            self._expiry_task.cancel()
            await asyncio.gather(self._expiry_task, return_exceptions=True)

    def subscription(self, group: str, topic: str) -> tuple[bool, frozenset[str] | None]:
        """(known, tags) of a group's registered subscription to topic."""
        info = self.groups.get(group)
        if info is None or topic not in info.subscriptions:
            return False, None
        return True, info.subscriptions[topic]

    def has_consumers(self, group: str) -> bool:
        """Whether a consumer of `group` is heart-beating here: the group is active, so its committed offsets
        do not expire (mqk.groups.coordinator)."""
        info = self.groups.get(group)
        return info is not None and bool(info.clients)

    # --- processors ----------------------------------------------------------------------------------------

    async def heart_beat(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        try:
            data = json.loads(cmd.body or b"{}")
        except (ValueError, UnicodeDecodeError):
            return cmd.response(ResponseCode.SYSTEM_ERROR, "heartbeat body is not JSON")
        if not isinstance(data, dict):
            return cmd.response(ResponseCode.SYSTEM_ERROR, "heartbeat body is not an object")
        client_id = str(data.get("clientID") or f"{conn.peer[0]}@{conn.id}")
        self._track(conn)
        now = self.ctx.clock.monotonic()
        for producer in _list(data.get("producerDataSet")):
            if isinstance(producer, dict) and producer.get("groupName"):
                self.producers.setdefault(str(producer["groupName"]), {})[client_id] = (conn, now)
        for consumer in _list(data.get("consumerDataSet")):
            if not isinstance(consumer, dict) or not consumer.get("groupName"):
                continue
            name = str(consumer["groupName"])
            group = self.groups.setdefault(name, ConsumerGroup(name))
            group.message_model = str(consumer.get("messageModel") or "CLUSTERING")
            group.consume_type = str(consumer.get("consumeType") or group.consume_type)
            group.consume_from_where = str(consumer.get("consumeFromWhere") or group.consume_from_where)
            group.raw_subscriptions = [
                sub for sub in _list(consumer.get("subscriptionDataSet")) if isinstance(sub, dict) and sub.get("topic")
            ]
            subs: dict[str, frozenset[str] | None] = {}
            for sub in _list(consumer.get("subscriptionDataSet")):
                if isinstance(sub, dict) and sub.get("topic"):
                    expression = sub.get("subString")
                    subs[str(sub["topic"])] = parse_subscription(None if expression is None else str(expression))
            group.subscriptions = subs
            known = group.clients.get(client_id)
            changed = known is None or known.conn is not conn
            group.clients[client_id] = ConsumerClient(client_id, conn, now, cmd.language, cmd.version)
            if group.message_model == "CLUSTERING":
                # RocketMQ creates the group's retry topic when its consumers first heart-beat
                try:
                    await self.ctx.ensure_topic(retry_topic(name), ON_DEMAND_QUEUES)
                except MqkError as exc:  # e.g. a group name no topic may carry: consuming still works
                    log.warning("cannot create the retry topic of group %r: %s", name, exc)
            if changed:
                self._notify(group)
        return cmd.response(ResponseCode.SUCCESS)

    async def unregister_client(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        client_id = cmd.get_str("clientID", required=True)
        producer_group = cmd.get_str("producerGroup")
        consumer_group = cmd.get_str("consumerGroup")
        if producer_group and producer_group in self.producers:
            self.producers[producer_group].pop(str(client_id), None)
        if consumer_group:
            self._remove_consumer(consumer_group, str(client_id))
        return cmd.response(ResponseCode.SUCCESS)

    async def get_consumer_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        name = cmd.get_str("consumerGroup", required=True)
        group = self.groups.get(str(name))
        if group is None or not group.clients:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {name}")
        body = json.dumps({"consumerIdList": sorted(group.clients)}).encode()
        return cmd.response(ResponseCode.SUCCESS, body=body)

    async def consumer_connections(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_CONNECTION_LIST (what `mqadmin consumerConnection` shows)."""
        name = cmd.get_str("consumerGroup", required=True)
        group = self.groups.get(str(name))
        if group is None or not group.clients:
            return cmd.response(ResponseCode.CONSUMER_NOT_ONLINE, "the consumer group not online")
        body = {
            "connectionSet": [
                {
                    "clientId": c.client_id,
                    "clientAddr": f"{c.conn.peer[0]}:{c.conn.peer[1]}",
                    "language": c.language,
                    "version": c.version,
                }
                for c in sorted(group.clients.values(), key=lambda c: c.client_id)
            ],
            "subscriptionTable": {sub["topic"]: sub for sub in group.raw_subscriptions},
            "consumeType": group.consume_type,
            "messageModel": group.message_model,
            "consumeFromWhere": group.consume_from_where,
        }
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())

    async def lock_batch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        req = _json_body(cmd)
        group, client = str(req.get("consumerGroup", "")), str(req.get("clientId", ""))
        now = self.ctx.clock.monotonic()
        locked = []
        for mq in _list(req.get("mqSet")):
            key = _mq_key(group, mq)
            if key is None:
                continue
            holder = self._locks.get(key)
            if holder is None or holder[0] == client or now - holder[1] > LOCK_EXPIRY_S:
                self._locks[key] = (client, now)
                locked.append(mq)
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps({"lockOKMQSet": locked}).encode())

    async def unlock_batch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        req = _json_body(cmd)
        group, client = str(req.get("consumerGroup", "")), str(req.get("clientId", ""))
        for mq in _list(req.get("mqSet")):
            key = _mq_key(group, mq)
            if key is not None and self._locks.get(key, ("",))[0] == client:
                del self._locks[key]
        return cmd.response(ResponseCode.SUCCESS)

    # --- membership changes ------------------------------------------------------------------------------------

    def _track(self, conn: Connection) -> None:
        if conn.id not in self._tracked:
            self._tracked.add(conn.id)
            conn.on_close.append(self._connection_closed)

    def _connection_closed(self, conn: Connection) -> None:
        self._tracked.discard(conn.id)
        for group in list(self.groups.values()):
            gone = [cid for cid, c in group.clients.items() if c.conn is conn]
            for cid in gone:
                self._remove_consumer(group.name, cid)
        for members in self.producers.values():
            for cid in [cid for cid, (c, _) in members.items() if c is conn]:
                del members[cid]

    def _remove_consumer(self, group_name: str, client_id: str) -> None:
        group = self.groups.get(group_name)
        if group is None or group.clients.pop(client_id, None) is None:
            return
        for key in [k for k, v in self._locks.items() if k[0] == group_name and v[0] == client_id]:
            del self._locks[key]
        if group.clients:
            self._notify(group)

    def _notify(self, group: ConsumerGroup) -> None:
        for client in list(group.clients.values()):
            task = asyncio.create_task(
                client.conn.send_oneway(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group.name})
            )
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _expire_loop(self) -> None:
        while True:
            await self.ctx.clock.sleep(10)
            deadline = self.ctx.clock.monotonic() - CLIENT_EXPIRY_S
            for group in list(self.groups.values()):
                for cid in [cid for cid, c in group.clients.items() if c.last_seen < deadline]:
                    log.info("consumer %s of group %s expired (no heartbeat)", cid, group.name)
                    self._remove_consumer(group.name, cid)


def _json_body(cmd: RemotingCommand) -> dict[str, Any]:
    try:
        doc = json.loads(cmd.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _list(value: object) -> list[Any]:
    """A JSON array from a client, or nothing (a malformed field is ignored, not a crash)."""
    return value if isinstance(value, list) else []


def _mq_key(group: str, mq: object) -> tuple[str, str, int] | None:
    if not isinstance(mq, dict):
        return None
    try:
        return group, str(mq.get("topic")), int(mq.get("queueId", -1))
    except (TypeError, ValueError):
        return None
