"""The classic group protocol's rounds that Kafka 4 clients rely on, with confluent-kafka:

- cooperative-sticky (KIP-429): a member joining takes partitions over in incremental rounds; the members that stay
  give up only what moves (never their whole assignment), no partition is owned by two members at once, every
  record is read, and none twice by one member (another member may read it again when its partition moved before
  the commit landed: at least once, as Kafka promises);
- `max.poll.interval.ms`: a member that stops polling leaves the group by itself (librdkafka sends LeaveGroup), the
  other member takes its partitions without waiting for a session timeout, and the late one is told
  (MAX_POLL_EXCEEDED) and joins again when it polls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from compat_helpers import PartitionOwners, create_topic, produce_numbered, unique
from confluent_kafka import Consumer, KafkaError

pytestmark = pytest.mark.timeout(120)


def member(bootstrap: str, group: str, **extra: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            **extra,
        }
    )


def test_cooperative_sticky_moves_only_what_it_must_in_incremental_rounds(bootstrap):
    topic, group = unique("coop"), unique("gcoop")
    create_topic(bootstrap, topic, 6)
    produce_numbered(bootstrap, topic, 6, 60)
    owners = PartitionOwners()
    seen: dict[bytes, list[str]] = {}
    consumers: dict[str, Consumer] = {}

    def poll_until(done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 40
        while not done():
            assert time.monotonic() < deadline, (owners.owner, len(seen))
            for name, consumer in consumers.items():
                msg = consumer.poll(0.05)
                if msg is None or msg.error():
                    continue
                # a record may be read again only by another member: one whose partition moved to it before the
                # first reader's (asynchronous) commit landed, which Kafka's at-least-once allows; never twice
                # by the same member
                readers = seen.setdefault(msg.value(), [])
                assert name not in readers, f"{msg.value()!r} read twice by {name}"
                readers.append(name)
                # (asynchronous: a member blocked in a synchronous commit while the group rebalances could not
                # poll the others, whose polls complete the rebalance)
                consumer.commit(message=msg, asynchronous=True)

    try:
        for name in ("a", "b", "c"):
            consumers[name] = member(bootstrap, group, **{"partition.assignment.strategy": "cooperative-sticky"})
            consumers[name].subscribe([topic], **owners.callbacks(name))
            share = 6 // len(consumers)
            poll_until(lambda s=share: all(len(owners.of(n)) == s for n in consumers))
        produce_numbered(bootstrap, topic, 6, 60, start=60)
        poll_until(lambda: len(seen) == 120)
    finally:
        for consumer in consumers.values():
            consumer.close()
    assert owners.overlaps == []
    # incremental: the first member gave up 3 partitions when the second came and 1 more when the third did, never
    # its whole assignment (an eager rebalance revokes everything first)
    assert [len(r) for r in owners.revoked.get("a", [])][:2] == [3, 1]
    assert sorted(int(v) for v in seen) == list(range(120))


def test_a_member_that_stops_polling_leaves_and_the_other_takes_its_partitions(bootstrap):
    topic, group = unique("poll"), unique("gpoll")
    create_topic(bootstrap, topic, 4)
    produce_numbered(bootstrap, topic, 4, 40)
    slow = member(bootstrap, group, **{"max.poll.interval.ms": 7000})
    busy = member(bootstrap, group)
    slow.subscribe([topic])
    busy.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        # the end of `slow`'s last poll, where its max.poll.interval.ms starts (not the end of busy's poll after it,
        # which a loaded machine may stretch past the half second the lower bound below allows)
        stopped = time.monotonic()
        while not (slow.assignment() and busy.assignment()):
            assert time.monotonic() < deadline, "both members assigned"
            slow.poll(0.1)
            stopped = time.monotonic()
            busy.poll(0.1)
        assert len(slow.assignment()) + len(busy.assignment()) == 4
        # `slow` polls no more: past max.poll.interval.ms it leaves, and `busy` gets every partition
        while len(busy.assignment()) < 4:
            assert time.monotonic() - stopped < 25, busy.assignment()
            busy.poll(0.1)
        took = time.monotonic() - stopped
        # (its heartbeats go on from librdkafka's own thread: the poll interval alone ends its membership, at 7 s)
        assert 6.5 < took < 25
        late = None
        for _ in range(50):
            msg = slow.poll(0.1)
            if msg is not None and msg.error() is not None:
                late = msg.error()
                break
        assert late is not None and late.code() == KafkaError._MAX_POLL_EXCEEDED
    finally:
        slow.close()
        busy.close()
