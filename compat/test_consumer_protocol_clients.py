"""The KIP-848 consumer group protocol with a real client: confluent-kafka (librdkafka 2.12+) with
`group.protocol=consumer`, whose members heartbeat with ConsumerGroupHeartbeat and are assigned by the broker.

- Members of one group share the topic's partitions (uniform and range assignors), never own one partition at the
  same time (each partition goes to its new owner only after the old one revoked it: checked from the clients'
  own assign and revoke callbacks), and every record is consumed once while the group grows and shrinks.
- Committed offsets carry the member epoch; a new member resumes where the group committed.
- A member killed -9 (a consumer in a process of its own) leaves with its session: the survivor takes its
  partitions and reads what it had not.
- Admin: ListGroups shows the group as a consumer group, DescribeConsumerGroups its members and assignments.

The broker runs with a half-second heartbeat interval and a three-second session (Kafka's defaults, 5 s and 45 s,
would only make the test wait longer).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compat_helpers import ChildClient, PartitionOwners, create_topic, hostport, produce_numbered, unique
from confluent_kafka import Consumer, ConsumerGroupType, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from helpers import CLUSTER_TESTS, wait_until

from mqk.testing import BrokerProcess

pytestmark = pytest.mark.timeout(120)

SESSION_MS = 3000


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Any]:
    config = tmp_path / "broker.toml"
    config.write_text(f"group_consumer_heartbeat_interval_ms = 500\ngroup_consumer_session_timeout_ms = {SESSION_MS}\n")
    process = BrokerProcess(tmp_path / "data", storage="memory", extra_args=("--config", str(config))).start()
    try:
        yield process
    finally:
        process.stop()


def member(bootstrap: str, group: str, name: str, **extra: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "client.id": name,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **extra,
        }
    )


def poll_all(consumers: dict[str, Consumer], seen: dict[bytes, str], until: Any, seconds: float = 30) -> None:
    """Poll every consumer (committing what it read) until `until()` holds; each value is recorded with its reader,
    and a value read twice fails the test at once."""
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, f"timed out; read {len(seen)}"
        for name, consumer in consumers.items():
            msg = consumer.poll(0.05)
            if msg is None or msg.error():
                continue
            assert msg.value() not in seen, f"{msg.value()!r} read by {seen.get(msg.value())} and {name}"
            seen[msg.value()] = name
            consumer.commit(message=msg, asynchronous=False)


@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_members_share_the_partitions_never_own_one_together_and_read_each_record_once(broker, assignor: str):
    bootstrap = hostport(broker.bootstrap)
    topic, group = unique("k848"), unique("g848")
    create_topic(bootstrap, topic, 6)
    produce_numbered(bootstrap, topic, 6, 60)
    owners = PartitionOwners()
    seen: dict[bytes, str] = {}
    consumers: dict[str, Consumer] = {}
    try:
        for name in ("a", "b", "c"):
            consumers[name] = member(bootstrap, group, name, **{"group.remote.assignor": assignor})
            consumers[name].subscribe([topic], **owners.callbacks(name))
            # each member arrives while the others read: the group moves partitions over to it
            share = 6 // len(consumers)
            poll_all(consumers, seen, lambda s=share: all(len(owners.of(n)) == s for n in consumers))
        assert {n: len(owners.of(n)) for n in consumers} == {"a": 2, "b": 2, "c": 2}
        if assignor == "range":  # each member a consecutive range, in member id order
            assert sorted(owners.of(n) for n in consumers) == [[0, 1], [2, 3], [4, 5]]
        produce_numbered(bootstrap, topic, 6, 60, start=60)
        poll_all(consumers, seen, lambda: len(seen) == 120)
        consumers.pop("b").close()  # leaves: its partitions go to the others
        poll_all(consumers, seen, lambda: len(owners.owner) == 6 and not owners.of("b"))
        assert sorted(len(owners.of(n)) for n in consumers) == [3, 3]
        produce_numbered(bootstrap, topic, 6, 60, start=120)
        poll_all(consumers, seen, lambda: len(seen) == 180)
    finally:
        for consumer in consumers.values():
            consumer.close()
    assert sorted(int(v) for v in seen) == list(range(180))
    assert owners.overlaps == []


def test_a_new_member_resumes_at_the_groups_committed_offsets_and_admin_sees_a_consumer_group(broker):
    bootstrap = hostport(broker.bootstrap)
    topic, group = unique("k848"), unique("g848")
    create_topic(bootstrap, topic, 3)
    produce_numbered(bootstrap, topic, 3, 30)
    seen: dict[bytes, str] = {}
    first = member(bootstrap, group, "first")
    first.subscribe([topic])
    try:
        poll_all({"first": first}, seen, lambda: len(seen) == 15)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        listed = admin.list_consumer_groups().result(10)
        mine = [g for g in listed.valid if g.group_id == group]
        assert len(mine) == 1 and mine[0].type == ConsumerGroupType.CONSUMER
        described = admin.describe_consumer_groups([group])[group].result(10)
        assert [m.client_id for m in described.members] == ["first"]
        assert sorted(tp.partition for tp in described.members[0].assignment.topic_partitions) == [0, 1, 2]
    finally:
        first.close()
    second = member(bootstrap, group, "second")
    second.subscribe([topic])
    try:
        poll_all({"second": second}, seen, lambda: len(seen) == 30)
    finally:
        second.close()
    by_first = {int(v) for v, n in seen.items() if n == "first"}
    assert len(by_first) == 15 and {int(v) for v, n in seen.items() if n == "second"} == set(range(30)) - by_first


CHILD = """
import sys
from confluent_kafka import Consumer
bootstrap, group, topic = sys.argv[1:4]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
              "client.id": "doomed", "auto.offset.reset": "earliest", "enable.auto.commit": False})
