"""ACLs in Kafka's model: the bindings, the filters that find them, where they are kept, and the rules that decide.

A binding (`AclBinding`) is a resource pattern and an access control entry:

- resource type TOPIC, GROUP, CLUSTER (named `kafka-cluster`), TRANSACTIONAL_ID, DELEGATION_TOKEN or USER;
- pattern LITERAL (the resource's exact name; the name `*` matches every resource of the type) or PREFIXED (every
  resource whose name starts with it);
- principal `User:NAME` (`User:*`: every user), host (`*` or one client address), operation (Kafka's, ALL for every
  one), permission ALLOW or DENY.

Deciding (`AclIndex.authorize`, Kafka's AclAuthorizer rules): a super user may do anything; otherwise the bindings
on the resource (its literal name, the wildcard, every prefix of its name) that name the principal (or `User:*`) and
the host (or `*`) are consulted. A DENY of the operation (or ALL) refuses; an ALLOW of the operation, of ALL, or of
one that implies it (READ, WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS) allows;
nothing: refused, unless the resource has no binding at all and `allow_everyone_if_no_acl_found` is set.

Filters (`AclFilter`, DescribeAcls and DeleteAcls) match bindings as Kafka's AclBindingFilter does: a None field or
ANY matches everything; pattern MATCH with a name finds every binding that would apply to that resource (its literal
name, the wildcard, its prefixes); ANY with a name finds the bindings of exactly that name, any pattern type.

Where they are kept (`Acls`):
- a broker on its own: `<data-dir>/security/acls.json` ({"acls": [binding, ...]}), replaced atomically after every
  change; a memory-store broker keeps them in memory;
- cluster mode: `/mqk/<cluster-id>/acls/<quoted binding>` in etcd, one key per binding, followed by every broker's
  view as the users are (mqk.broker.cluster). A change returns once this broker's view shows it.

Decisions are cached per (principal, host, operation, resource) and the cache is dropped whenever the bindings
change (their generation moves), so a request asks a dict, not the rules.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from mqk import errors as E
from mqk.broker.security.principal import Principal
from mqk.broker.security.users import write_private
from mqk.store.fsutil import read_json
from mqk.store.manager import StoreManager

# typing only: cluster mode's modules (etcd client, controller, replication) load with --cluster alone (start-up)
if TYPE_CHECKING:
    from mqk.broker.cluster import ClusterMember

log = logging.getLogger("mqk.security")

FILE = "acls.json"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"

# Kafka's codes (org.apache.kafka.common.resource / acl), both ways: the handlers speak codes, the rest names
RESOURCE_TYPES = {
    0: "UNKNOWN",
    1: "ANY",
    2: "TOPIC",
    3: "GROUP",
    4: "CLUSTER",
    5: "TRANSACTIONAL_ID",
    6: "DELEGATION_TOKEN",
    7: "USER",
}
PATTERN_TYPES = {0: "UNKNOWN", 1: "ANY", 2: "MATCH", 3: "LITERAL", 4: "PREFIXED"}
OPERATIONS = {
    0: "UNKNOWN",
    1: "ANY",
    2: "ALL",
    3: "READ",
    4: "WRITE",
    5: "CREATE",
    6: "DELETE",
    7: "ALTER",
    8: "DESCRIBE",
    9: "CLUSTER_ACTION",
    10: "DESCRIBE_CONFIGS",
    11: "ALTER_CONFIGS",
    12: "IDEMPOTENT_WRITE",
    13: "CREATE_TOKENS",
    14: "DESCRIBE_TOKENS",
}
PERMISSIONS = {0: "UNKNOWN", 1: "ANY", 2: "DENY", 3: "ALLOW"}
RESOURCE_CODES = {name: code for code, name in RESOURCE_TYPES.items()}
PATTERN_CODES = {name: code for code, name in PATTERN_TYPES.items()}
OPERATION_CODES = {name: code for code, name in OPERATIONS.items()}
PERMISSION_CODES = {name: code for code, name in PERMISSIONS.items()}

#: what an ALLOW of an operation also allows (Kafka's implied operations)
_IMPLIED_BY = {
    "DESCRIBE": ("DESCRIBE", "READ", "WRITE", "DELETE", "ALTER", "ALL"),
    "DESCRIBE_CONFIGS": ("DESCRIBE_CONFIGS", "ALTER_CONFIGS", "ALL"),
}

#: the operations each resource type has (what AuthorizedOperations reports, Kafka's AclEntry.supportedOperations)
SUPPORTED_OPERATIONS = {
    "TOPIC": ("READ", "WRITE", "CREATE", "DESCRIBE", "DELETE", "ALTER", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"),
    "GROUP": ("READ", "DESCRIBE", "DELETE"),
    "CLUSTER": (
        "CREATE",
        "CLUSTER_ACTION",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
        "IDEMPOTENT_WRITE",
        "ALTER",
        "DESCRIBE",
    ),
    "TRANSACTIONAL_ID": ("DESCRIBE", "WRITE"),
    "DELEGATION_TOKEN": ("DESCRIBE",),
    "USER": ("CREATE_TOKENS", "DESCRIBE_TOKENS"),
}


@dataclass(frozen=True, slots=True)
class AclBinding:
    resource_type: str
    name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission: str

    def key(self) -> str:
        """The binding as one etcd key tail (cluster mode): every field, percent-encoded."""
        return quote(json.dumps(list(asdict(self).values()), separators=(",", ":")), safe="")

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Any, what: str) -> AclBinding:
        if not isinstance(doc, dict):
            raise E.Corrupt(f"{what}: not a JSON object")
        try:
            binding = cls(**{k: doc[k] for k in cls.__dataclass_fields__})
        except (KeyError, TypeError):
            raise E.Corrupt(f"{what}: not an ACL binding") from None
        problem = binding.problem()
        if problem is not None:
            raise E.Corrupt(f"{what}: {problem}")
        return binding

    def problem(self) -> str | None:
        """Why this binding cannot be stored (None: it can), Kafka's checks on a new ACL."""
        if any(not isinstance(v, str) for v in asdict(self).values()):
            return "every field is a string"
        if self.resource_type not in SUPPORTED_OPERATIONS:
            return f"resource type {self.resource_type} is not one an ACL can name"
        if self.pattern_type not in ("LITERAL", "PREFIXED"):
            return f"pattern type {self.pattern_type}: LITERAL or PREFIXED"
        if not self.name:
            return "the resource name must not be empty"
        if self.resource_type == "CLUSTER" and self.name != CLUSTER_NAME:
            return f"the only valid name for the CLUSTER resource is {CLUSTER_NAME}"
        if self.operation in ("ANY", "UNKNOWN") or self.operation not in OPERATION_CODES:
            return f"operation {self.operation} cannot be stored"
        if self.permission not in ("ALLOW", "DENY"):
            return f"permission {self.permission}: ALLOW or DENY"
        kind, sep, who = self.principal.partition(":")
        if not sep or not kind or not who:
            return f"principal {self.principal!r}: expected TYPE:NAME (User:alice)"
        if not self.host:
            return "the host must not be empty (`*` for every host)"
        return None


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Kafka's AclBindingFilter; None for a null name, principal or host (matches every one)."""

    resource_type: str = "ANY"
    name: str | None = None
    pattern_type: str = "ANY"
    principal: str | None = None
    host: str | None = None
    operation: str = "ANY"
    permission: str = "ANY"

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type != "ANY" and self.resource_type != b.resource_type:
            return False
        if self.pattern_type not in ("ANY", "MATCH") and self.pattern_type != b.pattern_type:
            return False
        if self.name is not None:
            if self.pattern_type in ("ANY", b.pattern_type):
                if self.name != b.name:
                    return False
            elif b.pattern_type == "LITERAL":
                if self.name != b.name and b.name != WILDCARD:
                    return False
            elif not self.name.startswith(b.name):  # PREFIXED
                return False
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.host is not None and self.host != b.host:
            return False
        if self.operation != "ANY" and self.operation != b.operation:
            return False
        return self.permission == "ANY" or self.permission == b.permission

    def problem(self) -> str | None:
        """Why this filter is not one Kafka accepts (None: it is)."""
        if self.resource_type == "UNKNOWN" or self.resource_type not in RESOURCE_CODES:
            return "unknown resource type"
        if self.pattern_type == "UNKNOWN" or self.pattern_type not in PATTERN_CODES:
            return "unknown pattern type"
        if self.operation == "UNKNOWN" or self.operation not in OPERATION_CODES:
            return "unknown operation"
        if self.permission == "UNKNOWN" or self.permission not in PERMISSION_CODES:
            return "unknown permission type"
        return None


