"""The broker's periodic work on an injected FakeClock (memory StoreManager): retention passes come every
`log_retention_check_interval_ms` (or at once on `trigger`) and measure `retention.ms` from the clock's "now";
compaction passes come every `log_cleaner_backoff_ms`; idle idempotent producers expire after
`producer.id.expiration.ms`. Each deadline is checked just before and at its time."""

from __future__ import annotations

from helpers import twin_batch

from mqk import errors as E
from mqk.clock import FakeClock, settle
from mqk.config import BrokerConfig, TopicConfig
from mqk.server.kafka.idempotence import EXPIRATION_CHECK_INTERVAL_MS, PRODUCER_ID_EXPIRATION_MS, ProducerStates
from mqk.services.compaction import CompactionService
from mqk.services.retention import RetentionService
from mqk.store.manager import StoreManager


async def test_retention_runs_every_interval_and_on_trigger_measuring_age_on_the_clock(
    memory_store: StoreManager, mqk_fake_clock: FakeClock
) -> None:
    clock = mqk_fake_clock
    await memory_store.create_topic("aging", 1, TopicConfig({"retention.ms": "60000"}))
    await memory_store.append("aging", 0, [twin_batch([b"old"], timestamps=[clock.time_ms()])])
    service = RetentionService(BrokerConfig(log_retention_check_interval_ms=300_000), memory_store, clock=clock)
    await service.start()
    try:
        await clock.advance(299.999)
        assert service.passes == 0
        await clock.advance(0.001)
        # the first pass: the record is 300 s old on the clock, past its 60 s
        assert service.passes == 1 and memory_store.log_start_offset("aging", 0) == 1
        await memory_store.append("aging", 0, [twin_batch([b"new"], timestamps=[clock.time_ms()])])
        service.trigger()
        await settle()
        assert service.passes == 2 and memory_store.log_start_offset("aging", 0) == 1  # young: kept
        await clock.advance(299.999)  # the interval counts from the triggered pass
        assert service.passes == 2
        await clock.advance(0.001)
        assert service.passes == 3 and memory_store.log_start_offset("aging", 0) == 2
    finally:
        await service.stop()


async def test_compaction_runs_every_backoff(memory_store: StoreManager, mqk_fake_clock: FakeClock) -> None:
    clock = mqk_fake_clock
    service = CompactionService(BrokerConfig(log_cleaner_backoff_ms=15_000), memory_store, clock=clock)
    await service.start()
    try:
        for passes in (1, 2):
            await clock.advance(14.999)
            assert service.passes == passes - 1
            await clock.advance(0.001)
            assert service.passes == passes and service.last_report is not None
    finally:
        await service.stop()


async def _begin(states: ProducerStates, producer_id: int, first_seq: int, count: int = 1):
    decision = await states.begin("t", 0, producer_id, 0, first_seq, count - 1)
    if decision.entry is not None:
        ProducerStates.complete(decision, 100 + first_seq, -1)
    return decision


async def test_idle_producers_expire_and_are_then_taken_at_any_sequence(
    memory_store: StoreManager, mqk_fake_clock: FakeClock
) -> None:
    clock = mqk_fake_clock
    await memory_store.create_topic("t", 1)
    states = ProducerStates(memory_store, clock=clock)
    await states.start()
    (_, idle, _), (_, busy, _), (_, late, _) = [await states.init_producer_id() for _ in range(3)]
    assert (await _begin(states, idle, 0, 5)).entry is not None
    assert (await _begin(states, busy, 0)).entry is not None
    # a day less a millisecond later: still known, a retry of its batch is answered as the duplicate it is
    await clock.advance(PRODUCER_ID_EXPIRATION_MS / 1000 - 0.001)
    assert (await _begin(states, busy, 1)).entry is not None  # busy writes again: its day starts over
    assert (await _begin(states, idle, 0, 5)).duplicate is not None
    assert (await _begin(states, idle, 7)).error == E.OutOfOrderSequenceNumberError.code
    assert idle in states.partitions[("t", 0)]
    # a day: the next produce past the check interval sweeps it away
    await clock.advance(EXPIRATION_CHECK_INTERVAL_MS / 1000)
    assert (await _begin(states, busy, 2)).entry is not None
    assert idle not in states.partitions[("t", 0)] and busy in states.partitions[("t", 0)]
    # forgotten, it is treated like a producer whose state predates this start: any sequence is accepted
    assert (await _begin(states, idle, 5)).entry is not None
    # one allocated this run that never wrote here is held to sequence 0 unless its id is below a forgotten one
    assert late > idle
    assert (await _begin(states, late, 3)).error == E.OutOfOrderSequenceNumberError.code
    assert states.expire(clock.time_ms()) == 0  # nothing idle any more
    states.forget_topic("t")
    assert states.forgotten == {} and states.partitions == {}
