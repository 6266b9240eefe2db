"""DescribeClientQuotas and AlterClientQuotas: the broker's client quotas (mqk.broker.quotas), as Kafka's
`kafka-configs --entity-type users|clients` and the admin clients' describe/alterClientQuotas use them.

As in Kafka: describing asks DESCRIBE_CONFIGS on the cluster, altering ALTER_CONFIGS (the authorizer hook answers;
CLUSTER_AUTHORIZATION_FAILED otherwise). A describe filter's components match an entity type exactly (EXACT, 0), its
default (DEFAULT, 1) or any named entity (SPECIFIED, 2); `strict` asks for entities with exactly the filtered types.
An alteration's entity is checked (user and/or client-id, each once) and its ops (producer_byte_rate and
consumer_byte_rate, positive, each once): a refused entry gets INVALID_REQUEST and changes nothing; the others apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqk import errors as E
from mqk.broker.quotas import CLIENT_ID, USER, ClientQuotas, Entity, QuotaError, entity_of
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import NONE, allowed_cluster

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
    from mqk.protocol.kafka.messages.alter_client_quotas import (
        AlterClientQuotasRequest,
        AlterClientQuotasResponse,
        AlterClientQuotasResponseEntryData,
    )
    from mqk.protocol.kafka.messages.describe_client_quotas import (
        DescribeClientQuotasRequest,
        DescribeClientQuotasRequestComponentData,
        DescribeClientQuotasResponse,
        DescribeClientQuotasResponseEntryData,
    )

#: Kafka's ACL operations for quota configs (AclOperation names)
DESCRIBE_CONFIGS, ALTER_CONFIGS = "DESCRIBE_CONFIGS", "ALTER_CONFIGS"
EXACT, DEFAULT, SPECIFIED = 0, 1, 2
#: entity types Kafka knows; mqk sets quotas on user and client-id only (an `ip` filter matches nothing)
_KNOWN_TYPES = (USER, CLIENT_ID, "ip")


def _quotas(ctx: KafkaContext) -> ClientQuotas:
    assert ctx.quotas is not None, "the Kafka context is built with the broker's quotas"
    return ctx.quotas


def _matches(entity: Entity, components: list[DescribeClientQuotasRequestComponentData], strict: bool) -> bool:
    names = dict(entity)
    for c in components:
        kind = c["entity_type"]
        if kind not in names:
            return False
        name = names[kind]
        match_type = c["match_type"]
        if match_type == EXACT and name != c["match"]:
            return False
        if match_type == DEFAULT and name is not None:
            return False
        if match_type == SPECIFIED and name is None:
            return False
    return not strict or len(names) == len(components)


async def describe_client_quotas(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[DescribeClientQuotasRequest]
) -> DescribeClientQuotasResponse:
    def refuse(code: int, message: str) -> DescribeClientQuotasResponse:
        return {"throttle_time_ms": 0, "error_code": code, "error_message": message, "entries": None}

    if not allowed_cluster(ctx, peer, DESCRIBE_CONFIGS):
        return refuse(E.ClusterAuthorizationFailedError.code, "not authorized to describe client quotas")
    components = req.body["components"]
    kinds = [c["entity_type"] for c in components]
    if len(set(kinds)) != len(kinds):
        return refuse(E.InvalidRequestError.code, "an entity type is filtered more than once")
    unknown = [k for k in kinds if k not in _KNOWN_TYPES]
    if unknown:
        return refuse(E.InvalidRequestError.code, f"unknown entity type {unknown[0]!r}")
    for c in components:
        if c["match_type"] not in (EXACT, DEFAULT, SPECIFIED):
            return refuse(E.InvalidRequestError.code, f"unknown match type {c['match_type']}")
    entries: list[DescribeClientQuotasResponseEntryData] = []
    for entity, values in sorted(_quotas(ctx).entries().items(), key=lambda item: repr(item[0])):
        if _matches(entity, components, req.body["strict"]):
            entries.append(
                {
                    "entity": [{"entity_type": kind, "entity_name": name} for kind, name in entity],
                    "values": [{"key": key, "value": value} for key, value in sorted(values.items())],
                }
            )
    return {"throttle_time_ms": 0, "error_code": NONE, "error_message": None, "entries": entries}


async def alter_client_quotas(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[AlterClientQuotasRequest]
) -> AlterClientQuotasResponse:
    allowed = allowed_cluster(ctx, peer, ALTER_CONFIGS)
    quotas = _quotas(ctx)
    results: list[AlterClientQuotasResponseEntryData] = []
    for entry in req.body["entries"]:
        result: AlterClientQuotasResponseEntryData = {
            "error_code": NONE,
            "error_message": None,
            "entity": [{"entity_type": e["entity_type"], "entity_name": e["entity_name"]} for e in entry["entity"]],
        }
        results.append(result)
        if not allowed:
            result["error_code"] = E.ClusterAuthorizationFailedError.code
            result["error_message"] = "not authorized to alter client quotas"
            continue
        ops = [(op["key"], op["value"], op["remove"]) for op in entry["ops"]]
        try:
            entity = entity_of((e["entity_type"], e["entity_name"]) for e in entry["entity"])
            quotas.check(entity, ops)
            if not req.body["validate_only"]:
                await quotas.alter(entity, ops)
        except QuotaError as exc:
            result["error_code"] = E.InvalidRequestError.code
            result["error_message"] = str(exc)
        except OSError as exc:  # the quota file could not be written: the change is not kept
            result["error_code"] = E.KafkaStorageError.code
            result["error_message"] = f"cannot save the client quotas: {exc}"
        except E.MqkError as exc:  # cluster mode: etcd could not take it now
            result["error_code"] = E.kafka_code_for(exc)
            result["error_message"] = f"cannot save the client quotas: {exc}"
    return {"throttle_time_ms": 0, "entries": results}
