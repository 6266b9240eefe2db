"""Fuzz target for the TLS path: what a peer's first bytes do to a TLS listener's connection (mqk.server.tls's
TlsProtocol, on a transport that records what it is told), before any front door exists.

With atheris installed:  python fuzz/fuzz_tls.py [-atheris_runs=N] [corpus dir]
Without it, `corpus()` is a fixed set of inputs (a real ClientHello, cut at every length and with bytes changed,
and non-TLS bytes: a Kafka request, an HTTP request, zeros) and `smoke(iterations, seed)` mutates them; the unit
tests run both. The property: the bytes go in at any split without an exception escaping the protocol; the
front door's protocol is never created (no input here completes a handshake); the connection is either closed or
still waiting for the rest of a handshake, and what the server sent back is TLS (records starting with a known
content type).

The server certificate is made once per process with the `cryptography` package (a dev dependency).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import random
import ssl
import sys
import tempfile
from pathlib import Path
from typing import Any

from mqk.broker.accepted import AcceptedTransports
from mqk.server.tls import TlsProtocol, TlsServer

#: TLS record content types: change_cipher_spec, alert, handshake, application_data
RECORD_TYPES = {20, 21, 22, 23}


def _context() -> ssl.SSLContext:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fuzz")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    directory = Path(tempfile.mkdtemp(prefix="mqk-fuzz-tls-"))
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(directory / "cert.pem", directory / "key.pem")
    return context


_CONTEXT: ssl.SSLContext | None = None


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.sent = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("198.51.100.7", 4242) if name == "peername" else default

    def write(self, data: Any) -> None:
        self.sent += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _made() -> None:
    raise AssertionError("a front door was created without a finished handshake")


def test_one_input(data: bytes) -> None:
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = _context()
    protocol = TlsProtocol(_made, TlsServer(_CONTEXT, 10.0, "fuzz listener"), AcceptedTransports())  # type: ignore[arg-type]
    transport = _Transport()

    async def feed() -> None:
        protocol.connection_made(transport)
        cut = data[0] % (len(data) + 1) if data else 0
        for piece in (data[:cut], data[cut:]):
            if piece and not transport.closed:
                buf = protocol.get_buffer(len(piece))
                buf[: len(piece)] = piece
                protocol.buffer_updated(len(piece))
        if not transport.closed:
            protocol.eof_received()
        protocol.connection_lost(None)

    asyncio.run(feed())  # (a loop per input, closed after it: the handshake deadline's timer needs one)
    sent = bytes(transport.sent)
    assert not sent or sent[0] in RECORD_TYPES, sent[:16]


def _client_hello() -> bytes:
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = client.wrap_bio(incoming, outgoing, server_hostname="fuzz")
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def corpus() -> list[bytes]:
    hello = _client_hello()
    out = [hello[:n] for n in range(0, len(hello), 7)] + [hello]
    for pos in (0, 1, 2, 3, 4, 5, 9, 10, 43, len(hello) - 1):
        changed = bytearray(hello)
        changed[pos] ^= 0xFF
        out.append(bytes(changed))
    out += [
        b"\x00\x00\x00\x17\x00\x12\x00\x03\x00\x00\x00\x01\xff\xff",  # a Kafka ApiVersions request in plaintext
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x00" * 64,
        b"\x16\x03\x01\xff\xff" + b"\x01" * 32,  # a record that claims more than comes
        hello + hello,
    ]
    return out


def smoke(iterations: int = 300, seed: int = 0) -> int:
    rng = random.Random(seed)
    seeds = corpus()
    for _ in range(iterations):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            if data:
                data[rng.randrange(len(data))] = rng.getrandbits(8)
        test_one_input(bytes(data))
    return iterations


if __name__ == "__main__":  # pragma: no cover - needs atheris
    import logging

    import atheris

    logging.getLogger("mqk.tls").setLevel(logging.ERROR)  # one line per refused input would drown the fuzzer's own
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
