"""DescribeConfigs, AlterConfigs, IncrementalAlterConfigs for topics (and a read-only view of the broker).

Topic entries list every key of `mqk.config.TOPIC_DEFAULTS` (Kafka's defaults plus mqk's `storage.type` and
`index.keys`) with its source: DYNAMIC_TOPIC_CONFIG when set on the topic, DEFAULT_CONFIG otherwise. Broker
entries are this broker's static settings, read-only. Values are validated by type and allowed values before
anything changes; an unknown key or a bad value is INVALID_CONFIG with a message.

`compression.type` accepts only `producer`: mqk stores batches exactly as the producer sent them and never
recompresses, so accepting another value would be a silent lie.
"""
from __future__ import annotations

from mqk import errors as E
from mqk.config import ENGINES, TOPIC_DEFAULTS, TopicConfig
from mqk.server.kafka.handlers.common import NONE

TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8
# ConfigSource
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
# ConfigType
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7

TOPIC_TYPES = {
    "cleanup.policy": LIST, "compression.type": STRING, "delete.retention.ms": LONG, "file.delete.delay.ms": LONG,
    "flush.messages": LONG, "flush.ms": LONG, "index.interval.bytes": INT, "max.compaction.lag.ms": LONG,
    "max.message.bytes": INT, "message.timestamp.type": STRING, "message.timestamp.after.max.ms": LONG,
    "message.timestamp.before.max.ms": LONG, "min.cleanable.dirty.ratio": DOUBLE, "min.compaction.lag.ms": LONG,
    "min.insync.replicas": INT, "preallocate": BOOLEAN, "retention.bytes": LONG, "retention.ms": LONG,
    "segment.bytes": INT, "segment.ms": LONG, "unclean.leader.election.enable": BOOLEAN, "storage.type": STRING,
    "index.keys": BOOLEAN,
}
_CHOICES = {
    "compression.type": {"producer"},
    "message.timestamp.type": {"CreateTime", "LogAppendTime"},
    "storage.type": set(ENGINES) | {""},
}
_MIN = {"max.message.bytes": 0, "segment.bytes": 14, "index.interval.bytes": 0, "min.insync.replicas": 1,
        "retention.ms": -1, "retention.bytes": -1}


def check_topic_config(key: str, value: str | None) -> str | None:
    """A reason the setting is invalid, or None if it is fine. None as value means "remove the override"."""
    kind = TOPIC_TYPES.get(key)
    if kind is None:
        return f"unknown topic config {key!r}"
    if value is None:
        return None
    try:
        if kind in (INT, LONG):
            number = int(value)
            if number < _MIN.get(key, 0) or (kind == INT and number >= 1 << 31):
                return f"{key}={value} is out of range"
        elif kind == DOUBLE:
            if not 0.0 <= float(value) <= 1.0:
                return f"{key}={value} is out of range"
        elif kind == BOOLEAN:
            if value.lower() not in ("true", "false"):
                return f"{key} must be true or false"
        elif kind == LIST:
            parts = [p.strip() for p in value.split(",") if p.strip()]
            if not parts or any(p not in ("delete", "compact") for p in parts):
                return f"{key} must be a list of delete and compact"
    except ValueError:
        return f"{key}={value!r} is not a number"
    choices = _CHOICES.get(key)
    if choices is not None and value not in choices:
        return f"{key} must be one of {sorted(choices)}" + (
            " (mqk stores batches as the producer compressed them)" if key == "compression.type" else "")
    return None


def check_topic_configs(changes: dict[str, str | None]) -> str | None:
    for key, value in changes.items():
        reason = check_topic_config(key, value)
        if reason:
            return reason
    return None


def topic_config_entries(config: TopicConfig, keys=None, synonyms: bool = False, v0: bool = False) -> list[dict]:
    out = []
    for key in TOPIC_DEFAULTS:
        if keys is not None and key not in keys:
            continue
        overridden = key in config.overrides
        value = config.get(key)
        syn = []
        if synonyms:
            if overridden:
                syn.append({"name": key, "value": value, "source": DYNAMIC_TOPIC_CONFIG})
            syn.append({"name": key, "value": TOPIC_DEFAULTS[key], "source": DEFAULT_CONFIG})
        out.append({
            "name": key, "value": value, "read_only": False,
            "config_source": DYNAMIC_TOPIC_CONFIG if overridden else DEFAULT_CONFIG,
            "is_default": not overridden, "is_sensitive": False, "synonyms": syn,
            "config_type": TOPIC_TYPES.get(key, STRING), "documentation": None,
        })
    return out


def broker_entries(server, keys=None, synonyms: bool = False) -> list[dict]:
    c = server.config
    values = [
        ("node.id", str(c.node_id), INT), ("broker.id", str(c.node_id), INT),
        ("message.max.bytes", str(c.message_max_bytes), INT),
        ("socket.request.max.bytes", str(c.socket_request_max_bytes), INT),
        ("auto.create.topics.enable", str(c.auto_create_topics).lower(), BOOLEAN),
        ("num.partitions", str(c.num_partitions), INT),
        ("default.replication.factor", "1", INT), ("offsets.topic.replication.factor", "1", INT),
        ("group.initial.rebalance.delay.ms", str(c.group_initial_rebalance_delay_ms), INT),
        ("group.min.session.timeout.ms", str(c.group_min_session_timeout_ms), INT),
        ("group.max.session.timeout.ms", str(c.group_max_session_timeout_ms), INT),
        ("log.dirs", str(c.store.data_dir), STRING), ("mqk.storage", c.store.storage, STRING),
        ("mqk.flush.mode", c.store.flush_mode, STRING),
    ]
    return [{"name": k, "value": v, "read_only": True, "config_source": STATIC_BROKER_CONFIG, "is_default": False,
             "is_sensitive": False,
             "synonyms": [{"name": k, "value": v, "source": STATIC_BROKER_CONFIG}] if synonyms else [],
             "config_type": t, "documentation": None}
            for k, v, t in values if keys is None or k in keys]


