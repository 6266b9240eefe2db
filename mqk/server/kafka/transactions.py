"""Kafka transactions: the transaction coordinator, the markers, and what each partition knows of transactions
(its last stable offset and its aborted transactions).

What this module owns:
- **transactional ids** (`Txn`): producer id and epoch, state (Kafka's names: Empty, Ongoing, PrepareCommit,
  PrepareAbort, CompleteCommit, CompleteAbort), timeout, the partitions and consumer groups of the transaction
  under way and the offsets it will commit for them. InitProducerId gives a transactional id its producer id and
  bumps its epoch at every call (fencing the producer that had it: its requests then get PRODUCER_FENCED or
  INVALID_PRODUCER_EPOCH); a transaction still under way at that moment is aborted first. Epoch exhaustion moves
  the id to a new producer id at epoch 0. A KIP-360 call (the producer names its id and epoch) is accepted for the
  current epoch and for the one before a timeout's fence, else PRODUCER_FENCED.
- **durability**: every change of a transactional id is one document in `__transaction_state` (a
  `mqk.store.statelog.LogStateDocs`: name `t` + id, a JSON value; the topic is compacted, so its latest record is
  what the id is), written and awaited before the request is answered, in the log so that replication will carry
  it; so are the offsets a transaction will commit (TxnOffsetCommit) and each aborted transaction a partition must
  remember (name `a` + [topic, partition, marker offset], in the same batch as the Complete document; a tombstone
  once retention has removed the marker, or once the log cleaner has removed the transaction's batches, before it
  may remove the marker: `forget_aborted`). `start()` reads the topic back: a
  transaction caught between its Prepare record and its Complete one gets its markers again; one under way stays
  under way (its producer may go on, or its timeout ends it).
- **markers**: EndTxn writes Prepare, then one control batch (Kafka's COMMIT or ABORT control record, the
  producer's id and epoch, the transactional and control attributes) to every partition of the transaction,
  applies the transaction's group offsets on commit, and writes Complete, all before it answers. A marker is an
  ordinary append for the store: it wakes long polls, and replication will carry it.
- **per partition** (`PartitionTxns`): the first offset of each producer's transaction under way (registered
  before its first batch is appended, as the log's end at that moment, so a read_committed fetch can never see a
  batch ahead of it) and the aborted transactions (producer id, first offset, marker offset), in marker order, so
  Fetch finds the ones a read overlaps by bisection. Last stable offset = the smallest first offset under way, else
  the high watermark. After a restart, a transaction under way counts from where each partition ended when it was
  added (its "floor"): never after its first batch, so the LSO is at most lower than Kafka's, never higher.
- **transaction version 2** (KIP-890 part 2; ApiVersions finalizes the `transaction.version` feature at 2, and
  clients that speak it use EndTxn v5, Produce v12 and TxnOffsetCommit v5): every EndTxn bumps the epoch before
  its markers are written and answers the new one, so a late EndTxn or produce of an earlier transaction (its
  epoch now behind) can touch no later one; a retried EndTxn (the epoch just before, the same decision) is
  answered as the first; a produce names no AddPartitionsToTxn first (the partition is added as its first batch
  arrives), nor a TxnOffsetCommit its AddOffsetsToTxn. Clients of version 1 (every librdkafka, kafka-python,
  aiokafka, kafkajs) keep their request versions and their rules: an epoch per producer session, partitions added
  explicitly (a Produce v11 batch for a partition not added: TRANSACTION_ABORTABLE, older ones
  INVALID_TXN_STATE).
- **timeouts**: a sweep every `transaction_abort_timed_out_transaction_cleanup_interval_ms` aborts each
  transaction under way past its `transaction.timeout.ms`, bumping the epoch (the producer is fenced, as in Kafka),
  finishes a transaction whose markers could not all be written when it ended (a full disk: EndTxn answered
  COORDINATOR_NOT_AVAILABLE, and the producer's retry finishes it too), and forgets (with a tombstone) a
  transactional id idle for `transactional_id_expiration_ms` (Kafka's `transactional.id.expiration.ms`, 7 days),
  so ids that come and go do not grow the state without bound.

**Cluster mode** (`links`: mqk.broker.cluster.txn_partitions). A transactional id is coordinated by the master of
the group holding its `__consumer_offsets` partition; its documents are in that group's own `__transaction_state`
(local to each group, replicated with its log), loaded when the broker becomes master (`become_master`) and
dropped when it stops (`resign`). A transaction's partitions in the coordinator's own group are handled as on a
broker on its own. For each other group it writes to, the coordinator publishes the group's partitions in etcd
before answering the request that added them, and its decision at EndTxn; that group's master checks transactional
batches against the record, keeps each one's first offset in its own `__transaction_state` (`o` + [topic,
partition, producer id], written before the batch), writes the markers when the decision comes, and the
coordinator waits for them before its Complete record. A consumer group coordinated in another group takes the
transaction's offsets (TxnOffsetCommit goes to the group's coordinator) as pending documents (`g` + [producer id,
group]) and applies them when the decision reaches its offsets partition. Clients speak transaction version 1
there (ApiVersions finalizes no version 2: its implicit partition adds would need the partition's leader to ask
the coordinator).

Not thread-safe: one event loop owns it. Requests for one transactional id are serialised by its lock.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mqk import errors as E
from mqk._fast import load
from mqk.broker.internal import TRANSACTION_STATE_TOPIC
from mqk.clock import SYSTEM_CLOCK, Clock
from mqk.protocol.kafka.offset_records import OFFSETS_TOPIC
from mqk.services import BackgroundTask
from mqk.store.adapter import GroupOffset
from mqk.store.manager import StoreManager
from mqk.store.statelog import LogStateDocs

recbatch = load("recbatch")
log = logging.getLogger("mqk.kafka.transactions")

EMPTY, ONGOING = "Empty", "Ongoing"
PREPARE_COMMIT, PREPARE_ABORT = "PrepareCommit", "PrepareAbort"
COMPLETE_COMMIT, COMPLETE_ABORT = "CompleteCommit", "CompleteAbort"
STATES = (EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT)

#: record batch attributes: a transactional batch, a control batch
TRANSACTIONAL_ATTR = 0x10
CONTROL_ATTR = 0x20
#: control record types (the key's second int16)
ABORT_MARKER, COMMIT_MARKER = 0, 1
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_CONTROL_VALUE = struct.Struct(">hi")  # version, coordinator epoch
#: the last epoch a producer id may have: past it, a transactional id moves to a new producer id (Kafka's rule)
MAX_EPOCH = 32767 - 1
#: the coordinator epoch markers carry: always 0 (no client reads it; in a cluster a coordinator is fenced by its
#: group's master key instead: mqk.broker.cluster.txn_partitions)
COORDINATOR_EPOCH = 0
#: the state documents' names: a transactional id's (`t` + the id) and an aborted transaction's (`a` + JSON of its
#: topic, partition and marker offset); in cluster mode also a transaction's first offset in a partition of this
#: group coordinated elsewhere (`o` + JSON of topic, partition, producer id) and its offsets of a group coordinated
#: here (`g` + JSON of producer id, group)
_TXN_KEY, _ABORT_KEY, _OPEN_KEY, _OFFSETS_KEY = "t", "a", "o", "g"
#: TxnPartitionsRecord's states (mqk.broker.cluster.model)
_REMOTE_ONGOING, _REMOTE_COMMIT, _REMOTE_ABORT = "ongoing", "commit", "abort"
#: how long an EndTxn waits for other groups' markers before it answers COORDINATOR_NOT_AVAILABLE (the producer
#: retries; the transaction stays prepared, and its markers are asked for again)
REMOTE_MARKERS_WAIT_S = 10.0
_MARKED_EPOCHS_KEPT = 100_000
#: how long a partition's master waits for its view to show a transaction's record before it reads etcd
REMOTE_VIEW_WAIT_S = 0.2

Partition = tuple[str, int]
#: a transaction's offsets for one group: (topic, partition) -> (offset, leader epoch, metadata)
GroupOffsets = dict[Partition, tuple[int, int, str]]


class OffsetCommitter(Protocol):
    """Where a committed transaction's group offsets go (mqk.groups.coordinator.GroupCoordinator)."""

    async def commit_transactional_offsets(self, group_id: str, offsets: dict[Partition, GroupOffset]) -> None: ...


