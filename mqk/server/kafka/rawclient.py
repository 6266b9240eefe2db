"""A minimal asyncio Kafka client over mqk's own codec, for tests and tools: send any request at any version,
read responses in order, and write raw bytes (for bad-input tests). Not a production client: no retries, no
metadata cache, one connection. It speaks TLS (`ssl=`, a client context: `client_ssl_context`) and authenticates
with SASL PLAIN or SCRAM (`authenticate`, SaslHandshake v1 + SaslAuthenticate), as the `mqk` admin commands need.

Also `make_batch`, which builds a record batch v2 with the `_fast` kernel, for produce tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_module
import struct
import time
from collections.abc import Sequence
from typing import Any

from mqk._fast import load
from mqk.broker.security.scram import MECHANISMS, ScramClient
from mqk.errors import KafkaError
from mqk.protocol.kafka.api import ApiKey
from mqk.protocol.kafka.codec import decode_response_frame, encode_request

recbatch = load("recbatch")


def make_batch(
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    timestamp: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    headers: Sequence[Sequence[tuple[str, bytes | None]]] | None = None,
    transactional: bool = False,
) -> bytearray:
    """An uncompressed record batch v2 holding one record per value (timestamps 1 ms apart); `transactional`
    sets the batch's transactional attribute (a transactional producer's batch)."""
    ts = int(time.time() * 1000) if timestamp is None else timestamp
    records = bytearray()
    for i, value in enumerate(values):
        key = keys[i] if keys is not None else None
        records += recbatch.encode_record(i, i, key, value, headers[i] if headers else [])
    n = len(values)
    batch: bytearray = recbatch.build_batch(
        0,
        ts,
        ts + n - 1,
        bytes(records),
        n,
        n - 1,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        attributes=0x10 if transactional else 0,
    )
    return batch


class RawKafkaClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_id: str = "raw") -> None:
        self.reader, self.writer = reader, writer
        self.client_id = client_id
        self._correlation = 0
        self._sent: list[tuple[int, int, int]] = []  # (correlation id, api key, version) awaiting a response

    @classmethod
    async def connect(
        cls, host: str, port: int, client_id: str = "raw", *, ssl: ssl_module.SSLContext | None = None
    ) -> RawKafkaClient:
        reader, writer = await asyncio.open_connection(host, port, ssl=ssl, server_hostname=host if ssl else None)
        return cls(reader, writer, client_id)

    async def authenticate(self, mechanism: str, username: str, password: str) -> None:
        """SASL on a SASL listener: SaslHandshake v1, then the mechanism's SaslAuthenticate (v2) exchange. Raises the
        Kafka error the broker answered (mqk.errors), or AuthenticationFailed when the server's SCRAM signature
        does not check out."""
        shake = await self.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mechanism})
        _raise(shake["error_code"], f"SASL mechanism {mechanism} (the broker offers {shake['mechanisms']})")
        if mechanism == "PLAIN":
            await self._sasl_step(b"\x00" + username.encode() + b"\x00" + password.encode())
            return
        scram = ScramClient(MECHANISMS[mechanism], username, password)
        server_first = await self._sasl_step(scram.first())
        scram.verify(await self._sasl_step(scram.final(server_first)))

    async def _sasl_step(self, token: bytes) -> bytes:
        answer = await self.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": token})
        _raise(answer["error_code"], answer.get("error_message") or "SASL authentication")
        return bytes(answer["auth_bytes"])

    def send(self, api_key: int, version: int, body: dict[str, Any], expect_response: bool = True) -> int:
        self._correlation += 1
        cid = self._correlation
        self.writer.writelines(encode_request(api_key, version, cid, self.client_id, body))
        if expect_response:
            self._sent.append((cid, api_key, version))
        return cid

    # ASYNC109: the `timeout` of receive, call and closed_by_peer is a per-call deadline on purpose (a test's one
    # line "answered within N s"), where asyncio.timeout would take a block around each call
    async def receive(self, timeout: float = 10.0) -> tuple[int, dict[str, Any]]:  # noqa: ASYNC109 - see above
        cid, api_key, version = self._sent.pop(0)
        head = await asyncio.wait_for(self.reader.readexactly(4), timeout)
        (size,) = struct.unpack(">i", head)
        frame = await asyncio.wait_for(self.reader.readexactly(size), timeout)
        got_cid, body = decode_response_frame(api_key, version, frame)
        if got_cid != cid:
            raise AssertionError(f"response to correlation id {got_cid}, expected {cid}")
        return cid, body

    async def call(
        self,
        api_key: int,
        version: int,
        body: dict[str, Any],
        timeout: float = 10.0,  # noqa: ASYNC109 - see receive
    ) -> dict[str, Any]:
        self.send(api_key, version, body)
        await self.writer.drain()
        return (await self.receive(timeout))[1]

    def write_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def closed_by_peer(self, timeout: float = 5.0) -> bool:  # noqa: ASYNC109 - see receive
        """True if the broker closes the connection (EOF) within `timeout`."""
        try:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
        return data == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # the broker closed it first: fine
            await self.writer.wait_closed()

    async def __aenter__(self) -> RawKafkaClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


def _raise(code: int, message: str) -> None:
    if code:
        raise KafkaError.for_code(code)(message)


def client_ssl_context(
    cafile: str | None = None, certfile: str | None = None, keyfile: str | None = None, password: str | None = None
) -> ssl_module.SSLContext:
    """A client context: the server checked against `cafile` (the system's CAs without one) and its host name; a
    client certificate when `certfile` is given."""
    context = ssl_module.create_default_context(cafile=cafile)
    context.minimum_version = ssl_module.TLSVersion.TLSv1_2
    if certfile:
        context.load_cert_chain(certfile, keyfile, password)
    return context
