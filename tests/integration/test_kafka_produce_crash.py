"""Acknowledged Produce requests survive kill -9 when they were answered as a group.

A wire-level producer keeps many single-partition acks=-1 requests in flight over 40 partitions (librdkafka's
shape), so the broker reads several at a time and answers them with one store write (KafkaConnection grouping)
under sync flush; the broker is killed with SIGKILL at a random point while answers are flowing. After a restart
every batch whose answer arrived is present at the offset it was given, intact, and each partition holds a prefix
of what was sent to it, in order. Repeated with different kill points."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from mqk._fast import load
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient, make_batch
from mqk.testing import BrokerProcess

recbatch = load("recbatch")
PARTITIONS = 40
IN_FLIGHT = 48


def produce_body(topic: str, partition: int, value: bytes) -> dict:
    return {
        "transactional_id": None,
        "acks": -1,
        "timeout_ms": 5000,
        "topic_data": [
            {"name": topic, "partition_data": [{"index": partition, "records": bytes(make_batch([value]))}]}
        ],
    }


def fetch_body(topic: str, partition: int, offset: int) -> dict:
    return {
        "replica_id": -1,
        "max_wait_ms": 0,
        "min_bytes": 0,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "forgotten_topics_data": [],
        "rack_id": "",
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": partition,
                        "current_leader_epoch": -1,
                        "fetch_offset": offset,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 20,
                    }
                ],
            }
        ],
    }


def values_of(records) -> list[bytes]:
    data = b"".join(bytes(r) for r in records) if isinstance(records, (list, tuple)) else bytes(records or b"")
    out = []
    for pos, size, *_ in recbatch.scan_batches(data):
        header = recbatch.parse_header(data, pos)
        out += [r[4] for r in recbatch.decode_records(data[pos + 61 : pos + size], header[12])]
    return out


async def produce_until_killed(
    broker: BrokerProcess, topic: str, kill_after: int, round_: int
) -> dict[tuple[int, int], bytes]:
    """Send requests, IN_FLIGHT outstanding, until `kill_after` answers have arrived; then SIGKILL the broker.
    Returns what was acknowledged: (partition, base offset) -> value."""
    host, port = broker.kafka_address
    client = await RawKafkaClient.connect(host, port)
    sent: dict[int, tuple[int, bytes]] = {}  # correlation id -> (partition, value)
    acked: dict[tuple[int, int], bytes] = {}
    n = 0

    def send_one() -> None:
        nonlocal n
        partition, value = n % PARTITIONS, b"r%d-%06d" % (round_, n)
        cid = client.send(ApiKey.PRODUCE, 9, produce_body(topic, partition, value))
        sent[cid] = (partition, value)
        n += 1

    for _ in range(IN_FLIGHT):
        send_one()
    try:
        while len(acked) < kill_after:
            await client.writer.drain()
            cid, body = await client.receive()
            part = body["responses"][0]["partition_responses"][0]
            assert part["error_code"] == 0, part
            partition, value = sent.pop(cid)
            acked[(partition, part["base_offset"])] = value
            send_one()
    finally:
        broker.kill()
        client.writer.close()
    return acked


@pytest.mark.timeout(180)
def test_grouped_acks_all_produce_survives_kill_9(tmp_path: Path) -> None:
    rng = random.Random(7)
    broker = BrokerProcess(tmp_path / "data", extra_args=("--flush", "sync")).start()
    try:
        acked_all: dict[tuple[int, int], bytes] = {}

        async def setup() -> None:
            host, port = broker.kafka_address
            async with await RawKafkaClient.connect(host, port) as admin:
                created = await admin.call(
                    ApiKey.CREATE_TOPICS,
                    5,
                    {
                        "topics": [
                            {
                                "name": "crash",
                                "num_partitions": PARTITIONS,
                                "replication_factor": 1,
                                "assignments": [],
                                "configs": [],
                            }
                        ],
                        "timeout_ms": 10000,
                        "validate_only": False,
                    },
                )
                assert created["topics"][0]["error_code"] == 0

        asyncio.run(setup())
        for round_ in range(4):
            acked = asyncio.run(produce_until_killed(broker, "crash", rng.randrange(200, 1500), round_))
            assert not set(acked) & set(acked_all)  # no offset is handed out twice across restarts
            acked_all.update(acked)
            broker.start()
            asyncio.run(check(broker, acked_all))
    finally:
        broker.stop()


async def check(broker: BrokerProcess, acked: dict[tuple[int, int], bytes]) -> None:
    host, port = broker.kafka_address
    async with await RawKafkaClient.connect(host, port) as client:
        for partition in range(PARTITIONS):
            stored: list[bytes] = []
            while True:
                resp = await client.call(ApiKey.FETCH, 12, fetch_body("crash", partition, len(stored)))
                records = resp["responses"][0]["partitions"][0]["records"]
                got = values_of(records)
                if not got:
                    break
                stored += got
            for (p, offset), value in acked.items():
                if p == partition:
                    assert offset < len(stored) and stored[offset] == value, (partition, offset)
            # what a partition holds is what was sent to it, in sending order (values grow with the send count)
            assert stored == sorted(stored) and len(set(stored)) == len(stored)
            assert all(int(v.split(b"-")[1]) % PARTITIONS == partition for v in stored)
