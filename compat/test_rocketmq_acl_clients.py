"""ali-ons (pure-JS RocketMQ 4.x client, which signs every request with its accessKey / secretKey) against one
`mqk serve` with the ACL authorizer on: RocketMQ's plain ACL (mqk.server.native.acl) over Kafka's ACLs.

A user whose access key was added with `mqk users add-rocketmq` (while the broker runs) and who is allowed WRITE and
READ on its topic and READ on its group produces and consumes through a push consumer; without READ on the group
its consumer gets nothing. The same user with a wrong secret, an unknown access key, and a user allowed only READ
on the topic cannot send: the producer fails and nothing is written. Setup goes through the PLAINTEXT Kafka
listener, whose ANONYMOUS principal is a super user here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from compat_helpers import JS_DIR, NodeProcess, end_offsets, hostport, node_command, node_env, run_node, unique
from helpers import wait_until

from mqk.testing import BrokerProcess

pytestmark = pytest.mark.timeout(120)


def mqk(*args: str, stdin: str | None = None) -> None:
    done = subprocess.run([sys.executable, "-m", "mqk", *args], input=stdin, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


class RocketAclBroker:
    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.namesrv = hostport(broker.namesrv_address)

    def access_key(self, name: str, secret: str) -> None:
        mqk("users", "add-rocketmq", name, "--secret-stdin", "--data-dir", str(self.broker.data_dir), stdin=secret)

    def allow(self, principal: str, *args: str) -> None:
        mqk("acls", "add", "--allow-principal", principal, *args, "--bootstrap", self.broker.bootstrap)

    def create_topic(self, name: str) -> None:
        mqk("topics", "create", name, "--partitions", "2", "--bootstrap", self.broker.bootstrap)

    def end_offsets(self, topic: str) -> int:
        """Records in all of the topic's partitions."""
        offsets = end_offsets(self.broker.kafka_address, topic, (0, 1))
        assert min(offsets) >= 0, offsets
        return sum(offsets)


@pytest.fixture(scope="module")
def rocket_acl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RocketAclBroker]:
    directory = tmp_path_factory.mktemp("mqk-rocketmq-acls")
    config = directory / "broker.toml"
    config.write_text('authorizer = true\nsuper_users = "User:ANONYMOUS"\n')
    broker = BrokerProcess(directory / "data", storage="memory", extra_args=("--config", str(config))).start()
    try:
        yield RocketAclBroker(broker)
    finally:
        broker.stop()


def ons_produce(namesrv: str, topic: str, bodies: list[str], **keys: str) -> subprocess.CompletedProcess[str]:
    messages = [{"topic": topic, "tags": "T", "body": body} for body in bodies]
    return subprocess.run(
        node_command("ons.js", namesrv, "produce", json.dumps({"messages": messages, **keys})),
        cwd=JS_DIR,
        env=node_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_signed_producer_and_consumer_with_acls_work(rocket_acl: RocketAclBroker) -> None:
    topic, group, name = unique("racl"), unique("racl-g"), unique("ralice")
    rocket_acl.create_topic(topic)
    rocket_acl.access_key(name, "alice-secret")
    rocket_acl.allow(f"User:{name}", "--operation", "WRITE", "--operation", "READ", "--topic", topic)
    rocket_acl.allow(f"User:{name}", "--operation", "READ", "--group", group)
    keys = {"accessKey": name, "secretKey": "alice-secret"}
    sent = run_node(
        "ons.js",
        rocket_acl.namesrv,
        "produce",
        json.dumps({"messages": [{"topic": topic, "body": f"m{i}"} for i in range(4)], **keys}),
    )["result"]
    assert [r["sendStatus"] for r in sent] == ["SEND_OK"] * 4
    consumer = NodeProcess(
        "ons.js", rocket_acl.namesrv, "consume", json.dumps({"topic": topic, "group": group, **keys})
    )
    try:
        wait_until(
            lambda: sorted(m["body"] for m in consumer.of("msg")) == [f"m{i}" for i in range(4)],
            40,
            f"the signed consumer to get every message ({consumer.diagnostics()})",
        )
    finally:
        consumer.close()


def test_a_consumer_without_read_on_its_group_gets_nothing(rocket_acl: RocketAclBroker) -> None:
    topic, group, name = unique("racl-c"), unique("racl-cg"), unique("rcarol")
    rocket_acl.create_topic(topic)
    rocket_acl.access_key(name, "carol-secret")
    rocket_acl.allow(f"User:{name}", "--operation", "WRITE", "--operation", "READ", "--topic", topic)
    keys = {"accessKey": name, "secretKey": "carol-secret"}
    sent = run_node(
        "ons.js", rocket_acl.namesrv, "produce", json.dumps({"messages": [{"topic": topic, "body": "kept"}], **keys})
    )["result"]
    assert [r["sendStatus"] for r in sent] == ["SEND_OK"]
    consumer = NodeProcess(
        "ons.js", rocket_acl.namesrv, "consume", json.dumps({"topic": topic, "group": group, **keys})
    )
    try:
        refused = f"User:{name} is not allowed READ on GROUP {group}"
        wait_until(
            lambda: refused in rocket_acl.broker.log_path.read_text(errors="replace"),
            30,
            f"the broker to refuse the consumer's group ({consumer.diagnostics()})",
        )
        assert consumer.of("msg") == []
    finally:
        consumer.close()


@pytest.mark.parametrize("case", ["wrong secret", "unknown key", "no WRITE"])
def test_a_refused_producer_writes_nothing(rocket_acl: RocketAclBroker, case: str) -> None:
    topic, name = unique("racl-no"), unique("rbob")
    rocket_acl.create_topic(topic)
    rocket_acl.access_key(name, "bob-secret")
    rocket_acl.allow(f"User:{name}", "--operation", "READ", "--topic", topic)
    if case != "no WRITE":
        rocket_acl.allow(f"User:{name}", "--operation", "WRITE", "--topic", topic)
    unknown = unique("nobody")
    keys, why = {
        "wrong secret": (
            {"accessKey": name, "secretKey": "not-the-secret"},
            f"Check signature failed for accessKey={name}",
        ),
        "unknown key": ({"accessKey": unknown, "secretKey": "bob-secret"}, f"unknown AccessKey {unknown}"),
        "no WRITE": (
            {"accessKey": name, "secretKey": "bob-secret"},
            f"User:{name} is not allowed WRITE on TOPIC {topic}",
        ),
    }[case]
    done = ons_produce(rocket_acl.namesrv, topic, ["refused"], **keys)
    # ali-ons keeps the broker's remark to itself (it retries, then gives up); the broker's log says why
    assert done.returncode != 0 and "FAILED" in done.stderr, (done.stdout, done.stderr[-3000:])
    assert rocket_acl.end_offsets(topic) == 0
    log = rocket_acl.broker.log_path.read_text(errors="replace")
    assert "NO_PERMISSION for request code 310" in log and why in log, log[-3000:]