class AclIndex:
    """A set of bindings arranged for deciding: per resource type, the literal names, the wildcard's and the
    prefixes' bindings."""

    def __init__(self, bindings: Iterable[AclBinding]) -> None:
        self.bindings = frozenset(bindings)
        self._literal: dict[tuple[str, str], list[AclBinding]] = {}
        self._prefixed: dict[str, dict[str, list[AclBinding]]] = {}
        for b in self.bindings:
            if b.pattern_type == "LITERAL":
                self._literal.setdefault((b.resource_type, b.name), []).append(b)
            else:
                self._prefixed.setdefault(b.resource_type, {}).setdefault(b.name, []).append(b)

    def on_resource(self, resource_type: str, name: str) -> list[AclBinding]:
        """Every binding that applies to the resource, whoever it names."""
        found = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            found += self._literal.get((resource_type, WILDCARD), ())
        prefixes = self._prefixed.get(resource_type)
        if prefixes:
            for prefix, bindings in prefixes.items():
                if name.startswith(prefix):
                    found += bindings
        return found

    def authorize(
        self, principal: str, host: str, operation: str, resource_type: str, name: str, allow_if_none: bool
    ) -> bool:
        """Kafka's AclAuthorizer decision for a principal that is not a super user."""
        bindings = self.on_resource(resource_type, name)
        if not bindings:
            return allow_if_none
        mine = [
            b
            for b in bindings
            if (b.principal == principal or b.principal == WILDCARD_PRINCIPAL)
            and (b.host == host or b.host == WILDCARD)
        ]
        for b in mine:
            if b.permission == "DENY" and (b.operation == operation or b.operation == "ALL"):
                return False
        allowing = _IMPLIED_BY.get(operation, (operation, "ALL"))
        return any(b.permission == "ALLOW" and b.operation in allowing for b in mine)

    def authorize_any(self, principal: str, host: str, operation: str, resource_type: str) -> bool:
        """Whether the principal may `operation` some resource of the type (Kafka's authorizeByResourceType, which
        lets an idempotent producer in with WRITE on any topic): an ALLOW that no DENY covers."""
        allowing = _IMPLIED_BY.get(operation, (operation, "ALL"))
        allows: list[AclBinding] = []
        denies: list[AclBinding] = []
        for b in self.bindings:
            if b.resource_type != resource_type:
                continue
            if b.principal not in (principal, WILDCARD_PRINCIPAL) or b.host not in (host, WILDCARD):
                continue
            if b.permission == "DENY" and b.operation in (operation, "ALL"):
                denies.append(b)
            elif b.permission == "ALLOW" and b.operation in allowing:
                allows.append(b)
        for deny in denies:
            if deny.name == WILDCARD and deny.pattern_type == "LITERAL":
                return False
        for allow in allows:
            covered = any(
                (d.name == allow.name and d.pattern_type == allow.pattern_type)
                or (d.pattern_type == "PREFIXED" and allow.name.startswith(d.name))
                for d in denies
            )
            if not covered:
                return True
        return False


