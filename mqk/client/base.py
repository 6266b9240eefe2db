"""What producers and consumers share: name-server lookups (topic routes), one connection per broker address,
request helpers that turn error codes into `ClientError`, and the client id RocketMQ clients heart-beat with."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mqk.client.remoting import ClientError, RemotingConnection
from mqk.config import parse_hostport
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.protocol.native.command import RemotingCommand, stringify_fields


@dataclass(frozen=True, order=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id}


@dataclass
class TopicRoute:
    topic: str
    queues: list[MessageQueue]  #: writable and readable queues (mqk runs one broker)
    broker_addrs: dict[str, tuple[str, int]]  #: broker name -> master address


class ClientBase:
    def __init__(self, namesrv: str | tuple[str, int], group: str, request_timeout: float = 30.0) -> None:
        self.namesrv = parse_hostport(namesrv) if isinstance(namesrv, str) else namesrv
        self.group = group
        self.request_timeout = request_timeout
        self.client_id = f"{socket.gethostname()}@{os.getpid()}@{id(self):x}"
        self._connections: dict[tuple[str, int], RemotingConnection] = {}
        self._routes: dict[str, TopicRoute] = {}
        self._connect_lock = asyncio.Lock()
        self.on_server_request: Callable[[RemotingCommand], None] | None = None
        #: TLS for every connection (name server and brokers), as a RocketMQ client with tls.enable: set it before
        #: the first call
        self.ssl: ssl.SSLContext | None = None
        #: (access key, secret key): sign every request as RocketMQ's ACL client hook does; set it before the first
        #: call
        self.credentials: tuple[str, str] | None = None

    async def _connection(self, address: tuple[str, int]) -> RemotingConnection:
        conn = self._connections.get(address)
        if conn is not None and not conn.closed:
            return conn
        async with self._connect_lock:
            conn = self._connections.get(address)
            if conn is None or conn.closed:
                conn = RemotingConnection(address, self._server_request, ssl=self.ssl, credentials=self.credentials)
                try:
                    await conn.connect()
                except OSError as exc:
                    raise ClientError(f"cannot connect to {address[0]}:{address[1]}: {exc}") from None
                self._connections[address] = conn
            return conn

    def _server_request(self, cmd: RemotingCommand) -> None:
        if self.on_server_request is not None:
            self.on_server_request(cmd)

    async def invoke(
        self,
        address: tuple[str, int],
        code: int,
        ext: dict[str, Any] | None = None,
        body: bytes | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - a per-request deadline, as RocketMQ clients offer
        ok: tuple[int, ...] = (ResponseCode.SUCCESS,),
    ) -> RemotingCommand:
        conn = await self._connection(address)
        cmd = RemotingCommand(code=int(code), ext_fields=stringify_fields(ext or {}), body=body, language="PYTHON")
        response = await conn.invoke(cmd, timeout or self.request_timeout)
        if response.code not in ok:
            raise ClientError(
                f"request {RequestCode(code).name if code in RequestCode._value2member_map_ else code}"
                f" failed: code {response.code} {response.remark or ''}".rstrip(),
                response.code,
            )
        return response

    async def oneway(self, address: tuple[str, int], code: int, ext: dict[str, Any]) -> None:
        conn = await self._connection(address)
        await conn.oneway(RemotingCommand(code=int(code), ext_fields=stringify_fields(ext), language="PYTHON"))

    async def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        if not refresh and topic in self._routes:
            return self._routes[topic]
        resp = await self.invoke(self.namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        data = json.loads(resp.body or b"{}")
        addrs = {
            b["brokerName"]: parse_hostport(b["brokerAddrs"]["0"])
            for b in data.get("brokerDatas", [])
            if "0" in b.get("brokerAddrs", {})
        }
        queues = [
            MessageQueue(topic, q["brokerName"], i)
            for q in data.get("queueDatas", [])
            for i in range(q.get("writeQueueNums", 0))
        ]
        route = TopicRoute(topic, sorted(queues), addrs)
        self._routes[topic] = route
        return route

    async def broker_of(self, mq: MessageQueue) -> tuple[str, int]:
        route = await self.route(mq.topic)
        if mq.broker_name not in route.broker_addrs:
            route = await self.route(mq.topic, refresh=True)
        try:
            return route.broker_addrs[mq.broker_name]
        except KeyError:
            raise ClientError(f"no address for broker {mq.broker_name}") from None

    async def close(self) -> None:
        for conn in list(self._connections.values()):
            await conn.close()
        self._connections.clear()
