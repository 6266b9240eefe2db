"""The native client's transport: one asyncio connection to a broker or name server, request/response matched by
opaque, oneway sends, and a callback for requests the server sends us (NOTIFY_CONSUMER_IDS_CHANGED). With
`credentials` (access key, secret) every request leaves signed as RocketMQ's ACL client hook signs it
(mqk.protocol.native.signature)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl as ssl_module
from collections.abc import Callable

from mqk.errors import MqkError, ProtocolError
from mqk.protocol.native.codes import FLAG_ONEWAY
from mqk.protocol.native.command import FrameDecoder, RemotingCommand
from mqk.protocol.native.signature import sign

log = logging.getLogger("mqk.client")


class ClientError(MqkError):
    """A native-client call failed: the broker answered an error code, or the connection failed."""

    def __init__(self, message: str, code: int = -1) -> None:
        super().__init__(message)
        self.code = code


class RemotingConnection:
    _opaques = itertools.count(1)

    def __init__(
        self,
        address: tuple[str, int],
        on_request: Callable[[RemotingCommand], None] | None = None,
        *,
        ssl: ssl_module.SSLContext | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        self.address = address
        #: (access key, secret key) to sign requests with (RocketMQ's plain ACL), or None
        self.credentials = credentials
        self.on_request = on_request
        #: TLS (a client context) for a broker or name server with TLS on
        self.ssl = ssl
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._read_task: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self.closed = False

    async def connect(self) -> None:
        host, port = self.address
        self._reader, self._writer = await asyncio.open_connection(
            host, port, ssl=self.ssl, server_hostname=host if self.ssl is not None else None
        )
        self._read_task = asyncio.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        assert self._reader is not None
        decoder = FrameDecoder(64 * 1024 * 1024)
        try:
            while True:
                data = await self._reader.read(256 * 1024)
                if not data:
                    break
                decoder.receive_data(data)
                while (cmd := decoder.next_command()) is not None:
                    if cmd.is_response:
                        fut = self._pending.pop(cmd.opaque, None)
                        if fut is not None and not fut.done():
                            fut.set_result(cmd)
                    elif self.on_request is not None:
                        self.on_request(cmd)
        except (ConnectionError, ProtocolError) as exc:
            log.debug("connection to %s:%s failed: %s", *self.address, exc)
        except asyncio.CancelledError:
            pass
        finally:
            self.closed = True
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ClientError(f"connection to {self.address[0]}:{self.address[1]} closed"))
            self._pending.clear()

    async def _write(self, data: bytes) -> None:
        if self.closed or self._writer is None:
            raise ClientError(f"connection to {self.address[0]}:{self.address[1]} closed")
        self._writer.write(data)
        await self._writer.drain()

    async def invoke(self, cmd: RemotingCommand, timeout: float = 30.0) -> RemotingCommand:  # noqa: ASYNC109 - a per-request deadline, as RocketMQ clients offer
        cmd.opaque = next(self._opaques)
        self._sign(cmd)
        fut = asyncio.get_running_loop().create_future()
        self._pending[cmd.opaque] = fut
        try:
            await self._write(cmd.encode())
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise ClientError(f"request code {cmd.code} timed out after {timeout}s") from None
        finally:
            self._pending.pop(cmd.opaque, None)

    async def oneway(self, cmd: RemotingCommand) -> None:
        cmd.opaque = next(self._opaques)
        cmd.flag |= FLAG_ONEWAY
        self._sign(cmd)
        await self._write(cmd.encode())

    def _sign(self, cmd: RemotingCommand) -> None:
        if self.credentials is not None:
            sign(cmd.ext_fields, cmd.body, *self.credentials)

    async def close(self) -> None:
        self.closed = True
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self._writer.wait_closed()
        if self._read_task is not None:
            self._read_task.cancel()
            await asyncio.gather(self._read_task, return_exceptions=True)
