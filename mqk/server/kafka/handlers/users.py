"""DescribeUserScramCredentials and AlterUserScramCredentials: the broker's users (mqk.broker.security.users).

As in Kafka: describing asks DESCRIBE on the cluster, altering ALTER on the cluster (the authorizer hook answers;
CLUSTER_AUTHORIZATION_FAILED otherwise). A null or empty user list describes every user. An alteration carries the
salted password the client derived (salt, iterations, PBKDF2 output); the broker keeps only StoredKey and ServerKey
from it. Each user's changes are applied together, and each user gets its own answer:
- the same user and mechanism twice in one request: DUPLICATE_RESOURCE (nothing applied for that user);
- an empty user name, iterations outside [4096, 16384], an empty salt or salted password: UNACCEPTABLE_CREDENTIAL;
- a mechanism other than SCRAM-SHA-256 (1) and SCRAM-SHA-512 (2): UNSUPPORTED_SASL_MECHANISM;
- deleting a credential the user does not have: RESOURCE_NOT_FOUND.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqk import errors as E
from mqk.broker.security import Security
from mqk.broker.security.authorizer import ALTER, CLUSTER, CLUSTER_NAME, DESCRIBE
from mqk.broker.security.scram import BY_KAFKA_TYPE, MAX_ITERATIONS, MECHANISMS, MIN_ITERATIONS, ScramMechanism
from mqk.broker.security.users import Change
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import NONE

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
    from mqk.protocol.kafka.messages.alter_user_scram_credentials import (
        AlterUserScramCredentialsRequest,
        AlterUserScramCredentialsResponse,
        AlterUserScramCredentialsResult,
    )
    from mqk.protocol.kafka.messages.describe_user_scram_credentials import (
        DescribeUserScramCredentialsRequest,
        DescribeUserScramCredentialsResponse,
        DescribeUserScramCredentialsResult,
    )


def _security(ctx: KafkaContext) -> Security:
    assert ctx.security is not None, "the Kafka context is built with the broker's security services"
    return ctx.security


def _allowed(ctx: KafkaContext, peer: Peer, operation: str) -> bool:
    return _security(ctx).authorizer.authorize(
        peer.principal, peer.client_host.lstrip("/"), operation, CLUSTER, CLUSTER_NAME
    )


async def describe_user_scram_credentials(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[DescribeUserScramCredentialsRequest]
) -> DescribeUserScramCredentialsResponse:
    if not _allowed(ctx, peer, DESCRIBE):
        return {
            "throttle_time_ms": 0,
            "error_code": E.ClusterAuthorizationFailedError.code,
            "error_message": "not authorized to describe users",
            "results": [],
        }
    users = _security(ctx).users
    requested = req.body.get("users")
    names = [u["name"] for u in requested] if requested else users.names()
    seen: set[str] = set()
    duplicates: set[str] = set()
    for name in names:
        (duplicates if name in seen else seen).add(name)
    results: list[DescribeUserScramCredentialsResult] = []
    for name in dict.fromkeys(names):
        credentials = users.get(name)
        if name in duplicates:
            code, message = E.DuplicateResourceError.code, "cannot describe the same user twice in one request"
        elif not credentials:
            code, message = (
                E.ResourceNotFoundError.code,
                f"attempt to describe a user credential that does not exist: {name}",
            )
        else:
            code, message = NONE, None
        results.append(
            {
                "user": name,
                "error_code": code,
                "error_message": message,
                "credential_infos": []
                if code
                else [
                    {"mechanism": MECHANISMS[m].kafka_type, "iterations": c.iterations}
                    for m, c in sorted(credentials.items())
                ],
            }
        )
    return {"throttle_time_ms": 0, "error_code": NONE, "error_message": None, "results": results}


def _refusal(
    mechanism: ScramMechanism | None, iterations: int | None, salt: bytes, salted: bytes, name: str
) -> tuple[int, str] | None:
    if not name:
        return E.UnacceptableCredentialError.code, "user name must not be empty"
    if mechanism is None:
        return E.UnsupportedSaslMechanismError.code, "unknown SCRAM mechanism"
    if iterations is not None:
        if iterations < MIN_ITERATIONS:
            return E.UnacceptableCredentialError.code, f"too few iterations: at least {MIN_ITERATIONS}"
        if iterations > MAX_ITERATIONS:
            return E.UnacceptableCredentialError.code, f"too many iterations: at most {MAX_ITERATIONS}"
        if not salt or not salted:
            return E.UnacceptableCredentialError.code, "salt and salted password must not be empty"
    return None


async def alter_user_scram_credentials(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[AlterUserScramCredentialsRequest]
) -> AlterUserScramCredentialsResponse:
    body = req.body
    order: list[str] = []  # each user once, in the order the request names them
    changes: dict[str, list[Change]] = {}
    errors: dict[str, tuple[int, str]] = {}
    pairs: set[tuple[str, int]] = set()

    def take(name: str, kafka_type: int, refusal: tuple[int, str] | None, change: Change | None) -> None:
        if name not in changes:
            order.append(name)
            changes[name] = []
        if (name, kafka_type) in pairs:
            errors[name] = (E.DuplicateResourceError.code, "a user credential cannot be altered twice in one request")
        pairs.add((name, kafka_type))
        if refusal is not None:
            errors.setdefault(name, refusal)
        elif change is not None:
            changes[name].append(change)

    for d in body["deletions"]:
        mechanism = BY_KAFKA_TYPE.get(d["mechanism"])
        refusal = _refusal(mechanism, None, b"", b"", d["name"])
        take(d["name"], d["mechanism"], refusal, (mechanism, None) if mechanism else None)
    for u in body["upsertions"]:
        mechanism = BY_KAFKA_TYPE.get(u["mechanism"])
        salt, salted = bytes(u["salt"]), bytes(u["salted_password"])
        refusal = _refusal(mechanism, u["iterations"], salt, salted, u["name"])
        change = (mechanism, mechanism.credential(salted, salt, u["iterations"])) if mechanism and not refusal else None
        take(u["name"], u["mechanism"], refusal, change)

    allowed = _allowed(ctx, peer, ALTER)
    users = _security(ctx).users
    results: list[AlterUserScramCredentialsResult] = []
    for name in order:
        if not allowed:
            code, message = E.ClusterAuthorizationFailedError.code, "not authorized to alter users"
        elif name in errors:
            code, message = errors[name]
        else:
            try:
                await users.alter(name, changes[name])
                code, message = NONE, None
            except (E.MqkError, OSError) as exc:  # each user's outcome is its own answer
                code, message = E.kafka_code_for(exc), str(exc)
        results.append({"user": name, "error_code": code, "error_message": message})
    return {"throttle_time_ms": 0, "results": results}
