"""RocketMQ's plain-ACL signature (mqk.protocol.native.signature), the RocketMQ access-key store
(mqk.broker.security.access_keys) and what each request code needs from the ACLs (mqk.server.native.acl)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import logging
import os
import stat
from types import SimpleNamespace

import pytest

from mqk import errors as E
from mqk.broker.cluster.model import Keys
from mqk.broker.cluster.view import KeyTable
from mqk.broker.security.access_keys import (
    AccessKeys,
    access_keys_path,
    cluster_key_tail,
    encode_cluster_value,
    read_access_keys,
)
from mqk.cli import main
from mqk.cluster_local import free_port
from mqk.protocol.native.codes import RequestCode
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.signature import sign, signature, signed_content, verify
from mqk.server.native.acl import needs


def test_signature_matches_hmac_sha1_over_sorted_values_then_body() -> None:
    ext = {"topic": "t1", "AccessKey": "alice", "queueId": "3", "OnsChannel": "ALIYUN", "Signature": "old"}
    body = b"\x00hello"
    # sorted keys: AccessKey, OnsChannel, queueId, topic (Signature left out); values only, then the body
    expected_content = b"alice" + b"ALIYUN" + b"3" + b"t1" + body
    assert signed_content(ext, body) == expected_content
    expected = base64.b64encode(hmac.new(b"s3cret", expected_content, hashlib.sha1).digest()).decode()
    assert signature(ext, body, "s3cret") == expected
    # the same vector from `printf 'aliceALIYUN3t1\x00hello' | openssl dgst -sha1 -hmac s3cret -binary | base64`
    assert expected == "sPQy7Suha3yEuwzxumwY9/QnhQM="


def test_upper_case_keys_sort_before_lower_case_as_java_strings_do() -> None:
    assert signed_content({"b": "2", "B": "1", "a": "3"}, None) == b"132"


def test_no_body_and_empty_body_sign_the_fields_alone() -> None:
    assert signed_content({"k": "v"}, None) == signed_content({"k": "v"}, b"") == b"v"


def test_sign_then_verify_and_tampering_fails() -> None:
    ext = {"topic": "orders", "consumerGroup": "g"}
    sign(ext, b"body", "alice", "pw")
    assert ext["AccessKey"] == "alice"
    assert verify(ext, b"body", "pw")
    assert not verify(ext, b"body", "other")
    assert not verify(ext, b"bodz", "pw")
    assert not verify({**ext, "topic": "payments"}, b"body", "pw")
    assert not verify({k: v for k, v in ext.items() if k != "Signature"}, b"body", "pw")


def test_unique_key_query_flag_is_not_signed() -> None:
    ext = {"topic": "t"}
    sign(ext, None, "a", "s")
    assert verify({**ext, "_UNIQUE_KEY_QUERY": "true"}, None, "s")


def test_access_keys_file_is_private_and_reread_when_changed(tmp_path) -> None:
    keys = AccessKeys(tmp_path)
    keys.load()
    assert keys.secret("alice") is None
    keys.set("alice", "one")
    path = access_keys_path(tmp_path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert read_access_keys(path) == {"alice": "one"}
    other = AccessKeys(tmp_path)  # a broker reading what the CLI wrote
    other.load()
    assert other.secret("alice") == "one"
    keys.set("bob", "two")
    assert other.secret("bob") == "two"  # unknown key: the file is checked at once
    keys.delete("alice")
    other._checked -= 10  # past the reload interval
    assert other.secret("alice") is None


def test_a_corrupt_access_keys_file_refuses_to_load(tmp_path) -> None:
    path = access_keys_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"access_keys": {"alice": {}}}))
    with pytest.raises(E.Corrupt):
        AccessKeys(tmp_path).load()


def cmd(code: int, body: bytes | None = None, **ext: str) -> RemotingCommand:
    return RemotingCommand(code=code, ext_fields=dict(ext), body=body)


def test_needs_map_requests_to_kafka_operations() -> None:
    assert needs(cmd(RequestCode.SEND_MESSAGE_V2, a="pg", b="orders")) == [("WRITE", "TOPIC", "orders")]
    assert needs(cmd(RequestCode.SEND_MESSAGE, topic="orders")) == [("WRITE", "TOPIC", "orders")]
    assert needs(cmd(RequestCode.RECALL_MESSAGE, topic="orders", recallHandle="h")) == [("WRITE", "TOPIC", "orders")]
    assert needs(cmd(RequestCode.PULL_MESSAGE, topic="orders", consumerGroup="g")) == [
        ("READ", "TOPIC", "orders"),
        ("READ", "GROUP", "g"),
    ]
    # a group's retry topic stands for the group
    assert needs(cmd(RequestCode.PULL_MESSAGE, topic="%RETRY%g", consumerGroup="g")) == [
        ("READ", "GROUP", "g"),
        ("READ", "GROUP", "g"),
    ]
    assert needs(cmd(RequestCode.UPDATE_CONSUMER_OFFSET, topic="o", consumerGroup="g")) == [
        ("READ", "TOPIC", "o"),
        ("READ", "GROUP", "g"),
    ]
    beat = json.dumps({"consumerDataSet": [{"groupName": "g1"}, {"groupName": "g2"}], "producerDataSet": []})
    assert needs(cmd(RequestCode.HEART_BEAT, beat.encode())) == [("READ", "GROUP", "g1"), ("READ", "GROUP", "g2")]
    assert needs(cmd(RequestCode.HEART_BEAT, b"not json")) == []
    assert needs(cmd(RequestCode.UPDATE_AND_CREATE_TOPIC, topic="n")) == [("CREATE", "TOPIC", "n")]
    assert needs(cmd(RequestCode.DELETE_TOPIC_IN_BROKER, topic="n")) == [("DELETE", "TOPIC", "n")]
    assert needs(cmd(RequestCode.GET_BROKER_CONFIG)) == [("DESCRIBE_CONFIGS", "CLUSTER", "kafka-cluster")]
    assert needs(cmd(RequestCode.GET_MAX_OFFSET, topic="o")) == [("DESCRIBE", "TOPIC", "o")]
    assert needs(cmd(RequestCode.CHECK_CLIENT_CONFIG)) == []
    # its topic is known only once the message is found: the processor asks for it (NativeAcl.check_viewed)
    assert needs(cmd(RequestCode.VIEW_MESSAGE_BY_ID, offset="0")) == []


def test_cli_adds_lists_and_deletes_rocketmq_access_keys(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret\n"))
    assert main(["users", "add-rocketmq", "alice", "--secret-stdin", "--data-dir", str(tmp_path)]) == 0
    path = access_keys_path(tmp_path)
    assert read_access_keys(path) == {"alice": "s3cret"}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert main(["users", "list-rocketmq", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "alice"
    assert main(["users", "delete-rocketmq", "alice", "--data-dir", str(tmp_path)]) == 0
    assert read_access_keys(path) == {}
    assert main(["users", "delete-rocketmq", "alice", "--data-dir", str(tmp_path)]) == 1


def test_in_cluster_mode_the_access_keys_are_the_clusters_table(tmp_path, caplog) -> None:
    keys = AccessKeys(tmp_path)
    keys.set("local", "local-secret")
    table = KeyTable()
    cluster = SimpleNamespace(keys=Keys("c1"), table=lambda prefix: table)
    with caplog.at_level(logging.WARNING, "mqk.security"):
        keys.attach_cluster(cluster)  # type: ignore[arg-type]  # the table part of a ClusterMember is enough
    assert "the 1 kept in" in caplog.text and "not the cluster's" in caplog.text
    assert keys.secret("local") is None and keys.names() == []
    # another broker's write (or the CLI's) arrives through the view: a new generation of the table
    table.values[cluster_key_tail("team/a")] = encode_cluster_value("a-secret")
    table.values["bad"] = b"{not json"
    table.changes += 1
    assert keys.secret("team/a") == "a-secret" and keys.names() == ["team/a"]  # the bad one logged and skipped
    del table.values[cluster_key_tail("team/a")]
    table.changes += 1
    assert keys.secret("team/a") is None
    with pytest.raises(RuntimeError, match="cluster"):
        keys.set("x", "y")
    assert read_access_keys(access_keys_path(tmp_path)) == {"local": "local-secret"}  # the file is left as it was


def test_cli_refuses_an_unreachable_cluster_for_access_keys(capsys) -> None:
    port = free_port()  # nothing listens there
    assert main(["users", "list-rocketmq", "--cluster", f"etcd://127.0.0.1:{port}"]) == 1
    assert "cannot reach etcd" in capsys.readouterr().err
