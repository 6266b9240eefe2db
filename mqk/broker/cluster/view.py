"""Every broker's cached view of the cluster metadata, kept current by one etcd watch (never by polling).

Reads never wait for etcd: request handlers ask the view, which answers from memory. The view follows the watch of
`/mqk/<cluster-id>/`: a `reset` (the first listing, and again after the watch was re-established) rebuilds it, each
put or delete patches it. Keys it cannot decode are logged once and left out. Changes are announced to listeners
(the topic reconciler, the controller) and to coroutines waiting for a condition (`wait_until`).

While etcd is unreachable the view keeps its last state (the broker keeps serving what it leads) and `connected`
is False; it catches up with one listing when the watch comes back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from mqk.broker.cluster.model import (
    BrokerRecord,
    ControllerRecord,
    Keys,
    Malformed,
    MasterRecord,
    RequestRecord,
    ResultRecord,
    SyncStateRecord,
    TopicRecord,
    load_int,
    load_members,
)
from mqk.meta import Record, WatchEvent

log = logging.getLogger("mqk.cluster")


@dataclass(slots=True)
class ClusterState:
    """One consistent picture (at `revision`)."""

    revision: int = 0
    brokers: dict[int, BrokerRecord] = field(default_factory=dict)
    controller: ControllerRecord | None = None
    #: the controller key's create revision: a controller's writes are fenced on it
    controller_revision: int = 0
    masters: dict[str, MasterRecord] = field(default_factory=dict)
    topics: dict[str, TopicRecord] = field(default_factory=dict)
    #: each topic key's mod revision (compare-and-set of a topic update)
    topic_revisions: dict[str, int] = field(default_factory=dict)
    #: how many topic records were put or deleted in this state (what follows the topic table checks it first)
    topic_changes: int = 0
    #: every group a broker registered in, live or not (a group is live while it has a master)
    groups: set[str] = field(default_factory=set)
    #: per group, every node that ever served it (its replicas, live or not)
    members: dict[str, list[int]] = field(default_factory=dict)
    #: per group, its in-sync replicas and the key's mod revision (their compare-and-set)
    isr: dict[str, tuple[SyncStateRecord, int]] = field(default_factory=dict)
    #: metadata changes waiting for the controller: id -> (the key's create revision: their order, the request)
    requests: dict[str, tuple[int, RequestRecord]] = field(default_factory=dict)
    #: the controller's answers not yet collected by their askers
    results: dict[str, ResultRecord] = field(default_factory=dict)
    #: user name -> (its key's mod revision, its value): SCRAM credentials, decoded by mqk.broker.security.users
    users: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    #: the values other modules decode, one table per prefix of `Keys.tables`: ACL bindings
    #: (mqk.broker.security.acls), client quotas (mqk.broker.quotas), RocketMQ access keys
    #: (mqk.broker.security.access_keys)
    tables: dict[str, KeyTable] = field(default_factory=dict)

    def table(self, prefix: str) -> KeyTable:
        """The table of one of `Keys.tables`' prefixes (empty until a key under it is seen)."""
        table = self.tables.get(prefix)
        if table is None:
            table = self.tables[prefix] = KeyTable()
        return table


@dataclass(slots=True, eq=False)
class KeyTable:
    """The keys under one prefix, by tail, with their stored values, and how many changes the watch made to them
    since the listing that made this table. The table's identity (equality is identity) and that count are its
    generation: a follower reads the values again only when it compares unequal to the one it last read."""

    values: dict[str, bytes] = field(default_factory=dict)
    changes: int = 0

    def generation(self) -> tuple[object, int]:
        return self, self.changes


