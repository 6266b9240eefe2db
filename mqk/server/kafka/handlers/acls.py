"""CreateAcls, DescribeAcls and DeleteAcls (v1 and up): the broker's ACL bindings (mqk.broker.security.acls).

As in Kafka:
- with no authorizer configured every answer is SECURITY_DISABLED;
- describing asks DESCRIBE on the cluster, creating and deleting ALTER on the cluster (CLUSTER_AUTHORIZATION_FAILED
  otherwise: DescribeAcls as a whole, CreateAcls and DeleteAcls for each creation or filter);
- a creation Kafka would refuse (an ANY or MATCH pattern, an ANY operation or permission, a principal not
  TYPE:NAME, a CLUSTER resource not named kafka-cluster, ...) is INVALID_REQUEST with the reason, the others of
  the request are created; a filter with an UNKNOWN field is INVALID_REQUEST;
- DescribeAcls answers the matching bindings grouped by resource pattern; DeleteAcls answers, per filter, the
  bindings it removed (a binding two filters match is removed once and listed under both).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqk import errors as E
from mqk.broker.security import Security
from mqk.broker.security.acls import (
    OPERATION_CODES,
    PATTERN_CODES,
    PERMISSION_CODES,
    RESOURCE_CODES,
    AclAuthorizer,
    AclBinding,
    binding_from_codes,
    filter_from_codes,
)
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import NONE, allowed_cluster

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
    from mqk.protocol.kafka.messages.create_acls import (
        CreateAclsRequest,
        CreateAclsResponse,
        CreateAclsResponseAclCreationResult,
    )
    from mqk.protocol.kafka.messages.delete_acls import (
        DeleteAclsFilterResult,
        DeleteAclsMatchingAcl,
        DeleteAclsRequest,
        DeleteAclsResponse,
    )
    from mqk.protocol.kafka.messages.describe_acls import (
        DescribeAclsRequest,
        DescribeAclsResource,
        DescribeAclsResponse,
    )

_DISABLED = "no authorizer is configured on the broker (authorizer = true)"


def _security(ctx: KafkaContext) -> Security | None:
    """The broker's security services when its ACL authorizer is on (None: ACLs are off)."""
    security = ctx.security
    if security is None or not isinstance(security.authorizer, AclAuthorizer):
        return None
    return security


async def describe_acls(ctx: KafkaContext, peer: Peer, req: KafkaRequest[DescribeAclsRequest]) -> DescribeAclsResponse:
    def refused(code: int, message: str) -> DescribeAclsResponse:
        return {"throttle_time_ms": 0, "error_code": code, "error_message": message, "resources": []}

    security = _security(ctx)
    if security is None:
        return refused(E.SecurityDisabledError.code, _DISABLED)
    if not allowed_cluster(ctx, peer, "DESCRIBE"):
        return refused(E.ClusterAuthorizationFailedError.code, "not authorized to describe ACLs")
    acl_filter = filter_from_codes(req.body)
    problem = acl_filter.problem()
    if problem is not None:
        return refused(E.InvalidRequestError.code, problem)
    resources: dict[tuple[str, str, str], DescribeAclsResource] = {}
    for b in security.acls.matching(acl_filter):
        resource = resources.get((b.resource_type, b.name, b.pattern_type))
        if resource is None:
            resource = resources[(b.resource_type, b.name, b.pattern_type)] = {
                "resource_type": RESOURCE_CODES[b.resource_type],
                "resource_name": b.name,
                "pattern_type": PATTERN_CODES[b.pattern_type],
                "acls": [],
            }
        resource["acls"].append(
            {
                "principal": b.principal,
                "host": b.host,
                "operation": OPERATION_CODES[b.operation],
                "permission_type": PERMISSION_CODES[b.permission],
            }
        )
    return {"throttle_time_ms": 0, "error_code": NONE, "error_message": None, "resources": list(resources.values())}


async def create_acls(ctx: KafkaContext, peer: Peer, req: KafkaRequest[CreateAclsRequest]) -> CreateAclsResponse:
    creations = req.body["creations"]
    security = _security(ctx)
    if security is None:
        return _create_answer([(E.SecurityDisabledError.code, _DISABLED)] * len(creations))
    if not allowed_cluster(ctx, peer, "ALTER"):
        refusal = (E.ClusterAuthorizationFailedError.code, "not authorized to create ACLs")
        return _create_answer([refusal] * len(creations))
    outcomes: list[tuple[int, str | None]] = []
    valid: list[tuple[int, AclBinding]] = []
    for creation in creations:
        binding = binding_from_codes(creation)
        problem = binding.problem()
        if problem is not None:
            outcomes.append((E.InvalidRequestError.code, problem))
        else:
            valid.append((len(outcomes), binding))
            outcomes.append((NONE, None))
    if valid:
        try:
            await security.acls.change(add=[b for _i, b in valid])
        except (E.MqkError, OSError) as exc:  # every creation of the request shares the store's answer
            for i, _b in valid:
                outcomes[i] = (E.kafka_code_for(exc), str(exc))
    return _create_answer(outcomes)


def _create_answer(outcomes: list[tuple[int, str | None]]) -> CreateAclsResponse:
    results: list[CreateAclsResponseAclCreationResult] = [
        {"error_code": code, "error_message": message} for code, message in outcomes
    ]
    return {"throttle_time_ms": 0, "results": results}


def _matching(b: AclBinding) -> DeleteAclsMatchingAcl:
    return {
        "error_code": NONE,
        "error_message": None,
        "resource_type": RESOURCE_CODES[b.resource_type],
        "resource_name": b.name,
        "pattern_type": PATTERN_CODES[b.pattern_type],
        "principal": b.principal,
        "host": b.host,
        "operation": OPERATION_CODES[b.operation],
        "permission_type": PERMISSION_CODES[b.permission],
    }


async def delete_acls(ctx: KafkaContext, peer: Peer, req: KafkaRequest[DeleteAclsRequest]) -> DeleteAclsResponse:
    filters = req.body["filters"]

    def refused(code: int, message: str | None) -> DeleteAclsFilterResult:
        return {"error_code": code, "error_message": message, "matching_acls": []}

    security = _security(ctx)
    if security is None:
        return {
            "throttle_time_ms": 0,
            "filter_results": [refused(E.SecurityDisabledError.code, _DISABLED)] * len(filters),
        }
    if not allowed_cluster(ctx, peer, "ALTER"):
        refusal = refused(E.ClusterAuthorizationFailedError.code, "not authorized to delete ACLs")
        return {"throttle_time_ms": 0, "filter_results": [refusal] * len(filters)}
    results: list[DeleteAclsFilterResult] = []
    removed: set[AclBinding] = set()
    for fields in filters:
        acl_filter = filter_from_codes(fields)
        problem = acl_filter.problem()
        if problem is not None:
            results.append(refused(E.InvalidRequestError.code, problem))
            continue
        matched = security.acls.matching(acl_filter)
        removed.update(matched)
        results.append({"error_code": NONE, "error_message": None, "matching_acls": [_matching(b) for b in matched]})
    if removed:
        try:
            await security.acls.change(remove=removed)
        except (E.MqkError, OSError) as exc:  # nothing was removed: every filter that matched says why
            code = E.kafka_code_for(exc)
            results = [refused(code, str(exc)) if r["matching_acls"] else r for r in results]
    return {"throttle_time_ms": 0, "filter_results": results}
