"""kcat (librdkafka's command-line client) against mqk: metadata listing, codecs with keys and headers,
offset-by-timestamp queries, and a balanced consumer group that commits and resumes across a broker restart."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
from compat_helpers import SESSION_TIMEOUT_MS, assert_stored_with, create_topic, hostport

pytestmark = pytest.mark.timeout(60)

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def run_kcat(kcat: str, *args: str, stdin: str | None = None, timeout: float = 30) -> str:
    proc = subprocess.run([kcat, *args], check=False, input=stdin, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"kcat {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout


def consume_json(kcat: str, bootstrap: str, topic: str, *extra: str) -> list[dict[str, Any]]:
    out = run_kcat(kcat, "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-J", "-q", *extra)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_metadata_listing(kcat: str, bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, 3)
    md = json.loads(run_kcat(kcat, "-b", bootstrap, "-L", "-J", "-m", "10"))
    assert [b["name"] for b in md["brokers"]] == [bootstrap]
    broker_id = md["brokers"][0]["id"]
    topics = {t["topic"]: t for t in md["topics"]}
    assert topic in topics
    parts = sorted(topics[topic]["partitions"], key=lambda p: p["partition"])
    assert [p["partition"] for p in parts] == [0, 1, 2]
    assert all(p["leader"] == broker_id for p in parts)
    assert all(not p.get("error") for p in parts)
    # The plain text listing too (what people type).
    text = run_kcat(kcat, "-b", bootstrap, "-L", "-t", topic)
    assert f'topic "{topic}" with 3 partitions' in text


@pytest.mark.parametrize("codec", CODECS)
def test_produce_consume_keys_headers_codec(kcat: str, bootstrap: str, topic: str, codec: str) -> None:
    lines = [f"key{i}:value {i} {'x' * i}" for i in range(40)]
    run_kcat(
        kcat,
        "-b",
        bootstrap,
        "-P",
        "-t",
        topic,
        "-p",
        "0",
        "-K",
        ":",
        "-X",
        f"compression.codec={codec}",
        # all 40 lines in one batch: librdkafka sends a batch uncompressed when compressing does not shrink it, as
        # with a lone first record that left before the others were read
        "-X",
        "linger.ms=500",
        "-H",
        "source=kcat",
        "-H",
        f"codec={codec}",
        stdin="\n".join(lines) + "\n",
    )
    assert_stored_with(bootstrap, topic, codec)
    got = consume_json(kcat, bootstrap, topic)
    assert [m["offset"] for m in got] == list(range(40))
    assert [f"{m['key']}:{m['payload']}" for m in got] == lines
    assert all(m["headers"] == ["source", "kcat", "codec", codec] for m in got)
    assert all(m["partition"] == 0 and m["tstype"] == "create" for m in got)


def test_query_offset_by_timestamp(kcat: str, bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    base = int(time.time() * 1000) - 20_000
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(5):
        producer.produce(topic, value=str(i).encode(), partition=0, timestamp=base + i * 1000)
        producer.flush(10)
    out = run_kcat(kcat, "-b", bootstrap, "-Q", "-t", f"{topic}:0:{base + 2500}")
    assert f"{topic} [0] offset 3" in out, out
    got = consume_json(kcat, bootstrap, topic, "-o", f"s@{base + 1000}")
    assert [m["payload"] for m in got] == ["1", "2", "3", "4"]


def test_group_commit_resume_across_restart(kcat: str, file_broker: Any, topic: str, group: str) -> None:
    bootstrap = hostport(file_broker.bootstrap)
    create_topic(bootstrap, topic, 2)
    run_kcat(
        kcat,
        "-b",
        bootstrap,
        "-P",
        "-t",
        topic,
        "-p",
        "0",
        "-X",
        "acks=all",
        stdin="".join(f"{i}\n" for i in range(30)),
    )
    group_args = [
        "-b",
        bootstrap,
        "-G",
        group,
        "-J",
        "-q",
        "-X",
        "auto.offset.reset=earliest",
        "-X",
        f"session.timeout.ms={SESSION_TIMEOUT_MS}",
        "-X",
        "heartbeat.interval.ms=1000",
    ]
    first = [json.loads(x) for x in run_kcat(kcat, *group_args, "-c", "10", topic).splitlines() if x.strip()]
    assert [int(m["payload"]) for m in first] == list(range(10))

    file_broker.stop()
    file_broker.restart()
    bootstrap = hostport(file_broker.bootstrap)
    group_args[1] = bootstrap
    second = [json.loads(x) for x in run_kcat(kcat, *group_args, "-c", "20", topic).splitlines() if x.strip()]
    assert [int(m["payload"]) for m in second] == list(range(10, 30))
