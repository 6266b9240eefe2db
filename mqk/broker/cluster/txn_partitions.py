"""Kafka transactions across broker groups (cluster mode): what a transaction's coordinator tells the master of
another group whose partitions the transaction writes, through etcd.

A transactional id is coordinated by the master of the group holding its `__consumer_offsets` partition (the
hash of the id, as a group id's: `ClusterMember.coordinator`), which keeps the transaction's state in its own
log (mqk.server.kafka.transactions). A transaction may write to partitions of any group; for each other group G
it writes to, there is one key, `txn-partitions/<G>/<producer id>` (model.TxnPartitionsRecord):

- the coordinator writes it with state `ongoing` and every partition of G the transaction has added, before it
  answers the AddPartitionsToTxn or AddOffsetsToTxn that added them (an offsets partition stands for the
  transaction's offsets of a group coordinated in G). G's master accepts a transactional batch, or a
  TxnOffsetCommit, only if the key names its producer epoch and partition, as a coordinator of its own would
  (Kafka's partition leaders ask the coordinator the same since KIP-890);
- at EndTxn, once its Prepare record is in its log, the coordinator sets the state to `commit` or `abort`. G's
  master writes a marker to each named partition (and applies or drops the offsets), then deletes the key. The
  coordinator waits for the deletion before it writes its Complete record.

Every write is fenced: the coordinator's on its own mastership (the master key still holds its record), the
deletion also on the value acted on. The request lives in etcd, not in either log, so it survives a failover on
either side: a new coordinator finds the transaction prepared in its log and writes the key again; a new master
of G finds the key and acts on it. Acting twice writes a second marker, which readers pass over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from mqk.broker.cluster import ClusterMember
from mqk.broker.cluster.controller import OFFSETS_TOPIC
from mqk.broker.cluster.model import TXN_ONGOING, Malformed, TxnPartitionsRecord, dump
from mqk.errors import MetaUnavailable
from mqk.meta import Compare, Delete, Put

log = logging.getLogger("mqk.cluster.txn")

#: decoded records kept by their stored bytes (cleared past this many)
_CACHE_LIMIT = 10_000


class TxnPartitions:
    """One broker's side of the keys: as a coordinator (publish, wait) and as a group's master (read, done)."""

    def __init__(self, member: ClusterMember) -> None:
        self.member = member
        self.keys = member.keys
        self._decoded: dict[bytes, TxnPartitionsRecord | None] = {}
        #: `decided`'s last answer and the table generation it was found at
        self._decided: list[tuple[bytes, TxnPartitionsRecord]] = []
        self._decided_at: tuple[object, int] | None = None

    @property
    def group(self) -> str:
        return self.member.group

    # --- placement ---------------------------------------------------------------------------------------------

    def group_of(self, topic: str, partition: int) -> str | None:
        """The group `topic`'s `partition` is placed in, or None when the cluster has no such partition."""
        record = self.member.topic(topic)
        if record is None or not 0 <= partition < len(record.partitions):
            return None
        return record.partitions[partition][0]

    def offsets_partition(self, group_id: str) -> tuple[str, int]:
        """The `__consumer_offsets` partition whose leader coordinates consumer group `group_id`."""
        return OFFSETS_TOPIC, self.member.coordinator_partition(group_id)

    # --- the coordinator's side ----------------------------------------------------------------------------------

    def remote_record(
        self, transactional_id: str, producer_id: int, epoch: int, state: str, partitions: list[list[Any]]
    ) -> TxnPartitionsRecord:
        return TxnPartitionsRecord(transactional_id, producer_id, epoch, state, partitions, self.member.node_id)

    async def publish(self, records: dict[str, TxnPartitionsRecord]) -> None:
        """Write each group's record (group -> record) in one transaction, fenced on this broker's mastership.
        MetaUnavailable when etcd cannot be reached or this broker is no longer master."""
        changes = [Put(self.keys.txn_partitions_of(g, r.producer_id), dump(r)) for g, r in records.items()]
        if not await self.member.node.meta.txn([self.member.master_fence()], changes):
            raise MetaUnavailable(f"not the master of group {self.group} any more")

    async def wait_gone(
        self,
        producer_id: int,
        groups: list[str],
        timeout: float,  # noqa: ASYNC109 - a bound that answers False, not a cancellation
    ) -> bool:
        """Wait until every group's master has acted on the producer's record (deleted it); whether they have."""
        table = self.keys.txn_partitions
        tails = [self.keys.txn_partitions_of(g, producer_id)[len(table) :] for g in groups]
        return await self.member.view.wait_until(lambda s: not any(t in s.table(table).values for t in tails), timeout)

    # --- the partitions' master's side ---------------------------------------------------------------------------

    def record(self, producer_id: int) -> TxnPartitionsRecord | None:
        """This group's record of the producer's transaction as this broker's view last saw it."""
        key = self.keys.txn_partitions_of(self.group, producer_id)
        value = self.member.view.state.table(self.keys.txn_partitions).values.get(key[len(self.keys.txn_partitions) :])
        return None if value is None else self._decode(value, key)

    async def await_record(
        self,
        producer_id: int,
        wanted: Callable[[TxnPartitionsRecord], bool],
        timeout: float,  # noqa: ASYNC109 - a bound on the wait for the view, then etcd is read
    ) -> TxnPartitionsRecord | None:
        """The record as this broker's view shows it once `wanted` holds of it (waiting up to `timeout` for the
        watch), else as etcd holds it now."""

        def shown(_state: object) -> bool:
            record = self.record(producer_id)
            return record is not None and wanted(record)

        if await self.member.view.wait_until(shown, timeout):
            return self.record(producer_id)
        return await self.fetch(producer_id)

    async def fetch(self, producer_id: int) -> TxnPartitionsRecord | None:
        """The same record as etcd holds it now (a linearizable read: for a view that may lag the coordinator)."""
        key = self.keys.txn_partitions_of(self.group, producer_id)
        held = await self.member.node.meta.get(key)
        return None if held is None else self._decode(held.value, key)

    def decided(self) -> list[tuple[bytes, TxnPartitionsRecord]]:
        """(stored value, record) of every transaction of this group its coordinator has decided (looked for
        again only when the keys changed: the caller asks at every change of the cluster's view)."""
        table = self.member.view.state.table(self.keys.txn_partitions)
        if self._decided_at == table.generation():
            return self._decided
        prefix = quote(self.group, safe="") + "/"
        found = []
        for tail, value in table.values.items():
            if tail.startswith(prefix):
                record = self._decode(value, self.keys.txn_partitions + tail)
                if record is not None and record.state != TXN_ONGOING:
                    found.append((value, record))
        self._decided, self._decided_at = found, table.generation()
        return found

    async def done(self, record: TxnPartitionsRecord, value: bytes) -> bool:
        """Delete the record acted on (unless it changed since, or this broker is no longer master); whether it
        was deleted."""
        key = self.keys.txn_partitions_of(self.group, record.producer_id)
        return await self.member.node.meta.txn(
            [Compare(key, "value", "==", value), self.member.master_fence()], [Delete(key)]
        )

    def on_change(self, callback: Callable[[], None]) -> None:
        """`callback()` after every change the cluster's watch brings."""
        self.member.view.add_listener(callback)

    def _decode(self, value: bytes, key: str) -> TxnPartitionsRecord | None:
        if value in self._decoded:
            return self._decoded[value]
        try:
            record: TxnPartitionsRecord | None = TxnPartitionsRecord.decode(value)
        except Malformed as exc:
            log.error("cluster: %s skipped: %s", key, exc)
            record = None
        if len(self._decoded) >= _CACHE_LIMIT:
            self._decoded.clear()
        self._decoded[value] = record
        return record
