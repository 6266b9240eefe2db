"""Typed errors of the Kafka protocol layer (sans-IO codecs).

Remote errors (the peer sent bytes that break the protocol) are `mqk.errors.ProtocolError`s: the server closes the
connection and logs the reason. `EncodeError` is the local one (like h11's LocalProtocolError): our own handler asked
to encode something the schema cannot carry; it is a bug on our side, not the peer's.
"""

from __future__ import annotations

from mqk.errors import MqkError, ProtocolError


class MalformedMessage(ProtocolError):
    """A frame, header or body that does not decode (truncated, bad length, bad UTF-8, null where not nullable).
    When the header was readable, the codec sets `api_key`, `api_version` and `correlation_id` (else -1)."""

    api_key = api_version = correlation_id = -1


class UnknownApiKey(ProtocolError):
    """The request's api key is not one this broker knows; Kafka closes the connection."""

    def __init__(self, api_key: int, correlation_id: int = -1) -> None:
        super().__init__(f"unknown api key {api_key}")
        self.api_key, self.correlation_id = api_key, correlation_id


class UnsupportedApiVersion(ProtocolError):
    """A known API at a version outside the supported range (ApiVersions is answered instead, see codec)."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int = -1) -> None:
        super().__init__(f"api key {api_key} version {api_version} is not supported")
        self.api_key, self.api_version, self.correlation_id = api_key, api_version, correlation_id


class EncodeError(MqkError):
    """A message dict cannot be encoded (wrong type, None for a non-nullable field, value out of range)."""
