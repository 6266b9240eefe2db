"""Kafka share groups (KIP-932, "queues for Kafka") with a real client: confluent-kafka's ShareConsumer (librdkafka's
share consumer, in preview) against an `mqk serve` process.

- Two share consumers of one group split the records of three partitions between them; every record is delivered
  once (each poll's records accepted by the next poll or commit).
- Explicit acknowledgement: a released record comes back (with a higher delivery count), at most
  `group_share_delivery_count_limit` times; a rejected one never does; accepted ones never do.
- A consumer killed -9 while holding records: they come back to the other consumer once their acquisition lock
  (`group_share_record_lock_duration_ms`) ends.
- The broker killed -9 after the acknowledgements were answered: restarted, it delivers only what was not accepted
  (the record states live in `__share_group_state`).
- RocketMQ POP over remoting (mqk's own PopConsumer) and a ShareConsumer in one group: a record has one holder at a
  time; what the POP consumer hands back early goes to the ShareConsumer, what it acknowledges never does.

The broker runs with a half-second heartbeat interval, a two-second record lock and `share.auto.offset.reset`
earliest, set in its TOML file.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from compat_helpers import ChildClient, create_topic, hostport, produce_numbered, unique
from confluent_kafka import AcknowledgeType, KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)

from mqk.client import ClientError, PopConsumer, PoppedMessage
from mqk.testing import BrokerProcess

pytestmark = pytest.mark.timeout(120)

LOCK_MS = 2000
DELIVERY_LIMIT = 3
SETTINGS = (
    "group_share_heartbeat_interval_ms = 500\n"
    f"group_share_record_lock_duration_ms = {LOCK_MS}\n"
    f"group_share_delivery_count_limit = {DELIVERY_LIMIT}\n"
    'group_share_auto_offset_reset = "earliest"\n'
)


def start(tmp_path: Path) -> Any:
    config = tmp_path / "broker.toml"
    config.write_text(SETTINGS)
    return BrokerProcess(tmp_path / "data", storage="file", extra_args=("--config", str(config))).start()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Any]:
    process = start(tmp_path)
    try:
        yield process
    finally:
        process.stop()


def share_consumer(bootstrap: str, group: str, topic: str, **extra: Any) -> ShareConsumer:
    consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, **extra})
    consumer.subscribe([topic])
    return consumer


def drain(
    consumers: list[ShareConsumer],
    until: Callable[[list[tuple[int, int]]], bool],
    seconds: float = 30,
    on_message: Callable[[ShareConsumer, Any], None] | None = None,
) -> list[tuple[int, int]]:
    """Poll the consumers in turn until `until(log)` holds; the log is (consumer index, value) per delivery. After
    each poll the consumer commits (implicit mode: that poll's records are accepted)."""
    log: list[tuple[int, int]] = []
    deadline = time.monotonic() + seconds
    while not until(log):
        assert time.monotonic() < deadline, f"timed out; delivered {sorted(v for _c, v in log)}"
        for index, consumer in enumerate(consumers):
            messages = consumer.poll(0.2) or []
            for msg in messages:
                if msg.error():
                    continue
                log.append((index, int(msg.value())))
                if on_message is not None:
                    on_message(consumer, msg)
            if messages:
                consumer.commit_sync()
    return log


def test_two_share_consumers_split_the_records_and_each_is_delivered_once(broker):
    bootstrap = hostport(broker.bootstrap)
    topic, group = unique("q"), unique("sg")
    create_topic(bootstrap, topic, 3)
    produce_numbered(bootstrap, topic, 3, 300)
    consumers = [share_consumer(bootstrap, group, topic), share_consumer(bootstrap, group, topic)]
    try:
        log = drain(consumers, lambda log: len({v for _c, v in log}) == 300)
        produce_numbered(bootstrap, topic, 3, 60, start=300)
        log += drain(consumers, lambda more: len({v for _c, v in log + more}) == 360)
    finally:
        for consumer in consumers:
            consumer.close()
    values = [v for _c, v in log]
    assert sorted(values) == list(range(360))  # each once
    assert {c for c, _v in log} == {0, 1}  # both had a share


def test_a_pop_consumer_and_a_share_consumer_of_one_group_never_hold_a_record_together(broker):
    bootstrap = hostport(broker.bootstrap)
    topic, group = unique("q"), unique("sg")
    create_topic(bootstrap, topic, 2)
    produce_numbered(bootstrap, topic, 2, 40)
    loop = asyncio.new_event_loop()
    pop = PopConsumer(hostport(broker.namesrv_address), group)

    async def take(count: int) -> list[PoppedMessage]:
        held: list[PoppedMessage] = []
        deadline = time.monotonic() + 30
        while len(held) < count:
            assert time.monotonic() < deadline, f"popped {len(held)} of {count}"
            held += await pop.pop(topic, max_messages=count - len(held), invisible_ms=60_000, poll_ms=500)
        return held

    share = share_consumer(bootstrap, group, topic)
    try:
        held = loop.run_until_complete(take(10))
        popped = {int(p.message.body) for p in held}
        assert len(popped) == 10 and all(p.attempt == 1 for p in held)
        first = drain([share], lambda log: len({v for _c, v in log}) >= 30)
        assert {v for _c, v in first}.isdisjoint(popped)  # held by the POP consumer: not handed to the other
        assert sorted({v for _c, v in first} | popped) == list(range(40))

        acked, handed_back = held[:5], held[5:]
        for p in acked:
            loop.run_until_complete(pop.ack(p))
        with pytest.raises(ClientError, match="code 208"):  # NO_MESSAGE: an acknowledged message is held no more
            loop.run_until_complete(pop.change_invisible_time(acked[0], 0))
        for p in handed_back:
            loop.run_until_complete(pop.change_invisible_time(p, 0))
        back = {int(p.message.body) for p in handed_back}
        second = drain([share], lambda log: {v for _c, v in log} >= back)
        assert {v for _c, v in second} == back  # only those: the acknowledged five never come back
        assert loop.run_until_complete(pop.pop(topic, invisible_ms=60_000, poll_ms=1000)) == []  # all settled
    finally:
        share.close()
        loop.run_until_complete(pop.close())
        loop.close()


def test_released_records_come_back_up_to_the_delivery_limit_and_rejected_ones_never(broker):
    bootstrap = hostport(broker.bootstrap)
    topic, group = unique("q"), unique("sg")
    create_topic(bootstrap, topic, 1)
    produce_numbered(bootstrap, topic, 1, 10)

    def decide(consumer: ShareConsumer, msg: Any) -> None:
        value = int(msg.value())
        if value == 3:
            consumer.acknowledge(msg, AcknowledgeType.RELEASE)
        elif value == 7:
            consumer.acknowledge(msg, AcknowledgeType.REJECT)
        else:
            consumer.acknowledge(msg)

    consumer = share_consumer(bootstrap, group, topic, **{"share.acknowledgement.mode": "explicit"})
    try:
        log = drain([consumer], lambda log: [v for _c, v in log].count(3) == DELIVERY_LIMIT, on_message=decide)
        # nothing more comes: 3 has reached the limit, 7 was rejected, the rest were accepted. Polled past every
        # lock's end (a record whose lock ran out would be delivered again within that time)
        extra: list[tuple[int, int]] = []
        quiet_until = time.monotonic() + LOCK_MS / 1000 + 1
        while time.monotonic() < quiet_until:
            extra += [(0, int(m.value())) for m in (consumer.poll(0.2) or []) if not m.error()]
    finally:
        consumer.close()
    values = [v for _c, v in log]
    assert sorted(set(values)) == list(range(10))
    assert values.count(3) == DELIVERY_LIMIT and values.count(7) == 1
    assert all(values.count(v) == 1 for v in range(10) if v != 3)
    assert extra == []


CHILD = """
import signal, sys
from confluent_kafka import ShareConsumer
bootstrap, group, topic = sys.argv[1:4]
c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
c.subscribe([topic])
while True:
    got = [m for m in c.poll(0.2) or [] if not m.error()]
    for m in got:
        print(m.value().decode(), flush=True)
    if got:
        signal.pause()  # holds them (a next poll would accept them) until it is killed
"""


def test_records_a_killed_consumer_held_come_back_after_their_lock(broker):
    bootstrap = hostport(broker.bootstrap)
    topic, group = unique("q"), unique("sg")
    create_topic(bootstrap, topic, 1)
    produce_numbered(bootstrap, topic, 1, 20)
    with ChildClient(CHILD, bootstrap, group, topic) as child:
        held = {int(v) for v in child.kill9()}
    assert held  # it held at least one when it was killed
    survivor = share_consumer(bootstrap, group, topic)
    try:
        log = drain([survivor], lambda log: {v for _c, v in log} >= set(range(20)))
    finally:
        survivor.close()
    assert sorted(v for _c, v in log) == list(range(20))  # the killed one's records too, each once
    assert held <= {v for _c, v in log}


def test_after_a_kill_9_of_the_broker_only_unaccepted_records_are_delivered_again(tmp_path: Path):
    broker = start(tmp_path)
    try:
        bootstrap = hostport(broker.bootstrap)
        topic, group = unique("q"), unique("sg")
        create_topic(bootstrap, topic, 2)
        produce_numbered(bootstrap, topic, 2, 40)
        consumer = share_consumer(bootstrap, group, topic)
        try:
            first = drain([consumer], lambda log: len(log) >= 10)
            consumer.commit_sync()  # accepted, and answered: durable from here
        finally:
            consumer.close()
        accepted = {v for _c, v in first}
        broker.kill()
        broker = BrokerProcess(tmp_path / "data", storage="file", extra_args=broker.extra_args).start()
        bootstrap = hostport(broker.bootstrap)
        consumer = share_consumer(bootstrap, group, topic)
        try:
            rest = drain([consumer], lambda log: {v for _c, v in log} | accepted >= set(range(40)))
        finally:
            consumer.close()
        assert not accepted & {v for _c, v in rest}  # nothing accepted came back
        assert sorted(accepted | {v for _c, v in rest}) == list(range(40))
    finally:
        broker.stop()


def group_configs(admin: Any, group: str) -> dict[str, tuple[str, Any]]:
    """The group's configs as confluent-kafka's admin describes them: name -> (value, source)."""
    resource = ConfigResource(ResourceType.GROUP, group)
    entries = admin.describe_configs([resource])[resource].result(timeout=15)
    return {name: (entry.value, ConfigSource(entry.source)) for name, entry in entries.items()}


def test_a_group_config_set_by_the_admin_overrides_the_broker_and_survives_a_restart(tmp_path: Path):
    process = start(tmp_path)
    try:
        bootstrap = hostport(process.bootstrap)
        topic, group = unique("q"), unique("sg")
        create_topic(bootstrap, topic, 1)
        produce_numbered(bootstrap, topic, 1, 3)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        change = ConfigResource(
            ResourceType.GROUP,
            group,
            incremental_configs=[
                ConfigEntry("share.delivery.count.limit", "2", incremental_operation=AlterConfigOpType.SET)
            ],
        )
        admin.incremental_alter_configs([change])[change].result(timeout=15)
        bad = ConfigResource(
            ResourceType.GROUP,
            group,
            incremental_configs=[
                ConfigEntry("share.delivery.count.limit", "99", incremental_operation=AlterConfigOpType.SET)
            ],
        )
        with pytest.raises(KafkaException, match="outside"):
            admin.incremental_alter_configs([bad])[bad].result(timeout=15)
        configs = group_configs(admin, group)
        assert configs["share.delivery.count.limit"] == ("2", ConfigSource.GROUP_CONFIG)
        assert configs["share.record.lock.duration.ms"] == (str(LOCK_MS), ConfigSource.DEFAULT_CONFIG)

        def release_one(consumer: ShareConsumer, msg: Any) -> None:
            consumer.acknowledge(msg, AcknowledgeType.RELEASE if int(msg.value()) == 1 else AcknowledgeType.ACCEPT)

        consumer = share_consumer(bootstrap, group, topic, **{"share.acknowledgement.mode": "explicit"})
        try:
            log = drain([consumer], lambda log: [v for _c, v in log].count(1) == 2, on_message=release_one)
            quiet_until = time.monotonic() + LOCK_MS / 1000 + 1
            while time.monotonic() < quiet_until:  # the group's limit (2), not the broker's (3)
                log += [(0, int(m.value())) for m in (consumer.poll(0.2) or []) if not m.error()]
        finally:
            consumer.close()
        assert sorted(v for _c, v in log) == [0, 1, 1, 2]
        process.kill()
        process.start()
        admin = AdminClient({"bootstrap.servers": hostport(process.bootstrap)})
        assert group_configs(admin, group)["share.delivery.count.limit"] == ("2", ConfigSource.GROUP_CONFIG)
    finally:
        process.kill()


def set_group_config(admin: Any, group: str, key: str, value: str) -> None:
    change = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)],
    )
    admin.incremental_alter_configs([change])[change].result(timeout=15)


