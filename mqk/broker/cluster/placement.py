"""Where a topic's partitions live: placement over broker groups, decided by the controller alone.

Rules (Kafka's replica placement, with the broker group as the unit of replication):
- a new partition goes to the live group holding the fewest partitions of its own topic (a topic's partitions, and
  so its load, spread over every group, as Kafka spreads a topic's replicas round robin over the brokers); among
  those, to the group holding the fewest partitions of every topic, so leadership evens out as topics come; ties
  are broken by a rotation of the groups that starts at a point derived from the topic name (as Kafka starts its
  round robin at a random broker), so topics of equal size do not all start on one group;
- placement never moves: a partition stays in its group when brokers come and go (RF 1: while its group has no
  master it is unavailable); only new partitions (CreateTopics, CreatePartitions) are placed, over the groups live
  then;
- a partition's queue id inside its group's store is its partition number.

Pure functions: no I/O, no clock.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence


def group_loads(placements: Iterable[Sequence[tuple[str, int]]], groups: Iterable[str]) -> dict[str, int]:
    """Partitions per group over every topic's placement (groups with none count 0)."""
    loads = dict.fromkeys(groups, 0)
    for partitions in placements:
        for group, _queue in partitions:
            if group in loads:
                loads[group] += 1
    return loads


def place(
    topic: str,
    first: int,
    count: int,
    live_groups: Sequence[str],
    loads: Mapping[str, int],
    existing: Sequence[tuple[str, int]] = (),
) -> list[tuple[str, int]]:
    """(group, queue) for partitions first .. first + count - 1 of `topic` over `live_groups`, given each group's
    current `loads` and the topic's `existing` placement (CreatePartitions). ValueError without a live group."""
    if not live_groups:
        raise ValueError("no broker group is live")
    order = sorted(set(live_groups))
    start = zlib.crc32(topic.encode()) % len(order)
    rotation = order[start:] + order[:start]
    rank = {group: i for i, group in enumerate(rotation)}
    load = {group: loads.get(group, 0) for group in order}
    own = group_loads([existing], order)
    out = []
    for p in range(first, first + count):
        group = min(rotation, key=lambda g: (own[g], load[g], (rank[g] - p) % len(rotation)))
        load[group] += 1
        own[group] += 1
        out.append((group, p))
    return out


__all__ = ["group_loads", "place"]
