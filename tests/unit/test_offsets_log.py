"""LogOffsetStore (mqk.store.offsets_log): committed offsets as `__consumer_offsets` records, rebuilt from the log
by a broker that becomes master, malformed records skipped with a log line, the replication wait before a commit
is answered, and where a group's commits go."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import pytest
from helpers import store_config

from mqk._fast import load
from mqk.clock import settle
from mqk.config import StoreConfig, TopicConfig
from mqk.errors import NotCoordinatorError
from mqk.groups.coordinator import GroupCoordinator
from mqk.protocol.kafka import offset_records as R
from mqk.store.adapter import AppendResult, GroupOffset
from mqk.store.manager import StoreManager
from mqk.store.offsets_log import LogOffsetStore

recbatch = load("recbatch")
TOPIC = R.OFFSETS_TOPIC
PARTITIONS = 4


class Placement:
    """Offsets partitions 0..PARTITIONS-1, `here` of them placed in this broker's group; a group's partition is
    given by the test (else 0)."""

    def __init__(self, here: list[int] | None = None) -> None:
        self.here = list(range(PARTITIONS)) if here is None else here
        self.of: dict[str, int] = {}
        self.ensured = 0

    def partition_of(self, group: str) -> int:
        return self.of.get(group, 0)

    def partitions_here(self) -> list[int]:
        return list(self.here)

    async def ensure_topic(self) -> None:
        self.ensured += 1


async def offsets_topic(store: StoreManager) -> None:
    await store.create_topic(TOPIC, PARTITIONS, TopicConfig({"cleanup.policy": "compact"}))


async def new_master(store: StoreManager, placement: Placement) -> LogOffsetStore:
    """What a broker that becomes master builds: a store whose map comes from the log alone."""
    offsets = LogOffsetStore(store, placement)
    await offsets.activate()
    return offsets


async def log_records(store: StoreManager, partition: int) -> list[R.OffsetRecord]:
    read = await store.read(TOPIC, partition, 0, 1 << 20)
    out = []
    for batch in read.batches:
        out.extend(r for r in R.offset_records(batch.data) if not isinstance(r, Exception))
    return out


async def test_commit_is_a_kafka_record_in_the_groups_partition_and_a_new_master_reads_it_back(
    memory_store: StoreManager,
) -> None:
    await offsets_topic(memory_store)
    placement = Placement()
    placement.of = {"g1": 2, "g2": 1}
    offsets = await new_master(memory_store, placement)
    await offsets.commit_offsets("g1", {("t", 0): GroupOffset(5, "meta", 1000, 3), ("t", 1): GroupOffset(9, "", 1000)})
    await offsets.commit_offsets("g2", {("u", 0): GroupOffset(1, "", 2000)})
    await offsets.commit_offsets("g1", {("t", 0): GroupOffset(6, "", 3000, 4)})

    assert await log_records(memory_store, 2) == [
        R.OffsetRecord(0, R.OffsetKey("g1", "t", 0), R.OffsetValue(5, 3, "meta", 1000)),
        R.OffsetRecord(1, R.OffsetKey("g1", "t", 1), R.OffsetValue(9, -1, "", 1000)),
        R.OffsetRecord(2, R.OffsetKey("g1", "t", 0), R.OffsetValue(6, 4, "", 3000)),
    ]
    assert [r.key.group for r in await log_records(memory_store, 1)] == ["g2"]
    expected = {("t", 0): GroupOffset(6, "", 3000, 4), ("t", 1): GroupOffset(9, "", 1000)}
    assert offsets.fetch_offsets("g1") == expected

    again = await new_master(memory_store, placement)
    assert again.fetch_offsets("g1") == expected
    assert again.fetch_offsets("g2") == {("u", 0): GroupOffset(1, "", 2000)}
    assert again.list_offset_groups() == ["g1", "g2"]


async def test_deletes_are_tombstones(memory_store: StoreManager) -> None:
    await offsets_topic(memory_store)
    placement = Placement()
    offsets = await new_master(memory_store, placement)
    await offsets.commit_offsets("g", {("t", 0): GroupOffset(1, "", 10), ("t", 1): GroupOffset(2, "", 10)})
    await offsets.commit_offsets("h", {("t", 0): GroupOffset(3, "", 10)})
    await offsets.delete_offsets("g", [("t", 0), ("t", 9)])
    assert offsets.fetch_offsets("g") == {("t", 1): GroupOffset(2, "", 10)}
    await offsets.delete_offsets("h")
    assert offsets.list_offset_groups() == ["g"]
    tail = (await log_records(memory_store, 0))[-2:]
    assert [(r.key, r.value) for r in tail] == [(R.OffsetKey("g", "t", 0), None), (R.OffsetKey("h", "t", 0), None)]

    again = await new_master(memory_store, placement)
    assert again.fetch_offsets("g") == {("t", 1): GroupOffset(2, "", 10)}
    assert again.fetch_offsets("h") == {}
    assert again.list_offset_groups() == ["g"]


async def test_loader_skips_malformed_records_and_says_so(
    memory_store: StoreManager, caplog: pytest.LogCaptureFixture
) -> None:
    await offsets_topic(memory_store)
    good = R.offsets_batch([(R.OffsetKey("g", "t", 0), R.OffsetValue(7, -1, "", 5))], 5)
    records = (
        recbatch.encode_record(0, 0, R.encode_key("g", "t", 1), b"\x00\x03 not a value", [])
        + recbatch.encode_record(1, 0, b"\x00", b"key cut short", [])
        + recbatch.encode_record(2, 0, R.encode_key("g", "t", 2), R.encode_value(8, -1, "", 5), [])
    )
    mixed = recbatch.build_batch(0, 5, 5, records, 3, 2)
    for batch in (good, mixed):
        await memory_store.append(TOPIC, 0, [batch])
    with caplog.at_level(logging.WARNING, logger="mqk.offsets"):
        offsets = await new_master(memory_store, Placement())
    assert offsets.fetch_offsets("g") == {("t", 0): GroupOffset(7, "", 5), ("t", 2): GroupOffset(8, "", 5)}
    assert offsets.skipped == 2
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 2 and "offset 1" in skipped[0] and "offset 2" in skipped[1]


async def test_a_replica_refuses_commits_and_forgets_what_it_loaded(memory_store: StoreManager) -> None:
    await offsets_topic(memory_store)
    offsets = LogOffsetStore(memory_store, Placement())
    with pytest.raises(NotCoordinatorError):
        await offsets.commit_offsets("g", {("t", 0): GroupOffset(1)})
    await offsets.activate()
    await offsets.commit_offsets("g", {("t", 0): GroupOffset(1)})
    offsets.deactivate()
    assert offsets.fetch_offsets("g") == {} and offsets.list_offset_groups() == []
    assert offsets.loading("g")
    with pytest.raises(NotCoordinatorError):
        await offsets.commit_offsets("g", {("t", 0): GroupOffset(2)})
    with pytest.raises(NotCoordinatorError):
        await offsets.delete_offsets("g")
    assert memory_store.end_offset(TOPIC, 0) == 1  # nothing appended while inactive
    await offsets.activate()
    assert offsets.fetch_offsets("g") == {("t", 0): GroupOffset(1)}


async def test_a_commit_is_applied_and_answered_only_after_the_replication_wait(memory_store: StoreManager) -> None:
    await offsets_topic(memory_store)
    offsets = await new_master(memory_store, Placement())
    waits: list[tuple[str, int, int, asyncio.Event]] = []
    both_waiting = asyncio.Event()

    async def wait_replicated(topic: str, partition: int, result: AppendResult) -> None:
        event = asyncio.Event()
        waits.append((topic, partition, result.base_offset, event))
        if len(waits) == 2:
            both_waiting.set()
        await event.wait()

    offsets.wait_replicated = wait_replicated
    first = asyncio.create_task(offsets.commit_offsets("g", {("t", 0): GroupOffset(1)}))
    second = asyncio.create_task(offsets.commit_offsets("g", {("t", 0): GroupOffset(2)}))
    await asyncio.wait_for(both_waiting.wait(), 10)
    assert [(t, p, o) for t, p, o, _e in waits] == [(TOPIC, 0, 0), (TOPIC, 0, 1)]
    assert offsets.fetch_offsets("g") == {} and not first.done() and not second.done()
    waits[1][3].set()  # the later commit's wait ends first
    await second
    assert offsets.fetch_offsets("g") == {("t", 0): GroupOffset(2)}
    waits[0][3].set()
    await first
    assert offsets.fetch_offsets("g") == {("t", 0): GroupOffset(2)}  # the older record does not undo it

    async def failing(topic: str, partition: int, result: AppendResult) -> None:
        raise TimeoutError("not enough replicas")

    offsets.wait_replicated = failing
    with pytest.raises(TimeoutError):
        await offsets.commit_offsets("g", {("t", 0): GroupOffset(3)})
    assert offsets.fetch_offsets("g") == {("t", 0): GroupOffset(2)}


async def test_groups_coordinated_elsewhere_commit_to_a_partition_placed_here(memory_store: StoreManager) -> None:
    """A RocketMQ consumer commits to the broker holding its queue: the group's Kafka partition may be elsewhere."""
    await offsets_topic(memory_store)
    placement = Placement(here=[1, 3])
    placement.of = {"home": 3, "away": 2}
    offsets = await new_master(memory_store, placement)
    await offsets.commit_offsets("home", {("t", 0): GroupOffset(1)})
    await offsets.commit_offsets("away", {("t", 0): GroupOffset(2)})
    assert [r.key.group for r in await log_records(memory_store, 3)] == ["home"]
    assert [r.key.group for r in await log_records(memory_store, 1)] == ["away"]  # 2 % 2 -> here[0]
    again = await new_master(memory_store, placement)
    assert again.fetch_offsets("away") == {("t", 0): GroupOffset(2)}


