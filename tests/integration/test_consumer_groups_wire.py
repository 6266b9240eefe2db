"""KIP-848 consumer groups on the wire, through mqk's own codec and a raw client against a KafkaServer: what the
real-client tests (compat/test_consumer_protocol_clients.py) do not reach. ApiVersions lists the two APIs; a heartbeat
joins and ConsumerGroupDescribe, ListGroups v5 (group types) and DescribeGroups (the classic view) show the group;
classic and consumer members do not mix in one group; OffsetCommit and OffsetFetch v9 check the member epoch;
DeleteGroups refuses a group with members; and a malformed heartbeat costs only its connection."""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from helpers import memory_kafka

from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient
from mqk.server.kafka.server import KafkaServer

INCONSISTENT_GROUP_PROTOCOL, NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND, STALE_MEMBER_EPOCH = 23, 68, 69, 113


@pytest.fixture
async def server() -> AsyncIterator[KafkaServer]:
    async with memory_kafka() as kafka:
        await kafka.store.create_topic("orders", 3)
        yield kafka


async def heartbeat(client: RawKafkaClient, member: str, epoch: int, **fields: Any) -> dict[str, Any]:
    return await client.call(
        ApiKey.CONSUMER_GROUP_HEARTBEAT,
        1,
        {
            "group_id": "g",
            "member_id": member,
            "member_epoch": epoch,
            "rebalance_timeout_ms": 30_000 if epoch == 0 else -1,
            "subscribed_topic_names": ["orders"] if epoch == 0 else None,
            "topic_partitions": [] if epoch == 0 else None,
            **fields,
        },
    )


async def classic_join(client: RawKafkaClient, member_id: str) -> dict[str, Any]:
    """A classic JoinGroup v7 for group "g" (the "range" protocol, no metadata)."""
    return await client.call(
        ApiKey.JOIN_GROUP,
        7,
        {
            "group_id": "g",
            "session_timeout_ms": 10_000,
            "rebalance_timeout_ms": 10_000,
            "member_id": member_id,
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
            "reason": None,
        },
    )


