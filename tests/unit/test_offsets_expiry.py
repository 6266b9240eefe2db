"""Committed offsets expire as Kafka's offsets.retention.minutes has them (mqk.groups.coordinator): an empty group's
after it has been empty for the retention, a standalone consumer's by commit time, an active group's never (but
its unsubscribed topics' by age, KIP-496); in cluster mode as tombstones in `__consumer_offsets` that a new master
rebuilding from the log agrees with. Time is a FakeClock."""

from __future__ import annotations

import asyncio

import pytest
from helpers import OffsetsOnly, subscription

from mqk.clock import FakeClock, settle
from mqk.config import BrokerConfig, TopicConfig
from mqk.groups.coordinator import EMPTY, GroupCoordinator
from mqk.protocol.kafka import offset_records as R
from mqk.store.manager import StoreManager
from mqk.store.offsets_log import LogOffsetStore

RETENTION_MS = 60_000
PROTOS = [("range", subscription("t"))]


@pytest.fixture
def coord(mqk_fake_clock: FakeClock):
    c = GroupCoordinator(
        OffsetsOnly(),
        min_session_timeout_ms=10,
        max_session_timeout_ms=60000,
        offsets_retention_ms=RETENTION_MS,
        offsets_retention_check_interval_ms=1000,
        clock=mqk_fake_clock,
    )
    yield c
    c.close()


async def stable_member(coord: GroupCoordinator, group: str = "g") -> str:
    first = await coord.join(group, "", "consumer", PROTOS, session_timeout_ms=5000, require_known_member_id=True)
    joined = await coord.join(group, first.member_id, "consumer", PROTOS, session_timeout_ms=5000)
    await coord.sync(group, joined.generation_id, joined.member_id, {})
    return joined.member_id


