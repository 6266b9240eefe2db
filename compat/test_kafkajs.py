"""kafkajs (pure JavaScript) against mqk, driven through compat/js/kafkajs_client.js.

Each scenario runs in one node process and prints its observations as JSON; the assertions live here.
"""

from __future__ import annotations

import collections
import json
import subprocess
import time
from typing import Any

import pytest
from compat_helpers import JS_DIR, assert_stored_with, create_topic, hostport, node_command, node_env, run_node

pytestmark = pytest.mark.timeout(90)

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def kafkajs(bootstrap: str, command: str, timeout: float = 60, **options: Any) -> Any:
    return run_node("kafkajs_client.js", bootstrap, command, json.dumps(options), timeout=timeout)["result"]


@pytest.mark.parametrize("codec", CODECS)
def test_keys_headers_and_codec_round_trip(bootstrap: str, topic: str, codec: str) -> None:
    r = kafkajs(bootstrap, "roundtrip", topic=topic, codec=codec, n=20)
    assert r["sent"] == [{"partition": 0, "baseOffset": 0, "errorCode": 0}]
    assert_stored_with(bootstrap, topic, codec)
    got = sorted(r["got"], key=lambda m: m["offset"])
    assert [m["offset"] for m in got] == list(range(20))
    for sent, m in zip(r["messages"], got):
        assert m["key"] == sent["key"]
        assert m["value"] == sent["value"]
        assert m["headers"] == sent["headers"]
        assert abs(m["timestamp"] - time.time() * 1000) < 60_000


def test_consumer_group_join_and_leave_no_loss_no_duplicates(bootstrap: str, topic: str, group: str) -> None:
    create_topic(bootstrap, topic, 6)
    batch = 90
    values = kafkajs(bootstrap, "group", timeout=120, topic=topic, group=group, batch=batch)
    seen = collections.Counter(v for member in values.values() for v in member)
    every = set(range(3 * batch + 6))  # three batches, then one last value per partition
    assert not [v for v, n in seen.items() if n > 1], "duplicated across the rebalance"
    assert set(seen) == every, f"lost: {sorted(every - set(seen))[:20]}"
    assert all(values[m] for m in "abc"), {m: len(v) for m, v in values.items()}


def test_admin_topics_configs_and_offsets_by_timestamp(bootstrap: str, topic: str) -> None:
    r = kafkajs(bootstrap, "admin", topic=topic)
    assert r["created"] is True
    assert r["createdAgain"] is False  # kafkajs answers false for TOPIC_ALREADY_EXISTS
    assert r["listed"] is True
    assert r["partitions"] == [0, 1]
    assert r["configs"]["retention.ms"]["value"] == "7777777"
    assert r["configs"]["retention.ms"]["isDefault"] is False
    assert r["configs"]["cleanup.policy"]["value"] == "delete"
    assert r["configs"]["cleanup.policy"]["isDefault"] is True
    assert r["configsAfterAlter"]["retention.ms"]["value"] == "1000000"
    assert r["partitionsAfter"] == 3
    by_ts = {p["partition"]: int(p["offset"]) for p in r["byTimestamp"]}
    assert by_ts[0] == 3
    latest = {p["partition"]: (int(p["low"]), int(p["high"])) for p in r["offsets"]}
    assert latest[0] == (0, 6)
    assert r["listedAfterDelete"] is False


def test_commit_and_resume_after_broker_restart(file_broker: Any, topic: str, group: str) -> None:
    bootstrap = hostport(file_broker.bootstrap)
    create_topic(bootstrap, topic, 1)
    kafkajs(bootstrap, "produce", topic=topic, n=40)
    first = kafkajs(bootstrap, "consumeCommit", topic=topic, group=group, count=15)
    assert first["offsets"] == list(range(15))
    file_broker.stop()
    file_broker.restart()
    bootstrap = hostport(file_broker.bootstrap)
    second = kafkajs(bootstrap, "consumeCommit", topic=topic, group=group, count=25)
    assert second["offsets"] == list(range(15, 40))


def test_idempotent_producer_across_restart(file_broker: Any, topic: str) -> None:
    bootstrap = hostport(file_broker.bootstrap)
    create_topic(bootstrap, topic, 1)
    proc = subprocess.Popen(
        node_command("kafkajs_client.js", bootstrap, "idempotent", json.dumps({"topic": topic, "n": 20})),
        cwd=JS_DIR,
        env=node_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert "restart-now" in line, line + (proc.stderr.read() if proc.stderr else "")
        file_broker.stop()
        file_broker.restart()
        assert hostport(file_broker.bootstrap) == bootstrap
        out, err = proc.communicate("go\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    result = json.loads([x for x in out.splitlines() if x.startswith('{"result"')][-1])["result"]
    assert result["offsets"] == list(range(40))
    assert result["values"] == list(range(40))
