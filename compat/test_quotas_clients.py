"""Client quotas against a real client: a confluent-kafka producer with a produce byte-rate quota on its client id is
held to that rate (within 10 %, measured over 10 s after its first seconds) and is told its throttle times
(librdkafka's throttle_cb). The quota is set with AlterClientQuotas over the wire (no Python client has that admin
call)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from compat_helpers import hostport

from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient
from mqk.testing import BrokerProcess

pytestmark = pytest.mark.timeout(90)

QUOTA = 200_000  # bytes per second
CLIENT_ID = "quota-producer"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "data", storage="memory").start()
    try:
        yield process
    finally:
        process.stop()


def _set_quota(bootstrap: str) -> None:
    host, port = bootstrap.rsplit(":", 1)
    body = {
        "validate_only": False,
        "entries": [
            {
                "entity": [{"entity_type": "client-id", "entity_name": CLIENT_ID}],
                "ops": [{"key": "producer_byte_rate", "value": float(QUOTA), "remove": False}],
            }
        ],
    }

    async def alter() -> int:
        async with await RawKafkaClient.connect(host, int(port), "compat-quotas") as client:
            answer = await client.call(ApiKey.ALTER_CLIENT_QUOTAS, 1, body)
        return int(answer["entries"][0]["error_code"])

    assert asyncio.run(alter()) == 0


def test_a_producer_is_held_to_its_byte_rate(broker: BrokerProcess) -> None:
    from confluent_kafka import Producer

    bootstrap = hostport(broker.bootstrap)
    _set_quota(bootstrap)
    throttles: list[int] = []
    delivered: list[tuple[float, int]] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": CLIENT_ID,
            "linger.ms": 5,
            # Kafka's Java producer's batch size (librdkafka's is 1 MB: five seconds of this quota per request, too
            # coarse to measure a rate over ten)
            "batch.size": 16384,
            "queue.buffering.max.kbytes": 64,  # (what is queued when the test ends is waited for at the quota's pace)
            "throttle_cb": lambda event: throttles.append(event.throttle_time),
        }
    )

    def on_delivery(err: object, msg: object) -> None:
        if err is None:
            delivered.append((time.monotonic(), 2048))

    value = b"q" * 2048
    start = time.monotonic()
    while time.monotonic() - start < 15:
        try:
            producer.produce("quota-topic", value, on_delivery=on_delivery)
            producer.poll(0)
        except BufferError:
            producer.poll(0.01)
    assert producer.flush(30) == 0
    assert throttles and max(throttles) > 0  # told, in throttle_time_ms
    window = [size for at, size in delivered if start + 4 <= at < start + 14]
    rate = sum(window) / 10
    per_second = [sum(s for at, s in delivered if start + i <= at < start + i + 1) for i in range(16)]
    assert 0.9 * QUOTA <= rate <= 1.1 * QUOTA, f"{rate:.0f} B/s against a quota of {QUOTA}: {per_second}"
