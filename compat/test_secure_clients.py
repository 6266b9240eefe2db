"""Real clients over TLS and SASL against one `mqk serve` process with every kind of listener: SASL_SSL (SCRAM-SHA-512
and SCRAM-SHA-256), SASL_PLAINTEXT (PLAIN), and SSL with client certificates required. Each client
(confluent-kafka, kafka-python, aiokafka, kafkajs, Debian's kcat) writes and reads back through each; then each is
refused with a wrong password, an unknown user, an expired client certificate and one from a CA the broker does not
trust, with nothing written. Users are added with `mqk users add` through the unnamed PLAINTEXT listener.

Debian's kcat runs librdkafka 2.0, whose SCRAM client-final message repeats the client nonce (fixed in librdkafka
2.6.1; Kafka 3.8.1 accepted it): its SCRAM tests are the proof that mqk accepts it too.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compat_helpers import end_offsets, hostport, run_node, unique
from helpers import wait_until
from pki import make_pki

from mqk.testing import BrokerProcess

USER, PASSWORD = "alice", "alice-secret"
N = 3

#: (mode, listener, security protocol, SASL mechanism or None for a client certificate)
MODES = {
    "scram512": ("SS", "SASL_SSL", "SCRAM-SHA-512"),
    "scram256": ("SS", "SASL_SSL", "SCRAM-SHA-256"),
    "plain": ("SP", "SASL_PLAINTEXT", "PLAIN"),
    "mtls": ("SSL", "SSL", None),
}
#: (case, mode, user, password, client certificate: "good", "expired", "rogue")
REFUSALS = {
    "wrong-password": ("scram512", USER, "not-the-password", "good"),
    "unknown-user": ("plain", "mallory", PASSWORD, "good"),
    "expired-certificate": ("mtls", None, None, "expired"),
    "foreign-certificate": ("mtls", None, None, "rogue"),
}


class Secure:
    """The module's broker and what a client needs to reach each listener."""

    def __init__(self, broker: Any, pki: Any) -> None:
        self.broker = broker
        self.pki = pki

    def address(self, listener: str) -> str:
        return hostport(self.broker.listeners[listener])

    def settings(self, mode: str, user: str | None = USER, password: str | None = PASSWORD, cert: str = "good"):
        listener, protocol, mechanism = MODES[mode]
        files = {"good": self.pki.client("carol"), "expired": self.pki.expired_client, "rogue": self.pki.rogue_client}
        return {
            "bootstrap": self.address(listener),
            "protocol": protocol,
            "mechanism": mechanism,
            "user": user,
            "password": password,
            "ca": str(self.pki.ca),
            "cert": None if mechanism else tuple(str(f) for f in files[cert]),
        }

    def end_offset(self, topic: str) -> int:
        """The topic's partition 0 end offset through the PLAINTEXT listener (-1: no such topic)."""
        return end_offsets(self.broker.kafka_address, topic)[0]


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    directory = tmp_path_factory.mktemp("mqk-secure")
    pki = make_pki(directory / "pki")
    config = directory / "broker.toml"
    config.write_text(
        'listeners = ["SSL=SSL://127.0.0.1:0", "SP=SASL_PLAINTEXT://127.0.0.1:0", "SS=SASL_SSL://127.0.0.1:0"]\n'
        # failures are delayed, but not so long that this module's refusals add up
        "auth_failure_delay_ms = 20\nauth_failure_delay_max_ms = 200\n"
        f'[tls]\ncert_file = "{pki.server}"\nkey_file = "{pki.server_key}"\nca_file = "{pki.ca}"\n'
        'client_auth = "required"\n'
    )
    broker = BrokerProcess(directory / "data", storage="memory", extra_args=("--config", str(config))).start()
    try:
        added = subprocess.run(
            [sys.executable, "-m", "mqk", "users", "add", USER, "--password-stdin", "--bootstrap", broker.bootstrap],
            input=PASSWORD + "\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert added.returncode == 0, added.stderr
        yield Secure(broker, pki)
    finally:
        broker.stop()


# --- one function per client: write N values and read them back; or be refused ------------------------------


def librdkafka_config(s: dict) -> dict:
    conf = {"bootstrap.servers": s["bootstrap"], "security.protocol": s["protocol"], "ssl.ca.location": s["ca"]}
    if s["mechanism"]:
        conf.update({"sasl.mechanisms": s["mechanism"], "sasl.username": s["user"], "sasl.password": s["password"]})
    else:
        conf.update({"ssl.certificate.location": s["cert"][0], "ssl.key.location": s["cert"][1]})
    return conf


def confluent_roundtrip(s: dict, topic: str) -> list[bytes]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer(librdkafka_config(s))
    for i in range(N):
        producer.produce(topic, f"confluent-{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({**librdkafka_config(s), "group.id": topic, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < N and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got.append(msg.value())
    consumer.close()
    return got


def confluent_refused(s: dict, topic: str) -> str:
    from confluent_kafka import KafkaError, Producer

    errors: list[Any] = []
    producer = Producer({**librdkafka_config(s), "error_cb": errors.append, "message.timeout.ms": 10000})
    producer.produce(topic, b"must not land", partition=0)
    deadline = time.monotonic() + 15
    while not errors and time.monotonic() < deadline:  # the refusal arrives as an error event
        producer.poll(0.1)
    producer.purge()
    producer.flush(5)
    codes = {e.code() for e in errors}
    assert codes & {KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}
    return str(errors[0])


def kafka_python_config(s: dict) -> dict:
    conf: dict[str, Any] = {
        "bootstrap_servers": s["bootstrap"],
        "security_protocol": s["protocol"],
        "ssl_cafile": s["ca"],
        "request_timeout_ms": 10000,
    }
    if s["mechanism"]:
        conf.update(sasl_mechanism=s["mechanism"], sasl_plain_username=s["user"], sasl_plain_password=s["password"])
    else:
        conf.update(ssl_certfile=s["cert"][0], ssl_keyfile=s["cert"][1])
    return conf


def kafka_python_roundtrip(s: dict, topic: str) -> list[bytes]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(acks="all", **kafka_python_config(s))
    for i in range(N):
        producer.send(topic, f"kafka-python-{i}".encode(), partition=0).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(enable_auto_commit=False, consumer_timeout_ms=10000, **kafka_python_config(s))
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    got = [m.value for _, m in zip(range(N), consumer)]
    consumer.close()
    return got


def kafka_python_refused(s: dict, topic: str) -> str:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    with pytest.raises((KafkaError, OSError)) as info:
        producer = KafkaProducer(**kafka_python_config(s), max_block_ms=3000, bootstrap_timeout_ms=3000)
        try:
            producer.send(topic, b"must not land", partition=0).get(timeout=10)
        finally:
            producer.close(timeout=5)
    return repr(info.value)


def aiokafka_config(s: dict) -> dict:
    from aiokafka.helpers import create_ssl_context

    conf: dict[str, Any] = {"bootstrap_servers": s["bootstrap"], "security_protocol": s["protocol"]}
    if s["protocol"] in ("SSL", "SASL_SSL"):
        certs = {"certfile": s["cert"][0], "keyfile": s["cert"][1]} if s["cert"] else {}
        conf["ssl_context"] = create_ssl_context(cafile=s["ca"], **certs)
    if s["mechanism"]:
        conf.update(sasl_mechanism=s["mechanism"], sasl_plain_username=s["user"], sasl_plain_password=s["password"])
    return conf


def aiokafka_roundtrip(s: dict, topic: str) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(acks="all", **aiokafka_config(s))
        await producer.start()
        try:
            for i in range(N):
                await producer.send_and_wait(topic, f"aiokafka-{i}".encode(), partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(enable_auto_commit=False, **aiokafka_config(s))
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            await consumer.seek_to_beginning()
            got: list[bytes] = []
            while len(got) < N:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 30)
                got += [m.value for msgs in batch.values() for m in msgs]
            return got
        finally:
            await consumer.stop()

    return asyncio.run(run())


def aiokafka_refused(s: dict, topic: str) -> str:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    async def run() -> None:
        producer = AIOKafkaProducer(request_timeout_ms=10000, **aiokafka_config(s))
        try:
            await producer.start()
            await producer.send_and_wait(topic, b"must not land", partition=0)
        finally:
            await producer.stop()

    with pytest.raises((KafkaError, OSError)) as info:
        asyncio.run(run())
    return repr(info.value)


def kafkajs_security(s: dict) -> dict:
    security: dict[str, Any] = {}
    if s["protocol"] in ("SSL", "SASL_SSL"):
        security["ssl"] = {"ca": s["ca"], **({"cert": s["cert"][0], "key": s["cert"][1]} if s["cert"] else {})}
    if s["mechanism"]:
        security["sasl"] = {"mechanism": s["mechanism"].lower(), "username": s["user"], "password": s["password"]}
    return security


def kafkajs_roundtrip(s: dict, topic: str) -> list[bytes]:
    import json

    options = json.dumps({"topic": topic, "n": N, "security": kafkajs_security(s)})
    out = run_node("kafkajs_secure.js", s["bootstrap"], "roundtrip", options)
    return [v.encode() for v in out["result"]["got"]]


def kafkajs_refused(s: dict, topic: str) -> str:
    import json

    options = json.dumps({"topic": topic, "security": kafkajs_security(s), "retries": 0})
    result = run_node("kafkajs_secure.js", s["bootstrap"], "refused", options)["result"]
    assert result["refused"], result
    return f"{result['name']}: {result['message']}"


def kcat_args(s: dict) -> list[str]:
    args = ["-b", s["bootstrap"], "-X", f"security.protocol={s['protocol']}", "-X", f"ssl.ca.location={s['ca']}"]
    if s["mechanism"]:
        args += ["-X", f"sasl.mechanisms={s['mechanism']}", "-X", f"sasl.username={s['user']}"]
        args += ["-X", f"sasl.password={s['password']}"]
    else:
        args += ["-X", f"ssl.certificate.location={s['cert'][0]}", "-X", f"ssl.key.location={s['cert'][1]}"]
    return args


def kcat_roundtrip(s: dict, topic: str, kcat: str) -> list[bytes]:
    values = "".join(f"kcat-{i}\n" for i in range(N))
    produced = subprocess.run(
        [kcat, *kcat_args(s), "-P", "-t", topic, "-p", "0"], input=values, capture_output=True, text=True, timeout=60
    )
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(
        [kcat, *kcat_args(s), "-C", "-t", topic, "-p", "0", "-o", "beginning", "-c", str(N), "-e"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert consumed.returncode == 0, consumed.stderr
    return [line.encode() for line in consumed.stdout.splitlines()]


def kcat_refused(s: dict, topic: str, kcat: str) -> str:
    done = subprocess.run(
        [kcat, *kcat_args(s), "-P", "-t", topic, "-p", "0", "-X", "message.timeout.ms=5000"],
        input="must not land\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 or "failed" in done.stderr.lower(), done.stderr
    return done.stderr


CLIENTS = ("confluent", "kafka-python", "aiokafka", "kafkajs", "kcat")
ROUNDTRIP = {
    "confluent": confluent_roundtrip,
    "kafka-python": kafka_python_roundtrip,
    "aiokafka": aiokafka_roundtrip,
    "kafkajs": kafkajs_roundtrip,
}
REFUSED = {
    "confluent": confluent_refused,
    "kafka-python": kafka_python_refused,
    "aiokafka": aiokafka_refused,
    "kafkajs": kafkajs_refused,
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("client", CLIENTS)
def test_client_writes_and_reads_back(secure: Secure, client: str, mode: str, request: pytest.FixtureRequest) -> None:
    topic = unique(f"sec-{client}-{mode}")
    s = secure.settings(mode)
    got = kcat_roundtrip(s, topic, request.getfixturevalue("kcat")) if client == "kcat" else ROUNDTRIP[client](s, topic)
    prefix = {"confluent": "confluent", "kcat": "kcat"}.get(client, client)
    assert got == [f"{prefix}-{i}".encode() for i in range(N)]
    assert secure.end_offset(topic) == N


@pytest.mark.parametrize("case", list(REFUSALS))
@pytest.mark.parametrize("client", CLIENTS)
# aiokafka leaves the transport of a refused TLS handshake for the garbage collector to report (its leak, not mqk's)
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <function _SelectorTransport.__del__:pytest.PytestUnraisableExceptionWarning"
)
def test_client_is_refused_and_nothing_is_written(
    secure: Secure, client: str, case: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    mode, user, password, cert = REFUSALS[case]
    topic = unique(f"sec-no-{client}-{case}")
    s = secure.settings(mode, user, password, cert)
    handshakes_refused = secure.broker.log_text().count("TLS handshake failed")
    why = kcat_refused(s, topic, request.getfixturevalue("kcat")) if client == "kcat" else REFUSED[client](s, topic)
    if MODES[mode][2]:
        # the client was told why: SASL_AUTHENTICATION_FAILED (the Python clients retry, then raise a generic
        # error; the answer they got is in their log)
        assert "uthentication failed" in why + caplog.text, why
    else:
        # the broker refused the certificate in the handshake, and said why in its log
        wait_until(
            lambda: secure.broker.log_text().count("TLS handshake failed") > handshakes_refused,
            what="the broker's log line",
        )
        refusals = [line for line in secure.broker.log_text().splitlines() if "TLS handshake failed" in line]
        expected = "certificate has expired" if case == "expired-certificate" else "unable to get local issuer"
        assert any(expected in line for line in refusals), refusals[-3:]
    assert secure.end_offset(topic) == -1  # nothing created, nothing written


def test_kcat_scram_against_the_exchange_it_sends(secure: Secure, kcat: str, tmp_path: Path) -> None:
    """Debian's kcat (librdkafka 2.0) authenticates with SCRAM-SHA-256 and SCRAM-SHA-512: its client-final message
    carries the repeated client nonce, which the broker accepts (the roundtrip tests write through it)."""
    version = subprocess.run([kcat, "-V"], capture_output=True, text=True, timeout=10).stdout
    for mode in ("scram256", "scram512"):
        listed = subprocess.run(
            [kcat, *kcat_args(secure.settings(mode)), "-L", "-J"], capture_output=True, text=True, timeout=30
        )
        assert listed.returncode == 0 and '"brokers"' in listed.stdout, (version, listed.stderr)
