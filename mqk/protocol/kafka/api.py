"""Kafka API keys and the version ranges this broker advertises in ApiVersions.

Ranges: from the oldest version present in Kafka's spec files (Kafka 4 dropped some old versions; the generated
codecs cover exactly what the specs hold, so nothing older can be decoded) up to what an Apache Kafka 4.1 broker
advertises, never beyond the spec files and never an unstable version (InitProducerId v6 is marked
`latestVersionUnstable`; Fetch v18 and ListOffsets v11 came after 4.1). Clients negotiate down to the highest
version both sides support, so a narrower upper bound only costs newer features, never compatibility.

Topic ids: Fetch v13+, Produce v13 and OffsetCommit / OffsetFetch v10 carry topic ids instead of names (the
handlers resolve them). `supported(topic_ids=False)` caps them at their last name-based versions, for a server
without any topic-id support.
"""

from __future__ import annotations

from typing import Any

from mqk.protocol.kafka import messages
from mqk.protocol.kafka.newer import NEWER


class ApiKey:
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    ALTER_REPLICA_LOG_DIRS = 34
    DESCRIBE_LOG_DIRS = 35
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_CLUSTER = 60
    OFFSET_FOR_LEADER_EPOCH = 23
    SASL_AUTHENTICATE = 36
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    ELECT_LEADERS = 43
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    DESCRIBE_PRODUCERS = 61
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    DESCRIBE_TOPIC_PARTITIONS = 75
    LIST_CONFIG_RESOURCES = 74
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    SHARE_GROUP_HEARTBEAT = 76
    SHARE_GROUP_DESCRIBE = 77
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79
    DESCRIBE_SHARE_GROUP_OFFSETS = 90
    ALTER_SHARE_GROUP_OFFSETS = 91
    DELETE_SHARE_GROUP_OFFSETS = 92


# Upper bounds an Apache Kafka 4.1 broker advertises (stable versions only).
_KAFKA_41_MAX = {
    ApiKey.PRODUCE: 13,
    ApiKey.FETCH: 17,
    ApiKey.LIST_OFFSETS: 10,
    ApiKey.METADATA: 13,
    ApiKey.OFFSET_COMMIT: 10,
    ApiKey.OFFSET_FETCH: 10,
    ApiKey.FIND_COORDINATOR: 6,
    ApiKey.JOIN_GROUP: 9,
    ApiKey.HEARTBEAT: 4,
    ApiKey.LEAVE_GROUP: 5,
    ApiKey.SYNC_GROUP: 5,
    ApiKey.DESCRIBE_GROUPS: 6,
    ApiKey.LIST_GROUPS: 5,
    ApiKey.SASL_HANDSHAKE: 1,
    ApiKey.API_VERSIONS: 4,
    ApiKey.CREATE_TOPICS: 7,
    ApiKey.DELETE_TOPICS: 6,
    ApiKey.DELETE_RECORDS: 2,
    ApiKey.INIT_PRODUCER_ID: 5,
    ApiKey.DESCRIBE_ACLS: 3,
    ApiKey.CREATE_ACLS: 3,
    ApiKey.DELETE_ACLS: 3,
    ApiKey.DESCRIBE_CONFIGS: 4,
    ApiKey.ALTER_CONFIGS: 2,
    ApiKey.ALTER_REPLICA_LOG_DIRS: 2,
    # v5 adds the log directory's cordoned flag (KIP-1066), after 4.1
    ApiKey.DESCRIBE_LOG_DIRS: 4,
    ApiKey.CREATE_PARTITIONS: 3,
    ApiKey.DELETE_GROUPS: 2,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: 1,
    ApiKey.OFFSET_DELETE: 0,
    ApiKey.DESCRIBE_CLIENT_QUOTAS: 1,
    ApiKey.ALTER_CLIENT_QUOTAS: 1,
    ApiKey.DESCRIBE_CLUSTER: 2,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: 4,
    ApiKey.SASL_AUTHENTICATE: 2,
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: 0,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: 0,
    ApiKey.ELECT_LEADERS: 2,
    # not v1 (allow_replication_factor_change, KIP-860): no reassignment changes a partition's replicas here
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: 0,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: 0,
    ApiKey.DESCRIBE_PRODUCERS: 0,
    # EndTxn v5, TxnOffsetCommit v5 and AddPartitionsToTxn v5 are transaction version 2 (KIP-890 part 2), which
    # clients use only when ApiVersions finalizes the transaction.version feature at 2 (TRANSACTION_FEATURES)
    ApiKey.ADD_PARTITIONS_TO_TXN: 5,
    ApiKey.ADD_OFFSETS_TO_TXN: 4,
    ApiKey.END_TXN: 5,
    ApiKey.TXN_OFFSET_COMMIT: 5,
    ApiKey.DESCRIBE_TRANSACTIONS: 0,
    ApiKey.LIST_TRANSACTIONS: 2,
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: 0,
    ApiKey.LIST_CONFIG_RESOURCES: 1,
    # the KIP-848 consumer group protocol (codecs: mqk.protocol.kafka.newer)
    ApiKey.CONSUMER_GROUP_HEARTBEAT: 1,
    ApiKey.CONSUMER_GROUP_DESCRIBE: 1,
    # KIP-932 share groups (mqk.groups.share; codecs: mqk.protocol.kafka.newer)
    ApiKey.SHARE_GROUP_HEARTBEAT: 1,
    ApiKey.SHARE_GROUP_DESCRIBE: 1,
    ApiKey.SHARE_FETCH: 2,
    ApiKey.SHARE_ACKNOWLEDGE: 2,
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: 1,
    ApiKey.ALTER_SHARE_GROUP_OFFSETS: 0,
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: 0,
}

