"""Security over real sockets, one broker for the module with every kind of listener: the unnamed PLAINTEXT one,
SSL with client certificates required, SASL_PLAINTEXT and SASL_SSL, and TLS on the RocketMQ listener and name server.

What each client may do before and after authenticating, what a failure costs, the SCRAM user APIs, the principal the
authorizer hook is asked about, per-listener addresses in the answers, and the `mqk users` verb. Refusals are checked
to leave nothing written. Real third-party clients are in compat/test_secure_clients.py."""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fetch_body, produce_body, values_of, wait_until_async
from pki import make_pki

from mqk import errors as E
from mqk.broker.security.principal import Principal
from mqk.broker.security.scram import MECHANISMS, SCRAM_SHA_256, ScramClient, salt_password
from mqk.client import MessageQueue, Producer, PullConsumer
from mqk.config import BrokerConfig, ListenerConfig, StoreConfig, TlsConfig
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient, client_ssl_context, make_batch
from mqk.testing import ThreadedBroker

ANY = ("127.0.0.1", 0)
PASSWORD = {"alice": "alice-secret", "bob": "bob-secret"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def security_config(pki, **kw) -> BrokerConfig:
    listeners = ("SSL=SSL://127.0.0.1:0", "SP=SASL_PLAINTEXT://127.0.0.1:0", "SS=SASL_SSL://127.0.0.1:0")
    defaults = {
        "kafka_listen": ANY,
        "native_listen": ANY,
        "namesrv_listen": ANY,
        "admin_listen": ANY,
        "listeners": tuple(ListenerConfig.parse(spec) for spec in listeners),
        "tls": TlsConfig(cert_file=pki.server, key_file=pki.server_key, ca_file=pki.ca, client_auth="required"),
        "native_tls": True,
        "namesrv_tls": True,
        "auth_failure_delay_ms": 10,
        "auth_failure_delay_max_ms": 40,
        "store": StoreConfig(storage="memory"),
    }
    defaults.update(kw)
    return BrokerConfig(**defaults)


def upsertion(name: str, password: str, mechanism: str, iterations: int = 4096) -> dict:
    scram = MECHANISMS[mechanism]
    salt, salted = salt_password(scram, password, iterations)
    return {
        "name": name,
        "mechanism": scram.kafka_type,
        "iterations": iterations,
        "salt": salt,
        "salted_password": salted,
    }


async def add_users(address) -> None:
    async with await RawKafkaClient.connect(*address) as admin:
        answer = await admin.call(
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
            0,
            {
                "deletions": [],
                "upsertions": [
                    upsertion("alice", PASSWORD["alice"], "SCRAM-SHA-256"),
                    upsertion("alice", PASSWORD["alice"], "SCRAM-SHA-512"),
                    upsertion("bob", PASSWORD["bob"], "SCRAM-SHA-256"),
                ],
            },
        )
    assert [(r["user"], r["error_code"]) for r in answer["results"]] == [("alice", 0), ("bob", 0)]


@pytest.fixture(scope="module")
def broker(pki):
    b = ThreadedBroker(security_config(pki)).start()
    asyncio.run(add_users(b.kafka_address))
    yield b
    b.stop()


@pytest.fixture
def security(broker):
    security = broker.runtime.kafka.ctx.security
    yield security
    security.authorizer = type(security.authorizer)()  # whatever a test installed goes


class Recorder:
    """An authorizer that records what it is asked and answers `allow`."""

    def __init__(self, allow: bool = True) -> None:
        self.allow = allow
        self.asked: list[tuple] = []

    def authorize(self, principal, host, operation, resource_type, resource_name) -> bool:
        self.asked.append((principal, host, operation, resource_type, resource_name))
        return self.allow


async def connect(broker, pki, listener: str, cert: str | None = None, **kw) -> RawKafkaClient:
    address = broker.kafka_address if listener == "kafka" else broker.listeners[listener]
    context = None
    if listener in ("SSL", "SS"):
        files = pki.client(cert) if cert else ()
        context = client_ssl_context(str(pki.ca), *(str(f) for f in files))
    return await RawKafkaClient.connect(*address, ssl=context, **kw)


async def logged(caplog, text: str) -> str:
    """The first log line holding `text`, once the broker (on this loop or its own thread) has written it."""

    def line() -> str | None:
        return next((r.getMessage() for r in caplog.records if text in r.getMessage()), None)

    return await wait_until_async(line, 5, f"a log line with {text!r}")


def test_ready_line_ends_with_each_named_listener(broker):
    line = broker.runtime.ready_line()
    named = " ".join(f"kafka.{n}={h}:{p}" for n, (h, p) in broker.listeners.items())
    assert list(broker.listeners) == ["SSL", "SP", "SS"]
    assert line.startswith("mqk ready kafka=127.0.0.1:") and line.endswith(" " + named)


@pytest.mark.parametrize(("listener", "mechanism"), [("SP", "PLAIN"), ("SP", "SCRAM-SHA-256"), ("SS", "SCRAM-SHA-512")])
async def test_authenticated_clients_produce_and_fetch_and_are_told_their_listener(broker, pki, listener, mechanism):
    topic = f"sec-{listener}-{mechanism}"
    async with await connect(broker, pki, listener) as client:
        await client.authenticate(mechanism, "alice", PASSWORD["alice"])
        meta = await client.call(ApiKey.METADATA, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": True})
        host, port = broker.listeners[listener]
        assert meta["brokers"] == [{"node_id": 0, "host": host, "port": port, "rack": None}]
        coordinator = await client.call(ApiKey.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["g"]})
        assert (coordinator["coordinators"][0]["host"], coordinator["coordinators"][0]["port"]) == (host, port)
        cluster = await client.call(ApiKey.DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": False})
        assert cluster["brokers"][0]["port"] == port
        produced = await client.call(ApiKey.PRODUCE, 9, produce_body(topic, make_batch([b"one", b"two"])))
        assert produced["responses"][0]["partition_responses"][0]["error_code"] == 0
        fetched = await client.call(ApiKey.FETCH, 12, fetch_body(topic, 0))
        assert values_of(fetched["responses"][0]["partitions"][0]["records"]) == [b"one", b"two"]
        # the exchange is over: Kafka answers its APIs ILLEGAL_SASL_STATE now
        again = await client.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mechanism})
        assert again["error_code"] == E.IllegalSaslStateError.code
        token = await client.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": b"x"})
        assert token["error_code"] == E.IllegalSaslStateError.code