async def keep_alive(coord: GroupCoordinator, clock: FakeClock, member: str, seconds: float) -> None:
    """Let `seconds` pass with the member heart-beating (its session is 5 s)."""
    for _ in range(int(seconds // 4)):
        await clock.advance(4)
        assert coord.heartbeat("g", 1, member) == 0


async def test_an_empty_groups_offsets_expire_retention_after_it_became_empty_then_the_group_is_gone(coord):
    clock = coord.clock
    member = await stable_member(coord)
    assert await coord.commit_offsets("g", 1, member, {("t", 0): (5, -1, ""), ("t", 1): (1, -1, "")})
    await keep_alive(coord, clock, member, RETENTION_MS * 2 / 1000)  # active all along: old commits stay
    assert await coord.expire_offsets() == 0 and set(coord.fetch_offsets("g")) == {("t", 0), ("t", 1)}
    coord.leave("g", [(member, None)])
    assert coord.groups["g"].state == EMPTY
    await clock.advance((RETENTION_MS - 1) / 1000)  # measured from when it became empty, not from the commits
    assert await coord.expire_offsets() == 0
    await clock.advance(0.001)
    assert await coord.expire_offsets() == 2
    assert coord.fetch_offsets("g") == {} and "g" not in coord.groups and coord.list_groups() == []


async def test_a_stable_group_loses_only_the_offsets_of_topics_it_no_longer_subscribes_to(coord):
    clock = coord.clock
    member = await stable_member(coord)
    await coord.commit_offsets("g", 1, member, {("t", 0): (5, -1, ""), ("old", 0): (3, -1, "")})
    await keep_alive(coord, clock, member, RETENTION_MS / 1000)
    assert await coord.expire_offsets() == 1
    assert set(coord.fetch_offsets("g")) == {("t", 0)}


async def test_standalone_commits_expire_by_their_commit_time(coord):
    clock = coord.clock
    await coord.commit_offsets("simple", -1, "", {("t", 0): (1, -1, "")})
    await clock.advance(RETENTION_MS / 2 / 1000)
    await coord.commit_offsets("simple", -1, "", {("t", 1): (2, -1, "")})
    await clock.advance(RETENTION_MS / 2 / 1000)
    assert await coord.expire_offsets() == 1
    assert set(coord.fetch_offsets("simple")) == {("t", 1)}
    await clock.advance(RETENTION_MS / 2 / 1000)
    assert await coord.expire_offsets() == 1
    assert coord.list_groups() == []


async def test_a_group_seen_only_through_its_offsets_is_measured_from_the_coordinators_start(mqk_fake_clock):
    store = OffsetsOnly()
    first = GroupCoordinator(store, offsets_retention_ms=RETENTION_MS, clock=mqk_fake_clock)
    await first.commit_offsets("g", -1, "", {("t", 0): (1, -1, "")})
    await mqk_fake_clock.advance(RETENTION_MS * 3 / 1000)
    # a restarted broker: the commit is old, but it cannot tell how long the group has been empty
    fresh = GroupCoordinator(store, offsets_retention_ms=RETENTION_MS, clock=mqk_fake_clock)
    assert await fresh.expire_offsets() == 0
    await mqk_fake_clock.advance(RETENTION_MS / 1000)
    assert await fresh.expire_offsets() == 1 and store.data.get("g", {}) == {}


async def test_groups_active_over_rocketmq_and_groups_committing_keep_their_offsets(coord):
    clock = coord.clock
    await coord.commit_offsets("rmq", -1, "", {("t", 0): (1, -1, "")})
    await coord.commit_offsets("busy", -1, "", {("t", 0): (1, -1, "")})
    await clock.advance(RETENTION_MS / 1000)
    coord.active_elsewhere = lambda group: group == "rmq"
    gate = asyncio.Event()
    store = coord.store
    real_commit = store.commit_offsets

    async def slow_commit(group, offsets):
        await gate.wait()
        await real_commit(group, offsets)

    store.commit_offsets = slow_commit
    committing = asyncio.create_task(coord.commit_offsets("busy", -1, "", {("t", 0): (9, -1, "")}))
    await settle()  # the commit runs up to its gate
    assert await coord.expire_offsets() == 0  # "busy" has a commit on its way: the next pass decides
    gate.set()
    await committing
    assert coord.fetch_offsets("busy")[("t", 0)].offset == 9 and set(coord.fetch_offsets("rmq")) == {("t", 0)}


async def test_the_periodic_pass_runs_on_the_check_interval(coord):
    clock = coord.clock
    await coord.commit_offsets("simple", -1, "", {("t", 0): (1, -1, "")})
    coord.start()
    await clock.advance(RETENTION_MS / 1000 - 0.5)  # passes every second so far found it young enough
    assert coord.fetch_offsets("simple") != {}
    await clock.advance(0.5)  # the pass at RETENTION_MS
    assert coord.fetch_offsets("simple") == {}


def test_the_broker_config_carries_kafkas_defaults(tmp_path):
    config = BrokerConfig()
    assert config.offsets_retention_minutes == 7 * 24 * 60 and config.offsets_retention_check_interval_ms == 600_000
    coordinator = GroupCoordinator.from_config(BrokerConfig(offsets_retention_minutes=3), OffsetsOnly())
    assert coordinator.offsets_retention_ms == 180_000
    with pytest.raises(ValueError, match="offsets_retention_minutes"):
        BrokerConfig(offsets_retention_minutes=0)
    toml = tmp_path / "broker.toml"
    toml.write_text("offsets_retention_minutes = 1440\noffsets_retention_check_interval_ms = 30000\n")
    loaded = BrokerConfig.load(toml)
    assert (loaded.offsets_retention_minutes, loaded.offsets_retention_check_interval_ms) == (1440, 30000)


class Placement:
    def partition_of(self, group: str) -> int:
        return 0

    def partitions_here(self) -> list[int]:
        return [0]

    async def ensure_topic(self) -> None:
        pass


async def test_in_the_log_expiry_is_tombstones_a_new_master_agrees_with(memory_store: StoreManager, mqk_fake_clock):
    await memory_store.create_topic(R.OFFSETS_TOPIC, 1, TopicConfig({"cleanup.policy": "compact"}))
    offsets = LogOffsetStore(memory_store, Placement())
    await offsets.activate()
    coord = GroupCoordinator(offsets, offsets_retention_ms=RETENTION_MS, clock=mqk_fake_clock)
    await coord.commit_offsets("gone", -1, "", {("t", 0): (4, -1, ""), ("t", 1): (5, -1, "")})
    await mqk_fake_clock.advance(RETENTION_MS / 2 / 1000)
    await coord.commit_offsets("kept", -1, "", {("t", 0): (6, -1, "")})
    await mqk_fake_clock.advance(RETENTION_MS / 2 / 1000)
    assert await coord.expire_offsets() == 2

    read = await memory_store.read(R.OFFSETS_TOPIC, 0, 0, 1 << 20)
    records = [r for batch in read.batches for r in R.offset_records(batch.data)]
    tombstones = [(r.key.group, r.key.partition) for r in records if not isinstance(r, Exception) and r.value is None]
    assert sorted(tombstones) == [("gone", 0), ("gone", 1)]
    again = LogOffsetStore(memory_store, Placement())  # a new master, from the log alone
    await again.activate()
    assert again.list_offset_groups() == ["kept"] and again.fetch_offsets("gone") == {}
