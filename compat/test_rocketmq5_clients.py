"""The official RocketMQ 5 Python SDK (rocketmq-python-client, gRPC) against mqk's RocketMQ 5 front door
(`--grpc-listen`, mqk.server.rocketmq5):

- a producer's messages (tags, keys, user properties, FIFO message groups, delivery times) reach a simple consumer
  by tag filter, each once, and a Kafka consumer reads the same records (and the other way round); a delayed
  message recalled with its send receipt's handle is never delivered;
- POP consumption: an unacknowledged message comes back after its invisible duration with its delivery attempt
  counted, an expired receipt handle is refused, a push consumer's failed message is retried after its back-off
  and moved to `%DLQ%group` by the broker at the group's delivery limit;
- a Kafka share consumer and a RocketMQ 5 consumer of one group share its records (none delivered to both);
- after kill -9 of the broker acknowledged messages stay acknowledged and held ones come back;
- transactions commit and roll back, and one left open is committed when the broker asks its producer;
- with the authorizer on, a request signed with a wrong secret is UNAUTHORIZED and one the ACLs do not grant
  FORBIDDEN; over TLS the SDK sends and receives;
- in a cluster of two broker groups, each with its gRPC listener, the SDK sends to and receives from the queues of
  both masters (the route and the assignment name each master's endpoint), each message once.

Each client starts its own gRPC channel and threads; every test shuts its clients down in `finally`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from compat_helpers import create_topic, hostport, unique
from confluent_kafka import Consumer, Producer, ShareConsumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from helpers import CLUSTER_TESTS, leaders_seen_by, wait_until
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq import Producer as RmqProducer

from mqk.testing import BrokerProcess

pytestmark = pytest.mark.timeout(120)

#: the share groups' delivery limit of these brokers: past it a RocketMQ group's message goes to %DLQ%group
DELIVERY_LIMIT = 3
#: the push consumer test's group sets its own, lower
GROUP_LIMIT = 2
#: how long a simple consumer's receive waits for messages (its long polling)
AWAIT_S = 2


def start(data_dir: Path, *extra: str) -> BrokerProcess:
    config = data_dir.parent / f"{data_dir.name}.toml"
    # (an open transaction is checked after a second, not RocketMQ's six: the check-back test waits for it)
    config.write_text(
        f"group_share_delivery_count_limit = {DELIVERY_LIMIT}\n"
        "native_transaction_timeout_ms = 1000\nnative_transaction_check_interval_ms = 500\n"
    )
    args = ["--grpc-listen", "127.0.0.1:0", "--config", str(config), *extra]
    return BrokerProcess(data_dir, extra_args=args).start()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = start(tmp_path / "b")
    try:
        yield process
    finally:
        process.kill()


def endpoint(broker: Any) -> str:
    assert broker.grpc_address is not None
    return hostport(broker.grpc_address)


def configuration(broker: Any, ak: str = "", sk: str = "") -> ClientConfiguration:
    return ClientConfiguration(endpoint(broker), Credentials(ak, sk))


def rocketmq_producer(broker: Any, topic: str, **credentials: str) -> RmqProducer:
    producer = RmqProducer(configuration(broker, **credentials), (topic,))
    producer.startup()
    return producer


def simple_consumer(broker: Any, group: str, topic: str, tags: str = "*") -> SimpleConsumer:
    consumer = SimpleConsumer(configuration(broker), group, {topic: FilterExpression(tags)}, await_duration=AWAIT_S)
    consumer.startup()
    return consumer


def message(topic: str, body: bytes, **fields: Any) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body
    for name, value in fields.items():
        if name == "properties":
            for k, v in value.items():
                msg.add_property(k, v)
        else:
            setattr(msg, name, value)
    return msg


def receive_until(
    consumer: SimpleConsumer, done: Callable[[list[Any]], bool], invisible_s: int = 10, ack: bool = True
) -> list[Any]:
    """Receive (acknowledging each message unless told not to) until `done(received)` holds; bounded."""
    received: list[Any] = []
    deadline = time.monotonic() + 40
    while not done(received):
        assert time.monotonic() < deadline, f"received {[m.body for m in received]}"
        for msg in consumer.receive(32, invisible_s):
            received.append(msg)
            if ack:
                consumer.ack(msg)
    return received


def nothing_more(consumer: SimpleConsumer, seconds: float) -> list[Any]:
    """What the consumer still receives within `seconds` (each receive long-polls AWAIT_S)."""
    extra: list[Any] = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        extra += consumer.receive(32, 10)
    return extra


def test_messages_reach_a_tag_filtered_simple_consumer_once_with_keys_and_properties(broker):
    topic, group = unique("r5"), unique("G")
    producer = rocketmq_producer(broker, topic)
    try:
        receipts = [
            producer.send(
                message(
                    topic,
                    b"m%d" % i,
                    tag="A" if i % 2 == 0 else "B",
                    keys=f"key-{i}",
                    properties={"color": "blue", "n": str(i)},
                )
            )
            for i in range(6)
        ]
    finally:
        producer.shutdown()
    assert sorted(r.offset for r in receipts) == list(range(6))
    consumer = simple_consumer(broker, group, topic, "A")
    try:
        got = receive_until(consumer, lambda got: len(got) >= 3)
        extra = nothing_more(consumer, AWAIT_S + 1)
    finally:
        consumer.shutdown()
    assert sorted(m.body for m in got) == [b"m0", b"m2", b"m4"] and extra == []
    by_body = {m.body: m for m in got}
    first = by_body[b"m0"]
    assert first.tag == "A" and set(first.keys) == {"key-0"}
    assert first.properties == {"color": "blue", "n": "0"}
    assert first.message_id == receipts[0].message_id and first.delivery_attempt == 1


def test_an_unacknowledged_message_comes_back_and_its_old_receipt_handle_is_refused(broker):
    from rocketmq.v5.exception import BadRequestException

    topic, group = unique("r5"), unique("G")
    producer = rocketmq_producer(broker, topic)
    try:
        producer.send(message(topic, b"once-more"))
    finally:
        producer.shutdown()
    consumer = simple_consumer(broker, group, topic)
    try:
        [first] = receive_until(consumer, lambda got: len(got) == 1, invisible_s=1, ack=False)
        [again] = receive_until(consumer, lambda got: len(got) == 1, invisible_s=30, ack=False)
        assert again.message_id == first.message_id and (first.delivery_attempt, again.delivery_attempt) == (1, 2)
        with pytest.raises(BadRequestException):  # the first delivery's handle expired with its lock
            consumer.ack(first)
        consumer.change_invisible_duration(again, 1)  # back after a second, counted once more
        [third] = receive_until(consumer, lambda got: len(got) == 1)
        assert third.delivery_attempt == 3
        assert nothing_more(consumer, AWAIT_S + 1) == []
    finally:
        consumer.shutdown()


class Listener(MessageListener):
    """Fails every message whose body starts with b"poison"; records (body, delivery attempt) of each call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[bytes, int]] = []

    def consume(self, msg: Any) -> Any:
        with self.lock:
            self.calls.append((msg.body, msg.delivery_attempt))
        return ConsumeResult.FAILURE if msg.body.startswith(b"poison") else ConsumeResult.SUCCESS

    def seen(self) -> list[tuple[bytes, int]]:
        with self.lock:
            return sorted(self.calls)


