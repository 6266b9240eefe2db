"""TLS for every front door, with the stdlib `ssl` module (TLS 1.2 and later only): the server context built from
the `[tls]` settings, and a TLS layer between an accepted TCP connection and a front door's protocol.

A layer of its own rather than the event loop's `create_server(ssl=...)`, because the loop's TLS never tells the
server about a handshake that failed or never finished: the front door's protocol is not created until the
handshake is done, and a failure is dropped without a word. Here:

- every handshake has a deadline (`handshake_timeout_ms`, Kafka's ssl handshake timeout); one that is not done by
  then is logged once and its connection dropped, so a peer that connects and sends nothing holds no buffers;
- bytes that are not TLS (garbage, a plaintext client on a TLS port) fail the handshake: one log line, the TLS
  alert, closed;
- only once the handshake is done is the front door's protocol created and connected (`connection_made` with a
  `TlsTransport`), so nothing of the front door exists for a peer that never finished one; the peer's verified
  certificate is the transport's `get_extra_info("peercert")`.

The front door's protocol sees an ordinary transport. Data path: received ciphertext goes into the SSL object's
memory BIO and is decrypted straight into a buffered protocol's own buffer (`SSLObject.read(n, buffer)`, no copy
of its own); `writelines` gathers small parts before encrypting them and encrypts large ones (a Fetch answer's
store views) where they lie, so an answer leaves as full 16 KiB records rather than a record per part. Flow control
passes through both ways: pausing the front door's reading pauses the socket, the socket's write buffer pauses the
front door's writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from mqk.broker.accepted import AcceptedTransports
from mqk.config import TlsConfig

log = logging.getLogger("mqk.tls")

#: ciphertext read from the socket at a time
READ_SIZE = 256 * 1024
#: plaintext handed to a non-buffered protocol at a time
PLAIN_CHUNK = 64 * 1024
#: the most plaintext one TLS record carries
RECORD_SIZE = 16 * 1024

_VERIFY = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def server_context(tls: TlsConfig, client_auth: str = "none") -> ssl.SSLContext:
    """A server context with the broker's certificate, TLS 1.2+, and client certificates checked against
    `tls.ca_file` as `client_auth` says (none, requested, required). Errors in the files raise here (at start)."""
    if tls.cert_file is None or tls.key_file is None:
        raise ValueError("TLS needs the [tls] table's cert_file and key_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_NO_COMPRESSION
    context.load_cert_chain(str(tls.cert_file), str(tls.key_file), tls.key_password)
    if tls.ca_file is not None:
        context.load_verify_locations(cafile=str(tls.ca_file))
    context.verify_mode = _VERIFY[client_auth]
    return context


@dataclass(frozen=True)
class TlsServer:
    """One TLS listener's settings: its context, its handshake deadline and the name its log lines carry."""

    context: ssl.SSLContext
    handshake_timeout_s: float
    name: str


async def create_server(
    factory: Callable[[], asyncio.BaseProtocol],
    host: str,
    port: int,
    tls: TlsServer | None = None,
    *,
    accepted: AcceptedTransports,
    **kwargs: Any,
) -> asyncio.Server:
    """`loop.create_server(factory, ...)`, with each connection behind the TLS layer when `tls` is given. The TLS
    layer registers each socket in `accepted` (a connection still in its handshake is not yet the front door's);
    without TLS the front door's protocol does."""
    loop = asyncio.get_running_loop()
    if tls is None:
        return await loop.create_server(factory, host, port, **kwargs)
    return await loop.create_server(lambda: TlsProtocol(factory, tls, accepted), host, port, **kwargs)


