"""Fuzz target for the SASL paths: the SCRAM-SHA-256/512 and PLAIN servers the broker runs for every SASL client
(mqk.broker.security), and the SCRAM client mqk's tools run against a server's answers.

An input's first byte picks the path: 0 SCRAM-SHA-256 server, 1 SCRAM-SHA-512 server, 2 PLAIN server, 3 SCRAM
client; the rest is the peer's messages, separated by NUL NUL (the server paths take client-first then client-final;
the client path takes server-first then server-final).

With atheris installed:  python fuzz/fuzz_sasl.py [-atheris_runs=N] [corpus dir]
Without it, `corpus()` is a fixed set of inputs (valid exchanges, each of their messages cut at every length, and
known-bad messages) and `smoke(iterations, seed)` mutates them pseudo-randomly; the unit tests run both. The
property: a message is answered or refused with `AuthenticationFailed`, nothing else escapes; a refused exchange
never completes; and only a message whose proof checks out completes one.
"""

from __future__ import annotations

import random
import sys

from mqk.broker.security.errors import AuthenticationFailed
from mqk.broker.security.sasl import PlainServer
from mqk.broker.security.scram import SCRAM_SHA_256, SCRAM_SHA_512, ScramClient, ScramServer

SEPARATOR = b"\x00\x00"
SCRAM_256, SCRAM_512, PLAIN, CLIENT = 0, 1, 2, 3
SALT = b"fuzz-salt-fuzz-salt"
SERVER_NONCE = "fuzz-server-nonce"
CLIENT_NONCE = "fuzz-client-nonce"
PASSWORD = "pencil"
MECHANISM = {SCRAM_256: SCRAM_SHA_256, SCRAM_512: SCRAM_SHA_512}
CREDENTIALS = {
    m.name: m.credential(m.salted_password(PASSWORD, SALT, 4096), SALT, 4096) for m in (SCRAM_SHA_256, SCRAM_SHA_512)
}


def _credential(mechanism):
    return lambda user: CREDENTIALS[mechanism.name] if user == "user" else None


def run(data: bytes) -> bool:
    """Run one input; whether an exchange completed."""
    if not data:
        return False
    path, messages = data[0] % 4, data[1:].split(SEPARATOR)
    try:
        if path in MECHANISM:
            mechanism = MECHANISM[path]
            server = ScramServer(mechanism, _credential(mechanism), mock_key=b"fuzz", nonce=SERVER_NONCE)
            for message in messages[:3]:
                answer = server.evaluate(message)
                assert isinstance(answer, bytes)
            return server.complete
        if path == PLAIN:
            plain = PlainServer(lambda user, m: CREDENTIALS[m.name] if user == "user" else None)
            assert plain.evaluate(messages[0]) == b""
            return plain.complete
        client = ScramClient(SCRAM_SHA_256, "user", PASSWORD, nonce=CLIENT_NONCE)
        client.first()
        client.final(messages[0])
        if len(messages) < 2:
            return False
        client.verify(messages[1])
        return True
    except AuthenticationFailed:
        return False


def test_one_input(data: bytes) -> None:
    run(data)


def _exchange(mechanism) -> list[bytes]:
    """A valid client-first and client-final pair for the target's server (fixed nonces)."""
    client = ScramClient(mechanism, "user", PASSWORD, nonce=CLIENT_NONCE)
    server = ScramServer(mechanism, _credential(mechanism), mock_key=b"fuzz", nonce=SERVER_NONCE)
    first = client.first()
    final = client.final(server.evaluate(first))
    return [first, final]


def _server_side(mechanism) -> list[bytes]:
    """A valid server-first and server-final pair for the target's client."""
    client = ScramClient(mechanism, "user", PASSWORD, nonce=CLIENT_NONCE)
    server = ScramServer(mechanism, _credential(mechanism), mock_key=b"fuzz", nonce=SERVER_NONCE)
    server_first = server.evaluate(client.first())
    return [server_first, server.evaluate(client.final(server_first))]


def valid() -> list[bytes]:
    """Inputs that complete an exchange."""
    return [
        bytes([SCRAM_256]) + SEPARATOR.join(_exchange(SCRAM_SHA_256)),
        bytes([SCRAM_512]) + SEPARATOR.join(_exchange(SCRAM_SHA_512)),
        bytes([PLAIN]) + b"\x00user\x00" + PASSWORD.encode(),
        bytes([CLIENT]) + SEPARATOR.join(_server_side(SCRAM_SHA_256)),
    ]


def corpus() -> list[bytes]:
    """The fixed corpus: the valid inputs, each message of them cut at every length, and known-bad messages."""
    out = valid()
    for path, messages in (
        (SCRAM_256, _exchange(SCRAM_SHA_256)),
        (SCRAM_512, _exchange(SCRAM_SHA_512)),
        (CLIENT, _server_side(SCRAM_SHA_256)),
    ):
        first, final = messages
        out += [bytes([path]) + first[:n] for n in range(len(first))]
        out += [bytes([path]) + first + SEPARATOR + final[:n] for n in range(len(final))]
    plain = b"\x00user\x00" + PASSWORD.encode()
    out += [bytes([PLAIN]) + plain[:n] for n in range(len(plain))]
    first_256, final_256 = _exchange(SCRAM_SHA_256)
    out += [
        bytes([SCRAM_256]) + first_256 + SEPARATOR + final_256 + SEPARATOR + final_256,  # a third message
        bytes([SCRAM_256]) + first_256.replace(b"n,,", b"p=tls-unique,,") + SEPARATOR + final_256,
        bytes([SCRAM_256]) + first_256 + SEPARATOR + final_256.replace(b"c=biws", b"c=eSws"),
        bytes([SCRAM_256]) + first_256.replace(b"n=user", b"n=us=er"),
        bytes([SCRAM_256]) + first_256.replace(b"n=user", b"n=nobody") + SEPARATOR + final_256,
        bytes([SCRAM_256]) + b"\xff\xfe\xfd",
        bytes([PLAIN]) + b"\x00user\x00" + PASSWORD.encode() + b"\x00",
        bytes([CLIENT]) + b"r=fuzz-client-nonce,s=AAAA,i=1",
        bytes([CLIENT]) + b"r=elsewhere,s=AAAA,i=4096",
    ]
    return out


def smoke(iterations: int = 2000, seed: int = 0) -> int:
    """`iterations` pseudo-random mutations of the corpus (bytes flipped, cut, duplicated)."""
    rng = random.Random(seed)
    seeds = corpus()
    for _ in range(iterations):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            if not data:
                break
            pos = rng.randrange(len(data))
            action = rng.randrange(3)
            if action == 0:
                data[pos] = rng.getrandbits(8)
            elif action == 1:
                del data[pos : pos + rng.randrange(1, 8)]
            else:
                data[pos:pos] = data[pos : pos + rng.randrange(1, 8)]
        test_one_input(bytes(data))
    return iterations


if __name__ == "__main__":  # pragma: no cover - needs atheris
    import atheris

    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
