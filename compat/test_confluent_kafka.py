"""confluent-kafka (librdkafka) against mqk: codecs, headers, groups, restart, admin, timestamps, idempotence."""

from __future__ import annotations

import time
from typing import Any

import pytest
from compat_helpers import (
    HEARTBEAT_MS,
    SESSION_TIMEOUT_MS,
    ThreadMember,
    assert_stored_with,
    consume_and_commit,
    create_topic,
    hostport,
    run_group_scenario,
    unique,
)
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupState,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)
from helpers import wait_until

pytestmark = pytest.mark.timeout(90)

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def produce_all(bootstrap: str, topic: str, records: list[dict[str, Any]], **conf: Any) -> list[Any]:
    """Produce and flush; returns the delivered messages (raises on any delivery error)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
    delivered: list[Any] = []
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        (errors if err else delivered).append(err or msg)

    for rec in records:
        producer.produce(topic, on_delivery=on_delivery, **rec)
        producer.poll(0)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records not delivered in 30 s"
    assert not errors, f"delivery errors: {errors[:5]}"
    return delivered


def consume_from(bootstrap: str, topic: str, partition: int, offset: int, count: int, timeout: float = 20) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("assign"), "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=count - len(out), timeout=0.2):
                assert msg.error() is None, msg.error()
                out.append(msg)
        return out
    finally:
        consumer.close()


@pytest.mark.parametrize("codec", CODECS)
def test_keys_headers_and_codec_round_trip(bootstrap: str, topic: str, codec: str) -> None:
    records = [
        {
            "key": f"k{i}".encode(),
            "value": (f"value-{i}-" * (i % 7 + 1)).encode(),
            "partition": 0,
            "headers": [("trace", f"t{i}".encode()), ("dup", b"1"), ("dup", b"2")],
        }
        for i in range(30)
    ]
    records.append({"key": None, "value": b"no key, no headers", "partition": 0})
    records.append({"key": b"tombstone", "value": None, "partition": 0})
    # One batch for all of them (linger.ms=500): librdkafka sends a batch uncompressed when compressing does not
    # shrink it, which a batch of the first few records alone, sent before the rest were produced, can be.
    delivered = produce_all(bootstrap, topic, records, **{"compression.type": codec, "linger.ms": 500})
    assert sorted(m.offset() for m in delivered) == list(range(len(records)))
    assert_stored_with(bootstrap, topic, codec)

    got = consume_from(bootstrap, topic, 0, OFFSET_BEGINNING, len(records))
    assert [m.offset() for m in got] == list(range(len(records)))
    for rec, msg in zip(records, got):
        assert msg.key() == rec["key"]
        assert msg.value() == rec["value"]
        assert (msg.headers() or []) == rec.get("headers", [])
        ts_type, ts = msg.timestamp()
        assert ts_type == 1 and abs(ts - time.time() * 1000) < 60_000  # CreateTime, set by the producer


@pytest.mark.parametrize("assignor", ["range,roundrobin", "cooperative-sticky"])
def test_consumer_group_join_and_leave_no_loss_no_duplicates(
    bootstrap: str, topic: str, group: str, assignor: str
) -> None:
    # cooperative-sticky: incremental rebalances (KIP-429), members keep their partitions through a join and
    # revoke only what moves, in a second round of JoinGroup / SyncGroup
    create_topic(bootstrap, topic, 6)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "acks": "all"})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    chosen: list[str] = []  # the group's protocol (the assignor the broker selected) while members run

    def stable_group_protocol() -> str:
        # as in Kafka, a group answers with its protocol only when stable (a rebalance may be under way here)
        def stable() -> Any:
            desc = admin.describe_consumer_groups([group])[group].result(15)
            return desc if desc.state == ConsumerGroupState.STABLE else None

        return wait_until(stable, 15, "the group to be stable").partition_assignor

    def produce(start: int, count: int) -> None:
        if start:
            chosen.append(stable_group_protocol())
        for v in range(start, start + count):
            producer.produce(topic, value=str(v).encode(), key=str(v).encode(), partition=v % 6)
        assert producer.flush(20) == 0

    def setup() -> Consumer:
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": HEARTBEAT_MS,
                "partition.assignment.strategy": assignor,
            }
        )
        c.subscribe([topic])
        return c

    by_member = run_group_scenario(
        produce,
        lambda name: ThreadMember(
            name, setup, lambda c: consume_and_commit(c, 50), lambda c: c.close(), lambda c: len(c.assignment())
        ),
    )
    assert sum(map(len, by_member.values())) == 360
    assert chosen == [assignor.split(",")[0]] * 3  # the first protocol every member supports


def test_commit_and_resume_after_broker_restart(file_broker: Any, topic: str, group: str) -> None:
    bootstrap = hostport(file_broker.bootstrap)
    create_topic(bootstrap, topic, 1)
    produce_all(bootstrap, topic, [{"value": str(i).encode(), "partition": 0} for i in range(100)], acks="all")

    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": HEARTBEAT_MS,
    }
    c = Consumer(conf)
    c.subscribe([topic])
    seen: list[int] = []
    deadline = time.monotonic() + 30
    while len(seen) < 40 and time.monotonic() < deadline:
        for m in c.consume(num_messages=40 - len(seen), timeout=0.2):
            assert m.error() is None, m.error()
            seen.append(m.offset())
    assert seen == list(range(40))
    c.commit(offsets=[TopicPartition(topic, 0, 40, metadata="after-40")], asynchronous=False)
    c.close()

    file_broker.stop()
    file_broker.restart()
    bootstrap = hostport(file_broker.bootstrap)
    produce_all(bootstrap, topic, [{"value": str(i).encode(), "partition": 0} for i in range(100, 110)])

    c = Consumer({**conf, "bootstrap.servers": bootstrap})
    try:
        committed = c.committed([TopicPartition(topic, 0)], timeout=15)
        assert committed[0].offset == 40
        assert committed[0].metadata == "after-40"
        c.subscribe([topic])
        resumed: list[int] = []
        deadline = time.monotonic() + 30
        while len(resumed) < 70 and time.monotonic() < deadline:
            for m in c.consume(num_messages=70, timeout=0.2):
                assert m.error() is None, m.error()
                resumed.append(m.offset())
        assert resumed == list(range(40, 110))
    finally:
        c.close()


def test_acks_all_records_survive_kill_9(file_broker: Any, topic: str) -> None:
    bootstrap = hostport(file_broker.bootstrap)
    records = [{"key": str(i).encode(), "value": f"durable-{i}".encode(), "partition": 0} for i in range(300)]
    produce_all(bootstrap, topic, records, acks="all", **{"compression.type": "lz4"})
    file_broker.kill()
    file_broker.restart()
    bootstrap = hostport(file_broker.bootstrap)
    got = consume_from(bootstrap, topic, 0, OFFSET_BEGINNING, 300)
    assert [m.value() for m in got] == [r["value"] for r in records]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("wm")})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 300)
    finally:
        consumer.close()


def test_admin_create_describe_alter_delete(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(topic, 3, 1, config={"retention.ms": "3600000"})], operation_timeout=10)
    fs[topic].result(15)

    with pytest.raises(KafkaException) as exc:
        admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(15)
    assert exc.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS

    dry = unique("validate-only")
    admin.create_topics([NewTopic(dry, 2, 1)], validate_only=True)[dry].result(15)

    md = admin.list_topics(timeout=10)
    assert topic in md.topics and dry not in md.topics
    assert sorted(md.topics[topic].partitions) == [0, 1, 2]
    assert all(p.leader == md.topics[topic].partitions[0].leader for p in md.topics[topic].partitions.values())

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(15)
    assert entries["retention.ms"].value == "3600000"
    assert ConfigSource(entries["retention.ms"].source) == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert entries["cleanup.policy"].value == "delete" and entries["cleanup.policy"].is_default
    assert entries["segment.bytes"].value is not None and int(entries["segment.bytes"].value) > 0
    assert "max.message.bytes" in entries and "min.insync.replicas" in entries

    alter = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    admin.incremental_alter_configs([alter])[alter].result(15)
    entries = admin.describe_configs([resource])[resource].result(15)
    assert entries["retention.ms"].value == "7200000"
    assert entries["cleanup.policy"].value == "compact" and not entries["cleanup.policy"].is_default

    admin.create_partitions([NewPartitions(topic, 5)])[topic].result(15)
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 5

    admin.delete_topics([topic], operation_timeout=10)[topic].result(15)
    wait_until(lambda: topic not in admin.list_topics(timeout=10).topics, 10, "the topic to disappear")

    with pytest.raises(KafkaException) as exc:
        admin.delete_topics([topic])[topic].result(15)
    assert exc.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_every_kafka_4_topic_config_is_accepted_and_legacy_keys_are_ignored(bootstrap: str, topic: str) -> None:
    """Topic settings mqk does not act on are still Kafka's: accepted (checked by type), stored and reported; keys
    Kafka 4 removed that 3.x tools still send are accepted and dropped; a value of the wrong type is refused."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {
        "compression.zstd.level": "7",
        "segment.jitter.ms": "1000",
        "leader.replication.throttled.replicas": "*",
        "remote.storage.enable": "false",
        "message.format.version": "2.8-IV1",
    }
    admin.create_topics([NewTopic(topic, 1, 1, config=config)], operation_timeout=10)[topic].result(15)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(15)
    assert entries["compression.zstd.level"].value == "7" and not entries["compression.zstd.level"].is_default
    assert entries["segment.jitter.ms"].value == "1000"
    assert entries["leader.replication.throttled.replicas"].value == "*"
    assert entries["segment.index.bytes"].value == "10485760" and entries["segment.index.bytes"].is_default
    assert "message.format.version" not in entries
    bad = unique("bad-config")
    with pytest.raises(KafkaException) as exc:
        admin.create_topics([NewTopic(bad, 1, 1, config={"compression.lz4.level": "99"})])[bad].result(15)
    assert exc.value.args[0].code() == KafkaError.INVALID_CONFIG


