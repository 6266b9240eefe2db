"""The settings of reads from replicas: RocketMQ's slave reads (`native_slave_read_enable` and its in-memory ratio)
and Kafka's replica selector with the broker's rack (KIP-392), checked as the broker starts."""

from __future__ import annotations

import pytest

from mqk.config import RACK_AWARE_REPLICA_SELECTOR, BrokerConfig


@pytest.mark.parametrize("ratio", [-1, 101])
def test_the_in_memory_ratio_of_slave_reads_is_a_percentage(ratio: int) -> None:
    with pytest.raises(ValueError, match="percentage"):
        BrokerConfig(native_slave_read_enable=True, native_access_message_in_memory_max_ratio=ratio)


@pytest.mark.parametrize("name", [RACK_AWARE_REPLICA_SELECTOR, "RackAwareReplicaSelector"])
def test_the_rack_aware_selector_is_known_by_its_class_name_or_its_short_name(name: str) -> None:
    config = BrokerConfig(broker_rack="eu-1a", replica_selector_class=name)
    assert config.rack_aware_fetching and config.broker_rack == "eu-1a"
    assert not BrokerConfig().rack_aware_fetching


def test_an_unknown_replica_selector_is_refused() -> None:
    with pytest.raises(ValueError, match="not known"):
        BrokerConfig(replica_selector_class="com.example.NearestReplicaSelector")
