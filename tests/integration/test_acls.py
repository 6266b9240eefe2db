"""ACLs over real sockets: one broker with the ACL authorizer on, a SASL_PLAINTEXT listener and three users (the super
user `admin`, `alice`, `bob`). What each user may do is exactly what its ACLs say, API by API, with Kafka's error
codes; the ACL APIs themselves and their filters; the `mqk acls` verb; ACLs surviving a restart of a file-store
broker; SECURITY_DISABLED on a broker without an authorizer. Real third-party clients: compat/test_acl_clients.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from helpers import fetch_body, produce_body, values_of

from mqk import errors as E
from mqk.broker.security.acls import OPERATION_CODES, SUPPORTED_OPERATIONS
from mqk.broker.security.principal import Principal
from mqk.broker.security.scram import SCRAM_SHA_256, SCRAM_SHA_512, new_credential
from mqk.config import BrokerConfig, ListenerConfig, StoreConfig
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient, make_batch
from mqk.testing import ThreadedBroker

ANY = ("127.0.0.1", 0)
PASSWORD = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
TAF, GAF, CAF = (
    E.TopicAuthorizationFailedError.code,
    E.GroupAuthorizationFailedError.code,
    E.ClusterAuthorizationFailedError.code,
)
# Kafka's codes: resource types, pattern types, operations, permissions
TOPIC, GROUP, CLUSTER = 2, 3, 4
ANY_TYPE, MATCH, LITERAL, PREFIXED = 1, 2, 3, 4
ALLOW, DENY = 3, 2


def acl_config(store: StoreConfig | None = None, **kw) -> BrokerConfig:
    defaults = {
        "kafka_listen": ANY,
        "native_listen": ANY,
        "namesrv_listen": ANY,
        "admin_listen": ANY,
        "listeners": (ListenerConfig.parse("SP=SASL_PLAINTEXT://127.0.0.1:0"),),
        "authorizer": True,
        "super_users": ("User:admin",),
        "auth_failure_delay_ms": 10,
        "auth_failure_delay_max_ms": 40,
        "store": store or StoreConfig(storage="memory"),
    }
    defaults.update(kw)
    return BrokerConfig(**defaults)


def add_users(broker: ThreadedBroker) -> None:
    users = broker.runtime.kafka.ctx.security.users
    for name, password in PASSWORD.items():
        changes = [(SCRAM_SHA_256, new_credential(SCRAM_SHA_256, password, 4096))]
        changes.append((SCRAM_SHA_512, new_credential(SCRAM_SHA_512, password, 4096)))
        broker.call(users.alter(name, changes))


@pytest.fixture(scope="module")
def broker():
    b = ThreadedBroker(acl_config()).start()
    add_users(b)
    yield b
    b.stop()


async def as_user(broker: ThreadedBroker, user: str | None) -> RawKafkaClient:
    """A client authenticated as `user` on the SASL listener (None: ANONYMOUS on the PLAINTEXT one)."""
    if user is None:
        return await RawKafkaClient.connect(*broker.kafka_address)
    client = await RawKafkaClient.connect(*broker.listeners["SP"])
    await client.authenticate("SCRAM-SHA-256", user, PASSWORD[user])
    return client


def acl(rtype: int, name: str, principal: str, op: str, permission: int = ALLOW, pattern: int = LITERAL) -> dict:
    return {
        "resource_type": rtype,
        "resource_name": name,
        "resource_pattern_type": pattern,
        "principal": principal,
        "host": "*",
        "operation": OPERATION_CODES[op],
        "permission_type": permission,
    }


def acl_filter(rtype: int = ANY_TYPE, name: str | None = None, pattern: int = ANY_TYPE, principal=None) -> dict:
    return {
        "resource_type_filter": rtype,
        "resource_name_filter": name,
        "pattern_type_filter": pattern,
        "principal_filter": principal,
        "host_filter": None,
        "operation": 1,
        "permission_type": 1,
    }


async def admin_setup(broker: ThreadedBroker, topics: list[str], acls: list[dict]) -> None:
    async with await as_user(broker, "admin") as admin:
        created = await admin.call(
            ApiKey.CREATE_TOPICS,
            7,
            {
                "topics": [
                    {"name": t, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}
                    for t in topics
                ],
                "timeout_ms": 5000,
                "validate_only": False,
            },
        )
        assert {t["error_code"] for t in created["topics"]} <= {0, E.TopicAlreadyExistsError.code}
        answer = await admin.call(ApiKey.CREATE_ACLS, 3, {"creations": acls})
        assert [r["error_code"] for r in answer["results"]] == [0] * len(acls)


def codes(answer: dict, topics_key: str = "responses", parts_key: str = "partition_responses") -> dict:
    return {t["name"]: [p["error_code"] for p in t[parts_key]] for t in answer[topics_key]}


async def test_a_user_may_write_topic_a_and_read_group_g_and_nothing_else(broker):
    await admin_setup(
        broker,
        ["a", "b"],
        [acl(TOPIC, "a", "User:alice", "WRITE"), acl(GROUP, "g", "User:alice", "READ")],
    )
    async with await as_user(broker, "alice") as alice:
        # Metadata: the listing hides b; asking for it by name is TOPIC_AUTHORIZATION_FAILED
        listing = await alice.call(ApiKey.METADATA, 12, {"topics": None, "include_topic_authorized_operations": True})
        assert [t["name"] for t in listing["topics"]] == ["a"]
        ops = listing["topics"][0]["topic_authorized_operations"]
        assert ops == (1 << OPERATION_CODES["WRITE"]) | (1 << OPERATION_CODES["DESCRIBE"])
        named = await alice.call(ApiKey.METADATA, 12, {"topics": [{"name": "b"}], "allow_auto_topic_creation": True})
        assert named["topics"][0]["error_code"] == TAF
        # a missing topic is not auto-created without CREATE
        missing = await alice.call(
            ApiKey.METADATA, 12, {"topics": [{"name": "new"}], "allow_auto_topic_creation": True}
        )
        assert missing["topics"][0]["error_code"] == TAF and broker.store.topic("new") is None

        produced = await alice.call(
            ApiKey.PRODUCE,
            9,
            {
                "transactional_id": None,
                "acks": -1,
                "timeout_ms": 5000,
                "topic_data": [
                    {"name": n, "partition_data": [{"index": 0, "records": make_batch([b"x"])}]} for n in ("a", "b")
                ],
            },
        )
        assert codes(produced) == {"a": [0], "b": [TAF]}
        assert broker.store.end_offset("b", 0) == 0 and broker.store.end_offset("a", 0) == 1

        fetched = await alice.call(ApiKey.FETCH, 12, fetch_body("a", 0))
        assert fetched["responses"][0]["partitions"][0]["error_code"] == TAF  # WRITE is not READ
        offsets = await alice.call(
            ApiKey.LIST_OFFSETS,
            7,
            {
                "replica_id": -1,
                "isolation_level": 0,
                "topics": [
                    {"name": n, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}]}
                    for n in ("a", "b")
                ],
            },
        )
        assert codes(offsets, "topics", "partitions") == {"a": [0], "b": [TAF]}

        # groups: g is hers to read, h is not
        found = await alice.call(ApiKey.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["g", "h"]})
        assert [c["error_code"] for c in found["coordinators"]] == [0, GAF]
        join = {
            "session_timeout_ms": 10000,
            "rebalance_timeout_ms": 10000,
            "member_id": "",
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
        }
        joined_g = await alice.call(ApiKey.JOIN_GROUP, 5, {**join, "group_id": "g"})
        assert joined_g["error_code"] == E.MemberIdRequiredError.code  # let in: the coordinator's usual answer
        joined_h = await alice.call(ApiKey.JOIN_GROUP, 5, {**join, "group_id": "h"})
        assert joined_h["error_code"] == GAF
        beat = await alice.call(ApiKey.HEARTBEAT, 3, {"group_id": "h", "generation_id": 1, "member_id": "m"})
        assert beat["error_code"] == GAF
        commit = {
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [{"name": "a", "partitions": [{"partition_index": 0, "committed_offset": 1}]}],
        }
        committed = await alice.call(ApiKey.OFFSET_COMMIT, 8, {**commit, "group_id": "g"})
        assert codes(committed, "topics", "partitions") == {"a": [TAF]}  # the group, yes; the topic needs READ
        committed = await alice.call(ApiKey.OFFSET_COMMIT, 8, {**commit, "group_id": "h"})
        assert codes(committed, "topics", "partitions") == {"a": [GAF]}
        fetched_offsets = await alice.call(ApiKey.OFFSET_FETCH, 7, {"group_id": "h", "topics": None})
        assert fetched_offsets["error_code"] == GAF
        described = await alice.call(
            ApiKey.DESCRIBE_GROUPS, 5, {"groups": ["g", "h"], "include_authorized_operations": True}
        )
        assert [g["error_code"] for g in described["groups"]] == [0, GAF]
        read_describe = (1 << OPERATION_CODES["READ"]) | (1 << OPERATION_CODES["DESCRIBE"])
        assert described["groups"][0]["authorized_operations"] == read_describe
        deleted = await alice.call(ApiKey.DELETE_GROUPS, 2, {"groups_names": ["g"]})
        assert deleted["results"][0]["error_code"] == GAF  # READ is not DELETE

        # topic and config admin
        created = await alice.call(
            ApiKey.CREATE_TOPICS,
            7,
            {
                "topics": [
                    {"name": "c", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}
                ],
                "timeout_ms": 5000,
                "validate_only": False,
            },
        )
        assert created["topics"][0]["error_code"] == TAF and broker.store.topic("c") is None
        dropped = await alice.call(ApiKey.DELETE_TOPICS, 4, {"topic_names": ["a"], "timeout_ms": 5000})
        assert dropped["responses"][0]["error_code"] == TAF and broker.store.topic("a") is not None
        grown = await alice.call(
            ApiKey.CREATE_PARTITIONS,
            3,
            {"topics": [{"name": "a", "count": 2, "assignments": None}], "timeout_ms": 5000, "validate_only": False},
        )
        assert grown["results"][0]["error_code"] == TAF
        trimmed = await alice.call(
            ApiKey.DELETE_RECORDS,
            2,
            {"topics": [{"name": "a", "partitions": [{"partition_index": 0, "offset": 1}]}], "timeout_ms": 5000},
        )
        assert codes(trimmed, "topics", "partitions") == {"a": [TAF]} and broker.store.log_start_offset("a", 0) == 0
        configs = await alice.call(
            ApiKey.DESCRIBE_CONFIGS,
            4,
            {
                "resources": [
                    {"resource_type": 2, "resource_name": "a", "configuration_keys": None},
                    {"resource_type": 4, "resource_name": "0", "configuration_keys": None},
                ],
                "include_synonyms": False,
                "include_documentation": False,
            },
        )
        assert [r["error_code"] for r in configs["results"]] == [TAF, CAF]
        altered = await alice.call(
            ApiKey.INCREMENTAL_ALTER_CONFIGS,
            1,
            {
                "resources": [
                    {
                        "resource_type": 2,
                        "resource_name": "a",
                        "configs": [{"name": "retention.ms", "config_operation": 0, "value": "1000"}],
                    }
                ],
                "validate_only": False,
            },
        )
        assert altered["responses"][0]["error_code"] == TAF
        assert broker.store.topic("a").config.get("retention.ms") != "1000"

        # cluster-level APIs
        assert (await alice.call(ApiKey.DESCRIBE_CLUSTER, 0, {}))["error_code"] == CAF
        assert (await alice.call(ApiKey.DESCRIBE_LOG_DIRS, 4, {"topics": None}))["error_code"] == CAF
        assert (await alice.call(ApiKey.DESCRIBE_ACLS, 3, acl_filter()))["error_code"] == CAF
        created_acls = await alice.call(ApiKey.CREATE_ACLS, 3, {"creations": [acl(TOPIC, "b", "User:alice", "ALL")]})
        assert created_acls["results"][0]["error_code"] == CAF
        users = await alice.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": None})
        assert users["error_code"] == CAF
        # an idempotent producer may start: she may WRITE a topic
        pid = await alice.call(ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 1})
        assert pid["error_code"] == 0 and pid["producer_id"] >= 0
    async with await as_user(broker, "bob") as bob:
        pid = await bob.call(ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 1})
        assert pid["error_code"] == CAF
        listing = await bob.call(ApiKey.METADATA, 12, {"topics": None})
        assert listing["topics"] == []
    async with await as_user(broker, None) as anonymous:
        listing = await anonymous.call(ApiKey.METADATA, 12, {"topics": None})
        assert listing["topics"] == []


async def test_prefixed_patterns_and_deny_over_allow(broker):
    await admin_setup(
        broker,
        ["orders-eu", "orders-secret", "other"],
        [
            acl(TOPIC, "orders-", "User:bob", "ALL", pattern=PREFIXED),
            acl(TOPIC, "orders-secret", "User:bob", "WRITE", permission=DENY),
            acl(TOPIC, "other", "User:*", "READ"),
        ],
    )
    async with await as_user(broker, "bob") as bob:
        for topic, expected in (("orders-eu", 0), ("orders-secret", TAF)):
            produced = await bob.call(ApiKey.PRODUCE, 9, produce_body(topic, make_batch([b"v"])))
            assert codes(produced)[topic] == [expected]
        # the DENY is of WRITE only: reading the topic is still allowed by the prefixed ALL
        fetched = await bob.call(ApiKey.FETCH, 12, fetch_body("orders-eu", 0))
        assert values_of(fetched["responses"][0]["partitions"][0]["records"]) == [b"v"]
        assert (await bob.call(ApiKey.FETCH, 12, fetch_body("orders-secret", 0)))["responses"][0]["partitions"][0][
            "error_code"
        ] == 0
        # ALL covers CREATE on the prefix: an auto-created orders- topic is allowed, another one is not
        made = await bob.call(
            ApiKey.METADATA, 12, {"topics": [{"name": "orders-new"}], "allow_auto_topic_creation": True}
        )
        assert made["topics"][0]["error_code"] == 0
        listing = await bob.call(ApiKey.METADATA, 12, {"topics": None})
        assert {t["name"] for t in listing["topics"]} >= {"orders-eu", "orders-secret", "orders-new", "other"}
        assert "a" not in {t["name"] for t in listing["topics"]}


async def test_acl_filters_describe_and_delete_as_kafka(broker):
    principal = "User:carol"
    await admin_setup(
        broker,
        [],
        [
            acl(TOPIC, "pay", principal, "READ"),
            acl(TOPIC, "pay-", principal, "WRITE", pattern=PREFIXED),
            acl(TOPIC, "*", principal, "DESCRIBE"),
            acl(GROUP, "pay-group", principal, "READ"),
        ],
    )
    async with await as_user(broker, "admin") as admin:

        async def described(**kw) -> set:
            answer = await admin.call(ApiKey.DESCRIBE_ACLS, 3, acl_filter(principal=principal, **kw))
            assert answer["error_code"] == 0
            return {(r["resource_type"], r["resource_name"], r["pattern_type"]) for r in answer["resources"]}

        assert await described() == {
            (TOPIC, "pay", LITERAL),
            (TOPIC, "pay-", PREFIXED),
            (TOPIC, "*", LITERAL),
            (GROUP, "pay-group", LITERAL),
        }
        assert await described(rtype=TOPIC, name="pay-in", pattern=MATCH) == {
            (TOPIC, "pay-", PREFIXED),
            (TOPIC, "*", LITERAL),
        }
        assert await described(name="pay") == {(TOPIC, "pay", LITERAL)}
        assert await described(rtype=TOPIC, name="pay-", pattern=LITERAL) == set()
        bad = await admin.call(ApiKey.DESCRIBE_ACLS, 3, {**acl_filter(), "operation": 0})
        assert bad["error_code"] == E.InvalidRequestError.code
        invalid = await admin.call(
            ApiKey.CREATE_ACLS,
            3,
            {
                "creations": [
                    acl(TOPIC, "x", "carol", "READ"),
                    acl(CLUSTER, "other", principal, "ALTER"),
                    acl(TOPIC, "x", principal, "READ", pattern=MATCH),
                ]
            },
        )
        assert [r["error_code"] for r in invalid["results"]] == [E.InvalidRequestError.code] * 3
        removed = await admin.call(
            ApiKey.DELETE_ACLS,
            3,
            {
                "filters": [
                    acl_filter(rtype=TOPIC, name="pay-x", pattern=MATCH, principal=principal),
                    acl_filter(rtype=GROUP),
                ]
            },
        )
        matched = [
            {(m["resource_name"], m["pattern_type"]) for m in r["matching_acls"]} for r in removed["filter_results"]
        ]
        assert matched[0] == {("pay-", PREFIXED), ("*", LITERAL)}
        assert ("pay-group", LITERAL) in matched[1]
        assert await described() == {(TOPIC, "pay", LITERAL)}


def mqk_acls(broker: ThreadedBroker, *args: str, user: str = "admin") -> subprocess.CompletedProcess:
    host, port = broker.listeners["SP"]
    sasl = ("--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", user)
    env = {**os.environ, "MQK_SASL_PASSWORD": PASSWORD[user]}
    return subprocess.run(
        [sys.executable, "-m", "mqk", "acls", *args, "--bootstrap", f"{host}:{port}", *sasl],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_the_mqk_acls_verb_adds_lists_and_removes(broker):
    added = mqk_acls(
        broker,
        "add",
        "--allow-principal",
        "User:dave",
        "--operation",
        "read",
        "--operation",
        "write",
        "--topic",
        "logs",
    )
    assert added.returncode == 0, added.stderr
    assert "2 ACL(s) added" in added.stdout
    denied = mqk_acls(
        broker,
        "add",
        "--deny-principal",
        "User:dave",
        "--operation",
        "ALL",
        "--group",
        "audit",
        "--resource-pattern-type",
        "prefixed",
    )
    assert denied.returncode == 0, denied.stderr
    listed = mqk_acls(broker, "list", "--principal", "User:dave")
    assert listed.returncode == 0, listed.stderr
    assert sorted(listed.stdout.splitlines()) == [
        "GROUP:PREFIXED:audit\tUser:dave\thost=*\tALL\tDENY",
        "TOPIC:LITERAL:logs\tUser:dave\thost=*\tREAD\tALLOW",
        "TOPIC:LITERAL:logs\tUser:dave\thost=*\tWRITE\tALLOW",
    ]
    removed = mqk_acls(broker, "remove", "--allow-principal", "User:dave", "--topic", "logs", "--operation", "WRITE")
    assert removed.returncode == 0 and "1 ACL(s) removed" in removed.stdout, removed.stderr
    refused = mqk_acls(broker, "list", user="alice")
    assert refused.returncode == 1 and "ClusterAuthorizationFailedError" in refused.stderr
    listed = mqk_acls(broker, "list", "--topic", "logs", "--json")
    assert '"WRITE"' not in listed.stdout and '"READ"' in listed.stdout


def test_acls_survive_a_restart_of_a_file_store_broker(tmp_path):
    config = acl_config(StoreConfig(storage="file", data_dir=tmp_path / "data"))
    first = ThreadedBroker(config).start()
    try:
        add_users(first)
        asyncio.run(admin_setup(first, [], [acl(TOPIC, "kept", "User:alice", "READ")]))
    finally:
        first.stop()
    assert (tmp_path / "data" / "security" / "acls.json").exists()
    again = ThreadedBroker(config).start()
    try:
        security = again.runtime.kafka.ctx.security
        assert [b.name for b in security.acls.bindings()] == ["kept"]
        assert security.authorizer.authorize(Principal("User", "alice"), "127.0.0.1", "DESCRIBE", "TOPIC", "kept")
    finally:
        again.stop()


async def test_a_broker_without_an_authorizer_answers_security_disabled(mqk_broker):
    async with await RawKafkaClient.connect(*mqk_broker.kafka_address) as client:
        described = await client.call(ApiKey.DESCRIBE_ACLS, 3, acl_filter())
        assert described["error_code"] == E.SecurityDisabledError.code
        created = await client.call(ApiKey.CREATE_ACLS, 3, {"creations": [acl(TOPIC, "t", "User:x", "READ")]})
        assert created["results"][0]["error_code"] == E.SecurityDisabledError.code
        # everyone may do everything: the authorized operations are every operation a resource type has
        meta = await client.call(
            ApiKey.METADATA,
            12,
            {
                "topics": [{"name": "ops"}],
                "allow_auto_topic_creation": True,
                "include_topic_authorized_operations": True,
            },
        )
        topic_ops = sum(1 << OPERATION_CODES[op] for op in SUPPORTED_OPERATIONS["TOPIC"])
        assert meta["topics"][0]["topic_authorized_operations"] == topic_ops
        cluster = await client.call(ApiKey.DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": True})
        cluster_ops = sum(1 << OPERATION_CODES[op] for op in SUPPORTED_OPERATIONS["CLUSTER"])
        assert cluster["cluster_authorized_operations"] == cluster_ops
        versions = await client.call(
            ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}
        )
        keys = {k["api_key"]: (k["min_version"], k["max_version"]) for k in versions["api_keys"]}
        assert keys[ApiKey.DESCRIBE_ACLS] == keys[ApiKey.CREATE_ACLS] == keys[ApiKey.DELETE_ACLS] == (1, 3)