async def test_a_consumer_group_on_the_wire(server: KafkaServer) -> None:
    client = await RawKafkaClient.connect(server.host, server.port)
    try:
        versions = await client.call(
            ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}
        )
        listed = {k["api_key"]: (k["min_version"], k["max_version"]) for k in versions["api_keys"]}
        assert listed[ApiKey.CONSUMER_GROUP_HEARTBEAT] == (0, 1) and listed[ApiKey.CONSUMER_GROUP_DESCRIBE] == (0, 1)

        joined = await heartbeat(client, "m1", 0)
        assert joined["error_code"] == 0 and joined["member_epoch"] > 0 and joined["heartbeat_interval_ms"] == 5000
        topic_id = uuid.UUID(bytes=bytes(server.ctx.topics.get("orders").topic_id))  # type: ignore[union-attr]
        assert joined["assignment"]["topic_partitions"] == [{"topic_id": topic_id, "partitions": [0, 1, 2]}]
        epoch = joined["member_epoch"]

        described = await client.call(ApiKey.CONSUMER_GROUP_DESCRIBE, 1, {"group_ids": ["g", "nope"]})
        group, missing = described["groups"]
        assert group["group_state"] == "Stable" and group["assignor_name"] == "uniform"
        member = group["members"][0]
        assert member["member_id"] == "m1" and member["member_epoch"] == epoch
        assert member["assignment"]["topic_partitions"][0]["topic_name"] == "orders"
        assert missing["error_code"] == GROUP_ID_NOT_FOUND

        groups = await client.call(ApiKey.LIST_GROUPS, 5, {"states_filter": [], "types_filter": []})
        assert [(g["group_id"], g["group_type"], g["protocol_type"]) for g in groups["groups"]] == [
            ("g", "consumer", "consumer")
        ]
        classic_only = await client.call(ApiKey.LIST_GROUPS, 5, {"states_filter": [], "types_filter": ["classic"]})
        assert classic_only["groups"] == []
        old = await client.call(ApiKey.DESCRIBE_GROUPS, 5, {"groups": ["g"], "include_authorized_operations": False})
        classic_view = old["groups"][0]
        assert classic_view["protocol_type"] == "consumer" and classic_view["protocol_data"] == "uniform"
        assignment = bytes(classic_view["members"][0]["member_assignment"])
        assert assignment[:6] == struct.pack(">hi", 0, 1) and b"orders" in assignment

        # a classic member cannot join it while it has members
        join = await classic_join(client, "")
        assert join["error_code"] == INCONSISTENT_GROUP_PROTOCOL

        def commit_body(member_epoch: int) -> dict[str, Any]:
            return {
                "group_id": "g",
                "generation_id_or_member_epoch": member_epoch,
                "member_id": "m1",
                "group_instance_id": None,
                "topics": [
                    {
                        "name": "orders",
                        "partitions": [
                            {
                                "partition_index": 0,
                                "committed_offset": 5,
                                "committed_leader_epoch": -1,
                                "committed_metadata": "",
                            }
                        ],
                    }
                ],
            }

        stale = await client.call(ApiKey.OFFSET_COMMIT, 9, commit_body(epoch - 1))
        assert stale["topics"][0]["partitions"][0]["error_code"] == STALE_MEMBER_EPOCH
        ok = await client.call(ApiKey.OFFSET_COMMIT, 9, commit_body(epoch))
        assert ok["topics"][0]["partitions"][0]["error_code"] == 0

        def fetch_body(member_epoch: int) -> dict[str, Any]:
            return {
                "groups": [
                    {
                        "group_id": "g",
                        "member_id": "m1",
                        "member_epoch": member_epoch,
                        "topics": [{"name": "orders", "partition_indexes": [0]}],
                    }
                ],
                "require_stable": False,
            }

        fetched = await client.call(ApiKey.OFFSET_FETCH, 9, fetch_body(epoch))
        assert fetched["groups"][0]["topics"][0]["partitions"][0]["committed_offset"] == 5
        assert (await client.call(ApiKey.OFFSET_FETCH, 9, fetch_body(epoch - 1)))["groups"][0][
            "error_code"
        ] == STALE_MEMBER_EPOCH

        deleted = await client.call(ApiKey.DELETE_GROUPS, 2, {"groups_names": ["g"]})
        assert deleted["results"][0]["error_code"] == NON_EMPTY_GROUP
        left = await heartbeat(client, "m1", -1)
        assert left["error_code"] == 0 and left["member_epoch"] == -1
        deleted = await client.call(ApiKey.DELETE_GROUPS, 2, {"groups_names": ["g"]})
        assert deleted["results"][0]["error_code"] == 0
    finally:
        await client.close()


async def test_a_classic_group_with_members_refuses_consumer_members(server: KafkaServer) -> None:
    client = await RawKafkaClient.connect(server.host, server.port)
    try:
        join = await classic_join(client, "")
        member_id = join["member_id"]
        join = await classic_join(client, member_id)
        assert join["error_code"] == 0
        refused = await heartbeat(client, "m1", 0)
        assert refused["error_code"] == GROUP_ID_NOT_FOUND
    finally:
        await client.close()


async def test_a_malformed_heartbeat_costs_its_connection_only(server: KafkaServer) -> None:
    reader, writer = await asyncio.open_connection(server.host, server.port)
    # ConsumerGroupHeartbeat v1, flexible header, then a body that ends in the middle of the group id
    header = struct.pack(">hhi", ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, 9) + struct.pack(">h", 1) + b"c" + b"\x00"
    body = b"\x10abc"
    writer.write(struct.pack(">i", len(header) + len(body)) + header + body)
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, nothing answered
    writer.close()
    client = await RawKafkaClient.connect(server.host, server.port)
    try:
        assert (await heartbeat(client, "m2", 0))["error_code"] == 0  # the broker serves on
    finally:
        await client.close()
