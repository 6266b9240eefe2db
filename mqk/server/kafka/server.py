"""The Kafka listeners: an asyncio Protocol per connection feeding the sans-IO codec, and the handlers' context.

What this module owns:
- the handlers' context (`KafkaContext`): built once from the shared broker services (mqk.broker) and the
  Kafka-only state (group coordinator, producer-id state); handlers see it, never the server;
- the listeners (mqk.server.listeners): the unnamed PLAINTEXT one and every named one, each with its security
  protocol: TLS below the connection for SSL and SASL_SSL (mqk.server.tls), and on SASL listeners a connection
  class (`SaslKafkaConnection`) that serves only ApiVersions, SaslHandshake and SaslAuthenticate until the client
  has authenticated. Every connection carries its `principal` (`User:ANONYMOUS`, the client certificate's user on
  SSL, the SASL user); a PLAINTEXT connection does no per-request work for any of it;
- framing errors and protocol errors: a negative or oversized frame, an unknown api key, an unsupported version
  (other than ApiVersions) or bytes that do not decode close *that* connection with one log line; nothing else
  is disturbed;
- ordering: every request is started as soon as it is decoded (so a long-polling Fetch does not hold up the
  decoding of the next request), but responses leave in request order through a per-connection FIFO of tasks;
- grouping: consecutive requests of an API in `handlers.GROUPED` that arrive together (one read holding several
  Produce requests: a client with requests in flight, librdkafka sending one partition per request) are prepared
  one by one and answered by one call, before any later request starts, so their appends are one store write;
- connection limits (mqk.server.limits): max_connections and max_connections_per_ip refuse a connection as it
  is accepted; connections silent for connections_max_idle_ms are closed;
- client quotas (mqk.broker.quotas): over its produce or fetch byte rate, a client's answer carries
  throttle_time_ms and its connection reads nothing for that long;
- back-pressure: reading pauses while too many requests are in flight on a connection or while the transport's
  write buffer is above its high-water mark (a slow consumer), and resumes when both drain. Connections are
  independent, so a slow consumer never stalls a producer on another connection;
- zero-copy output: handlers return plain dicts whose `records` may be lists of memoryviews into the store, and
  the encoded response goes out with `transport.writelines` without joining.

It does not know any API's semantics: those live in `handlers/`, one module per API or small family.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import struct
import time
from collections import deque
from collections.abc import Coroutine, Sequence
from typing import Any, cast

from mqk import errors as E
from mqk.broker import Broker
from mqk.broker.accepted import AcceptedTransports
from mqk.broker.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, ClientQuotas
from mqk.broker.security import USER, AuthenticationFailed, Principal, SaslServer
from mqk.broker.security.principal import ANONYMOUS, NoMatchingRule
from mqk.clock import Clock
from mqk.config import SSL, BrokerConfig
from mqk.errors import FrameTooLarge, ProtocolError
from mqk.groups.coordinator import GroupCoordinator
from mqk.protocol.kafka import api
from mqk.protocol.kafka.codec import KafkaConnectionCodec, Request, encode_response
from mqk.server.kafka.context import Answer, CloseConnection, Grouping, Handler, KafkaContext
from mqk.server.kafka.handlers import GROUPED, HANDLERS
from mqk.server.kafka.idempotence import ProducerStates
from mqk.server.kafka.metering import count_errors
from mqk.server.kafka.transactions import TransactionCoordinator
from mqk.server.limits import ConnectionLimits
from mqk.server.listeners import KafkaListener, advertised_address, kafka_listeners
from mqk.server.tls import TlsServer, create_server, server_context
from mqk.store.adapter import Buffer
from mqk.store.manager import StoreManager

log = logging.getLogger("mqk.kafka")

#: requests decoded but not yet answered on one connection before we stop reading from it
MAX_IN_FLIGHT = 64
#: answers are gathered into one writelines call until they reach this size (asyncio's default high-water mark)
FLUSH_BYTES = 64 * 1024
#: the APIs client quotas measure (mqk.broker.quotas)
_QUOTA_KEYS = frozenset({api.ApiKey.PRODUCE, api.ApiKey.FETCH})

__all__ = ["FLUSH_BYTES", "MAX_IN_FLIGHT", "CloseConnection", "KafkaConnection", "KafkaServer", "SaslKafkaConnection"]


#: how long a connection whose authentication failed stays open after its answer, so the client reads the answer
#: before the close
AUTH_FAILURE_CLOSE_GRACE_S = 0.1


class KafkaServer:
    def __init__(
        self, config: BrokerConfig, store: StoreManager, *, broker: Broker | None = None, clock: Clock | None = None
    ) -> None:
        """`broker`: the broker services shared with the other front doors (one is made for this server alone
        when not given, on `clock` or the system clock)."""
        self.config = config
        self.store = store
        self.broker = broker if broker is not None else Broker(config, store, *(() if clock is None else (clock,)))
        if clock is not None and clock is not self.broker.clock:
            raise ValueError("a KafkaServer runs on its broker's clock")
        self.handlers: dict[int, Handler] = HANDLERS
        self.grouped: dict[int, Grouping] = GROUPED
        self.groups = GroupCoordinator.from_config(config, store, clock=self.broker.clock, topics=self.broker.topics)
        self.producers = ProducerStates(store, clock=self.broker.clock)
        #: every Kafka listener, the first one's address as ctx.host/port
        self.listeners: list[KafkaListener] = kafka_listeners(config)
        host, port = self.listeners[0].config.host, self.listeners[0].config.port
        self.ctx = KafkaContext(
            config=config,
            store=store,
            topics=self.broker.topics,
            groups=self.groups,
            producers=self.producers,
            hub=self.broker.hub,
            clock=self.broker.clock,
            # the versions ApiVersions advertises: what the codec can decode AND we have a handler for
            supported={k: v for k, v in api.SUPPORTED.items() if k in HANDLERS},
            node_id=config.node_id,
            cluster_id=config.cluster_id,
            host=host,
            port=port,
            traffic=None if self.broker.stats is None else self.broker.stats.traffic,
            produce_general_path=None if self.broker.stats is None else self.broker.stats.produce_general_path,
            log_sizes=self.broker.log_sizes,
            security=self.broker.security,
            quotas=self.broker.quotas,
            # (in cluster mode it serves while this broker is its group's master: the runtime links it)
            transactions=TransactionCoordinator(
                store,
                self.producers,
                self.groups,
                clock=self.broker.clock,
                max_timeout_ms=config.transaction_max_timeout_ms,
                check_interval_ms=config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
                id_expiration_ms=config.transactional_id_expiration_ms,
                standby=bool(config.cluster),
            ),
        )
        # a read_committed share group reads below the last stable offset, as a read_committed fetch does
        self.groups.share.transactions = self.ctx.transactions
        self._servers: list[asyncio.AbstractServer] = []
        self.connections: set[KafkaConnection] = set()
        #: every socket the listeners accepted, for the stop to leave none open
        self.accepted = AcceptedTransports()
        #: max_connections, max_connections_per_ip and connections_max_idle_ms over every Kafka listener
        self.limits = ConnectionLimits(
            config.max_connections, config.max_connections_per_ip, config.connections_max_idle_ms, self.broker.clock
        )
        self._sweeps: asyncio.Task[None] | None = None
        #: requests and connections counted for /metrics (None with metrics off)
        self.meter = None if self.broker.stats is None else self.broker.stats.meter("kafka", "kafka")

    @property
    def node_id(self) -> int:
        return self.config.node_id

    @property
    def supported(self) -> dict[int, tuple[int, int]]:
        return self.ctx.supported

    @property
    def host(self) -> str:
        """The first listener's bound host (where this process's own clients connect)."""
        bound = self.listeners[0].bound
        return bound[0] if bound is not None else self.ctx.host

    @property
    def port(self) -> int:
        bound = self.listeners[0].bound
        return bound[1] if bound is not None else self.ctx.port

    def _tls(self, listener: KafkaListener, contexts: dict[str, ssl.SSLContext]) -> TlsServer | None:
        if not listener.tls:
            return None
        tls = self.config.tls
        # ssl.client.auth applies to SSL listeners; a SASL_SSL client authenticates with SASL (Kafka, KIP-684)
        client_auth = tls.client_auth if listener.protocol == SSL else "none"
        if client_auth not in contexts:
            contexts[client_auth] = server_context(tls, client_auth)
        name = f"kafka listener {listener.describe()}"
        return TlsServer(contexts[client_auth], tls.handshake_timeout_ms / 1000, name)

    async def start(self) -> tuple[str, int]:
        """Bind every listener; the first one's bound address."""
        await self.producers.start()
        self.groups.start()
        if self.ctx.transactions is not None:
            await self.ctx.transactions.start()
        self.broker.open()
        contexts: dict[str, ssl.SSLContext] = {}
        for listener in self.listeners:
            conn_class = SaslKafkaConnection if listener.sasl else KafkaConnection
            server = await create_server(
                functools.partial(conn_class, self, listener),
                listener.config.host,
                listener.config.port,
                self._tls(listener, contexts),
                accepted=self.accepted,
                reuse_address=True,
            )
            self._servers.append(server)
            sockname = server.sockets[0].getsockname()
            listener.bound = (sockname[0], sockname[1])
            listener.advertised = advertised_address(self.config, listener.key, listener.bound)
            log.info("kafka listener %s on %s:%d", listener.describe(), *listener.bound)
        first = self.listeners[0]
        assert first.bound is not None
        self.ctx.host, self.ctx.port = first.advertised or first.bound
        self._sweeps = asyncio.create_task(self.limits.run_sweeps(lambda: self.connections), name="mqk-kafka-idle")
        return first.bound

    async def stop(self) -> None:
        if self._sweeps is not None:
            self._sweeps.cancel()
            await asyncio.gather(self._sweeps, return_exceptions=True)
            self._sweeps = None
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.close("broker stopping", level=logging.INFO)
        self.broker.release_waiters()
        self.groups.close()
        if self.ctx.transactions is not None:
            await self.ctx.transactions.stop()
        for server in self._servers:
            try:
                await asyncio.wait_for(server.wait_closed(), 5)
            except TimeoutError:
                log.warning("kafka listener: connections still open after 5 s at stop")
        self._servers = []
        await self.accepted.abort_all()  # (a connection with answers its client never read, or one that just came)