#: Advertised minimums below what the broker accepts. Produce v0-v2 (magic 0 and 1 message sets) are gone since
#: Kafka 4, but librdkafka up to 2.11 turns gzip, snappy and lz4 on only when the broker lists Produce v0 (it asks
#: whether Produce [0, 0] is supported) and otherwise sends every batch uncompressed without a word. Kafka 4 lists
#: Produce from v0 for that reason (KAFKA-18659) and still refuses a v0-v2 request; so does mqk (the codec checks
#: requests against SUPPORTED, not against this).
ADVERTISED_MIN = {ApiKey.PRODUCE: 0}

# Last version that still names topics (the next one is topic-id only).
_LAST_NAME_VERSION = {ApiKey.FETCH: 12, ApiKey.PRODUCE: 12, ApiKey.OFFSET_COMMIT: 9, ApiKey.OFFSET_FETCH: 9}


def message_meta(api_key: int) -> tuple[str, int, int, int] | None:
    """(name, lowest version, highest version, first flexible version) of an API whose codec mqk has."""
    return messages.MESSAGES.get(api_key) or NEWER.get(api_key)


def _ranges(caps: dict[int, int]) -> dict[int, tuple[int, int]]:
    out = {}
    for key, cap in sorted(caps.items()):
        meta = message_meta(key)
        assert meta is not None
        _name, lo, hi, _flex = meta
        out[key] = (lo, min(hi, cap))
    return out


SUPPORTED: dict[int, tuple[int, int]] = _ranges(_KAFKA_41_MAX)
NAMES: dict[int, str] = {key: meta[0] for key in SUPPORTED if (meta := message_meta(key)) is not None}


def supported(topic_ids: bool = True) -> dict[int, tuple[int, int]]:
    """The advertised ranges; `topic_ids=False` stops before the id-only versions."""
    if topic_ids:
        return dict(SUPPORTED)
    return _ranges({k: min(v, _LAST_NAME_VERSION.get(k, v)) for k, v in _KAFKA_41_MAX.items()})


def is_flexible_request(api_key: int, api_version: int) -> bool:
    """Flexible versions use request header v2 and (except ApiVersions) response header v1."""
    meta = message_meta(api_key)
    return meta is not None and meta[3] >= 0 and api_version >= meta[3]


def api_versions_body(
    error_code: int = 0, ranges: dict[int, tuple[int, int]] | None = None, throttle_time_ms: int = 0
) -> dict[str, Any]:
    """An ApiVersions response body listing every supported API (also the UNSUPPORTED_VERSION answer), with the
    ADVERTISED_MIN exceptions."""
    ranges = SUPPORTED if ranges is None else ranges
    return {
        "error_code": error_code,
        "api_keys": [
            {"api_key": k, "min_version": min(lo, ADVERTISED_MIN.get(k, lo)), "max_version": hi}
            for k, (lo, hi) in sorted(ranges.items())
        ],
        "throttle_time_ms": throttle_time_ms,
    }


UNSUPPORTED_VERSION = 35


def api_versions_unsupported_body(ranges: dict[int, tuple[int, int]] | None = None) -> dict[str, Any]:
    return api_versions_body(UNSUPPORTED_VERSION, ranges)
