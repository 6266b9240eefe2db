"""The web console's JSON API in cluster mode: each broker shows the cluster's topics (its view of the cluster's
metadata) and, per partition, whether it holds it; the overview names the broker and its cluster checks."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from helpers import CLUSTER_TESTS, wait_until

pytestmark = CLUSTER_TESTS


def api(address: tuple[str, int] | None, path: str) -> Any:
    assert address is not None
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}{path}", timeout=10) as resp:
        return json.loads(resp.read())


def test_each_broker_shows_the_clusters_topics_and_the_partitions_it_holds(mqk_cluster_factory):
    cluster = mqk_cluster_factory(2)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.create_topics([NewTopic("spread", 4, 1)], operation_timeout=30).values():
        future.result(30)

    def listed(address: tuple[str, int] | None) -> Any:
        topics = {t["name"]: t for t in api(address, "/api/topics")["topics"]}
        return topics.get("spread")

    for broker in cluster.brokers:
        overview = api(broker.admin, "/api/overview")
        assert overview["broker"]["cluster_mode"] and overview["broker"]["node_id"] == broker.node_id
        assert overview["checks"]["cluster"] and overview["checks"]["cluster_detail"]["registered"]
        assert wait_until(lambda b=broker: listed(b.admin), what="the topic in the broker's view")["partitions"] == 4

    def held() -> list[list[int]]:
        out = []
        for broker in cluster.brokers:
            partitions = api(broker.admin, "/api/topic?name=spread")["partitions"]
            out.append([p["partition"] for p in partitions if p["local"]])
        return out

    # one replica per partition: every partition is held by exactly one of the two brokers, and each broker names
    # the leader the cluster's metadata gives (what a Kafka client is told too). A broker opens the queues of its
    # partitions after its view shows the topic, so the listing may lag the topic by a moment.
    def held_everywhere() -> list[list[int]] | None:
        holders = held()
        return holders if sorted(holders[0] + holders[1]) == [0, 1, 2, 3] else None

    holders = wait_until(held_everywhere, what="every partition held by one broker")
    assert all(holders), holders
    leaders = {p: m.leader for p, m in admin.list_topics("spread", timeout=10).topics["spread"].partitions.items()}
    for broker, mine in zip(cluster.brokers, holders):
        for p in api(broker.admin, "/api/topic?name=spread")["partitions"]:
            assert p["leader"] == leaders[p["partition"]]
            assert p["leads"] == (p["partition"] in mine) == (leaders[p["partition"]] == broker.node_id)
        elsewhere = next(p for p in range(4) if p not in mine)
        try:
            api(broker.admin, f"/api/messages?topic=spread&partition={elsewhere}")
        except urllib.error.HTTPError as exc:
            assert exc.code == 404 and f"its leader is node {leaders[elsewhere]}" in json.loads(exc.read())["error"]
        else:
            raise AssertionError("a partition held elsewhere was browsed here")


def post(address: tuple[str, int] | None, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    assert address is not None
    request = urllib.request.Request(
        f"http://{address[0]}:{address[1]}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=40) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_any_brokers_console_resets_a_groups_offsets_across_the_cluster_and_consumers_resume_there(
    mqk_cluster_factory,
):
    """Two brokers, four partitions spread over them, the group's coordinator one of them: a reset through either
    console is committed by the coordinator with each partition's offsets from its leader (the other broker's for
    half of them), refused while the group has a member, and a consumer of the group then starts where it says."""
    cluster = mqk_cluster_factory(2, extra_args=["--admin-console-writes"])
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.create_topics([NewTopic("resets", 4, 1)], operation_timeout=30).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    base = 1_700_000_000_000
    for partition in range(4):
        for i in range(10):
            producer.produce("resets", b"%d-%d" % (partition, i), partition=partition, timestamp=base + i)
    assert producer.flush(30) == 0
    group = "console-resets"

    def committed() -> dict[int, int]:
        request = ConsumerGroupTopicPartitions(group, [TopicPartition("resets", p) for p in range(4)])
        answer = admin.list_consumer_group_offsets([request])[group].result(30)
        return {tp.partition: tp.offset for tp in answer.topic_partitions}

    first, second = cluster.brokers
    leaders = {p: m.leader for p, m in admin.list_topics("resets", timeout=10).topics["resets"].partitions.items()}
    assert sorted(set(leaders.values())) == [first.node_id, second.node_id]  # each console asks the other broker
    wait_until(
        lambda: all(p["partition"] is not None for p in api(first.admin, "/api/topic?name=resets")["partitions"]),
        what="the topic on the first broker",
    )
    status, answer = post(first.admin, "/api/group/reset-offsets", {"group": group, "topic": "resets", "to": "latest"})
    assert status == 200, answer
    assert committed() == dict.fromkeys(range(4), 10)
    body = {"group": group, "topic": "resets", "to": "offset", "value": 4}
    status, answer = post(second.admin, "/api/group/reset-offsets", body)
    assert status == 200 and [o["offset"] for o in answer["offsets"]] == [4] * 4, answer
    assert committed() == dict.fromkeys(range(4), 4)
    body = {"group": group, "topic": "resets", "to": "timestamp", "value": base + 6, "partitions": [1, 2]}
    status, answer = post(first.admin, "/api/group/reset-offsets", body)
    assert status == 200, answer
    assert committed() == {0: 4, 1: 6, 2: 6, 3: 4}

    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
        }
    )
    try:
        consumer.subscribe(["resets"])
        firsts: dict[int, int] = {}
        deadline = time.monotonic() + 30
        while len(firsts) < 4 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                firsts.setdefault(msg.partition(), msg.offset())
        assert firsts == {0: 4, 1: 6, 2: 6, 3: 4}
        # the group has a member now: both consoles refuse, the one that hands the reset on included
        for broker in cluster.brokers:
            status, answer = post(
                broker.admin, "/api/group/reset-offsets", {"group": group, "topic": "resets", "to": "earliest"}
            )
            assert status == 409 and "stop its consumers" in answer["error"], answer
        assert committed() == {0: 4, 1: 6, 2: 6, 3: 4}
    finally:
        consumer.close()
