"""`mqk query --topic T --key K` against a real broker process on a file store: messages sent with KEYS over
remoting (mqk.client) and Kafka records with keys on an `index.keys=true` topic (kafka-python) are found, still
after a kill -9 and restart (the key index rebuilds its tail), and a key that matches nothing prints nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mqk.client import Producer
from mqk.testing import BrokerProcess


def mqk(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mqk", *args], capture_output=True, text=True, timeout=60)


def namesrv(broker: BrokerProcess) -> str:
    assert broker.namesrv_address is not None
    return f"{broker.namesrv_address[0]}:{broker.namesrv_address[1]}"


def query(broker: BrokerProcess, topic: str, key: str, *extra: str) -> list[dict]:
    out = mqk("query", "--topic", topic, "--key", key, "--namesrv", namesrv(broker), "--json", *extra)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.fixture
def broker(tmp_path: Path):
    b = BrokerProcess(tmp_path / "data", storage="file").start()
    yield b
    b.stop()


async def test_query_finds_both_protocols_messages_across_kill_9(broker: BrokerProcess) -> None:
    from kafka import KafkaProducer

    created = mqk(
        "topics",
        "create",
        "events",
        "--partitions",
        "2",
        "--config",
        "index.keys=true",
        "--bootstrap",
        broker.bootstrap,
    )
    assert created.returncode == 0, created.stderr
    assert broker.native_address is not None
    async with Producer(namesrv(broker)) as producer:
        await producer.send("orders", b"first order", keys=["order-1", "customer-9"], tags="TagA")
        await producer.send("orders", b"second order", keys=["order-2", "customer-9"], tags="TagB")
        await producer.send("events", b"native event", keys=["user-7"])
    kp = KafkaProducer(bootstrap_servers=broker.bootstrap)
    kp.send("events", key=b"user-7", value=b"kafka event", partition=1)
    kp.send("events", key=b"user-8", value=b"other user", partition=0)
    kp.flush()
    kp.close()

    def check(late: bool = False) -> None:
        hits = query(broker, "orders", "customer-9")
        if late:
            assert [h["body"] for h in hits[:1]] == ["third order"]
            assert [h["body"] for h in query(broker, "events", "user-8")] == ["late event", "other user"]
            hits = hits[1:]
        assert [(h["body"], h["tags"], h["keys"]) for h in hits] == [
            ("second order", "TagB", ["order-2", "customer-9"]),
            ("first order", "TagA", ["order-1", "customer-9"]),
        ]
        assert [(h["queue"], h["offset"]) for h in query(broker, "orders", "order-1")] == [
            (hits[1]["queue"], hits[1]["offset"])
        ]
        events = query(broker, "events", "user-7")
        assert sorted((h["body"], h["keys"]) for h in events) == [
            ("kafka event", ["user-7"]),
            ("native event", ["user-7"]),
        ]
        assert [h["queue"] for h in events if h["body"] == "kafka event"] == [1]
        if not late:
            assert [h["body"] for h in query(broker, "events", "user-8")] == ["other user"]
        assert query(broker, "orders", "no-such-key") == []
        assert len(query(broker, "orders", "customer-9", "--max", "1")) == 1
        assert query(broker, "orders", "customer-9", "--end-ms", "1") == []

    check()
    text = mqk("query", "--topic", "orders", "--key", "order-2", "--namesrv", namesrv(broker))
    assert text.returncode == 0 and text.stdout.count("\n") == 1
    assert "keys=order-2 customer-9" in text.stdout and "tags=TagB" in text.stdout
    assert text.stdout.rstrip().endswith("second order")

    # more of both right before the kill: most likely past the index checkpoint (taken every second), so
    # the restarted broker finds them through the tail it re-reads from the CommitLog
    async with Producer(namesrv(broker)) as producer:
        await producer.send("orders", b"third order", keys=["order-3", "customer-9"], tags="TagA")
    kp = KafkaProducer(bootstrap_servers=broker.bootstrap)
    kp.send("events", key=b"user-8", value=b"late event", partition=0)
    kp.flush()
    kp.close()
    broker.restart(kill=True)
    check(late=True)
    broker.restart()  # and a clean restart
    check(late=True)


def test_query_errors_are_one_line(broker: BrokerProcess) -> None:
    missing = mqk("query", "--topic", "nope", "--key", "k", "--namesrv", namesrv(broker))
    assert missing.returncode == 1 and "Traceback" not in missing.stderr and "nope" in missing.stderr
    bad = mqk("query", "--topic", "t", "--key", "k", "--namesrv", namesrv(broker), "--max", "0")
    assert bad.returncode == 1 and "--max" in bad.stderr
    down = mqk("query", "--topic", "t", "--key", "k", "--namesrv", "127.0.0.1:1")
    assert down.returncode == 1 and "Traceback" not in down.stderr