class ClusterView:
    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.state = ClusterState()
        #: a listing has been received (the view knows the cluster, not just its own guesses)
        self.synced = False
        #: the watch is up (False while etcd is unreachable: the view is the last one seen)
        self.connected = False
        self._listeners: list[Callable[[], None]] = []
        self._changed = asyncio.Event()
        self._bad_keys: set[str] = set()

    # --- reading --------------------------------------------------------------------------------------------

    def broker(self, node_id: int) -> BrokerRecord | None:
        return self.state.brokers.get(node_id)

    def master_of(self, group: str) -> MasterRecord | None:
        return self.state.masters.get(group)

    def live_groups(self) -> list[str]:
        """Groups with a master (a registered broker leading them), sorted."""
        return sorted(g for g, m in self.state.masters.items() if m.node_id in self.state.brokers)

    def leader_of(self, topic: str, partition: int) -> tuple[int, int]:
        """(leader node id, leader epoch) of a partition; (-1, -1) when it has no live leader or does not exist."""
        record = self.state.topics.get(topic)
        if record is None or not 0 <= partition < len(record.partitions):
            return -1, -1
        master = self.state.masters.get(record.partitions[partition][0])
        if master is None or master.node_id not in self.state.brokers:
            return -1, -1
        return master.node_id, master.epoch + record.epoch_base(partition)

    def isr_of(self, group: str) -> list[int]:
        """The group's in-sync replicas as etcd last said; its master alone when no set was written yet."""
        entry = self.state.isr.get(group)
        if entry is not None:
            return entry[0].members
        master = self.state.masters.get(group)
        return [master.node_id] if master is not None else []

    def group_of(self, node_id: int) -> str | None:
        """The group of node `node_id` (a live broker's, or one that served a group before), None if unknown."""
        broker = self.state.brokers.get(node_id)
        if broker is not None:
            return broker.group
        for group, members in sorted(self.state.members.items()):
            if node_id in members:
                return group
        return None

    def members_of(self, group: str) -> list[int]:
        """The nodes of `group`, live or not, sorted (its replicas)."""
        live = {n for n, b in self.state.brokers.items() if b.group == group}
        return sorted(live.union(self.state.members.get(group, ())))

    # --- change notification ----------------------------------------------------------------------------------

    def add_listener(self, listener: Callable[[], None]) -> None:
        """`listener()` runs after every change the watch brings (on the event loop)."""
        self._listeners.append(listener)

    async def wait_until(
        self,
        condition: Callable[[ClusterState], bool],
        timeout: float,  # noqa: ASYNC109 - a bound that answers False, not a cancellation
    ) -> bool:
        """Wait until `condition(state)` holds (checked after each change) or `timeout` seconds pass; whether it
        holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not condition(self.state):
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return condition(self.state)
        return True

    def _announce(self) -> None:
        self._changed.set()
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                log.exception("cluster view listener %r failed", listener)

    # --- following the watch -----------------------------------------------------------------------------------

    def apply(self, event: WatchEvent) -> None:
        """Fold one watch event into the view and announce the change."""
        if event.kind == "lost":
            self.disconnected()
            return
        if event.kind == "reset":
            log.debug("cluster view: listing of %d keys at revision %d", len(event.records), event.revision)
            state = ClusterState(revision=event.revision)
            for record in event.records:
                self._put(state, record)
            self.state = state
            self.synced = True
            self.connected = True
        elif event.record is not None:
            if event.kind == "put":
                self._put(self.state, event.record)
            else:
                self._delete(self.state, event.record.key)
            self.state.revision = max(self.state.revision, event.revision)
        self._announce()

    def _put(self, state: ClusterState, record: Record) -> None:
        keys = self.keys
        key = record.key
        try:
            if key.startswith(keys.brokers):
                broker = BrokerRecord.decode(record.value)
                state.brokers[broker.node_id] = broker
                state.groups.add(broker.group)
            elif key == keys.controller:
                state.controller = ControllerRecord.decode(record.value)
                state.controller_revision = record.create_revision
            elif key.startswith(keys.topics):
                name = key[len(keys.topics) :]
                state.topics[name] = TopicRecord.decode(record.value)
                state.topic_revisions[name] = record.mod_revision
                state.topic_changes += 1
            elif key.startswith(keys.groups) and key.endswith("/master"):
                group = key[len(keys.groups) : -len("/master")]
                state.masters[group] = MasterRecord.decode(record.value)
                state.groups.add(group)
            elif key.startswith(keys.groups) and key.endswith("/isr"):
                group = key[len(keys.groups) : -len("/isr")]
                state.isr[group] = (SyncStateRecord.decode(record.value), record.mod_revision)
            elif key.startswith(keys.groups) and key.endswith("/members"):
                group = key[len(keys.groups) : -len("/members")]
                state.members[group] = load_members(record.value, key)
                state.groups.add(group)
            elif key.startswith(keys.requests):
                state.requests[key[len(keys.requests) :]] = (record.create_revision, RequestRecord.decode(record.value))
            elif key.startswith(keys.results):
                state.results[key[len(keys.results) :]] = ResultRecord.decode(record.value)
            elif key.startswith(keys.users):
                state.users[keys.user_name(key)] = (record.mod_revision, record.value)
            elif prefix := _table_prefix(keys, key):
                table = state.table(prefix)
                table.values[key[len(prefix) :]] = record.value
                table.changes += 1
            elif key == keys.controller_epoch or key == keys.pid_blocks:
                load_int(record.value, key)
        except Malformed as exc:
            if key not in self._bad_keys:
                self._bad_keys.add(key)
                log.error("cluster key %s skipped: %s", key, exc)

    def _delete(self, state: ClusterState, key: str) -> None:
        keys = self.keys
        if key.startswith(keys.brokers):
            tail = key[len(keys.brokers) :]
            if tail.isdigit():
                state.brokers.pop(int(tail), None)
        elif key == keys.controller:
            state.controller = None
            state.controller_revision = 0
        elif key.startswith(keys.topics):
            name = key[len(keys.topics) :]
            state.topics.pop(name, None)
            state.topic_revisions.pop(name, None)
            state.topic_changes += 1
        elif key.startswith(keys.groups) and key.endswith("/master"):
            state.masters.pop(key[len(keys.groups) : -len("/master")], None)
        elif key.startswith(keys.groups) and key.endswith("/isr"):
            state.isr.pop(key[len(keys.groups) : -len("/isr")], None)
        elif key.startswith(keys.requests):
            state.requests.pop(key[len(keys.requests) :], None)
        elif key.startswith(keys.results):
            state.results.pop(key[len(keys.results) :], None)
        elif key.startswith(keys.users):
            state.users.pop(keys.user_name(key), None)
        elif prefix := _table_prefix(keys, key):
            table = state.table(prefix)
            table.values.pop(key[len(prefix) :], None)
            table.changes += 1

    def disconnected(self) -> None:
        """The watch broke: the view stays as it is until the next listing."""
        if self.connected:
            self.connected = False
            log.warning(
                "cluster metadata: etcd unreachable; serving with the last view (revision %d)", self.state.revision
            )


def _table_prefix(keys: Keys, key: str) -> str:
    """The prefix of `Keys.tables` that `key` is under, or ''."""
    for prefix in keys.tables:
        if key.startswith(prefix):
            return prefix
    return ""


__all__ = ["ClusterState", "ClusterView", "KeyTable"]
