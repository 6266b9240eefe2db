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
        }

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
