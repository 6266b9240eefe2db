"""Real Kafka clients against a 3-broker cluster (etcd plus three `mqk serve --cluster` processes on loopback), and
the same scenarios against a cluster of one `mqk serve --cluster` broker (a single etcd member either way).

For each client (confluent-kafka, kafka-python, aiokafka, kafkajs, kcat): a 12-partition topic created through an
admin client bootstrapped on one broker, its leaders spread over all three brokers; records written to every
partition; a consumer group of three members, each bootstrapped on a different broker, reads every record exactly
once; the offsets it committed are where a new member resumes; and the admin calls (describe cluster, list topics,
create / delete topic, describe / alter configs, create partitions) work from whichever broker a client starts on.
`test_admin_requests_sent_to_each_broker` sends those admin requests to every broker itself, the controller and
the others alike, without a client's routing in between. On one broker, "each broker" is that broker three times.
The KIP-848 consumer protocol (confluent-kafka's `group.protocol=consumer`) runs the same scenario, and share
consumers (KIP-932) share a topic whose partitions are led by every broker; a group coordinated by a broker that
holds none of its topic's partitions is served as well, under both protocols. kafkajs moves a partition to another
broker group (AlterPartitionReassignments) and reads every value back at its offset.

The records are written only once the group has settled (three members, 4 partitions each), so no join moves a
partition while they are read; a member counts a record once its offset is committed (kcat: once printed, its
offset stored and committed on revocation), so a later rebalance cannot make one count twice. A change made through
one broker reaches the others through their etcd watch a moment later: a test waits until every broker's Metadata
shows it before the next admin call. The module shares one cluster (topics and groups have unique names); every wait
is bounded and waits for a condition, never for time.
"""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import subprocess
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from compat_helpers import HEARTBEAT_MS, SESSION_TIMEOUT_MS, ThreadMember, consume_and_commit, run_node, unique
from confluent_kafka import (
    AcknowledgeType,
    Consumer,
    ConsumerGroupState,
    KafkaException,
    Producer,
    ShareConsumer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from helpers import CLUSTER_TESTS, wait_until, wait_until_async

from mqk import errors as E
from mqk.cluster_local import EtcdProcess, LocalBroker, LocalCluster
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient
from mqk.testing import TEST_CLUSTER_STORE

pytestmark = [pytest.mark.timeout(180), CLUSTER_TESTS]

PARTITIONS = 12
#: records the group reads, then records the resumed member reads
FIRST, MORE = 600, 120


@pytest.fixture(scope="module", params=[3, 1], ids=["3-brokers", "1-broker"])
def cluster(
    request: pytest.FixtureRequest, mqk_etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """A cluster of 3 brokers, then one of 1, for the module (on the session's etcd), stopped by pid at its end."""
    data_dir = tmp_path_factory.mktemp("cluster-clients")
    # (share groups start at a partition's first record here, so records written before a member's first fetch from
    # a partition's leader are shared too)
    config = {"store": TEST_CLUSTER_STORE, "group_share_auto_offset_reset": "earliest"}
    started = LocalCluster(data_dir, request.param, etcd=mqk_etcd.url, config=config).start()
    try:
        yield started
    finally:
        started.stop()


def eventually(ask: Callable[[], Any], expected: Any, what: str) -> None:
    """Ask until the answer is `expected`: a client may ask a broker whose view is a moment behind the one that
    made a change (Kafka's metadata is eventually consistent across brokers too); errors count as not yet."""

    last: list[Any] = [None]

    def answered() -> bool:
        try:
            last[0] = ask()
        except Exception as exc:  # noqa: BLE001 - the client's "unknown topic" while the broker catches up: asked again
            last[0] = exc
        return bool(last[0] == expected)

    try:
        wait_until(answered, 15, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last answer: {last[0]!r}") from None


async def seen_everywhere(cluster: LocalCluster, name: str, partitions: int) -> None:
    """Until every broker's own Metadata has topic `name` with `partitions` partitions (0: has it no more). A change
    reaches the other brokers through their etcd watch a moment after the one that made it answered: an admin call
    that follows one, sent to whichever broker the client picks, is only sure to find it then."""
    for b in cluster.brokers:
        assert b.kafka is not None
        client = await RawKafkaClient.connect(*b.kafka, "seen-everywhere")
        try:
            if partitions:
                await metadata_until(
                    client, name, lambda t: t["error_code"] == 0 and len(t["partitions"]) == partitions
                )
            else:
                await metadata_until(client, name, lambda t: t["error_code"] == E.UnknownTopicOrPartitionError.code)
        finally:
            await client.close()


def every_broker_sees(cluster: LocalCluster, name: str, partitions: int) -> None:
    """`seen_everywhere` for a test without an event loop."""
    asyncio.run(seen_everywhere(cluster, name, partitions))


def bootstraps(cluster: LocalCluster) -> list[str]:
    """Three brokers' own Kafka addresses, a different one each where the cluster has three (a client given one of
    them knows only that broker at first)."""
    return [cluster.brokers[i % len(cluster.brokers)].bootstrap for i in range(3)]


# --- checks every client's scenario shares ------------------------------------------------------------------


def leaders_of(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> leader node id, as the broker at `bootstrap` answers Metadata."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    return {p: meta.leader for p, meta in partitions.items()}


def create_topic(bootstrap: str, topic: str) -> None:
    """A 12-partition topic, made through confluent-kafka's admin client bootstrapped on one broker."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(15)


def assert_spread(cluster: LocalCluster, topic: str) -> None:
    """Every broker answers Metadata alike, and the topic's 12 partitions are led by all the brokers."""
    views = [
        wait_until(lambda b=b: _full(leaders_of(b, topic)), 15, f"{topic} in {b}'s Metadata")
        for b in bootstraps(cluster)
    ]
    assert all(view == views[0] for view in views)
    assert sorted(views[0]) == list(range(PARTITIONS))
    # (placement balances every group's partitions over all topics, so one topic's shares may differ by a few)
    assert set(views[0].values()) == set(cluster.node_ids)


def _full(leaders: dict[int, int]) -> dict[int, int] | None:
    return leaders if len(leaders) == PARTITIONS and all(n >= 0 for n in leaders.values()) else None


def assert_written_to_every_partition(cluster: LocalCluster, topic: str, per_partition: int) -> None:
    """Each partition's high watermark, asked of its leader: the records are on all three brokers."""
    c = Consumer({"bootstrap.servers": cluster.brokers[0].bootstrap, "group.id": unique("watermarks")})
    try:
        for p in range(PARTITIONS):
            assert c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) == (0, per_partition), p
    finally:
        c.close()


def group_settled(cluster: LocalCluster, group: str, topic: str) -> Any:
    """The group's description once it is stable with three members of 4 partitions each (None before), asked of
    its coordinator through a client bootstrapped on the last broker."""
    admin = AdminClient({"bootstrap.servers": cluster.brokers[-1].bootstrap})

    def settled() -> Any:
        try:
            desc = admin.describe_consumer_groups([group])[group].result(10)
        except KafkaException:
            return None  # (the coordinator is moving or loading: asked again)
        shares = [len([tp for tp in m.assignment.topic_partitions if tp.topic == topic]) for m in desc.members]
        return desc if desc.state == ConsumerGroupState.STABLE and shares == [4, 4, 4] else None

    return wait_until(settled, 60, f"group {group} to settle with three members")


class Member:
    """What the scenario needs of a group member: the values it has read and a way to stop it (committing)."""

    name: str
    values: list[int]

    def close(self) -> None: ...


def reads_each_record_once(
    cluster: LocalCluster,
    topic: str,
    group: str,
    start_member: Callable[[str, str], Member],
    produce: Callable[[int, int], None],
    resume: Callable[[str, int], list[int]],
) -> dict[str, list[int]]:
    """Members a, b, c, each bootstrapped on its own broker, settle, then read FIRST values exactly once between
    them; MORE values written after they left are what a new member (on the first broker) reads: the committed
    offsets were kept. Returns each member's values."""
    members: list[Member] = []
    try:
        for name, bootstrap in zip("abc", bootstraps(cluster), strict=True):
            members.append(start_member(name, bootstrap))
        group_settled(cluster, group, topic)
        produce(0, FIRST)

        def read() -> list[int]:
            return [v for m in members for v in list(m.values)]

        wait_until(lambda: len(set(read())) >= FIRST, 60, f"{FIRST} values read by the group")
    finally:
        errors = []
        for m in members:
            try:
                m.close()
            except AssertionError as exc:
                errors.append(str(exc))
        assert not errors, errors
    seen = collections.Counter(read())
    assert sorted(seen) == list(range(FIRST))
    assert not [v for v, n in seen.items() if n > 1], "a value was read twice"
    # (which member read what is the client's: one may rebalance again after settling, as kafka-python's leader
    # does when its metadata changed since it assigned, and its partitions then go to the others)
    by_member = {m.name: m.values for m in members}

    produce(FIRST, MORE)
    resumed = resume(cluster.brokers[0].bootstrap, MORE)
    assert sorted(resumed) == list(range(FIRST, FIRST + MORE))
    return by_member


def confluent_produce(bootstrap: str, topic: str) -> Callable[[int, int], None]:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "enable.idempotence": True, "acks": "all"})

    def produce(start: int, count: int) -> None:
        for v in range(start, start + count):
            producer.produce(topic, value=str(v).encode(), partition=v % PARTITIONS)
        assert producer.flush(30) == 0

    return produce


# --- confluent-kafka ------------------------------------------------------------------------------------------


def test_confluent_kafka(cluster: LocalCluster) -> None:
    topic, group = unique("ck"), unique("ck-group")
    b0, b1, b2 = bootstraps(cluster)
    create_topic(b0, topic)
    assert_spread(cluster, topic)

    settings = {"session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": HEARTBEAT_MS}
    confluent_reads_each_record_once(cluster, topic, group, settings, {})
    assert_written_to_every_partition(cluster, topic, (FIRST + MORE) // PARTITIONS)

    # admin calls, each from a client bootstrapped on another broker
    admins = [AdminClient({"bootstrap.servers": b}) for b in (b0, b1, b2)]
    for admin in admins:
        described = admin.describe_cluster().result(10)
        assert sorted(n.id for n in described.nodes) == cluster.node_ids
        assert described.controller.id in cluster.node_ids and described.cluster_id == cluster.cluster_id
    other = unique("ck-admin")
    admins[1].create_topics([NewTopic(other, 2, 1, config={"retention.ms": "3600000"})])[other].result(15)
    every_broker_sees(cluster, other, 2)
    assert all(other in admin.list_topics(timeout=10).topics for admin in admins)
    resource = ConfigResource(ConfigResource.Type.TOPIC, other)

    def retention(admin: AdminClient) -> str:
        return str(admin.describe_configs([resource])[resource].result(15)["retention.ms"].value)

    eventually(lambda: retention(admins[2]), "3600000", "the topic's retention.ms")
    change = ConfigResource(
        ConfigResource.Type.TOPIC,
        other,
        incremental_configs=[ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)],
    )
    admins[0].incremental_alter_configs([change])[change].result(15)
    eventually(lambda: retention(admins[1]), "7200000", "the altered retention.ms")
    admins[2].create_partitions([NewPartitions(other, 5)])[other].result(15)
    every_broker_sees(cluster, other, 5)
    assert all(len(admin.list_topics(other, timeout=10).topics[other].partitions) == 5 for admin in admins)
    admins[0].delete_topics([other])[other].result(15)
    every_broker_sees(cluster, other, 0)
    assert all(other not in admin.list_topics(timeout=10).topics for admin in admins)


def test_confluent_kafka_consumer_protocol(cluster: LocalCluster) -> None:
    """The KIP-848 consumer protocol: the group's coordinator assigns, each member on its own broker."""
    topic, group = unique("ck848"), unique("ck848-group")
    create_topic(bootstraps(cluster)[0], topic)
    assert_spread(cluster, topic)
    protocol = {"group.protocol": "consumer"}
    confluent_reads_each_record_once(cluster, topic, group, protocol, protocol)


def confluent_reads_each_record_once(
    cluster: LocalCluster, topic: str, group: str, member_settings: dict[str, Any], resume_settings: dict[str, Any]
) -> None:
    """`reads_each_record_once` with confluent-kafka members (each committing what it consumed) configured with
    `member_settings`, and a resuming member with `resume_settings`."""

    def start_member(name: str, bootstrap: str) -> ThreadMember:
        def setup() -> Consumer:
            c = Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": group,
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    **member_settings,
                }
            )
            c.subscribe([topic])
            return c

        return ThreadMember(name, setup, consume_and_commit, lambda c: c.close(), lambda c: len(c.assignment()))

    def resume(bootstrap: str, count: int) -> list[int]:
        c = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest", **resume_settings}
        )
        c.subscribe([topic])
        got: list[int] = []
        try:
            wait_until(lambda: got.extend(int(m.value()) for m in c.consume(100, 0.2)) or len(got) >= count, 60)
        finally:
            c.close()
        return got

    reads_each_record_once(
        cluster, topic, group, start_member, confluent_produce(bootstraps(cluster)[1], topic), resume
    )


