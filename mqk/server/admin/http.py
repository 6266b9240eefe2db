"""The admin listener's HTTP/1.1 server: h11's sans-IO state machine under a thin asyncio Protocol.

What it owns: sockets, framing (h11: request line, headers, bodies by Content-Length or chunks, keep-alive,
pipelined requests answered in order), limits (a request body above `max_body` gets 413, headers above h11's
incomplete-event limit 431, an idle connection is closed after `idle_timeout_s`), and routing by method and path:
an exact path, or a prefix for a subtree (a console's static files). HEAD is answered as GET without the body.
An unknown path gets 404, a known path with another method 405 (with Allow), a handler that raises 500 (logged).

It knows nothing of metrics or health: mqk.server.admin.server registers those routes, and further routes (a web
console) can be added with `route` / `route_prefix` before or after start.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

from mqk.broker.accepted import AcceptedTransports

log = logging.getLogger("mqk.admin")

#: longest request body taken (a larger one is answered 413 and the connection closed)
MAX_BODY = 1 << 20
#: longest request line + headers (h11's max_incomplete_event_size; more is answered 431)
MAX_HEAD = 64 * 1024
IDLE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class HttpRequest:
    method: str
    #: the path, percent-decoded, without the query
    path: str
    query: dict[str, list[str]]
    #: header names lower-cased; a repeated header keeps its last value
    headers: dict[str, str]
    body: bytes = b""

    def arg(self, name: str, default: str | None = None) -> str | None:
        """The last value of query parameter `name`."""
        values = self.query.get(name)
        return values[-1] if values else default


@dataclass
class HttpResponse:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def text(cls, text: str, status: int = 200) -> HttpResponse:
        return cls(status, text.encode())

    @classmethod
    def json(cls, obj: Any, status: int = 200) -> HttpResponse:
        return cls(status, json.dumps(obj, sort_keys=True).encode() + b"\n", "application/json")


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class HttpServer:
    def __init__(
        self,
        listen: tuple[str, int],
        *,
        max_body: int = MAX_BODY,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.listen = listen
        self.max_body = max_body
        self.idle_timeout_s = idle_timeout_s
        self._exact: dict[str, dict[str, Handler]] = {}
        self._prefixes: list[tuple[str, dict[str, Handler]]] = []
        self._server: asyncio.AbstractServer | None = None
        self.connections: set[_HttpConnection] = set()
        #: every socket accepted, for the stop to leave none open
        self.accepted = AcceptedTransports()
        self.address: tuple[str, int] | None = None

    # --- routes ----------------------------------------------------------------------------------------------

    def route(self, method: str, path: str, handler: Handler) -> None:
        """Answer `method` requests for exactly `path` with `handler`."""
        self._exact.setdefault(path, {})[method.upper()] = handler

    def route_prefix(self, method: str, prefix: str, handler: Handler) -> None:
        """Answer `method` requests for every path starting with `prefix` (longest prefix first)."""
        for known, methods in self._prefixes:
            if known == prefix:
                methods[method.upper()] = handler
                return
        self._prefixes.append((prefix, {method.upper(): handler}))
        self._prefixes.sort(key=lambda item: -len(item[0]))

    def _methods(self, path: str) -> dict[str, Handler] | None:
        methods = self._exact.get(path)
        if methods is not None:
            return methods
        for prefix, methods in self._prefixes:
            if path.startswith(prefix):
                return methods
        return None

    async def handle(self, request: HttpRequest) -> HttpResponse:
        """The response to one request (routing; a handler's failure becomes 500)."""
        methods = self._methods(request.path)
        if methods is None:
            return HttpResponse.text("not found\n", 404)
        method = "GET" if request.method == "HEAD" else request.method
        handler = methods.get(method)
        if handler is None:
            allowed = sorted(set(methods) | ({"HEAD"} if "GET" in methods else set()))
            return HttpResponse(405, b"method not allowed\n", headers=[("Allow", ", ".join(allowed))])
        try:
            return await handler(request)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("admin: %s %s failed", request.method, request.path)
            return HttpResponse.text("internal error\n", 500)

    # --- life cycle ------------------------------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        host, port = self.listen
        self._server = await loop.create_server(lambda: _HttpConnection(self), host, port, reuse_address=True)
        sockname = self._server.sockets[0].getsockname()
        self.address = (str(sockname[0]), int(sockname[1]))
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 5)
            except TimeoutError:
                log.warning("admin listener: connections still open after 5 s at stop")
            self._server = None
        await self.accepted.abort_all()  # (a connection with answers its client never read, or one that just came)