def test_offsets_for_times(bootstrap: str, topic: str) -> None:
    base = int(time.time() * 1000) - 100_000
    # One produce call per timestamp, all in one batch: the broker must find the record inside the batch.
    produce_all(
        bootstrap,
        topic,
        [{"value": str(i).encode(), "partition": 0, "timestamp": base + i * 1000} for i in range(10)],
        **{"linger.ms": 50},
    )
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("times")})
    try:
        found = consumer.offsets_for_times([TopicPartition(topic, 0, base + 4500)], timeout=10)
        assert found[0].offset == 5
        found = consumer.offsets_for_times([TopicPartition(topic, 0, base)], timeout=10)
        assert found[0].offset == 0
        found = consumer.offsets_for_times([TopicPartition(topic, 0, base + 60_000)], timeout=10)
        assert found[0].offset == -1  # no record that late: OFFSET_END
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 10)
    finally:
        consumer.close()


def test_a_record_from_the_future_is_refused_with_invalid_timestamp(bootstrap: str, topic: str) -> None:
    """Kafka 4's message.timestamp.after.max.ms default (one hour): librdkafka reports the refusal per message."""
    create_topic(bootstrap, topic, 1)
    now = int(time.time() * 1000)
    reports: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "retries": 0})
    for value, ts in ((b"later", now + 2 * 3600_000), (b"now", now)):
        producer.produce(topic, value, partition=0, timestamp=ts, on_delivery=lambda err, msg: reports.append(err))
        producer.flush(10)
    assert [err.code() if err else None for err in reports] == [KafkaError.INVALID_TIMESTAMP, None]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("ts")})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 1)
    finally:
        consumer.close()


