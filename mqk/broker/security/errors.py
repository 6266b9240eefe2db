"""The security errors of the broker layer (each front door turns them into its protocol's answer)."""

from __future__ import annotations

from mqk.errors import MqkError


class AuthenticationFailed(MqkError):
    """A SASL exchange failed: bad credentials, an unknown user, or a malformed message. The message says why, for
    the broker's log; clients are told only that authentication failed."""