def test_a_push_consumer_retries_a_failed_message_and_the_broker_dead_letters_it_at_the_limit(broker):
    topic, group = unique("r5"), unique("G")
    # the group's own delivery limit (a Kafka group config: it is a share group), below the broker's
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    entry = ConfigEntry("share.delivery.count.limit", str(GROUP_LIMIT), incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(timeout=15)
    listener = Listener()
    consumer = PushConsumer(configuration(broker), group, listener, {topic: FilterExpression()})
    consumer.startup()
    producer = rocketmq_producer(broker, topic)
    dead = None
    try:
        for body in (b"fine-1", b"poison", b"fine-2"):
            producer.send(message(topic, body))
        # each failure puts the message back after the back-off the broker's settings gave; past the group's
        # delivery limit the broker moves it to the group's dead-letter topic, which a consumer reads like any
        dead = simple_consumer(broker, unique("D"), f"%DLQ%{group}")
        [forwarded] = receive_until(dead, lambda got: len(got) == 1)
    finally:
        producer.shutdown()
        consumer.shutdown()
        if dead is not None:
            dead.shutdown()
    calls = listener.seen()
    assert forwarded.body == b"poison"
    assert [a for b, a in calls if b == b"poison"] == list(range(1, GROUP_LIMIT + 1))
    assert [b for b, a in calls if b != b"poison"] == [b"fine-1", b"fine-2"]


def test_fifo_messages_of_one_group_keep_their_order_in_one_queue(broker):
    topic, group = unique("r5"), unique("G")
    create_topic(broker.bootstrap, topic, 4)
    producer = rocketmq_producer(broker, topic)
    try:
        for i in range(10):
            for g in ("g1", "g2", "g3"):
                producer.send(message(topic, f"{g}-{i}".encode(), message_group=g))
    finally:
        producer.shutdown()
    # where they were stored, as a Kafka consumer of the topic reads them
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": unique("k"), "auto.offset.reset": "earliest"}
    )
    by_partition: dict[int, list[str]] = {}
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while sum(map(len, by_partition.values())) < 30:
            assert time.monotonic() < deadline, by_partition
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                by_partition.setdefault(msg.partition(), []).append(msg.value().decode())
    finally:
        consumer.close()
    for g in ("g1", "g2", "g3"):
        holding = [p for p, values in by_partition.items() if any(v.startswith(g) for v in values)]
        assert len(holding) == 1, (g, by_partition)
        in_order = [v for v in by_partition[holding[0]] if v.startswith(g)]
        assert in_order == [f"{g}-{i}" for i in range(10)]
    simple = simple_consumer(broker, group, topic)
    try:
        got = receive_until(simple, lambda got: len(got) == 30)
    finally:
        simple.shutdown()
    assert {m.message_group for m in got} == {"g1", "g2", "g3"}