class Acls:
    """The broker's ACL bindings: the local file or the cluster's keys, and an index of the current ones."""

    def __init__(self, store: StoreManager) -> None:
        self._path: Path | None = store.config.data_dir / "security" / FILE if store.persistent else None
        self._local: frozenset[AclBinding] = frozenset()
        self._cluster: ClusterMember | None = None
        #: moves whenever the bindings may have changed (what decision caches are keyed on): each local change, and
        #: in cluster mode each change of the view's ACL keys (its listener, `_follow`)
        self.generation = 0
        self._seen: tuple[object, int] = (None, -1)
        self._index = AclIndex(())
        self._indexed = -1
        self._write_lock = asyncio.Lock()

    def load(self) -> None:
        """Read the local file (a broker on its own); Corrupt if it cannot be trusted."""
        if self._path is None:
            return
        doc = read_json(self._path)
        if doc is None:
            return
        items = doc.get("acls") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise E.Corrupt(f"{self._path}: no acls list")
        self._local = frozenset(AclBinding.from_json(item, f"{self._path}: ACL {i}") for i, item in enumerate(items))
        self.generation += 1
        log.info("acls: %d loaded from %s", len(self._local), self._path)

    def attach_cluster(self, cluster: ClusterMember) -> None:
        """Cluster mode: the ACLs are the cluster's (in etcd) from now on, followed through the view's changes."""
        self._cluster = cluster
        self._seen = cluster.table(cluster.keys.acls).generation()
        self.generation += 1
        cluster.view.add_listener(self._follow)

    def _follow(self) -> None:
        """A view change: a new generation if it touched the ACL keys (the view's ACL dict, or its change count)."""
        assert self._cluster is not None
        seen = self._cluster.table(self._cluster.keys.acls).generation()
        if seen != self._seen:
            self._seen = seen
            self.generation += 1

    # --- reading ----------------------------------------------------------------------------------------

    def index(self) -> AclIndex:
        if self._indexed != self.generation:
            self._index = AclIndex(self._read())
            self._indexed = self.generation
        return self._index

    def _read(self) -> list[AclBinding]:
        cluster = self._cluster
        if cluster is None:
            return list(self._local)
        out = []
        for key, value in cluster.table(cluster.keys.acls).values.items():
            try:
                out.append(AclBinding.from_json(json.loads(value), f"cluster ACL {key}"))
            except (E.Corrupt, ValueError) as exc:
                log.error("acls: %s skipped: %s", key, exc)
        return out

    def bindings(self) -> frozenset[AclBinding]:
        return self.index().bindings

    def matching(self, acl_filter: AclFilter) -> list[AclBinding]:
        return sorted((b for b in self.bindings() if acl_filter.matches(b)), key=_order)

    # --- changing ---------------------------------------------------------------------------------------

    async def change(self, add: Iterable[AclBinding] = (), remove: Iterable[AclBinding] = ()) -> None:
        """Add and remove bindings together (adding one that exists, or removing one that does not, is no change).
        MetaUnavailable / RequestTimedOutError in cluster mode when etcd cannot take it now."""
        add, remove = set(add), set(remove) - set(add)
        if self._cluster is not None:
            await self._cluster.write_table(
                self._cluster.keys.acls,
                {b.key(): json.dumps(b.to_json()).encode() for b in add},
                [b.key() for b in remove],
            )
            return
        async with self._write_lock:
            updated = (self._local | add) - remove
            if updated == self._local:
                return
            if self._path is not None:
                doc = {"acls": [b.to_json() for b in sorted(updated, key=_order)]}
                await asyncio.to_thread(write_private, self._path, doc)
            self._local = frozenset(updated)
            self.generation += 1