class RemoteTxn(Protocol):
    """A transaction's partitions in this broker's group, as its coordinator in another group published them
    (mqk.broker.cluster.model.TxnPartitionsRecord)."""

    @property
    def transactional_id(self) -> str: ...
    @property
    def producer_id(self) -> int: ...
    @property
    def producer_epoch(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def partitions(self) -> list[list[Any]]: ...

    def holds(self, topic: str, partition: int) -> bool: ...


class ClusterLinks(Protocol):
    """What the coordinator needs of the cluster (mqk.broker.cluster.txn_partitions.TxnPartitions)."""

    @property
    def group(self) -> str: ...

    def group_of(self, topic: str, partition: int) -> str | None: ...

    def offsets_partition(self, group_id: str) -> tuple[str, int]: ...

    def remote_record(
        self, transactional_id: str, producer_id: int, epoch: int, state: str, partitions: list[list[Any]]
    ) -> Any: ...

    async def publish(self, records: dict[str, Any]) -> None: ...

    async def wait_gone(self, producer_id: int, groups: list[str], timeout: float) -> bool: ...  # noqa: ASYNC109

    async def await_record(
        self,
        producer_id: int,
        wanted: Callable[[Any], bool],
        timeout: float,  # noqa: ASYNC109 - a bound on the wait for the view, then etcd is read
    ) -> RemoteTxn | None: ...

    def decided(self) -> list[tuple[bytes, Any]]: ...

    async def done(self, record: Any, value: bytes) -> bool: ...

    def on_change(self, callback: Callable[[], None]) -> None: ...


class ProducerIds(Protocol):
    """Where producer ids come from (mqk.server.kafka.idempotence.ProducerStates)."""

    async def init_producer_id(self) -> tuple[int, int, int]: ...


@dataclass(eq=False)  # (one per transactional id, found by identity; no equality is ever asked)
class Txn:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str = EMPTY
    #: the partitions of the transaction under way -> the partition's end offset when it was added (its floor)
    partitions: dict[Partition, int] = field(default_factory=dict)
    #: group -> the offsets the transaction commits for it
    groups: dict[str, GroupOffsets] = field(default_factory=dict)
    start_ms: int = -1
    update_ms: int = -1
    #: the epoch before a timeout's fence (a KIP-360 InitProducerId may name it), else -1
    last_epoch: int = -1
    #: cluster mode: the other groups told of the transaction under way (each holds its record in etcd until its
    #: master acts on the decision, which they are all told, even one whose partitions were deleted since)
    told: set[str] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)

    def document(self) -> dict[str, Any]:
        return {
            "v": 1,
            "pid": self.producer_id,
            "epoch": self.producer_epoch,
            "last_epoch": self.last_epoch,
            "timeout_ms": self.timeout_ms,
            "state": self.state,
            "partitions": [[t, p, floor] for (t, p), floor in self.partitions.items()],
            "groups": {g: _offsets_list(offsets) for g, offsets in self.groups.items()},
            "start_ms": self.start_ms,
            "update_ms": self.update_ms,
            "told": sorted(self.told),
        }

    @classmethod
    def from_document(cls, transactional_id: str, doc: dict[str, Any]) -> Txn:
        if doc.get("v") != 1 or doc.get("state") not in STATES:
            raise E.Corrupt(f"transaction state of {transactional_id!r}: unknown version or state")
        return cls(
            transactional_id,
            int(doc["pid"]),
            int(doc["epoch"]),
            int(doc["timeout_ms"]),
            doc["state"],
            {(str(t), int(p)): int(floor) for t, p, floor in doc["partitions"]},
            {str(g): _offsets_from(offsets) for g, offsets in doc["groups"].items()},
            int(doc["start_ms"]),
            int(doc["update_ms"]),
            int(doc.get("last_epoch", -1)),
            {str(g) for g in doc.get("told", ())},
        )


