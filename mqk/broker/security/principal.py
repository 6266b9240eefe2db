"""Principals: who a connection acts as, and how a client certificate's subject names one (Kafka's rules).

A principal is `User:NAME`: from SASL, the authenticated user name; from a client certificate, the certificate's
subject mapped by Kafka's `ssl.principal.mapping.rules` (`RULE:pattern/replacement/[LU]` rules tried in order over
the subject in RFC 2253 form, `DEFAULT` taking the whole subject); `User:ANONYMOUS` otherwise. The authorizer
(mqk.broker.security.authorizer) decides what a principal may do.

This module owns the RFC 2253 spelling of a subject as Java's `X500Principal.getName()` writes it (Kafka's rules are
written against that form): RDNs from the most specific (CN) to the least (C), the short keywords CN, C, L, ST, O,
OU, STREET, DC and UID, and `,+"\\<>;` escaped with a backslash.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Principal:
    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"


USER = "User"
ANONYMOUS = Principal(USER, "ANONYMOUS")

#: the attribute names Python's ssl module gives -> the RFC 2253 keywords Java writes
_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_SPECIAL = re.compile(r'([,+"\\<>;])')


def _escape(value: str) -> str:
    value = _SPECIAL.sub(r"\\\1", value)
    if value.startswith(("#", " ")):
        value = "\\" + value
    if value.endswith(" ") and not value.endswith("\\ "):
        value = value[:-1] + "\\ "
    return value


def subject_dn(subject: Sequence[Sequence[tuple[str, str]]]) -> str:
    """The RFC 2253 string of a subject as `ssl.SSLSocket.getpeercert()["subject"]` gives it (RDNs in certificate
    order, each a tuple of (attribute, value) pairs)."""
    rdns = []
    for rdn in reversed(tuple(subject)):
        rdns.append("+".join(f"{_KEYWORDS.get(attr, attr)}={_escape(value)}" for attr, value in rdn))
    return ",".join(rdns)


class NoMatchingRule(ValueError):
    """No principal mapping rule matches a certificate subject."""


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""  # "L", "U" or ""

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        m = self.pattern.fullmatch(dn)
        if m is None:
            return None
        result = m.expand(self.replacement)
        if self.case == "L":
            result = result.lower()
        elif self.case == "U":
            result = result.upper()
        return result


def _split_unescaped(text: str) -> list[str]:
    """Split at '/' not preceded by a backslash; `\\/` becomes '/'."""
    parts, current, i = [], [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] == "/":
            current.append("/")
            i += 2
            continue
        if ch == "/":
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return parts


def parse_rule(text: str) -> _Rule:
    """`DEFAULT` or `RULE:pattern/replacement/[LU]` (Java's `$1` group references in the replacement)."""
    text = text.strip()
    if text == "DEFAULT":
        return _Rule(None)
    if not text.startswith("RULE:"):
        raise ValueError(f"principal mapping rule {text!r}: expected DEFAULT or RULE:pattern/replacement/[LU]")
    parts = _split_unescaped(text[len("RULE:") :])
    if len(parts) != 3 or parts[2] not in ("", "L", "U"):
        raise ValueError(f"principal mapping rule {text!r}: expected RULE:pattern/replacement/[LU]")
    try:
        pattern = re.compile(parts[0])
    except re.error as exc:
        raise ValueError(f"principal mapping rule {text!r}: {exc}") from None
    # Java's $n and ${n} group references -> Python's \g<n>; a literal backslash stays one
    replacement = re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", parts[1].replace("\\", "\\\\"))
    return _Rule(pattern, replacement, parts[2])


class PrincipalMapper:
    """Kafka's SslPrincipalMapper: the first rule matching the subject's RFC 2253 string names the user."""

    def __init__(self, rules: Sequence[str]) -> None:
        self.rules = [parse_rule(rule) for rule in rules]

    def name_of(self, dn: str) -> str:
        for rule in self.rules:
            name = rule.apply(dn)
            if name:
                return name
        raise NoMatchingRule(f"no principal mapping rule matches {dn!r}")

    def principal(self, peercert: dict[str, Any] | None) -> Principal:
        """The principal of a verified client certificate (`getpeercert()`), ANONYMOUS without one."""
        if not peercert or not peercert.get("subject"):
            return ANONYMOUS
        return Principal(USER, self.name_of(subject_dn(peercert["subject"])))