def share_read(consumers: list[ShareConsumer], count: int) -> collections.Counter[int]:
    """Poll the share consumers in turn until `count` distinct values are in; each value's deliveries."""
    seen: collections.Counter[int] = collections.Counter()

    def more() -> bool:
        for consumer in consumers:
            for m in consumer.poll(0.2) or []:
                if not m.error():
                    seen[int(m.value())] += 1
        return len(seen) >= count

    wait_until(more, 90, f"{count} values shared out")
    return seen


def test_share_consumers_share_the_partitions_every_broker_leads(cluster: LocalCluster) -> None:
    topic, group = unique("sq"), unique("share")
    b0, b1, b2 = bootstraps(cluster)
    create_topic(b0, topic)
    assert_spread(cluster, topic)
    confluent_produce(b1, topic)(0, FIRST)
    consumers = [ShareConsumer({"bootstrap.servers": b, "group.id": group}) for b in (b1, b2)]
    try:
        for consumer in consumers:
            consumer.subscribe([topic])
        seen = share_read(consumers, FIRST)
    finally:
        for consumer in consumers:
            consumer.close()
    assert sorted(seen) == list(range(FIRST))
    assert not [v for v, n in seen.items() if n > 1], "a value was delivered twice"


def test_a_share_group_keeps_its_progress_when_a_partition_moves_to_another_broker_group(cluster: LocalCluster) -> None:
    """A share group reads part of a topic; its consumer leaves, a partition moves to another broker group
    (AlterPartitionReassignments, kafka-python's admin client), and a new consumer of the group goes on: the
    records accepted before are not delivered again (the partition's share state moved with it), and every other
    record is delivered. (On one broker the move is refused, and the same holds.)"""
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KafkaTopicPartition

    topic, group = unique("sq-move"), unique("share-move")
    b0, b1, b2 = bootstraps(cluster)
    create_topic(b0, topic)
    produce = confluent_produce(b1, topic)
    produce(0, FIRST)
    before = ShareConsumer({"bootstrap.servers": b1, "group.id": group})
    try:
        before.subscribe([topic])
        accepted: set[int] = set()

        def read_half() -> bool:
            got = [int(m.value()) for m in before.poll(0.2) or [] if not m.error()]
            if got:
                before.commit_sync()  # (implicit mode: what this poll gave is accepted)
                accepted.update(got)
            return len(accepted) >= FIRST // 2

        wait_until(read_half, 90, "half the values shared out")
    finally:
        before.close()
    # the partition to move: the one most of whose values were accepted (value v went to partition v % 12)
    moving = collections.Counter(v % PARTITIONS for v in accepted).most_common(1)[0][0]
    leader = leaders_of(b0, topic)[moving]
    others = [n for n in cluster.node_ids if n != leader] or [leader + 7]
    admin = KafkaAdminClient(bootstrap_servers=b2)
    try:
        admin.alter_partition_reassignments({KafkaTopicPartition(topic, moving): [others[0]]})
        wait_until(lambda: admin.list_partition_reassignments() == {}, 60, "the move to end")
    finally:
        admin.close()
    if len(cluster.brokers) > 1:
        wait_until(lambda: leaders_of(b0, topic).get(moving) == others[0], 30, "the partition led in its new group")
    produce(FIRST, MORE)
    after = ShareConsumer({"bootstrap.servers": b2, "group.id": group})
    try:
        after.subscribe([topic])
        seen = share_read([after], FIRST + MORE - len(accepted))
    finally:
        after.close()
    assert not accepted & set(seen), f"accepted before the move, delivered again: {sorted(accepted & set(seen))[:5]}"
    assert sorted(accepted | set(seen)) == list(range(FIRST + MORE))


