"""ali-ons (pure-JS RocketMQ 4.x remoting client) against mqk's name server and broker, via compat/js/ons.js:
tags and keys, tag-filtered push consumption, delayed delivery, retry after a throwing handler, and two consumers
of one group sharing the queues without loss or duplicates."""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Any

import pytest
from compat_helpers import NodeProcess, create_topic, run_node, unique
from helpers import wait_until

from mqk.client import MessageQueue, PullConsumer

pytestmark = pytest.mark.timeout(90)


def ons_produce(namesrv: str, messages: list[dict[str, Any]], timeout: float = 40) -> list[dict[str, Any]]:
    results = run_node("ons.js", namesrv, "produce", json.dumps({"messages": messages}), timeout=timeout)["result"]
    assert [r["sendStatus"] for r in results] == ["SEND_OK"] * len(messages), results
    return results


def ons_consumer(namesrv: str, topic: str, group: str, **options: Any) -> NodeProcess:
    return NodeProcess("ons.js", namesrv, "consume", json.dumps({"topic": topic, "group": group, **options}))


def caught_up(namesrv: str, group: str, topic: str, queues: int, end: int | None = None) -> bool:
    """Whether `group` has committed every queue of `topic` up to the queue's end (and the queues hold `end`
    messages in all, when given): then nothing of it is left to deliver to the group (short of a rebalance).
    Asked with mqk's own client, which reads offsets without joining the group."""

    async def ask() -> list[tuple[int | None, int]]:
        async with PullConsumer(namesrv, group) as client:
            out = []
            for queue in range(queues):
                mq = MessageQueue(topic, "mqk-broker-a", queue)
                out.append((await client.committed_offset(mq), await client.max_offset(mq)))
            return out

    offsets = asyncio.run(ask())
    return all(committed == last for committed, last in offsets) and (
        end is None or sum(last for _, last in offsets) == end
    )


def wait_assigned(consumer: NodeProcess, queues: int, timeout: float = 20) -> None:
    wait_until(
        lambda: bool(consumer.of("assign")) and len(consumer.of("assign")[-1]["queues"]) == queues,
        timeout,
        f"the consumer to own {queues} queues ({consumer.diagnostics()})",
    )


def test_tags_keys_properties_and_tag_filtered_push_consumer(bootstrap: str, namesrv: str, topic: str) -> None:
    create_topic(bootstrap, topic, 4)
    tags = ["TagA", "TagB", "TagC"]
    messages = [
        {
            "topic": topic,
            "tags": tags[i % 3],
            "keys": [f"key-{i}", f"order-{i}"],
            "body": f"ons body {i}",
            "props": {"color": f"c{i}"},
        }
        for i in range(12)
    ]
    sent = ons_produce(namesrv, messages)
    assert len({r["msgId"] for r in sent}) == 12
    assert {r["queueId"] for r in sent} <= {0, 1, 2, 3}
    per_queue = collections.defaultdict(list)
    for r in sent:
        per_queue[r["queueId"]].append(r["queueOffset"])
    assert all(offs == list(range(len(offs))) for offs in per_queue.values()), per_queue

    group = unique("ons-tags")
    consumer = ons_consumer(namesrv, topic, group, subExpression="TagA || TagB")
    try:
        wait_until(lambda: len(consumer.of("msg")) >= 8, 30, f"8 TagA/TagB messages ({consumer.diagnostics()})")
        # the group has acknowledged every queue to its end: a TagC message let through was delivered before
        wait_until(lambda: caught_up(namesrv, group, topic, 4, 12), 30, "the group to commit every queue")
        got = consumer.of("msg")
    finally:
        consumer.close()
    expected = {i for i in range(12) if i % 3 != 2}
    bodies = [m["body"] for m in got]
    assert sorted(bodies) == sorted(f"ons body {i}" for i in expected), bodies
    by_body = {m["body"]: m for m in got}
    for i in expected:
        m, r = by_body[f"ons body {i}"], sent[i]
        assert m["tags"] == tags[i % 3]
        assert m["keys"] == f"key-{i} order-{i}"
        assert m["props"]["color"] == f"c{i}"
        assert (m["queueId"], m["queueOffset"]) == (r["queueId"], r["queueOffset"])
        assert m["msgId"] == r["msgId"]  # offset message id: store host + physical offset
        assert m["reconsumeTimes"] == 0
        assert m["storeTimestamp"] >= m["bornTimestamp"] - 1000