class TlsProtocol(asyncio.BufferedProtocol):
    """The socket's side of one TLS connection: ciphertext in and out, the handshake, and the front door's protocol
    once the handshake is done."""

    def __init__(
        self, factory: Callable[[], asyncio.BaseProtocol], settings: TlsServer, accepted: AcceptedTransports
    ) -> None:
        self._factory = factory
        self._settings = settings
        self._accepted = accepted
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = settings.context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._recv = memoryview(bytearray(READ_SIZE))
        self._raw: asyncio.Transport | None = None
        self._app: Any = None
        self._app_buffered = False
        self._transport: TlsTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        #: the front door paused its reading: decrypted bytes wait in the SSL object until it resumes
        self._app_paused = False
        self._closing = False
        self._lost = False
        self.peer = "?"

    # --- the socket's callbacks -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)  # a stream server's (uvloop's too: same methods, no subclass)
        self._raw = stream
        if not self._accepted.add(stream):
            self._closing = True
            return
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._settings.handshake_timeout_s, self._handshake_timed_out)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._recv

    def buffer_updated(self, nbytes: int) -> None:
        self._incoming.write(self._recv[:nbytes])
        if self._app is None:
            self._handshake()
        else:
            self._read()

    def eof_received(self) -> bool:
        if self._app is None:
            self._drop(logging.INFO, "closed by the peer during the TLS handshake")
            return False
        self._incoming.write_eof()
        self._read()
        if not self._closing:
            self._app.eof_received()
        return False  # the socket closes; connection_lost tells the front door

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._cancel_timer()
        if self._app is not None:
            app, self._app = self._app, None
            app.connection_lost(exc)
        elif not self._closing:
            self._closing = True
            log.info("%s: connection from %s lost during the TLS handshake", self._settings.name, self.peer)

    def pause_writing(self) -> None:
        if self._app is not None:
            self._app.pause_writing()

    def resume_writing(self) -> None:
        if self._app is not None:
            self._app.resume_writing()

    # --- TLS ------------------------------------------------------------------------------------------

    def _handshake(self) -> None:
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except (ssl.SSLError, OSError) as exc:
            self._drop(logging.WARNING, f"TLS handshake failed: {_reason(exc)}", alert=True)
            return
        self._cancel_timer()
        self._flush()
        self._app = self._factory()
        self._app_buffered = isinstance(self._app, asyncio.BufferedProtocol)
        self._transport = TlsTransport(self)
        self._app.connection_made(self._transport)
        self._read()  # application data that arrived with the handshake's last flight

    def _read(self) -> None:
        """Hand the front door what can be decrypted now, until it pauses or the SSL object wants more."""
        ssl_object = self._ssl
        try:
            while self._app is not None and not self._app_paused and not self._closing:
                # (a read of 0 bytes is the peer's close_notify: the ssl module answers it so, not with an error)
                if self._app_buffered:
                    # fill the front door's buffer with as many records as are here before telling it: one
                    # buffer_updated per socket read rather than one per 16 KiB record
                    buf = memoryview(self._app.get_buffer(-1))
                    size = len(buf)
                    filled = 0
                    try:
                        while filled < size:
                            # (given a buffer, read answers a count; the stubs say bytes)
                            n: int = ssl_object.read(size - filled, buf[filled:])  # type: ignore[assignment]
                            if not n:
                                break
                            filled += n
                    except ssl.SSLWantReadError:
                        if not filled:
                            raise
                    if filled:
                        self._app.buffer_updated(filled)
                    if filled < size and not n:
                        raise ssl.SSLZeroReturnError
                else:
                    data = ssl_object.read(PLAIN_CHUNK)
                    if not data:
                        raise ssl.SSLZeroReturnError
                    self._app.data_received(data)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:  # the peer said goodbye: answer it and close
            if self._app is not None and not self._closing:
                self._app.eof_received()
            self._close()
            return
        except (ssl.SSLError, OSError) as exc:
            self._drop(logging.WARNING, f"TLS error: {_reason(exc)}")
            return
        self._flush()  # reading can produce records to send (session tickets, key updates, alerts)

    def _flush(self) -> None:
        if self._outgoing.pending and self._raw is not None and not self._lost:
            self._raw.write(self._outgoing.read())

    def _write(self, parts: list[Any]) -> None:
        """Encrypt `parts` and send them. Small parts are gathered first (a record per 20-byte header would cost a
        record's overhead and an encryption call each); a part of a full record or more (a Fetch answer's store
        views) is encrypted where it lies, without joining it to the rest."""
        if self._closing:
            return
        write = self._ssl.write
        small = bytearray()
        try:
            for part in parts:
                if len(part) >= RECORD_SIZE:
                    if small:
                        write(small)
                        small = bytearray()
                    write(part)
                elif part:
                    small += part
            if small:
                write(small)
        except (ssl.SSLError, OSError) as exc:
            self._drop(logging.WARNING, f"TLS error: {_reason(exc)}")
            return
        self._flush()

    def _close(self) -> None:
        """Send close_notify and close the socket (without waiting for the peer's)."""
        if self._closing:
            return
        self._closing = True
        self._cancel_timer()
        # (SSLWantReadError among them: the peer's close_notify is not awaited)
        with contextlib.suppress(ssl.SSLError, OSError, ValueError):
            self._ssl.unwrap()
        self._flush()
        if self._raw is not None:
            self._raw.close()

    def _drop(self, level: int, reason: str, *, alert: bool = False) -> None:
        """Close without a TLS goodbye, with one log line; `alert`: send the TLS alert the SSL object made (it tells
        the peer why), after the log line, so the line is written by the time the peer learns of it."""
        if self._closing:
            return
        self._closing = True
        self._cancel_timer()
        log.log(level, "%s: connection from %s closed: %s", self._settings.name, self.peer, reason)
        if alert:
            self._flush()
        if self._raw is not None:
            self._raw.close()

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if self._app is None and not self._closing:
            self._closing = True
            log.warning(
                "%s: connection from %s closed: TLS handshake not finished in %.1f s",
                self._settings.name,
                self.peer,
                self._settings.handshake_timeout_s,
            )
            if self._raw is not None:
                self._raw.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _pause_reading(self) -> None:
        if not self._app_paused:
            self._app_paused = True
            if self._raw is not None and not self._closing:
                self._raw.pause_reading()

    def _resume_reading(self) -> None:
        if self._app_paused:
            self._app_paused = False
            if self._raw is not None and not self._closing:
                self._raw.resume_reading()
                # records already decrypted or buffered in the SSL object would wait for the next socket read
                asyncio.get_running_loop().call_soon(self._read)


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return f"{reason} ({exc})" if reason else str(exc) or type(exc).__name__


