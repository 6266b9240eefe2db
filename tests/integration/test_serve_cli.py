"""The contracts outside tests rely on: the ready line, port 0, SIGTERM exits 0 and leaves a clean data dir."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_until

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


def test_sigusr1_logs_where_every_task_waits_and_the_broker_serves_on(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        os.kill(broker.pid, signal.SIGUSR1)
        wait_until(lambda: "SIGUSR1:" in broker.log_text(), 10, "the task dump in the log")
        dump = broker.log_text().split("SIGUSR1:", 1)[1]
        assert "--- mqk-retention" in dump  # a task by its name, then where it waits
        assert "mqk/services/retention.py" in dump
        assert _connectable(broker.kafka_address)
    finally:
        code = broker.stop()
    assert code == 0, broker.log_text()


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
                made = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "mqk",
                        "topics",
                        "create",
                        "many",
                        "--partitions",
                        "300",
                        "--bootstrap",
                        broker.bootstrap,
                    ],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
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
    Kafka) and takes records into 300 partitions: their queues hold a descriptor each, over 256 with the rest."""
    import asyncio
    import re
    import resource

    from mqk.server.kafka.rawclient import RawKafkaClient

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard > 1000, f"this test needs a hard open files limit above 1,000, not {hard}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        broker = BrokerProcess(tmp_path / "data").start()  # inherits the soft limit of 256
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    async def produce_everywhere(partitions: int) -> list[dict]:
        client = await RawKafkaClient.connect(*broker.kafka_address)
        try:
            return await _fill_wide_topic(client, partitions)
        finally:
            await client.close()

    try:
        limits = Path(f"/proc/{broker.pid}/limits").read_text()
        max_open = re.search(r"Max open files\s+(\d+)\s+(\d+)", limits)
        assert max_open and int(max_open.group(1)) == hard, limits
        answers = asyncio.run(produce_everywhere(300))
        assert sorted((a["index"], a["error_code"], a["base_offset"]) for a in answers) == [
            (i, 0, 0) for i in range(300)
        ]
        assert len(os.listdir(f"/proc/{broker.pid}/fd")) > 300
    finally:
        code = broker.stop()
    assert code == 0, broker.log_text()
    assert f"open files limit raised from 256 to {hard}" in broker.log_text()


def test_a_partition_costs_one_descriptor_so_a_limit_serves_twice_the_partitions(tmp_path):
    """A ConsumeQueue file keeps no descriptor of its own once mapped (the mapping holds one): under a hard limit
    of 800 open files the broker takes and serves records in 600 partitions, which at two descriptors each (the
    file's and the mapping's) failed from partition 389 on with KAFKA_STORAGE_ERROR."""
    import asyncio
    import resource

    from mqk.protocol.kafka.api import ApiKey
    from mqk.server.kafka.rawclient import RawKafkaClient

    partitions = 600
    broker = BrokerProcess(tmp_path / "data").start()

    async def produce_and_fetch_everywhere() -> tuple[list[dict], list[dict]]:
        client = await RawKafkaClient.connect(*broker.kafka_address)
        try:
            produced = await _fill_wide_topic(client, partitions)
            fetched = await client.call(
                ApiKey.FETCH,
                11,
                {
                    "replica_id": -1,
                    "max_wait_ms": 0,
                    "min_bytes": 0,
                    "max_bytes": 50 << 20,
                    "isolation_level": 0,
                    "session_id": 0,
                    "session_epoch": -1,
                    "topics": [
                        {
                            "topic": "wide",
                            "partitions": [
                                {
                                    "partition": i,
                                    "current_leader_epoch": -1,
                                    "fetch_offset": 0,
                                    "log_start_offset": -1,
                                    "partition_max_bytes": 1 << 20,
                                }
                                for i in range(partitions)
                            ],
                        }
                    ],
                    "forgotten_topics_data": [],
                    "rack_id": "",
                },
                timeout=60,
            )
            return produced, fetched["responses"][0]["partitions"]
        finally:
            await client.close()

    try:
        resource.prlimit(broker.pid, resource.RLIMIT_NOFILE, (800, 800))
        produced, fetched = asyncio.run(produce_and_fetch_everywhere())
        assert sorted((a["index"], a["error_code"], a["base_offset"]) for a in produced) == [
            (i, 0, 0) for i in range(partitions)
        ]
        assert sorted((f["partition_index"], f["error_code"], f["high_watermark"]) for f in fetched) == [
            (i, 0, 1) for i in range(partitions)
        ]
        assert all(b"r%d" % f["partition_index"] in bytes(f["records"]) for f in fetched)
        queue_files = [link for link in open_files(broker.pid) if "/consumequeue/wide/" in link]
        assert len(queue_files) == partitions and len(set(queue_files)) == partitions
    finally:
        code = broker.stop()
    assert code == 0, broker.log_text()
    assert "KAFKA_STORAGE_ERROR" not in broker.log_text() and "Too many open files" not in broker.log_text()


def open_files(pid: int) -> list[str]:
    """What the process's descriptors point at now (one closed between the listing and its reading is left out)."""
    fd_dir = f"/proc/{pid}/fd"
    links = []
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(FileNotFoundError):
            links.append(os.readlink(f"{fd_dir}/{fd}"))
    return links


async def _fill_wide_topic(client, partitions: int) -> list[dict]:
    """Create topic "wide" with `partitions` partitions and produce one record (b"r<i>") into each partition i in
    one request; returns the partitions' answers."""
    from mqk.protocol.kafka.api import ApiKey
    from mqk.server.kafka.rawclient import make_batch

    made = await client.call(
        ApiKey.CREATE_TOPICS,
        5,
        {
            "topics": [
                {
                    "name": "wide",
                    "num_partitions": partitions,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [],
                }
            ],
            "timeout_ms": 30000,
            "validate_only": False,
        },
        timeout=60,
    )
    assert made["topics"][0]["error_code"] == 0, made
    answer = await client.call(
        ApiKey.PRODUCE,
        9,
        {
            "transactional_id": None,
            "acks": 1,
            "timeout_ms": 30000,
            "topic_data": [
                {
                    "name": "wide",
                    "partition_data": [
                        {"index": i, "records": bytes(make_batch([b"r%d" % i]))} for i in range(partitions)
                    ],
                }
            ],
        },
        timeout=60,
    )
    return answer["responses"][0]["partition_responses"]
