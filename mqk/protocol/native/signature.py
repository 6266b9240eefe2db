"""RocketMQ's plain-ACL request signature (sans-IO): what a 4.x client signs and how, for both ends.

A signed request carries the ext fields `AccessKey` and `Signature` (clients may add more, e.g. ali-ons'
`OnsChannel`, and they are signed like any other field). The signed content is the values of every ext field except
`Signature` (and `_UNIQUE_KEY_QUERY`, which RocketMQ's broker leaves out too), in the order of their keys sorted by
code unit, concatenated as UTF-8, followed by the request body when there is one. The signature is the base64 of
HMAC-SHA1 over that content keyed with the access key's secret. Keys are not part of the content, only values.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
#: a field RocketMQ's broker drops before it checks a signature (a query flag some clients add after signing)
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
_UNSIGNED = frozenset((SIGNATURE, UNIQUE_KEY_QUERY))


def signed_content(ext_fields: Mapping[str, str], body: bytes | None) -> bytes:
    """The bytes a signature covers (see the module docstring)."""
    # Java's TreeMap orders String keys by UTF-16 code unit; keys outside the BMP would order differently from
    # Python's code point order, so sort by the UTF-16 encoding to match it exactly.
    keys = sorted((k for k in ext_fields if k not in _UNSIGNED), key=lambda k: k.encode("utf-16-be"))
    content = "".join(ext_fields[k] for k in keys).encode("utf-8")
    return content + body if body else content


def signature(ext_fields: Mapping[str, str], body: bytes | None, secret: str) -> str:
    """The base64 HMAC-SHA1 of the signed content under `secret`."""
    digest = hmac.new(secret.encode("utf-8"), signed_content(ext_fields, body), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def sign(ext_fields: dict[str, str], body: bytes | None, access_key: str, secret: str) -> None:
    """Add `AccessKey` and `Signature` to a request's ext fields (what a RocketMQ client's ACL hook does)."""
    ext_fields[ACCESS_KEY] = access_key
    ext_fields.pop(SIGNATURE, None)
    ext_fields[SIGNATURE] = signature(ext_fields, body, secret)


def verify(ext_fields: Mapping[str, str], body: bytes | None, secret: str) -> bool:
    """Whether the request's `Signature` is the one `secret` makes (compared in constant time)."""
    given = ext_fields.get(SIGNATURE)
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"), signature(ext_fields, body, secret).encode("ascii"))