def test_idempotent_producer_across_restart_and_kill(file_broker: Any, topic: str) -> None:
    bootstrap = hostport(file_broker.bootstrap)
    create_topic(bootstrap, topic, 1)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 45000,
            "retry.backoff.ms": 100,
            "reconnect.backoff.ms": 100,
            "reconnect.backoff.max.ms": 500,
        }
    )
    errors: list[Any] = []

    def cb(err: Any, msg: Any) -> None:
        if err:
            errors.append(err)

    for i in range(50):
        producer.produce(topic, value=str(i).encode(), partition=0, on_delivery=cb)
    assert producer.flush(20) == 0

    file_broker.stop()
    file_broker.restart()
    assert hostport(file_broker.bootstrap) == bootstrap, "restart() must keep the listener address"
    for i in range(50, 100):
        producer.produce(topic, value=str(i).encode(), partition=0, on_delivery=cb)
    assert producer.flush(40) == 0

    # Records in flight when the broker dies: the producer retries them; the broker must drop what it already
    # stored (same producer id, epoch, sequence) and keep order.
    for i in range(100, 200):
        producer.produce(topic, value=str(i).encode(), partition=0, on_delivery=cb)
        producer.poll(0)
    file_broker.kill()
    file_broker.restart()
    assert producer.flush(40) == 0
    assert not errors, errors[:5]

    values = [int(m.value()) for m in consume_from(bootstrap, topic, 0, OFFSET_BEGINNING, 200)]
    assert values == list(range(200))
    # flush() returned with every record acknowledged: nothing is in flight, so the log's end is final
    watcher = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("watermarks")})
    try:
        assert watcher.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 200), (
            "duplicates stored after the retry"
        )
    finally:
        watcher.close()