def coordinator_of(cluster: LocalCluster, group: str) -> int:
    """The node FindCoordinator names for consumer group `group`."""

    async def ask() -> int:
        b = cluster.brokers[0]
        assert b.kafka is not None
        client = await RawKafkaClient.connect(*b.kafka, "find-coordinator")
        try:
            answer = await client.call(ApiKey.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]})
        finally:
            await client.close()
        (found,) = answer["coordinators"]
        return int(found["node_id"]) if found["error_code"] == 0 else -1

    return wait_until(lambda: (n := asyncio.run(ask())) >= 0 and (n,), 15, "the group's coordinator")[0]


def test_a_group_coordinated_by_a_broker_without_its_topic(cluster: LocalCluster) -> None:
    """A one-partition topic, and groups coordinated by another broker than its leader (with three brokers): the
    coordinator assigns a partition it does not hold, to a KIP-848 member and to share consumers."""
    topic = unique("lone")
    admin = AdminClient({"bootstrap.servers": cluster.brokers[0].bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    every_broker_sees(cluster, topic, 1)
    leader = wait_until(lambda: (n := leaders_of(cluster.brokers[0].bootstrap, topic).get(0, -1)) >= 0 and (n,), 15)[0]

    def elsewhere(prefix: str) -> str:
        for _ in range(200):
            group = unique(prefix)
            if len(cluster.brokers) == 1 or coordinator_of(cluster, group) != leader:
                return group
        raise AssertionError("no group id coordinated away from the topic's leader")

    confluent_produce_one = Producer({"bootstrap.servers": cluster.brokers[0].bootstrap})
    for v in range(50):
        confluent_produce_one.produce(topic, value=str(v).encode())
    assert confluent_produce_one.flush(30) == 0

    member = Consumer(
        {
            "bootstrap.servers": cluster.brokers[-1].bootstrap,
            "group.id": elsewhere("lone848"),
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
        }
    )
    member.subscribe([topic])
    got: list[int] = []
    try:
        wait_until(lambda: got.extend(consume_and_commit(member)) or len(got) >= 50, 60, "the member's 50 records")
    finally:
        member.close()
    assert sorted(got) == list(range(50))

    share = ShareConsumer({"bootstrap.servers": cluster.brokers[-1].bootstrap, "group.id": elsewhere("loneshare")})
    try:
        share.subscribe([topic])
        seen = share_read([share], 50)
    finally:
        share.close()
    assert sorted(seen) == list(range(50)) and set(seen.values()) == {1}


def test_a_share_groups_config_set_through_one_broker_holds_on_every_broker(cluster: LocalCluster) -> None:
    """A group's `share.delivery.count.limit` of 2, set through one broker: every broker describes it, and the
    partition leaders (all the brokers) archive a record released twice."""
    topic, group = unique("cfg"), unique("cfg-share")
    b0, _b1, b2 = bootstraps(cluster)
    create_topic(b0, topic)
    assert_spread(cluster, topic)
    change = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry("share.delivery.count.limit", "2", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin = AdminClient({"bootstrap.servers": b0})  # (held: a client collected mid-call fails its futures)
    admin.incremental_alter_configs([change])[change].result(15)

    async def described(b: LocalBroker) -> str:
        assert b.kafka is not None
        client = await RawKafkaClient.connect(*b.kafka, "group-config")
        try:
            resource = {
                "resource_type": 32,
                "resource_name": group,
                "configuration_keys": ["share.delivery.count.limit"],
            }
            answer = await client.call(ApiKey.DESCRIBE_CONFIGS, 4, {"resources": [resource], "include_synonyms": False})
        finally:
            await client.close()
        return str(answer["results"][0]["configs"][0]["value"])

    for b in cluster.brokers:
        eventually(lambda b=b: asyncio.run(described(b)), "2", f"broker {b.node_id}'s share.delivery.count.limit")

    confluent_produce(b0, topic)(0, PARTITIONS)  # one record on each partition, so on each leader
    deliveries: collections.Counter[int] = collections.Counter()
    consumer = ShareConsumer({"bootstrap.servers": b2, "group.id": group, "share.acknowledgement.mode": "explicit"})
    try:
        consumer.subscribe([topic])

        def poll(release_below: int) -> None:
            for m in consumer.poll(0.2) or []:
                if m.error():
                    continue
                value = int(m.value())
                deliveries[value] += 1
                consumer.acknowledge(m, AcknowledgeType.RELEASE if value < release_below else AcknowledgeType.ACCEPT)

        wait_until(
            lambda: poll(PARTITIONS) or all(deliveries[v] == 2 for v in range(PARTITIONS)), 90, "two deliveries each"
        )
        # released records are handed out again before new ones: once the next twelve are in, any third delivery
        # of the first twelve would have come
        confluent_produce(b0, topic)(PARTITIONS, PARTITIONS)
        wait_until(lambda: poll(PARTITIONS) or all(deliveries[v] for v in range(PARTITIONS, 2 * PARTITIONS)), 90)
    finally:
        consumer.close()
    assert [deliveries[v] for v in range(PARTITIONS)] == [2] * PARTITIONS  # archived at the group's limit, not 5
    assert [deliveries[v] for v in range(PARTITIONS, 2 * PARTITIONS)] == [1] * PARTITIONS


def test_a_share_groups_offsets_are_described_reset_and_deleted_through_its_coordinator(cluster: LocalCluster) -> None:
    """Describe-, Alter- and DeleteShareGroupOffsets sent to the group's coordinator, while every broker leads some
    of the topic's partitions and holds their states: the coordinator answers for all of them; a reset to 0 is
    seen by the leaders (a new share consumer gets every record again); a deleted state is gone everywhere. Any
    other broker answers NOT_COORDINATOR."""
    topic, group = unique("so"), unique("so-share")
    b0, b1, b2 = bootstraps(cluster)
    create_topic(b0, topic)
    assert_spread(cluster, topic)
    confluent_produce(b1, topic)(0, FIRST)  # FIRST / PARTITIONS records on each partition
    per_partition = FIRST // PARTITIONS

    def read_all(count: int) -> collections.Counter[int]:
        consumer = ShareConsumer({"bootstrap.servers": b2, "group.id": group})
        try:
            consumer.subscribe([topic])
            seen = share_read([consumer], count)
            consumer.commit_sync()  # (the last poll's records, accepted)
        finally:
            consumer.close()
        return seen

    assert sorted(read_all(FIRST)) == list(range(FIRST))
    node = coordinator_of(cluster, group)
    at = next(b for b in cluster.brokers if b.node_id == node)
    assert at.kafka is not None

    async def call(api: ApiKey, version: int, body: dict[str, Any], broker: LocalBroker = at) -> dict[str, Any]:
        assert broker.kafka is not None
        client = await RawKafkaClient.connect(*broker.kafka, "share-offsets")
        try:
            return await client.call(api, version, body)
        finally:
            await client.close()

    def describe(topics: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        body = {"groups": [{"group_id": group, "topics": topics}]}
        return asyncio.run(call(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1, body))["groups"][0]

    def rows(described: dict[str, Any]) -> dict[int, tuple[int, int, int]]:
        assert described["error_code"] == 0, described
        return {
            p["partition_index"]: (p["start_offset"], p["lag"], p["error_code"])
            for t in described["topics"]
            for p in t["partitions"]
        }

    every = dict.fromkeys(range(PARTITIONS), (per_partition, 0, 0))
    eventually(lambda: rows(describe()), every, "every partition's start offset past its records")
    others = [b for b in cluster.brokers if b.node_id != node]
    for other in others:
        body = {"groups": [{"group_id": group, "topics": None}]}
        answer = asyncio.run(call(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1, body, other))
        assert answer["groups"][0]["error_code"] == E.NotCoordinatorError.code

    reset = {
        "group_id": group,
        "topics": [
            {
                "topic_name": topic,
                "partitions": [{"partition_index": p, "start_offset": 0 if p else 10_000} for p in range(PARTITIONS)],
            }
        ],
    }

    def altered() -> dict[int, int] | None:
        answer = asyncio.run(call(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, reset))
        if answer["error_code"] == E.NonEmptyGroupError.code:  # (the member's leave is a moment behind its close)
            return None
        assert answer["error_code"] == 0, answer
        return {p["partition_index"]: p["error_code"] for p in answer["responses"][0]["partitions"]}

    codes = wait_until(altered, 30, "the group empty, and reset")
    assert codes == {0: E.OffsetOutOfRangeError.code, **dict.fromkeys(range(1, PARTITIONS), 0)}
    assert rows(describe()) == {0: (per_partition, 0, 0), **dict.fromkeys(range(1, PARTITIONS), (0, per_partition, 0))}
    again = read_all(FIRST - per_partition)  # every record of the reset partitions once more, none of partition 0's
    assert sorted(again) == [v for v in range(FIRST) if v % PARTITIONS] and set(again.values()) == {1}

    delete = {"group_id": group, "topics": [{"topic_name": topic}]}
    deleted = wait_until(
        lambda: (a := asyncio.run(call(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, delete)))["error_code"] == 0 and a,
        30,
        "the states deleted",
    )
    assert deleted["responses"][0]["error_code"] == 0
    named = describe([{"topic_name": topic, "partitions": list(range(PARTITIONS))}])
    assert rows(named) == dict.fromkeys(
        range(PARTITIONS), (-1, -1, 0)
    )  # no state anywhere: the next fetch starts afresh
    assert rows(describe()) == {}


# --- kafka-python ---------------------------------------------------------------------------------------------


def test_kafka_python(cluster: LocalCluster) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import ConfigResource as KpConfigResource
    from kafka.admin import ConfigResourceType
    from kafka.admin import NewPartitions as KpNewPartitions
    from kafka.admin import NewTopic as KpNewTopic
    from kafka.errors import CommitFailedError, IllegalGenerationError, RebalanceInProgressError

    topic, group = unique("kp"), unique("kp-group")
    b0, b1, b2 = bootstraps(cluster)
    admin = KafkaAdminClient(bootstrap_servers=b1)
    try:
        admin.create_topics([KpNewTopic(topic, PARTITIONS, 1)])
    finally:
        admin.close()
    assert_spread(cluster, topic)

    producer = KafkaProducer(bootstrap_servers=b2, acks="all", linger_ms=2)

    def produce(start: int, count: int) -> None:
        for v in range(start, start + count):
            producer.send(topic, value=str(v).encode(), partition=v % PARTITIONS)
        producer.flush(30)

    def start_member(name: str, bootstrap: str) -> ThreadMember:
        def setup() -> KafkaConsumer:
            return KafkaConsumer(
                topic,
                bootstrap_servers=bootstrap,
                group_id=group,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                session_timeout_ms=SESSION_TIMEOUT_MS,
                heartbeat_interval_ms=HEARTBEAT_MS,
            )

        def poll_once(c: KafkaConsumer) -> list[int]:
            values = [int(r.value) for recs in c.poll(timeout_ms=200).values() for r in recs]
            if values:
                try:
                    c.commit()
                except (CommitFailedError, RebalanceInProgressError, IllegalGenerationError):
                    return []
            return values

        return ThreadMember(name, setup, poll_once, lambda c: c.close(), lambda c: len(c.assignment()))

    def resume(bootstrap: str, count: int) -> list[int]:
        c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest")
        got: list[int] = []
        try:

            def poll() -> bool:
                got.extend(int(r.value) for recs in c.poll(timeout_ms=200).values() for r in recs)
                return len(got) >= count

            wait_until(poll, 60, "the resumed member's values")
        finally:
            c.close()
        return got

    try:
        reads_each_record_once(cluster, topic, group, start_member, produce, resume)
    finally:
        producer.close()
    assert_written_to_every_partition(cluster, topic, (FIRST + MORE) // PARTITIONS)

    other = unique("kp-admin")
    admins = [KafkaAdminClient(bootstrap_servers=b) for b in (b0, b1, b2)]
    try:
        for a in admins:
            described = a.describe_cluster()
            assert sorted(b["broker_id"] for b in described["brokers"]) == cluster.node_ids
            assert described["controller_id"] in cluster.node_ids
            assert described["cluster_id"] == cluster.cluster_id
        admins[0].create_topics([KpNewTopic(other, 2, 1, topic_configs={"retention.ms": "1234567"})])
        every_broker_sees(cluster, other, 2)
        assert all(other in a.list_topics() for a in admins)
        resource = KpConfigResource(ConfigResourceType.TOPIC, other)

        def retention(a: Any) -> str:
            # kafka-python 3: {resource type: {topic: {config name: {"value": ...}}}}
            for by_name in a.describe_configs([resource]).values():
                if isinstance(by_name, dict) and other in by_name:
                    return str(by_name[other]["retention.ms"]["value"])
            raise AssertionError(f"no configs for {other}")

        eventually(lambda: retention(admins[1]), "1234567", "the topic's retention.ms")
        admins[2].alter_configs([KpConfigResource(ConfigResourceType.TOPIC, other, configs={"retention.ms": "999"})])
        eventually(lambda: retention(admins[0]), "999", "the altered retention.ms")
        admins[1].create_partitions({other: KpNewPartitions(total_count=4)})
        every_broker_sees(cluster, other, 4)
        assert all(len(a.describe_topics([other])[0]["partitions"]) == 4 for a in admins)
        admins[2].delete_topics([other])
        every_broker_sees(cluster, other, 0)
        assert all(other not in a.list_topics() for a in admins)
    finally:
        for a in admins:
            a.close()


# --- aiokafka -------------------------------------------------------------------------------------------------


def test_aiokafka(cluster: LocalCluster) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewPartitions as AkNewPartitions
    from aiokafka.admin import NewTopic as AkNewTopic
    from aiokafka.admin.config_resource import ConfigResource as AkConfigResource
    from aiokafka.admin.config_resource import ConfigResourceType as AkType
    from aiokafka.errors import CommitFailedError, IllegalGenerationError, RebalanceInProgressError

    topic, group = unique("ak"), unique("ak-group")
    b0, b1, b2 = bootstraps(cluster)

    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=b2)
        await admin.start()
        try:
            await admin.create_topics([AkNewTopic(topic, PARTITIONS, 1)])
        finally:
            await admin.close()

    asyncio.run(create())
    assert_spread(cluster, topic)

    def produce(start: int, count: int) -> None:
        async def send() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=b0, acks="all", enable_idempotence=True, linger_ms=2)
            await producer.start()
            try:
                sent = [
                    await producer.send(topic, str(v).encode(), partition=v % PARTITIONS)
                    for v in range(start, start + count)
                ]
                await asyncio.gather(*sent)
            finally:
                await producer.stop()

        asyncio.run(send())

    # each member owns an event loop in its thread; aiokafka's heartbeat task runs while getmany() waits
    def start_member(name: str, bootstrap: str) -> ThreadMember:
        def setup() -> tuple[asyncio.AbstractEventLoop, AIOKafkaConsumer]:
            loop = asyncio.new_event_loop()

            async def make() -> AIOKafkaConsumer:
                c = AIOKafkaConsumer(
                    topic,
                    bootstrap_servers=bootstrap,
                    group_id=group,
                    auto_offset_reset="earliest",
                    enable_auto_commit=False,
                    session_timeout_ms=SESSION_TIMEOUT_MS,
                    heartbeat_interval_ms=HEARTBEAT_MS,
                )
                await c.start()
                return c

            return loop, loop.run_until_complete(make())

        def poll_once(state: tuple[asyncio.AbstractEventLoop, AIOKafkaConsumer]) -> list[int]:
            loop, c = state

            async def once() -> list[int]:
                batches = await c.getmany(timeout_ms=200)
                values = [int(r.value) for recs in batches.values() for r in recs]
                if values:
                    try:
                        await c.commit()
                    except (CommitFailedError, RebalanceInProgressError, IllegalGenerationError):
                        return []
                return values

            return loop.run_until_complete(once())

        def shutdown(state: tuple[asyncio.AbstractEventLoop, AIOKafkaConsumer]) -> None:
            loop, c = state
            try:
                loop.run_until_complete(c.stop())
            finally:
                loop.close()

        return ThreadMember(name, setup, poll_once, shutdown, lambda s: len(s[1].assignment()))

    def resume(bootstrap: str, count: int) -> list[int]:
        async def read() -> list[int]:
            c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest")
            await c.start()
            got: list[int] = []
            try:
                while len(got) < count:
                    batches = await c.getmany(timeout_ms=200)
                    got.extend(int(r.value) for recs in batches.values() for r in recs)
            finally:
                await c.stop()
            return got

        return asyncio.run(asyncio.wait_for(read(), 60))

    reads_each_record_once(cluster, topic, group, start_member, produce, resume)
    assert_written_to_every_partition(cluster, topic, (FIRST + MORE) // PARTITIONS)

    other = unique("ak-admin")

    async def admin_calls() -> None:
        admins = [AIOKafkaAdminClient(bootstrap_servers=b) for b in (b0, b1, b2)]
        for a in admins:
            await a.start()
        try:
            for a in admins:
                described = await a.describe_cluster()
                assert sorted(b["node_id"] for b in described["brokers"]) == cluster.node_ids
                assert described["controller_id"] in cluster.node_ids
                assert described["cluster_id"] == cluster.cluster_id
            await admins[1].create_topics([AkNewTopic(other, 2, 1, topic_configs={"retention.ms": "86400001"})])
            await seen_everywhere(cluster, other, 2)
            for a in admins:
                assert other in await a.list_topics()
            resource = AkConfigResource(AkType.TOPIC, other)

            async def retention(a: AIOKafkaAdminClient) -> str:
                for response in await a.describe_configs([resource]):
                    for res in response.to_object()["resources"]:
                        for entry in res["config_entries"]:
                            if entry["config_names"] == "retention.ms":
                                return str(entry["config_value"])
                raise AssertionError("no retention.ms")

            await eventually_async(lambda: retention(admins[2]), "86400001", "the topic's retention.ms")
            (altered,) = await admins[0].alter_configs(
                [AkConfigResource(AkType.TOPIC, other, {"retention.ms": "5000"})]
            )
            # (aiokafka hands back the response without raising for its error codes)
            assert [(r["error_code"], r["error_message"]) for r in altered.to_object()["resources"]] == [(0, None)]
            await eventually_async(lambda: retention(admins[1]), "5000", "the altered retention.ms")
            await admins[2].create_partitions({other: AkNewPartitions(total_count=3)})
            await seen_everywhere(cluster, other, 3)
            for a in admins:
                assert len((await a.describe_topics([other]))[0]["partitions"]) == 3
            await admins[0].delete_topics([other])
            await seen_everywhere(cluster, other, 0)
            for a in admins:
                assert other not in await a.list_topics()
        finally:
            for a in admins:
                await a.close()

    asyncio.run(asyncio.wait_for(admin_calls(), 60))


async def eventually_async(ask: Callable[[], Awaitable[Any]], expected: Any, what: str) -> None:
    """`eventually` for an asyncio client."""

    last: list[Any] = [None]

    async def answered() -> bool:
        try:
            last[0] = await ask()
        except Exception as exc:  # noqa: BLE001 - the client's "unknown topic" while the broker catches up: asked again
            last[0] = exc
        return bool(last[0] == expected)

    try:
        await wait_until_async(answered, 15, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last answer: {last[0]!r}") from None


# --- kafkajs --------------------------------------------------------------------------------------------------


def test_kafkajs(cluster: LocalCluster) -> None:
    topic, group, other = unique("js"), unique("js-group"), unique("js-admin")
    options = {"bootstraps": bootstraps(cluster), "topic": topic, "group": group, "n": FIRST, "more": MORE}
    r = run_node(
        "kafkajs_client.js",
        cluster.brokers[0].bootstrap,
        "cluster",
        json.dumps({**options, "adminTopic": other}),
        timeout=150,
    )["result"]
    assert r["created"] is True
    leaders = {p["partition"]: p["leader"] for p in r["leaders"]}
    assert sorted(leaders) == list(range(PARTITIONS)) and set(leaders.values()) == set(cluster.node_ids)
    assert r["assigned"] == {"a": 4, "b": 4, "c": 4}
    assert {s["errorCode"] for s in r["sent"] + r["sentMore"]} == {0}
    assert {s["partition"] for s in r["sent"]} == set(range(PARTITIONS))
    seen = collections.Counter(v for values in r["values"].values() for v in values)
    assert sorted(seen) == list(range(FIRST)) and max(seen.values()) == 1
    assert sorted(r["resumed"]) == list(range(FIRST, FIRST + MORE))
    assert_written_to_every_partition(cluster, topic, (FIRST + MORE) // PARTITIONS)

    for described in r["described"]:
        assert described["brokers"] == cluster.node_ids
        assert described["controller"] in cluster.node_ids and described["clusterId"] == cluster.cluster_id
    assert r["createdAdminTopic"] is True
    assert r["listed"] == [True, True, True]
    assert r["retention"] == "7777777" and r["retentionAfterAlter"] == "1000000"
    assert r["partitionsAfter"] == 5
    assert r["listedAfterDelete"] is False


def test_kafkajs_moves_a_partition_to_another_broker_group(cluster: LocalCluster) -> None:
    """AlterPartitionReassignments and ListPartitionReassignments from kafkajs: with three groups the partition moves
    to another one and every value is read back at its offset; a broker on its own refuses a move to a node it does
    not know (INVALID_REPLICA_ASSIGNMENT) and the partition stays."""
    topic = unique("js-move")
    nodes = cluster.node_ids if len(cluster.brokers) > 1 else [cluster.node_ids[0] + 7]
    r = run_node(
        "kafkajs_client.js",
        cluster.brokers[0].bootstrap,
        "reassign",
        json.dumps({"topic": topic, "nodes": nodes, "n": 50, "more": 20}),
        timeout=120,
    )["result"]
    if len(cluster.brokers) > 1:
        assert "refused" not in r and r["after"] == r["to"] != r["before"]
    else:
        assert r["refused"] == "INVALID_REPLICA_ASSIGNMENT" and r["after"] == r["before"]
    assert sorted(r["read"]) == [[i, str(i)] for i in range(70)]


# --- kcat -----------------------------------------------------------------------------------------------------


class KcatMember:
    """`kcat -G` (librdkafka's balanced consumer, auto-commit) in its own process, bootstrapped on one broker; its
    JSON lines are read as they come. Closed with SIGTERM (by its pid): kcat then closes its consumer, which
    commits what it has read."""

    def __init__(self, kcat: str, name: str, bootstrap: str, group: str, topic: str) -> None:
        self.name = name
        self.values: list[int] = []
        self.proc = subprocess.Popen(
            [kcat, *group_args(bootstrap, group), "-u", topic],  # -u: each line written as it is read
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"kcat-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.values.append(int(json.loads(line)["payload"]))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            self._reader.join(10)
            assert self.proc.stderr is not None
            err = self.proc.stderr.read()
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
        assert code == 0, f"kcat member {self.name} exited {code}: {err[-2000:]}"


def group_args(bootstrap: str, group: str) -> list[str]:
    return [
        "-b", bootstrap,
        "-G", group,
        "-J", "-q",
        "-X", "auto.offset.reset=earliest",
        "-X", f"session.timeout.ms={SESSION_TIMEOUT_MS}",
        "-X", f"heartbeat.interval.ms={HEARTBEAT_MS}",
    ]  # fmt: skip


def run_kcat(kcat: str, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
    proc = subprocess.run([kcat, *args], check=False, input=stdin, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"kcat {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout


def test_kcat(cluster: LocalCluster, kcat: str) -> None:
    topic, group = unique("kc"), unique("kc-group")
    b0, b1, b2 = bootstraps(cluster)
    create_topic(b2, topic)
    assert_spread(cluster, topic)

    # the metadata listing, asked of each broker: all three brokers, every partition with its leader
    for b in (b0, b1, b2):
        md = json.loads(run_kcat(kcat, "-b", b, "-L", "-J", "-t", topic))
        assert sorted(x["id"] for x in md["brokers"]) == cluster.node_ids
        (listed,) = md["topics"]
        assert {p["partition"]: p["leader"] for p in listed["partitions"]} == leaders_of(b0, topic)

    def produce(start: int, count: int) -> None:
        # one kcat per partition (-p), each bootstrapped on the next broker
        for p in range(PARTITIONS):
            lines = "".join(f"{v}\n" for v in range(start, start + count) if v % PARTITIONS == p)
            run_kcat(
                kcat, "-b", bootstraps(cluster)[p % 3], "-P", "-t", topic, "-p", str(p), "-X", "acks=all", stdin=lines
            )

    def resume(bootstrap: str, count: int) -> list[int]:
        out = run_kcat(kcat, *group_args(bootstrap, group), "-c", str(count), topic)
        return [int(json.loads(line)["payload"]) for line in out.splitlines() if line.startswith("{")]

    reads_each_record_once(
        cluster, topic, group, lambda name, b: KcatMember(kcat, name, b, group, topic), produce, resume
    )
    assert_written_to_every_partition(cluster, topic, (FIRST + MORE) // PARTITIONS)


# --- admin requests sent to each broker, without a client's routing -----------------------------------------


def create_body(name: str, partitions: int, configs: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "timeout_ms": 10_000,
        "validate_only": False,
        "topics": [
            {
                "name": name,
                "num_partitions": partitions,
                "replication_factor": -1,
                "assignments": [],
                "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()],
            }
        ],
    }


def configs_body(name: str, settings: dict[str, str] | None = None) -> dict[str, Any]:
    resource: dict[str, Any] = {"resource_type": 2, "resource_name": name}
    if settings is None:
        resource["configuration_keys"] = ["retention.ms"]
        return {"resources": [resource], "include_synonyms": False, "include_documentation": False}
    resource["configs"] = [{"name": k, "value": v} for k, v in settings.items()]
    return {"resources": [resource], "validate_only": False}


async def test_admin_requests_sent_to_each_broker(cluster: LocalCluster) -> None:
    clients = [await RawKafkaClient.connect(*b.kafka, f"admin-{b.node_id}") for b in cluster.brokers if b.kafka]
    try:
        described = [
            await c.call(ApiKey.DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": False}) for c in clients
        ]
        controllers = {d["controller_id"] for d in described}
        assert len(controllers) == 1 and controllers <= set(cluster.node_ids)
        for d in described:
            assert d["error_code"] == 0 and d["cluster_id"] == cluster.cluster_id
            assert sorted(b["broker_id"] for b in d["brokers"]) == cluster.node_ids

        for asked, client in zip(cluster.brokers, clients, strict=True):
            name = unique(f"raw-{asked.node_id}")
            created = await client.call(ApiKey.CREATE_TOPICS, 5, create_body(name, 3, {"retention.ms": "600000"}))
            assert [(t["error_code"], t["num_partitions"]) for t in created["topics"]] == [(0, 3)], created
            # the broker asked answers once its own view has the topic; the others follow through their watch
            for other in clients:
                md = await metadata_until(other, name, lambda t: len(t["partitions"]) == 3)
                assert {p["leader_id"] for p in md["partitions"]} <= set(cluster.node_ids)

            for reader in clients:
                described_configs = await reader.call(ApiKey.DESCRIBE_CONFIGS, 1, configs_body(name))
                (res,) = described_configs["results"]
                assert res["error_code"] == 0
                assert [(c["name"], c["value"]) for c in res["configs"]] == [("retention.ms", "600000")]
            altered = await client.call(ApiKey.ALTER_CONFIGS, 0, configs_body(name, {"retention.ms": "700000"}))
            assert [r["error_code"] for r in altered["responses"]] == [0], altered
            for reader in clients:
                await configs_until(reader, name, "700000")

            grown = await client.call(
                ApiKey.CREATE_PARTITIONS,
                1,
                {
                    "topics": [{"name": name, "count": 6, "assignments": None}],
                    "timeout_ms": 10_000,
                    "validate_only": False,
                },
            )
            assert [r["error_code"] for r in grown["results"]] == [0], grown
            for other in clients:
                await metadata_until(other, name, lambda t: len(t["partitions"]) == 6)

            deleted = await client.call(ApiKey.DELETE_TOPICS, 4, {"topic_names": [name], "timeout_ms": 10_000})
            assert [r["error_code"] for r in deleted["responses"]] == [0], deleted
            for other in clients:
                await metadata_until(other, name, lambda t: t["error_code"] == E.UnknownTopicOrPartitionError.code)
    finally:
        for c in clients:
            await c.close()


async def metadata_until(
    client: RawKafkaClient, name: str, condition: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The topic's Metadata entry from this broker, once `condition` holds for it (a broker's view follows the
    change through its etcd watch, a moment after the broker that made it)."""
    body = {
        "topics": [{"name": name}],
        "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False,
    }

    async def entry() -> dict[str, Any] | None:
        (topic,) = (await client.call(ApiKey.METADATA, 9, body))["topics"]
        return topic if condition(topic) else None

    found: dict[str, Any] = await wait_until_async(entry, 10, f"{name} in Metadata")
    return found


async def configs_until(client: RawKafkaClient, name: str, retention: str) -> None:
    async def changed() -> bool:
        (res,) = (await client.call(ApiKey.DESCRIBE_CONFIGS, 1, configs_body(name)))["results"]
        return res["error_code"] == 0 and [c["value"] for c in res["configs"]] == [retention]

    await wait_until_async(changed, 10, f"retention.ms of {name} to be {retention}")
