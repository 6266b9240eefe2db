"""The broker layer's security services alone: certificate subjects and Kafka's principal mapping rules, the growing
delay after failed authentications (on a fake clock), and the user store (what it writes, and only that)."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from mqk import errors as E
from mqk.broker.security.failures import AuthFailureDelays
from mqk.broker.security.principal import (
    ANONYMOUS,
    NoMatchingRule,
    Principal,
    PrincipalMapper,
    parse_rule,
    subject_dn,
)
from mqk.broker.security.scram import SCRAM_SHA_256, SCRAM_SHA_512, new_credential
from mqk.broker.security.users import Users
from mqk.clock import FakeClock
from mqk.config import TlsConfig

SUBJECT = (
    (("countryName", "US"),),
    (("organizationName", "mqk"),),
    (("organizationalUnitName", "eng"), ("organizationalUnitName", "ops")),
    (("commonName", "alice"),),
)


def test_subject_in_rfc2253_form_as_java_writes_it():
    assert subject_dn(SUBJECT) == "CN=alice,OU=eng+OU=ops,O=mqk,C=US"
    assert subject_dn(((("commonName", 'a,b+c"d\\e<f>g;h'),),)) == 'CN=a\\,b\\+c\\"d\\\\e\\<f\\>g\\;h'
    assert subject_dn(((("commonName", "#lead "),),)) == "CN=\\#lead\\ "
    assert subject_dn(((("emailAddress", "a@b"),), (("commonName", "x"),))) == "CN=x,emailAddress=a@b"


def test_default_rules_take_the_cn_and_fall_back_to_the_whole_subject():
    mapper = PrincipalMapper(TlsConfig().principal_mapping_rules)
    assert mapper.principal({"subject": SUBJECT}) == Principal("User", "alice")
    assert mapper.name_of("CN=a\\,b,O=mqk") == "a\\,b"  # an escaped comma stays in the name
    assert mapper.name_of("O=mqk,C=US") == "O=mqk,C=US"  # no CN: Kafka's DEFAULT
    assert mapper.principal(None) == ANONYMOUS and mapper.principal({}) == ANONYMOUS


def test_kafka_rules_with_groups_case_and_escaped_slashes():
    mapper = PrincipalMapper(["RULE:^CN=([a-z]+),OU=(.*?),.*$/$1@$2/U", "RULE:^O=(.*)\\/x$/org-${1}/L"])
    assert mapper.name_of("CN=bob,OU=eng,O=mqk") == "BOB@ENG"
    assert mapper.name_of("O=MQK/x") == "org-mqk"
    with pytest.raises(NoMatchingRule):
        mapper.name_of("C=US")
    for bad in ("RULE:^(.*$/$1/", "RULE:a/b", "RULE:a/b/Q", "SOMETHING"):
        with pytest.raises(ValueError):
            parse_rule(bad)


async def test_failure_delays_double_up_to_the_bound_and_are_forgotten():
    clock = FakeClock()
    delays = AuthFailureDelays(clock, 0.1, 1.0, forget_s=60, capacity=2)
    assert [delays.failed("10.0.0.1") for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert delays.failed("10.0.0.2") == 0.1  # each address on its own
    delays.succeeded("10.0.0.2")
    assert delays.failures("10.0.0.2") == 0
    await clock.advance(61)
    assert delays.failed("10.0.0.1") == 0.1  # a minute later it starts again
    delays.failed("10.0.0.3")
    delays.failed("10.0.0.4")
    assert delays.failures("10.0.0.1") == 0  # the least recently failed address made room


def fake_store(tmp_path: Path, persistent: bool = True):
    return SimpleNamespace(persistent=persistent, config=SimpleNamespace(data_dir=tmp_path / "data"))


async def test_users_keep_only_salted_keys_in_a_private_file_and_load_them_again(tmp_path):
    users = Users(fake_store(tmp_path))
    alice = new_credential(SCRAM_SHA_512, "a-long-password", 8192)
    await users.alter("alice", [(SCRAM_SHA_512, alice), (SCRAM_SHA_256, new_credential(SCRAM_SHA_256, "pw"))])
    path = tmp_path / "data" / "security" / "scram-credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    text = path.read_text()
    assert "a-long-password" not in text and "salted" not in text
    assert set(json.loads(text)["users"]["alice"]) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}

    again = Users(fake_store(tmp_path))
    again.load()
    assert again.credential("alice", SCRAM_SHA_512) == alice and again.names() == ["alice"]
    await again.alter("alice", [(SCRAM_SHA_256, None)])
    assert set(again.get("alice")) == {"SCRAM-SHA-512"}
    with pytest.raises(E.ResourceNotFoundError):
        await again.alter("alice", [(SCRAM_SHA_256, None)])
    with pytest.raises(E.ResourceNotFoundError):
        await again.alter("nobody", [(SCRAM_SHA_512, None)])
    await again.alter("alice", [(SCRAM_SHA_512, None)])
    assert again.names() == [] and json.loads(path.read_text()) == {"users": {}}


async def test_a_memory_broker_keeps_users_in_memory_only(tmp_path):
    users = Users(fake_store(tmp_path, persistent=False))
    await users.alter("bob", [(SCRAM_SHA_256, new_credential(SCRAM_SHA_256, "pw"))])
    assert users.names() == ["bob"] and not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    "doc",
    [
        "not json",
        '{"users": []}',
        '{"users": {"a": {"SCRAM-SHA-1": {}}}}',
        # keys of the wrong length for SHA-256
        '{"users": {"a": {"SCRAM-SHA-256": {"salt": "AA==", "stored_key": "AA==", "server_key": "AA==", '
        '"iterations": 4096}}}}',
        '{"users": {"a": {"SCRAM-SHA-256": {"salt": "!", "stored_key": "", "server_key": "", "iterations": 1}}}}',
    ],
)
def test_a_damaged_credentials_file_is_refused_at_start(tmp_path, doc):
    path = tmp_path / "data" / "security" / "scram-credentials.json"
    path.parent.mkdir(parents=True)
    path.write_text(doc)
    with pytest.raises(E.Corrupt):
        Users(fake_store(tmp_path)).load()


class FakeCluster:
    """The user part of a ClusterMember: a key per user with revisions, and a compare-and-set that another broker
    beats once."""

    def __init__(self) -> None:
        self.state = SimpleNamespace(users={}, revision=0)
        self.view = SimpleNamespace(state=self.state, wait_until=self._wait_until)
        self.interfere = False

    def users(self):
        return self.state.users

    def _put(self, name, value):
        self.state.revision += 1
        if value is None:
            self.state.users.pop(name, None)
        else:
            self.state.users[name] = (self.state.revision, value)

    async def write_user(self, name, value, revision):
        if self.interfere:  # another broker writes first
            self.interfere = False
            other = json.dumps({"SCRAM-SHA-512": _encoded(new_credential(SCRAM_SHA_512, "theirs"))}).encode()
            self._put(name, other)
        if self.state.users.get(name, (0, b""))[0] != revision:
            return False
        self._put(name, value)
        return True

    async def _wait_until(self, condition, timeout):  # noqa: ASYNC109 - the view's wait_until signature
        await asyncio.sleep(0)  # a yield, as the real view's wait does before it answers
        return condition(self.state)


def _encoded(credential):
    from mqk.broker.security.users import encode_user

    return encode_user({"x": credential})["x"]


async def test_cluster_users_are_read_from_the_view_and_changed_by_compare_and_set(tmp_path):
    users = Users(fake_store(tmp_path))
    cluster = FakeCluster()
    users.attach_cluster(cluster)  # type: ignore[arg-type]  # the user part of a ClusterMember is enough here
    mine = new_credential(SCRAM_SHA_256, "mine")
    cluster.interfere = True
    await users.alter("carol", [(SCRAM_SHA_256, mine)])
    # the change was applied on top of what the other broker wrote meanwhile
    assert set(users.get("carol")) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
    assert users.credential("carol", SCRAM_SHA_256) == mine
    assert not (tmp_path / "data").exists()  # nothing local in cluster mode
    cluster.state.users["bad"] = (99, b"{")
    assert users.get("bad") == {}  # logged and left out
    await users.alter("carol", [(SCRAM_SHA_256, None), (SCRAM_SHA_512, None)])
    assert users.names() == ["bad"]
