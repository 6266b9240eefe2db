"""Broker limits against real clients (a `mqk serve` process of the test's own): confluent-kafka over
`--message-max-bytes` gets MSG_SIZE_TOO_LARGE; librdkafka lives through `--connections-max-idle-ms` closing its idle
connections (it reconnects and delivers); kcat cannot connect while other connections fill
`--max-connections-per-ip`, and can once they close. Waits are bounded; nothing is timed."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compat_helpers import hostport, unique
from helpers import wait_until

from mqk.testing import BrokerProcess

pytestmark = pytest.mark.timeout(90)


def _broker(data_dir: Path, *flags: str) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(data_dir, storage="memory", extra_args=flags).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def small_and_impatient(tmp_path: Path) -> Iterator[BrokerProcess]:
    yield from _broker(tmp_path / "data", "--message-max-bytes", "10000", "--connections-max-idle-ms", "500")


@pytest.fixture
def few_per_ip(tmp_path: Path) -> Iterator[BrokerProcess]:
    yield from _broker(tmp_path / "data", "--max-connections-per-ip", "3")


def _deliver(producer: Any, topic: str, value: bytes) -> Any:
    errors: list[Any] = []
    producer.produce(topic, value, on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(20)
    assert errors, "no delivery report"
    return errors[0]


def test_confluent_kafka_message_size_and_idle_connections(small_and_impatient: BrokerProcess) -> None:
    limited = small_and_impatient
    from confluent_kafka import KafkaError, Producer

    bootstrap = hostport(limited.bootstrap)
    topic = unique("limits")
    # the client's own limit is above the broker's, so the broker's answer is what refuses it
    producer = Producer({"bootstrap.servers": bootstrap, "message.send.max.retries": 0, "message.max.bytes": 100000})
    error = _deliver(producer, topic, b"x" * 20000)
    assert error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert _deliver(producer, topic, b"x" * 5000) is None
    # the broker closes the producer's idle connections; the producer reconnects and delivers again
    wait_until(
        lambda: "idle for more than connections_max_idle_ms" in limited.log_text(), 30, "the idle connections closed"
    )
    assert _deliver(producer, topic, b"after the idle close") is None


def test_kcat_past_max_connections_per_ip(kcat: str, few_per_ip: BrokerProcess) -> None:
    limited = few_per_ip
    bootstrap = hostport(limited.bootstrap)
    host, port = bootstrap.rsplit(":", 1)
    api_versions = bytes.fromhex("0000000e001200000000000100046b656570")  # ApiVersions v0, id "keep"
    held: list[socket.socket] = []
    try:
        for _ in range(3):  # fill max_connections_per_ip; each proves it is served
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(api_versions)
            assert s.recv(4), "a connection within the limit is served"
            held.append(s)
        refused = subprocess.run(
            [kcat, "-b", bootstrap, "-L", "-m", "3"], capture_output=True, text=True, timeout=30, check=False
        )
        assert refused.returncode != 0
        assert "max_connections_per_ip (3) reached" in limited.log_text()
    finally:
        for s in held:
            s.close()
    listed = subprocess.run(
        [kcat, "-b", bootstrap, "-L", "-m", "10"], capture_output=True, text=True, timeout=30, check=False
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
