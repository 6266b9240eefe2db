"""SaslHandshake and SaslAuthenticate on a connection that is not in a SASL exchange: a PLAINTEXT or SSL
connection, or a SASL one that has authenticated already. Both are answered ILLEGAL_SASL_STATE, as Kafka answers
them outside an exchange.

The exchange itself (before authentication, on SASL listeners) is the connection's (mqk.server.kafka.server's
SaslKafkaConnection), not a handler's: it decides what the connection may send next, and how a failure ends it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqk import errors as E
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
    from mqk.protocol.kafka.messages.sasl_authenticate import SaslAuthenticateRequest, SaslAuthenticateResponse
    from mqk.protocol.kafka.messages.sasl_handshake import SaslHandshakeRequest, SaslHandshakeResponse


async def sasl_handshake(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[SaslHandshakeRequest]
) -> SaslHandshakeResponse:
    return {"error_code": E.IllegalSaslStateError.code, "mechanisms": []}


async def sasl_authenticate(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[SaslAuthenticateRequest]
) -> SaslAuthenticateResponse:
    return {
        "error_code": E.IllegalSaslStateError.code,
        "error_message": "SaslAuthenticate request outside a SASL exchange (not a SASL listener, or already "
        "authenticated)",
        "auth_bytes": b"",
        "session_lifetime_ms": 0,
    }
