"""Security of the broker layer, protocol-neutral: who a client is, and the services the front doors use to find out.

- `Security` (one per Broker): the user store, the SASL mechanisms this broker offers, the growing delay for failed
  authentications, the client-certificate principal mapping, and the authorizer hook;
- principal.py: `Principal` (`User:NAME`, `User:ANONYMOUS`) and Kafka's certificate-subject mapping rules;
- sasl.py, scram.py: the SASL mechanisms PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 (sans-IO);
- users.py: the SCRAM credentials (data dir, or etcd in cluster mode); failures.py: the failure delays;
- authorizer.py: the hook the front doors ask (`ALLOW_ALL` unless `authorizer` is on);
- access_keys.py: RocketMQ access keys and their plain secrets (what RocketMQ's request signatures need);
- acls.py: the ACL bindings (data dir, or etcd in cluster mode) and Kafka's ACL authorizer over them.

TLS itself (sockets, handshakes) belongs to the front doors (mqk.server.tls); SASL framing to each protocol.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from mqk.broker.security.access_keys import AccessKeys
from mqk.broker.security.acls import AclAuthorizer, Acls
from mqk.broker.security.authorizer import ALLOW_ALL, Authorizer
from mqk.broker.security.errors import AuthenticationFailed
from mqk.broker.security.failures import AuthFailureDelays
from mqk.broker.security.principal import ANONYMOUS, USER, Principal, PrincipalMapper
from mqk.broker.security.sasl import SaslServer, new_server
from mqk.broker.security.users import Users
from mqk.clock import SYSTEM_CLOCK, Clock
from mqk.config import BrokerConfig
from mqk.store.manager import StoreManager

# typing only: cluster mode's modules (etcd client, controller, replication) load with --cluster alone (start-up)
if TYPE_CHECKING:
    from mqk.broker.cluster import ClusterMember


#: distinct RocketMQ access keys whose principals are kept (past it they are made again)
_KEY_PRINCIPALS_KEPT = 10_000


class Security:
    def __init__(self, config: BrokerConfig, store: StoreManager, clock: Clock = SYSTEM_CLOCK) -> None:
        self.users = Users(store)
        self.users.load()
        #: what SASL listeners offer (Kafka's sasl.enabled.mechanisms)
        self.mechanisms: tuple[str, ...] = tuple(config.sasl_enabled_mechanisms)
        self.failures = AuthFailureDelays(
            clock, config.auth_failure_delay_ms / 1000, config.auth_failure_delay_max_ms / 1000
        )
        self.principals = PrincipalMapper(config.tls.principal_mapping_rules)
        #: RocketMQ access keys (their own store: a signature needs the plain secret, SCRAM keeps none)
        self.access_keys = AccessKeys(store.config.data_dir)
        self.access_keys.load()
        self.acls = Acls(store)
        self.acls.load()
        #: what every front door asks: the ACL authorizer when configured, else everyone may do everything
        self.authorizer: Authorizer = ALLOW_ALL
        if config.authorizer:
            self.authorizer = AclAuthorizer(self.acls, config.super_users, config.allow_everyone_if_no_acl_found)
        #: made-up salts of unknown users derive from this (mqk.broker.security.scram)
        self._mock_key = secrets.token_bytes(32)
        #: access key -> its principal: one object per key, because the authorizer caches its decisions by the
        #: principal's identity (a Kafka connection keeps one for its life; RocketMQ signs every request)
        self._key_principals: dict[str, Principal] = {}

    def access_key_principal(self, access_key: str) -> Principal:
        """The principal (`User:<access key>`) of requests signed with a RocketMQ access key."""
        principal = self._key_principals.get(access_key)
        if principal is None:
            if len(self._key_principals) >= _KEY_PRINCIPALS_KEPT:
                self._key_principals.clear()
            principal = self._key_principals[access_key] = Principal(USER, access_key)
        return principal

    def attach_cluster(self, cluster: ClusterMember) -> None:
        self.users.attach_cluster(cluster)
        self.acls.attach_cluster(cluster)
        self.access_keys.attach_cluster(cluster)

    def sasl_server(self, mechanism: str) -> SaslServer:
        """A server for one exchange of an enabled `mechanism` (KeyError for another)."""
        if mechanism not in self.mechanisms:
            raise KeyError(mechanism)
        return new_server(mechanism, self.users.credential, self._mock_key)


__all__ = [
    "ANONYMOUS",
    "USER",
    "AuthenticationFailed",
    "Principal",
    "SaslServer",
    "Security",
]
