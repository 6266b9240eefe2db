"""Topic names: the one rule set every way of creating a topic applies.

A topic name is 1 to 249 characters of Kafka's alphabet (ASCII letters, digits, `.`, `_`, `-`), and neither `.`
nor `..` (both would name a directory). RocketMQ's alphabet adds `%` and `|`: RocketMQ writes namespaces and the
per-group retry and dead-letter topics with them (`ns%orders`, `%RETRY%group`, `%DLQ%group`, see
mqk.broker.internal). A topic created through the RocketMQ front door may use them; one created through Kafka's
may not, as Kafka itself refuses them. Reading an existing topic is never refused by name: a Kafka client sees
`%RETRY%group` in Metadata and may fetch from it.

The store does not check names; it only refuses what its files cannot hold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Kafka's limit (a partition directory `<topic>-<partition>` must fit a 255-byte file name)
MAX_LENGTH = 249


@dataclass(frozen=True, slots=True)
class NameRule:
    """One alphabet of topic names (KAFKA or ROCKETMQ below)."""

    label: str
    pattern: re.Pattern[str]

    def error(self, name: object) -> str | None:
        """Why `name` cannot name a new topic, or None if it can."""
        if (
            not isinstance(name, str)
            or not name
            or len(name) > MAX_LENGTH
            or name in (".", "..")
            or self.pattern.fullmatch(name) is None
        ):
            return f"illegal topic name {name!r}"
        return None

    def allows(self, name: object) -> bool:
        return self.error(name) is None


#: Kafka's legal topic characters
KAFKA = NameRule("kafka", re.compile(r"[a-zA-Z0-9._-]+"))
#: Kafka's plus RocketMQ's `%` and `|` (namespaces, retry and dead-letter topics)
ROCKETMQ = NameRule("rocketmq", re.compile(r"[a-zA-Z0-9._%|-]+"))
