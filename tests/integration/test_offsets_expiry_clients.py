"""offsets.retention.minutes as real clients see it, on a broker running on a FakeClock: a confluent-kafka consumer
group commits and leaves; kafka-python's admin client still finds the group's offsets until the group has been
empty for the retention, and neither the offsets nor the group after the next expiry pass; a consumer of the same
group then starts from its auto.offset.reset position, as after Kafka's expiry."""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer

from mqk.clock import FakeClock
from mqk.testing import ThreadedBroker, broker_config

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient

pytestmark = pytest.mark.filterwarnings("ignore:(open|read)_text is deprecated:DeprecationWarning")
RETENTION_MINUTES = 60
CHECK_S = 60


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    config = dataclasses.replace(
        broker_config("memory"),
        offsets_retention_minutes=RETENTION_MINUTES,
        offsets_retention_check_interval_ms=CHECK_S * 1000,
    )
    started = ThreadedBroker(config, clock=FakeClock()).start()
    try:
        yield started
    finally:
        started.stop()


def _consume(bootstrap: str, group: str, count: int, reset: str = "earliest") -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": reset, "enable.auto.commit": False}
    )
    out: list[bytes] = []
    try:
        consumer.subscribe(["expiring"])
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append(msg.value())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()  # LeaveGroup: the group is empty from here
    return out


def _committed(admin: KafkaAdminClient) -> list[tuple[str, int]]:
    offsets = admin.list_group_offsets({"leaver": None}).get("leaver", {})
    return [(tp.topic, meta.offset) for tp, meta in offsets.items() if meta.offset >= 0]


def test_an_empty_groups_offsets_expire_after_the_retention_and_the_group_starts_over(broker) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(5):
        producer.produce("expiring", value=b"v%d" % i)
    assert producer.flush(10) == 0
    assert _consume(broker.bootstrap, "leaver", 5) == [b"v%d" % i for i in range(5)]
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert _committed(admin) == [("expiring", 5)] and "leaver" in str(admin.list_groups())
        broker.advance(RETENTION_MINUTES * 60 - CHECK_S)  # empty for less than the retention at every pass
        assert _committed(admin) == [("expiring", 5)]
        broker.advance(2 * CHECK_S)
        assert _committed(admin) == []
        assert "leaver" not in str(admin.list_groups())
    finally:
        admin.close()
    producer.produce("expiring", value=b"new")
    assert producer.flush(10) == 0
    # no committed offset any more: the group starts from auto.offset.reset (earliest), so it reads all again
    assert _consume(broker.bootstrap, "leaver", 6) == [*(b"v%d" % i for i in range(5)), b"new"]