async def test_the_principal_is_the_sasl_user_or_the_certificate_user_or_anonymous(broker, pki, security):
    recorder = Recorder()
    security.authorizer = recorder
    describe = {"users": [{"name": "alice"}]}
    async with await connect(broker, pki, "SS") as client:
        await client.authenticate("SCRAM-SHA-256", "bob", PASSWORD["bob"])
        await client.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, describe)
    async with await connect(broker, pki, "SSL", cert="carol") as client:
        await client.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, describe)
    async with await connect(broker, pki, "kafka") as client:
        await client.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, describe)
    assert [(a[0], a[2], a[3], a[4]) for a in recorder.asked] == [
        (Principal("User", "bob"), "DESCRIBE", "CLUSTER", "kafka-cluster"),
        (Principal("User", "carol"), "DESCRIBE", "CLUSTER", "kafka-cluster"),
        (Principal("User", "ANONYMOUS"), "DESCRIBE", "CLUSTER", "kafka-cluster"),
    ]
    assert {a[1] for a in recorder.asked} == {"127.0.0.1"}


async def test_a_denying_authorizer_refuses_the_user_apis(broker, pki, security):
    security.authorizer = Recorder(allow=False)
    async with await connect(broker, pki, "kafka") as client:
        described = await client.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": None})
        assert described["error_code"] == E.ClusterAuthorizationFailedError.code and described["results"] == []
        altered = await client.call(
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
            0,
            {"deletions": [{"name": "alice", "mechanism": 1}], "upsertions": []},
        )
        assert altered["results"][0]["error_code"] == E.ClusterAuthorizationFailedError.code
    assert set(security.users.get("alice")) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}


async def test_before_authentication_only_the_exchange_is_served(broker, pki, caplog):
    async with await connect(broker, pki, "SP") as client:
        versions = await client.call(
            ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}
        )
        assert versions["error_code"] == 0 and ApiKey.SASL_AUTHENTICATE in {k["api_key"] for k in versions["api_keys"]}
        client.send(ApiKey.PRODUCE, 9, produce_body("sec-early", make_batch([b"sneaky"])))
        assert await client.closed_by_peer()
    assert "Produce request before authentication" in await logged(caplog, "before authentication")
    assert broker.store.topic("sec-early") is None  # nothing created, nothing written
    async with await connect(broker, pki, "SS") as client:
        assert (await client.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}))["error_code"] == 0
        client.send(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert await client.closed_by_peer()  # after the handshake only its tokens may come


async def test_an_unknown_mechanism_is_answered_with_the_enabled_ones_then_closed(broker, pki):
    async with await connect(broker, pki, "SP") as client:
        answer = await client.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "GSSAPI"})
        assert answer == {
            "error_code": E.UnsupportedSaslMechanismError.code,
            "mechanisms": ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"],
        }
        assert await client.closed_by_peer()