def _offsets_list(offsets: GroupOffsets) -> list[list[Any]]:
    return [[t, p, o, e, m] for (t, p), (o, e, m) in offsets.items()]


def _offsets_from(rows: list[list[Any]]) -> GroupOffsets:
    return {(str(t), int(p)): (int(o), int(e), str(m)) for t, p, o, e, m in rows}


class PartitionTxns:
    """One partition's transactions: those under way (producer id -> first offset) and the aborted ones."""

    __slots__ = ("aborted", "open")

    def __init__(self) -> None:
        self.open: dict[int, int] = {}
        #: (marker offset, producer id, first offset), in marker order
        self.aborted: list[tuple[int, int, int]] = []

    def last_stable(self, high_watermark: int) -> int:
        if not self.open:
            return high_watermark
        return min(high_watermark, min(self.open.values()))

    def aborted_overlapping(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions with records in [start, end)."""
        i = bisect.bisect_left(self.aborted, (start, -1, -1))
        return [(pid, first) for _marker, pid, first in self.aborted[i:] if first < end]


def control_batch(producer_id: int, epoch: int, commit: bool, timestamp: int) -> bytearray:
    """A marker: one control record (version 0, COMMIT or ABORT; the coordinator's epoch) in a control batch."""
    key = _CONTROL_KEY.pack(0, COMMIT_MARKER if commit else ABORT_MARKER)
    value = _CONTROL_VALUE.pack(0, COORDINATOR_EPOCH)
    record = recbatch.encode_record(0, 0, key, value, [])
    return recbatch.build_batch(
        0,
        timestamp,
        timestamp,
        bytes(record),
        1,
        0,
        attributes=TRANSACTIONAL_ATTR | CONTROL_ATTR,
        producer_id=producer_id,
        producer_epoch=epoch,
    )


def _abort_key(topic: str, partition: int, marker: int) -> str:
    return _ABORT_KEY + json.dumps([topic, partition, marker], separators=(",", ":"))


def _open_key(topic: str, partition: int, producer_id: int) -> str:
    return _OPEN_KEY + json.dumps([topic, partition, producer_id], separators=(",", ":"))


def _offsets_key(producer_id: int, group_id: str) -> str:
    return _OFFSETS_KEY + json.dumps([producer_id, group_id], separators=(",", ":"))


class TransactionCoordinator:
    def __init__(
        self,
        store: StoreManager,
        producer_ids: ProducerIds,
        offsets: OffsetCommitter,
        *,
        clock: Clock = SYSTEM_CLOCK,
        max_timeout_ms: int = 900_000,
        check_interval_ms: int = 10_000,
        id_expiration_ms: int = 604_800_000,
        standby: bool = False,
    ) -> None:
        self.store = store
        self.producer_ids = producer_ids
        self.offsets = offsets
        self.clock = clock
        self.max_timeout_ms = max_timeout_ms
        self.check_interval_ms = check_interval_ms
        self.id_expiration_ms = id_expiration_ms
        self.txns: dict[str, Txn] = {}
        #: producer id -> its transactional id's state (the ids of the transactions that may write now)
        self.by_pid: dict[int, Txn] = {}
        #: (topic, partition) -> its transactions; empty while no transaction has written anything
        self.partitions: dict[Partition, PartitionTxns] = {}
        #: the documents of `__transaction_state` (mqk.store.statelog)
        self.docs = LogStateDocs(store, TRANSACTION_STATE_TOPIC)
        self._sweeper = BackgroundTask("mqk-txn-timeouts")
        #: cluster mode: the other groups' side of this broker's transactions, and theirs of this group's partitions
        #: (set before the first `become_master`)
        self.links: ClusterLinks | None = None
        #: whether this broker serves transactions now: from `start` on its own; in cluster mode (`standby`) from
        #: `become_master` to `resign`
        self.active = False
        self.standby = standby
        #: cluster mode: offsets of transactions coordinated elsewhere, for groups coordinated here:
        #: producer id -> group -> offsets (applied when the transaction's decision reaches the group's partition)
        self.pending: dict[int, dict[str, GroupOffsets]] = {}
        self._decisions = asyncio.Event()
        #: producer id -> the epoch of the last marker written for it on a coordinator's decision from another
        #: group (a batch of an older epoch is fenced, as the partition's producer state fences it in Kafka), the
        #: most recent _MARKED_EPOCHS_KEPT
        self._marked_epochs: dict[int, int] = {}
        #: the decided records (their stored values) this master has acted on -> whether etcd deleted them
        self._acted: dict[bytes, bool] = {}
        self._marker_task = BackgroundTask("mqk-txn-markers")
        #: what `become_master` found prepared, finished in the background (held: the loop keeps only a weak
        #: reference to a task)
        self._finishing: asyncio.Task[None] | None = None

    # --- start and stop ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Read `__transaction_state` back (if there is one) and finish what a stop left between Prepare and
        Complete; then sweep for timeouts. In cluster mode (`standby`) the reading waits for `become_master`."""
        if not self.standby:
            await self._load()
            self.active = True
            await self.finish_prepared()
        else:
            self._marker_task.start(self._serve_decisions)
        self._sweeper.start(self._sweep_forever)

    async def stop(self) -> None:
        await self._sweeper.stop()
        await self._marker_task.stop()
        finishing, self._finishing = self._finishing, None
        if finishing is not None:
            finishing.cancel()
            await asyncio.gather(finishing, return_exceptions=True)

    def use_cluster(self, links: ClusterLinks) -> None:
        """Cluster mode: coordinate with the other groups through `links` (before the first `become_master`)."""
        self.links = links
        links.on_change(self._decisions.set)

    async def become_master(self, _epoch: int) -> None:
        """This broker became its group's master: read the group's `__transaction_state`, then serve; what was
        prepared and other groups' decisions are finished in the background."""
        self._forget_all()
        await self._load()
        self.active = True
        self._decisions.set()
        self._finishing = asyncio.get_running_loop().create_task(self.finish_prepared(), name="mqk-txn-finish")

    async def resign(self) -> None:
        """This broker stopped being master: it serves no transaction (NOT_COORDINATOR) and forgets their state."""
        self.active = False
        self._forget_all()

    def _forget_all(self) -> None:
        self.txns.clear()
        self.by_pid.clear()
        self.partitions.clear()
        self.pending.clear()
        self._acted.clear()
        self._marked_epochs.clear()

    async def _load(self) -> None:
        if self.store.topic(TRANSACTION_STATE_TOPIC) is None:
            return
        docs = await self.docs.load_all()
        for name, doc in docs.items():
            kind = name[:1]
            if kind not in (_ABORT_KEY, _OPEN_KEY, _OFFSETS_KEY):
                continue
            try:
                a, b, *c = json.loads(name[1:])
                if kind == _ABORT_KEY:
                    record = (int(c[0]), int(doc["pid"]), int(doc["first"]))
                    bisect.insort(self._partition(str(a), int(b)).aborted, record)
                elif kind == _OPEN_KEY:
                    self._partition(str(a), int(b)).open[int(c[0])] = int(doc["first"])
                else:
                    self.pending.setdefault(int(a), {})[str(b)] = _offsets_from(doc["offsets"])
            except (IndexError, KeyError, TypeError, ValueError) as exc:
                log.warning("skipping an unreadable transaction record %r: %s", name, exc)
                continue
        docs = {name[len(_TXN_KEY) :]: doc for name, doc in docs.items() if name.startswith(_TXN_KEY)}
        for name, doc in docs.items():
            try:
                txn = Txn.from_document(name, doc)
            except (E.Corrupt, KeyError, TypeError, ValueError) as exc:
                log.warning("skipping transactional id %r: %s", name, exc)
                continue
            self.txns[name] = txn
            self.by_pid[txn.producer_id] = txn
            if txn.state in (ONGOING, PREPARE_COMMIT, PREPARE_ABORT):
                for tp, floor in txn.partitions.items():
                    if floor >= 0:  # (-1: a partition of another group, which keeps its own)
                        self._partition(*tp).open[txn.producer_id] = floor
        log.info("loaded %d transactional ids from %s", len(self.txns), TRANSACTION_STATE_TOPIC)

    # --- InitProducerId ----------------------------------------------------------------------------------

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, producer_id: int = -1, epoch: int = -1
    ) -> tuple[int, int, int]:
        """-> (error code, producer id, epoch)."""
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return E.InvalidTransactionTimeoutError.code, -1, -1
        txn = self.txns.get(transactional_id)
        if txn is None:
            code, pid, _epoch = await self.producer_ids.init_producer_id()
            if code:
                return code, -1, -1
            txn = self.txns.setdefault(transactional_id, Txn(transactional_id, pid, -1, timeout_ms))
        async with txn.lock:
            if producer_id >= 0 and not (
                producer_id == txn.producer_id and epoch in (txn.producer_epoch, txn.last_epoch)
            ):
                return E.ProducerFencedError.code, -1, -1
            if txn.state in (PREPARE_COMMIT, PREPARE_ABORT) and not await self._finish(txn):
                return E.ConcurrentTransactionsError.code, -1, -1
            if txn.state == ONGOING:
                # a new producer (or a restarted one) takes the id over: what the old one left is aborted, at
                # a bumped epoch that fences it
                await self._bump(txn)
                if not await self._end(txn, commit=False):
                    return E.ConcurrentTransactionsError.code, -1, -1
            if producer_id >= 0 and epoch == txn.last_epoch and epoch != txn.producer_epoch:
                pass  # a timeout already bumped the epoch past the producer's: it takes that one
            else:
                await self._bump(txn)
            txn.last_epoch = -1
            txn.timeout_ms = timeout_ms
            txn.partitions.clear()
            txn.groups.clear()
            txn.told.clear()
            txn.update_ms = self.clock.time_ms()
            code = await self._saved(txn)
            return (code, -1, -1) if code else (0, txn.producer_id, txn.producer_epoch)

    async def _bump(self, txn: Txn) -> None:
        if txn.producer_epoch >= MAX_EPOCH:
            code, pid, _epoch = await self.producer_ids.init_producer_id()
            if code:
                raise E.KafkaError.for_code(code)("no producer id for the transactional id")
            self.by_pid.pop(txn.producer_id, None)
            txn.producer_id, txn.producer_epoch = pid, 0
        else:
            txn.producer_epoch += 1
        self.by_pid[txn.producer_id] = txn

    # --- the transaction's requests ----------------------------------------------------------------------

    def _check(self, transactional_id: str, producer_id: int, epoch: int) -> tuple[int, Txn | None]:
        txn = self.txns.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            return E.InvalidProducerIdMappingError.code, None
        if epoch != txn.producer_epoch:
            return E.ProducerFencedError.code, None
        return 0, txn

    async def add_partitions(
        self, transactional_id: str, producer_id: int, epoch: int, partitions: Iterable[Partition], verify_only: bool
    ) -> tuple[int, set[Partition]]:
        """-> (error code for every partition, or 0; with `verify_only` the partitions not in the transaction)."""
        code, txn = self._check(transactional_id, producer_id, epoch)
        if txn is None:
            return code, set()
        async with txn.lock:
            if txn.producer_epoch != epoch:
                return E.ProducerFencedError.code, set()
            if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                return E.ConcurrentTransactionsError.code, set()
            if verify_only:
                missing = {tp for tp in partitions if tp not in txn.partitions or txn.state != ONGOING}
                return 0, missing
            new = [tp for tp in partitions if tp not in txn.partitions]
            if not new and txn.state == ONGOING:
                return 0, set()
            self._begin(txn)
            for tp in new:
                txn.partitions[tp] = self._floor(*tp)
            txn.update_ms = self.clock.time_ms()
            return await self._saved(txn, published=any(txn.partitions[tp] < 0 for tp in new)), set()

    async def add_offsets(self, transactional_id: str, producer_id: int, epoch: int, group_id: str) -> int:
        code, txn = self._check(transactional_id, producer_id, epoch)
        if txn is None:
            return code
        async with txn.lock:
            if txn.producer_epoch != epoch:
                return E.ProducerFencedError.code
            if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                return E.ConcurrentTransactionsError.code
            if group_id in txn.groups and txn.state == ONGOING:
                return 0
            self._begin(txn)
            txn.groups.setdefault(group_id, {})
            published = False
            if self.links is not None:
                # a group coordinated in another group takes the offsets there: its offsets partition joins the
                # transaction as that group's partitions do
                tp = self.links.offsets_partition(group_id)
                if self._floor(*tp) < 0 and tp not in txn.partitions:
                    txn.partitions[tp] = -1
                    published = True
            txn.update_ms = self.clock.time_ms()
            return await self._saved(txn, published=published)

    async def txn_offset_commit(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        group_id: str,
        offsets: GroupOffsets,
        implicit: bool = False,
    ) -> int:
        """`implicit` (transaction version 2): no AddOffsetsToTxn came first; the offsets begin the transaction
        if nothing else has."""
        if self.links is not None and transactional_id not in self.txns:
            return await self._remote_offsets(transactional_id, producer_id, epoch, group_id, offsets)
        code, txn = self._check(transactional_id, producer_id, epoch)
        if txn is None:
            return E.InvalidProducerEpochError.code if code == E.ProducerFencedError.code else code
        async with txn.lock:
            if txn.producer_epoch != epoch:
                return E.InvalidProducerEpochError.code
            if implicit and txn.state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT):
                self._begin(txn)
            if txn.state != ONGOING:
                return E.InvalidTxnStateError.code
            txn.groups.setdefault(group_id, {}).update(offsets)
            txn.update_ms = self.clock.time_ms()
            return await self._saved(txn)

    async def end_txn_v2(
        self, transactional_id: str, producer_id: int, epoch: int, commit: bool
    ) -> tuple[int, int, int]:
        """EndTxn of transaction version 2 -> (error code, the producer id and epoch to go on with)."""
        txn = self.txns.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            return E.InvalidProducerIdMappingError.code, -1, -1
        async with txn.lock:
            done, prepared = (COMPLETE_COMMIT, PREPARE_COMMIT) if commit else (COMPLETE_ABORT, PREPARE_ABORT)
            if epoch == txn.last_epoch and epoch != txn.producer_epoch:
                # the epoch this transaction ended with was bumped: a retry of that EndTxn, or a late one
                if txn.state == done:
                    return 0, txn.producer_id, txn.producer_epoch
                if txn.state == prepared:
                    ok = await self._finish(txn)
                    return (
                        (0, txn.producer_id, txn.producer_epoch)
                        if ok
                        else (E.CoordinatorNotAvailableError.code, -1, -1)
                    )
                return E.ProducerFencedError.code, -1, -1
            if epoch != txn.producer_epoch:
                return E.ProducerFencedError.code, -1, -1
            if txn.state == ONGOING or (txn.state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT) and not commit):
                # (an abort with nothing under way still moves the epoch on, as Kafka's does)
                await self._bump(txn)
                txn.last_epoch = epoch
                if txn.state != ONGOING:
                    txn.update_ms = self.clock.time_ms()
                    code = await self._saved(txn)
                    return (code, -1, -1) if code else (0, txn.producer_id, txn.producer_epoch)
                if not await self._end(txn, commit):
                    return E.CoordinatorNotAvailableError.code, -1, -1
                return 0, txn.producer_id, txn.producer_epoch
            if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                return E.ConcurrentTransactionsError.code, -1, -1
            return E.InvalidTxnStateError.code, -1, -1

    async def add_implicitly(self, topic: str, partition: int, producer_id: int, epoch: int) -> int:
        """Transaction version 2: a transactional batch for a partition its transaction has not added yet adds
        it (and begins the transaction); 0, or the code refusing the batch."""
        txn = self.by_pid.get(producer_id)
        if txn is None:
            return E.InvalidProducerIdMappingError.code
        if (topic, partition) in txn.partitions and txn.state == ONGOING:
            return 0
        async with txn.lock:
            if epoch != txn.producer_epoch:
                return E.InvalidProducerEpochError.code
            if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                return E.ConcurrentTransactionsError.code
            if (topic, partition) in txn.partitions and txn.state == ONGOING:
                return 0
            self._begin(txn)
            txn.partitions[(topic, partition)] = self.store.end_offset(topic, partition)
            txn.update_ms = self.clock.time_ms()
            return await self._saved(txn)

    async def end_txn(self, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> int:
        txn = self.txns.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            return E.InvalidProducerIdMappingError.code
        async with txn.lock:
            if epoch != txn.producer_epoch:
                return E.ProducerFencedError.code
            if txn.state == ONGOING:
                return 0 if await self._end(txn, commit) else E.CoordinatorNotAvailableError.code
            if txn.state == (PREPARE_COMMIT if commit else PREPARE_ABORT):
                # a retry of an EndTxn whose markers could not all be written: finish them now
                return 0 if await self._finish(txn) else E.CoordinatorNotAvailableError.code
            if txn.state == (COMPLETE_COMMIT if commit else COMPLETE_ABORT):
                return 0  # a retry of the EndTxn that completed it
            if txn.state == EMPTY and not commit:
                return 0  # nothing to abort (a producer aborting before it wrote anything)
            return E.InvalidTxnStateError.code

    def _begin(self, txn: Txn) -> None:
        if txn.state != ONGOING:
            txn.state = ONGOING
            txn.partitions.clear()
            txn.groups.clear()
            txn.told.clear()
            txn.start_ms = self.clock.time_ms()

    async def _end(self, txn: Txn, commit: bool) -> bool:
        """Prepare, then complete the transaction; False if the store failed on the way (logged): the
        transaction stays prepared, and the producer's retry or the next sweep finishes it (`_finish`)."""
        txn.state = PREPARE_COMMIT if commit else PREPARE_ABORT
        txn.update_ms = self.clock.time_ms()
        try:
            await self._save(txn)
        except E.MqkError as exc:
            log.warning("transaction %r: its Prepare record was not written (%s)", txn.transactional_id, exc)
            return False
        return await self._finish(txn)

    async def _finish(self, txn: Txn) -> bool:
        """Complete a prepared transaction (markers, offsets, Complete record); False if the store failed."""
        try:
            await self._complete(txn, txn.state == PREPARE_COMMIT)
        except E.MqkError as exc:
            log.warning("transaction %r: not completed yet (%s); it will be retried", txn.transactional_id, exc)
            return False
        return True

    async def _complete(self, txn: Txn, commit: bool) -> None:
        """Markers to every partition (other groups' first: their masters write them), the group offsets on
        commit, then the Complete record."""
        now = self.clock.time_ms()
        pid, epoch = txn.producer_id, txn.producer_epoch
        remote = await self._publish(txn, _REMOTE_COMMIT if commit else _REMOTE_ABORT)
        if remote:
            assert self.links is not None
            if not await self.links.wait_gone(pid, remote, REMOTE_MARKERS_WAIT_S):
                raise E.CoordinatorNotAvailableError(f"the markers of groups {remote} are not written yet")
        aborted: dict[str, dict[str, Any] | None] = {}
        for (topic, partition), floor in txn.partitions.items():
            if floor >= 0 or not self._remote(topic, partition):
                await self._mark(topic, partition, pid, epoch, commit, now, aborted)
        if commit:
            for group, offsets in txn.groups.items():
                if offsets:
                    await self.offsets.commit_transactional_offsets(
                        group, {tp: GroupOffset(o, m, now, e) for tp, (o, e, m) in offsets.items()}
                    )
        txn.state = COMPLETE_COMMIT if commit else COMPLETE_ABORT
        txn.partitions.clear()
        txn.groups.clear()
        txn.told.clear()
        txn.update_ms = now
        await self._save(txn, aborted)

    async def _mark(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        epoch: int,
        commit: bool,
        now: int,
        docs: dict[str, dict[str, Any] | None],
    ) -> None:
        """Write the transaction's marker to one partition and forget it there; an abort's entry in the
        partition's aborted transactions goes into `docs` (to be saved once every marker is written)."""
        self._check_serving()
        state = self._partition(topic, partition)
        first = state.open.pop(producer_id, None)
        try:
            result = await self.store.append(topic, partition, [control_batch(producer_id, epoch, commit, now)])
        except (E.UnknownShard, E.UnknownTopicOrPartitionError):
            return  # the topic is gone, and its records with it
        except BaseException:
            if first is not None:
                state.open.setdefault(producer_id, first)  # still under way there, until a marker lands
            raise
        if not commit and first is not None:
            marker = result.base_offset
            bisect.insort(state.aborted, (marker, producer_id, min(first, marker)))
            docs[_abort_key(topic, partition, marker)] = {"pid": producer_id, "first": first}

    def _check_serving(self) -> None:
        """Nothing is written once this broker stopped being master (cluster mode): a replica never appends, and
        what was under way is finished by the new master from the log."""
        if self.standby and not self.active:
            raise E.NotCoordinatorError("this broker stopped coordinating transactions (no longer its group's master)")

    def _remote(self, topic: str, partition: int) -> bool:
        """Cluster mode: the partition is placed in another group, whose master keeps its transactions."""
        if self.links is None:
            return False
        group = self.links.group_of(topic, partition)
        return group is not None and group != self.links.group

    def _floor(self, topic: str, partition: int) -> int:
        """Where a transaction added now begins in the partition: its end now; -1 in another group's."""
        return -1 if self._remote(topic, partition) else self.store.end_offset(topic, partition)

    async def _publish(self, txn: Txn, state: str) -> list[str]:
        """Tell each other group whose partitions the transaction writes what they are and `state`; the groups."""
        links = self.links
        if links is None:
            return []
        by_group: dict[str, list[list[Any]]] = {}
        for (topic, partition), floor in txn.partitions.items():
            group = links.group_of(topic, partition) if floor < 0 else None
            if group is not None and group != links.group:
                by_group.setdefault(group, []).append([topic, partition])
        for group in txn.told:
            by_group.setdefault(group, [])  # (its partitions deleted since: its record goes all the same)
        txn.told.update(by_group)
        if by_group:
            await links.publish(
                {
                    group: links.remote_record(txn.transactional_id, txn.producer_id, txn.producer_epoch, state, tps)
                    for group, tps in by_group.items()
                }
            )
        return list(by_group)

    # --- the produce path --------------------------------------------------------------------------------

    async def check_write(self, topic: str, partition: int, producer_id: int, epoch: int) -> int:
        """0 if a transactional batch of this producer may be appended to the partition now, else the code."""
        txn = self.by_pid.get(producer_id)
        if txn is None:
            if self.links is not None:
                return (await self._remote_check(topic, partition, producer_id, epoch))[0]
            return E.InvalidProducerIdMappingError.code
        if epoch < txn.producer_epoch:
            return E.InvalidProducerEpochError.code
        if epoch > txn.producer_epoch or txn.state != ONGOING or (topic, partition) not in txn.partitions:
            return E.InvalidTxnStateError.code
        return 0

    async def will_write(self, topic: str, partition: int, producer_id: int, floor: int) -> None:
        """A transactional batch is about to be appended at or after `floor` (the log's end now). In cluster mode,
        for a transaction coordinated in another group, the first batch's floor is saved first (an `o` document,
        ahead of the batch in this group's log), so a replica that becomes master knows where it begins."""
        state = self._partition(topic, partition)
        if producer_id in state.open:
            return
        state.open[producer_id] = floor
        if self.links is not None and producer_id not in self.by_pid:
            try:
                await self._save_docs({_open_key(topic, partition, producer_id): {"first": floor}})
            except BaseException:
                if state.open.get(producer_id) == floor:
                    del state.open[producer_id]
                raise

    # --- cluster mode: transactions coordinated in another group -----------------------------------------

    async def _remote_record(self, producer_id: int, wanted: Callable[[RemoteTxn], bool]) -> RemoteTxn | None:
        """The producer's transaction in this group as its coordinator published it: as this broker's view shows
        it once that is what `wanted` asks, else as etcd holds it now. The view may lag the coordinator's write,
        which came before its answer to the client: the watch usually brings it within a moment, sparing the
        read of etcd; what never comes (a batch the transaction does not allow) is read after REMOTE_VIEW_WAIT_S."""
        assert self.links is not None
        return await self.links.await_record(producer_id, wanted, REMOTE_VIEW_WAIT_S)

    async def _remote_check(
        self, topic: str, partition: int, producer_id: int, epoch: int
    ) -> tuple[int, RemoteTxn | None]:
        """(0 or the code refusing it, the record) for a write of the producer's transaction to the partition."""

        def ongoing_here(r: RemoteTxn) -> bool:
            return r.state == _REMOTE_ONGOING and r.producer_epoch == epoch and r.holds(topic, partition)

        try:
            record = await self._remote_record(producer_id, ongoing_here)
        except E.MetaUnavailable:
            return E.CoordinatorNotAvailableError.code, None
        if epoch < (record.producer_epoch if record is not None else self._marked_epochs.get(producer_id, -1)):
            return E.InvalidProducerEpochError.code, record
        return (0 if record is not None and ongoing_here(record) else E.InvalidTxnStateError.code), record

    async def _remote_offsets(
        self, transactional_id: str, producer_id: int, epoch: int, group_id: str, offsets: GroupOffsets
    ) -> int:
        """TxnOffsetCommit for a group coordinated here by a transaction coordinated in another group: kept (an
        `g` document) until the transaction's decision reaches the group's offsets partition."""
        assert self.links is not None
        topic, partition = self.links.offsets_partition(group_id)
        code, record = await self._remote_check(topic, partition, producer_id, epoch)
        if not code and (record is None or record.transactional_id != transactional_id):
            code = E.InvalidProducerIdMappingError.code
        if code:
            return code
        held = self.pending.setdefault(producer_id, {}).setdefault(group_id, {})
        held.update(offsets)
        try:
            await self._save_docs({_offsets_key(producer_id, group_id): {"offsets": _offsets_list(held)}})
        except E.MqkError as exc:
            log.warning("offsets of transaction %r not written: %s", transactional_id, exc)
            return E.CoordinatorNotAvailableError.code
        return 0

    async def _serve_decisions(self) -> None:
        """Cluster mode, while master: write the markers other groups' coordinators decided for this group's
        partitions (woken by every change the cluster's watch brings; a failure is retried a second later)."""
        while True:
            await self._decisions.wait()
            self._decisions.clear()
            if not self.active or self.links is None:
                continue
            decided = self.links.decided()
            # a record acted on stays in the view until the watch brings its deletion: it is not acted on twice,
            # and its deletion is asked for again only if etcd did not take it
            live = {value for value, _record in decided}
            self._acted = {value: deleted for value, deleted in self._acted.items() if value in live}
            for value, record in decided:
                if self._acted.get(value):
                    continue
                try:
                    if value not in self._acted:
                        await self._act_on(record)
                        self._acted[value] = False
                    self._acted[value] = await self.links.done(record, value)
                except Exception as exc:  # (logged, and the record is acted on again a second later)
                    log.warning(
                        "markers of transaction %r (producer id %d) not written yet: %s",
                        record.transactional_id,
                        record.producer_id,
                        exc,
                        exc_info=not isinstance(exc, E.MqkError),
                    )
                    asyncio.get_running_loop().call_later(1.0, self._decisions.set)

    async def _act_on(self, record: RemoteTxn) -> None:
        """The markers of one decided transaction on this group's partitions (the offsets it holds for groups
        coordinated here applied on commit, dropped on abort), then its documents here forgotten."""
        commit = record.state == _REMOTE_COMMIT
        pid, epoch = record.producer_id, record.producer_epoch
        self._marked_epochs.pop(pid, None)
        self._marked_epochs[pid] = epoch
        if len(self._marked_epochs) > _MARKED_EPOCHS_KEPT:
            del self._marked_epochs[next(iter(self._marked_epochs))]
        now = self.clock.time_ms()
        docs: dict[str, dict[str, Any] | None] = {}
        held = self.pending.get(pid, {})
        for topic, partition in record.partitions:
            if topic == OFFSETS_TOPIC:
                assert self.links is not None
                for group in [g for g in held if self.links.offsets_partition(g) == (topic, partition)]:
                    offsets = held[group]
                    if commit and offsets:
                        await self.offsets.commit_transactional_offsets(
                            group, {tp: GroupOffset(o, m, now, e) for tp, (o, e, m) in offsets.items()}
                        )
                    docs[_offsets_key(pid, group)] = None
                    del held[group]
                continue
            await self._mark(topic, partition, pid, epoch, commit, now, docs)
            docs[_open_key(topic, partition, pid)] = None
        if not held:
            self.pending.pop(pid, None)
        if docs:
            await self._save_docs(docs)

    def _partition(self, topic: str, partition: int) -> PartitionTxns:
        state = self.partitions.get((topic, partition))
        if state is None:
            state = self.partitions[(topic, partition)] = PartitionTxns()
        return state

    # --- what reads and admin tools see ------------------------------------------------------------------

    def last_stable(self, topic: str, partition: int, high_watermark: int) -> int:
        state = self.partitions.get((topic, partition))
        return high_watermark if state is None else state.last_stable(high_watermark)

    def aborted_ranges(self, topic: str, partition: int) -> list[tuple[int, int, int]]:
        """(marker offset, producer id, first offset) of the partition's aborted transactions (the cleaner's
        question: mqk.services.compaction)."""
        state = self.partitions.get((topic, partition))
        return [] if state is None else list(state.aborted)

    def pending_offsets(self, group_id: str) -> set[Partition]:
        """The partitions of `group_id` whose offsets a transaction under way will commit (OffsetFetch's
        require_stable answers UNSTABLE_OFFSET_COMMIT for them)."""
        pending: set[Partition] = set()
        for txn in self.txns.values():
            if txn.state in (ONGOING, PREPARE_COMMIT) and group_id in txn.groups:
                pending.update(txn.groups[group_id])
        for held in self.pending.values():
            pending.update(held.get(group_id, ()))
        return pending

    def under_way(self, topic: str, partition: int) -> bool:
        """Whether a transaction has records in the partition and no marker yet (a partition moving to another
        broker group is sealed only without one: mqk.broker.moves)."""
        state = self.partitions.get((topic, partition))
        return state is not None and bool(state.open)

    async def adopt_aborted(self, topic: str, partition: int, aborted: Sequence[tuple[int, int, int]]) -> None:
        """Take over a partition's aborted transactions, (marker offset, producer id, first offset) each, found in
        its records when it was copied here from another broker group (mqk.broker.moves): read_committed
        consumers skip them here as they did there. Saved before the partition is served here."""
        state = self._partition(topic, partition)
        docs: dict[str, dict[str, Any] | None] = {}
        for marker, producer_id, first in aborted:
            entry = (marker, producer_id, first)
            if entry not in state.aborted:
                bisect.insort(state.aborted, entry)
                docs[_abort_key(topic, partition, marker)] = {"pid": producer_id, "first": first}
        if docs:
            await self._save_docs(docs)

    def open_first_offset(self, topic: str, partition: int, producer_id: int) -> int:
        state = self.partitions.get((topic, partition))
        return -1 if state is None else state.open.get(producer_id, -1)

    def forget_topic(self, topic: str) -> None:
        for tp in [tp for tp in self.partitions if tp[0] == topic]:
            del self.partitions[tp]

    # --- timeouts and pruning ----------------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        while True:
            await self.clock.sleep(self.check_interval_ms / 1000)
            if not self.active:
                continue
            try:
                await self.abort_timed_out()
                await self.finish_prepared()
                await self.expire_ids()
                await self.prune_aborted()
            except Exception:
                log.exception("transaction sweep failed")

    async def abort_timed_out(self) -> int:
        """Abort every transaction under way past its timeout (the producer is fenced: its epoch is bumped).
        -> how many were aborted."""
        now = self.clock.time_ms()
        count = 0
        for txn in list(self.txns.values()):
            if txn.state != ONGOING or now - txn.start_ms <= txn.timeout_ms:
                continue
            async with txn.lock:
                if txn.state != ONGOING or now - txn.start_ms <= txn.timeout_ms:
                    continue
                log.info(
                    "aborting transaction %r (producer id %d): open for more than its %d ms timeout",
                    txn.transactional_id,
                    txn.producer_id,
                    txn.timeout_ms,
                )
                fenced = txn.producer_epoch
                await self._bump(txn)
                txn.last_epoch = fenced
                if await self._end(txn, commit=False):
                    count += 1
        return count

    async def finish_prepared(self) -> None:
        """Finish the transactions an earlier failure left prepared."""
        for txn in list(self.txns.values()):
            if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                async with txn.lock:
                    if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                        await self._finish(txn)

    async def expire_ids(self) -> int:
        """Forget every transactional id with nothing under way and idle for `id_expiration_ms` (a tombstone in
        the state log); -> how many."""
        horizon = self.clock.time_ms() - self.id_expiration_ms
        gone = [
            txn
            for txn in self.txns.values()
            if txn.state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT) and txn.update_ms < horizon
        ]
        if not gone:
            return 0
        await self._save_docs({_TXN_KEY + txn.transactional_id: None for txn in gone})
        for txn in gone:
            if self.txns.get(txn.transactional_id) is txn and txn.state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT):
                del self.txns[txn.transactional_id]
                if self.by_pid.get(txn.producer_id) is txn:
                    del self.by_pid[txn.producer_id]
        log.info("forgot %d transactional ids idle for %d ms", len(gone), self.id_expiration_ms)
        return len(gone)

    async def prune_aborted(self) -> None:
        """Forget (with a tombstone) the aborted transactions whose marker retention has removed."""
        gone: dict[str, dict[str, Any] | None] = {}
        for (topic, partition), state in list(self.partitions.items()):
            if not state.aborted:
                continue
            try:
                start = self.store.log_start_offset(topic, partition)
            except E.MqkError:
                start = 1 << 62  # the topic is gone
            cut = bisect.bisect_left(state.aborted, (start, -1, -1))
            for marker, _pid, _first in state.aborted[:cut]:
                gone[_abort_key(topic, partition, marker)] = None
            del state.aborted[:cut]
        if gone:
            await self._save_docs(gone)

    async def forget_aborted(self, topic: str, partition: int, markers: Iterable[int]) -> None:
        """Forget (with a tombstone) the partition's aborted transactions whose markers are at `markers`: the log
        cleaner's call (mqk.services.compaction), once it found none of their batches left and before its rewrite
        may drop the markers. The tombstones are in the state log when this returns; an entry stays known until
        then, so a failed save leaves it named, and the cleaner, which fails with it, drops no marker."""
        state = self.partitions.get((topic, partition))
        wanted = set(markers)
        named = {entry[0] for entry in state.aborted if entry[0] in wanted} if state is not None else set()
        if state is None or not named:
            return
        await self._save_docs({_abort_key(topic, partition, marker): None for marker in sorted(named)})
        state.aborted[:] = [entry for entry in state.aborted if entry[0] not in named]

    # --- the state log -----------------------------------------------------------------------------------

    async def _saved(self, txn: Txn, published: bool = False) -> int:
        """`_save` (and, when `published`, the transaction's partitions in other groups told them), answering 0
        or, when the store or etcd fails (logged), COORDINATOR_NOT_AVAILABLE: the client retries the request,
        whose change is then written again (the state in memory already holds it)."""
        try:
            await self._save(txn)
            if published:
                await self._publish(txn, _REMOTE_ONGOING)
        except E.MqkError as exc:
            log.warning("transaction state of %r not written: %s", txn.transactional_id, exc)
            return E.CoordinatorNotAvailableError.code
        return 0

    async def _save(self, txn: Txn, extra: Mapping[str, dict[str, Any] | None] | None = None) -> None:
        """The transactional id's document, with `extra` documents (aborted transactions) in the same batch."""
        await self._save_docs({_TXN_KEY + txn.transactional_id: txn.document(), **(extra or {})})

    async def _save_docs(self, docs: Mapping[str, dict[str, Any] | None]) -> None:
        self._check_serving()
        await self._prepared_docs()
        await self.docs.save_many(docs)

    async def _prepared_docs(self) -> None:
        """The state topic made on first use (a broker that never saw a transaction has none)."""
        if self.store.topic(TRANSACTION_STATE_TOPIC) is None:
            await self.docs.prepare()