def _h11() -> Any:
    # imported with the first connection, not with the broker: a broker nobody asks over HTTP never loads it
    import h11

    return h11


class _HttpConnection(asyncio.Protocol):
    """One client connection: bytes -> h11 events -> one request at a time -> the server's routes -> bytes."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.h11 = _h11()
        self.conn = self.h11.Connection(self.h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        #: the request being read: (method, target, headers) and its body so far
        self._head: tuple[str, str, dict[str, str]] | None = None
        self._body = bytearray()
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)  # a stream server's (uvloop's too: same methods, no subclass)
        self.transport = stream
        if not self.server.accepted.add(stream):
            self.closed = True
            return
        self.server.connections.add(self)
        self._touch()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        if self._task is not None:
            self._task.cancel()

    def data_received(self, data: bytes) -> None:
        self._touch()
        self.conn.receive_data(data)
        self._events()

    def eof_received(self) -> bool | None:
        self.conn.receive_data(b"")
        self._events()
        return None

    def _touch(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        loop = asyncio.get_running_loop()
        self._idle = loop.call_later(self.server.idle_timeout_s, self.close)

    def _events(self) -> None:
        """Take events until h11 needs more bytes, or a request is complete (it is then answered before the next
        one is read: h11 keeps pipelined bytes until the cycle restarts)."""
        h11 = self.h11
        while not self.closed and self._task is None:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._refuse(exc.error_status_hint, str(exc))
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
                self._head = (event.method.decode("ascii", "replace"), event.target.decode("latin-1"), headers)
                self._body = bytearray()
            elif isinstance(event, h11.Data):
                self._body += event.data
                if len(self._body) > self.server.max_body:
                    self._refuse(413, "request body too large")
                    return
            elif isinstance(event, h11.EndOfMessage):
                assert self._head is not None
                method, target, headers = self._head
                self._head = None
                self._task = asyncio.get_running_loop().create_task(
                    self._answer(_request(method, target, headers, bytes(self._body)))
                )
            elif isinstance(event, h11.ConnectionClosed):
                self.close()
                return

    async def _answer(self, request: HttpRequest) -> None:
        try:
            response = await self.server.handle(request)
            self._send(response, head_only=request.method == "HEAD")
        finally:
            self._task = None
        if self.closed:
            return
        h11 = self.h11
        if self.conn.our_state is h11.MUST_CLOSE or self.conn.their_state is h11.MUST_CLOSE:
            self.close()
            return
        try:
            self.conn.start_next_cycle()
        except h11.LocalProtocolError:  # the client has not finished its request: close rather than guess
            self.close()
            return
        self._events()

    def _send(self, response: HttpResponse, head_only: bool = False) -> None:
        if self.closed or self.transport is None:
            return
        h11 = self.h11
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            ("Cache-Control", "no-store"),
            *response.headers,
        ]
        try:
            phrase = HTTPStatus(response.status).phrase.encode()
        except ValueError:
            phrase = b""
        try:
            out = [self.conn.send(h11.Response(status_code=response.status, headers=headers, reason=phrase))]
            if response.body and not head_only:
                out.append(self.conn.send(h11.Data(data=response.body)))
            out.append(self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError as exc:
            log.warning("admin: cannot answer: %s", exc)
            self.close()
            return
        self.transport.writelines([b for b in out if b])

    def _refuse(self, status: int, reason: str) -> None:
        """Answer a request that cannot be taken (when h11 still may) and close."""
        log.info("admin: refused a request: %s", reason)
        if self.conn.our_state is self.h11.SEND_RESPONSE or self.conn.our_state is self.h11.IDLE:
            self._send(HttpResponse.text(reason + "\n", status))
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _request(method: str, target: str, headers: dict[str, str], body: bytes) -> HttpRequest:
    parts = urlsplit(target)
    return HttpRequest(method.upper(), unquote(parts.path) or "/", parse_qs(parts.query), headers, body)


__all__ = ["Handler", "HttpRequest", "HttpResponse", "HttpServer"]
