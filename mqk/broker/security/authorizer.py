"""The authorizer hook: whether a principal may perform an operation on a resource (Kafka's Authorizer interface,
reduced to the one question every front door asks).

Operations and resource types are Kafka's names (`READ`, `WRITE`, `DESCRIBE`, `ALTER`, ... on `TOPIC`, `GROUP`,
`CLUSTER`, ...; the cluster resource is named `kafka-cluster`). Handlers ask `Security.authorizer`; the broker
starts with `ALLOW_ALL`, which lets every principal do everything; with `authorizer` on, Security installs the ACL
authorizer (mqk.broker.security.acls) instead; nothing else changes for the handlers. A handler on a hot path may
test `authorizer is ALLOW_ALL` to skip asking at all.
"""

from __future__ import annotations

from typing import Protocol

from mqk.broker.security.principal import Principal

#: Kafka's resource types and operations as the handlers name them
CLUSTER = "CLUSTER"
CLUSTER_NAME = "kafka-cluster"
TOPIC = "TOPIC"
READ = "READ"
DESCRIBE = "DESCRIBE"
ALTER = "ALTER"


class Authorizer(Protocol):
    def authorize(
        self, principal: Principal, host: str, operation: str, resource_type: str, resource_name: str
    ) -> bool: ...

    def authorize_any(self, principal: Principal, host: str, operation: str, resource_type: str) -> bool:
        """Whether the principal may `operation` some resource of the type (Kafka's authorizeByResourceType)."""
        ...


class AllowAll:
    """Every principal may do everything."""

    def authorize(
        self, principal: Principal, host: str, operation: str, resource_type: str, resource_name: str
    ) -> bool:
        return True

    def authorize_any(self, principal: Principal, host: str, operation: str, resource_type: str) -> bool:
        return True


ALLOW_ALL = AllowAll()