def _broker_name_ok(server, name: str) -> bool:
    return name in ("", str(server.node_id))


async def describe_configs(server, conn, req) -> dict:
    b = req.body
    synonyms = b.get("include_synonyms", False)
    results = []
    for r in b["resources"]:
        rtype, name, keys = r["resource_type"], r["resource_name"], r["configuration_keys"]
        keys = set(keys) if keys is not None else None
        entry = {"error_code": NONE, "error_message": None, "resource_type": rtype, "resource_name": name,
                 "configs": []}
        if rtype == TOPIC:
            info = server.store.topic(name)
            if info is None:
                entry.update(error_code=E.UnknownTopicOrPartitionError.code, error_message=f"unknown topic {name!r}")
            else:
                entry["configs"] = topic_config_entries(info.config, keys, synonyms)
        elif rtype == BROKER:
            if _broker_name_ok(server, name):
                entry["configs"] = broker_entries(server, keys, synonyms)
            else:
                entry.update(error_code=E.InvalidRequestError.code, error_message=f"unknown broker {name!r}")
        elif rtype == BROKER_LOGGER:
            pass  # no adjustable loggers: an empty list
        else:
            entry.update(error_code=E.InvalidRequestError.code, error_message=f"unsupported resource type {rtype}")
        results.append(entry)
    return {"throttle_time_ms": 0, "results": results}


async def _apply(server, rtype: int, name: str, build, validate_only: bool) -> tuple[int, str | None]:
    """Common tail of both alter APIs: `build(old TopicConfig) -> (changes or error message)`."""
    if rtype == BROKER:
        if not _broker_name_ok(server, name):
            return E.InvalidRequestError.code, f"unknown broker {name!r}"
        return E.InvalidRequestError.code, "broker configs are static in mqk (set them in the TOML file)"
    if rtype == BROKER_LOGGER:
        return E.InvalidRequestError.code, "broker loggers are not adjustable"
    if rtype != TOPIC:
        return E.InvalidRequestError.code, f"unsupported resource type {rtype}"
    info = server.store.topic(name)
    if info is None:
        return E.UnknownTopicOrPartitionError.code, f"unknown topic {name!r}"
    new_overrides = build(info.config)
    if isinstance(new_overrides, str):
        return E.InvalidConfigError.code, new_overrides
    if validate_only:
        return NONE, None
    try:
        await server.store.alter_topic_config(name, TopicConfig(new_overrides))
    except Exception as exc:  # noqa: BLE001
        return E.kafka_code_for(exc), str(exc)
    return NONE, None


async def alter_configs(server, conn, req) -> dict:
    """The legacy API: the given set REPLACES every override of the resource."""
    b = req.body
    responses = []
    for r in b["resources"]:
        changes = {c["name"]: c["value"] for c in r["configs"]}

        def build(_old, changes=changes):
            reason = check_topic_configs(changes)
            return reason or {k: v for k, v in changes.items() if v is not None}

        code, message = await _apply(server, r["resource_type"], r["resource_name"], build, b["validate_only"])
        responses.append({"error_code": code, "error_message": message, "resource_type": r["resource_type"],
                          "resource_name": r["resource_name"]})
    return {"throttle_time_ms": 0, "responses": responses}


SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


async def incremental_alter_configs(server, conn, req) -> dict:
    b = req.body
    responses = []
    for r in b["resources"]:
        ops = [(c["name"], c["config_operation"], c["value"]) for c in r["configs"]]

        def build(old: TopicConfig, ops=ops):
            merged = dict(old.overrides)
            for key, op, value in ops:
                if key not in TOPIC_TYPES:
                    return f"unknown topic config {key!r}"
                if op == SET:
                    merged[key] = value
                elif op == DELETE:
                    merged.pop(key, None)
                elif op in (APPEND, SUBTRACT):
                    if TOPIC_TYPES[key] != LIST:
                        return f"{key} is not a list; APPEND/SUBTRACT do not apply"
                    current = [p for p in old.get(key).split(",") if p] if key not in merged else \
                        [p for p in (merged[key] or "").split(",") if p]
                    items = [p.strip() for p in (value or "").split(",") if p.strip()]
                    if op == APPEND:
                        current += [i for i in items if i not in current]
                    else:
                        current = [c for c in current if c not in items]
                    merged[key] = ",".join(current)
                else:
                    return f"unknown config operation {op}"
            return check_topic_configs(merged) or merged

        code, message = await _apply(server, r["resource_type"], r["resource_name"], build, b["validate_only"])
        responses.append({"error_code": code, "error_message": message, "resource_type": r["resource_type"],
                          "resource_name": r["resource_name"]})
    return {"throttle_time_ms": 0, "responses": responses}
