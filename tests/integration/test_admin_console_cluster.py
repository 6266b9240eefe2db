"""The web console's JSON API in cluster mode: each broker shows the cluster's topics (its view of the cluster's
metadata) and, per partition, whether it holds it; the overview names the broker and its cluster checks."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from helpers import wait_until


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