def _order(b: AclBinding) -> tuple[str, ...]:
    return (b.resource_type, b.pattern_type, b.name, b.principal, b.host, b.operation, b.permission)


class AclAuthorizer:
    """Kafka's ACL authorizer on the broker's bindings: super users, allow-if-no-ACL, decisions cached.

    The cache is keyed on the principal object's identity (a connection keeps its principal for its life), which
    costs less than hashing it; each entry holds that object, so its identity cannot be reused while the entry
    lives."""

    def __init__(
        self, acls: Acls, super_users: Iterable[str] = (), allow_everyone_if_no_acl_found: bool = False
    ) -> None:
        self.acls = acls
        self.super_users = frozenset(super_users)
        self.allow_if_none = allow_everyone_if_no_acl_found
        self._cache: dict[tuple[int, str, str, str, str], tuple[Principal, bool]] = {}
        self._cached_at = -1

    def authorize(
        self, principal: Principal, host: str, operation: str, resource_type: str, resource_name: str
    ) -> bool:
        if self._cached_at != self.acls.generation or len(self._cache) > 100_000:
            # the ACLs changed (or the cache grew past its bound): decide again on demand
            self._cache = {}
            self._cached_at = self.acls.generation
        key = (id(principal), host, operation, resource_type, resource_name)
        entry = self._cache.get(key)
        if entry is not None and entry[0] is principal:
            return entry[1]
        who = str(principal)
        if who in self.super_users:
            decision = True
        else:
            decision = self.acls.index().authorize(
                who, host, operation, resource_type, resource_name, self.allow_if_none
            )
        self._cache[key] = (principal, decision)
        return decision

    def authorize_any(self, principal: Principal, host: str, operation: str, resource_type: str) -> bool:
        who = str(principal)
        if who in self.super_users:
            return True
        if self.allow_if_none and not any(b.resource_type == resource_type for b in self.acls.bindings()):
            return True
        return self.acls.index().authorize_any(who, host, operation, resource_type)


def binding_from_codes(fields: Mapping[str, Any]) -> AclBinding:
    """A binding from a CreateAcls creation (Kafka's codes; an unknown code becomes UNKNOWN, refused by
    `problem`)."""
    return AclBinding(
        RESOURCE_TYPES.get(fields["resource_type"], "UNKNOWN"),
        fields["resource_name"],
        PATTERN_TYPES.get(fields["resource_pattern_type"], "UNKNOWN"),
        fields["principal"],
        fields["host"],
        OPERATIONS.get(fields["operation"], "UNKNOWN"),
        PERMISSIONS.get(fields["permission_type"], "UNKNOWN"),
    )


def filter_from_codes(fields: Mapping[str, Any]) -> AclFilter:
    """A filter from a DescribeAcls request or a DeleteAcls filter (Kafka's codes)."""
    return AclFilter(
        RESOURCE_TYPES.get(fields["resource_type_filter"], "UNKNOWN"),
        fields["resource_name_filter"],
        PATTERN_TYPES.get(fields["pattern_type_filter"], "UNKNOWN"),
        fields["principal_filter"],
        fields["host_filter"],
        OPERATIONS.get(fields["operation"], "UNKNOWN"),
        PERMISSIONS.get(fields["permission_type"], "UNKNOWN"),
    )
