"""SASL mechanisms on the broker's side, protocol-neutral: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (scram.py).

A mechanism server takes the client's tokens one at a time (`evaluate(token) -> challenge`) until `complete`, then
names the authenticated user (`username`); a failure raises `AuthenticationFailed`. The front door frames the tokens
(Kafka: SaslHandshake + SaslAuthenticate, or raw tokens after a v0 handshake) and decides what a failure costs.

Passwords are checked against the SCRAM credentials of the user store (mqk.broker.security.users), the only form in
which the broker keeps them: PLAIN derives the salted password from the credential's salt and iteration count
(SCRAM-SHA-512's if the user has one, else SCRAM-SHA-256's) and compares StoredKeys. That key derivation is the
costly part of PLAIN (`blocking`: the front door runs it off the event loop); an unknown user costs the same, so
the time taken does not tell whether a user exists.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Protocol

from mqk.broker.security.errors import AuthenticationFailed
from mqk.broker.security.scram import (
    MECHANISMS,
    MIN_ITERATIONS,
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    ScramCredential,
    ScramMechanism,
    ScramServer,
)

PLAIN = "PLAIN"


class SaslServer(Protocol):
    #: evaluate() derives keys (PBKDF2): run it off the event loop
    blocking: bool
    complete: bool
    username: str | None

    def evaluate(self, token: bytes) -> bytes: ...


#: (user, mechanism) -> that user's SCRAM credential for the mechanism, or None
CredentialLookup = Callable[[str, ScramMechanism], ScramCredential | None]

_DUMMY_SALT = b"\x00" * 32


class PlainServer:
    """PLAIN: one message `authzid NUL authcid NUL password`, answered with an empty challenge."""

    blocking = True

    def __init__(self, credentials: CredentialLookup) -> None:
        self.credentials = credentials
        self.username: str | None = None
        self.complete = False
        self._used = False

    def evaluate(self, token: bytes) -> bytes:
        if self._used:
            raise AuthenticationFailed("PLAIN takes one message")
        self._used = True
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise AuthenticationFailed("malformed PLAIN message (expected authzid NUL user NUL password)")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("PLAIN message is not UTF-8") from None
        if not user or not password:
            raise AuthenticationFailed("PLAIN user name and password must not be empty")
        if authzid and authzid != user:
            raise AuthenticationFailed(f"authorization id {authzid!r} differs from the user {user!r}")
        self.username = user
        for mechanism in (SCRAM_SHA_512, SCRAM_SHA_256):
            credential = self.credentials(user, mechanism)
            if credential is not None:
                break
        else:
            SCRAM_SHA_512.salted_password(password, _DUMMY_SALT, MIN_ITERATIONS)  # as long as a real check
            raise AuthenticationFailed(f"unknown user {user!r}")
        salted = mechanism.salted_password(password, credential.salt, credential.iterations)
        stored = mechanism.hash(mechanism.hmac(salted, b"Client Key"))
        if not hmac.compare_digest(stored, credential.stored_key):
            raise AuthenticationFailed(f"invalid password for user {user!r}")
        self.complete = True
        return b""


def new_server(mechanism: str, credentials: CredentialLookup, mock_key: bytes) -> SaslServer:
    """A server for one exchange of `mechanism` (one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)."""
    if mechanism == PLAIN:
        return PlainServer(credentials)
    scram = MECHANISMS[mechanism]
    return ScramServer(scram, lambda user: credentials(user, scram), mock_key=mock_key)
