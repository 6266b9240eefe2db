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


def test_quotas_set_list_and_remove_and_what_the_broker_then_holds(mqk_broker):
    b = ("--bootstrap", mqk_broker.bootstrap)
    set_ = mqk("quotas", "set", "--user", "alice", "--client-id", "etl", "--producer-byte-rate", "1048576", *b)
    assert set_.returncode == 0, set_.stderr
    assert "user=alice, client-id=etl: producer_byte_rate=1048576" in set_.stdout
    assert mqk("quotas", "set", "--client-id-default", "--consumer-byte-rate", "5e6", *b).returncode == 0
    listed = mqk("quotas", "list", *b)
    assert listed.stdout.splitlines() == [
        "client-id=<default>\tconsumer_byte_rate=5000000",
        "user=alice, client-id=etl\tproducer_byte_rate=1048576",
    ]
    # what the broker's own quotas say applies to that client (the CLI changed the broker, not just printed)
    assert mqk_broker.call(_quota_for(mqk_broker, "producer_byte_rate", "alice", "etl")) == 1048576
    refused = mqk("quotas", "set", "--user", "bob", "--producer-byte-rate", "-1", *b)
    assert refused.returncode == 1 and "positive number" in refused.stderr
    nothing = mqk("quotas", "set", "--producer-byte-rate", "10", *b)
    assert nothing.returncode != 0 and "name a user" in nothing.stderr
    assert mqk("quotas", "remove", "--user", "alice", "--client-id", "etl", *b).returncode == 0
    as_json = json.loads(mqk("quotas", "list", "--json", *b).stdout)
    assert as_json == [
        {"entity": [{"entity_type": "client-id", "entity_name": None}], "values": {"consumer_byte_rate": 5e6}}
    ]


async def _quota_for(broker, key: str, user: str, client_id: str) -> float | None:
    found = broker.runtime.broker.quotas.quota_for(key, user, client_id)
    return None if found is None else found[0]