def test_a_delayed_message_is_delivered_at_its_time(broker):
    topic, group = unique("r5"), unique("G")
    producer = rocketmq_producer(broker, topic)
    consumer = simple_consumer(broker, group, topic)
    try:
        producer.send(message(topic, b"now"))
        due_ms = int(time.time() * 1000) + 3000
        # (the SDK's delivery_timestamp is in milliseconds, as its own tests set it)
        producer.send(message(topic, b"later", delivery_timestamp=due_ms))
        first = receive_until(consumer, lambda got: len(got) >= 1)
        assert [m.body for m in first] == [b"now"]
        [later] = receive_until(consumer, lambda got: len(got) == 1)
        received_ms = time.time() * 1000
    finally:
        producer.shutdown()
        consumer.shutdown()
    assert later.body == b"later" and received_ms >= due_ms - 50  # not before its time (50 ms: clock reads)


def test_a_recalled_delayed_message_is_never_delivered_and_bad_recalls_are_refused(broker):
    topic, group = unique("r5"), unique("G")
    producer = rocketmq_producer(broker, topic)
    consumer = simple_consumer(broker, group, topic)
    try:
        now = producer.send(message(topic, b"now"))
        assert not now.recall_handle  # nothing to recall
        due_ms = int(time.time() * 1000) + 3000
        kept = producer.send(message(topic, b"kept", delivery_timestamp=due_ms))
        recalled = producer.send(message(topic, b"recalled", delivery_timestamp=due_ms))
        assert kept.recall_handle and recalled.recall_handle
        assert producer.recall_message(topic, recalled.recall_handle) == recalled.message_id
        with pytest.raises(Exception, match="not exist"):
            producer.recall_message(unique("missing"), recalled.recall_handle)
        elsewhere = unique("elsewhere")
        create_topic(broker.bootstrap, elsewhere)
        with pytest.raises(Exception, match="topic not match"):
            producer.recall_message(elsewhere, recalled.recall_handle)
        with pytest.raises(Exception, match="recall handle is invalid"):
            producer.recall_message(topic, "garbage")
        first = receive_until(consumer, lambda got: len(got) >= 1)
        assert [m.body for m in first] == [b"now"]
        [later] = receive_until(consumer, lambda got: len(got) == 1)
        assert later.body == b"kept" and time.time() * 1000 >= due_ms - 50
        assert nothing_more(consumer, 2 * AWAIT_S) == []  # the recalled one never comes
        with pytest.raises(Exception, match="timestamp invalid"):  # delivered: too late to recall
            producer.recall_message(topic, kept.recall_handle)
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_kafka_and_rocketmq5_clients_read_each_others_messages(broker):
    topic, group = unique("r5"), unique("G")
    create_topic(broker.bootstrap, topic, 1)
    kafka = Producer({"bootstrap.servers": broker.bootstrap})
    kafka.produce(topic, b"from-kafka", key=b"k")
    assert kafka.flush(30) == 0
    producer = rocketmq_producer(broker, topic)
    try:
        producer.send(message(topic, b"from-rocketmq", tag="T"))
    finally:
        producer.shutdown()
    simple = simple_consumer(broker, group, topic)
    try:
        got = receive_until(simple, lambda got: len(got) == 2)
    finally:
        simple.shutdown()
    assert sorted(m.body for m in got) == [b"from-kafka", b"from-rocketmq"]
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": unique("k"), "auto.offset.reset": "earliest"}
    )
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(values) < 2:
            assert time.monotonic() < deadline, values
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                values.append(msg.value())
    finally:
        consumer.close()
    assert values == [b"from-kafka", b"from-rocketmq"]


