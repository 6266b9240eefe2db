"""`mqk topics|groups|produce|consume` against a real broker, run as a person would: subprocesses, exit codes, text."""

from __future__ import annotations

import json
import subprocess
import sys


def mqk(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mqk", *args], input=stdin, capture_output=True, text=True, timeout=60)


def test_topic_life_cycle_and_records_round_trip(mqk_broker):
    b = ("--bootstrap", mqk_broker.bootstrap)
    created = mqk("topics", "create", "orders", "--partitions", "3", "--config", "retention.ms=3600000", *b)
    assert created.returncode == 0, created.stderr
    listed = mqk("topics", "list", *b)
    assert "orders\tpartitions=3" in listed.stdout

    produced = mqk(
        "produce",
        "--topic",
        "orders",
        "--partition",
        "2",
        "--key",
        "k",
        "--header",
        "h=v",
        *b,
        stdin="one\ntwo\nthree\n",
    )
    assert produced.returncode == 0, produced.stderr
    consumed = mqk("consume", "--topic", "orders", "--partition", "2", "--json", "--max-messages", "3", *b)
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert [(r["offset"], r["key"], r["value"], r["headers"]) for r in records] == [
        (0, "k", "one", {"h": "v"}),
        (1, "k", "two", {"h": "v"}),
        (2, "k", "three", {"h": "v"}),
    ]

    described = mqk("topics", "describe", "orders", *b).stdout
    assert "partition 2\tleader=0\tend_offset=3" in described
    assert "retention.ms=3600000  (set)" in described
    assert "cleanup.policy=delete" in described

    assert mqk("topics", "delete", "orders", *b).returncode == 0
    again = mqk("topics", "delete", "orders", *b)
    assert again.returncode == 1 and "UnknownTopicOrPartition" in again.stderr


def test_creating_an_existing_topic_fails_with_its_error_name(mqk_broker):
    b = ("--bootstrap", mqk_broker.bootstrap)
    assert mqk("topics", "create", "t", *b).returncode == 0
    dup = mqk("topics", "create", "t", *b)
    assert dup.returncode == 1 and "TopicAlreadyExists" in dup.stderr


def test_unreachable_broker_is_one_line_not_a_traceback():
    out = mqk("topics", "list", "--bootstrap", "127.0.0.1:1")
    assert out.returncode == 1
    assert "cannot reach the broker" in out.stderr and "Traceback" not in out.stderr


def test_delete_records_moves_the_log_start_and_consume_follows(mqk_broker):
    b = ("--bootstrap", mqk_broker.bootstrap)
    assert mqk("produce", "--topic", "dr", *b, stdin="".join(f"r{i}\n" for i in range(5))).returncode == 0
    moved = mqk("topics", "delete-records", "dr", "--before", "3", *b)
    assert moved.returncode == 0, moved.stderr
    assert "now starts at offset 3" in moved.stdout
    consumed = mqk("consume", "--topic", "dr", "--json", "--max-messages", "2", *b)
    assert [json.loads(line)["value"] for line in consumed.stdout.splitlines()] == ["r3", "r4"]
    beyond = mqk("topics", "delete-records", "dr", "--before", "99", *b)
    assert beyond.returncode == 1 and "OffsetOutOfRange" in beyond.stderr


def test_native_protocol_produce_and_consume_with_tags(mqk_broker):
    host, port = mqk_broker.namesrv_address
    n = ("--protocol", "native", "--namesrv", f"{host}:{port}")
    assert mqk("topics", "create", "nat", "--bootstrap", mqk_broker.bootstrap).returncode == 0
    sent = mqk("produce", "--topic", "nat", "--tags", "red", "--key", "k1", *n, stdin="a\nb\n")
    assert sent.returncode == 0, sent.stderr
    assert mqk("produce", "--topic", "nat", "--tags", "blue", *n, stdin="c\n").returncode == 0
    red = mqk("consume", "--topic", "nat", "--tags", "red", "--json", "--timeout", "2", *n)
    assert red.returncode == 0, red.stderr
    got = [json.loads(line) for line in red.stdout.splitlines()]
    assert [(m["value"], m["tags"], m["keys"]) for m in got] == [("a", "red", ["k1"]), ("b", "red", ["k1"])]
    # the same messages through Kafka: the first key is the record key
    kafka = mqk("consume", "--topic", "nat", "--json", "--max-messages", "3", "--bootstrap", mqk_broker.bootstrap)
    assert [(r["key"], r["value"]) for r in map(json.loads, kafka.stdout.splitlines())] == [
        ("k1", "a"),
        ("k1", "b"),
        (None, "c"),
    ]
