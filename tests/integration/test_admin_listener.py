"""The admin listener against a real broker: /metrics read back with prometheus-client's own text-format parser after
a known workload, lag from a real confluent-kafka consumer stopped at a known offset, the health endpoints, the
ready line's admin= pair and JSON logs of `mqk serve`, and DescribeLogDirs / AlterReplicaLogDirs through
kafka-python's admin client."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from helpers import produce_body
from prometheus_client.parser import text_string_to_metric_families

from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient, make_batch
from mqk.testing import BrokerProcess


def get(address: tuple[str, int], path: str, method: str = "GET") -> tuple[int, str, str]:
    """(status, content type, body) of one request to the admin listener."""
    request = urllib.request.Request(f"http://{address[0]}:{address[1]}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def scrape(address: tuple[str, int]) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """sample name -> {sorted labels: value}, parsed by prometheus-client's parser."""
    status, content_type, text = get(address, "/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get(name, {}).get(tuple(sorted(labels.items())))


async def _produce(bootstrap: str, bodies: list[dict]) -> list[dict]:
    host, port = bootstrap.rsplit(":", 1)
    async with await RawKafkaClient.connect(host, int(port)) as client:
        return [await client.call(ApiKey.PRODUCE, 9, body) for body in bodies]


def test_metrics_count_a_known_workload_and_a_stopped_consumers_lag(mqk_file_broker):
    broker = mqk_file_broker
    host, port = broker.bootstrap.rsplit(":", 1)

    async def create() -> None:
        async with await RawKafkaClient.connect(host, int(port)) as client:
            body = {
                "topics": [
                    {"name": "m", "num_partitions": 2, "replication_factor": 1, "assignments": [], "configs": []}
                ],
                "timeout_ms": 10000,
                "validate_only": False,
            }
            assert (await client.call(ApiKey.CREATE_TOPICS, 7, body))["topics"][0]["error_code"] == 0

    asyncio.run(create())
    # partition 0: three batches of four records; partition 1: one batch of five; then one partition that does not
    # exist (an error the request metrics count)
    p0 = [bytes(make_batch([b"v%d-%d" % (b, i) for i in range(4)])) for b in range(3)]
    p1 = [bytes(make_batch([b"w%d" % i for i in range(5)]))]
    answers = asyncio.run(
        _produce(broker.bootstrap, [*(produce_body("m", b, 0) for b in p0), produce_body("m", p1[0], 1)])
    )
    assert all(a["responses"][0]["partition_responses"][0]["error_code"] == 0 for a in answers)
    refused = asyncio.run(_produce(broker.bootstrap, [produce_body("m", p1[0], 7)]))
    assert refused[0]["responses"][0]["partition_responses"][0]["error_code"] == 3

    # a real consumer in group g1 reads five records of partition 0, commits them and stops
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "g1",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([TopicPartition("m", 0, 0)])
        got: list[Any] = []
        # (one deadline for the five: the first poll waits for the consumer's start too, which a loaded machine can
        # stretch past any short per-poll timeout)
        deadline = time.monotonic() + 30
        while len(got) < 5:
            assert time.monotonic() < deadline, f"{len(got)} of 5 records read in 30 s"
            msg = consumer.poll(0.5)
            if msg is not None:
                assert not msg.error(), msg.error()
                got.append(msg)
        consumer.commit(message=got[4], asynchronous=False)
    finally:
        consumer.close()

    samples = scrape(broker.admin_address)
    for partition, batches, records in (("0", p0, 12), ("1", p1, 5)):
        labels = {"topic": "m", "partition": partition}
        assert value(samples, "mqk_partition_records_in_total", **labels) == records
        assert value(samples, "mqk_partition_bytes_in_total", **labels) == sum(len(b) for b in batches)
        assert value(samples, "mqk_partition_log_end_offset", **labels) == records
        assert value(samples, "mqk_partition_log_start_offset", **labels) == 0
        assert value(samples, "mqk_partition_log_size_bytes", **labels) == sum(len(b) for b in batches)
    # the consumer fetched whole batches: at least the two holding its five records
    assert value(samples, "mqk_partition_bytes_out_total", topic="m", partition="0") >= 2 * len(p0[0])
    assert value(samples, "mqk_partition_records_out_total", topic="m", partition="0") >= 8

    assert value(samples, "mqk_consumer_group_committed_offset", group="g1", topic="m", partition="0") == 5
    assert value(samples, "mqk_consumer_group_lag", group="g1", topic="m", partition="0") == 12 - 5
    assert value(samples, "mqk_consumer_group_lag_sum", group="g1") == 7
    assert value(samples, "mqk_consumer_group_state", group="g1", state="Empty") == 1

    kafka_produce = {"listener": "kafka", "protocol": "kafka", "api": "Produce"}
    assert value(samples, "mqk_requests_total", **kafka_produce) == 5
    assert value(samples, "mqk_request_duration_seconds_count", **kafka_produce) == 5
    assert value(samples, "mqk_request_duration_seconds_bucket", **kafka_produce, le="+Inf") == 5
    assert value(samples, "mqk_request_errors_total", **kafka_produce, error="UNKNOWN_TOPIC_OR_PARTITION") == 1
    assert value(samples, "mqk_connections_accepted_total", listener="kafka") >= 3
    # the store's own figures: every batch went into the CommitLog, each append timed
    assert value(samples, "mqk_store_puts_total") >= 4
    assert value(samples, "mqk_store_append_latency_seconds_count") == value(samples, "mqk_store_puts_total")
    assert value(samples, "mqk_store_flush_lag_bytes") is not None
    assert value(samples, "mqk_data_dir_used_bytes") > 0
    assert value(samples, "mqk_broker_ready") == 1
    assert value(samples, "process_resident_memory_bytes") > 0


def test_health_endpoints_say_live_and_ready_and_not_ready_when_appends_are_refused(mqk_broker):
    admin = mqk_broker.admin_address
    assert get(admin, "/health/live")[:1] == (200,)
    status, content_type, body = get(admin, "/health/ready")
    assert status == 200 and content_type == "application/json"
    assert json.loads(body) == {
        "status": "ready",
        "checks": {"listeners": True, "recovery": True, "store_writable": True},
    }
    guard = mqk_broker.runtime.diskguard
    guard.full = True  # what the disk guard sets when the disk is above its limit
    try:
        status, _ct, body = get(admin, "/health/ready")
        assert status == 503 and json.loads(body)["checks"]["store_writable"] is False
    finally:
        guard.full = False
    assert get(admin, "/health/ready")[0] == 200
    assert get(admin, "/nowhere")[0] == 404
    assert get(admin, "/metrics", method="POST")[0] == 405
    assert get(admin, "/health/live", method="HEAD")[:2] == (200, "application/json")


def test_describe_and_alter_log_dirs_through_kafka_pythons_admin_client(mqk_broker):
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import LogDirNotFoundError, NoError
    from kafka.structs import TopicPartitionReplica

    batches = [bytes(make_batch([b"x" * 50] * 3)), bytes(make_batch([b"y" * 70] * 2))]
    admin = KafkaAdminClient(bootstrap_servers=mqk_broker.bootstrap)
    try:
        admin.create_topics([NewTopic("dirs", 2, 1)])
        asyncio.run(_produce(mqk_broker.bootstrap, [produce_body("dirs", b, 1) for b in batches]))
        (described,) = admin.describe_log_dirs({"dirs": [0, 1]})
        (log_dir,) = described["log_dirs"]
        assert log_dir["error_code"] == 0
        assert log_dir["log_dir"] == os.path.abspath(mqk_broker.config.store.data_dir)
        (topic,) = log_dir["topics"]
        sizes = {p["partition_index"]: p["partition_size"] for p in topic["partitions"]}
        assert sizes == {0: 0, 1: sum(len(b) for b in batches)}
        # the same directory: nothing to move; another: not a log directory of this broker
        here = admin.alter_replica_log_dirs({TopicPartitionReplica("dirs", 1, 0): log_dir["log_dir"]})
        assert list(here.values()) == [NoError]
        elsewhere = admin.alter_replica_log_dirs({TopicPartitionReplica("dirs", 1, 0): "/not/a/log/dir"})
        assert list(elsewhere.values()) == [LogDirNotFoundError]
    finally:
        admin.close()


def test_serve_prints_admin_on_the_ready_line_and_logs_json(tmp_path):
    broker = BrokerProcess(tmp_path / "data", storage="memory", extra_args=("--log-format", "json")).start()
    try:
        assert broker.admin_address is not None and broker.admin_address[1] > 0
        status, _ct, body = get(broker.admin_address, "/health/ready")
        assert status == 200 and json.loads(body)["status"] == "ready"
    finally:
        assert broker.stop() == 0
    lines = [line for line in broker.log_text().splitlines() if line.strip()]
    events = [json.loads(line) for line in lines]  # every line one JSON object
    assert all({"ts", "level", "logger", "msg"} <= set(e) for e in events)
    assert any(e["logger"] == "mqk.admin" and "admin listener" in e["msg"] for e in events)


def test_no_metrics_leaves_out_the_fetch_and_request_counters(tmp_path):
    broker = BrokerProcess(tmp_path / "data", storage="memory", extra_args=("--no-metrics",)).start()
    try:
        asyncio.run(_produce(broker.bootstrap, [produce_body("quiet", bytes(make_batch([b"a"])))]))
        samples = scrape(broker.admin_address)
        assert "mqk_partition_records_out_total" not in samples and "mqk_requests_total" not in samples
        # what went in is the store's to tell, counters or not
        assert value(samples, "mqk_partition_records_in_total", topic="quiet", partition="0") == 1
        assert value(samples, "mqk_partition_log_end_offset", topic="quiet", partition="0") == 1
    finally:
        broker.stop()


def test_what_went_in_counts_from_the_start_of_this_broker(tmp_path):
    """records/bytes in are the store's growth since this process started: a restart starts them again at 0 while the
    log keeps its size."""
    first, second = bytes(make_batch([b"a"] * 3)), bytes(make_batch([b"b"] * 2))
    broker = BrokerProcess(tmp_path / "data", storage="file").start()
    try:
        asyncio.run(_produce(broker.bootstrap, [produce_body("grow", first)]))
        broker.restart()
        asyncio.run(_produce(broker.bootstrap, [produce_body("grow", second)]))
        samples = scrape(broker.admin_address)
    finally:
        broker.stop()
    labels = {"topic": "grow", "partition": "0"}
    assert value(samples, "mqk_partition_records_in_total", **labels) == 2
    assert value(samples, "mqk_partition_bytes_in_total", **labels) == len(second)
    assert value(samples, "mqk_partition_log_size_bytes", **labels) == len(first) + len(second)
    assert value(samples, "mqk_partition_log_end_offset", **labels) == 5
