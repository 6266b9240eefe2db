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
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from mqk import errors as E
from mqk._fast import load

recbatch = load("recbatch")
log = logging.getLogger("mqk.kafka.idempotence")

STATE_NAME = "kafka-producer-ids"
ID_BLOCK = 1000
CACHED_BATCHES = 5
TAIL_RECORDS = 100_000
TAIL_READ_BYTES = 64 * 1024 * 1024
SEQ_MOD = 1 << 31  # sequences wrap from Int32.MaxValue to 0


def add_seq(seq: int, delta: int) -> int:
    return (seq + delta) % SEQ_MOD


@dataclass
class BatchEntry:
    first_seq: int
    last_seq: int
    base_offset: int = -1
    log_append_time: int = -1
    #: set while the append is in flight; a retry of this batch waits on it
    done: asyncio.Future | None = None


@dataclass
class ProducerEntry:
    epoch: int
    batches: deque[BatchEntry] = field(default_factory=lambda: deque(maxlen=CACHED_BATCHES))


@dataclass
class Decision:
    """What to do with one batch: append it (`entry` to complete), answer a duplicate, or refuse it."""

    error: int = 0
    duplicate: BatchEntry | None = None
    entry: BatchEntry | None = None
    producer: ProducerEntry | None = None


class ProducerStates:
    def __init__(self, store: Any) -> None:
        self.store = store
        self.next_id = 0
        self.block_end = 0
        self.first_id_this_run = 0
        self.partitions: dict[tuple[str, int], dict[int, ProducerEntry]] = {}
        self._loading: dict[tuple[str, int], asyncio.Future] = {}
        self._alloc_lock = asyncio.Lock()

    async def start(self) -> None:
        state = self.store.load_state(STATE_NAME) or {}
        self.next_id = self.block_end = int(state.get("block_end", 0))
        self.first_id_this_run = self.next_id

    # --- InitProducerId --------------------------------------------------------------------------------

    async def init_producer_id(self) -> tuple[int, int, int]:
        """-> (error, producer_id, epoch): a new producer id at epoch 0, every time. As in Kafka, an idempotent
        producer (no transactional id) asking again with its current id and epoch (KIP-360) also gets a new id: the
        broker keeps no epoch per producer id outside the partitions' batches, so there is nothing to bump (a
        producer that bumps its epoch itself starts the new epoch at sequence 0, see `begin`)."""
        async with self._alloc_lock:
            if self.next_id >= self.block_end:
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
        producers = self.partitions.get((topic, partition))
        if producers is None:
            producers = await self._load(topic, partition)
        last_seq = add_seq(first_seq, last_offset_delta)
        producer = producers.get(producer_id)
        if producer is None:
            if first_seq != 0 and producer_id >= self.first_id_this_run:
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
        try:
            producer.batches.remove(entry)
        except ValueError:
            pass
        if entry.done is not None and not entry.done.done():
            entry.done.set_result(False)
        entry.done = None

    @staticmethod
    async def settle(entry: BatchEntry) -> bool:
        """Wait for an in-flight original of a duplicate; False if the original failed."""
        if entry.done is not None:
            return bool(await asyncio.shield(entry.done))
        return entry.base_offset >= 0

    def forget_topic(self, topic: str) -> None:
        for key in [k for k in self.partitions if k[0] == topic]:
            del self.partitions[key]

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
            self.partitions[key] = producers
            del self._loading[key]
            future.set_result(producers)
        return producers

    async def _scan_tail(self, topic: str, partition: int, producers: dict[int, ProducerEntry]) -> None:
        start, end = self.store.offset_bounds(topic, partition)
        offset = max(start, end - TAIL_RECORDS)
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
                    producer = producers[producer_id] = ProducerEntry(epoch)
                elif epoch < producer.epoch:
                    continue
                log_append_time = h[8] if h[5] & 0x08 else -1
                producer.batches.append(
                    BatchEntry(base_seq, add_seq(base_seq, last_delta), base_offset, log_append_time)
                )
            offset = result.next_offset