c.subscribe([topic])
while True:
    m = c.poll(0.1)
    if m is not None and not m.error():
        print(m.value().decode(), flush=True)  # (before the commit: whatever it committed, it printed)
        c.commit(message=m, asynchronous=False)
"""


def test_a_member_killed_9_leaves_with_its_session_and_the_survivor_reads_the_rest(broker):
    bootstrap = hostport(broker.bootstrap)
    topic, group = unique("k848"), unique("g848")
    create_topic(bootstrap, topic, 4)
    produce_numbered(bootstrap, topic, 4, 40)
    owners = PartitionOwners()
    seen: dict[bytes, str] = {}
    survivor = member(bootstrap, group, "survivor")
    survivor.subscribe([topic], **owners.callbacks("survivor"))
    poll_all({"survivor": survivor}, seen, lambda: len(owners.of("survivor")) == 4 and len(seen) == 40)
    try:
        with ChildClient(CHILD, bootstrap, group, topic) as child:
            # the child joins: the survivor gives up half of its partitions, and the child reads what comes to them
            poll_all({"survivor": survivor}, seen, lambda: len(owners.of("survivor")) == 2)
            produce_numbered(bootstrap, topic, 4, 40, start=40)
            by_child = set(child.kill9())
        assert by_child and all(40 <= int(v) < 80 for v in by_child)
        # no heartbeat from it any more: after its session the survivor owns every partition again and reads the
        # rest (a record the child printed but had not committed yet is read again: at least once, none lost)
        read_after: set[int] = set()
        deadline = time.monotonic() + SESSION_MS / 1000 + 30
        while len(owners.of("survivor")) < 4 or read_after | {int(v) for v in by_child} != set(range(40, 80)):
            assert time.monotonic() < deadline, (owners.of("survivor"), sorted(read_after))
            msg = survivor.poll(0.1)
            if msg is not None and not msg.error():
                read_after.add(int(msg.value()))
                survivor.commit(message=msg, asynchronous=False)
    finally:
        survivor.close()
    assert owners.overlaps == []


def test_a_regex_subscription_takes_matching_topics_and_one_created_later(broker):
    bootstrap = hostport(broker.bootstrap)
    prefix, group = unique("rx"), unique("g848")
    first, second, other = f"{prefix}-a", f"{prefix}-b", unique("other")
    producer = Producer({"bootstrap.servers": bootstrap})
    for topic in (first, second, other):
        create_topic(bootstrap, topic, 2)
        for i in range(4):
            producer.produce(topic, f"{topic}-{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    consumer = member(bootstrap, group, "rx")
    consumer.subscribe([f"^{prefix}-.*"])
    seen: dict[bytes, str] = {}
    try:
        poll_all({"rx": consumer}, seen, lambda: len(seen) == 8)
        assert {tp.topic for tp in consumer.assignment()} == {first, second}
        later = f"{prefix}-c"
        create_topic(bootstrap, later, 1)
        producer.produce(later, b"later")
        assert producer.flush(30) == 0
        poll_all({"rx": consumer}, seen, lambda: b"later" in seen)
    finally:
        consumer.close()
    assert len(seen) == 9 and not any(v.startswith(other.encode()) for v in seen)  # none of the other topic's


@CLUSTER_TESTS
def test_a_consumer_protocol_group_goes_on_after_its_coordinator_fails_over(mqk_cluster_factory):
    """Three replicas of one broker group: its master coordinates the group. Killed -9, another member becomes master
    and coordinator; the consumer finds it, joins again (its membership was the dead broker's memory) and resumes at
    the offsets it committed (they were replicated), so every record is read and none committed is read again."""
    from helpers import CONFIG, SETTLE_S, leader
    from helpers import create_topic as create_replicated_topic

    settings = {**CONFIG, "group_consumer_heartbeat_interval_ms": 500, "group_consumer_session_timeout_ms": 6000}
    cluster = mqk_cluster_factory(3, group_size=3, config=settings)
    topic, group = unique("k848"), unique("g848")
    create_replicated_topic(cluster, topic, 3)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(30):
        producer.produce(topic, b"%d" % i, partition=i % 3)
    assert producer.flush(30) == 0
    consumer = member(cluster.bootstrap, group, "survivor")
    consumer.subscribe([topic])
    seen: dict[bytes, str] = {}
    committed_before: set[int] = set()
    try:
        poll_all({"survivor": consumer}, seen, lambda: len(seen) == 15)
        committed_before = {int(v) for v in seen}
        master = leader(cluster, topic)
        cluster.kill(master)
        wait_until(lambda: leader(cluster, topic) not in (-1, master), SETTLE_S, "a new master")
        again: list[int] = []
        deadline = time.monotonic() + SETTLE_S
        while {int(v) for v in seen} | set(again) != set(range(30)):
            assert time.monotonic() < deadline, sorted(set(range(30)) - {int(v) for v in seen} - set(again))
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            again.append(int(msg.value()))
            # (a commit while the group moves may fail: then the record may be read again, which is allowed)
            with contextlib.suppress(KafkaException):
                consumer.commit(message=msg, asynchronous=False)
    finally:
        consumer.close()
    assert not committed_before & set(again)  # nothing it had committed was read again