def test_a_kafka_share_consumer_and_a_rocketmq5_consumer_of_one_group_share_its_records(broker):
    topic, group = unique("r5"), unique("SG")
    create_topic(broker.bootstrap, topic, 2)
    share = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    share.subscribe([topic])
    simple = simple_consumer(broker, group, topic)
    kafka = Producer({"bootstrap.servers": broker.bootstrap})
    readers: dict[bytes, list[str]] = {}
    try:
        # both have read the (empty) partitions once: the group's share state starts before the records, whichever
        # member made it (share.auto.offset.reset is latest for a Kafka share group)
        share.poll(1.0)
        assert simple.receive(8, 30) == []
        for i in range(60):
            kafka.produce(topic, b"%d" % i, partition=i % 2)
        assert kafka.flush(30) == 0
        deadline = time.monotonic() + 60
        while len(readers) < 60:
            assert time.monotonic() < deadline, sorted(readers)
            for m in share.poll(0.3) or []:
                if not m.error():
                    readers.setdefault(m.value(), []).append("kafka")
            for m in simple.receive(8, 30):
                readers.setdefault(m.body, []).append("rocketmq")
                simple.ack(m)
    finally:
        share.close()
        simple.shutdown()
    assert sorted(readers) == sorted(b"%d" % i for i in range(60))
    assert all(len(r) == 1 for r in readers.values()), {v: r for v, r in readers.items() if len(r) > 1}


def test_after_a_kill_9_acknowledged_messages_stay_acknowledged_and_held_ones_come_back(tmp_path: Path):
    process = start(tmp_path / "b")
    topic, group = unique("r5"), unique("G")
    try:
        producer = rocketmq_producer(process, topic)
        try:
            for i in range(10):
                producer.send(message(topic, b"%d" % i))
        finally:
            producer.shutdown()
        consumer = simple_consumer(process, group, topic)
        try:
            held = receive_until(consumer, lambda got: len(got) == 10, invisible_s=60, ack=False)
            acked = sorted(held, key=lambda m: int(m.body))[:5]
            for m in acked:
                consumer.ack(m)  # answered once the group's state is in its log
        finally:
            consumer.shutdown()
        process.kill()
        process.start()
        consumer = simple_consumer(process, group, topic)
        try:
            again = receive_until(consumer, lambda got: len(got) >= 5)
            extra = nothing_more(consumer, AWAIT_S + 1)
        finally:
            consumer.shutdown()
    finally:
        process.kill()
    assert sorted(int(m.body) for m in again) == [5, 6, 7, 8, 9] and extra == []
    assert {m.delivery_attempt for m in again} == {2}  # the delivery before the kill counts


