"""The broker layer on its own (mqk.broker, over a memory StoreManager): topic names, the settings schema, the
internal-topic policy, the topic registry (creation, auto-creation, ids, alteration) and the wake-up hub on an
injected clock."""

from __future__ import annotations

import asyncio

import pytest

from mqk.broker import Broker, TopicRegistry, WakeupHub, internal, topic_config
from mqk.broker.names import KAFKA, MAX_LENGTH, ROCKETMQ
from mqk.clock import FakeClock
from mqk.config import TOPIC_DEFAULTS, TOPIC_SCHEMA, BrokerConfig, StoreConfig, TopicConfig
from mqk.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    ShardExists,
    TopicAuthorizationFailedError,
    UnknownShard,
)
from mqk.protocol.native import codes
from mqk.server.kafka.rawclient import make_batch
from mqk.store.manager import StoreManager
from mqk.timer import TIMER_TOPIC


@pytest.fixture
async def store():
    s = StoreManager(StoreConfig(storage="memory"))
    await s.start()
    yield s
    await s.close()


def registry(store: StoreManager, **config) -> TopicRegistry:
    return TopicRegistry(store, BrokerConfig(**config))


# --- names ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "x" * (MAX_LENGTH + 1), "tab\t", "sl/ash", "ünï", None, 7])
def test_names_no_alphabet_allows(name) -> None:
    assert KAFKA.error(name) == ROCKETMQ.error(name) == f"illegal topic name {name!r}"


@pytest.mark.parametrize("name", ["orders", "a.b-c_d", "x" * MAX_LENGTH, "...", "_"])
def test_names_both_alphabets_allow(name: str) -> None:
    assert KAFKA.allows(name) and ROCKETMQ.allows(name)


@pytest.mark.parametrize("name", ["%RETRY%group", "%DLQ%g", "ns%orders", "a|b"])
def test_rocketmq_names_only_through_the_rocketmq_alphabet(name: str) -> None:
    assert not KAFKA.allows(name) and ROCKETMQ.allows(name)


async def test_the_registry_refuses_an_illegal_name_on_every_creation_path(store: StoreManager) -> None:
    topics = registry(store)
    with pytest.raises(InvalidTopicError):
        await topics.create("%RETRY%g", 1)  # Kafka's alphabet by default
    with pytest.raises(InvalidTopicError):
        await topics.create("a b", 1, names=ROCKETMQ)
    with pytest.raises(InvalidTopicError):
        await topics.auto_create("a/b")
    with pytest.raises(InvalidTopicError):
        await topics.ensure("..", 1)
    assert store.topics() == {}
    assert (await topics.create("%RETRY%g", 1, names=ROCKETMQ)).queue_count == 1


# --- settings -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("no.such.key", "1", "unknown topic config 'no.such.key'"),
        ("retention.ms", "-2", "retention.ms=-2 is out of range"),
        ("retention.ms", "1e3", "retention.ms='1e3' is not a number"),
        ("max.message.bytes", str(1 << 31), f"max.message.bytes={1 << 31} is out of range"),
        ("segment.bytes", "13", "segment.bytes=13 is out of range"),
        ("min.insync.replicas", "0", "min.insync.replicas=0 is out of range"),
        ("retention.bytes", str(1 << 63), f"retention.bytes={1 << 63} is out of range"),
        ("min.cleanable.dirty.ratio", "1.5", "min.cleanable.dirty.ratio=1.5 is out of range"),
        ("min.cleanable.dirty.ratio", "nan", "min.cleanable.dirty.ratio=nan is out of range"),
        ("preallocate", "yes", "preallocate must be true or false"),
        ("cleanup.policy", "delete,archive", "cleanup.policy must be a list of delete and compact"),
        ("cleanup.policy", " , ", "cleanup.policy must be a list of delete and compact"),
        (
            "compression.type",
            "brotli",
            "compression.type must be one of ['gzip', 'lz4', 'producer', 'snappy', 'uncompressed', 'zstd']",
        ),
        ("segment.ms", "0", "segment.ms=0 is out of range"),
        ("message.timestamp.type", "Now", "message.timestamp.type must be one of ['CreateTime', 'LogAppendTime']"),
        ("storage.type", "tape", "storage.type must be one of ['', 'file', 'memory', 'rocksdb']"),
    ],
)
def test_the_schema_refuses_with_a_reason(key: str, value: str, reason: str) -> None:
    assert topic_config.check(key, value) == reason
    assert topic_config.check_all({"retention.ms": "1", key: value}) == reason


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("retention.ms", "-1"),
        ("retention.bytes", "-1"),
        ("max.message.bytes", str((1 << 31) - 1)),
        ("min.cleanable.dirty.ratio", "0"),
        ("preallocate", "TRUE"),
        ("cleanup.policy", "compact, delete"),
        ("message.timestamp.type", "LogAppendTime"),
        ("storage.type", "memory"),
        ("index.keys", "true"),
        ("flush.ms", str((1 << 63) - 1)),
        ("retention.ms", None),
    ],
)
def test_the_schema_accepts(key: str, value: str | None) -> None:
    assert topic_config.check(key, value) is None


