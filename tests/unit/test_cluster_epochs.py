"""Master epochs (mqk.broker.cluster.epochs) and the leader epoch a master stamps into what it appends: where a
replica cuts its log, what OffsetForLeaderEpoch answers, and the batches' partitionLeaderEpoch field."""

from __future__ import annotations

import struct

import pytest

from mqk.broker.cluster.epochs import UNDEFINED, EpochHistory, truncation_point
from mqk.broker.replication.link import _last_epoch
from mqk.protocol.kafka.records import stamp_leader_epoch, validate_produce_records
from mqk.server.kafka.rawclient import make_batch

# --- where a replica cuts its log ------------------------------------------------------------------------------


def test_a_replica_holding_the_masters_previous_epoch_keeps_all_of_it() -> None:
    # a replica that followed the master of epoch 8 to 3,777,521, and the replica that was elected in epoch 9 at
    # that very offset: nothing to cut
    replica = [[7, 2_801_981], [8, 3_201_350]]
    master = [[7, 2_801_981], [8, 3_201_350], [9, 3_777_521]]
    assert truncation_point(master, 3_900_000, replica, 3_777_521) == 3_777_521


def test_a_master_history_missing_the_epoch_the_replica_followed_would_cut_it_back() -> None:
    # why a master refuses links until its epoch is recorded and a replica refuses such a history: adopted, a
    # history without epoch 8 makes the next master's replicas cut back to where 8 began
    replica = [[7, 2_801_981], [8, 3_201_350]]
    master_without_8 = [[7, 2_801_981], [9, 3_777_521]]
    assert truncation_point(master_without_8, 3_900_000, replica, 3_777_521) == 3_201_350
    assert _last_epoch({"version": 2, "epochs": [[7, {}, 2_801_981]]}) == 7
    assert _last_epoch({"version": 2, "epochs": []}) is None


def test_a_replica_with_writes_its_master_never_replicated_cuts_them() -> None:
    # an old master (epoch 8) wrote past 3,300,000 after the new one (epoch 9) began at 3,300,000
    replica = [[7, 2_801_981], [8, 3_201_350]]
    master = [[7, 2_801_981], [8, 3_201_350], [9, 3_300_000]]
    assert truncation_point(master, 3_400_000, replica, 3_350_000) == 3_300_000


def test_an_empty_replica_or_one_without_history() -> None:
    assert truncation_point([[1, 0]], 500, [], 0) == 0
    assert truncation_point([[3, 100]], 500, [], 400) == 100


# --- OffsetForLeaderEpoch ----------------------------------------------------------------------------------------


@pytest.fixture
def history() -> EpochHistory:
    h = EpochHistory(None)
    h.begin(1, 0, {})
    h.begin(2, 1000, {"t": [40, 70]})
    h.begin(4, 2000, {"t": [90, 120]})
    return h


def test_the_current_epoch_ends_at_the_log_end(history: EpochHistory) -> None:
    assert history.end_offset_for("t", 0, 4, 150) == (4, 150)


def test_a_past_epoch_ends_where_the_next_began(history: EpochHistory) -> None:
    assert history.end_offset_for("t", 0, 1, 150) == (1, 40)
    assert history.end_offset_for("t", 1, 2, 150) == (2, 120)
    assert history.end_offset_for("t", 0, 3, 150) == (2, 90)  # an epoch this group never had: the one before it


def test_an_epoch_newer_than_the_current_is_undefined(history: EpochHistory) -> None:
    assert history.end_offset_for("t", 0, 5, 150) == UNDEFINED


def test_an_epoch_no_master_stamped_is_not_a_truncation(history: EpochHistory) -> None:
    # producers write 0; a consumer that read such batches must not be told its log was cut (it would reset its
    # position by auto.offset.reset after every failover)
    assert history.end_offset_for("t", 0, 0, 150) == (0, 150)


# --- the stamp -----------------------------------------------------------------------------------------------------

_EPOCH = struct.Struct(">i")


def _epochs(buf: bytes | bytearray | memoryview) -> list[int]:
    view = memoryview(buf)
    found, pos = [], 0
    while pos < len(view):
        found.append(_EPOCH.unpack_from(view, pos + 12)[0])
        pos += 12 + _EPOCH.unpack_from(view, pos + 8)[0]
    return found


def test_every_batch_of_a_writable_buffer_is_stamped_in_place_and_still_checks() -> None:
    two = make_batch([b"a", b"b"]) + make_batch([b"c"])
    assert _epochs(two) == [-1, -1]  # (what a producer that knows no epoch writes)
    view = memoryview(two)
    assert stamp_leader_epoch(view, 7) is view
    assert _epochs(two) == [7, 7]
    assert [b.record_count for b in validate_produce_records(two, 1 << 20)] == [2, 1]  # CRCs still hold


def test_a_read_only_buffer_is_stamped_in_a_copy() -> None:
    original = bytes(make_batch([b"x"]))
    stamped = stamp_leader_epoch(original, 3)
    assert stamped is not original
    assert _epochs(original) == [-1]
    assert _epochs(stamped) == [3]
    assert bytes(stamped)[16:] == original[16:]
