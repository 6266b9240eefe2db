"""mqk.broker.quotas on its own (FakeClock, no server): which entity's quota applies (Kafka's order), the
windowed rate and the throttle time it gives, checks on changes, and the quota file surviving a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqk.broker.quotas import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    USER,
    ClientQuotas,
    QuotaError,
    entity_of,
)
from mqk.clock import FakeClock


async def test_the_most_specific_entity_that_sets_a_key_applies() -> None:
    quotas = ClientQuotas(FakeClock(), None)
    await quotas.alter(entity_of([(CLIENT_ID, None)]), [(PRODUCER_BYTE_RATE, 100, False)])
    await quotas.alter(entity_of([(USER, None)]), [(PRODUCER_BYTE_RATE, 200, False)])
    await quotas.alter(entity_of([(USER, "alice")]), [(CONSUMER_BYTE_RATE, 300, False)])
    await quotas.alter(entity_of([(USER, "alice"), (CLIENT_ID, "app")]), [(PRODUCER_BYTE_RATE, 400, False)])
    assert quotas.quota_for(PRODUCER_BYTE_RATE, "alice", "app") == (400, ((USER, "alice"), (CLIENT_ID, "app")))
    # alice's other clients: /users/alice sets no producer rate, so the default user's applies, to alice alone
    assert quotas.quota_for(PRODUCER_BYTE_RATE, "alice", "other") == (200, ((USER, "alice"),))
    assert quotas.quota_for(CONSUMER_BYTE_RATE, "alice", "other") == (300, ((USER, "alice"),))
    assert quotas.quota_for(CONSUMER_BYTE_RATE, "bob", "x") is None
    await quotas.alter(entity_of([(USER, None)]), [(PRODUCER_BYTE_RATE, 0, True)])
    assert quotas.quota_for(PRODUCER_BYTE_RATE, "bob", "x") == (100, ((CLIENT_ID, "x"),))


async def test_over_the_rate_a_client_is_throttled_in_proportion() -> None:
    clock = FakeClock()
    quotas = ClientQuotas(clock, None)
    await quotas.alter(entity_of([(CLIENT_ID, "c")]), [(PRODUCER_BYTE_RATE, 1000, False)])
    # a first burst is measured over one second: one second's worth is exactly the quota
    assert quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "c", 1000).ms == 0
    throttle = quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "c", 1000)
    assert throttle.ms == 1000  # twice the quota over one second: wait one more second
    assert quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "other", 10**9).ms == 0  # no quota for this client
    await clock.advance(11)  # the window has passed: the rate starts afresh
    assert quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "c", 500).ms == 0
    big = quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "c", 10**9)
    assert big.ms == 11_000  # never more than the whole window
    quotas.unrecord(big, 10**9)
    assert quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "c", 100).ms == 0


def test_changes_are_checked() -> None:
    quotas = ClientQuotas(FakeClock(), None)
    with pytest.raises(QuotaError, match="not supported"):
        entity_of([("ip", "1.2.3.4")])
    with pytest.raises(QuotaError, match="twice"):
        entity_of([(USER, "a"), (USER, "b")])
    with pytest.raises(QuotaError, match="empty user"):
        entity_of([(USER, "")])
    entity = entity_of([(USER, "a")])
    with pytest.raises(QuotaError, match="request_percentage"):
        quotas.check(entity, [("request_percentage", 50, False)])
    with pytest.raises(QuotaError, match="positive"):
        quotas.check(entity, [(PRODUCER_BYTE_RATE, -1, False)])
    with pytest.raises(QuotaError, match="twice"):
        quotas.check(entity, [(PRODUCER_BYTE_RATE, 1, False), (PRODUCER_BYTE_RATE, 2, False)])
    assert not quotas.active


async def test_quotas_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "security" / "client-quotas.json"
    quotas = ClientQuotas(FakeClock(), path)
    await quotas.alter(entity_of([(USER, None), (CLIENT_ID, "app")]), [(CONSUMER_BYTE_RATE, 5e6, False)])
    again = ClientQuotas(FakeClock(), path)
    again.load()
    assert again.entries() == {((USER, None), (CLIENT_ID, "app")): {CONSUMER_BYTE_RATE: 5e6}}
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