def test_every_key_has_a_legal_default_and_the_defaults_come_from_the_schema() -> None:
    assert list(TOPIC_DEFAULTS) == list(TOPIC_SCHEMA)
    for name, key in TOPIC_SCHEMA.items():
        assert key.name == name and TOPIC_DEFAULTS[name] == key.default
        assert key.check(key.default) is None, name
    assert not TOPIC_SCHEMA["preallocate"].acted_on and TOPIC_SCHEMA["retention.ms"].acted_on


def test_describe_lists_every_key_in_schema_order_with_its_source() -> None:
    config = TopicConfig({"retention.ms": "5"})
    described = topic_config.describe(config)
    assert [s.key.name for s in described] == list(TOPIC_SCHEMA)
    retention = next(s for s in described if s.key.name == "retention.ms")
    assert retention.value == "5" and retention.overridden
    assert [s.key.name for s in topic_config.describe(config, {"retention.ms", "nope"})] == ["retention.ms"]


async def test_creation_and_alteration_check_settings_before_anything_changes(store: StoreManager) -> None:
    topics = registry(store)
    with pytest.raises(InvalidConfigError, match=r"retention.ms=.x. is not a number"):
        await topics.create("t", 1, {"retention.ms": "x"})
    assert topics.get("t") is None
    info = await topics.create("t", 2, {"retention.ms": "10", "segment.ms": None})
    assert info.config.overrides == {"retention.ms": "10"}
    with pytest.raises(InvalidConfigError, match="preallocate"):
        await topics.alter_config("t", {"preallocate": "maybe"})
    assert topics.get("t").config.overrides == {"retention.ms": "10"}
    await topics.alter_config("t", {"cleanup.policy": "compact", "retention.ms": None})
    assert topics.get("t").config.overrides == {"cleanup.policy": "compact"}
    with pytest.raises(ShardExists):
        await topics.create("t", 1)


# --- internal topics ------------------------------------------------------------------------------------------


