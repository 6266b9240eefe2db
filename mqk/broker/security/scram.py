"""SCRAM (RFC 5802) over SHA-256 and SHA-512 (RFC 7677), both sides, sans-IO: messages in, messages out.

- `ScramCredential`: what the broker keeps of a user's password for one mechanism: salt, iteration count, StoredKey
  and ServerKey. Never the password, nor the salted password (which would let its holder log in).
- `ScramServer`: the broker's side of one exchange: `evaluate(client-first)` -> server-first,
  `evaluate(client-final)` -> server-final; `AuthenticationFailed` (its `reason` for the broker's log) otherwise.
  A user without a credential is answered with a made-up salt (fixed per user name) and fails only at the proof,
  so an exchange does not tell whether a user exists (RFC 5802 section 5.1).
- `ScramClient`: the client's side, for mqk's own tools and tests.

Kafka's rules, kept: iterations between 4,096 and 16,384; the gs2 header `n,,` or `y,,` (no channel binding) and
an authorization id only if it is the user itself; extensions allowed, but `tokenauth=true` (delegation tokens) is
refused. librdkafka before 2.6.1 sends the client nonce twice in its client-final message (the client nonce, then
the whole nonce the server sent, which starts with it again); Kafka 3.8.1 accepted that, and so does mqk, in exactly
that shape: Debian's kcat (librdkafka 2.0) and other older clients keep working.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from mqk.broker.security.errors import AuthenticationFailed

MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384


@dataclass(frozen=True, slots=True)
class ScramMechanism:
    name: str
    hash_name: str
    #: Kafka's ScramMechanism type in DescribeUserScramCredentials / AlterUserScramCredentials
    kafka_type: int

    @property
    def digest_size(self) -> int:
        return hashlib.new(self.hash_name).digest_size

    def hash(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self.hash_name).digest()

    def salted_password(self, password: str, salt: bytes, iterations: int) -> bytes:
        """Hi(password, salt, i) of RFC 5802: PBKDF2 with this mechanism's HMAC. The password as UTF-8 bytes, as
        Kafka takes it (no SASLprep)."""
        return hashlib.pbkdf2_hmac(self.hash_name, password.encode("utf-8"), salt, iterations)

    def credential(self, salted_password: bytes, salt: bytes, iterations: int) -> ScramCredential:
        client_key = self.hmac(salted_password, b"Client Key")
        return ScramCredential(
            salt=salt,
            stored_key=self.hash(client_key),
            server_key=self.hmac(salted_password, b"Server Key"),
            iterations=iterations,
        )


SCRAM_SHA_256 = ScramMechanism("SCRAM-SHA-256", "sha256", 1)
SCRAM_SHA_512 = ScramMechanism("SCRAM-SHA-512", "sha512", 2)
MECHANISMS: dict[str, ScramMechanism] = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
BY_KAFKA_TYPE: dict[int, ScramMechanism] = {m.kafka_type: m for m in MECHANISMS.values()}


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def salt_password(mechanism: ScramMechanism, password: str, iterations: int = MIN_ITERATIONS) -> tuple[bytes, bytes]:
    """(a fresh random salt, the salted password): what a client sends in AlterUserScramCredentials."""
    salt = secrets.token_bytes(32)
    return salt, mechanism.salted_password(password, salt, iterations)


def new_credential(mechanism: ScramMechanism, password: str, iterations: int = MIN_ITERATIONS) -> ScramCredential:
    salt, salted = salt_password(mechanism, password, iterations)
    return mechanism.credential(salted, salt, iterations)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AuthenticationFailed(f"{what} is not base64") from None


#: printable ASCII but ',' (RFC 5802's `printable`, the alphabet of nonces)
_NONCE = r"[\x21-\x2b\x2d-\x7e]+"
_EXTENSIONS = r"(?:,[A-Za-z]+=[^,]+)*"
_CLIENT_FIRST = re.compile(
    r"(?P<gs2>(?P<flag>[ny]),(?:a=(?P<authzid>[^,]*))?,)"
    rf"(?P<bare>n=(?P<user>[^,]+),r=(?P<nonce>{_NONCE})(?P<ext>{_EXTENSIONS}))"
)
_CLIENT_FINAL = re.compile(
    rf"(?P<without>c=(?P<cb>[A-Za-z0-9+/=]+),r=(?P<nonce>{_NONCE}){_EXTENSIONS}),p=(?P<proof>[A-Za-z0-9+/=]+)"
)
_SERVER_FIRST = re.compile(rf"r=(?P<nonce>{_NONCE}),s=(?P<salt>[A-Za-z0-9+/=]+),i=(?P<iterations>[0-9]+){_EXTENSIONS}")
_SERVER_FINAL = re.compile(r"(?:v=(?P<verifier>[A-Za-z0-9+/=]+)|e=(?P<error>[^,]*))" + _EXTENSIONS)


def _text(token: bytes, what: str) -> str:
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationFailed(f"{what} is not UTF-8") from None


def decode_saslname(name: str) -> str:
    """RFC 5802's saslname: '=2C' is ',' and '=3D' is '='; any other '=' is malformed."""
    if re.search(r"=(?!2C|3D)", name):
        raise AuthenticationFailed(f"user name {name!r} has an invalid '=' escape")
    return name.replace("=2C", ",").replace("=3D", "=")


def encode_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _extensions(text: str) -> dict[str, str]:
    out = {}
    for item in text.split(",")[1:] if text else ():
        key, _, value = item.partition("=")
        out[key] = value
    return out


def new_nonce() -> str:
    return secrets.token_urlsafe(24)  # base64url: no ',' in its alphabet


