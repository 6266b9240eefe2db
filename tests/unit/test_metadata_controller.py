"""The controller a cluster broker names in Metadata and DescribeCluster: admin clients send their controller
requests there, and librdkafka's admin client, told -1, waits for a controller until its request times out."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from mqk.broker.cluster.model import BrokerRecord
from mqk.server.kafka.handlers.metadata import brokers_and_controller


def answer(controller: int, live: list[int], me: int = 1) -> tuple[list[int], int]:
    records = [BrokerRecord(n, f"group-{n}", {"kafka": f"127.0.0.1:{9000 + n}"}) for n in live]
    cluster = SimpleNamespace(brokers=lambda: records, controller_id=lambda: controller)
    ctx: Any = SimpleNamespace(cluster=cluster, node_id=me)
    peer: Any = SimpleNamespace(listener=SimpleNamespace(key="kafka"), advertised=("127.0.0.1", 9000 + me))
    brokers, named = brokers_and_controller(ctx, peer)
    return [b["node_id"] for b in brokers], named


@pytest.mark.parametrize(
    ("elected", "live", "named"),
    [
        (2, [0, 1, 2], 2),  # the elected controller, listed: named
        (-1, [0, 1, 2], 1),  # no controller in this broker's view yet: this broker (it forwards admin writes)
        (7, [0, 1, 2], 1),  # a controller no longer listed (its registration went): this broker
        (-1, [0, 2], 0),  # this broker not in its own view (re-registering): the first one listed
        (-1, [], -1),  # nobody listed: nobody named
    ],
)
def test_the_named_controller_is_always_a_listed_broker(elected: int, live: list[int], named: int) -> None:
    listed, controller = answer(elected, live)
    assert listed == live
    assert controller == named