def test_the_internal_topics_and_their_kinds() -> None:
    for name in (TIMER_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC"):
        assert internal.is_internal(name) and internal.kind_of(name) is internal.TopicKind.INTERNAL
    for name in ("%RETRY%g", "%DLQ%g"):
        assert not internal.is_internal(name) and internal.kind_of(name) is internal.TopicKind.GROUP
        assert internal.created_on_demand(name)
    assert internal.kind_of("orders") is internal.TopicKind.USER and not internal.created_on_demand("orders")
    assert not internal.is_internal(internal.AUTO_CREATE_KEY)  # a route key, never a topic
    # Kafka's offsets are internal, but placed in a cluster like user topics (not local by nature); its transaction
    # state is each group's own (the transactional ids its master coordinates)
    assert internal.is_internal("__consumer_offsets") and not internal.is_local("__consumer_offsets")
    assert internal.is_internal("__transaction_state") and internal.is_local("__transaction_state")
    assert internal.is_local(TIMER_TOPIC) and not internal.is_local("%RETRY%g")


def test_no_client_may_change_an_internal_topic() -> None:
    for name in (TIMER_TOPIC, "__mqk_timer_state", "__consumer_offsets", "RMQ_SYS_TRANS_HALF_TOPIC"):
        assert internal.client_change_refusal(name) and internal.rocketmq_send_refusal(name)
    assert (
        internal.rocketmq_send_refusal("SCHEDULE_TOPIC_XXXX")
        == "Sending message to topic[SCHEDULE_TOPIC_XXXX] is forbidden."
    )
    for name in ("orders", "%RETRY%g", "%DLQ%g"):
        assert internal.client_change_refusal(name) is None and internal.rocketmq_send_refusal(name) is None
    # RocketMQ's names are not listed to Kafka clients (asked for by name, they are answered)
    assert internal.listed_to_kafka("orders") and internal.listed_to_kafka(TIMER_TOPIC)
    assert not internal.listed_to_kafka("%RETRY%g") and not internal.listed_to_kafka("ns%orders")


async def test_the_registry_refuses_client_changes_to_internal_topics(memory_store: StoreManager) -> None:
    topics = TopicRegistry(memory_store, BrokerConfig())
    await memory_store.create_topic(TIMER_TOPIC, 1)
    with pytest.raises(TopicAuthorizationFailedError):
        await topics.delete(TIMER_TOPIC)
    with pytest.raises(TopicAuthorizationFailedError):
        await topics.add_partitions(TIMER_TOPIC, 2)
    with pytest.raises(TopicAuthorizationFailedError):
        await topics.alter_config(TIMER_TOPIC, {"retention.ms": "1"})
    with pytest.raises(InvalidTopicError, match="reserved"):
        await topics.create("__consumer_offsets", 1)
    with pytest.raises(InvalidTopicError, match="reserved"):
        await topics.auto_create("__transaction_state")
    assert memory_store.topic(TIMER_TOPIC).queue_count == 1
    assert await topics.ensure("RMQ_SYS_TRANS_HALF_TOPIC", 1)  # the broker's own services still make them


def test_the_broker_spells_rocketmq_names_as_the_protocol_does() -> None:
    assert internal.RETRY_PREFIX == codes.RETRY_GROUP_TOPIC_PREFIX
    assert internal.DLQ_PREFIX == codes.DLQ_GROUP_TOPIC_PREFIX
    assert internal.AUTO_CREATE_KEY == codes.AUTO_CREATE_TOPIC_KEY
    assert internal.retry_topic("g") == "%RETRY%g" and internal.dlq_topic("g") == "%DLQ%g"


# --- auto-creation and ids -----------------------------------------------------------------------------------


async def test_auto_creation_follows_the_policy(store: StoreManager) -> None:
    off = registry(store, auto_create_topics=False, num_partitions=4)
    with pytest.raises(UnknownShard):
        await off.auto_create("new")
    # a group's topics are created on demand, with one queue, whatever the setting
    assert (await off.auto_create("%RETRY%g", names=ROCKETMQ)).queue_count == 1
    on = registry(store, num_partitions=4)
    with pytest.raises(UnknownShard):
        await on.auto_create("asked-not-to", client_allows=False)
    assert (await on.auto_create("plain")).queue_count == 4
    assert (await on.auto_create("fewer", names=ROCKETMQ, requested=2)).queue_count == 2
    assert (await on.auto_create("capped", names=ROCKETMQ, requested=9)).queue_count == 4
    assert on.auto_create_partitions("%DLQ%g", requested=9) == 1
    with pytest.raises(InvalidPartitionsError):
        await on.create("zero", 0)


async def test_concurrent_ensures_create_a_topic_once(store: StoreManager) -> None:
    topics = registry(store)
    calls = []
    create = store.create_topic

    async def counted(*args, **kwargs):
        calls.append(args)
        await asyncio.sleep(0)  # a yield: the other ensure runs here, where a race would show
        return await create(*args, **kwargs)

    store.create_topic = counted  # type: ignore[method-assign]  # counting the store's creations
    infos = await asyncio.gather(*(topics.ensure("once", 3) for _ in range(5)))
    assert len(calls) == 1 and {info.queue_count for info in infos} == {3}


async def test_topic_ids_follow_deletion_and_recreation(store: StoreManager) -> None:
    topics = registry(store)
    first = await topics.create("t", 1)
    assert topics.by_id(first.topic_id) == first
    await topics.delete("t")
    assert topics.by_id(first.topic_id) is None
    second = await topics.create("t", 1)
    assert topics.by_id(second.topic_id) == second and topics.by_id(first.topic_id) is None
    assert topics.by_id(b"\x00" * 16) is None
    with pytest.raises(UnknownShard):
        await topics.delete("gone")


# --- the hub and the broker ---------------------------------------------------------------------------------------


async def test_a_long_poll_times_out_on_the_injected_clock_only() -> None:
    clock = FakeClock()
    hub = WakeupHub(clock)
    waiting = asyncio.ensure_future(hub.wait([("t", 0)], 30.0))
    await clock.advance(29.9)
    assert not waiting.done()
    await clock.advance(0.1)
    assert waiting.done() and waiting.result() is False
    assert await hub.wait([("t", 0)], 0) is False  # no wait at all


async def test_one_hub_hears_the_store_once_however_many_front_doors_open_it(store: StoreManager) -> None:
    broker = Broker(BrokerConfig(), store)
    broker.open()
    broker.open()  # the second front door
    assert sum(1 for listener in store._listeners if listener == broker.hub.notify) == 1
    await store.create_topic("t", 2)
    poll = asyncio.ensure_future(broker.hub.wait([("t", 1)], 5))
    other = asyncio.ensure_future(broker.hub.wait([("t", 0)], 5))
    await asyncio.sleep(0)  # a yield: both waiters register before the append
    await store.append("t", 1, [make_batch([b"x"])])
    assert await asyncio.wait_for(poll, 1) is True
    assert not other.done()
    broker.release_waiters()  # a front door stopping: every long poll returns now
    assert await asyncio.wait_for(other, 1) is True
