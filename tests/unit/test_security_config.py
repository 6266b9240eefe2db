"""Listener, advertised-listener and TLS settings: how they are written (flags, TOML, Kafka's spellings), what they
become, and what a start refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqk.broker.cluster import ClusterStartError
from mqk.config import BrokerConfig, ListenerConfig, TlsConfig, parse_advertised_listener
from mqk.runtime import advertised_listeners
from mqk.server.listeners import advertised_address


def test_listener_specs_in_mqk_and_kafka_spellings():
    assert ListenerConfig.parse("client=sasl_ssl://127.0.0.1:9093") == ListenerConfig(
        "CLIENT", "SASL_SSL", "127.0.0.1", 9093
    )
    assert ListenerConfig.parse("SSL://:9094") == ListenerConfig("SSL", "SSL", "0.0.0.0", 9094)  # Kafka: every NIC
    assert ListenerConfig.parse("IN=PLAINTEXT://[::1]:0") == ListenerConfig("IN", "PLAINTEXT", "::1", 0)
    assert str(ListenerConfig.parse("a=SSL://h:1")) == "A=SSL://h:1"
    for bad in ("x=TLS://h:1", "x=SSL//h:1", "x=SSL://h", "x=SSL://h:99999", "a b=SSL://h:1", "FOO://h:1"):
        with pytest.raises(ValueError):
            ListenerConfig.parse(bad)
    assert parse_advertised_listener("client=broker.example:9093") == ("CLIENT", "broker.example", 9093)
    assert parse_advertised_listener("CLIENT://broker.example:9093") == ("CLIENT", "broker.example", 9093)
    with pytest.raises(ValueError):
        parse_advertised_listener("client")


def test_toml_file_with_listeners_advertised_listeners_and_a_tls_table(tmp_path: Path):
    path = tmp_path / "broker.toml"
    path.write_text(
        'kafka_listen = "off"\n'
        'listeners = ["CLIENT=SASL_SSL://0.0.0.0:9093", "INTERNAL=PLAINTEXT://127.0.0.1:9092"]\n'
        'advertised_listeners = "CLIENT=broker.example:19093"\n'  # Kafka's comma-separated style also works
        'sasl_enabled_mechanisms = ["SCRAM-SHA-512"]\n'
        "[tls]\n"
        'cert_file = "/etc/mqk/broker.pem"\nkey_file = "/etc/mqk/broker.key"\nca_file = "/etc/mqk/ca.pem"\n'
        'client_auth = "required"\nhandshake_timeout_ms = 2500\n'
        'principal_mapping_rules = ["RULE:^CN=(.*?),.*$/$1/L", "DEFAULT"]\n'
    )
    config = BrokerConfig.load(path, tls_client_auth="requested")  # a flag wins over the file
    assert config.kafka_listen is None
    assert [str(lc) for lc in config.kafka_listeners] == [
        "CLIENT=SASL_SSL://0.0.0.0:9093",
        "INTERNAL=PLAINTEXT://127.0.0.1:9092",
    ]
    assert config.advertised_listeners == (("CLIENT", "broker.example", 19093),)
    assert config.sasl_enabled_mechanisms == ("SCRAM-SHA-512",)
    assert config.tls == TlsConfig(
        cert_file=Path("/etc/mqk/broker.pem"),
        key_file=Path("/etc/mqk/broker.key"),
        ca_file=Path("/etc/mqk/ca.pem"),
        client_auth="requested",
        handshake_timeout_ms=2500,
        principal_mapping_rules=("RULE:^CN=(.*?),.*$/$1/L", "DEFAULT"),
    )


def test_flags_give_listeners_and_the_unnamed_listener_stays_first():
    config = BrokerConfig.load(
        None,
        listeners=["EXT=SASL_PLAINTEXT://127.0.0.1:0"],
        advertised_listeners=["EXT=ext.example:1"],
        kafka_listen="127.0.0.1:0",
    )
    assert [(lc.name, lc.protocol) for lc in config.kafka_listeners] == [("", "PLAINTEXT"), ("EXT", "SASL_PLAINTEXT")]


TLS = TlsConfig(cert_file=Path("c.pem"), key_file=Path("k.pem"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"listeners": (ListenerConfig("A", "SSL", "h", 1),)}, "cert_file"),
        ({"native_tls": True}, "cert_file"),
        ({"tls": TlsConfig(client_auth="required")}, "ca_file"),
        ({"kafka_listen": None}, "no Kafka listener"),
        ({"listeners": (ListenerConfig("A", "PLAINTEXT", "h", 1),) * 2}, "unique"),
        ({"kafka_listen": ("h", 1), "listeners": (ListenerConfig("A", "PLAINTEXT", "h", 1),)}, "kafka_listen"),
        ({"advertised_listeners": (("NOPE", "h", 1),)}, "NOPE"),
        ({"sasl_enabled_mechanisms": ("GSSAPI",)}, "sasl_enabled_mechanisms"),
        ({"sasl_enabled_mechanisms": ()}, "sasl_enabled_mechanisms"),
        ({"auth_failure_delay_ms": 10, "auth_failure_delay_max_ms": 5}, "auth_failure_delay"),
    ],
)
def test_what_a_start_refuses(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BrokerConfig(**kwargs)


def test_tls_settings_refused():
    for kwargs in ({"client_auth": "maybe"}, {"handshake_timeout_ms": 0}, {"principal_mapping_rules": ("CN",)}):
        with pytest.raises(ValueError):
            TlsConfig(**kwargs)
    assert BrokerConfig(listeners=(ListenerConfig("A", "SASL_SSL", "h", 1),), tls=TLS).tls is TLS


def test_advertised_address_of_each_listener():
    config = BrokerConfig(
        listeners=(ListenerConfig("A", "PLAINTEXT", "0.0.0.0", 0), ListenerConfig("B", "PLAINTEXT", "::", 0)),
        advertised_listeners=(("A", "a.example", 1),),
        advertise=("kafka=k.example:2",),
    )
    assert advertised_address(config, "kafka", ("127.0.0.1", 9092)) == ("k.example", 2)
    assert advertised_address(config, "kafka.A", ("0.0.0.0", 5)) == ("a.example", 1)
    assert advertised_address(config, "kafka.B", ("::", 6)) is None  # each client's own address to it
    assert advertised_address(config, "native", ("127.0.0.1", 7)) == ("127.0.0.1", 7)
    everywhere = BrokerConfig(advertise=("host.example",), listeners=(ListenerConfig("B", "PLAINTEXT", "::", 0),))
    assert advertised_address(everywhere, "kafka.B", ("::", 6)) == ("host.example", 6)
    named = BrokerConfig(advertise=("kafka.B=b.example:3",), listeners=(ListenerConfig("B", "PLAINTEXT", "::", 0),))
    assert advertised_address(named, "kafka.B", ("::", 6)) == ("b.example", 3)


def test_a_cluster_broker_registers_advertised_addresses_and_refuses_a_wildcard_without_one() -> None:
    config = BrokerConfig(
        listeners=(
            ListenerConfig.parse("EXT=SASL_PLAINTEXT://0.0.0.0:0"),
            ListenerConfig.parse("INT=PLAINTEXT://127.0.0.1:0"),
        ),
        advertised_listeners=(("EXT", "broker-1.example", 19093),),
    )
    bound = {"kafka": ("127.0.0.1", 9092), "kafka.EXT": ("0.0.0.0", 9093), "kafka.INT": ("127.0.0.1", 9094)}
    assert advertised_listeners(config, {**bound, "native": ("0.0.0.0", 10911)}) == {
        "kafka": "127.0.0.1:9092",
        "kafka.EXT": "broker-1.example:19093",
        "kafka.INT": "127.0.0.1:9094",
        "native": "0.0.0.0:10911",  # (the RocketMQ listeners keep their former rule)
    }
    no_address = BrokerConfig(listeners=(ListenerConfig.parse("EXT=SASL_PLAINTEXT://0.0.0.0:0"),))
    with pytest.raises(ClusterStartError, match=r"kafka\.EXT is bound to every interface"):
        advertised_listeners(no_address, bound)
