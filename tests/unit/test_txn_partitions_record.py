"""The etcd record through which a transaction's coordinator tells another broker group its partitions and its
decision (mqk.broker.cluster.model.TxnPartitionsRecord): what it reads back, and what it refuses."""

from __future__ import annotations

import json

import pytest

from mqk.broker.cluster.model import TXN_ABORT, Keys, Malformed, TxnPartitionsRecord, dump


def test_a_record_reads_back_what_was_written() -> None:
    record = TxnPartitionsRecord("app-1", 7, 3, TXN_ABORT, [["orders", 2], ["__consumer_offsets", 11]], 4)
    again = TxnPartitionsRecord.decode(dump(record))
    assert again == record
    assert again.holds("orders", 2) and again.holds("__consumer_offsets", 11) and not again.holds("orders", 1)


@pytest.mark.parametrize(
    "change",
    [
        {"state": "maybe"},
        {"producer_epoch": "3"},
        {"partitions": [["orders"]]},
        {"partitions": [["orders", True]]},
        {"partitions": [[2, "orders"]]},
        {"coordinator": None},
    ],
)
def test_a_damaged_record_is_refused(change: dict[str, object]) -> None:
    doc = json.loads(dump(TxnPartitionsRecord("app-1", 7, 3, "ongoing", [["orders", 2]], 4)))
    doc.update(change)
    with pytest.raises(Malformed):
        TxnPartitionsRecord.decode(json.dumps(doc).encode())
    with pytest.raises(Malformed):
        TxnPartitionsRecord.decode(b"[1, 2]")


def test_each_group_and_producer_id_has_its_own_key() -> None:
    keys = Keys("c1")
    assert keys.txn_partitions_of("group-0", 7) == "/mqk/c1/txn-partitions/group-0/7"
    # a group name with a slash stays one path segment
    assert keys.txn_partitions_of("a/b", 7) == "/mqk/c1/txn-partitions/a%2Fb/7"
    assert keys.txn_partitions in keys.tables