def test_metadata_lists_topics_and_auto_creates(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_topic(bootstrap, topic, 4)
    md = admin.list_topics(timeout=10)
    assert len(md.brokers) == 1
    broker = next(iter(md.brokers.values()))
    assert f"{broker.host}:{broker.port}" == bootstrap
    assert len(md.topics[topic].partitions) == 4
    auto = unique("auto")
    produce_all(bootstrap, auto, [{"value": b"x"}])
    assert auto in admin.list_topics(timeout=10).topics


def test_group_admin_list_describe_offsets_delete(bootstrap: str, topic: str, group: str) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions

    create_topic(bootstrap, topic, 2)
    produce_all(bootstrap, topic, [{"value": str(i).encode(), "partition": i % 2} for i in range(10)])
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            "client.id": "compat-describe",
        }
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        c.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 20
        while got < 10 and time.monotonic() < deadline:
            got += len(c.consume(num_messages=10, timeout=0.2))
        assert got == 10
        c.commit(offsets=[TopicPartition(topic, 0, 5), TopicPartition(topic, 1, 3)], asynchronous=False)

        listed = admin.list_consumer_groups().result(15)
        assert group in {g.group_id for g in listed.valid}
        desc = admin.describe_consumer_groups([group])[group].result(15)
        assert desc.state == ConsumerGroupState.STABLE
        assert len(desc.members) == 1 and desc.members[0].client_id == "compat-describe"
        assert sorted(tp.partition for tp in desc.members[0].assignment.topic_partitions) == [0, 1]

        req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0), TopicPartition(topic, 1)])
        offsets = admin.list_consumer_group_offsets([req])[group].result(15)
        assert sorted((tp.partition, tp.offset) for tp in offsets.topic_partitions) == [(0, 5), (1, 3)]

        # A group with a live member cannot be deleted.
        with pytest.raises(KafkaException) as exc:
            admin.delete_consumer_groups([group])[group].result(15)
        assert exc.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
    finally:
        c.close()
    admin.delete_consumer_groups([group])[group].result(15)
    assert group not in {g.group_id for g in admin.list_consumer_groups().result(15).valid}