def test_delayed_delivery(bootstrap: str, namesrv: str, topic: str) -> None:
    create_topic(bootstrap, topic, 2)
    consumer = ons_consumer(namesrv, topic, unique("ons-delay"))
    try:
        wait_assigned(consumer, 2)
        sent = ons_produce(
            namesrv,
            [
                {"topic": topic, "tags": "T", "body": "at-3s", "deliverAfterMs": 3000},
                {"topic": topic, "tags": "T", "body": "level-1", "delayLevel": 1},  # 1 s
                {"topic": topic, "tags": "T", "body": "now"},
            ],
        )
        wait_until(lambda: len(consumer.of("msg")) >= 3, 20, f"3 messages ({consumer.diagnostics()})")
        got = {m["body"]: m for m in consumer.of("msg")}
    finally:
        consumer.close()
    lateness = {body: got[body]["receivedAt"] - sent[i]["sentAt"] for i, body in enumerate(["at-3s", "level-1", "now"])}
    assert 2900 <= lateness["at-3s"] <= 3000 + 2500, lateness
    assert 900 <= lateness["level-1"] <= 1000 + 2500, lateness
    assert lateness["now"] < 2000, lateness
    assert got["at-3s"]["topic"] == topic and got["level-1"]["topic"] == topic


def test_retry_after_handler_throws(bootstrap: str, namesrv: str, topic: str) -> None:
    create_topic(bootstrap, topic, 1)
    group = unique("ons-retry")
    consumer = ons_consumer(namesrv, topic, group, failFirst=True)
    try:
        wait_assigned(consumer, 1)
        ons_produce(namesrv, [{"topic": topic, "tags": "R", "keys": [f"r{i}"], "body": f"retry-{i}"} for i in range(2)])
        wait_until(lambda: len(consumer.of("fail")) >= 2, 20, f"the first deliveries ({consumer.diagnostics()})")
        # Sent back with delay level 0: the broker picks the delay (RocketMQ: level 3 + reconsume times = 10 s).
        wait_until(lambda: len(consumer.of("msg")) >= 2, 40, f"the retried deliveries ({consumer.diagnostics()})")
        # both originals and both retries (the retry topic holds exactly two) acknowledged: nothing more can come
        wait_until(
            lambda: caught_up(namesrv, group, topic, 1, 2) and caught_up(namesrv, group, f"%RETRY%{group}", 1, 2),
            20,
            "the group to commit the originals and the retries",
        )
        fails, retried = consumer.of("fail"), consumer.of("msg")
    finally:
        consumer.close()
    assert sorted(m["body"] for m in fails) == ["retry-0", "retry-1"]
    assert sorted(m["body"] for m in retried) == ["retry-0", "retry-1"]
    for m in retried:
        assert m["reconsumeTimes"] >= 1
        assert m["topic"] == topic  # the client restores the original topic from the RETRY_TOPIC property
        assert m["props"].get("KEYS") == m["body"].replace("retry-", "r")


def test_two_consumers_in_one_group_share_queues(bootstrap: str, namesrv: str, topic: str) -> None:
    create_topic(bootstrap, topic, 8)
    group = unique("ons-share")
    x = ons_consumer(namesrv, topic, group)
    y = ons_consumer(namesrv, topic, group)
    try:

        def settled() -> bool:
            qx = set(x.of("assign")[-1]["queues"]) if x.of("assign") else set()
            qy = set(y.of("assign")[-1]["queues"]) if y.of("assign") else set()
            return len(qx) == 4 and len(qy) == 4 and not (qx & qy)

        wait_until(settled, 30, f"4 + 4 disjoint queues (x: {x.diagnostics()} y: {y.diagnostics()})")
        ons_produce(namesrv, [{"topic": topic, "tags": "S", "body": f"share-{i}"} for i in range(40)])
        wait_until(lambda: len(x.of("msg")) + len(y.of("msg")) >= 40, 30, "40 messages")
        wait_until(lambda: caught_up(namesrv, group, topic, 8, 40), 30, "the group to commit all 40")
        first_x, first_y = [m["body"] for m in x.of("msg")], [m["body"] for m in y.of("msg")]

        y.close()  # y leaves: x must take over y's queues from y's committed offsets
        wait_assigned(x, 8, timeout=30)
        ons_produce(namesrv, [{"topic": topic, "tags": "S", "body": f"after-{i}"} for i in range(16)])
        wait_until(lambda: len(x.of("msg")) - len(first_x) >= 16, 30, "16 messages after y left")
        wait_until(lambda: caught_up(namesrv, group, topic, 8, 56), 30, "the group to commit all 56")
        all_x = [m["body"] for m in x.of("msg")]
    finally:
        x.close()
        y.close()
    assert first_x and first_y, (len(first_x), len(first_y))
    counts = collections.Counter(first_x + first_y)
    assert not [b for b, n in counts.items() if n > 1], "duplicates between the two consumers"
    assert set(counts) == {f"share-{i}" for i in range(40)}
    after = all_x[len(first_x) :]
    assert sorted(after) == sorted(f"after-{i}" for i in range(16)), after
