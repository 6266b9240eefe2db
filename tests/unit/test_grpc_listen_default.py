"""Where `mqk serve` puts its RocketMQ 5 gRPC listener: 127.0.0.1:8081 (RocketMQ's proxy port) where the `grpc`
extra is installed and nothing says otherwise; off when the flag or the TOML file says `off`, in cluster mode unless
asked for (several brokers on one host would all want the same port), and where the extra is missing."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from mqk import cli
from mqk.config import BrokerConfig


def serve_config(*argv: str) -> BrokerConfig:
    parser = argparse.ArgumentParser()
    cli._serve_parser(parser.add_subparsers())
    return cli.build_config(parser.parse_args(["serve", *argv]))


def test_the_listener_is_on_at_rocketmqs_proxy_port_where_the_extra_is_installed() -> None:
    assert cli.grpc_installed()  # (the dev environment has the extra)
    assert serve_config().grpc_listen == ("127.0.0.1", 8081)
    assert serve_config("--grpc-listen", "127.0.0.1:0").grpc_listen == ("127.0.0.1", 0)


def test_off_when_told_so_by_flag_or_file_and_in_cluster_mode(tmp_path: Path) -> None:
    assert serve_config("--grpc-listen", "off").grpc_listen is None
    toml = tmp_path / "broker.toml"
    toml.write_text('grpc_listen = "off"\n')
    assert serve_config("--config", str(toml)).grpc_listen is None
    toml.write_text('grpc_listen = "127.0.0.1:18081"\n')
    assert serve_config("--config", str(toml)).grpc_listen == ("127.0.0.1", 18081)
    assert serve_config("--cluster", "etcd://127.0.0.1:2379", "--node-id", "1").grpc_listen is None
    asked = serve_config("--cluster", "etcd://127.0.0.1:2379", "--node-id", "1", "--grpc-listen", "127.0.0.1:0")
    assert asked.grpc_listen == ("127.0.0.1", 0)  # (asked for in cluster mode: on, each master routed to)


def test_off_where_the_extra_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "grpc_installed", lambda: False)
    assert serve_config().grpc_listen is None
