"""Kafka's ACL rules on their own: which bindings apply to a resource (literal, wildcard, prefixed), DENY over ALLOW,
implied operations, super users, allow-if-no-ACL, the filters of DescribeAcls / DeleteAcls (ANY and MATCH), where
the bindings are kept (a private file, memory, the cluster's keys) and that a cached decision follows a change."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from mqk import errors as E
from mqk.broker.cluster.model import Keys
from mqk.broker.cluster.view import KeyTable
from mqk.broker.security.acls import AclAuthorizer, AclBinding, AclFilter, AclIndex, Acls
from mqk.broker.security.principal import ANONYMOUS, Principal

ALICE = Principal("User", "alice")
BOB = Principal("User", "bob")


def allow(rt: str, name: str, op: str, principal: str = "User:alice", pattern: str = "LITERAL", host: str = "*"):
    return AclBinding(rt, name, pattern, principal, host, op, "ALLOW")


def deny(rt: str, name: str, op: str, principal: str = "User:alice", pattern: str = "LITERAL", host: str = "*"):
    return AclBinding(rt, name, pattern, principal, host, op, "DENY")


def fake_store(tmp_path: Path, persistent: bool = True):
    return SimpleNamespace(persistent=persistent, config=SimpleNamespace(data_dir=tmp_path / "data"))


def decide(bindings, principal="User:alice", host="127.0.0.1", op="READ", rt="TOPIC", name="a", if_none=False):
    return AclIndex(bindings).authorize(principal, host, op, rt, name, if_none)


def test_literal_wildcard_and_prefixed_patterns_apply_to_their_resources():
    assert decide([allow("TOPIC", "a", "READ")])
    assert not decide([allow("TOPIC", "a", "READ")], name="ab")
    assert decide([allow("TOPIC", "*", "READ")], name="anything")
    assert decide([allow("TOPIC", "or", "READ", pattern="PREFIXED")], name="orders")
    assert not decide([allow("TOPIC", "or", "READ", pattern="PREFIXED")], name="o")
    assert not decide([allow("GROUP", "a", "READ")], name="a")  # another resource type
    assert not decide([allow("TOPIC", "a", "READ")], op="WRITE")


def test_principal_and_host_must_match_or_be_wildcards():
    assert not decide([allow("TOPIC", "a", "READ")], principal="User:bob")
    assert decide([allow("TOPIC", "a", "READ", principal="User:*")], principal="User:bob")
    assert decide([allow("TOPIC", "a", "READ", host="127.0.0.1")])
    assert not decide([allow("TOPIC", "a", "READ", host="127.0.0.2")])


def test_deny_beats_allow_and_all_covers_every_operation():
    assert not decide([allow("TOPIC", "a", "READ"), deny("TOPIC", "a", "READ")])
    assert not decide([allow("TOPIC", "*", "ALL"), deny("TOPIC", "a", "ALL")], op="WRITE")
    assert not decide([allow("TOPIC", "a", "READ"), deny("TOPIC", "", "READ", pattern="PREFIXED")])
    assert not decide([allow("TOPIC", "a", "READ"), deny("TOPIC", "a", "READ", principal="User:*")])
    assert decide([allow("TOPIC", "a", "READ"), deny("TOPIC", "a", "READ", principal="User:bob")])
    assert decide([allow("TOPIC", "a", "ALL")], op="DELETE")
    # a DENY of READ does not deny DESCRIBE (Kafka denies only the operation asked, or ALL)
    assert decide([allow("TOPIC", "a", "DESCRIBE"), deny("TOPIC", "a", "READ")], op="DESCRIBE")


@pytest.mark.parametrize("op", ["READ", "WRITE", "DELETE", "ALTER"])
def test_read_write_delete_and_alter_imply_describe(op):
    assert decide([allow("TOPIC", "a", op)], op="DESCRIBE")


def test_alter_configs_implies_describe_configs_but_not_the_other_way():
    assert decide([allow("TOPIC", "a", "ALTER_CONFIGS")], op="DESCRIBE_CONFIGS")
    assert not decide([allow("TOPIC", "a", "DESCRIBE_CONFIGS")], op="ALTER_CONFIGS")
    assert not decide([allow("TOPIC", "a", "CREATE")], op="DESCRIBE")


def test_no_acl_on_a_resource_refuses_unless_everyone_is_allowed():
    assert not decide([allow("TOPIC", "b", "READ")])
    assert decide([allow("TOPIC", "b", "READ")], if_none=True)
    # a resource that has ACLs (for someone else) is not "no ACL found"
    assert not decide([allow("TOPIC", "a", "READ", principal="User:bob")], if_none=True)


def test_authorize_any_lets_in_an_allow_no_deny_covers():
    index = AclIndex([allow("TOPIC", "a", "WRITE")])
    assert index.authorize_any("User:alice", "h", "WRITE", "TOPIC")
    assert not index.authorize_any("User:bob", "h", "WRITE", "TOPIC")
    covered = AclIndex([allow("TOPIC", "ab", "WRITE"), deny("TOPIC", "a", "WRITE", pattern="PREFIXED")])
    assert not covered.authorize_any("User:alice", "h", "WRITE", "TOPIC")
    wildcard = AclIndex([allow("TOPIC", "ab", "WRITE"), deny("TOPIC", "*", "WRITE")])
    assert not wildcard.authorize_any("User:alice", "h", "WRITE", "TOPIC")


BINDINGS = [
    allow("TOPIC", "orders", "READ"),
    allow("TOPIC", "ord", "WRITE", pattern="PREFIXED"),
    allow("TOPIC", "*", "DESCRIBE", principal="User:bob"),
    deny("GROUP", "g", "READ"),
]


@pytest.mark.parametrize(
    ("acl_filter", "expected"),
    [
        (AclFilter(), [0, 1, 2, 3]),
        (AclFilter(resource_type="TOPIC"), [0, 1, 2]),
        # ANY with a name: that exact name, any pattern type
        (AclFilter(name="ord"), [1]),
        (AclFilter(name="orders", pattern_type="LITERAL"), [0]),
        (AclFilter(name="orders", pattern_type="PREFIXED"), []),
        # MATCH: every binding that applies to the resource named
        (AclFilter(resource_type="TOPIC", name="orders", pattern_type="MATCH"), [0, 1, 2]),
        (AclFilter(resource_type="TOPIC", name="other", pattern_type="MATCH"), [2]),
        (AclFilter(principal="User:bob"), [2]),
        (AclFilter(permission="DENY"), [3]),
        (AclFilter(operation="WRITE"), [1]),
        (AclFilter(host="10.0.0.1"), []),
    ],
)
def test_filters_match_as_kafkas_binding_filter(acl_filter, expected):
    assert [i for i, b in enumerate(BINDINGS) if acl_filter.matches(b)] == expected


@pytest.mark.parametrize(
    "binding",
    [
        AclBinding("ANY", "a", "LITERAL", "User:a", "*", "READ", "ALLOW"),
        AclBinding("TOPIC", "a", "MATCH", "User:a", "*", "READ", "ALLOW"),
        AclBinding("TOPIC", "a", "LITERAL", "alice", "*", "READ", "ALLOW"),
        AclBinding("TOPIC", "a", "LITERAL", "User:a", "*", "ANY", "ALLOW"),
        AclBinding("TOPIC", "a", "LITERAL", "User:a", "*", "READ", "ANY"),
        AclBinding("TOPIC", "", "LITERAL", "User:a", "*", "READ", "ALLOW"),
        AclBinding("CLUSTER", "other", "LITERAL", "User:a", "*", "ALTER", "ALLOW"),
    ],
)
def test_bindings_kafka_refuses_to_store_are_refused(binding):
    assert binding.problem() is not None


async def test_the_authorizer_caches_but_follows_changes_and_lets_super_users_in(tmp_path):
    acls = Acls(fake_store(tmp_path, persistent=False))  # type: ignore[arg-type]  # the config part is enough
    authorizer = AclAuthorizer(acls, super_users=["User:admin"])
    assert not authorizer.authorize(ALICE, "h", "WRITE", "TOPIC", "a")
    await acls.change(add=[allow("TOPIC", "a", "WRITE")])
    assert authorizer.authorize(ALICE, "h", "WRITE", "TOPIC", "a")
    await acls.change(add=[deny("TOPIC", "a", "WRITE")])
    assert not authorizer.authorize(ALICE, "h", "WRITE", "TOPIC", "a")
    assert authorizer.authorize(Principal("User", "admin"), "h", "ALTER", "CLUSTER", "kafka-cluster")
    assert not authorizer.authorize(ANONYMOUS, "h", "DESCRIBE", "TOPIC", "a")
    assert not (tmp_path / "data").exists()  # a memory-store broker writes nothing


async def test_acls_live_in_a_private_file_and_load_again(tmp_path):
    acls = Acls(fake_store(tmp_path))  # type: ignore[arg-type]  # the config part is enough
    await acls.change(add=BINDINGS)
    await acls.change(remove=[BINDINGS[0]])
    path = tmp_path / "data" / "security" / "acls.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = Acls(fake_store(tmp_path))  # type: ignore[arg-type]  # the config part is enough
    again.load()
    assert again.bindings() == frozenset(BINDINGS[1:])


@pytest.mark.parametrize("doc", ['{"acls": {}}', '{"acls": [{"resource_type": "TOPIC"}]}', "[1]"])
def test_a_damaged_acl_file_is_refused_at_start(tmp_path, doc):
    path = tmp_path / "data" / "security" / "acls.json"
    path.parent.mkdir(parents=True)
    path.write_text(doc)
    with pytest.raises(E.Corrupt):
        Acls(fake_store(tmp_path)).load()  # type: ignore[arg-type]  # the config part is enough


class FakeCluster:
    """The ACL part of a ClusterMember: its table of ACL keys, whose generation moves with each write."""

    def __init__(self) -> None:
        self.keys = Keys("test")
        self.acls = KeyTable()
        self.listeners: list = []
        self.view = SimpleNamespace(add_listener=self.listeners.append)

    def table(self, prefix: str) -> KeyTable:
        assert prefix == self.keys.acls
        return self.acls

    def changed(self) -> None:
        """What the view does after a watch event touching the ACL keys."""
        self.acls.changes += 1
        for listener in self.listeners:
            listener()

    async def write_table(self, prefix, puts, deletes):
        table = self.table(prefix)
        table.values.update(puts)
        for key in deletes:
            table.values.pop(key, None)
        self.changed()


async def test_cluster_acls_are_the_clusters_keys(tmp_path):
    acls = Acls(fake_store(tmp_path))  # type: ignore[arg-type]  # the config part is enough
    cluster = FakeCluster()
    acls.attach_cluster(cluster)  # type: ignore[arg-type]  # the ACL part of a ClusterMember is enough here
    authorizer = AclAuthorizer(acls)
    await acls.change(add=BINDINGS[:2])
    assert len(cluster.acls.values) == 2 and authorizer.authorize(ALICE, "h", "READ", "TOPIC", "orders")
    # another broker's write shows up through the view
    cluster.acls.values["bad"] = b"{"
    cluster.acls.values[BINDINGS[3].key()] = json.dumps(BINDINGS[3].to_json()).encode()
    cluster.changed()
    assert acls.bindings() == frozenset([*BINDINGS[:2], BINDINGS[3]])  # the bad one logged and left out
    await acls.change(remove=[BINDINGS[0]])
    assert not authorizer.authorize(ALICE, "h", "READ", "TOPIC", "orders")
    assert not (tmp_path / "data").exists()


def test_authorizer_settings_from_the_toml_file_and_flags(tmp_path):
    from mqk.config import BrokerConfig

    path = tmp_path / "mqk.toml"
    path.write_text('authorizer = true\nsuper_users = "User:admin;User:ops"\n')
    config = BrokerConfig.load(path)
    assert config.authorizer and config.super_users == ("User:admin", "User:ops")
    assert not config.allow_everyone_if_no_acl_found
    flags = BrokerConfig.load(None, super_users=("User:root",), allow_everyone_if_no_acl_found=True)
    assert flags.super_users == ("User:root",) and flags.allow_everyone_if_no_acl_found and not flags.authorizer
    with pytest.raises(ValueError, match="super_users"):
        BrokerConfig.load(None, super_users=("admin",))
