"""PullProcessor.get_messages against a model: whatever the tags, subscription, offset and batch size, a consumer
that follows nextBeginOffset sees exactly the matching messages, in order, once (memory StoreManager, no server)."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqk.config import BrokerConfig, StoreConfig
from mqk.protocol.native.codes import ResponseCode
from mqk.protocol.native.records import keys_of, message_to_batch, tags_code_for
from mqk.server.native.clients import ClientManager, parse_subscription
from mqk.server.native.context import BrokerContext
from mqk.server.native.pull import PullProcessor
from mqk.store.manager import StoreManager

TAGS = [None, "A", "B", "C"]


def test_parse_subscription() -> None:
    assert parse_subscription("*") is None and parse_subscription("") is None and parse_subscription(None) is None
    assert parse_subscription(" A || B ||") == frozenset({"A", "B"})


async def _run(tags: list[str | None], expression: str, start: int, max_nums: int, delete_to: int) -> None:
    store = StoreManager(StoreConfig(storage="memory"))
    await store.start()
    try:
        await store.create_topic("p", 1)
        for i, tag in enumerate(tags):
            props = {"TAGS": tag} if tag else {}
            await store.append(
                "p", 0, [message_to_batch(b"%d" % i, props, i)], tags_code=tags_code_for(props), keys=keys_of(props)
            )
        if delete_to:
            await store.delete_before("p", 0, delete_to)
        pull = PullProcessor(BrokerContext(BrokerConfig(), store), ClientManager(BrokerContext(BrokerConfig(), store)))
        wanted = parse_subscription(expression)
        low, high = delete_to, len(tags)
        expected = [i for i in range(max(start, low), high) if wanted is None or tags[i] in wanted]
        got: list[int] = []
        offset = start
        for _ in range(len(tags) + 5):
            result = await pull.get_messages("p", 0, offset, max_nums, wanted)
            assert result.min_offset == low and result.max_offset == high
            if result.code == ResponseCode.PULL_OFFSET_MOVED:
                assert offset < low or offset > high
                assert result.next_offset == (low if offset < low or low == 0 else high)
            elif result.code == ResponseCode.SUCCESS:
                assert 0 < len(result.messages) <= max_nums
                got += [m.queue_offset for m in result.messages]
                assert result.next_offset > result.messages[-1].queue_offset
            elif result.code == ResponseCode.PULL_RETRY_IMMEDIATELY:
                assert not result.messages and result.next_offset > offset
            else:
                assert result.code == ResponseCode.PULL_NOT_FOUND and offset == high == result.next_offset
                break
            offset = result.next_offset
        else:
            raise AssertionError("the consumer never reached the end of the queue")
        if start <= high:
            assert got == expected
    finally:
        await store.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tags=st.lists(st.sampled_from(TAGS), min_size=1, max_size=40),
    expression=st.sampled_from(["*", "A", "A || B", "D", "B||C"]),
    start=st.integers(0, 45),
    max_nums=st.integers(1, 8),
    delete_frac=st.floats(0, 0.5),
)
def test_following_next_offset_yields_exactly_the_matches(tags, expression, start, max_nums, delete_frac) -> None:
    delete_to = int(len(tags) * delete_frac)
    asyncio.run(_run(tags, expression, start, max_nums, delete_to))