def test_delete_records_moves_log_start(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_topic(bootstrap, topic, 1)
    for i in range(4):  # four batches, so the cut can fall on a batch boundary
        produce_all(bootstrap, topic, [{"value": f"{i}-{j}".encode(), "partition": 0} for j in range(5)])
    result = admin.delete_records([TopicPartition(topic, 0, 10)])[TopicPartition(topic, 0, 10)].result(15)
    assert result.low_watermark == 10
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("dr")})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (10, 20)
    finally:
        consumer.close()
    got = consume_from(bootstrap, topic, 0, OFFSET_BEGINNING, 10)
    assert [m.offset() for m in got] == list(range(10, 20))


def test_static_member_restart_keeps_assignment_without_rebalance(bootstrap: str, topic: str, group: str) -> None:
    create_topic(bootstrap, topic, 4)
    revoked: dict[str, int] = {"a": 0, "b": 0}

    def member(name: str) -> Consumer:
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "group.instance.id": f"static-{name}",
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": HEARTBEAT_MS,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        c.subscribe([topic], on_revoke=lambda _c, parts: revoked.__setitem__(name, revoked[name] + len(parts)))
        return c

    def settle(consumers: list[Consumer], until: Any, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            for c in consumers:
                c.poll(0.1)
        assert until(), "the group did not settle"

    a, b = member("a"), member("b")
    try:
        settle([a, b], lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
        before_a = sorted(tp.partition for tp in a.assignment())
        revoked.update(a=0, b=0)
        a.close()  # a static member does not send LeaveGroup: its partitions wait for it
        a = member("a")
        settle([a, b], lambda: len(a.assignment()) == 2)
        for _ in range(20):  # give a rebalance, if one was started, the time to reach b
            b.poll(0.1)
        assert sorted(tp.partition for tp in a.assignment()) == before_a
        assert revoked["b"] == 0, "b was rebalanced although a came back with its group.instance.id"
    finally:
        a.close()
        b.close()


def test_a_consumer_of_many_partitions_reads_them_all_and_then_what_arrives_on_a_few(
    bootstrap: str, topic: str, group: str
) -> None:
    """A subscriber of a 200-partition topic: every Fetch names all its partitions, most of them caught up (the
    broker answers those from their offsets alone). It reads every record, in order per partition, then the
    records produced while it waits, on three partitions, arrive too."""
    partitions = 200
    create_topic(bootstrap, topic, partitions)
    produce_all(
        bootstrap, topic, [{"value": b"%d-%d" % (p, i), "partition": p} for i in range(5) for p in range(partitions)]
    )
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        consumer.subscribe([topic])
        seen: dict[int, list[bytes]] = {p: [] for p in range(partitions)}

        def read(until: int) -> None:
            deadline = time.monotonic() + 30
            while sum(map(len, seen.values())) < until and time.monotonic() < deadline:
                for msg in consumer.consume(1000, timeout=0.5):
                    assert msg.error() is None, msg.error()
                    seen[msg.partition()].append(msg.value())

        read(5 * partitions)
        assert all(seen[p] == [b"%d-%d" % (p, i) for i in range(5)] for p in range(partitions))
        produce_all(bootstrap, topic, [{"value": b"late-%d" % p, "partition": p} for p in (0, 99, 199)])
        read(5 * partitions + 3)
        assert [seen[p][5:] for p in (0, 99, 199)] == [[b"late-0"], [b"late-99"], [b"late-199"]]
        assert sum(map(len, seen.values())) == 5 * partitions + 3
        # the high watermarks the broker reported for caught-up partitions are their ends
        lows_highs = [consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True) for p in (1, 99)]
        assert lows_highs == [(0, 5), (0, 6)]
    finally:
        consumer.close()