class TlsTransport(asyncio.Transport):
    """What the front door's protocol writes to and controls: plaintext in, the TLS layer below."""

    def __init__(self, protocol: TlsProtocol) -> None:
        super().__init__()
        self._tls = protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        tls = self._tls
        if name == "peercert":
            return tls._ssl.getpeercert()
        if name == "ssl_object":
            return tls._ssl
        if name == "sslcontext":
            return tls._settings.context
        if name == "cipher":
            return tls._ssl.cipher()
        if name == "compression":
            return tls._ssl.compression()
        raw = tls._raw
        return raw.get_extra_info(name, default) if raw is not None else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._tls._write([data])

    def writelines(self, list_of_data: Any) -> None:
        self._tls._write(list(list_of_data))

    def can_write_eof(self) -> bool:
        return False  # TLS has no half-close

    def write_eof(self) -> None:
        raise NotImplementedError("TLS connections cannot be half-closed")

    def is_closing(self) -> bool:
        tls = self._tls
        return tls._closing or tls._raw is None or tls._raw.is_closing()

    def close(self) -> None:
        self._tls._close()

    def abort(self) -> None:
        tls = self._tls
        tls._closing = True
        if tls._raw is not None:
            tls._raw.abort()

    def pause_reading(self) -> None:
        self._tls._pause_reading()

    def resume_reading(self) -> None:
        self._tls._resume_reading()

    def is_reading(self) -> bool:
        return not self._tls._app_paused

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if self._tls._raw is not None:
            self._tls._raw.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        raw = self._tls._raw
        return raw.get_write_buffer_size() if raw is not None else 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        raw = self._tls._raw
        return raw.get_write_buffer_limits() if raw is not None else (0, 0)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._tls._app = protocol
        self._tls._app_buffered = isinstance(protocol, asyncio.BufferedProtocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._tls._app  # type: ignore[no-any-return]  # the protocol it was made for
