"""Share groups on the wire, through mqk's codec and a raw client against a KafkaServer: share sessions and their
epochs (SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH), acknowledgements carried by a fetch and of records a
member does not hold (INVALID_RECORD_STATE), a released record delivered again, ListGroups' share type and
ShareGroupDescribe. The real client's view: compat/test_share_groups_clients.py."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from helpers import memory_kafka

from mqk.groups.share import INVALID_RECORD_STATE
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient, make_batch
from mqk.server.kafka.server import KafkaServer

ACCEPT, RELEASE = 1, 2
GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, UNKNOWN_TOPIC_OR_PARTITION, OFFSET_OUT_OF_RANGE = 69, 68, 3, 1


def fetch_body(
    topic_id: uuid.UUID, member: str, epoch: int, acks: list[dict[str, Any]] | None = None, **fields: Any
) -> dict[str, Any]:
    """A ShareFetch of partition 0 of the topic for member `member` of share group "sg" (100 records, no wait)."""
    return {
        "group_id": "sg",
        "member_id": member,
        "share_session_epoch": epoch,
        "max_wait_ms": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "max_records": 100,
        "batch_size": 100,
        "topics": [
            {"topic_id": topic_id, "partitions": [{"partition_index": 0, "acknowledgement_batches": acks or []}]}
        ],
        "forgotten_topics_data": [],
        **fields,
    }


@pytest.fixture
async def server() -> AsyncIterator[KafkaServer]:
    async with memory_kafka(group_share_auto_offset_reset="earliest") as kafka:
        await kafka.store.create_topic("jobs", 1)
        await kafka.store.append("jobs", 0, [make_batch([b"a", b"b", b"c"])])
        yield kafka


async def test_share_sessions_on_the_wire(server: KafkaServer) -> None:
    client = await RawKafkaClient.connect(server.host, server.port)
    topic_id = uuid.UUID(bytes=bytes(server.ctx.topics.get("jobs").topic_id))  # type: ignore[union-attr]

    def fetch(epoch: int, acks: list[dict[str, Any]] | None = None, member: str = "m1") -> dict[str, Any]:
        return fetch_body(topic_id, member, epoch, acks)

    try:
        versions = await client.call(
            ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}
        )
        listed = {k["api_key"]: (k["min_version"], k["max_version"]) for k in versions["api_keys"]}
        assert listed[ApiKey.SHARE_FETCH] == (1, 2) and listed[ApiKey.SHARE_GROUP_HEARTBEAT] == (1, 1)
        assert (await client.call(ApiKey.SHARE_FETCH, 1, fetch(0)))["error_code"] == 25  # not a member yet
        hb = await client.call(
            ApiKey.SHARE_GROUP_HEARTBEAT,
            1,
            {"group_id": "sg", "member_id": "m1", "member_epoch": 0, "subscribed_topic_names": ["jobs"]},
        )
        assert hb["error_code"] == 0
        assert (await client.call(ApiKey.SHARE_FETCH, 1, fetch(3)))["error_code"] == 122  # SHARE_SESSION_NOT_FOUND
        first = await client.call(ApiKey.SHARE_FETCH, 1, fetch(0))
        part = first["responses"][0]["partitions"][0]
        assert (
            part["acquired_records"] == [{"first_offset": 0, "last_offset": 2, "delivery_count": 1}] and part["records"]
        )
        assert (await client.call(ApiKey.SHARE_FETCH, 1, fetch(5)))["error_code"] == 123  # INVALID_SHARE_SESSION_EPOCH
        acks = [{"first_offset": 0, "last_offset": 2, "acknowledge_types": [ACCEPT, RELEASE, ACCEPT]}]
        second = await client.call(ApiKey.SHARE_FETCH, 1, fetch(1, acks))
        part = second["responses"][0]["partitions"][0]
        assert part["acknowledge_error_code"] == 0
        assert part["acquired_records"] == [{"first_offset": 1, "last_offset": 1, "delivery_count": 2}]
        wrong = await client.call(
            ApiKey.SHARE_ACKNOWLEDGE,
            1,
            {
                "group_id": "sg",
                "member_id": "m1",
                "share_session_epoch": 2,
                "topics": [
                    {
                        "topic_id": topic_id,
                        "partitions": [
                            {
                                "partition_index": 0,
                                "acknowledgement_batches": [
                                    {"first_offset": 0, "last_offset": 0, "acknowledge_types": [ACCEPT]}
                                ],
                            }
                        ],
                    }
                ],
            },
        )
        assert wrong["responses"][0]["partitions"][0]["error_code"] == INVALID_RECORD_STATE  # 0 is done already
        groups = await client.call(ApiKey.LIST_GROUPS, 5, {"states_filter": [], "types_filter": ["share"]})
        assert [(g["group_id"], g["group_type"]) for g in groups["groups"]] == [("sg", "share")]
        described = await client.call(
            ApiKey.SHARE_GROUP_DESCRIBE, 1, {"group_ids": ["sg"], "include_authorized_operations": False}
        )
        member = described["groups"][0]["members"][0]
        assert member["member_id"] == "m1" and member["assignment"]["topic_partitions"][0]["topic_name"] == "jobs"
    finally:
        await client.close()


async def test_the_admin_describes_resets_and_deletes_a_share_groups_offsets(server: KafkaServer) -> None:
    client = await RawKafkaClient.connect(server.host, server.port)
    info = server.store.topic("jobs")
    assert info is not None
    topic_id = uuid.UUID(bytes=bytes(info.topic_id))

    async def heartbeat(epoch: int) -> dict:
        body = {"group_id": "sg", "member_id": "m1", "member_epoch": epoch, "subscribed_topic_names": ["jobs"]}
        return await client.call(ApiKey.SHARE_GROUP_HEARTBEAT, 1, body)

    async def describe(topics: list | None) -> dict:
        answer = await client.call(
            ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1, {"groups": [{"group_id": "sg", "topics": topics}]}
        )
        return answer["groups"][0]

    def alter(start: int) -> dict:
        partitions = [{"partition_index": 0, "start_offset": start}]
        return {"group_id": "sg", "topics": [{"topic_name": "jobs", "partitions": partitions}]}

    try:
        unknown = await describe(None)
        assert unknown["error_code"] == GROUP_ID_NOT_FOUND
        # a member takes the three records and accepts the first: the SPSO moves to 1, two records lag
        assert (await heartbeat(0))["error_code"] == 0
        fetch = fetch_body(topic_id, "m1", 0)
        await client.call(ApiKey.SHARE_FETCH, 1, fetch)
        acks = [{"first_offset": 0, "last_offset": 0, "acknowledge_types": [ACCEPT]}]
        fetch["share_session_epoch"] = 1
        fetch["topics"][0]["partitions"][0]["acknowledgement_batches"] = acks
        fetch["max_records"] = 0
        await client.call(ApiKey.SHARE_FETCH, 1, fetch)
        described = await describe(None)
        row = described["topics"][0]["partitions"][0]
        assert described["topics"][0]["topic_name"] == "jobs"
        assert (row["start_offset"], row["lag"], row["error_code"]) == (1, 2, 0)
        named = await describe(
            [{"topic_name": "jobs", "partitions": [0, 7]}, {"topic_name": "nope", "partitions": [0]}]
        )
        rows = {(t["topic_name"], p["partition_index"]): p for t in named["topics"] for p in t["partitions"]}
        assert rows[("jobs", 7)]["error_code"] == rows[("nope", 0)]["error_code"] == UNKNOWN_TOPIC_OR_PARTITION
        # a group with a member is not reset, nor are its offsets deleted
        assert (await client.call(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, alter(0)))["error_code"] == NON_EMPTY_GROUP
        delete = {"group_id": "sg", "topics": [{"topic_name": "jobs"}]}
        assert (await client.call(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, delete))["error_code"] == NON_EMPTY_GROUP
        assert (await heartbeat(-1))["error_code"] == 0
        # empty: reset to 0 (every record again), an offset past the log's end is out of range
        out = await client.call(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, alter(99))
        assert out["error_code"] == 0 and out["responses"][0]["partitions"][0]["error_code"] == OFFSET_OUT_OF_RANGE
        reset = await client.call(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, alter(0))
        assert reset["responses"][0]["partitions"][0]["error_code"] == 0
        row = (await describe(None))["topics"][0]["partitions"][0]
        assert (row["start_offset"], row["lag"]) == (0, 3)
        deleted = await client.call(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, delete)
        assert deleted["error_code"] == 0 and deleted["responses"][0]["error_code"] == 0
        row = (await describe([{"topic_name": "jobs", "partitions": [0]}]))["topics"][0]["partitions"][0]
        assert (row["start_offset"], row["error_code"]) == (-1, 0)  # no state: the next fetch starts it afresh
    finally:
        await client.close()


async def test_batch_optimised_fetches_acquire_whole_batches_and_record_limit_ones_max_records() -> None:
    """KIP-1206: in the batch-optimised mode (v1's only one, v2's default) `max_records` is soft, a stored batch
    begun is acquired to its end; in v2's record-limit mode it is a hard limit and the batch's rest stays for the
    next fetch. An unknown mode is an invalid request, and nothing of it is applied."""
    async with memory_kafka(group_share_auto_offset_reset="earliest") as kafka:
        await kafka.store.create_topic("jobs", 1)
        await kafka.store.append("jobs", 0, [make_batch([b"%d" % i for i in range(10)])])
        await kafka.store.append("jobs", 0, [make_batch([b"%d" % i for i in range(10, 20)])])
        client = await RawKafkaClient.connect(kafka.host, kafka.port)
        topic_id = uuid.UUID(bytes=bytes(kafka.ctx.topics.get("jobs").topic_id))  # type: ignore[union-attr]

        async def fetch(version: int, member: str, epoch: int, **fields: Any) -> dict[str, Any]:
            body = fetch_body(topic_id, member, epoch, max_records=3, batch_size=3, **fields)
            return await client.call(ApiKey.SHARE_FETCH, version, body)

        def acquired(answer: dict[str, Any]) -> list[tuple[int, int]]:
            ranges = answer["responses"][0]["partitions"][0]["acquired_records"] if answer["responses"] else []
            return [(r["first_offset"], r["last_offset"]) for r in ranges]

        try:
            for member in ("whole", "limited", "odd"):
                hb = await client.call(
                    ApiKey.SHARE_GROUP_HEARTBEAT,
                    1,
                    {"group_id": "sg", "member_id": member, "member_epoch": 0, "subscribed_topic_names": ["jobs"]},
                )
                assert hb["error_code"] == 0
            odd = await fetch(2, "odd", 0, share_acquire_mode=7)
            assert odd["error_code"] == 42 and kafka.ctx.groups.share.sessions.get(("sg", "odd")) is None
            assert acquired(await fetch(2, "limited", 0, share_acquire_mode=1)) == [(0, 2)]
            assert acquired(await fetch(1, "whole", 0)) == [(3, 9)]  # the first batch's rest, not 3 of it
            assert acquired(await fetch(2, "limited", 1, share_acquire_mode=1)) == [(10, 12)]
            assert acquired(await fetch(2, "limited", 2, share_acquire_mode=0)) == [(13, 19)]  # to the batch's end
        finally:
            await client.close()


async def test_a_batch_optimised_fetch_starts_a_new_acquired_range_at_a_batch_once_batch_size_is_reached() -> None:
    """Kafka's acquired ranges in the batch-optimised mode: one range grows over stored batches until it holds
    `batch_size` records; the next starts at the next stored batch. The record-limit mode has no such split."""
    async with memory_kafka(group_share_auto_offset_reset="earliest") as kafka:
        await kafka.store.create_topic("jobs", 1)
        for first in range(0, 50, 10):
            await kafka.store.append("jobs", 0, [make_batch([b"%d" % i for i in range(first, first + 10)])])
        client = await RawKafkaClient.connect(kafka.host, kafka.port)
        topic_id = uuid.UUID(bytes=bytes(kafka.ctx.topics.get("jobs").topic_id))  # type: ignore[union-attr]
        try:
            for member in ("split", "whole"):
                hb = await client.call(
                    ApiKey.SHARE_GROUP_HEARTBEAT,
                    1,
                    {"group_id": "sg", "member_id": member, "member_epoch": 0, "subscribed_topic_names": ["jobs"]},
                )
                assert hb["error_code"] == 0
            body = fetch_body(topic_id, "split", 0, max_records=25, batch_size=15)
            split = (await client.call(ApiKey.SHARE_FETCH, 1, body))["responses"][0]["partitions"][0]
            assert [(r["first_offset"], r["last_offset"]) for r in split["acquired_records"]] == [(0, 19), (20, 29)]
            body = fetch_body(topic_id, "whole", 0, max_records=20, batch_size=5, share_acquire_mode=1)
            limited = (await client.call(ApiKey.SHARE_FETCH, 2, body))["responses"][0]["partitions"][0]
            assert [(r["first_offset"], r["last_offset"]) for r in limited["acquired_records"]] == [(30, 49)]
        finally:
            await client.close()
