"""Per-topic settings as the broker applies them: the schema (`mqk.config.TOPIC_SCHEMA`) checked on every creation
and alteration, and one protocol-neutral description of a topic's settings.

Every path that creates a topic or changes its settings goes through `mqk.broker.topics.TopicRegistry`, which
checks the changes here first: Kafka's CreateTopics, AlterConfigs and IncrementalAlterConfigs, RocketMQ's
UPDATE_AND_CREATE_TOPIC, auto-creation on Metadata, Produce and RocketMQ send, and the CLI (which speaks one of
the two protocols). An unknown key or a value of the wrong type or outside its bounds is refused with a reason,
before anything changes.

The protocol views are drawn from `describe`: Kafka's DescribeConfigs (names, sources, synonyms, types: in
mqk.server.kafka.handlers.configs) and RocketMQ's topic config table (perm, read/write queue numbers, filter
type: in mqk.server.native.context).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mqk.config import LIST, TOPIC_SCHEMA, TopicConfig, TopicConfigKey

__all__ = [
    "LEGACY_KEYS",
    "TOPIC_SCHEMA",
    "Setting",
    "check",
    "check_all",
    "config_of",
    "describe",
    "is_list",
    "list_items",
    "without_legacy",
]

#: topic keys Kafka 4 removed that clients and tools of Kafka 3.x still send (KIP-724's message.format.version, the
#: timestamp difference KIP-937 replaced): accepted and ignored, as Kafka 4 does, never stored or reported
LEGACY_KEYS = frozenset({"message.format.version", "message.timestamp.difference.max.ms"})


def without_legacy(changes: Mapping[str, str | None]) -> Mapping[str, str | None]:
    """`changes` without the LEGACY_KEYS (the same mapping when it has none)."""
    if LEGACY_KEYS.isdisjoint(changes):
        return changes
    return {k: v for k, v in changes.items() if k not in LEGACY_KEYS}


def check(key: str, value: str | None) -> str | None:
    """Why setting `key` to `value` is refused, or None if it is fine. None as value means "remove the
    override", which any known key allows; a legacy key is fine whatever its value (it is ignored)."""
    schema = TOPIC_SCHEMA.get(key)
    if schema is None:
        return None if key in LEGACY_KEYS else f"unknown topic config {key!r}"
    if value is None:
        return None
    return schema.check(value)


def check_all(changes: Mapping[str, str | None]) -> str | None:
    """The first refusal among `changes`, or None."""
    for key, value in changes.items():
        reason = check(key, value)
        if reason:
            return reason
    return None


def config_of(changes: Mapping[str, str | None]) -> TopicConfig:
    """The TopicConfig with `changes` as its overrides (None values and legacy keys dropped); check them first."""
    return TopicConfig({k: v for k, v in changes.items() if v is not None and k not in LEGACY_KEYS})


def is_list(key: str) -> bool:
    schema = TOPIC_SCHEMA.get(key)
    return schema is not None and schema.type == LIST


def list_items(value: str | None) -> list[str]:
    """The items of a LIST value (comma-separated, blanks dropped)."""
    return [p.strip() for p in (value or "").split(",") if p.strip()]


@dataclass(frozen=True, slots=True)
class Setting:
    """One key of a topic's settings: its schema, its value, and whether the topic sets it (else the default)."""

    key: TopicConfigKey
    value: str
    overridden: bool


def describe(config: TopicConfig, keys: Iterable[str] | None = None) -> list[Setting]:
    """Every schema key (or those of `keys` that are in the schema), in schema order."""
    wanted = None if keys is None else set(keys)
    overrides = config.overrides
    return [
        Setting(schema, config.get(name), name in overrides)
        for name, schema in TOPIC_SCHEMA.items()
        if wanted is None or name in wanted
    ]
