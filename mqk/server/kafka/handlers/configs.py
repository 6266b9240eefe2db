"""DescribeConfigs, AlterConfigs, IncrementalAlterConfigs for topics and groups (and a read-only view of the broker).

Groups (resource type GROUP, 32): Kafka's GroupConfig keys of share groups (mqk.groups.share.GROUP_CONFIGS:
share.auto.offset.reset, share.isolation.level, share.record.lock.duration.ms, share.delivery.count.limit,
share.session.timeout.ms, share.heartbeat.interval.ms), each GROUP_CONFIG when the group sets it and
DEFAULT_CONFIG (the broker's `group_share_*`) otherwise; kept with the group's share state, so they survive
restarts, and in cluster mode in etcd, where every broker follows them (mqk.broker.cluster.group_configs): any
broker takes an alter, and its answer comes once its own view shows the change. DESCRIBE_CONFIGS and ALTER_CONFIGS
on the group (GROUP_AUTHORIZATION_FAILED).

Kafka's view of the broker's per-topic settings schema (mqk.config.TOPIC_SCHEMA, applied by mqk.broker): topic
entries list every key (Kafka's plus mqk's `storage.type` and `index.keys`) with its source, DYNAMIC_TOPIC_CONFIG
when set on the topic, DEFAULT_CONFIG otherwise, and its Kafka ConfigType. Broker entries are this broker's
static settings, read-only. Values are checked by the broker's schema before anything changes; an unknown key
or a bad value is INVALID_CONFIG with the schema's reason.

`compression.type` takes Kafka's values: `producer` keeps batches as the producer compressed them; `uncompressed`,
`gzip`, `snappy`, `lz4` and `zstd` make the Produce handler recompress every batch that differs on append.

Authorization as Kafka's: describing a topic's configs asks DESCRIBE_CONFIGS on it, altering ALTER_CONFIGS
(TOPIC_AUTHORIZATION_FAILED); the broker's and its loggers' ask the same of the cluster
(CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from mqk import config as C
from mqk import errors as E
from mqk.broker import topic_config
from mqk.config import PLAINTEXT, TopicConfig
from mqk.groups.share import GROUP_CONFIGS
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import NONE, allowed, allowed_cluster

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
    from mqk.protocol.kafka.messages.alter_configs import (
        AlterConfigsRequest,
        AlterConfigsResourceResponse,
        AlterConfigsResponse,
    )
    from mqk.protocol.kafka.messages.describe_configs import (
        DescribeConfigsRequest,
        DescribeConfigsResourceResult,
        DescribeConfigsResponse,
        DescribeConfigsResult,
        DescribeConfigsSynonym,
    )
    from mqk.protocol.kafka.messages.incremental_alter_configs import (
        IncrementalAlterConfigsRequest,
        IncrementalAlterConfigsResponse,
        IncrementalAlterConfigsResponseAlterConfigsResourceResponse,
    )
    from mqk.protocol.kafka.messages.list_config_resources import (
        ListConfigResourcesRequest,
        ListConfigResourcesResponse,
        ListConfigResourcesResponseConfigResource,
    )

TOPIC, BROKER, BROKER_LOGGER, GROUP_RESOURCE = 2, 4, 8, 32
# ConfigSource
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG, GROUP_CONFIG = 1, 4, 5, 8
# ConfigType
BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST = 1, 2, 3, 4, 5, 6, 7
#: the schema's value types as Kafka's ConfigType codes
CONFIG_TYPES = {C.BOOLEAN: BOOLEAN, C.STRING: STRING, C.INT: INT, C.LONG: LONG, C.DOUBLE: DOUBLE, C.LIST: LIST}


def topic_config_entries(
    config: TopicConfig,
    keys: Iterable[str] | None = None,
    synonyms: bool = False,
    message_max_bytes: int | None = None,
) -> list[DescribeConfigsResourceResult]:
    """`message_max_bytes`: the broker's, which a topic without its own max.message.bytes takes (Kafka's rule)."""
    out: list[DescribeConfigsResourceResult] = []
    for setting in topic_config.describe(config, keys):
        key = setting.key
        default = key.default
        value = setting.value
        if key.name == "max.message.bytes" and message_max_bytes is not None:
            default = str(message_max_bytes)
            value = value if setting.overridden else default
        syn: list[DescribeConfigsSynonym] = []
        if synonyms:
            if setting.overridden:
                syn.append({"name": key.name, "value": setting.value, "source": DYNAMIC_TOPIC_CONFIG})
            syn.append({"name": key.name, "value": default, "source": DEFAULT_CONFIG})
        out.append(
            {
                "name": key.name,
                "value": value,
                "read_only": False,
                "config_source": DYNAMIC_TOPIC_CONFIG if setting.overridden else DEFAULT_CONFIG,
                "is_default": not setting.overridden,
                "is_sensitive": False,
                "synonyms": syn,
                "config_type": CONFIG_TYPES[key.type],
                "documentation": None,
            }
        )
    return out


#: what DescribeConfigs tells of each broker setting when asked for documentation (include_documentation)
BROKER_DOCS = {
    "node.id": "This broker's node id, unique in its cluster (mqk serve --node-id).",
    "broker.id": "The node id, under its older name.",
    "listeners": "The Kafka listeners: NAME://HOST:PORT each, the unnamed one named PLAINTEXT.",
    "advertised.listeners": "The addresses clients are told to connect to, per listener name.",
    "message.max.bytes": "The largest record batch a topic without its own max.message.bytes takes.",
    "socket.request.max.bytes": "The largest request a connection may send.",
    "max.connections": "Open Kafka connections over every listener.",
    "max.connections.per.ip": "Open Kafka connections from one address.",
    "connections.max.idle.ms": "A connection silent this long is closed.",
    "auto.create.topics.enable": "Whether a topic a client names is created on first use.",
    "num.partitions": "The partition count of a topic created on first use.",
    "default.replication.factor": "The replication factor of a topic created without one.",
    "offsets.topic.replication.factor": "The replication factor of __consumer_offsets.",
    "offsets.retention.minutes": "Committed offsets of a group without members expire this long after it emptied.",
    "group.initial.rebalance.delay.ms": "How long a new group waits for more members before its first assignment.",
    "group.min.session.timeout.ms": "The shortest session timeout a member may ask for.",
    "group.max.session.timeout.ms": "The longest session timeout a member may ask for.",
    "transaction.max.timeout.ms": "The longest transaction.timeout.ms a transactional producer may ask for.",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "How often transactions open past their "
    "timeout are looked for and aborted.",
    "transactional.id.expiration.ms": "A transactional id idle this long is forgotten.",
    "transaction.state.log.replication.factor": "The replication factor of __transaction_state.",
    "transaction.state.log.min.isr": "The in-sync replicas a __transaction_state write needs.",
    "replica.lag.time.max.ms": "A replica not caught up for this long leaves the in-sync set.",
    "broker.rack": "The rack this broker is in (mqk serve --rack), told to clients in Metadata.",
    "replica.selector.class": "Which replica a consumer naming its rack fetches from (KIP-392); unset: the leader.",
    "unclean.leader.election.enable": "Whether a group with no in-sync member left may elect another.",
    "log.dirs": "Where the broker keeps its data.",
    "mqk.storage": "The default storage engine of new topics (file, memory or rocksdb).",
    "mqk.flush.mode": "When the CommitLog is flushed: async, or sync (before every acknowledgement).",
}


def broker_entries(
    ctx: KafkaContext, keys: Iterable[str] | None = None, synonyms: bool = False, documentation: bool = False
) -> list[DescribeConfigsResourceResult]:
    c = ctx.config
    listeners = c.kafka_listeners
    advertised = {name: (host, port) for name, host, port in c.advertised_listeners}
    if listeners and not listeners[0].name:
        # the unnamed listener is advertised where the broker bound it (port 0 resolved)
        advertised.setdefault("", (ctx.host, ctx.port))
    values = [
        ("node.id", str(c.node_id), INT),
        ("broker.id", str(c.node_id), INT),
        ("listeners", ",".join(f"{lst.name or PLAINTEXT}://{lst.host}:{lst.port}" for lst in listeners), STRING),
        (
            "advertised.listeners",
            ",".join(f"{name or PLAINTEXT}://{host}:{port}" for name, (host, port) in advertised.items()),
            STRING,
        ),
        ("message.max.bytes", str(c.message_max_bytes), INT),
        ("socket.request.max.bytes", str(c.socket_request_max_bytes), INT),
        ("max.connections", str(c.max_connections), INT),
        ("max.connections.per.ip", str(c.max_connections_per_ip), INT),
        ("connections.max.idle.ms", str(c.connections_max_idle_ms), LONG),
        ("auto.create.topics.enable", str(c.auto_create_topics).lower(), BOOLEAN),
        ("num.partitions", str(c.num_partitions), INT),
        ("default.replication.factor", "1", INT),
        ("offsets.topic.replication.factor", "1", INT),
        ("offsets.retention.minutes", str(c.offsets_retention_minutes), INT),
        ("group.initial.rebalance.delay.ms", str(c.group_initial_rebalance_delay_ms), INT),
        ("group.min.session.timeout.ms", str(c.group_min_session_timeout_ms), INT),
        ("group.max.session.timeout.ms", str(c.group_max_session_timeout_ms), INT),
        ("transaction.max.timeout.ms", str(c.transaction_max_timeout_ms), INT),
        (
            "transaction.abort.timed.out.transaction.cleanup.interval.ms",
            str(c.transaction_abort_timed_out_transaction_cleanup_interval_ms),
            INT,
        ),
        ("transactional.id.expiration.ms", str(c.transactional_id_expiration_ms), INT),
        ("transaction.state.log.replication.factor", "1", SHORT),
        ("transaction.state.log.min.isr", "1", INT),
        ("replica.lag.time.max.ms", str(c.replica_lag_time_max_ms), LONG),
        ("broker.rack", c.broker_rack, STRING),
        ("replica.selector.class", c.replica_selector_class, STRING),
        ("unclean.leader.election.enable", str(c.unclean_leader_election_enable).lower(), BOOLEAN),
        ("log.dirs", str(c.store.data_dir), STRING),
        ("mqk.storage", c.store.storage, STRING),
        ("mqk.flush.mode", c.store.flush_mode, STRING),
    ]
    return [
        {
            "name": k,
            "value": v,
            "read_only": True,
            "config_source": STATIC_BROKER_CONFIG,
            "is_default": False,
            "is_sensitive": False,
            "synonyms": [{"name": k, "value": v, "source": STATIC_BROKER_CONFIG}] if synonyms else [],
            "config_type": t,
            "documentation": BROKER_DOCS.get(k) if documentation else None,
        }
        for k, v, t in values
        if keys is None or k in keys
    ]


# --- groups' configs (Kafka's GroupConfig: the share.* keys of mqk.groups.share.GROUP_CONFIGS) -----------------


def group_config_entries(
    ctx: KafkaContext, group_id: str, keys: set[str] | None
) -> list[DescribeConfigsResourceResult]:
    share = ctx.groups.share
    overrides = share.configs.get(group_id, {})
    return [
        {
            "name": key,
            "value": share.setting(group_id, key),
            "read_only": False,
            "config_source": GROUP_CONFIG if key in overrides else DEFAULT_CONFIG,
            "is_default": key not in overrides,
            "is_sensitive": False,
            "synonyms": [],
            "config_type": STRING if key in ("share.auto.offset.reset", "share.isolation.level") else INT,
            "documentation": None,
        }
        for key in GROUP_CONFIGS
        if keys is None or key in keys
    ]


async def _apply_group(
    ctx: KafkaContext,
    group_id: str,
    change: Callable[[dict[str, str]], dict[str, str | None] | str],
    validate_only: bool,
) -> tuple[int, str | None]:
    """Both alter APIs on a GROUP resource: `change` turns the group's overrides into the new ones (None values
    dropped) or says why not."""
    share = ctx.groups.share
    await share.ensure_loaded(ctx.store)
    changed = change(dict(share.configs.get(group_id, {})))
    if isinstance(changed, str):
        return E.InvalidConfigError.code, changed
    overrides = {k: v for k, v in changed.items() if v is not None}
    for key, value in overrides.items():
        check = GROUP_CONFIGS.get(key)
        if check is None:
            return E.InvalidConfigError.code, f"unknown group config {key!r} (known: {sorted(GROUP_CONFIGS)})"
        problem = check(value)
        if problem:
            return E.InvalidConfigError.code, f"{key}: {problem}"
    if validate_only:
        return NONE, None
    if share.config_writer is not None:  # cluster mode: the cluster's, followed by every broker
        try:
            await share.config_writer(group_id, overrides)
        except E.MetaUnavailable as exc:
            return E.RequestTimedOutError.code, f"the cluster cannot take the change now: {exc}"
        return NONE, None
    share.configure(group_id, overrides)
    await share.save([group_id])
    return NONE, None


def _broker_name_ok(ctx: KafkaContext, name: str) -> bool:
    return name in ("", str(ctx.node_id))


def _unauthorized(ctx: KafkaContext, peer: Peer, rtype: int, name: str, operation: str) -> tuple[int, str] | None:
    """The refusal of `operation` (DESCRIBE_CONFIGS, ALTER_CONFIGS) on a config resource, None if allowed."""
    if rtype == TOPIC:
        if not allowed(ctx, peer, operation, "TOPIC", name):
            return E.TopicAuthorizationFailedError.code, f"not authorized to {operation} of topic {name!r}"
    elif rtype == GROUP_RESOURCE:
        if not allowed(ctx, peer, operation, "GROUP", name):
            return E.GroupAuthorizationFailedError.code, f"not authorized to {operation} of group {name!r}"
    elif rtype in (BROKER, BROKER_LOGGER) and not allowed_cluster(ctx, peer, operation):
        return E.ClusterAuthorizationFailedError.code, f"not authorized to {operation} of the broker"
    return None


async def describe_configs(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[DescribeConfigsRequest]
) -> DescribeConfigsResponse:
    b = req.body
    synonyms = b.get("include_synonyms", False)
    results: list[DescribeConfigsResult] = []
    for r in b["resources"]:
        rtype, name, asked = r["resource_type"], r["resource_name"], r["configuration_keys"]
        keys = set(asked) if asked is not None else None
        entry: DescribeConfigsResult = {
            "error_code": NONE,
            "error_message": None,
            "resource_type": rtype,
            "resource_name": name,
            "configs": [],
        }
        refusal = _unauthorized(ctx, peer, rtype, name, "DESCRIBE_CONFIGS")
        if refusal is not None:
            entry["error_code"], entry["error_message"] = refusal
        elif rtype == TOPIC:
            info = ctx.topics.get(name)
            if info is None:
                entry["error_code"] = E.UnknownTopicOrPartitionError.code
                entry["error_message"] = f"unknown topic {name!r}"
            else:
                entry["configs"] = topic_config_entries(info.config, keys, synonyms, ctx.config.message_max_bytes)
        elif rtype == BROKER:
            if _broker_name_ok(ctx, name):
                entry["configs"] = broker_entries(ctx, keys, synonyms, b.get("include_documentation", False))
            else:
                entry["error_code"] = E.InvalidRequestError.code
                entry["error_message"] = f"unknown broker {name!r}"
        elif rtype == BROKER_LOGGER:
            pass  # no adjustable loggers: an empty list
        elif rtype == GROUP_RESOURCE:
            await ctx.groups.share.ensure_loaded(ctx.store)
            entry["configs"] = group_config_entries(ctx, name, keys)
        else:
            entry["error_code"] = E.InvalidRequestError.code
            entry["error_message"] = f"unsupported resource type {rtype}"
        results.append(entry)
    return {"throttle_time_ms": 0, "results": results}


#: an alter API's change set: the topic's current settings -> its new overrides, or the reason they are refused
Build = Callable[[TopicConfig], "dict[str, str | None] | str"]


async def _apply(
    ctx: KafkaContext, peer: Peer, rtype: int, name: str, build: Build, validate_only: bool
) -> tuple[int, str | None]:
    """Common tail of both alter APIs."""
    refusal = _unauthorized(ctx, peer, rtype, name, "ALTER_CONFIGS")
    if refusal is not None:
        return refusal
    if rtype == BROKER:
        if not _broker_name_ok(ctx, name):
            return E.InvalidRequestError.code, f"unknown broker {name!r}"
        return E.InvalidRequestError.code, "broker configs are static in mqk (set them in the TOML file)"
    if rtype == BROKER_LOGGER:
        return E.InvalidRequestError.code, "broker loggers are not adjustable"
    if rtype != TOPIC:
        return E.InvalidRequestError.code, f"unsupported resource type {rtype}"
    info = ctx.topics.get(name)
    if info is None:
        return E.UnknownTopicOrPartitionError.code, f"unknown topic {name!r}"
    internal = ctx.topics.client_change_refusal(name)  # an internal topic's settings are its owner's
    if internal:
        return E.TopicAuthorizationFailedError.code, internal
    new_overrides = build(info.config)
    if isinstance(new_overrides, str):
        return E.InvalidConfigError.code, new_overrides
    if validate_only:
        return NONE, None
    try:
        await ctx.topics.alter_config(name, new_overrides)
    except Exception as exc:  # noqa: BLE001 - the resource's answer carries the code
        return E.kafka_code_for(exc), str(exc)
    return NONE, None


async def alter_configs(ctx: KafkaContext, peer: Peer, req: KafkaRequest[AlterConfigsRequest]) -> AlterConfigsResponse:
    """The legacy API: the given set REPLACES every override of the resource."""
    b = req.body
    responses: list[AlterConfigsResourceResponse] = []
    for r in b["resources"]:
        changes = {c["name"]: c["value"] for c in r["configs"]}

        def build(_old: TopicConfig, changes: dict[str, str | None] = changes) -> dict[str, str | None] | str:
            return topic_config.check_all(changes) or {k: v for k, v in changes.items() if v is not None}

        def replace(_old: dict[str, str], changes: dict[str, str | None] = changes) -> dict[str, str | None] | str:
            return dict(changes)

        rtype, name = r["resource_type"], r["resource_name"]
        if rtype == GROUP_RESOURCE:
            code, message = _unauthorized(ctx, peer, rtype, name, "ALTER_CONFIGS") or await _apply_group(
                ctx, name, replace, b["validate_only"]
            )
        else:
            code, message = await _apply(ctx, peer, rtype, name, build, b["validate_only"])
        responses.append({"error_code": code, "error_message": message, "resource_type": rtype, "resource_name": name})
    return {"throttle_time_ms": 0, "responses": responses}


SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def _group_ops(ops: list[tuple[str, int, str | None]]) -> Callable[[dict[str, str]], dict[str, str | None] | str]:
    """IncrementalAlterConfigs' operations on a group's overrides: SET and DELETE (no group config is a list)."""

    def change(old: dict[str, str]) -> dict[str, str | None] | str:
        merged: dict[str, str | None] = dict(old)
        for key, op, value in ops:
            if op == SET:
                merged[key] = value
            elif op == DELETE:
                merged.pop(key, None)
            else:
                return f"{key} is not a list; only SET and DELETE apply to group configs"
        return merged

    return change


async def incremental_alter_configs(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[IncrementalAlterConfigsRequest]
) -> IncrementalAlterConfigsResponse:
    b = req.body
    responses: list[IncrementalAlterConfigsResponseAlterConfigsResourceResponse] = []
    for r in b["resources"]:
        ops = [(c["name"], c["config_operation"], c["value"]) for c in r["configs"]]

        def build(old: TopicConfig, ops: list[tuple[str, int, str | None]] = ops) -> dict[str, str | None] | str:
            merged: dict[str, str | None] = dict(old.overrides)
            for key, op, value in ops:
                if key in topic_config.LEGACY_KEYS:
                    continue  # (accepted and ignored, as Kafka 4 does)
                if key not in topic_config.TOPIC_SCHEMA:
                    return f"unknown topic config {key!r}"
                if op == SET:
                    merged[key] = value
                elif op == DELETE:
                    merged.pop(key, None)
                elif op in (APPEND, SUBTRACT):
                    if not topic_config.is_list(key):
                        return f"{key} is not a list; APPEND/SUBTRACT do not apply"
                    current = (
                        [p for p in old.get(key).split(",") if p]
                        if key not in merged
                        else [p for p in (merged[key] or "").split(",") if p]
                    )
                    items = topic_config.list_items(value)
                    if op == APPEND:
                        current += [i for i in items if i not in current]
                    else:
                        current = [c for c in current if c not in items]
                    merged[key] = ",".join(current)
                else:
                    return f"unknown config operation {op}"
            return topic_config.check_all(merged) or merged

        rtype, name = r["resource_type"], r["resource_name"]
        if rtype == GROUP_RESOURCE:
            code, message = _unauthorized(ctx, peer, rtype, name, "ALTER_CONFIGS") or await _apply_group(
                ctx, name, _group_ops(ops), b["validate_only"]
            )
        else:
            code, message = await _apply(ctx, peer, rtype, name, build, b["validate_only"])
        responses.append({"error_code": code, "error_message": message, "resource_type": rtype, "resource_name": name})
    return {"throttle_time_ms": 0, "responses": responses}


#: ListConfigResources resource types (KIP-1142), beside TOPIC, BROKER, BROKER_LOGGER and GROUP_RESOURCE above
CLIENT_METRICS = 16
_LISTED_TYPES = (TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP_RESOURCE)


async def list_config_resources(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[ListConfigResourcesRequest]
) -> ListConfigResourcesResponse:
    """ListConfigResources (v1, Kafka 4.1; v0 was ListClientMetricsResources): the resources that have configs, of
    the types asked for (every type when none is named): every topic, every broker, every consumer group; no
    client-metrics subscriptions or broker loggers exist here. Asks DESCRIBE_CONFIGS on the cluster
    (CLUSTER_AUTHORIZATION_FAILED); an unknown type is INVALID_REQUEST."""
    if not allowed_cluster(ctx, peer, "DESCRIBE_CONFIGS"):
        return {"throttle_time_ms": 0, "error_code": E.ClusterAuthorizationFailedError.code, "config_resources": []}
    if req.api_version == 0:  # ListClientMetricsResources: none
        return {"throttle_time_ms": 0, "error_code": NONE, "config_resources": []}
    wanted = set(req.body.get("resource_types") or _LISTED_TYPES)
    if not wanted <= set(_LISTED_TYPES):
        return {"throttle_time_ms": 0, "error_code": E.InvalidRequestError.code, "config_resources": []}
    found: list[ListConfigResourcesResponseConfigResource] = []
    if TOPIC in wanted:
        found += [{"resource_name": name, "resource_type": TOPIC} for name in sorted(ctx.topics.all())]
    if BROKER in wanted:
        nodes = [b.node_id for b in ctx.cluster.brokers()] if ctx.cluster is not None else [ctx.node_id]
        found += [{"resource_name": str(node), "resource_type": BROKER} for node in sorted(nodes)]
    if GROUP_RESOURCE in wanted:
        found += [
            {"resource_name": group, "resource_type": GROUP_RESOURCE}
            for group, _protocol, _state in sorted(ctx.groups.list_groups())
        ]
    return {"throttle_time_ms": 0, "error_code": NONE, "config_resources": found}
