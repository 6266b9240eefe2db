"""Idempotent producers: producer-id allocation and per-partition sequence tracking.

Producer ids are handed out in blocks (like Kafka's ProducerIdManager): the end of the current block is saved
with `store.save_state` before any id of it is used, so ids are never reused after a restart or a crash; at most
one block of ids is skipped.

Per partition and producer the broker remembers the producer epoch and the last `CACHED_BATCHES` batches
(first/last sequence, offsets). A new batch must continue the sequence (else OUT_OF_ORDER_SEQUENCE_NUMBER); a
batch equal to one of the cached ones is a retry and is answered with the original offsets without being
appended again. A batch is registered *before* its append is awaited, so pipelined batches of one producer
(max.in.flight > 1) see each other in order; a failed append withdraws its entry so the retry is accepted.

Surviving a restart: the state is not written on every produce (that would cost an fsync per request). Instead,
the first time a partition is produced to after a start, the tail of its log (`TAIL_RECORDS` offsets) is read
and every batch with a producer id rebuilds that producer's sequence window — the batches are the truth.
A producer whose id predates this start but which has no batch in that tail is accepted at any sequence
(its state cannot be known), while a producer id allocated since this start must begin at sequence 0.

Cluster mode: becoming a group's master counts as a start (`become_master`): the windows cached while this broker
was master before are forgotten, so each partition's first produce rebuilds them from its log tail, which now holds
the previous master's batches (replicated): a producer retrying a batch the old master acknowledged is answered
with its offsets, not appended again. Every id handed out in the cluster until then counts as predating the start.

Expiry (Kafka's `producer.id.expiration.ms`, its default of one day): a producer that has written nothing to a
partition for that long is forgotten there, so the state of producers that come and go does not grow without
bound. Idleness is measured on the injected `Clock` (the broker's receive time of the producer's last batch; Kafka
reads the batch's own timestamp, which a client clock can skew), swept at most every
`producer.id.expiration.check.interval.ms` (ten minutes) from the produce path. A forgotten producer is like one
whose state predates this start: any sequence is accepted from it, as Kafka accepts it. A partition keeps only the
highest id it forgot, and gives that benefit to every unknown id up to it (an id allocated this run that first
writes to the partition after a higher one expired there is not held to sequence 0: the one case where the check
is looser than without expiry, and as loose as Kafka's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from mqk import errors as E
from mqk._fast import load
from mqk.clock import SYSTEM_CLOCK, Clock
from mqk.store.manager import StoreManager


class ProducerIdSource(Protocol):
    """A cluster's producer-id blocks (mqk.broker.cluster.node.ClusterNode)."""

    async def allocate_pids(self, size: int) -> range: ...

    async def next_free_pid(self) -> int: ...


recbatch = load("recbatch")
log = logging.getLogger("mqk.kafka.idempotence")

STATE_NAME = "kafka-producer-ids"
ID_BLOCK = 1000
CACHED_BATCHES = 5
TAIL_RECORDS = 100_000
TAIL_READ_BYTES = 64 * 1024 * 1024
SEQ_MOD = 1 << 31  # sequences wrap from Int32.MaxValue to 0
#: Kafka's producer.id.expiration.ms and producer.id.expiration.check.interval.ms defaults
PRODUCER_ID_EXPIRATION_MS = 86_400_000
EXPIRATION_CHECK_INTERVAL_MS = 600_000


def add_seq(seq: int, delta: int) -> int:
    return (seq + delta) % SEQ_MOD


@dataclass
class BatchEntry:
    first_seq: int
    last_seq: int
    base_offset: int = -1
    log_append_time: int = -1
    #: set while the append is in flight; a retry of this batch waits on it
    done: asyncio.Future[bool] | None = None


@dataclass
class ProducerEntry:
    epoch: int
    batches: deque[BatchEntry] = field(default_factory=lambda: deque(maxlen=CACHED_BATCHES))
    #: clock time (epoch ms) of the producer's last batch here, or of the tail scan that found it
    last_ms: int = 0


@dataclass
class Decision:
    """What to do with one batch: append it (`entry` to complete), answer a duplicate, or refuse it."""

    error: int = 0
    duplicate: BatchEntry | None = None
    entry: BatchEntry | None = None
    producer: ProducerEntry | None = None


