"""Where the controller places a topic's partitions over broker groups (mqk.broker.cluster.placement)."""

from __future__ import annotations

from collections import Counter

import pytest

from mqk.broker.cluster.placement import group_loads, place

GROUPS = ["group-0", "group-1", "group-2"]


def per_group(placed: list[tuple[str, int]]) -> Counter[str]:
    return Counter(group for group, _queue in placed)


def test_a_topic_spreads_over_every_group_even_when_one_group_holds_more_of_the_others() -> None:
    loads = {"group-0": 10, "group-1": 0, "group-2": 0}
    placed = place("orders", 0, 6, GROUPS, loads)
    assert per_group(placed) == {"group-0": 2, "group-1": 2, "group-2": 2}
    assert [queue for _group, queue in placed] == list(range(6))  # a partition's queue id is its number


def test_the_remainder_goes_to_the_least_loaded_groups() -> None:
    loads = {"group-0": 10, "group-1": 3, "group-2": 0}
    placed = place("orders", 0, 4, GROUPS, loads)
    counts = per_group(placed)
    assert sorted(counts.values()) == [1, 1, 2] and counts["group-0"] == 1 and counts["group-2"] == 2


def test_new_partitions_go_where_the_topic_has_fewest() -> None:
    existing = [("group-0", 0), ("group-1", 1)]
    loads = group_loads([existing, [("group-2", 0)] * 5], GROUPS)  # group-2 busy with another topic
    placed = place("orders", 2, 1, GROUPS, loads, existing)
    assert placed == [("group-2", 2)]


def test_topics_of_one_partition_start_on_different_groups() -> None:
    firsts = {place(f"topic-{i}", 0, 1, GROUPS, {})[0][0] for i in range(30)}
    assert firsts == set(GROUPS)


def test_no_live_group_is_an_error() -> None:
    with pytest.raises(ValueError, match="no broker group"):
        place("orders", 0, 1, [], {})
