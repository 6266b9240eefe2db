"""The web console's JSON API (mqk.server.admin.console) against an in-process broker: topics with partitions, sizes,
offsets and configs; records by offset, by timestamp and by key (Kafka keys and RocketMQ KEYS through the key index)
with their headers and RocketMQ properties; groups with members and lag; the timer's pending messages; escaping of
untrusted bytes; and the write guard (off by default; a JSON body from the console's own origin; a reset refused
while the group has members)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until

from mqk.cli import _serve_parser, build_config
from mqk.config import BrokerConfig
from mqk.protocol.native.records import message_to_batch
from mqk.server.admin.console import MAX_SHOWN, safe_json, shown_bytes
from mqk.server.kafka.rawclient import make_batch
from mqk.store.adapter import GroupOffset
from mqk.testing import ThreadedBroker, broker_config

EVIL = b"<img src=x onerror=alert(1)>&amp;"


def request(
    address: tuple[str, int] | None,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, raw body) of one request to the admin listener (POST when `body` is given)."""
    assert address is not None
    data = None if body is None else json.dumps(body).encode()
    sent = {"Content-Type": "application/json"} if body is not None else {}
    sent.update(headers or {})
    req = urllib.request.Request(f"http://{address[0]}:{address[1]}{path}", data=data, headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def get_json(broker: ThreadedBroker, path: str, status: int = 200) -> Any:
    code, headers, raw = request(broker.admin_address, path)
    assert code == status, raw
    assert headers["Content-Type"].startswith("application/json")
    assert headers["X-Content-Type-Options"] == "nosniff"
    return json.loads(raw)


def append(broker: ThreadedBroker, topic: str, partition: int, batch: Any, **kwargs: Any) -> None:
    broker.call(broker.store.append(topic, partition, [bytes(batch)], **kwargs))


@pytest.fixture
def writable_broker(tmp_path: Path) -> Iterator[ThreadedBroker]:
    config = dataclasses.replace(broker_config("memory", tmp_path / "data"), admin_console_writes=True)
    broker = ThreadedBroker(config).start()
    yield broker
    broker.stop()


def test_shown_bytes_cut_long_values_and_tell_binary_from_a_cut_character():
    assert shown_bytes(None) is None
    assert shown_bytes(b"abc") == {"size": 3, "text": "abc", "truncated": False, "binary": False}
    binary = shown_bytes(b"\xff\x00a")
    assert binary is not None and binary["binary"] and binary["base64"] == "/wBh"
    long = shown_bytes(b"a" * (MAX_SHOWN - 1) + "é".encode() * 4)  # a two-byte character cut at the limit
    assert long is not None and long["truncated"] and not long["binary"] and long["size"] == MAX_SHOWN + 7
    assert len(long["text"]) == MAX_SHOWN  # (MAX_SHOWN - 1 letters and a replacement character)


def test_json_answers_carry_no_markup_characters_and_read_back_unchanged():
    value = {"v": EVIL.decode(), "k<": "</script>"}
    response = safe_json(value)
    assert not {b"<", b">", b"&"} & {bytes([c]) for c in response.body}
    assert json.loads(response.body) == value
    assert ("X-Content-Type-Options", "nosniff") in response.headers


def test_the_page_is_served_with_a_policy_that_runs_only_its_own_script(mqk_broker):
    code, headers, raw = request(mqk_broker.admin_address, "/console/")
    assert code == 200 and headers["Content-Type"].startswith("text/html")
    policy = headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert b'<script src="/console/console.js">' in raw
    code, headers, raw = request(mqk_broker.admin_address, "/console/console.js")
    assert code == 200 and b"innerHTML" not in raw and b"textContent" in raw
    host, port = mqk_broker.admin_address
    req = urllib.request.Request(f"http://{host}:{port}/")
    opener = urllib.request.build_opener(_NoRedirect())
    with pytest.raises(urllib.error.HTTPError) as redirect:
        opener.open(req, timeout=10)
    assert redirect.value.code == 302 and redirect.value.headers["Location"] == "/console/"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_topics_partitions_sizes_offsets_and_configs(mqk_broker):
    mqk_broker.call(mqk_broker.runtime.broker.topics.create("orders", 2, {"retention.ms": "60000"}))
    append(mqk_broker, "orders", 1, make_batch([b"a", b"b", b"c"]))
    listed = {t["name"]: t for t in get_json(mqk_broker, "/api/topics")["topics"]}
    orders = listed["orders"]
    assert orders["partitions"] == 2 and orders["records"] == 3 and orders["size_bytes"] > 0
    assert orders["overrides"] == {"retention.ms": "60000"} and not orders["internal"]
    topic = get_json(mqk_broker, "/api/topic?name=orders")
    p0, p1 = topic["partitions"]
    assert (p0["log_start_offset"], p0["log_end_offset"], p0["size_bytes"]) == (0, 0, 0)
    assert (p1["log_end_offset"], p1["records"]) == (3, 3) and p1["size_bytes"] == orders["size_bytes"]
    configs = {c["name"]: c for c in topic["configs"]}
    assert configs["retention.ms"] == {"name": "retention.ms", "value": "60000", "default": False, "acted_on": True}
    assert configs["cleanup.policy"]["default"] and configs["cleanup.policy"]["value"] == "delete"
    assert get_json(mqk_broker, "/api/topic?name=nope", 404)["error"] == "no topic 'nope'"


def test_records_by_offset_and_timestamp_with_headers_escaped(mqk_broker):
    mqk_broker.call(mqk_broker.runtime.broker.topics.create("browse", 1))
    append(mqk_broker, "browse", 0, make_batch([b"one", b"two"], keys=[b"k1", None], timestamp=1_000_000))
    headers = [[("trace<", b"x&y"), ("empty", None)]]
    append(mqk_broker, "browse", 0, make_batch([EVIL], keys=[b"k3"], timestamp=2_000_000, headers=headers))
    code, _h, raw = request(mqk_broker.admin_address, "/api/messages?topic=browse&partition=0&offset=1&limit=5")
    assert code == 200 and b"<" not in raw and b"&" not in raw  # what the message carries stays inert
    page = json.loads(raw)
    assert [r["offset"] for r in page["records"]] == [1, 2]
    two, evil = page["records"]
    assert two["key"] is None and two["value"]["text"] == "two" and two["timestamp"] == 1_000_001
    assert evil["value"]["text"] == EVIL.decode() and evil["key"]["text"] == "k3"
    assert evil["headers"] == [
        {"key": "trace<", "value": {"size": 3, "text": "x&y", "truncated": False, "binary": False}},
        {"key": "empty", "value": None},
    ]
    assert "rocketmq" not in evil  # a Kafka record: no RocketMQ properties to show
    limited = get_json(mqk_broker, "/api/messages?topic=browse&partition=0&limit=1")
    assert [r["offset"] for r in limited["records"]] == [0] and limited["next_offset"] == 1
    by_time = get_json(mqk_broker, "/api/messages?topic=browse&partition=0&timestamp=1500000")
    assert by_time["by"] == "timestamp" and [r["offset"] for r in by_time["records"]] == [2]
    assert get_json(mqk_broker, "/api/messages?topic=browse&partition=3", 404)["error"].endswith("no partition 3")
    assert "integer" in get_json(mqk_broker, "/api/messages?topic=browse&offset=x", 400)["error"]


def test_records_by_key_through_the_key_index_with_rocketmq_properties(mqk_file_broker):
    topics = mqk_file_broker.runtime.broker.topics
    mqk_file_broker.call(topics.create("keyed", 2, {"index.keys": "true"}))
    append(mqk_file_broker, "keyed", 0, make_batch([b"v0"], keys=[b"user-1"]))
    append(mqk_file_broker, "keyed", 1, make_batch([b"v1"], keys=[b"user-2"]))
    append(mqk_file_broker, "keyed", 1, make_batch([b"v2"], keys=[b"user-1"]))
    props = {"TAGS": "tagA", "KEYS": "order-7 order-8", "UNIQ_KEY": "ABC"}
    native = message_to_batch(b"rocket", props, 3_000_000, flag=4, born_host=("127.0.0.1", 5555))
    append(mqk_file_broker, "keyed", 0, native, keys=[b"order-7", b"order-8"], properties=props)
    found = get_json(mqk_file_broker, "/api/messages?topic=keyed&key=user-1")
    assert found["by"] == "key" and found["key_index"]
    assert sorted((r["partition"], r["value"]["text"]) for r in found["records"]) == [(0, "v0"), (1, "v2")]
    rocket = get_json(mqk_file_broker, "/api/messages?topic=keyed&key=order-8")["records"]
    assert len(rocket) == 1
    shown = rocket[0]["rocketmq"]
    assert shown["properties"] == props and shown["tags"] == "tagA" and shown["keys"] == ["order-7", "order-8"]
    assert shown["flag"] == "4" and shown["born_host"] == "127.0.0.1:5555"
    assert get_json(mqk_file_broker, "/api/messages?topic=keyed&key=nobody")["records"] == []


def test_groups_with_lag_and_members(mqk_broker):
    runtime = mqk_broker.runtime
    mqk_broker.call(runtime.broker.topics.create("lagged", 2))
    append(mqk_broker, "lagged", 0, make_batch([b"x"] * 5))
    append(mqk_broker, "lagged", 1, make_batch([b"y"] * 3))
    offsets = {("lagged", 0): GroupOffset(2), ("lagged", 1): GroupOffset(3)}
    mqk_broker.call(runtime.store.commit_offsets("readers", offsets))
    groups = {g["group"]: g for g in get_json(mqk_broker, "/api/groups")["groups"]}
    assert groups["readers"]["lag"] == 3 and groups["readers"]["members"] == 0
    group = get_json(mqk_broker, "/api/group?id=readers")
    assert group["state"] == "Empty" and group["lag"] == 3
    assert [(o["partition"], o["committed_offset"], o["log_end_offset"], o["lag"]) for o in group["offsets"]] == [
        (0, 2, 5, 3),
        (1, 3, 3, 0),
    ]
    _join(mqk_broker, "readers")
    group = wait_until(lambda: (g := get_json(mqk_broker, "/api/group?id=readers"))["members"] and g, what="a member")
    assert group["members"][0]["client_id"] == "console-test" and group["members"][0]["client_host"] == "10.0.0.1"
    assert get_json(mqk_broker, "/api/group?id=ghost", 404)["error"] == "no group 'ghost'"


def _join(broker: ThreadedBroker, group: str) -> None:
    """A Kafka member joins `group` through the coordinator (left running: the group then has a member)."""
    coordinator = broker.runtime.kafka.groups
    asyncio.run_coroutine_threadsafe(
        coordinator.join(
            group,
            "",
            "consumer",
            [("range", b"")],
            session_timeout_ms=30_000,
            client_id="console-test",
            client_host="10.0.0.1",
        ),
        broker.loop,
    )


def test_delayed_messages_pending_with_their_target(mqk_broker):
    mqk_broker.call(mqk_broker.runtime.broker.topics.create("later", 2))
    batch = make_batch([b"soon"], keys=[b"k"], headers=[[("mqk-delay-ms", b"3600000")]])
    append(mqk_broker, "later", 1, batch)
    delayed = get_json(mqk_broker, "/api/delayed")
    assert delayed["enabled"] and delayed["pending"] == 1
    (item,) = delayed["items"]
    assert item["topic"] == "later" and item["queue"] == 1 and item["size_bytes"] == len(batch)
    assert item["records"] == 1 and [k["text"] for k in item["keys"]] == ["k"]
    assert item["due_ms"] > 0
    stats = get_json(mqk_broker, "/api/stats")
    assert stats["timer_pending"] == 1 and stats["ready"]


def test_writes_are_refused_unless_enabled(mqk_broker):
    code, _h, raw = request(mqk_broker.admin_address, "/api/topics", {"name": "made", "partitions": 1})
    assert code == 403 and b"admin_console_writes" in raw
    assert mqk_broker.store.topic("made") is None
    code, _h, raw = request(mqk_broker.admin_address, "/api/group/reset-offsets", {"group": "g", "topic": "t"})
    assert code == 403
    assert not get_json(mqk_broker, "/api/overview")["writes"]


def test_enabled_writes_take_json_from_their_own_origin(writable_broker):
    broker = writable_broker
    address = broker.admin_address
    assert address is not None
    assert get_json(broker, "/api/overview")["writes"]
    code, _h, _raw = request(address, "/api/topics", {"name": "made"}, {"Content-Type": "text/plain"})
    assert code == 415
    code, _h, _raw = request(address, "/api/topics", {"name": "made"}, {"Origin": "http://evil.example"})
    assert code == 403 and broker.store.topic("made") is None
    same_origin = {"Origin": f"http://{address[0]}:{address[1]}"}
    code, _h, raw = request(address, "/api/topics", {"name": "made", "partitions": 3}, same_origin)
    assert code == 200 and json.loads(raw) == {"created": "made", "partitions": 3}
    assert broker.store.topic("made").queue_count == 3
    code, _h, raw = request(address, "/api/topics", {"name": "made", "partitions": 3})
    assert code == 400 and b"cannot create" in raw
    code, _h, raw = request(address, "/api/topics", {"name": "bad name!"})
    assert code == 400


def test_reset_offsets_of_an_empty_group_and_refused_while_it_has_members(writable_broker):
    broker = writable_broker
    address = broker.admin_address
    runtime = broker.runtime
    broker.call(runtime.broker.topics.create("r", 2))
    append(broker, "r", 0, make_batch([b"x"] * 4, timestamp=1_000))
    append(broker, "r", 1, make_batch([b"y"] * 2, timestamp=5_000))
    code, _h, raw = request(address, "/api/group/reset-offsets", {"group": "idle", "topic": "r", "to": "latest"})
    assert code == 200, raw
    assert {tp: o.offset for tp, o in broker.store.fetch_offsets("idle").items()} == {("r", 0): 4, ("r", 1): 2}
    body = {"group": "idle", "topic": "r", "to": "timestamp", "value": 1_002, "partitions": [0]}
    code, _h, raw = request(address, "/api/group/reset-offsets", body)
    assert code == 200 and json.loads(raw)["offsets"] == [{"topic": "r", "partition": 0, "offset": 2}]
    code, _h, raw = request(address, "/api/group/reset-offsets", {"group": "idle", "topic": "r", "to": "offset"})
    assert code == 400 and b"integer value" in raw
    _join(broker, "busy")
    wait_until(lambda: get_json(broker, "/api/group?id=busy")["members"], what="a member of busy")
    code, _h, raw = request(address, "/api/group/reset-offsets", {"group": "busy", "topic": "r", "to": "earliest"})
    assert code == 409 and b"stop its consumers" in raw
    assert broker.store.fetch_offsets("busy") == {}


def test_the_write_switch_comes_from_toml_or_the_command_line(tmp_path):
    toml = tmp_path / "broker.toml"
    toml.write_text("admin_console_writes = true\n")
    assert BrokerConfig.load(toml).admin_console_writes
    assert not BrokerConfig.load().admin_console_writes
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    _serve_parser(sub)
    assert build_config(parser.parse_args(["serve", "--admin-console-writes"])).admin_console_writes
    assert not build_config(parser.parse_args(["serve"])).admin_console_writes
