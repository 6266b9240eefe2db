"""Configuration as frozen values, built once from a TOML file and command-line flags and passed down.

No module-level mutable settings. Defaults are documented beside the field they set. `TopicConfig` holds a
topic's explicitly set per-topic settings; `TOPIC_SCHEMA` describes every per-topic key (type, allowed values,
bounds, default, whether mqk acts on it): Kafka's keys plus mqk's `storage.type` (which engine) and `index.keys`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLUSH_ASYNC = "async"
FLUSH_SYNC = "sync"
ENGINES = ("file", "memory", "rocksdb")


def parse_hostport(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def parse_optional_hostport(value: str) -> tuple[str, int] | None:
    """HOST:PORT, or None for `off` (a listener that may be turned off)."""
    return None if value.strip().lower() in ("off", "none", "") else parse_hostport(value)


# --- listeners and TLS (security) -------------------------------------------------------------------------
#
# Kafka's listener model: each listener has a name and a security protocol; `advertised_listeners` says, per name,
# the address clients are told to connect to. The unnamed `kafka_listen` listener is PLAINTEXT.

PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL = "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
#: Kafka's SASL mechanisms mqk serves (sasl.enabled.mechanisms takes a subset)
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
CLIENT_AUTH = ("none", "requested", "required")
_LISTENER_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
#: what `--kafka-listen` / `kafka_listen` takes to turn the unnamed PLAINTEXT listener off
OFF = "off"


def _listener_name(name: str) -> str:
    name = name.strip()
    if not _LISTENER_NAME.match(name):
        raise ValueError(f"listener name {name!r}: letters, digits, '_' and '-' only")
    return name.upper()  # Kafka's listener names are case-insensitive (ListenerName.normalised)


@dataclass(frozen=True)
class ListenerConfig:
    """One named Kafka listener: `NAME=PROTOCOL://HOST:PORT`, or `PROTOCOL://HOST:PORT` (named after its
    protocol, as Kafka's default security protocol map does). An empty host binds every interface, as in Kafka."""

    name: str
    protocol: str
    host: str
    port: int

    @property
    def tls(self) -> bool:
        return self.protocol in (SSL, SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self.protocol in (SASL_PLAINTEXT, SASL_SSL)

    @classmethod
    def parse(cls, spec: str) -> ListenerConfig:
        name, sep, rest = spec.partition("=")
        if not sep:
            name, rest = "", spec
        protocol, sep, address = rest.partition("://")
        protocol = protocol.strip().upper()
        if not sep or protocol not in SECURITY_PROTOCOLS:
            choices = ", ".join(SECURITY_PROTOCOLS)
            raise ValueError(f"listener {spec!r}: expected NAME=PROTOCOL://HOST:PORT with PROTOCOL one of {choices}")
        host, _, port = address.strip().rpartition(":")
        if not port.isdigit() or int(port) > 65535:
            raise ValueError(f"listener {spec!r}: {address!r} is not HOST:PORT")
        return cls(_listener_name(name or protocol), protocol, host.strip("[]") or "0.0.0.0", int(port))

    def __str__(self) -> str:
        return f"{self.name}={self.protocol}://{self.host}:{self.port}"


def parse_advertised_listener(spec: str) -> tuple[str, str, int]:
    """`NAME=HOST:PORT` (or Kafka's `NAME://HOST:PORT`) -> (NAME, host, port)."""
    if "://" in spec:
        name, _, address = spec.partition("://")
    else:
        name, sep, address = spec.partition("=")
        if not sep:
            raise ValueError(f"advertised listener {spec!r}: expected NAME=HOST:PORT")
    host, port = parse_hostport(address.strip())
    return _listener_name(name), host, port


@dataclass(frozen=True)
class TlsConfig:
    """The `[tls]` table: the broker's certificate for every TLS listener (SSL and SASL_SSL Kafka listeners, and
    the RocketMQ listener and name server when `native_tls` / `namesrv_tls` are on). TLS 1.2 and later only."""

    #: PEM certificate chain and private key (Kafka's ssl.keystore)
    cert_file: Path | None = None
    key_file: Path | None = None
    #: the private key's passphrase, if it is encrypted
    key_password: str | None = None
    #: PEM CA bundle that client certificates are checked against (Kafka's ssl.truststore)
    ca_file: Path | None = None
    #: Kafka's ssl.client.auth for SSL listeners: `none`, `requested` (a certificate is asked for and checked if
    #: sent) or `required`. SASL_SSL listeners never ask (Kafka's rule since KIP-684)
    client_auth: str = "none"
    #: a TLS handshake not finished after this long is dropped (it holds a connection and its buffers)
    handshake_timeout_ms: int = 10_000
    #: Kafka's ssl.principal.mapping.rules, one rule per item (`RULE:pattern/replacement/[LU]` or `DEFAULT`), over
    #: the client certificate's subject in RFC 2253 form; the first that matches names the principal `User:NAME`.
    #: mqk's default takes the subject's CN, and the whole subject (Kafka's DEFAULT) when it has none
    principal_mapping_rules: tuple[str, ...] = (r"RULE:^CN=((\\,|[^,])*)(,.*)?$/$1/", "DEFAULT")

    def __post_init__(self) -> None:
        if self.client_auth not in CLIENT_AUTH:
            raise ValueError(f"tls client_auth must be one of {CLIENT_AUTH}, not {self.client_auth!r}")
        if self.handshake_timeout_ms <= 0:
            raise ValueError("tls handshake_timeout_ms must be positive")
        for rule in self.principal_mapping_rules:
            if rule.strip() != "DEFAULT" and not rule.strip().startswith("RULE:"):
                raise ValueError(f"tls principal mapping rule {rule!r}: expected DEFAULT or RULE:pattern/replacement/")

    @property
    def configured(self) -> bool:
        return self.cert_file is not None


@dataclass(frozen=True)
class StoreConfig:
    data_dir: Path = Path("mqk-data")
    #: default engine for topics that do not name one (`storage.type`)
    storage: str = "file"
    #: CommitLog segment size; RocketMQ uses 1 GiB. Files are sparse until written.
    commitlog_segment_bytes: int = 1 << 30
    #: ConsumeQueue units per mapped file (RocketMQ: 300,000 units)
    cq_units_per_file: int = 300_000
    #: `async`: flush every `flush_interval_ms` or once `flush_min_pages` 4 KiB pages are dirty;
    #: `sync`: an append completes only after fsync (group commit)
    flush_mode: str = FLUSH_ASYNC
    flush_interval_ms: int = 500
    flush_min_pages: int = 4
    #: the CommitLog's most recent bytes whose page cache is kept once flushed; the flusher drops older pages
    #: (mqk.store.file.flush), so writes reuse pages instead of growing the cache into fresh memory, and readers
    #: further behind read from the file; 0 = keep every page, as Kafka leaves it to the kernel
    commitlog_cache_bytes: int = 256 << 20
    #: how often the checkpoint file is rewritten (and ConsumeQueues are flushed, see the next two)
    checkpoint_interval_ms: int = 1000
    #: a checkpoint flushes a ConsumeQueue holding at least this many unflushed 4 KiB pages (RocketMQ's
    #: flushConsumeQueueLeastPages) or whose oldest unflushed unit is `cq_flush_max_delay_ms` old; the others
    #: wait, and the checkpoint's safe offset stays at their oldest unflushed unit (recovery re-dispatches it)
    cq_flush_least_pages: int = 2
    cq_flush_max_delay_ms: int = 10_000
    #: above this share of the disk in use, appends are refused
    disk_max_used_ratio: float = 0.90
    #: how often the disk guard (mqk.services.diskguard) measures the data dir's filesystem
    disk_check_interval_ms: int = 1000
    #: RocketMQ's fileReservedTime: a CommitLog segment older than this (by its last write) is deleted even if a
    #: shard's retention would keep it (the shards pointing into it move their log start past it); -1 = never
    file_reserved_time_ms: int = 72 * 3600 * 1000

    def __post_init__(self) -> None:
        if self.storage not in ENGINES:
            raise ValueError(f"storage must be one of {ENGINES}, not {self.storage!r}")
        if self.flush_mode not in (FLUSH_ASYNC, FLUSH_SYNC):
            raise ValueError(f"flush_mode must be 'async' or 'sync', not {self.flush_mode!r}")
        if self.commitlog_segment_bytes < 4096:
            raise ValueError("commitlog_segment_bytes must be at least 4096")
        if self.commitlog_cache_bytes < 0:
            raise ValueError("commitlog_cache_bytes must not be negative (0 keeps every page)")
        if self.cq_flush_least_pages < 0 or self.cq_flush_max_delay_ms < 0:
            raise ValueError("cq_flush_least_pages and cq_flush_max_delay_ms must not be negative")


# --- per-topic settings: the one schema -------------------------------------------------------------------
#
# Every per-topic key mqk knows, with its type, the values it takes and its default, in the order DescribeConfigs
# lists them. The schema lives here, beside `TopicConfig`, because the store and the services below the broker
# read settings through `TopicConfig.get` and need the defaults; the broker layer (mqk.broker.topic_config)
# applies it to every creation and alteration, and each protocol's view (Kafka's DescribeConfigs, RocketMQ's
# topic config table) is drawn from it.

#: value types, named as Kafka's ConfigDef names them
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = "boolean", "string", "int", "long", "double", "list"
_INT_MAX = (1 << 31) - 1
_LONG_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class TopicConfigKey:
    """One per-topic setting. `choices` are the allowed values of a STRING (or the allowed items of a LIST);
    `minimum`/`maximum` bound an INT, LONG or DOUBLE (inclusive); `acted_on` is False for a key mqk accepts and
    shows (so Kafka tools that set it keep working) but does not act on: one replica, no preallocation, flushing
    set broker-wide (`StoreConfig.flush_mode`), a log layout of its own. `refusal_note` is added to the message
    refusing a value outside `choices`."""

    name: str
    type: str
    default: str
    choices: tuple[str, ...] | None = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    acted_on: bool = True
    refusal_note: str = ""

    def check(self, value: str) -> str | None:
        """Why `value` is not acceptable for this key, or None if it is."""
        key, kind = self.name, self.type
        try:
            if kind in (INT, LONG):
                number: int | float = int(value)
                if not self._in_range(number):
                    return f"{key}={value} is out of range"
            elif kind == DOUBLE:
                number = float(value)
                if not self._in_range(number):  # NaN is in no range
                    return f"{key}={value} is out of range"
            elif kind == BOOLEAN:
                if value.lower() not in ("true", "false"):
                    return f"{key} must be true or false"
            elif kind == LIST:
                items = [p.strip() for p in value.split(",") if p.strip()]
                # a list of choices (cleanup.policy) names at least one; a free list (the throttled replicas)
                # may be empty
                if self.choices is not None and (not items or any(p not in self.choices for p in items)):
                    return f"{key} must be a list of {' and '.join(self.choices or ())}"
                return None
        except ValueError:
            return f"{key}={value!r} is not a number"
        if self.choices is not None and value not in self.choices:
            return f"{key} must be one of {sorted(self.choices)}{self.refusal_note}"
        return None

    def _in_range(self, number: int | float) -> bool:
        low = self.minimum if self.minimum is not None else -float("inf")
        high = self.maximum if self.maximum is not None else float("inf")
        return low <= number <= high


def _key(name: str, kind: str, default: str, **kw: Any) -> TopicConfigKey:
    if kind in (INT, LONG) and "minimum" not in kw:
        kw["minimum"] = 0
    if kind == INT:
        kw.setdefault("maximum", _INT_MAX)
    elif kind == LONG:
        kw.setdefault("maximum", _LONG_MAX)
    return TopicConfigKey(name, kind, default, **kw)


_NEVER = str(_LONG_MAX)  # Kafka's "no limit" default (Long.MAX_VALUE)

#: the per-topic keys: Kafka's (with Kafka's defaults) and mqk's own `storage.type` (which engine; fixed at creation)
#: and `index.keys` (keep the key index of the file engine for this topic)
TOPIC_SCHEMA: dict[str, TopicConfigKey] = {
    k.name: k
    for k in (
        _key("cleanup.policy", LIST, "delete", choices=("delete", "compact")),
        _key(
            "compression.type",
            STRING,
            "producer",
            choices=("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
        ),
        _key("delete.retention.ms", LONG, "86400000"),
        _key("file.delete.delay.ms", LONG, "60000", acted_on=False),
        _key("flush.messages", LONG, _NEVER, acted_on=False),
        _key("flush.ms", LONG, _NEVER, acted_on=False),
        _key("index.interval.bytes", INT, "4096", acted_on=False),
        _key("max.compaction.lag.ms", LONG, _NEVER),
        _key("max.message.bytes", INT, "1048588"),
        _key("message.timestamp.type", STRING, "CreateTime", choices=("CreateTime", "LogAppendTime")),
        _key("message.timestamp.after.max.ms", LONG, "3600000"),  # Kafka 4.0 (KIP-1030): one hour
        _key("message.timestamp.before.max.ms", LONG, _NEVER),
        _key("min.cleanable.dirty.ratio", DOUBLE, "0.5", minimum=0.0, maximum=1.0),
        _key("min.compaction.lag.ms", LONG, "0"),
        _key("min.insync.replicas", INT, "1", minimum=1, acted_on=False),
        _key("preallocate", BOOLEAN, "false", acted_on=False),
        _key("retention.bytes", LONG, "-1", minimum=-1),
        _key("retention.ms", LONG, "604800000", minimum=-1),
        _key("segment.bytes", INT, "1073741824", minimum=14),
        _key("segment.ms", LONG, "604800000", minimum=1),
        _key("unclean.leader.election.enable", BOOLEAN, "false", acted_on=False),
        # Kafka 4.x keys mqk accepts, stores and reports without acting on them: codec levels (batches keep the
        # level their producer chose), replication throttles, tiered storage (none here), index geometry
        _key("compression.gzip.level", INT, "-1", minimum=-1, maximum=9, acted_on=False),
        _key("compression.lz4.level", INT, "9", minimum=1, maximum=17, acted_on=False),
        _key("compression.zstd.level", INT, "3", minimum=-131072, maximum=22, acted_on=False),
        _key("follower.replication.throttled.replicas", LIST, "", acted_on=False),
        _key("leader.replication.throttled.replicas", LIST, "", acted_on=False),
        _key("local.retention.bytes", LONG, "-2", minimum=-2, acted_on=False),
        _key("local.retention.ms", LONG, "-2", minimum=-2, acted_on=False),
        _key("message.downconversion.enable", BOOLEAN, "true", acted_on=False),
        _key("remote.storage.enable", BOOLEAN, "false", acted_on=False),
        _key("remote.log.copy.disable", BOOLEAN, "false", acted_on=False),
        _key("remote.log.delete.on.disable", BOOLEAN, "false", acted_on=False),
        _key("segment.index.bytes", INT, "10485760", minimum=4, acted_on=False),
        _key("segment.jitter.ms", LONG, "0", acted_on=False),
        # mqk's own
        _key("storage.type", STRING, "", choices=(*ENGINES, "")),
        _key("index.keys", BOOLEAN, "false"),
    )
}

#: each key's default (the values DescribeConfigs reports as DEFAULT_CONFIG)
TOPIC_DEFAULTS: dict[str, str] = {name: key.default for name, key in TOPIC_SCHEMA.items()}


@dataclass(frozen=True)
class TopicConfig:
    """Per-topic settings; `overrides` holds only what was set explicitly (Kafka's TOPIC_CONFIG source)."""

    overrides: Mapping[str, str] = field(default_factory=dict)

    def get(self, key: str) -> str:
        return self.overrides.get(key, TOPIC_DEFAULTS.get(key, ""))

    def get_int(self, key: str) -> int:
        return int(self.get(key))

    @property
    def storage_type(self) -> str:
        return self.overrides.get("storage.type", "")

    @property
    def log_append_time(self) -> bool:
        return self.get("message.timestamp.type") == "LogAppendTime"

    @property
    def compacted(self) -> bool:
        return "compact" in self.get("cleanup.policy")

    def with_overrides(self, changes: Mapping[str, str | None]) -> TopicConfig:
        merged = dict(self.overrides)
        for key, value in changes.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return TopicConfig(merged)

    def to_dict(self) -> dict[str, str]:
        return dict(self.overrides)


#: Kafka's rack-aware replica selector (KIP-392), by its Java class name (the short name is accepted too)
RACK_AWARE_REPLICA_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
#: RocketMQ's brokerRole values a master takes (its replicas are SLAVE by nature)
SYNC_MASTER, ASYNC_MASTER = "SYNC_MASTER", "ASYNC_MASTER"


@dataclass(frozen=True)
class BrokerConfig:
    #: the unnamed PLAINTEXT Kafka listener; None (`off` in the TOML file and on the command line) when only the
    #: named `listeners` serve Kafka
    kafka_listen: tuple[str, int] | None = ("127.0.0.1", 9092)
    native_listen: tuple[str, int] = ("127.0.0.1", 10911)
    namesrv_listen: tuple[str, int] = ("127.0.0.1", 9876)
    node_id: int = 0
    cluster_id: str = "mqk-cluster"
    broker_name: str = "mqk-broker-a"
    auto_create_topics: bool = True
    num_partitions: int = 1
    #: Kafka `socket.request.max.bytes`: larger frames close the connection before allocation
    socket_request_max_bytes: int = 100 * 1024 * 1024
    #: Kafka `message.max.bytes`: the broker-wide ceiling for one record batch (a topic's `max.message.bytes`
    #: overrides it for that topic; Produce answers MESSAGE_TOO_LARGE above it)
    message_max_bytes: int = 1048588
    #: RocketMQ's `maxMessageSize` (its default, 4 MiB): the ceiling for one RocketMQ message body as stored
    #: (MESSAGE_ILLEGAL above it)
    native_max_message_size: int = 4 * 1024 * 1024
    #: Kafka `max.connections`: open connections on all Kafka listeners together; more are closed at accept
    max_connections: int = (1 << 31) - 1
    #: Kafka `max.connections.per.ip`: open Kafka connections from one address; more are closed at accept
    max_connections_per_ip: int = (1 << 31) - 1
    #: Kafka `connections.max.idle.ms`: a Kafka connection silent this long (no request in progress) is closed
    connections_max_idle_ms: int = 600_000
    #: RocketMQ remoting frame ceiling
    native_max_frame_bytes: int = 16 * 1024 * 1024
    group_initial_rebalance_delay_ms: int = 0
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1800000
    #: KIP-848 consumer groups (Kafka's group.consumer.*): a member's session without a heartbeat, the interval
    #: members are told to heartbeat at, and the assignors offered (the first is the default)
    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    group_consumer_assignors: tuple[str, ...] = ("uniform", "range")
    #: share groups (KIP-932, Kafka's group.share.*): sessions and heartbeats as above; how long a delivered record
    #: stays acquired, how often one is delivered before it is archived, how many records of a partition may be in
    #: flight, and where a group starts on a partition it has not read yet (Kafka's share.auto.offset.reset)
    group_share_session_timeout_ms: int = 45_000
    group_share_heartbeat_interval_ms: int = 5_000
    group_share_record_lock_duration_ms: int = 30_000
    group_share_delivery_count_limit: int = 5
    group_share_partition_max_record_locks: int = 2000
    group_share_auto_offset_reset: str = "latest"
    #: longest delay a timer message may ask for (RocketMQ timerMaxDelaySec), default 3 days
    timer_max_delay_ms: int = 3 * 24 * 3600 * 1000
    #: Kafka `log.retention.check.interval.ms`: how often retention (and file reclaim) runs
    log_retention_check_interval_ms: int = 300_000
    #: Kafka `log.cleaner.backoff.ms`: how long the compactor sleeps when no compacted log is dirty enough
    log_cleaner_backoff_ms: int = 15_000
    #: Kafka `log.cleaner.dedupe.buffer.size`: memory cap of the compactor's key -> offset map
    log_cleaner_dedupe_buffer_size: int = 128 * 1024 * 1024
    #: cluster mode: the meta service, `etcd://HOST:PORT[,HOST:PORT...]` (None: a single broker on its own)
    cluster: str | None = None
    #: cluster mode: this broker's group (the unit a partition is placed on); default `group-<node_id>`
    broker_group: str | None = None
    #: Kafka `broker.rack`: the rack (or zone) this broker is in, told to clients in Metadata; consumers that name
    #: theirs (`client.rack`) read from a broker of their own rack when `replica_selector_class` is set
    broker_rack: str | None = None
    #: Kafka `replica.selector.class` (KIP-392): None, the leader serves every fetch; RackAwareReplicaSelector
    #: (`org.apache.kafka.common.replica.RackAwareReplicaSelector`), a consumer whose rack holds an in-sync replica
    #: of the partition, and not the leader, is told to fetch from that replica
    replica_selector_class: str | None = None
    #: what clients and peers are told to connect to: a host for every listener (`HOST`), or per listener
    #: (`kafka=HOST:PORT`, `native=...`, `namesrv=...`); default: the bound addresses
    advertise: tuple[str, ...] = ()
    #: cluster mode: how long a broker that stops answering keeps its registration, mastership and controller
    #: role (its etcd lease TTL, Kafka's broker.session.timeout.ms)
    cluster_session_timeout_ms: int = 6000
    #: Kafka `offsets.topic.num.partitions`: partitions of __consumer_offsets, which place group coordinators
    offsets_topic_num_partitions: int = 50
    #: cluster mode: where replicas of this broker's group pull its CommitLog from while it is their master
    #: (RocketMQ's HA port, the broker listener's port + 1 by default there)
    replication_listen: tuple[str, int] = ("127.0.0.1", 10912)
    #: Kafka `offsets.commit.timeout.ms`: how long an offset commit waits for the in-sync replicas
    offsets_commit_timeout_ms: int = 5000
    #: Kafka `offsets.retention.minutes` (default 7 days): the committed offsets of a group with no members expire
    #: this long after it became empty (a group that never had members: after each offset's commit); offsets of an
    #: active group never do (mqk.groups.coordinator, `expire_offsets`)
    offsets_retention_minutes: int = 7 * 24 * 60
    #: Kafka `offsets.retention.check.interval.ms`: how often expired offsets are looked for
    offsets_retention_check_interval_ms: int = 600_000
    #: Kafka `transaction.max.timeout.ms`: the longest `transaction.timeout.ms` a transactional producer may ask for
    #: (above it InitProducerId answers INVALID_TRANSACTION_TIMEOUT)
    transaction_max_timeout_ms: int = 900_000
    #: Kafka `transaction.abort.timed.out.transaction.cleanup.interval.ms`: how often transactions open past their
    #: timeout are looked for (and aborted)
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    #: Kafka `transactional.id.expiration.ms`: a transactional id idle this long (nothing under way) is forgotten
    transactional_id_expiration_ms: int = 604_800_000
    #: Kafka `replica.lag.time.max.ms`: an in-sync replica not caught up for this long leaves the in-sync set
    replica_lag_time_max_ms: int = 30_000
    #: RocketMQ's brokerRole for a replicated group's master: SYNC_MASTER answers a send once the in-sync replicas
    #: hold it (FLUSH_SLAVE_TIMEOUT after `native_sync_replica_timeout_ms`, SLAVE_NOT_AVAILABLE below
    #: min.insync.replicas); ASYNC_MASTER answers once it is stored here
    native_broker_role: str = SYNC_MASTER
    native_sync_replica_timeout_ms: int = 5000
    #: RocketMQ's transactionTimeOut and transactionCheckInterval: a half message open this long is checked with
    #: its producer, by a scan this often
    native_transaction_timeout_ms: int = 6_000
    native_transaction_check_interval_ms: int = 5_000
    #: RocketMQ's slaveReadEnable: a pull that leaves its consumer far behind the CommitLog's end suggests that the
    #: consumer pull from its group's replica (brokerId 1) until it has caught up, as a RocketMQ master does, so
    #: a consumer reading old messages does not compete with the producers for the master's page cache and disk
    native_slave_read_enable: bool = False
    #: RocketMQ's accessMessageInMemoryMaxRatio: "far behind" is more than this percentage of the machine's memory
    #: between the CommitLog's end and the last message the pull served
    native_access_message_in_memory_max_ratio: int = 40
    #: Kafka `unclean.leader.election.enable`, for the broker groups (the unit of election here): a group whose
    #: in-sync replicas are all gone may elect another member, losing what only they held
    unclean_leader_election_enable: bool = False
    #: the admin HTTP listener (mqk.server.admin: /metrics, /health/live, /health/ready); None: off
    admin_listen: tuple[str, int] | None = ("127.0.0.1", 9644)
    #: the RocketMQ 5 gRPC listener (MessagingService, mqk.server.rocketmq5: the official RocketMQ 5 SDKs); None:
    #: off. `mqk serve` turns it on at 127.0.0.1:8081 (RocketMQ's proxy port) where the `grpc` extra is installed
    #: and nothing says otherwise (`BrokerConfig.load`'s grpc_default); a config built in code has it off
    grpc_listen: tuple[str, int] | None = None
    #: TLS on the gRPC listener (with the `[tls]` certificate; the RocketMQ 5 SDKs' `tls_enable`)
    grpc_tls: bool = False
    #: count traffic and requests on the hot paths for /metrics (plain ints, turned into metric families only
    #: when scraped); False leaves out those counters (offsets, lag, store and service figures are still served)
    metrics: bool = True
    #: the admin listener's web console may change things (create a topic, reset an empty group's offsets); off,
    #: it only reads
    admin_console_writes: bool = False
    #: named Kafka listeners (Kafka's `listeners`), bound beside `kafka_listen`
    listeners: tuple[ListenerConfig, ...] = ()
    #: Kafka's `advertised.listeners`: (NAME, host, port) per named listener that is not to be advertised at its bound
    #: address (a listener bound to every interface is advertised at the address each client reached)
    advertised_listeners: tuple[tuple[str, str, int], ...] = ()
    #: Kafka's sasl.enabled.mechanisms: what SASL listeners offer
    sasl_enabled_mechanisms: tuple[str, ...] = SASL_MECHANISMS
    #: Kafka's connection.failed.authentication.delay.ms: a failed authentication is answered (and its connection
    #: closed) after this delay, doubled for each further failure from the same address up to the maximum below
    auth_failure_delay_ms: int = 100
    auth_failure_delay_max_ms: int = 5000
    #: Kafka's sasl.server.max.receive.size: the largest request a connection may send before it authenticates
    sasl_max_receive_bytes: int = 524288
    #: Kafka's authorizer.class.name: on, every API is authorized against the ACLs (mqk.broker.security.acls); off,
    #: every client may do everything
    authorizer: bool = False
    #: Kafka's super.users: principals (`User:NAME`) every operation is allowed to, whatever the ACLs say
    super_users: tuple[str, ...] = ()
    #: Kafka's allow.everyone.if.no.acl.found: a resource no ACL names is open to everyone (off: to nobody)
    allow_everyone_if_no_acl_found: bool = False
    #: TLS on the RocketMQ remoting listener and on the name server (with the `[tls]` certificate)
    native_tls: bool = False
    namesrv_tls: bool = False
    tls: TlsConfig = field(default_factory=TlsConfig)
    store: StoreConfig = field(default_factory=StoreConfig)

    def __post_init__(self) -> None:
        names = [listener.name for listener in self.listeners]
        if len(set(names)) != len(names):
            raise ValueError(f"listener names must be unique: {names}")
        if self.kafka_listen is None and not self.listeners:
            raise ValueError("no Kafka listener: kafka_listen is off and no listeners are configured")
        if self.native_broker_role not in (SYNC_MASTER, ASYNC_MASTER):
            role = self.native_broker_role
            raise ValueError(f"native_broker_role must be {SYNC_MASTER} or {ASYNC_MASTER}, not {role!r}")
        bound = [(lc.host, lc.port) for lc in self.listeners if lc.port]
        if self.kafka_listen is not None and self.kafka_listen[1] and self.kafka_listen in bound:
            raise ValueError(f"a listener binds kafka_listen's address {self.kafka_listen}: set kafka_listen = 'off'")
        unknown = {name for name, _h, _p in self.advertised_listeners} - set(names)
        if unknown:
            raise ValueError(f"advertised listeners name no configured listener: {sorted(unknown)}")
        wants_tls = any(lc.tls for lc in self.listeners) or self.native_tls or self.namesrv_tls or self.grpc_tls
        if wants_tls and (self.tls.cert_file is None or self.tls.key_file is None):
            raise ValueError("TLS listeners need the [tls] table's cert_file and key_file")
        if self.tls.client_auth != "none" and self.tls.ca_file is None:
            raise ValueError("tls client_auth needs ca_file (the CA that signs client certificates)")
        if self.group_share_auto_offset_reset not in ("latest", "earliest"):
            raise ValueError("group_share_auto_offset_reset must be latest or earliest")
        if not self.group_consumer_assignors or set(self.group_consumer_assignors) - {"uniform", "range"}:
            raise ValueError("group_consumer_assignors must be a non-empty list of uniform and range")
        bad = set(self.sasl_enabled_mechanisms) - set(SASL_MECHANISMS)
        if bad or not self.sasl_enabled_mechanisms:
            raise ValueError(f"sasl_enabled_mechanisms must be a non-empty subset of {SASL_MECHANISMS}")
        if self.message_max_bytes < 0:
            raise ValueError("message_max_bytes must not be negative")
        if self.native_transaction_timeout_ms < 0 or self.native_transaction_check_interval_ms <= 0:
            raise ValueError("native_transaction_timeout_ms must not be negative, the check interval positive")
        if self.native_max_message_size < 0:
            raise ValueError("native_max_message_size must not be negative")
        if self.replica_selector_class is not None and not self.rack_aware_fetching:
            raise ValueError(
                f"replica_selector_class {self.replica_selector_class!r} is not known: "
                f"{RACK_AWARE_REPLICA_SELECTOR} is the one selector mqk has"
            )
        if not 0 <= self.native_access_message_in_memory_max_ratio <= 100:
            raise ValueError("native_access_message_in_memory_max_ratio is a percentage: 0 to 100")
        if self.max_connections < 1 or self.max_connections_per_ip < 1:
            raise ValueError("max_connections and max_connections_per_ip must be at least 1")
        if self.connections_max_idle_ms <= 0:
            raise ValueError("connections_max_idle_ms must be positive")
        if self.auth_failure_delay_ms < 0 or self.auth_failure_delay_max_ms < self.auth_failure_delay_ms:
            raise ValueError("auth_failure_delay_ms must be >= 0 and at most auth_failure_delay_max_ms")
        bad_users = [u for u in self.super_users if ":" not in u or u.startswith(":") or u.endswith(":")]
        if bad_users:
            raise ValueError(f"super_users are principals TYPE:NAME (User:admin), not {bad_users}")
        if self.offsets_retention_minutes < 1 or self.offsets_retention_check_interval_ms < 1:
            raise ValueError("offsets_retention_minutes and offsets_retention_check_interval_ms must be positive")
        if (
            min(
                self.transaction_max_timeout_ms,
                self.transaction_abort_timed_out_transaction_cleanup_interval_ms,
                self.transactional_id_expiration_ms,
            )
            < 1
        ):
            raise ValueError(
                "transaction_max_timeout_ms, transaction_abort_timed_out_transaction_cleanup_interval_ms and"
                " transactional_id_expiration_ms must be positive"
            )

    @property
    def kafka_listeners(self) -> tuple[ListenerConfig, ...]:
        """Every Kafka listener: the unnamed PLAINTEXT one (name "") first when it is on, then the named ones."""
        own = () if self.kafka_listen is None else (ListenerConfig("", PLAINTEXT, *self.kafka_listen),)
        return own + self.listeners

    @property
    def group_name(self) -> str:
        """This broker's group (in RocketMQ terms its broker name)."""
        return self.broker_group or (f"group-{self.node_id}" if self.cluster else self.broker_name)

    @property
    def rack_aware_fetching(self) -> bool:
        """Whether Fetch sends consumers to a replica in their rack (`replica_selector_class`, KIP-392)."""
        selector = self.replica_selector_class
        return selector is not None and selector.rsplit(".", 1)[-1] == RACK_AWARE_REPLICA_SELECTOR.rsplit(".", 1)[-1]

    @classmethod
    def load(
        cls, path: str | Path | None = None, *, grpc_default: tuple[str, int] | None = None, **flags: Any
    ) -> BrokerConfig:
        """Build from an optional TOML file, then flags (non-None values win). `grpc_default`: the RocketMQ 5 gRPC
        listener when neither the file nor a flag names one (`mqk serve`'s, when the grpc extra is installed); never
        in cluster mode, which does not offer it yet."""
        values: dict[str, Any] = {}
        store_values: dict[str, Any] = {}
        tls_values: dict[str, Any] = {}
        if path is not None:
            import tomllib  # imported only with a --config file, to keep start-up cheap

            with open(path, "rb") as f:
                doc = tomllib.load(f)
            store_values.update(doc.pop("store", {}))
            tls_values.update(doc.pop("tls", {}))
            values.update(doc)
        tls_fields = {f"tls_{f.name}": f.name for f in dataclasses.fields(TlsConfig)}
        for key, value in flags.items():
            if value is None:
                continue
            if key in {f.name for f in dataclasses.fields(StoreConfig)}:
                store_values[key] = value
            elif key in tls_fields:
                tls_values[tls_fields[key]] = value
            else:
                values[key] = value
        if grpc_default is not None and "grpc_listen" not in values and not values.get("cluster"):
            values["grpc_listen"] = grpc_default
        if isinstance(values.get("kafka_listen"), str) and values["kafka_listen"].strip().lower() == OFF:
            values["kafka_listen"] = None
        for key in ("kafka_listen", "native_listen", "namesrv_listen", "replication_listen"):
            if isinstance(values.get(key), str):
                values[key] = parse_hostport(values[key])
        for key in ("admin_listen", "grpc_listen"):
            if isinstance(values.get(key), str):
                values[key] = parse_optional_hostport(values[key])
        if "listeners" in values:
            values["listeners"] = tuple(
                item if isinstance(item, ListenerConfig) else ListenerConfig.parse(item)
                for item in _items(values["listeners"])
            )
        if "advertised_listeners" in values:
            values["advertised_listeners"] = tuple(
                parse_advertised_listener(item) if isinstance(item, str) else tuple(item)
                for item in _items(values["advertised_listeners"])
            )
        if "sasl_enabled_mechanisms" in values:
            values["sasl_enabled_mechanisms"] = tuple(
                m.strip().upper() for m in _items(values["sasl_enabled_mechanisms"]) if m.strip()
            )
        if "super_users" in values:
            # Kafka separates super.users with ';' (a principal may contain ','); a TOML list is taken as it is
            raw = values["super_users"]
            items = raw.split(";") if isinstance(raw, str) else _items(raw)
            values["super_users"] = tuple(u.strip() for u in items if u.strip())
        for key in ("cert_file", "key_file", "ca_file"):
            if tls_values.get(key) is not None:
                tls_values[key] = Path(tls_values[key])
        if "principal_mapping_rules" in tls_values:
            tls_values["principal_mapping_rules"] = tuple(_items(tls_values["principal_mapping_rules"]))
        if isinstance(values.get("advertise"), (str, list)):
            advertise = values["advertise"]
            values["advertise"] = (advertise,) if isinstance(advertise, str) else tuple(advertise)
        if "data_dir" in store_values:
            store_values["data_dir"] = Path(store_values["data_dir"])
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown configuration keys: {sorted(unknown)}")
        return cls(store=StoreConfig(**store_values), tls=TlsConfig(**tls_values), **values)


def _items(value: Any) -> list[Any]:
    """A TOML list, or one comma-separated string (Kafka's property style), as a list."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return list(value)
