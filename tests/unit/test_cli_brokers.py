"""The `mqk` admin commands' routing (mqk.cli_admin.Brokers) without a broker: a group's request is asked again of
its coordinator while the answer is one Kafka's admin client retries (the group's offsets loading, no coordinator
now, another one now), and not after any other answer."""

from __future__ import annotations

import argparse
from typing import Any

from mqk.cli_admin import Brokers
from mqk.protocol.kafka.api import ApiKey


class Answers:
    """A connection that answers DescribeGroups with the next of `codes` (then 0), counting the calls."""

    def __init__(self, codes: list[int]) -> None:
        self.codes = codes
        self.calls = 0

    async def call(self, api: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        assert api == ApiKey.DESCRIBE_GROUPS
        self.calls += 1
        code = self.codes.pop(0) if self.codes else 0
        return {"groups": [{"group_id": body["groups"][0], "error_code": code}]}


class Routed(Brokers):
    pause_s = 0.0

    def __init__(self, client: Answers) -> None:
        super().__init__(argparse.Namespace(bootstrap="127.0.0.1:9092"), client)  # type: ignore[arg-type]
        self.client = client
        self.found = 0

    async def coordinator(self, group: str, key_type: int = 0) -> Any:
        self.found += 1
        return self.client


async def ask(codes: list[int]) -> tuple[int, int, int]:
    routed = Routed(Answers(codes))
    _client, resp = await routed.at_coordinator(
        "g", ApiKey.DESCRIBE_GROUPS, 5, {"groups": ["g"]}, lambda r: r["groups"][0]["error_code"]
    )
    return resp["groups"][0]["error_code"], routed.client.calls, routed.found


async def test_a_coordinator_loading_or_moving_is_asked_again_and_other_errors_are_answered_at_once() -> None:
    assert await ask([14, 16, 15]) == (0, 4, 4)  # loading, moved, none: found again and asked again each time
    assert await ask([25]) == (25, 1, 1)  # UNKNOWN_MEMBER_ID is the answer
    assert await ask([14] * 100) == (14, 20, 20)  # bounded: the last answer is the command's