TLS_CHILD = """
import sys
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
endpoint, topic, group = sys.argv[1:4]
config = ClientConfiguration(endpoint, Credentials())
producer = Producer(config, (topic,), tls_enable=True)
producer.startup()
m = Message(); m.topic = topic; m.body = b"over-tls"
producer.send(m)
producer.shutdown()
consumer = SimpleConsumer(config, group, {topic: FilterExpression("*")}, await_duration=2, tls_enable=True)
consumer.startup()
for _ in range(10):
    got = consumer.receive(1, 10)
    if got:
        consumer.ack(got[0])
        print(got[0].body.decode(), flush=True)
        break
consumer.shutdown()
"""


def test_the_sdk_sends_and_receives_over_tls(tmp_path: Path):
    from pki import make_pki

    pki = make_pki(tmp_path / "pki")
    config = tmp_path / "tls.toml"
    config.write_text(f'grpc_tls = true\n[tls]\ncert_file = "{pki.server}"\nkey_file = "{pki.server_key}"\n')
    process = BrokerProcess(
        tmp_path / "b", extra_args=["--grpc-listen", "127.0.0.1:0", "--config", str(config)]
    ).start()
    try:
        # gRPC takes its trusted roots from this variable (the SDK gives it no CA of its own)
        env = {**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(pki.ca), "HOME": str(tmp_path)}
        child = subprocess.run(
            [sys.executable, "-c", TLS_CHILD, endpoint(process), unique("r5"), unique("G")],
            capture_output=True,
            text=True,
            timeout=90,
            env=env,
        )
    finally:
        process.kill()
    assert child.stdout.strip() == "over-tls", child.stderr[-3000:]


def test_signed_requests_pass_a_wrong_secret_is_unauthorized_and_an_ungranted_one_forbidden(caplog):
    import dataclasses

    from rocketmq.v5.exception import ForbiddenException

    from mqk.broker.security.acls import AclBinding
    from mqk.testing import ThreadedBroker, broker_config

    def allow(user: str, rtype: str, name: str, operation: str) -> AclBinding:
        return AclBinding(rtype, name, "LITERAL", f"User:{user}", "*", operation, "ALLOW")

    config = dataclasses.replace(broker_config(), grpc_listen=("127.0.0.1", 0), authorizer=True)
    broker = ThreadedBroker(config).start()
    topic, group = "orders", "G"
    clients: list[Any] = []
    try:
        security = broker.runtime.broker.security
        security.access_keys.set("alice", "alice-secret")
        security.access_keys.set("bob", "bob-secret")
        broker.call(broker.runtime.native.ctx.ensure_topic(topic, 1))
        grants = [allow("alice", "TOPIC", topic, "WRITE"), allow("alice", "TOPIC", topic, "READ")]
        grants += [allow("alice", "GROUP", group, "READ"), allow("bob", "TOPIC", topic, "DESCRIBE")]
        broker.call(security.acls.change(add=grants))

        alice = RmqProducer(configuration(broker, ak="alice", sk="alice-secret"), (topic,))
        clients.append(alice)
        alice.startup()
        alice.send(message(topic, b"signed"))
        consumer = SimpleConsumer(
            ClientConfiguration(endpoint(broker), Credentials("alice", "alice-secret")),
            group,
            {topic: FilterExpression()},
            await_duration=AWAIT_S,
        )
        clients.append(consumer)
        consumer.startup()
        [got] = receive_until(consumer, lambda got: len(got) == 1)
        assert got.body == b"signed"

        forger = RmqProducer(configuration(broker, ak="alice", sk="not-her-secret"), (topic,))
        clients.append(forger)
        forger.startup()
        # (the SDK meets the refusal first in its route lookup, and says only that the route failed)
        with pytest.raises(Exception, match="route"):
            forger.send(message(topic, b"forged"))
        refusals = [r.getMessage() for r in caplog.records if r.name == "mqk.rocketmq5"]
        assert any("UNAUTHORIZED" in r and "signature does not match" in r for r in refusals), refusals
        bob = RmqProducer(configuration(broker, ak="bob", sk="bob-secret"), (topic,))
        clients.append(bob)
        bob.startup()
        with pytest.raises(ForbiddenException):  # bob may see the topic, not write to it
            bob.send(message(topic, b"not allowed"))
        assert nothing_more(consumer, AWAIT_S + 1) == []  # neither refused send was stored
    finally:
        for client in clients:
            try:
                client.shutdown()
            except Exception as exc:  # noqa: BLE001 - a client that never started cannot shut down: the rest must
                print("shutdown:", exc)
        broker.stop()


