"""The TLS layer (mqk.server.tls) over real loopback sockets, with an echo protocol on top: both protocol kinds get
their bytes, flow control passes through, and everything that is not a good TLS client ends in one log line and a
closed connection (garbage, a handshake that never finishes, TLS 1.1, a missing, expired or foreign client
certificate)."""

from __future__ import annotations

import asyncio
import logging
import ssl
import warnings
from pathlib import Path

import pytest
from helpers import wait_until_async
from pki import make_pki

from mqk.broker.accepted import AcceptedTransports
from mqk.config import TlsConfig
from mqk.server.kafka.rawclient import client_ssl_context
from mqk.server.tls import TlsServer, create_server, server_context


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


class Echo(asyncio.Protocol):
    def __init__(self, seen):
        self.seen = seen

    def connection_made(self, transport):
        self.transport = transport
        self.seen.append(transport.get_extra_info("peercert"))

    def data_received(self, data):
        self.transport.write(data)


class BufferedEcho(asyncio.BufferedProtocol):
    """Echoes in writelines pieces, with a deliberately small receive buffer (decryption fills it piece by piece)."""

    def __init__(self, seen):
        self.seen = seen
        self.buf = bytearray(1000)

    def connection_made(self, transport):
        self.transport = transport
        self.seen.append(transport.get_extra_info("cipher"))

    def get_buffer(self, sizehint):
        return memoryview(self.buf)

    def buffer_updated(self, nbytes):
        data = bytes(self.buf[:nbytes])
        self.transport.writelines([data[:10], memoryview(data)[10:]])


async def serve(pki, protocol, client_auth="none", timeout=10.0):  # noqa: ASYNC109 - the handshake's deadline
    tls = TlsConfig(cert_file=pki.server, key_file=pki.server_key, ca_file=pki.ca, handshake_timeout_ms=1000)
    seen: list = []
    settings = TlsServer(server_context(tls, client_auth), timeout, "test listener")
    server = await create_server(lambda: protocol(seen), "127.0.0.1", 0, settings, accepted=AcceptedTransports())
    return server, server.sockets[0].getsockname()[1], seen


@pytest.mark.parametrize("protocol", [Echo, BufferedEcho])
async def test_bytes_go_through_both_ways(pki, protocol):
    server, port, seen = await serve(pki, protocol)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ssl_context(str(pki.ca)))
        payload = bytes(range(256)) * 2000  # 512 KB: many records, many reads, the writer paused on the way
        writer.write(payload)
        got = await asyncio.wait_for(reader.readexactly(len(payload)), 30)
        assert got == payload
        assert writer.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        writer.close()
        await writer.wait_closed()  # the server answers the close_notify
        assert len(seen) == 1
    finally:
        server.close()


async def test_client_certificate_reaches_the_protocol(pki):
    server, port, seen = await serve(pki, Echo, client_auth="required")
    try:
        cert, key = pki.client("alice")
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ssl_context(str(pki.ca), str(cert), str(key))
        )
        writer.write(b"x")
        assert await reader.readexactly(1) == b"x"
        assert dict(rdn[0] for rdn in seen[0]["subject"])["commonName"] == "alice"
        writer.close()
    finally:
        server.close()


async def closed_with_log(port, caplog, send: bytes, match: str, timeout: float = 10) -> None:  # noqa: ASYNC109 - bound
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(send)
    data = await asyncio.wait_for(reader.read(1 << 16), timeout)
    while data:  # an alert may come first; then the end
        data = await asyncio.wait_for(reader.read(1 << 16), timeout)
    writer.close()
    lines = await wait_until_async(
        lambda: [r for r in caplog.records if r.name == "mqk.tls"], timeout, "the TLS layer's log line"
    )
    assert len(lines) == 1 and match in lines[0].getMessage(), [r.getMessage() for r in lines]
    assert lines[0].levelno == logging.WARNING


async def test_garbage_is_one_log_line_and_a_closed_connection(pki, caplog):
    server, port, seen = await serve(pki, Echo)
    try:
        await closed_with_log(port, caplog, b"\x00\x00\x00\x10GET / HTTP/1.1\r\n\r\n" * 4, "TLS handshake failed")
        assert seen == []  # the protocol never existed
    finally:
        server.close()


async def test_a_handshake_that_never_finishes_is_dropped_at_its_deadline(pki, caplog):
    server, port, seen = await serve(pki, Echo, timeout=0.3)
    try:
        await closed_with_log(port, caplog, b"\x16\x03\x01", "not finished in 0.3 s")
        assert seen == []
    finally:
        server.close()


async def refused(port: int, context: ssl.SSLContext) -> BaseException:
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)) as info:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        writer.write(b"x")  # TLS 1.3: a refused client certificate shows at the first read
        await asyncio.wait_for(reader.readexactly(1), 10)
    return info.value


async def test_tls_1_1_is_refused_by_the_server(pki, caplog):
    server, port, seen = await serve(pki, Echo)
    try:
        old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        old.check_hostname = False
        old.verify_mode = ssl.CERT_NONE
        old.set_ciphers("DEFAULT@SECLEVEL=0")  # let this client offer TLS 1.1 at all
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # (TLS 1.1 is deprecated: the point of the test)
            old.minimum_version = ssl.TLSVersion.TLSv1_1
            old.maximum_version = ssl.TLSVersion.TLSv1_1
        await refused(port, old)
        await wait_until_async(
            lambda: any("handshake failed" in r.getMessage() for r in caplog.records if r.name == "mqk.tls"),
            10,
            "the refused handshake's log line",
        )
        assert any("UNSUPPORTED_PROTOCOL" in r.getMessage() for r in caplog.records if r.name == "mqk.tls")
        assert seen == []
    finally:
        server.close()


@pytest.mark.parametrize("which", ["none", "expired", "rogue"])
async def test_required_client_certificates_refuse_a_missing_expired_or_foreign_one(pki, which, caplog):
    server, port, seen = await serve(pki, Echo, client_auth="required")
    try:
        files = {"none": (None, None), "expired": pki.expired_client, "rogue": pki.rogue_client}[which]
        context = client_ssl_context(str(pki.ca), *(str(f) for f in files if f))
        await refused(port, context)
        assert seen == []
    finally:
        server.close()


def test_a_server_context_speaks_tls_1_2_and_up_only(pki):
    context = server_context(TlsConfig(cert_file=pki.server, key_file=pki.server_key))
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_NONE
    with pytest.raises(ValueError):
        server_context(TlsConfig())
    with pytest.raises((ssl.SSLError, OSError)):
        server_context(TlsConfig(cert_file=pki.ca, key_file=Path(pki.directory / "missing.key")))
