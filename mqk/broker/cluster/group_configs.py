"""Cluster mode: the share groups' configs (Kafka's GroupConfig `share.*` keys) are the cluster's.

A group's overrides live in etcd under `group-configs/<quoted group id>` (a JSON object of key to value), written by
whichever broker an IncrementalAlterConfigs or AlterConfigs on the group reached, and followed by every broker
through its view: the group's coordinator (heartbeat interval, session timeout) and each partition leader (lock
duration, delivery limit, where a partition starts, isolation level) apply the same values. A broker on its own keeps
them in the group's state document instead (mqk.groups.share).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol
from urllib.parse import quote, unquote

from mqk.broker.cluster import ClusterMember

log = logging.getLogger("mqk.cluster")


class ConfiguredGroups(Protocol):
    """What this module needs of the share groups (mqk.groups.share.ShareGroups)."""

    def use_cluster_configs(self, configs: dict[str, dict[str, str]]) -> None: ...


class GroupConfigs:
    def __init__(self, cluster: ClusterMember, groups: ConfiguredGroups) -> None:
        self.cluster = cluster
        self.groups = groups
        self.prefix = cluster.node.keys.group_configs
        self._seen: tuple[object, int] = (None, -1)

    def start(self) -> None:
        """Follow the cluster's configs from now on (the view is synced: the member has started)."""
        self._follow()
        self.cluster.view.add_listener(self._follow)

    def _follow(self) -> None:
        table = self.cluster.table(self.prefix)
        seen = table.generation()
        if seen == self._seen:
            return
        self._seen = seen
        configs: dict[str, dict[str, str]] = {}
        for tail, value in table.values.items():
            try:
                doc: Any = json.loads(value)
                if not isinstance(doc, dict):
                    raise ValueError("not a JSON object")
                configs[unquote(tail)] = {str(k): str(v) for k, v in doc.items()}
            except (ValueError, UnicodeDecodeError) as exc:
                log.error("group configs: cluster key %s skipped: %s", tail, exc)
        self.groups.use_cluster_configs(configs)

    async def write(self, group_id: str, overrides: dict[str, str]) -> None:
        """Make `overrides` the group's (none: it has no key any more); on return this broker's view has it.
        MetaUnavailable when etcd cannot take it."""
        tail = quote(group_id, safe="")
        if overrides:
            await self.cluster.write_table(self.prefix, {tail: json.dumps(overrides, sort_keys=True).encode()}, [])
        else:
            await self.cluster.write_table(self.prefix, {}, [tail])
        self._follow()


__all__ = ["GroupConfigs"]