class KafkaConnection(asyncio.BufferedProtocol):
    """One client connection: bytes → codec → handler tasks; results → codec → transport, in request order.
    A buffered protocol: the transport reads straight into the codec's buffer (no bytes object per read, no
    copy to assemble a frame)."""

    def __init__(self, server: KafkaServer, listener: KafkaListener | None = None) -> None:
        self.server = server
        self.ctx = server.ctx
        self.codec = KafkaConnectionCodec(server.config.socket_request_max_bytes, server.ctx.supported)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.client_host = ""
        #: the listener this connection came in through, and this broker's address there for this client
        self.listener = listener if listener is not None else server.listeners[0]
        self.advertised: tuple[str, int] = (self.ctx.host, self.ctx.port)
        #: who this connection acts as (SSL: the client certificate's user; SASL: the authenticated user)
        self.principal: Principal = ANONYMOUS
        #: (request, task) in arrival order; the head is written as soon as its task is done
        self.pending: deque[tuple[Request, asyncio.Future[Any]]] = deque()
        self.reading_paused = False
        self.writing_paused = False
        self.closed = False
        #: the tasks answering a group of requests that suspended (_dispatch_group), cancelled with the connection
        self._group_tasks: set[asyncio.Task[Any]] = set()
        #: encoded answers not yet handed to the transport: every answer ready in one pass goes out in one
        #: writelines call (one send for a burst of pipelined requests, not one per answer)
        self._out: list[Buffer] = []
        self._out_bytes = 0
        self.loop = asyncio.get_running_loop()
        self.meter = server.meter
        #: id(request) -> when it was decoded (perf_counter_ns), for its latency; kept only with metrics on
        self._arrived: dict[int, int] = {}
        #: reads and writes so far: the idleness sweep (mqk.server.limits) looks for counts that stand still
        self.activity = 0
        #: counted by the connection limits (released when it ends), under this address
        self._admitted = False
        self._limit_host = "?"
        #: the client quotas (mqk.broker.quotas); while `_throttled` the connection reads and decodes nothing
        self._quotas = server.ctx.quotas
        self._throttled = False
        self._unmuting: asyncio.TimerHandle | None = None

    # --- asyncio callbacks -----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)  # a stream server's (uvloop's too: same methods, no subclass)
        self.transport = stream
        if not self.server.accepted.add(stream):
            self.closed = True
            return
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
            self.client_host = f"/{peer[0]}"
        self._limit_host = str(peer[0]) if peer else "?"
        refusal = self.server.limits.admit(self._limit_host)
        if refusal is not None:
            log.warning("kafka connection %s refused: %s", self.peer, refusal)
            self.closed = True
            transport.close()
            return
        self._admitted = True
        self.server.connections.add(self)
        if self.meter is not None:
            self.meter.connections_accepted += 1
        listener = self.listener
        if listener.advertised is not None:
            self.advertised = listener.advertised
        else:  # bound to every interface: the address this client reached
            local = transport.get_extra_info("sockname")
            if local:
                self.advertised = (local[0], local[1])
        if listener.protocol == SSL:
            security = self.ctx.security
            assert security is not None
            try:
                self.principal = security.principals.principal(transport.get_extra_info("peercert"))
            except NoMatchingRule as exc:
                self.close(f"client certificate refused: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self._admitted:
            self._admitted = False
            self.server.limits.release(self._limit_host, self)
        self._cancel_pending()

    @property
    def busy(self) -> bool:
        """A request of its own waits for its answer (a long poll): not idle, however long it is silent."""
        return bool(self.pending) or bool(self._group_tasks)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.codec.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        if self.closed:
            return
        self.activity += 1
        self.codec.buffer_updated(nbytes)
        self._decode()

    def _decode(self) -> None:
        """Start the requests buffered in the codec, at most MAX_IN_FLIGHT unanswered at a time (the rest stay
        as bytes until answers drain, so a flood of tiny requests cannot become a flood of tasks)."""
        codec = self.codec
        pending = self.pending
        grouped = self.server.grouped
        group: list[tuple[Request, object]] = []  # (request, plan) of consecutive requests of one grouped API
        refusal = None
        arrived = self._arrived if self.meter is not None else None
        now = time.perf_counter_ns() if arrived is not None else 0
        try:
            while not self.closed and len(pending) < MAX_IN_FLIGHT and not self._throttled:
                if len(pending) + len(group) >= MAX_IN_FLIGHT:
                    # a full group is answered before decoding on (its answers may leave room at once); the loop
                    # must not end with requests left in the codec that no later read would ever decode
                    self._dispatch_group(group)
                    group = []
                    continue
                req = codec.next_request()
                if req is None:
                    break
                if arrived is not None:
                    arrived[id(req)] = now
                grouping = grouped.get(req.api_key)
                plan = None if grouping is None else grouping[0](self.ctx, self, req)
                if group and (plan is None or req.api_key != group[0][0].api_key):
                    self._dispatch_group(group)  # the group ends where a request cannot join it
                    group = []
                if plan is not None:
                    group.append((req, plan))
                else:
                    self._dispatch(req)
        except FrameTooLarge as exc:
            refusal = f"refused frame: {exc}"
        except ProtocolError as exc:
            refusal = f"protocol error: {exc}"
        except Exception as exc:  # a codec bug must cost one connection, never the broker
            log.exception("kafka connection %s: unexpected error decoding a request", self.peer)
            refusal = f"internal error: {exc!r}"
        if group and not self.closed:
            self._dispatch_group(group)  # the requests before a bad one are still answered, as when dispatched
        if refusal is not None:
            self.close(refusal)
        self._flush()
        self._update_reading()

    def pause_writing(self) -> None:
        """The peer is not reading: stop reading its requests and keep finished answers queued (they hold
        views of store data, not copies) until the transport drains."""
        self.writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._on_done(None)

    # --- dispatch --------------------------------------------------------------------------------------

    def _dispatch(self, req: Request) -> None:
        """Run the handler eagerly: most requests (ApiVersions, Metadata, Produce on a memory store, Heartbeat)
        finish without ever suspending, and then cost no Task at all. A handler that suspends continues in a
        Task (`_resume`). Eager start also means side effects (appends) happen in request arrival order up to
        each handler's first suspension, which keeps pipelined produce requests in order."""
        handler = self.server.handlers[req.api_key]  # the codec already refused keys we cannot serve
        self._start((req,), handler(self.ctx, self, req), grouped=False)

    def _dispatch_group(self, group: list[tuple[Request, object]]) -> None:
        """Answer prepared requests of one grouped API with one call (its answer per request, in order),
        started eagerly as `_dispatch` starts a handler."""
        answer = self.server.grouped[group[0][0].api_key][1]
        self._start([req for req, _plan in group], answer(self.ctx, [plan for _req, plan in group]), grouped=True)

    def _start(self, reqs: Sequence[Request], coro: Coroutine[Any, Any, Any], grouped: bool) -> None:
        """Run `coro` until it first suspends: if it finished, its answers (`grouped`: one per request, else the
        one request's) are sent at once when nothing is ahead of them, or queued done; if it failed, the failure
        is queued for the first request. If it suspended it continues in a Task: a lone request's place in
        `pending` is that Task; a group's places are futures the Task fills when it ends (_group_done)."""
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            bodies = stop.value if grouped else (stop.value,)
            if not self.pending and not self.writing_paused:
                for req, body in zip(reqs, bodies, strict=True):
                    if self.closed:
                        return
                    self._respond(req, body)
                return
            for req, body in zip(reqs, bodies, strict=True):
                done = self.loop.create_future()
                done.set_result(body)
                self.pending.append((req, done))
            return
        except Exception as exc:  # noqa: BLE001 - reported in order by _on_done, like a Task failure
            self._settle(self._places(reqs), None, exc)
            return
        task = self.loop.create_task(_resume(coro, yielded))
        if grouped:
            self._group_tasks.add(task)
            task.add_done_callback(functools.partial(self._group_done, self._places(reqs)))
        else:
            self.pending.append((reqs[0], task))
            task.add_done_callback(self._on_done)

    def _places(self, reqs: Sequence[Request]) -> list[asyncio.Future[Any]]:
        """A future per request, queued in `pending` in request order."""
        futures: list[asyncio.Future[Any]] = []
        for req in reqs:
            future = self.loop.create_future()
            self.pending.append((req, future))
            futures.append(future)
        return futures

    def _group_done(self, futures: list[asyncio.Future[Any]], task: asyncio.Task[Sequence[Answer]]) -> None:
        self._group_tasks.discard(task)
        if task.cancelled():
            for future in futures:
                future.cancel()
            return
        exc = task.exception()
        self._settle(futures, None if exc is not None else task.result(), exc)

    def _settle(
        self, futures: list[asyncio.Future[Any]], bodies: Sequence[Answer] | None, exc: BaseException | None
    ) -> None:
        """Give each request its answer, or the first one the failure (which closes the connection when _on_done
        reaches it; the others are cancelled, so nobody else reports it), then send what is due."""
        if exc is not None:
            if not futures[0].done():
                futures[0].set_exception(exc)
            for future in futures[1:]:
                future.cancel()
        else:
            for future, body in zip(futures, bodies, strict=True):  # type: ignore[arg-type]  # None only with exc
                if not future.done():
                    future.set_result(body)
        if self.pending and self.pending[0][1].done():
            self._on_done(None)

    def _respond(self, req: Request, body: Answer) -> None:
        meter = self.meter
        if meter is not None:
            arrived = self._arrived.pop(id(req), None)
            if arrived is not None:
                meter.record(req.api_key, time.perf_counter_ns() - arrived)
            if body is not None and body.__class__ is not CloseConnection:
                count_errors(meter, req.api_key, body)  # type: ignore[arg-type]  # a body, not CloseConnection
        quotas = self._quotas
        if (
            quotas is not None
            and quotas.active
            and req.api_key in _QUOTA_KEYS
            and body.__class__ is not CloseConnection
        ):
            parts = self._within_quota(quotas, req, body)  # type: ignore[arg-type]  # a body or None (acks=0)
            if parts is None:
                return
        else:
            if body is None:  # acks=0 produce: no response at all
                return
            if isinstance(body, CloseConnection):
                self.close(body.reason)
                return
            parts = self._encode(req, body)
            if parts is None:
                return
        self._out += parts
        # the first part starts with the frame's size prefix
        self._out_bytes += 4 + int.from_bytes(parts[0][:4], "big")
        if self._out_bytes >= FLUSH_BYTES:
            self._flush()  # big answers go out at once, so pause_writing can stop the next ones

    def _encode(self, req: Request, body: Answer) -> list[Buffer] | None:
        try:
            # the codec picks the body's type by the api key, so it takes a plain dict (a handler's TypedDict is one)
            return encode_response(req, body)  # type: ignore[arg-type]  # see above
        except Exception as exc:  # our bug; keep the broker up, drop the connection
            log.exception("kafka connection %s: cannot encode %s response", self.peer, req.api_key)
            self.close(f"encode error: {exc!r}")
            return None

    def _within_quota(self, quotas: ClientQuotas, req: Request, body: dict[str, Any] | None) -> list[Buffer] | None:
        """A Produce or Fetch answer under the client quotas (mqk.broker.quotas): its bytes counted (Produce: the
        request's, Fetch: the response's) and, over the quota, its throttle_time_ms set and the connection muted for
        that long (KIP-219); a throttled Fetch is answered empty and its bytes are not counted, as in Kafka. The
        encoded answer, or None when there is none to send (acks=0)."""
        user, client_id = self.principal.name, req.client_id or ""
        if req.api_key == api.ApiKey.PRODUCE:
            throttle = quotas.record(PRODUCER_BYTE_RATE, user, client_id, req.size)
            if body is not None and throttle.ms:
                body["throttle_time_ms"] = throttle.ms
            parts = None if body is None else self._encode(req, body)
        else:
            assert body is not None
            parts = self._encode(req, body)
            if parts is None:
                return None
            size = sum(len(p) for p in parts)
            throttle = quotas.record(CONSUMER_BYTE_RATE, user, client_id, size)
            if throttle.ms:
                quotas.unrecord(throttle, size)
                empty = {**body, "throttle_time_ms": throttle.ms, "responses": []}
                parts = self._encode(req, empty)
        if throttle.ms:
            self._mute(throttle.ms)
        return parts

    def _mute(self, ms: int) -> None:
        """Read and decode nothing from this client for `ms` (its throttle time) from now, or until an earlier mute
        ends if that is later: the answers of requests taken together (a group of Produce requests) each carry the
        throttle time of all the bytes recorded so far, so the last one's is the one that holds."""
        if self.closed:
            return
        until = self.loop.time() + ms / 1000
        if self._unmuting is not None:
            if self._unmuting.when() >= until:
                return
            self._unmuting.cancel()
        self._unmuting = self.loop.call_at(until, self._unmute)
        if not self._throttled:
            self._throttled = True
            self._update_reading()

    def _unmute(self) -> None:
        self._throttled = False
        self._unmuting = None
        if self.closed:
            return
        if self.codec.buffered and len(self.pending) < MAX_IN_FLIGHT and not self.writing_paused:
            self._decode()
        else:
            self._update_reading()

    def _flush(self) -> None:
        if self._out and not self.closed:
            self.activity += 1
            out, self._out = self._out, []
            self._out_bytes = 0
            self.transport.writelines(out)  # type: ignore[union-attr]  # set by connection_made, before any read

    def _on_done(self, _task: asyncio.Future[Any] | None) -> None:
        pending = self.pending
        while pending and pending[0][1].done() and not self.writing_paused:
            req, task = pending.popleft()
            if self.closed:
                return
            if task.cancelled():
                continue
            exc = task.exception()
            if exc is not None:
                if isinstance(exc, ProtocolError):
                    self.close(f"malformed {api.NAMES.get(req.api_key, req.api_key)} request: {exc}")
                else:
                    log.error(
                        "kafka connection %s: %s v%d handler failed",
                        self.peer,
                        api.NAMES.get(req.api_key, req.api_key),
                        req.api_version,
                        exc_info=exc,
                    )
                    self.close("handler error")
                return
            self._respond(req, task.result())
        if self.closed:
            return
        self._flush()
        if self.codec.buffered and len(pending) < MAX_IN_FLIGHT and not self.writing_paused and not self._throttled:
            self._decode()  # requests that arrived while MAX_IN_FLIGHT were unanswered
        elif self.reading_paused:
            self._update_reading()

    def _update_reading(self) -> None:
        if self.closed or self.transport is None:
            return
        should_pause = self.writing_paused or len(self.pending) >= MAX_IN_FLIGHT or self._throttled
        if should_pause and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        elif not should_pause and self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()

    def close(self, reason: str, level: int = logging.WARNING) -> None:
        if self.closed:
            return
        log.log(level, "kafka connection %s closed: %s", self.peer, reason)
        self._flush()  # the answers before the reason to close still go out
        self.closed = True
        self._cancel_pending()
        if self.transport is not None:
            self.transport.close()

    def _cancel_pending(self) -> None:
        if self._unmuting is not None:
            self._unmuting.cancel()
            self._unmuting = None
        for _req, task in self.pending:
            task.cancel()
        self.pending.clear()
        self._arrived.clear()
        for task in list(self._group_tasks):
            task.cancel()


#: what the client is told when its authentication fails (the broker's log says why); Kafka's words
_FAILED = "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"
_SIZE = struct.Struct(">i")


class SaslKafkaConnection(KafkaConnection):
    """A connection on a SASL listener (SASL_PLAINTEXT, SASL_SSL). Until it authenticates it is a small state machine
    of its own, one request at a time, in Kafka's order: ApiVersions (any number), SaslHandshake (the mechanism),
    then the mechanism's tokens, in SaslAuthenticate requests after a v1 handshake or as raw size-prefixed frames
    after a v0 one. Any other request, or one out of that order, closes the connection with a log line. Requests
    are limited to `sasl_max_receive_bytes` until then (an anonymous peer cannot make the broker hold 100 MB).

    A failed authentication is answered SASL_AUTHENTICATION_FAILED (a raw-token exchange cannot be answered: it is
    closed) after a delay that grows with the failures from that address (mqk.broker.security.failures), then the
    connection is closed. Once authenticated, the connection serves every API through the ordinary pipeline; the
    only cost left is one attribute test per read."""

    def __init__(self, server: KafkaServer, listener: KafkaListener | None = None) -> None:
        super().__init__(server, listener)
        self.authenticated = False
        self.codec.max_request_bytes = min(server.config.sasl_max_receive_bytes, server.config.socket_request_max_bytes)
        self._sasl: SaslServer | None = None
        self._mechanism = ""
        #: after a v0 SaslHandshake the tokens come as raw size-prefixed frames, not requests
        self._raw_tokens = False
        #: an exchange step is running off the loop (PLAIN's key derivation) or a failure is being delayed
        self._busy = False
        self._peer_host = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self._peer_host = str(peer[0]) if peer else "?"

    def buffer_updated(self, nbytes: int) -> None:
        if self.authenticated:
            super().buffer_updated(nbytes)
            return
        if self.closed:
            return
        self.activity += 1
        self.codec.buffer_updated(nbytes)
        self._authenticate()

    def _authenticate(self) -> None:
        """Serve the buffered requests of the exchange, one at a time, until it waits, fails or succeeds."""
        security = self.ctx.security
        assert security is not None
        while not self.closed and not self.authenticated and not self._busy:
            try:
                if self._raw_tokens:
                    frame = self.codec.next_frame()
                    if frame is None:
                        break
                    self._evaluate(bytes(frame), None)
                    continue
                req = self.codec.next_request()
            except FrameTooLarge as exc:
                self.close(f"refused frame before authentication: {exc}")
                return
            except ProtocolError as exc:
                self.close(f"protocol error before authentication: {exc}")
                return
            if req is None:
                break
            key = req.api_key
            if key == api.ApiKey.API_VERSIONS and self._sasl is None:
                self._dispatch(req)  # answered at once (its handler never waits)
            elif key == api.ApiKey.SASL_HANDSHAKE and self._sasl is None:
                self._handshake(req, security.mechanisms)
            elif key == api.ApiKey.SASL_AUTHENTICATE and self._sasl is not None:
                self._evaluate(bytes(req.body["auth_bytes"]), req)
            else:
                name = api.NAMES.get(key, key)
                self.close(
                    f"{name} request before authentication (only ApiVersions, SaslHandshake and SaslAuthenticate, "
                    "in that order, are served until then)"
                )
                return
        self._flush()
        if self.authenticated and not self.closed and self.codec.buffered:
            self._decode()  # requests the client sent right behind its last token

    def _handshake(self, req: Request, mechanisms: tuple[str, ...]) -> None:
        security = self.ctx.security
        assert security is not None
        mechanism = req.body["mechanism"]
        if mechanism not in mechanisms:
            self._respond(req, {"error_code": E.UnsupportedSaslMechanismError.code, "mechanisms": list(mechanisms)})
            self.close(f"SASL mechanism {mechanism!r} is not enabled (enabled: {', '.join(mechanisms)})")
            return
        self._sasl = security.sasl_server(mechanism)
        self._mechanism = mechanism
        self._raw_tokens = req.api_version == 0
        self._respond(req, {"error_code": 0, "mechanisms": list(mechanisms)})

    def _evaluate(self, token: bytes, req: Request | None) -> None:
        server = self._sasl
        assert server is not None
        if server.blocking:
            self._run_step(self._evaluate_off_loop(server, token, req))
            return
        try:
            challenge = server.evaluate(token)
        except AuthenticationFailed as exc:
            self._run_step(self._fail(req, exc))
            return
        self._answer(req, challenge, server)

    def _run_step(self, step: Coroutine[Any, Any, None]) -> None:
        """Run a step of the exchange that waits, reading nothing meanwhile."""
        self._busy = True
        if self.transport is not None:
            self.transport.pause_reading()
        task = self.loop.create_task(step)
        self._group_tasks.add(task)  # (cancelled with the connection)
        task.add_done_callback(self._step_done)

    def _step_done(self, task: asyncio.Task[None]) -> None:
        self._group_tasks.discard(task)
        self._busy = False
        if self.closed:
            return
        if not task.cancelled() and task.exception() is not None:
            log.error("kafka connection %s: SASL step failed", self.peer, exc_info=task.exception())
            self.close("SASL error")
            return
        if self.transport is not None:
            self.transport.resume_reading()
        if self.authenticated:
            self._flush()
            if self.codec.buffered:
                self._decode()
        else:
            self._authenticate()

    async def _evaluate_off_loop(self, server: SaslServer, token: bytes, req: Request | None) -> None:
        try:
            challenge = await asyncio.to_thread(server.evaluate, token)
        except AuthenticationFailed as exc:
            await self._fail(req, exc)
            return
        if not self.closed:
            self._answer(req, challenge, server)

    def _answer(self, req: Request | None, challenge: bytes, server: SaslServer) -> None:
        if req is None:
            self._out.append(_SIZE.pack(len(challenge)) + challenge)
        else:
            self._respond(
                req, {"error_code": 0, "error_message": None, "auth_bytes": challenge, "session_lifetime_ms": 0}
            )
        if server.complete:
            security = self.ctx.security
            assert security is not None and server.username is not None
            self.principal = Principal(USER, server.username)
            self.authenticated = True
            self._raw_tokens = False
            self.codec.max_request_bytes = self.server.config.socket_request_max_bytes
            security.failures.succeeded(self._peer_host)
            log.debug("kafka connection %s: authenticated as %s (%s)", self.peer, self.principal, self._mechanism)
        self._flush()

    async def _fail(self, req: Request | None, exc: AuthenticationFailed) -> None:
        security = self.ctx.security
        assert security is not None
        delay = security.failures.failed(self._peer_host)
        log.info(
            "kafka connection %s: failed authentication (%s, user %r): %s; answered in %.2f s",
            self.peer,
            self._mechanism,
            self._sasl.username if self._sasl is not None else None,
            exc,
            delay,
        )
        await self.ctx.clock.sleep(delay)
        if self.closed:
            return
        if req is None:  # a raw token exchange has no answer to give: closed at once
            self.close("authentication failed", level=logging.DEBUG)
            return
        self._respond(
            req,
            {
                "error_code": E.SaslAuthenticationFailedError.code,
                "error_message": _FAILED.format(self._mechanism),
                "auth_bytes": b"",
                "session_lifetime_ms": 0,
            },
        )
        self._flush()
        # the answer goes out now and the connection closes a moment later (Kafka closes a failed authentication's
        # connection after its answer, not with it): a client that reads the close before the answer reports a
        # lost connection instead of the failed authentication
        if self.transport is not None:
            self.transport.pause_reading()
        asyncio.get_running_loop().call_later(
            AUTH_FAILURE_CLOSE_GRACE_S, self.close, "authentication failed", logging.DEBUG
        )


async def _resume(coro: Coroutine[Any, Any, Any], yielded: Any) -> Any:
    """Drive a handler coroutine that `_dispatch` already started and that suspended on `yielded`, as a Task
    would (Python 3.12's eager tasks do the same natively). The handler reads its awaited future's outcome
    itself when resumed; only a cancellation of this Task is thrown into it."""
    while True:
        try:
            if yielded is None:
                await asyncio.sleep(0)  # a bare yield
            else:
                # the handler's own `yield` marked the future as blocking; a Task clears that mark before it
                # waits, and awaiting a pending future that is still marked raises in the C Future
                yielded._asyncio_future_blocking = False
                await yielded
        except asyncio.CancelledError:
            if yielded is None or not yielded.cancelled():
                try:
                    yielded = coro.throw(asyncio.CancelledError())
                except StopIteration as stop:
                    return stop.value
                continue
        except BaseException:  # noqa: BLE001 - the handler sees it when it reads the future's result
            pass
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            return stop.value
