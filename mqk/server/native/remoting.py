"""The asyncio shell around the sans-IO remoting codec, shared by the broker and the name server.

Owns sockets only: it frames bytes with `FrameDecoder`, hands each request to the dispatcher as its own task
(a long-polling pull must not hold up the heartbeat behind it on the same connection), writes responses in the
order they complete (clients match them by opaque), drops responses to oneway requests, and closes the connection
on a protocol error (oversized frame, impossible header) after logging why. It never interprets a request.
With `tls`, every connection is behind the TLS layer (mqk.server.tls): the request loop starts only once the
handshake is done.
Back-pressure: at most `MAX_INFLIGHT` requests run per connection; reading pauses while they do, and writes wait
for the transport to drain.
Connection limits (`limits`, mqk.server.limits, shared with the Kafka listeners: Kafka's max.connections counts
every listener of a broker): a connection past max_connections or max_connections_per_ip is closed as soon as it
is accepted, with a log line; one silent for connections_max_idle_ms with no request of its own running is closed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

from mqk.broker.accepted import AcceptedTransports
from mqk.broker.stats import RequestMeter
from mqk.config import BrokerConfig
from mqk.errors import ProtocolError
from mqk.protocol.native.codes import FLAG_ONEWAY, ResponseCode
from mqk.protocol.native.command import FrameDecoder, HeaderFieldError, RemotingCommand
from mqk.server.limits import ConnectionLimits
from mqk.server.tls import TlsServer, create_server, server_context

log = logging.getLogger("mqk.native")

MAX_INFLIGHT = 256
_READ_CHUNK = 256 * 1024
_HIGH_WATER = 1024 * 1024


class Connection:
    """One client connection: what processors may use to answer later or to call the client (broker → client
    requests such as NOTIFY_CONSUMER_IDS_CHANGED)."""

    _ids = itertools.count(1)

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.id = next(Connection._ids)
        self.writer = writer
        peer = writer.get_extra_info("peername") or ("127.0.0.1", 0)
        self.peer: tuple[str, int] = (str(peer[0]), int(peer[1]))
        self.closed = False
        #: grows with every frame read and written (the idleness sweep's view of it)
        self.activity = 0
        #: its requests running now
        self.running = 0
        self.on_close: list[Callable[[Connection], None]] = []
        self._opaque = itertools.count(1 << 30)
        self._pending: list[bytes] = []

    async def send(self, cmd: RemotingCommand) -> None:
        """Queue a frame; frames queued during one loop iteration leave in one write (one syscall, one wake-up
        of the client) instead of one each. Waits for the socket to drain only above the high-water mark."""
        if self.closed:
            return
        self.activity += 1
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append(cmd.encode())
        transport = self.writer.transport
        if transport.get_write_buffer_size() > _HIGH_WATER:
            try:
                await self.writer.drain()
            except (ConnectionError, RuntimeError):
                self.closed = True

    def _flush(self) -> None:
        data, self._pending = self._pending, []
        if self.closed or not data:
            return
        try:
            self.writer.write(data[0] if len(data) == 1 else b"".join(data))
        except (ConnectionError, RuntimeError):
            self.closed = True

    async def send_oneway(self, code: int, ext: dict[str, str], body: bytes | None = None) -> None:
        await self.send(
            RemotingCommand(code=code, opaque=next(self._opaque), flag=FLAG_ONEWAY, ext_fields=ext, body=body)
        )

    @property
    def busy(self) -> bool:
        """A request of its own is running (a long-polling pull is not idleness)."""
        return self.running > 0

    def close(self, reason: str = "", level: int = logging.INFO) -> None:
        if not self.closed:
            if reason:
                log.log(level, "closing connection from %s:%s: %s", *self.peer, reason)
            self.closed = True
            self.writer.close()


Dispatcher = Callable[[Connection, RemotingCommand], Awaitable[RemotingCommand | None]]


class RemotingServer:
    def __init__(
        self,
        listen: tuple[str, int],
        dispatch: Dispatcher,
        max_frame_bytes: int,
        name: str,
        meter: RequestMeter | None = None,
        *,
        tls: TlsServer | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        """`meter`: where requests (by request code), their answers' codes and connections are counted for
        /metrics; None counts nothing. `tls`: the listener's TLS (None: plain TCP). `limits`: the broker's
        connection limits (None: none)."""
        self.listen = listen
        self.meter = meter
        self.dispatch = dispatch
        self.max_frame_bytes = max_frame_bytes
        self.name = name
        self.tls = tls
        self.limits = limits
        self._sweeps: asyncio.Task[None] | None = None
        self.connections: set[Connection] = set()
        #: every socket accepted, for the stop to leave none open
        self.accepted = AcceptedTransports()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> tuple[str, int]:
        if self.tls is None:
            self._server = await asyncio.start_server(self._serve, self.listen[0], self.listen[1])
        else:
            loop = asyncio.get_running_loop()

            def streams() -> asyncio.StreamReaderProtocol:  # what asyncio.start_server makes per connection
                return asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), self._serve, loop=loop)

            self._server = await create_server(
                streams, self.listen[0], self.listen[1], self.tls, accepted=self.accepted
            )
        host, port = self._server.sockets[0].getsockname()[:2]
        if self.limits is not None:
            self._sweeps = asyncio.create_task(
                self.limits.run_sweeps(lambda: self.connections), name=f"{self.name}-idle"
            )
        return str(host), int(port)

    async def stop(self) -> None:
        if self._sweeps is not None:
            self._sweeps.cancel()
            await asyncio.gather(self._sweeps, return_exceptions=True)
            self._sweeps = None
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        await self.accepted.abort_all()  # (a connection with answers its client never read, or one that just came)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.accepted.add(writer.transport):
            return
        conn = Connection(writer)
        limits = self.limits
        if limits is not None:
            refusal = limits.admit(conn.peer[0])
            if refusal is not None:
                log.warning("%s: connection from %s:%s refused: %s", self.name, *conn.peer, refusal)
                conn.close()
                return
        self.connections.add(conn)
        if self.meter is not None:
            self.meter.connections_accepted += 1
        decoder = FrameDecoder(self.max_frame_bytes)
        inflight = asyncio.Semaphore(MAX_INFLIGHT)
        me = asyncio.current_task()
        if me is not None:
            self._tasks.add(me)
        try:
            while not conn.closed:
                data = await reader.read(_READ_CHUNK)
                if not data:
                    break
                conn.activity += 1
                decoder.receive_data(data)
                while (cmd := decoder.next_command()) is not None:
                    if cmd.is_response:
                        continue  # answers to our oneway notifications never come; ignore stray ones
                    await inflight.acquire()
                    task = asyncio.create_task(self._handle(conn, cmd, inflight))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        except ProtocolError as exc:
            log.warning("%s: closing connection from %s:%s: %s", self.name, *conn.peer, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self.connections.discard(conn)
            if limits is not None:
                limits.release(conn.peer[0], conn)
            conn.close()
            for callback in conn.on_close:
                try:
                    callback(conn)
                except Exception:  # one bad callback must not keep the others from running
                    log.exception("%s: connection close callback failed", self.name)
            if me is not None:
                self._tasks.discard(me)

    async def _handle(self, conn: Connection, cmd: RemotingCommand, inflight: asyncio.Semaphore) -> None:
        started = time.perf_counter_ns()
        conn.running += 1
        try:
            try:
                response = await self.dispatch(conn, cmd)
            except HeaderFieldError as exc:
                response = cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
            except ProtocolError as exc:
                response = cmd.response(ResponseCode.SYSTEM_ERROR, f"bad request: {exc}")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # answer the client; the broker keeps serving
                log.exception("%s: request code %s failed", self.name, cmd.code)
                response = cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
            meter = self.meter
            if meter is not None:
                meter.record(cmd.code, time.perf_counter_ns() - started)
                if response is not None and response.code != ResponseCode.SUCCESS:
                    meter.error(cmd.code, response.code)
            if response is not None and not cmd.is_oneway:
                await conn.send(response)
        finally:
            conn.running -= 1
            inflight.release()


def remoting_tls(config: BrokerConfig, name: str) -> TlsServer:
    """The TLS settings of a RocketMQ remoting listener (the broker's or the name server's): the `[tls]` certificate,
    client certificates as its `client_auth` says."""
    tls = config.tls
    return TlsServer(server_context(tls, tls.client_auth), tls.handshake_timeout_ms / 1000, name)