async def test_without_an_offsets_partition_here_commits_stay_in_the_side_store(
    memory_store: StoreManager, caplog: pytest.LogCaptureFixture
) -> None:
    placement = Placement(here=[])
    offsets = await new_master(memory_store, placement)
    with caplog.at_level(logging.WARNING, logger="mqk.offsets"):
        await offsets.commit_offsets("g", {("t", 0): GroupOffset(4)})
        await offsets.commit_offsets("g", {("t", 0): GroupOffset(5)})
    assert placement.ensured == 2  # asked for the offsets topic each time
    assert sum("do not survive a failover" in r.getMessage() for r in caplog.records) == 1
    assert offsets.fetch_offsets("g") == {("t", 0): GroupOffset(5)}
    assert memory_store.default_engine.fetch_offsets("g") == {("t", 0): GroupOffset(5)}
    assert offsets.list_offset_groups() == ["g"]
    await offsets.delete_offsets("g")
    assert offsets.fetch_offsets("g") == {}


async def test_loading_answers_for_partitions_not_loaded(memory_store: StoreManager) -> None:
    placement = Placement()
    offsets = await new_master(memory_store, placement)  # no offsets topic yet: nothing to load
    await offsets_topic(memory_store)  # created later, placed here, empty
    assert not offsets.loading("g")
    await offsets.commit_offsets("g", {("t", 0): GroupOffset(1)})
    # a partition with records that was not loaded (its load failed): loading, then loaded in the background
    other = LogOffsetStore(memory_store, placement)
    other._active = True
    assert other.loading("g")
    await settle()  # (the load runs on a task of its own)
    assert not other.loading("g")
    assert other.fetch_offsets("g") == {("t", 0): GroupOffset(1)}