class CommitEveryOrphan(TransactionChecker):
    """The producer's answer when the broker asks about a transaction left open: commit (and remember the ask)."""

    def __init__(self) -> None:
        self.asked: list[bytes] = []

    def check(self, msg: Any) -> Any:
        self.asked.append(msg.body)
        return TransactionResolution.COMMIT


def test_transactions_commit_roll_back_and_an_orphan_is_committed_when_the_broker_asks(broker):
    checker = CommitEveryOrphan()
    topic, group = unique("r5"), unique("G")
    producer = RmqProducer(configuration(broker), (topic,), checker)
    producer.startup()
    consumer = simple_consumer(broker, group, topic)
    try:
        committed = producer.begin_transaction()
        producer.send(message(topic, b"committed"), committed)
        committed.commit()
        rolled_back = producer.begin_transaction()
        producer.send(message(topic, b"rolled-back"), rolled_back)
        rolled_back.rollback()
        # a transaction its producer never ends (as if it had crashed after the send): the broker asks about it
        producer.send(message(topic, b"orphan"), producer.begin_transaction())
        got = receive_until(consumer, lambda got: {m.body for m in got} >= {b"committed", b"orphan"})
        extra = nothing_more(consumer, AWAIT_S + 1)
    finally:
        consumer.shutdown()
        producer.shutdown()
    assert sorted(m.body for m in got) == [b"committed", b"orphan"] and extra == []
    assert checker.asked == [b"orphan"]


