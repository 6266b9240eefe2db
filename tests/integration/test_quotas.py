"""Client quotas over real sockets: AlterClientQuotas / DescribeClientQuotas (filters, strict, refusals,
validate_only), and a producer and a consumer over their byte rates answered with throttle_time_ms (a throttled
Fetch empty), their connections still served once the throttle time is over. Nothing is timed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from helpers import fetch_body, memory_kafka, produce_body

from mqk import errors as E
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient, make_batch
from mqk.server.kafka.server import KafkaServer

RATE = 10_000


@pytest.fixture
async def server() -> AsyncIterator[KafkaServer]:
    async with memory_kafka() as kafka:
        yield kafka


def _entry(entity: list[tuple[str, str | None]], *ops: tuple[str, float, bool]) -> dict[str, Any]:
    return {
        "entity": [{"entity_type": kind, "entity_name": name} for kind, name in entity],
        "ops": [{"key": key, "value": value, "remove": remove} for key, value, remove in ops],
    }


async def _describe(client: RawKafkaClient, components: list[dict[str, Any]], strict: bool = False) -> Any:
    answer = await client.call(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, {"components": components, "strict": strict})
    assert answer["error_code"] == 0, answer
    return [({e["entity_type"]: e["entity_name"] for e in x["entity"]}, x["values"]) for x in answer["entries"]]


async def test_alter_and_describe_client_quotas(server: KafkaServer) -> None:
    async with await RawKafkaClient.connect(server.host, server.port, "admin") as client:
        answer = await client.call(
            ApiKey.ALTER_CLIENT_QUOTAS,
            1,
            {
                "validate_only": False,
                "entries": [
                    _entry([("client-id", "app")], ("producer_byte_rate", 1e6, False)),
                    _entry([("user", None)], ("consumer_byte_rate", 2e6, False)),
                    _entry([("ip", "127.0.0.1")], ("connection_creation_rate", 5, False)),
                    _entry([("user", "alice")], ("request_percentage", 50, False)),
                ],
            },
        )
        codes = [e["error_code"] for e in answer["entries"]]
        assert codes == [0, 0, E.InvalidRequestError.code, E.InvalidRequestError.code]
        assert await _describe(client, []) == [
            ({"client-id": "app"}, [{"key": "producer_byte_rate", "value": 1e6}]),
            ({"user": None}, [{"key": "consumer_byte_rate", "value": 2e6}]),
        ]
        exact = {"entity_type": "client-id", "match_type": 0, "match": "app"}
        assert [e for e, _v in await _describe(client, [exact])] == [{"client-id": "app"}]
        default_user = {"entity_type": "user", "match_type": 1, "match": None}
        assert [e for e, _v in await _describe(client, [default_user], strict=True)] == [{"user": None}]
        named_user = {"entity_type": "user", "match_type": 2, "match": None}
        assert await _describe(client, [named_user]) == []
        # validate_only checks and changes nothing; a removal empties the entity
        body = {"validate_only": True, "entries": [_entry([("client-id", "app")], ("producer_byte_rate", 0, True))]}
        assert (await client.call(ApiKey.ALTER_CLIENT_QUOTAS, 1, body))["entries"][0]["error_code"] == 0
        assert len(await _describe(client, [exact])) == 1
        body["validate_only"] = False
        assert (await client.call(ApiKey.ALTER_CLIENT_QUOTAS, 1, body))["entries"][0]["error_code"] == 0
        assert await _describe(client, [exact]) == []


async def test_clients_over_their_byte_rates_are_throttled(server: KafkaServer) -> None:
    async with await RawKafkaClient.connect(server.host, server.port, "admin") as admin:
        body = {
            "validate_only": False,
            "entries": [
                _entry([("client-id", "slow-producer")], ("producer_byte_rate", RATE, False)),
                _entry([("client-id", "slow-consumer")], ("consumer_byte_rate", RATE, False)),
            ],
        }
        assert [e["error_code"] for e in (await admin.call(ApiKey.ALTER_CLIENT_QUOTAS, 1, body))["entries"]] == [0, 0]
        # a client without a quota is never throttled, whatever it sends
        answer = await admin.call(ApiKey.PRODUCE, 9, produce_body("fed", make_batch([b"f" * 8_000])))
        assert answer["throttle_time_ms"] == 0 and answer["responses"][0]["partition_responses"][0]["error_code"] == 0

    async with await RawKafkaClient.connect(server.host, server.port, "slow-producer") as producer:
        # a first burst is measured over one second: just over one second's worth is throttled
        answer = await producer.call(ApiKey.PRODUCE, 9, produce_body("q", make_batch([b"p" * (RATE + 2000)])))
        assert answer["responses"][0]["partition_responses"][0]["error_code"] == 0  # stored, then throttled
        assert answer["throttle_time_ms"] > 0
        # muted for the throttle time, then served as before
        versions = await producer.call(
            ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}, 30
        )
        assert versions["error_code"] == 0

    async with await RawKafkaClient.connect(server.host, server.port, "slow-consumer") as consumer:
        first = await consumer.call(ApiKey.FETCH, 12, fetch_body("fed", 0))
        assert first["throttle_time_ms"] == 0 and first["responses"][0]["partitions"][0]["records"]
        again = await consumer.call(ApiKey.FETCH, 12, fetch_body("fed", 0))  # the same 8 KB again: over the rate now
        assert again["throttle_time_ms"] > 0 and again["responses"] == []  # answered empty, as Kafka does
    assert server.ctx.quotas is not None and server.ctx.quotas.throttled == 2