async def test_sasl_authenticate_before_a_handshake_closes(broker, pki):
    async with await connect(broker, pki, "SP") as client:
        client.send(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": b"\x00alice\x00alice-secret"})
        assert await client.closed_by_peer()


async def raw_token(client: RawKafkaClient, token: bytes) -> bytes:
    client.write_raw(struct.pack(">i", len(token)) + token)
    (size,) = struct.unpack(">i", await asyncio.wait_for(client.reader.readexactly(4), 10))
    return await asyncio.wait_for(client.reader.readexactly(size), 10)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_a_v0_handshake_takes_raw_tokens(broker, pki, mechanism):
    async with await connect(broker, pki, "SS") as client:
        assert (await client.call(ApiKey.SASL_HANDSHAKE, 0, {"mechanism": mechanism}))["error_code"] == 0
        if mechanism == "PLAIN":
            assert await raw_token(client, b"\x00alice\x00alice-secret") == b""
        else:
            scram = ScramClient(MECHANISMS[mechanism], "alice", PASSWORD["alice"])
            scram.verify(await raw_token(client, scram.final(await raw_token(client, scram.first()))))
        meta = await client.call(ApiKey.METADATA, 12, {"topics": None})
        assert meta["brokers"][0]["port"] == broker.listeners["SS"][1]


async def test_a_failed_raw_token_exchange_is_closed_without_an_answer(broker, pki):
    async with await connect(broker, pki, "SP") as client:
        assert (await client.call(ApiKey.SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"}))["error_code"] == 0
        token = b"\x00alice\x00wrong"
        client.write_raw(struct.pack(">i", len(token)) + token)
        assert await client.closed_by_peer()


@pytest.mark.parametrize(
    ("mechanism", "user", "password"),
    [
        ("SCRAM-SHA-512", "alice", "wrong"),
        ("SCRAM-SHA-256", "mallory", "anything"),
        ("SCRAM-SHA-512", "bob", PASSWORD["bob"]),  # bob has no SCRAM-SHA-512 credential
        ("PLAIN", "alice", "wrong"),
        ("PLAIN", "mallory", "anything"),
    ],
)
async def test_failed_authentication_is_answered_then_closed_and_later_ones_wait_longer(
    broker, pki, security, caplog, mechanism, user, password
):
    caplog.set_level(logging.INFO, "mqk.kafka")
    before = security.failures.failures("127.0.0.1")
    for attempt in (1, 2):
        async with await connect(broker, pki, "SS") as client:
            with pytest.raises(E.SaslAuthenticationFailedError, match=f"SASL mechanism {mechanism}"):
                await client.authenticate(mechanism, user, password)
            assert await client.closed_by_peer()
        assert security.failures.failures("127.0.0.1") == before + attempt
    line = await logged(caplog, "failed authentication")
    assert mechanism in line and repr(user) in line
    # the delay each failure got doubles (10, 20, 40 ms, then the 40 ms bound)
    delays = [
        float(r.getMessage().rsplit("answered in ", 1)[1].split()[0])
        for r in caplog.records
        if "answered in" in r.getMessage()
    ]
    assert delays == sorted(delays) and delays[-1] <= 0.04
    async with await connect(broker, pki, "SS") as client:  # a success forgets the address's failures
        await client.authenticate("SCRAM-SHA-256", "alice", PASSWORD["alice"])
    assert security.failures.failures("127.0.0.1") == 0


async def test_requests_before_authentication_are_kept_small(broker, pki, caplog):
    async with await connect(broker, pki, "SP") as client:
        client.write_raw(struct.pack(">i", 600_000) + b"\x00" * 1024)
        assert await client.closed_by_peer()
    assert "outside [0, 524288]" in await logged(caplog, "refused frame before authentication")


@pytest.mark.parametrize("which", ["none", "expired", "rogue"])
async def test_the_ssl_listener_refuses_a_missing_expired_or_foreign_client_certificate(broker, pki, which):
    files = {"none": (), "expired": pki.expired_client, "rogue": pki.rogue_client}[which]
    context = client_ssl_context(str(pki.ca), *(str(f) for f in files))
    with pytest.raises((OSError, asyncio.IncompleteReadError)):
        async with await RawKafkaClient.connect(*broker.listeners["SSL"], ssl=context) as client:
            await client.call(ApiKey.PRODUCE, 9, produce_body("sec-ssl-refused", make_batch([b"x"])))
    assert broker.store.topic("sec-ssl-refused") is None


async def test_plaintext_bytes_on_a_tls_listener_are_one_log_line(broker, pki, caplog):
    async with await RawKafkaClient.connect(*broker.listeners["SS"]) as client:
        client.send(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert await client.closed_by_peer()
    line = await logged(caplog, "TLS handshake failed")
    assert line.startswith("kafka listener SS (SASL_SSL): connection from 127.0.0.1:")


async def test_user_apis_follow_kafka(broker, pki, security):
    async with await connect(broker, pki, "kafka") as client:

        async def alter(deletions=(), upsertions=()):
            answer = await client.call(
                ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, {"deletions": list(deletions), "upsertions": list(upsertions)}
            )
            return [(r["user"], r["error_code"]) for r in answer["results"]]

        assert await alter(
            upsertions=[
                upsertion("dave", "pw", "SCRAM-SHA-256", 4095),
                upsertion("erin", "pw", "SCRAM-SHA-256", 16385),
                {**upsertion("frank", "pw", "SCRAM-SHA-256"), "mechanism": 0},
                upsertion("", "pw", "SCRAM-SHA-256"),
                upsertion("gina", "pw", "SCRAM-SHA-256"),
                upsertion("gina", "pw2", "SCRAM-SHA-256"),
                upsertion("hank", "pw", "SCRAM-SHA-512", 16384),
            ],
            deletions=[{"name": "ivan", "mechanism": 1}],
        ) == [
            ("ivan", E.ResourceNotFoundError.code),
            ("dave", E.UnacceptableCredentialError.code),
            ("erin", E.UnacceptableCredentialError.code),
            ("frank", E.UnsupportedSaslMechanismError.code),
            ("", E.UnacceptableCredentialError.code),
            ("gina", E.DuplicateResourceError.code),
            ("hank", 0),
        ]
        assert security.users.names() == ["alice", "bob", "hank"]  # nothing of the refused ones
        described = await client.call(
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
            0,
            {"users": [{"name": "hank"}, {"name": "nobody"}, {"name": "bob"}, {"name": "bob"}]},
        )
        assert [(r["user"], r["error_code"], r["credential_infos"]) for r in described["results"]] == [
            ("hank", 0, [{"mechanism": 2, "iterations": 16384}]),
            ("nobody", E.ResourceNotFoundError.code, []),
            ("bob", E.DuplicateResourceError.code, []),
        ]
        everyone = await client.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": []})
        assert [r["user"] for r in everyone["results"]] == ["alice", "bob", "hank"]
        assert await alter(deletions=[{"name": "hank", "mechanism": 2}]) == [("hank", 0)]
        assert security.users.names() == ["alice", "bob"]


async def test_rocketmq_listener_and_name_server_over_tls(broker, pki, caplog):
    context = client_ssl_context(str(pki.ca), *(str(f) for f in pki.client("rmq")))
    namesrv = broker.namesrv_address
    async with Producer(namesrv) as producer:
        producer.ssl = context
        sent = await producer.send("sec-native", b"over tls", tags="t")
    async with PullConsumer(namesrv, "sec-native-group") as consumer:
        consumer.ssl = context
        (msg,) = (
            await consumer.pull(MessageQueue("sec-native", sent.queue.broker_name, sent.queue.queue_id), 0)
        ).messages
        assert msg.body == b"over tls"
    reader, writer = await asyncio.open_connection(*broker.native_address)  # a plaintext client
    writer.write(b"\x00\x00\x00\x10" + b"\x00" * 16)
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    assert "rocketmq-broker: connection from" in await logged(caplog, "TLS handshake failed")


async def test_users_survive_a_restart_of_a_file_store_broker(pki, tmp_path):
    config = security_config(
        pki, store=StoreConfig(storage="file", data_dir=tmp_path / "data", commitlog_segment_bytes=1 << 20)
    )
    b = ThreadedBroker(config).start()
    try:
        # one turn of the broker's loop, so its listeners are serving before the client connects
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(asyncio.sleep(0), b.loop))
        await add_users(b.kafka_address)
    finally:
        b.stop()
    assert (tmp_path / "data" / "security" / "scram-credentials.json").exists()
    b = ThreadedBroker(config).start()
    try:
        async with await RawKafkaClient.connect(*b.listeners["SP"]) as client:
            await client.authenticate("SCRAM-SHA-512", "alice", PASSWORD["alice"])
    finally:
        b.stop()


async def test_a_listener_without_an_advertisable_address_answers_with_the_address_each_client_reached(pki):
    """What a listener bound to every interface does (mqk.server.listeners.advertised_address gives it no address:
    tests/unit/test_security_config.py). The tests bind loopback only, so the listener here is on 127.0.0.1 with its
    advertised address taken away as a wildcard bind leaves it."""
    config = security_config(
        pki, listeners=(ListenerConfig.parse("ALL=PLAINTEXT://127.0.0.1:0"),), native_tls=False, namesrv_tls=False
    )
    b = ThreadedBroker(config).start()
    try:
        (listener,) = [lst for lst in b.runtime.kafka.listeners if lst.name == "ALL"]
        listener.advertised = None
        async with await RawKafkaClient.connect("localhost", b.listeners["ALL"][1]) as client:
            meta = await client.call(ApiKey.METADATA, 12, {"topics": None})
        assert (meta["brokers"][0]["host"], meta["brokers"][0]["port"]) == ("127.0.0.1", b.listeners["ALL"][1])
    finally:
        b.stop()


def mqk(*args: str, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mqk", *args],
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
        env={**os.environ, **(env or {})},
    )


def test_mqk_users_add_list_delete_through_plaintext_and_sasl_ssl(broker, pki):
    plain = ("--bootstrap", broker.bootstrap)
    added = mqk("users", "add", "carl", "--password-stdin", "--mechanism", "SCRAM-SHA-512", *plain, stdin="c-pass\n")
    assert added.returncode == 0, added.stderr
    host, port = broker.listeners["SS"]
    secure = (
        "--bootstrap", f"{host}:{port}",
        "--security-protocol", "SASL_SSL",
        "--sasl-mechanism", "SCRAM-SHA-512",
        "--sasl-username", "carl",
        "--ssl-cafile", str(pki.ca),
    )  # fmt: skip
    listed = mqk("users", "list", *secure, env={"MQK_SASL_PASSWORD": "c-pass"})
    assert listed.returncode == 0, listed.stderr
    assert "carl\tSCRAM-SHA-512 iterations=4096" in listed.stdout.splitlines()
    assert "alice\tSCRAM-SHA-256 iterations=4096, SCRAM-SHA-512 iterations=4096" in listed.stdout.splitlines()
    wrong = mqk("topics", "list", *secure, "--sasl-password", "nope")
    assert wrong.returncode == 1 and "authentication failed: SaslAuthenticationFailedError" in wrong.stderr
    deleted = mqk("users", "delete", "carl", *plain)
    assert deleted.returncode == 0, deleted.stderr
    assert "carl" not in mqk("users", "list", *plain).stdout
    gone = mqk("users", "delete", "carl", *plain)
    assert gone.returncode == 1 and "ResourceNotFound" in gone.stderr


def test_serve_flags_name_listeners_and_the_ready_line_lists_them(pki, tmp_path: Path):
    from mqk.testing import BrokerProcess

    args = (
        "--kafka-listen", "off",
        "--listener", "in=SASL_PLAINTEXT://127.0.0.1:0",
        "--listener", "out=SASL_SSL://127.0.0.1:0",
        "--tls-cert", str(pki.server),
        "--tls-key", str(pki.server_key),
    )  # fmt: skip
    with BrokerProcess(tmp_path / "data", storage="memory", extra_args=args) as b:
        assert list(b.listeners) == ["IN", "OUT"]
        assert b.kafka_address == b.listeners["IN"]  # `kafka=` is the first listener when the unnamed one is off
        with pytest.raises(AssertionError):
            # nothing but the exchange without authentication, on the bootstrap address too
            asyncio.run(_metadata(b.kafka_address))


async def _metadata(address) -> None:
    async with await RawKafkaClient.connect(*address) as client:
        client.send(ApiKey.METADATA, 12, {"topics": None})
        assert not await client.closed_by_peer()


def test_scram_client_refuses_a_server_without_the_credential():
    """(The client half the tools use: a server that does not know the password cannot fake the final message.)"""
    client = ScramClient(SCRAM_SHA_256, "alice", "pw", nonce="abc")
    client.final(b"r=abcdef,s=" + b"QUFBQQ==" + b",i=4096")
    with pytest.raises(Exception, match="signature"):
        client.verify(b"v=" + b"QUFBQQ==")