class MakingPlacement(Placement):
    """A placement whose ensure_topic makes the offsets topic in the store, as the cluster's reconciler does."""

    def __init__(self, store: StoreManager) -> None:
        super().__init__()
        self.store = store

    async def ensure_topic(self) -> None:
        await super().ensure_topic()
        if self.store.topic(TOPIC) is None:
            await offsets_topic(self.store)


async def test_a_partition_placed_here_but_not_made_yet_is_loading_and_a_commit_has_it_made(
    memory_store: StoreManager,
) -> None:
    """The view already places the new offsets topic here; the reconciler has not made it in the store yet (a
    commit that reached the coordinator in that gap once failed with an unknown shard)."""
    placement = MakingPlacement(memory_store)
    offsets = await new_master(memory_store, placement)
    assert offsets.loading("g")  # retriable for the client, not an empty answer
    assert memory_store.topic(TOPIC) is None
    await offsets.commit_offsets("g", {("t", 0): GroupOffset(3)})
    assert placement.ensured == 1
    assert [r.key.group for r in await log_records(memory_store, 0)] == ["g"]
    assert not offsets.loading("g")
    assert offsets.fetch_offsets("g") == {("t", 0): GroupOffset(3)}


async def test_coordinator_through_the_store_manager_on_the_file_engine(tmp_path: Path) -> None:
    """The group coordinator's commits land in the log; a restarted store, its side files gone, has them back."""
    config: StoreConfig = store_config("file", tmp_path / "data")
    store = StoreManager(config)
    await store.start()
    await offsets_topic(store)
    offsets = await new_master(store, Placement())
    store.use_offsets(offsets)
    coordinator = GroupCoordinator(store)
    codes = await coordinator.commit_offsets("g", -1, "", {("t", 0): (12, 2, "m"), ("t", 1): (13, -1, None)})
    assert codes == {("t", 0): 0, ("t", 1): 0}
    assert store.default_engine.fetch_offsets("g") == {}  # nothing in the side store
    await store.close()

    shutil.rmtree(tmp_path / "data" / "offsets", ignore_errors=True)
    shutil.rmtree(tmp_path / "data" / "state", ignore_errors=True)
    store = StoreManager(config)
    await store.start()
    try:
        store.use_offsets(await new_master(store, Placement()))
        fetched = GroupCoordinator(store).fetch_offsets("g")
        assert {tp: (v.offset, v.leader_epoch, v.metadata) for tp, v in fetched.items() if v is not None} == {
            ("t", 0): (12, 2, "m"),
            ("t", 1): (13, -1, ""),
        }
        assert store.list_offset_groups() == ["g"]
    finally:
        await store.close()