class ProducerStates:
    def __init__(
        self, store: StoreManager, *, clock: Clock = SYSTEM_CLOCK, expiration_ms: int = PRODUCER_ID_EXPIRATION_MS
    ) -> None:
        self.store = store
        self.clock = clock
        self.expiration_ms = expiration_ms
        self.next_id = 0
        self.block_end = 0
        self.first_id_this_run = 0
        self.partitions: dict[tuple[str, int], dict[int, ProducerEntry]] = {}
        #: per partition, the highest producer id expired there (see the module docstring)
        self.forgotten: dict[tuple[str, int], int] = {}
        self._next_sweep_ms = 0
        self._loading: dict[tuple[str, int], asyncio.Future[dict[int, ProducerEntry]]] = {}
        self._alloc_lock = asyncio.Lock()
        #: cluster mode: where id blocks come from (None: this broker's own persisted counter)
        self._cluster: ProducerIdSource | None = None

    async def start(self) -> None:
        state = self.store.load_state(STATE_NAME) or {}
        self.next_id = self.block_end = int(state.get("block_end", 0))
        self.first_id_this_run = self.next_id

    async def use_cluster(self, cluster: ProducerIdSource) -> None:
        """Cluster mode: ids come in blocks from the cluster (unique across its brokers); an id allocated by any
        broker since this one started must begin at sequence 0 here."""
        self.first_id_this_run = await cluster.next_free_pid()
        self._cluster = cluster
        self.next_id = self.block_end = 0

    async def become_master(self, epoch: int) -> None:
        """Cluster mode: this broker became its group's master (epoch `epoch`): what it cached is forgotten and
        rebuilt from the log on each partition's next produce, as after a start."""
        await self.resign()
        if self._cluster is not None:
            try:
                self.first_id_this_run = await self._cluster.next_free_pid()
            except Exception as exc:  # noqa: BLE001 - unknown: every id counts as old (no sequence is refused)
                log.warning("cannot read the cluster's next producer id (%s); unknown producers are not checked", exc)
                self.first_id_this_run = 1 << 63

    async def resign(self) -> None:
        """Forget every partition's producer windows (this broker stops being master, or becomes it again)."""
        self.partitions.clear()
        self.forgotten.clear()
        self._loading.clear()  # a load under way completes for its waiters but is not kept

    # --- InitProducerId --------------------------------------------------------------------------------

    async def init_producer_id(self) -> tuple[int, int, int]:
        """-> (error, producer_id, epoch): a new producer id at epoch 0, every time. As in Kafka, an idempotent
        producer (no transactional id) asking again with its current id and epoch (KIP-360) also gets a new id: the
        broker keeps no epoch per producer id outside the partitions' batches, so there is nothing to bump (a
        producer that bumps its epoch itself starts the new epoch at sequence 0, see `begin`)."""
        async with self._alloc_lock:
            if self._cluster is not None and self.next_id >= self.block_end:
                try:
                    block = await self._cluster.allocate_pids(ID_BLOCK)
                except Exception as exc:  # noqa: BLE001 - the client retries InitProducerId
                    log.warning("cannot get a producer id block from the cluster: %s", exc)
                    return E.kafka_code_for(exc), -1, -1
                self.next_id, self.block_end = block.start, block.stop
            elif self.next_id >= self.block_end:
                new_end = self.next_id + ID_BLOCK
                try:
                    await self.store.save_state(STATE_NAME, {"block_end": new_end})
                except Exception as exc:  # noqa: BLE001 - the client retries InitProducerId
                    log.warning("cannot persist producer id block: %s", exc)
                    return E.kafka_code_for(exc), -1, -1
                self.block_end = new_end
            pid = self.next_id
            self.next_id += 1
        return 0, pid, 0

    # --- produce-side checks ---------------------------------------------------------------------------

    async def begin(
        self, topic: str, partition: int, producer_id: int, epoch: int, first_seq: int, last_offset_delta: int
    ) -> Decision:
        now = self.clock.time_ms()
        if now >= self._next_sweep_ms:
            self.expire(now)
        producers = self.partitions.get((topic, partition))
        if producers is None:
            producers = await self._load(topic, partition)
        last_seq = add_seq(first_seq, last_offset_delta)
        producer = producers.get(producer_id)
        if producer is None:
            if (
                first_seq != 0
                and producer_id >= self.first_id_this_run
                and producer_id > self.forgotten.get((topic, partition), -1)
            ):
                return Decision(E.OutOfOrderSequenceNumberError.code)
            producer = producers[producer_id] = ProducerEntry(epoch)
        elif epoch < producer.epoch:
            return Decision(E.InvalidProducerEpochError.code)
        elif epoch > producer.epoch:
            if first_seq != 0:
                return Decision(E.OutOfOrderSequenceNumberError.code)
            producer.epoch = epoch
            producer.batches.clear()
        else:
            for cached in producer.batches:
                if cached.first_seq == first_seq and cached.last_seq == last_seq:
                    return Decision(duplicate=cached)
            if producer.batches and first_seq != add_seq(producer.batches[-1].last_seq, 1):
                return Decision(E.OutOfOrderSequenceNumberError.code)
        entry = BatchEntry(first_seq, last_seq, done=asyncio.get_running_loop().create_future())
        producer.batches.append(entry)
        producer.last_ms = now
        return Decision(entry=entry, producer=producer)

    @staticmethod
    def complete(decision: Decision, base_offset: int, log_append_time: int) -> None:
        entry = decision.entry
        assert entry is not None
        entry.base_offset, entry.log_append_time = base_offset, log_append_time
        if entry.done is not None and not entry.done.done():
            entry.done.set_result(True)
        entry.done = None

    @staticmethod
    def abort(decision: Decision) -> None:
        """The append failed: forget the batch so the client's retry is taken as new."""
        entry, producer = decision.entry, decision.producer
        assert entry is not None and producer is not None
        with contextlib.suppress(ValueError):  # pushed out of the window (CACHED_BATCHES) meanwhile
            producer.batches.remove(entry)
        if entry.done is not None and not entry.done.done():
            entry.done.set_result(False)
        entry.done = None

    @staticmethod
    async def settle(entry: BatchEntry) -> bool:
        """Wait for an in-flight original of a duplicate; False if the original failed."""
        if entry.done is not None:
            return bool(await asyncio.shield(entry.done))
        return entry.base_offset >= 0

    async def describe(self, topic: str, partition: int) -> list[tuple[int, int, int, int]]:
        """The partition's active producers (Kafka's DescribeProducers): (producer id, epoch, last sequence, last
        time in epoch ms), by producer id. The last sequence is that of the producer's last appended batch (a batch
        still in flight is not counted yet; -1 when none is appended); the last time is when this broker received
        its last batch (or, for a producer rebuilt from the log tail, when the tail was read). A partition not
        produced to since this broker started (or became master) is rebuilt from its log tail first."""
        producers = self.partitions.get((topic, partition))
        if producers is None:
            producers = await self._load(topic, partition)
        out = []
        for pid, producer in sorted(producers.items()):
            appended = [b for b in producer.batches if b.base_offset >= 0]
            out.append((pid, producer.epoch, appended[-1].last_seq if appended else -1, producer.last_ms))
        return out

    def forget_topic(self, topic: str) -> None:
        for key in [k for k in self.partitions if k[0] == topic]:
            del self.partitions[key]
        for key in [k for k in self.forgotten if k[0] == topic]:
            del self.forgotten[key]

    def expire(self, now_ms: int | None = None) -> int:
        """Forget every producer idle in a partition for `expiration_ms` or longer; returns how many were. Runs
        from `begin` once per check interval; callable directly (tests, an operator's clean-up)."""
        now = self.clock.time_ms() if now_ms is None else now_ms
        self._next_sweep_ms = now + EXPIRATION_CHECK_INTERVAL_MS
        horizon = now - self.expiration_ms
        expired = 0
        for key, producers in self.partitions.items():
            # a batch in flight was registered just now (last_ms), so an idle producer has none
            stale = [pid for pid, producer in producers.items() if producer.last_ms <= horizon]
            if stale:
                for pid in stale:
                    del producers[pid]
                self.forgotten[key] = max(self.forgotten.get(key, -1), *stale)
                expired += len(stale)
        if expired:
            log.info("%d idle producer(s) expired (producer.id.expiration.ms %d)", expired, self.expiration_ms)
        return expired

    # --- rebuilding from the log -----------------------------------------------------------------------

    async def _load(self, topic: str, partition: int) -> dict[int, ProducerEntry]:
        key = (topic, partition)
        loading = self._loading.get(key)
        if loading is not None:
            return await asyncio.shield(loading)
        future = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        producers: dict[int, ProducerEntry] = {}
        try:
            await self._scan_tail(topic, partition, producers)
        except Exception as exc:  # noqa: BLE001 - an unreadable tail only loses duplicate detection
            log.warning("producer state of %s/%d not rebuilt: %s", topic, partition, exc)
        finally:
            if self._loading.get(key) is future:  # (not forgotten meanwhile by `resign`)
                self.partitions[key] = producers
                del self._loading[key]
            future.set_result(producers)
        return producers

    async def _scan_tail(self, topic: str, partition: int, producers: dict[int, ProducerEntry]) -> None:
        start, end = self.store.offset_bounds(topic, partition)
        offset = max(start, end - TAIL_RECORDS)
        found_at = self.clock.time_ms()  # idleness of a producer found in the tail counts from now
        while offset < end:
            result = await self.store.read(topic, partition, offset, TAIL_READ_BYTES)
            if not result.batches:
                break
            for batch in result.batches:
                h = recbatch.parse_header(batch.data, 0)
                base_offset, last_delta, producer_id, epoch, base_seq = h[0], h[6], h[9], h[10], h[11]
                if producer_id < 0 or base_seq < 0:
                    continue
                producer = producers.get(producer_id)
                if producer is None or epoch > producer.epoch:
                    producer = producers[producer_id] = ProducerEntry(epoch, last_ms=found_at)
                elif epoch < producer.epoch:
                    continue
                log_append_time = h[8] if h[5] & 0x08 else -1
                producer.batches.append(
                    BatchEntry(base_seq, add_seq(base_seq, last_delta), base_offset, log_append_time)
                )
            offset = result.next_offset