def test_a_read_committed_share_group_skips_aborted_transactions_and_waits_for_open_ones(broker):
    """share.isolation.level=read_committed (a group config, as Kafka's): records of aborted transactions are never
    delivered, and nothing at or past an open transaction's first record is (the last stable offset) until it
    commits; a read_uncommitted group of the same topic gets every data record at once."""
    bootstrap = hostport(broker.bootstrap)
    topic, committed_group, uncommitted_group = unique("q"), unique("sg-rc"), unique("sg-ru")
    create_topic(bootstrap, topic, 1)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    set_group_config(admin, committed_group, "share.isolation.level", "read_committed")
    assert group_configs(admin, committed_group)["share.isolation.level"] == (
        "read_committed",
        ConfigSource.GROUP_CONFIG,
    )
    with pytest.raises(KafkaException, match="read_committed"):
        set_group_config(admin, committed_group, "share.isolation.level", "serializable")
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("txn")})
    producer.init_transactions(15)

    def transaction(values: range, commit: bool | None) -> None:
        producer.begin_transaction()
        for v in values:
            producer.produce(topic, str(v).encode(), partition=0)
        producer.flush(15)
        if commit is True:
            producer.commit_transaction(15)
        elif commit is False:
            producer.abort_transaction(15)

    plain = Producer({"bootstrap.servers": bootstrap})
    try:
        transaction(range(5), commit=True)
        transaction(range(100, 105), commit=False)
        transaction(range(200, 205), commit=None)  # left open for now
        for v in range(300, 303):  # after the open transaction's records: past the last stable offset
            plain.produce(topic, str(v).encode(), partition=0)
        assert plain.flush(15) == 0
        reader = share_consumer(bootstrap, committed_group, topic)
        everything = share_consumer(bootstrap, uncommitted_group, topic)
        try:
            before = drain([reader], lambda log: len(log) >= 5)
            quiet_until = time.monotonic() + 2  # nothing else while the transaction is open
            while time.monotonic() < quiet_until:
                before += [(0, int(m.value())) for m in (reader.poll(0.2) or []) if not m.error()]
            producer.commit_transaction(15)
            after = drain([reader], lambda log: len(log) >= 8)
            uncommitted = drain([everything], lambda log: len(log) >= 18)
        finally:
            reader.close()
            everything.close()
    finally:
        plain.flush(5)
    assert sorted(v for _c, v in before) == list(range(5))
    assert sorted(v for _c, v in after) == [200, 201, 202, 203, 204, 300, 301, 302]
    assert sorted(v for _c, v in uncommitted) == [*range(5), *range(100, 105), *range(200, 205), 300, 301, 302]