class ScramServer:
    """The broker's side of one SCRAM exchange."""

    blocking = False  # cheap enough to run on the event loop (hashes and HMACs only)

    def __init__(
        self,
        mechanism: ScramMechanism,
        credentials: Callable[[str], ScramCredential | None],
        *,
        mock_key: bytes,
        nonce: str | None = None,
    ) -> None:
        """`credentials(user)`: the user's credential for this mechanism, or None. `mock_key`: a secret of this
        broker that the made-up salt of unknown users is derived from (the same every time for one name)."""
        self.mechanism = mechanism
        self.credentials = credentials
        self.mock_key = mock_key
        self._server_nonce = nonce or new_nonce()
        self.username: str | None = None
        self.complete = False
        self._state = "first"
        self._credential: ScramCredential | None = None
        self._known = False
        self._gs2 = ""
        self._client_nonce = ""
        self._auth_prefix = ""

    def evaluate(self, token: bytes) -> bytes:
        if self._state == "first":
            self._state = "failed"
            answer = self._first(_text(token, "client-first message"))
            self._state = "final"
            return answer
        if self._state == "final":
            self._state = "failed"
            answer = self._final(_text(token, "client-final message"))
            self._state = "done"
            self.complete = True
            return answer
        raise AuthenticationFailed(f"unexpected SCRAM message in state {self._state}")

    def _first(self, message: str) -> bytes:
        m = _CLIENT_FIRST.fullmatch(message)
        if m is None:
            raise AuthenticationFailed("malformed client-first message")
        user = decode_saslname(m["user"])
        authzid = m["authzid"]
        if authzid and decode_saslname(authzid) != user:
            raise AuthenticationFailed(f"authorization id {authzid!r} differs from the user {user!r}")
        if _extensions(m["ext"]).get("tokenauth", "false").lower() == "true":
            raise AuthenticationFailed("delegation tokens (tokenauth) are not supported")
        self.username = user
        credential = self.credentials(user)
        self._known = credential is not None
        if credential is None:  # answer as for a real user; the proof cannot match
            seed = self.mechanism.hmac(self.mock_key, user.encode("utf-8"))
            credential = ScramCredential(seed[:32], secrets.token_bytes(32), secrets.token_bytes(32), MIN_ITERATIONS)
        self._credential = credential
        self._gs2 = m["gs2"]
        self._client_nonce = m["nonce"]
        server_first = f"r={self._client_nonce}{self._server_nonce},s={_b64(credential.salt)},i={credential.iterations}"
        self._auth_prefix = f"{m['bare']},{server_first},"
        return server_first.encode("ascii")

    def _final(self, message: str) -> bytes:
        m = _CLIENT_FINAL.fullmatch(message)
        if m is None:
            raise AuthenticationFailed("malformed client-final message")
        if _unb64(m["cb"], "channel binding") != self._gs2.encode("utf-8"):
            raise AuthenticationFailed("channel binding does not match the gs2 header")
        nonce = self._client_nonce + self._server_nonce
        if m["nonce"] != nonce and m["nonce"] != self._client_nonce + nonce:  # (the second: librdkafka < 2.6.1)
            raise AuthenticationFailed("nonce does not match the server's")
        proof = _unb64(m["proof"], "proof")
        credential = self._credential
        assert credential is not None
        if len(proof) != self.mechanism.digest_size:
            raise AuthenticationFailed("proof has the wrong length")
        auth_message = (self._auth_prefix + m["without"]).encode("utf-8")
        signature = self.mechanism.hmac(credential.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(self.mechanism.hash(client_key), credential.stored_key) or not self._known:
            raise AuthenticationFailed(f"invalid credentials for user {self.username!r}")
        return f"v={_b64(self.mechanism.hmac(credential.server_key, auth_message))}".encode("ascii")


class ScramClient:
    """The client's side of one SCRAM exchange: `first()`, `final(server_first)`, `verify(server_final)`."""

    def __init__(self, mechanism: ScramMechanism, username: str, password: str, *, nonce: str | None = None) -> None:
        self.mechanism = mechanism
        self.username = username
        self.password = password
        self._nonce = nonce or new_nonce()
        self._bare = f"n={encode_saslname(username)},r={self._nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self._bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = _text(server_first, "server-first message")
        m = _SERVER_FIRST.fullmatch(text)
        if m is None:
            raise AuthenticationFailed("malformed server-first message")
        if not m["nonce"].startswith(self._nonce) or len(m["nonce"]) == len(self._nonce):
            raise AuthenticationFailed("the server's nonce does not extend the client's")
        iterations = int(m["iterations"])
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise AuthenticationFailed(f"iteration count {iterations} out of [{MIN_ITERATIONS}, {MAX_ITERATIONS}]")
        salt = _unb64(m["salt"], "salt")
        salted = self.mechanism.salted_password(self.password, salt, iterations)
        without = f"c={_b64(b'n,,')},r={m['nonce']}"
        auth_message = f"{self._bare},{text},{without}".encode()
        client_key = self.mechanism.hmac(salted, b"Client Key")
        signature = self.mechanism.hmac(self.mechanism.hash(client_key), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = self.mechanism.hmac(self.mechanism.hmac(salted, b"Server Key"), auth_message)
        return f"{without},p={_b64(proof)}".encode()

    def verify(self, server_final: bytes) -> None:
        m = _SERVER_FINAL.fullmatch(_text(server_final, "server-final message"))
        if m is None:
            raise AuthenticationFailed("malformed server-final message")
        if m["error"] is not None:
            raise AuthenticationFailed(f"the server refused: {m['error']}")
        if not hmac.compare_digest(_unb64(m["verifier"], "verifier"), self._server_signature):
            raise AuthenticationFailed("the server's signature does not match: it does not know the credential")