def make_fifo_group(broker: Any, group: str) -> None:
    """What `mqadmin updateSubGroup -g GROUP -o true` sends: the group's subscription config, consumeMessageOrderly."""
    from mqk.client.remoting import RemotingConnection
    from mqk.protocol.native.codes import RequestCode, ResponseCode
    from mqk.protocol.native.command import RemotingCommand

    async def send() -> int:
        conn = RemotingConnection(broker.native_address)
        await conn.connect()
        try:
            body = json.dumps({"groupName": group, "consumeMessageOrderly": True}).encode()
            command = RemotingCommand(code=RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
            return (await conn.invoke(command, timeout=10)).code
        finally:
            await conn.close()

    assert asyncio.run(send()) == ResponseCode.SUCCESS


class FailsOnce:
    """Fails the first delivery of one body; records the bodies in the order the listener saw them."""

    def __init__(self, failing: bytes) -> None:
        self.failing = failing
        self.lock = threading.Lock()
        self.calls: list[bytes] = []

    def consume(self, msg: Any) -> Any:
        with self.lock:
            self.calls.append(msg.body)
            first = self.calls.count(msg.body) == 1
        return ConsumeResult.FAILURE if first and msg.body == self.failing else ConsumeResult.SUCCESS


def test_a_fifo_groups_messages_go_out_in_order_one_batch_of_a_queue_at_a_time(broker):
    """A consumer group made FIFO (consumeMessageOrderly) is told so in its settings: the SDK's push consumer then
    retries a failed message before it consumes the next one of its message group. The broker hands out a queue's
    messages one batch at a time: while a batch is held, no consumer of the group gets more from that queue."""
    topic, group = unique("r5"), unique("G")
    create_topic(broker.bootstrap, topic, 1)
    make_fifo_group(broker, group)
    producer = rocketmq_producer(broker, topic)
    try:
        for i in range(5):
            producer.send(message(topic, b"o-%d" % i, message_group="orders"))
    finally:
        producer.shutdown()
    first, second = simple_consumer(broker, group, topic), simple_consumer(broker, group, topic)
    try:
        # held for 10 s: well past the watch on the second consumer below, whose last long poll (AWAIT_S) may
        # start just before its 2.5 s end and be open till 4.5 s, and a slow machine's calls add to that
        batch = first.receive(2, 10)
        assert [m.body for m in batch] == [b"o-0", b"o-1"]
        assert nothing_more(second, AWAIT_S + 0.5) == []  # the queue's batch is held
        first.ack(batch[1])  # o-0 is left to its lock's end
        rest = receive_until(second, lambda got: len(got) == 4)
    finally:
        first.shutdown()
        second.shutdown()
    assert [(m.body, m.delivery_attempt) for m in rest] == [(b"o-0", 2), (b"o-2", 1), (b"o-3", 1), (b"o-4", 1)]
    listener = FailsOnce(b"p-1")
    push_group = unique("G")
    make_fifo_group(broker, push_group)
    push = PushConsumer(configuration(broker), push_group, listener, {topic: FilterExpression()})
    push.startup()
    producer = rocketmq_producer(broker, topic)
    try:
        for i in range(4):
            producer.send(message(topic, b"p-%d" % i, message_group="orders"))
        wanted = [b"p-0", b"p-1", b"p-1", b"p-2", b"p-3"]
        wait_until(lambda: [c for c in listener.calls if c.startswith(b"p-")] == wanted, 30, "p-0..p-3 in order")
    finally:
        producer.shutdown()
        push.shutdown()


@CLUSTER_TESTS
def test_in_a_cluster_the_sdk_sends_to_and_receives_from_every_masters_queues(mqk_cluster_factory: Any) -> None:
    cluster = mqk_cluster_factory(2, extra_args=["--grpc-listen", "127.0.0.1:0"])
    first, second = cluster.brokers
    assert first.grpc is not None and second.grpc is not None
    topic, group = unique("r5c"), unique("G")
    create_topic(cluster.bootstrap, topic, 4)
    # (the controller answered the creation; the broker each client asks for the topic's route, through its gRPC
    # endpoint, learns the topic by its own etcd watch, maybe a moment later)
    wait_until(lambda: all(len(leaders_seen_by(b.kafka, topic)) == 4 for b in cluster.brokers), 30, "both know it")
    producer = RmqProducer(ClientConfiguration(hostport(first.grpc), Credentials("", "")), (topic,))
    producer.startup()
    consumer = SimpleConsumer(
        ClientConfiguration(hostport(second.grpc), Credentials("", "")),
        group,
        {topic: FilterExpression("*")},
        await_duration=AWAIT_S,
    )
    consumer.startup()
    try:
        for i in range(40):
            producer.send(message(topic, b"%d" % i))
        received = receive_until(consumer, lambda got: len({m.body for m in got}) >= 40)
    finally:
        producer.shutdown()
        consumer.shutdown()
    assert sorted(m.body for m in received) == sorted(b"%d" % i for i in range(40))  # each once
    kafka = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": unique("watermarks")})
    try:
        metadata = kafka.list_topics(topic, timeout=10).topics[topic].partitions
        stored = {p: kafka.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in metadata}
    finally:
        kafka.close()
    assert sum(stored.values()) == 40
    # both masters took messages: the SDK spread its sends over the queues of each
    assert {metadata[p].leader for p, n in stored.items() if n} == {first.node_id, second.node_id}
