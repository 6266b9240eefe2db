"""Real clients against ACLs: one `mqk serve` process with the ACL authorizer on and a SASL_PLAINTEXT listener.

Each client (confluent-kafka, kafka-python, aiokafka, kafkajs) authenticates as a user allowed to WRITE and READ its
own topic and to READ its own group, and nothing else. It writes and reads back through that group; writing another
topic is TOPIC_AUTHORIZATION_FAILED (nothing written), joining another group GROUP_AUTHORIZATION_FAILED, creating a
topic TOPIC_AUTHORIZATION_FAILED, and a metadata listing does not show the topics it may not describe. PREFIXED
patterns with a DENY that beats the ALLOW, and the super user, are checked with confluent-kafka.

Setup goes through the loopback PLAINTEXT listener, whose ANONYMOUS principal is a super user here (the bootstrap
docs/security.md describes): `mqk users add` and `mqk acls add`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from compat_helpers import end_offsets, hostport, run_node, unique

from mqk.testing import BrokerProcess

PASSWORD = "acl-secret"
N = 3
TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED = 29, 30


def mqk(*args: str, stdin: str | None = None) -> None:
    done = subprocess.run([sys.executable, "-m", "mqk", *args], input=stdin, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


class AclBroker:
    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.sasl = hostport(broker.listeners["SP"])

    def user(self, name: str) -> dict[str, str]:
        """A user with the password PASSWORD (added through the PLAINTEXT listener)."""
        mqk("users", "add", name, "--password-stdin", "--bootstrap", self.broker.bootstrap, stdin=PASSWORD + "\n")
        return {"bootstrap": self.sasl, "user": name, "password": PASSWORD}

    def allow(self, principal: str, *args: str) -> None:
        mqk("acls", "add", "--allow-principal", principal, *args, "--bootstrap", self.broker.bootstrap)

    def deny(self, principal: str, *args: str) -> None:
        mqk("acls", "add", "--deny-principal", principal, *args, "--bootstrap", self.broker.bootstrap)

    def create_topic(self, name: str) -> None:
        mqk("topics", "create", name, "--bootstrap", self.broker.bootstrap)

    def end_offset(self, topic: str) -> int:
        return end_offsets(self.broker.kafka_address, topic)[0]


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclBroker]:
    directory = tmp_path_factory.mktemp("mqk-acls")
    config = directory / "broker.toml"
    config.write_text(
        'listeners = ["SP=SASL_PLAINTEXT://127.0.0.1:0"]\n'
        "authorizer = true\n"
        'super_users = "User:admin;User:ANONYMOUS"\n'
        "auth_failure_delay_ms = 20\nauth_failure_delay_max_ms = 200\n"
    )
    broker = BrokerProcess(directory / "data", storage="memory", extra_args=("--config", str(config))).start()
    try:
        yield AclBroker(broker)
    finally:
        broker.stop()


class Case:
    """A user allowed exactly: WRITE and READ `topic`, READ `group`; `other` exists and is not theirs."""

    def __init__(self, acl_broker: AclBroker, client: str) -> None:
        self.topic, self.other = unique(f"acl-{client}"), unique(f"acl-{client}-other")
        self.group, self.other_group = unique(f"acl-{client}-g"), unique(f"acl-{client}-h")
        self.new_topic = unique(f"acl-{client}-new")
        name = unique(f"user-{client}")
        self.s = acl_broker.user(name)
        principal = f"User:{name}"
        acl_broker.create_topic(self.topic)
        acl_broker.create_topic(self.other)
        acl_broker.allow(principal, "--operation", "WRITE", "--operation", "READ", "--topic", self.topic)
        acl_broker.allow(principal, "--operation", "READ", "--group", self.group)


# --- one function per client; each returns what happened, as Kafka error codes -------------------------------


def librdkafka_config(s: dict) -> dict:
    return {
        "bootstrap.servers": s["bootstrap"],
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": s["user"],
        "sasl.password": s["password"],
    }


def confluent_case(c: Case) -> dict[str, Any]:
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    out: dict[str, Any] = {}
    reports: list[Any] = []
    producer = Producer({**librdkafka_config(c.s), "message.timeout.ms": 15000})
    for i in range(N):
        producer.produce(c.topic, f"v-{i}".encode(), partition=0, on_delivery=lambda err, _m: reports.append(err))
    producer.produce(c.other, b"must not land", partition=0, on_delivery=lambda err, _m: reports.append(err))
    producer.flush(30)
    out["produced"] = sum(1 for err in reports if err is None)
    out["denied_topic"] = next(err.code() for err in reports if err is not None)

    def consume(group: str) -> tuple[list[bytes], int | None]:
        consumer = Consumer(
            {**librdkafka_config(c.s), "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}
        )
        consumer.subscribe([c.topic])
        got: list[bytes] = []
        error = None
        deadline = time.monotonic() + 30
        while len(got) < N and error is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                error = msg.error().code()
            else:
                got.append(msg.value())
        if got:
            consumer.commit(asynchronous=False)
        consumer.close()
        return got, error

    out["consumed"], _error = consume(c.group)
    _got, out["denied_group"] = consume(c.other_group)
    admin = AdminClient(librdkafka_config(c.s))
    future = admin.create_topics([NewTopic(c.new_topic, 1, 1)], operation_timeout=10)[c.new_topic]
    try:
        future.result(timeout=15)
        out["create_topic"] = 0
    except KafkaException as exc:
        out["create_topic"] = exc.args[0].code()
    out["listed"] = sorted(admin.list_topics(timeout=10).topics)
    return out


def kafka_python_config(s: dict) -> dict:
    return {
        "bootstrap_servers": s["bootstrap"],
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": s["user"],
        "sasl_plain_password": s["password"],
        "request_timeout_ms": 10000,
    }


def kafka_python_case(c: Case) -> dict[str, Any]:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError

    out: dict[str, Any] = {}
    producer = KafkaProducer(acks="all", max_block_ms=10000, **kafka_python_config(c.s))
    for i in range(N):
        producer.send(c.topic, f"v-{i}".encode(), partition=0).get(timeout=30)
    out["produced"] = N
    try:
        producer.send(c.other, b"must not land", partition=0).get(timeout=30)
        out["denied_topic"] = 0
    except KafkaError as exc:
        out["denied_topic"] = getattr(exc, "errno", repr(exc))
    producer.close(timeout=5)

    def consume(group: str) -> tuple[list[bytes], Any]:
        consumer = KafkaConsumer(
            group_id=group, auto_offset_reset="earliest", enable_auto_commit=False, **kafka_python_config(c.s)
        )
        got: list[bytes] = []
        try:
            consumer.subscribe([c.topic])
            deadline = time.monotonic() + 30
            while len(got) < N and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500).values():
                    got += [r.value for r in records]
            consumer.commit()
            return got, None
        except KafkaError as exc:
            return got, getattr(exc, "errno", repr(exc))
        finally:
            consumer.close()

    out["consumed"], _error = consume(c.group)
    _got, out["denied_group"] = consume(c.other_group)
    admin = KafkaAdminClient(**kafka_python_config(c.s))
    try:
        answer = admin.create_topics([NewTopic(c.new_topic, 1, 1)])
        codes = [t[1] for t in getattr(answer, "topic_errors", ())]
        out["create_topic"] = codes[0] if codes else 0
    except KafkaError as exc:
        out["create_topic"] = getattr(exc, "errno", repr(exc))
    out["listed"] = sorted(admin.list_topics())
    admin.close()
    return out


def aiokafka_config(s: dict) -> dict:
    return {
        "bootstrap_servers": s["bootstrap"],
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": s["user"],
        "sasl_plain_password": s["password"],
    }


def aiokafka_case(c: Case) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        producer = AIOKafkaProducer(acks="all", request_timeout_ms=10000, **aiokafka_config(c.s))
        await producer.start()
        try:
            for i in range(N):
                await producer.send_and_wait(c.topic, f"v-{i}".encode(), partition=0)
            out["produced"] = N
            try:
                await producer.send_and_wait(c.other, b"must not land", partition=0)
                out["denied_topic"] = 0
            except KafkaError as exc:
                out["denied_topic"] = getattr(exc, "errno", repr(exc))
        finally:
            await producer.stop()

        async def consume(group: str) -> tuple[list[bytes], Any]:
            consumer = AIOKafkaConsumer(
                c.topic,
                group_id=group,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                **aiokafka_config(c.s),
            )
            got: list[bytes] = []
            try:
                await consumer.start()
                deadline = time.monotonic() + 30
                while len(got) < N and time.monotonic() < deadline:
                    batch = await consumer.getmany(timeout_ms=500)
                    got += [m.value for msgs in batch.values() for m in msgs]
                await consumer.commit()
                return got, None
            except KafkaError as exc:
                return got, getattr(exc, "errno", repr(exc))
            finally:
                await consumer.stop()

        out["consumed"], _error = await consume(c.group)
        _got, out["denied_group"] = await consume(c.other_group)
        admin = AIOKafkaAdminClient(**aiokafka_config(c.s))
        await admin.start()
        try:
            try:
                answer = await admin.create_topics([NewTopic(c.new_topic, 1, 1)])
                codes = [t[1] for t in getattr(answer, "topic_errors", ())]
                out["create_topic"] = codes[0] if codes else 0
            except KafkaError as exc:
                out["create_topic"] = getattr(exc, "errno", repr(exc))
            out["listed"] = sorted(await admin.list_topics())
        finally:
            await admin.close()
        return out

    return asyncio.run(run())


def kafkajs_case(c: Case) -> dict[str, Any]:
    options = {
        "topic": c.topic,
        "other": c.other,
        "group": c.group,
        "otherGroup": c.other_group,
        "newTopic": c.new_topic,
        "n": N,
        "security": {"sasl": {"mechanism": "scram-sha-512", "username": c.s["user"], "password": c.s["password"]}},
    }
    return run_node("kafkajs_secure.js", c.s["bootstrap"], "acl", json.dumps(options), timeout=120)["result"]


CASES = {
    "confluent": confluent_case,
    "kafka-python": kafka_python_case,
    "aiokafka": aiokafka_case,
    "kafkajs": kafkajs_case,
}


@pytest.mark.parametrize("client", list(CASES))
def test_a_user_does_exactly_what_its_acls_allow(acl_broker: AclBroker, client: str) -> None:
    c = Case(acl_broker, client)
    out = CASES[client](c)
    assert out["produced"] == N
    assert out["consumed"] == [f"v-{i}".encode() if client != "kafkajs" else f"v-{i}" for i in range(N)]
    assert out["denied_topic"] == TOPIC_AUTHORIZATION_FAILED, out
    assert out["denied_group"] == GROUP_AUTHORIZATION_FAILED, out
    assert out["create_topic"] == TOPIC_AUTHORIZATION_FAILED, out
    assert c.topic in out["listed"] and c.other not in out["listed"], out["listed"]
    assert acl_broker.end_offset(c.other) == 0  # nothing written where it may not write
    assert acl_broker.end_offset(c.new_topic) == -1  # nothing created


def test_prefixed_patterns_deny_over_allow_and_the_super_user(acl_broker: AclBroker) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    prefix = unique("acl-pfx") + "-"
    s = acl_broker.user(unique("user-prefixed"))
    principal = f"User:{s['user']}"
    acl_broker.allow(principal, "--operation", "ALL", "--topic", prefix, "--resource-pattern-type", "PREFIXED")
    acl_broker.deny(principal, "--operation", "WRITE", "--topic", prefix + "secret")
    # the super user creates topics and writes anywhere, with no ACL of its own
    admin_s = acl_broker.user("admin")
    admin = AdminClient(librdkafka_config(admin_s))
    names = [prefix + "open", prefix + "secret"]
    for future in admin.create_topics([NewTopic(n, 1, 1) for n in names], operation_timeout=10).values():
        future.result(timeout=15)

    def produce(settings: dict, topic: str) -> int:
        reports: list[Any] = []
        producer = Producer({**librdkafka_config(settings), "message.timeout.ms": 15000})
        producer.produce(topic, b"x", partition=0, on_delivery=lambda err, _m: reports.append(err))
        producer.flush(30)
        return 0 if reports[0] is None else reports[0].code()

    assert produce(s, prefix + "open") == 0
    assert produce(s, prefix + "secret") == TOPIC_AUTHORIZATION_FAILED
    assert produce(admin_s, prefix + "secret") == 0
    assert acl_broker.end_offset(prefix + "secret") == 1  # the super user's record only
    # a prefixed ALL includes CREATE: auto-creation under the prefix is allowed
    assert produce(s, prefix + "auto") == 0
    listed = set(AdminClient(librdkafka_config(s)).list_topics(timeout=10).topics)
    assert {prefix + "open", prefix + "secret", prefix + "auto"} <= listed
    assert not any(name.startswith("acl-") and not name.startswith(prefix) for name in listed), listed
