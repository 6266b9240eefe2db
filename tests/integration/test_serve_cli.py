"""The contracts outside tests rely on: the ready line, port 0, SIGTERM exits 0 and leaves a clean data dir."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mqk.testing import BrokerProcess


def _connectable(addr: tuple[str, int]) -> bool:
    with socket.create_connection(addr, timeout=5):
        return True


@pytest.mark.parametrize("storage", ["file", "memory", "rocksdb"])
def test_serve_prints_ready_line_and_stops_cleanly(tmp_path, storage):
    broker = BrokerProcess(tmp_path / "data", storage=storage).start()
    try:
        for addr in (broker.kafka_address, broker.native_address, broker.namesrv_address):
            assert addr[0] == "127.0.0.1" and addr[1] > 0
            assert _connectable(addr)
        assert len({broker.kafka_address, broker.native_address, broker.namesrv_address}) == 3
    finally:
        code = broker.stop()
    assert code == 0, broker.log_text()
    assert not (tmp_path / "data" / "abort").exists()


def test_python_dash_m_is_the_same_program():
    out = subprocess.run([sys.executable, "-m", "mqk", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("mqk ")


def test_bad_flag_is_refused_with_a_message(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "mqk", "serve", "--kafka-listen", "nonsense", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0
    assert "HOST:PORT" in out.stderr


def test_serve_moves_what_recovery_built_out_of_the_gcs_reach(tmp_path):
    """`mqk serve` freezes its start-up objects (gc.freeze), so a full collection does not walk every recovered
    partition's objects: the count it logs grows with the partitions it recovered. It also collects the young
    generation less often (cli.YOUNG_COLLECTION_THRESHOLD)."""
    import re

    def frozen_after_start() -> int:
        broker = BrokerProcess(tmp_path / "data").start()
        try:
            if not (tmp_path / "made").exists():
                made = subprocess.run([sys.executable, "-m", "mqk", "topics", "create", "many", "--partitions", "300",
                                       "--bootstrap", broker.bootstrap], capture_output=True, text=True, timeout=60)
                assert made.returncode == 0, made.stderr
                (tmp_path / "made").touch()
        finally:
            assert broker.stop() == 0, broker.log_text()
        counts = re.findall(r"moved out of the cyclic GC's reach: (\d+)", broker.log_text())
        assert counts, broker.log_text()
        assert "young generation is collected every 10000 allocations" in broker.log_text()
        return int(counts[-1])

    empty = frozen_after_start()  # creates the topic after its start-up
    recovered = frozen_after_start()  # starts with 300 partitions to recover
    assert recovered - empty > 300 * 5


def test_serve_raises_its_open_files_limit_and_serves_more_partitions_than_it_allowed(tmp_path):
    """Started with a soft limit of 256 open files, `mqk serve` raises it to the hard limit (as the JVM does for
    Kafka) and takes records into 300 partitions: their queues hold two descriptors each, far over 256."""
    import asyncio
    import re
    import resource

    from mqk.protocol.kafka.api import ApiKey
    from mqk.server.kafka.rawclient import RawKafkaClient, make_batch

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard > 1000, f"this test needs a hard open files limit above 1,000, not {hard}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        broker = BrokerProcess(tmp_path / "data").start()  # inherits the soft limit of 256
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    async def produce_everywhere(partitions: int) -> list[dict]:
        host, port = broker.kafka_address
        client = await RawKafkaClient.connect(host, port)
        try:
            made = await client.call(ApiKey.CREATE_TOPICS, 5, {"topics": [
                {"name": "wide", "num_partitions": partitions, "replication_factor": 1, "assignments": [],
                 "configs": []}], "timeout_ms": 30000, "validate_only": False}, timeout=60)
            assert made["topics"][0]["error_code"] == 0, made
            answer = await client.call(ApiKey.PRODUCE, 9, {"transactional_id": None, "acks": 1, "timeout_ms": 30000,
                                                          "topic_data": [{"name": "wide", "partition_data": [
                                                              {"index": i, "records": bytes(make_batch([b"r"]))}
                                                              for i in range(partitions)]}]}, timeout=60)
            return answer["responses"][0]["partition_responses"]
        finally:
            await client.close()

    try:
        limits = Path(f"/proc/{broker.pid}/limits").read_text()
        max_open = re.search(r"Max open files\s+(\d+)\s+(\d+)", limits)
        assert max_open and int(max_open.group(1)) == hard, limits
        answers = asyncio.run(produce_everywhere(300))
        assert sorted((a["index"], a["error_code"], a["base_offset"]) for a in answers) == [
            (i, 0, 0) for i in range(300)]
        assert len(os.listdir(f"/proc/{broker.pid}/fd")) > 600
    finally:
        code = broker.stop()
    assert code == 0, broker.log_text()
    assert f"open files limit raised from 256 to {hard}" in broker.log_text()
