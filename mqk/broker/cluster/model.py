"""Cluster metadata: the key layout under `/mqk/<cluster-id>/` and the values stored there (JSON).

    brokers/<node-id>            BrokerRecord    a live broker: its group, rack, advertised listeners    (its lease)
    controller                   ControllerRecord the elected controller and its epoch                    (its lease)
    controller-epoch             int              the last controller epoch handed out
    groups/<group>/master        MasterRecord     the group's master and its epoch                         (its lease)
    groups/<group>/epoch         int              the last master epoch handed out in the group
    groups/<group>/members       [int, ...]       every node that ever served the group (its replicas, live or not)
    groups/<group>/isr           SyncStateRecord  the group's in-sync replicas (compare-and-set by its master)
    topics/<name>                TopicRecord      id, configs, each partition's (group, queue), the moves of
                                                  partitions to other groups under way            (controller only)
    pid-blocks                   int              the next free producer id
    requests/<id>                RequestRecord    a metadata change asked of the controller    (the asker's lease)
    results/<id>                 ResultRecord     its outcome, for the asker                    (the asker's lease)
    users/<quoted name>          (bytes)          a user's SCRAM credentials (mqk.broker.security.users reads them)
    acls/<quoted binding>        (bytes)          one ACL binding (mqk.broker.security.acls reads them)
    quotas/<quoted entity>       (bytes)          one entity's client quotas (mqk.broker.quotas reads them)
    rocketmq-keys/<quoted name>  (bytes)          a RocketMQ access key and its secret (mqk.broker.security.access_keys)
    txn-partitions/<group>/<pid> TxnPartitionsRecord a Kafka transaction's partitions placed in <group>, when its
                                                  coordinator is in another group (mqk.broker.cluster.txn_partitions)
    group-configs/<quoted id>    (JSON object)    a share group's config overrides (mqk.broker.cluster.group_configs)
    share-ops/<group>/<id>       (JSON object)    a share group offset operation asked of <group>'s master by the
                                                  share group's coordinator (mqk.broker.cluster.share_ops)
                                                                                          (the asker's lease)
    share-answers/<id>/<group>   (JSON object)    that master's answer                    (the answerer's lease)

Every value is a small JSON object; decoding checks types and refuses what it does not understand (`Malformed`), so a
damaged or foreign key is logged and skipped, never trusted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from mqk.errors import MqkError


class Malformed(MqkError):
    """A cluster key's value is not what mqk writes there."""


class Keys:
    """Key names of one cluster."""

    def __init__(self, cluster_id: str) -> None:
        if not cluster_id or "/" in cluster_id:
            raise ValueError(f"cluster id {cluster_id!r} must be non-empty and contain no '/'")
        self.root = f"/mqk/{cluster_id}/"
        self.brokers = self.root + "brokers/"
        self.controller = self.root + "controller"
        self.controller_epoch = self.root + "controller-epoch"
        self.groups = self.root + "groups/"
        self.topics = self.root + "topics/"
        self.pid_blocks = self.root + "pid-blocks"
        self.requests = self.root + "requests/"
        self.results = self.root + "results/"
        self.users = self.root + "users/"
        self.acls = self.root + "acls/"
        self.quotas = self.root + "quotas/"
        self.rocketmq_keys = self.root + "rocketmq-keys/"
        self.txn_partitions = self.root + "txn-partitions/"
        self.group_configs = self.root + "group-configs/"
        self.share_ops = self.root + "share-ops/"
        self.share_answers = self.root + "share-answers/"
        #: the prefixes whose values other modules decode: a ClusterState keeps each as a KeyTable
        self.tables = (
            self.acls,
            self.quotas,
            self.rocketmq_keys,
            self.txn_partitions,
            self.group_configs,
            self.share_ops,
            self.share_answers,
        )

    def broker(self, node_id: int) -> str:
        return f"{self.brokers}{node_id}"

    def master(self, group: str) -> str:
        return f"{self.groups}{group}/master"

    def master_epoch(self, group: str) -> str:
        return f"{self.groups}{group}/epoch"

    def members(self, group: str) -> str:
        return f"{self.groups}{group}/members"

    def isr(self, group: str) -> str:
        return f"{self.groups}{group}/isr"

    def topic(self, name: str) -> str:
        return self.topics + name

    def request(self, request_id: str) -> str:
        return self.requests + request_id

    def result(self, request_id: str) -> str:
        return self.results + request_id

    def txn_partitions_of(self, group: str, producer_id: int) -> str:
        """The key of producer id `producer_id`'s transaction in `group` (the group's name percent-encoded)."""
        return f"{self.txn_partitions}{quote(group, safe='')}/{producer_id}"

    def share_op(self, group: str, op_id: str) -> str:
        return f"{self.share_ops}{quote(group, safe='')}/{op_id}"

    def share_answer(self, op_id: str, group: str) -> str:
        return f"{self.share_answers}{op_id}/{quote(group, safe='')}"

    def user(self, name: str) -> str:
        """A user's key: the name percent-encoded, so any name (one with '/' too) is one key."""
        return self.users + quote(name, safe="")

    def user_name(self, key: str) -> str:
        return unquote(key[len(self.users) :])


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Malformed(f"{what}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise Malformed(f"{what}: not a JSON object")
    return doc


def _field(doc: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = doc.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise Malformed(f"{what}: {name!r} missing or not {getattr(kind, '__name__', kind)}")
    return value


def dump(record: Any) -> bytes:
    return json.dumps(asdict(record), separators=(",", ":"), sort_keys=True).encode()


def load_members(data: bytes, what: str) -> list[int]:
    try:
        members = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Malformed(f"{what}: not JSON ({exc})") from None
    if not isinstance(members, list) or not all(isinstance(m, int) and not isinstance(m, bool) for m in members):
        raise Malformed(f"{what}: not a list of node ids")
    return sorted(set(members))


def load_int(data: bytes, what: str) -> int:
    try:
        value = int(data)
    except ValueError:
        raise Malformed(f"{what}: not an integer") from None
    return value


@dataclass(frozen=True, slots=True)
class BrokerRecord:
    node_id: int
    group: str
    #: protocol name -> "host:port" clients (and peers) connect to
    listeners: dict[str, str]
    rack: str | None = None

    @classmethod
    def decode(cls, data: bytes) -> BrokerRecord:
        doc = _load(data, "broker record")
        listeners = _field(doc, "listeners", dict, "broker record")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in listeners.items()):
            raise Malformed("broker record: listeners must map names to HOST:PORT strings")
        rack = doc.get("rack")
        if rack is not None and not isinstance(rack, str):
            raise Malformed("broker record: rack must be a string")
        return cls(
            _field(doc, "node_id", int, "broker record"), _field(doc, "group", str, "broker record"), listeners, rack
        )

    def address(self, listener: str) -> tuple[str, int] | None:
        """(host, port) of a listener, or None when the broker has none of that name."""
        value = self.listeners.get(listener)
        if not value:
            return None
        host, _, port = value.rpartition(":")
        return (host, int(port)) if host and port.isdigit() else None


@dataclass(frozen=True, slots=True)
class ControllerRecord:
    node_id: int
    epoch: int

    @classmethod
    def decode(cls, data: bytes) -> ControllerRecord:
        doc = _load(data, "controller record")
        return cls(_field(doc, "node_id", int, "controller record"), _field(doc, "epoch", int, "controller record"))


@dataclass(frozen=True, slots=True)
class MasterRecord:
    node_id: int
    epoch: int

    @classmethod
    def decode(cls, data: bytes) -> MasterRecord:
        doc = _load(data, "master record")
        return cls(_field(doc, "node_id", int, "master record"), _field(doc, "epoch", int, "master record"))


@dataclass(frozen=True, slots=True)
class SyncStateRecord:
    """A group's in-sync replicas (Kafka's ISR, RocketMQ 5's SyncStateSet): the members holding every entry the
    master has acknowledged to acks=all producers. Only they may become master (unless an unclean election is
    asked for). Changed only by compare-and-set on the key's revision: by an election (the winner and the live
    members of the old set) and by the master (`master_epoch` its own) as replicas fall behind or catch up."""

    members: list[int]
    #: the master epoch under which this set was written
    master_epoch: int

    @classmethod
    def decode(cls, data: bytes) -> SyncStateRecord:
        what = "sync state record"
        doc = _load(data, what)
        members = _field(doc, "members", list, what)
        if not members or not all(isinstance(m, int) and not isinstance(m, bool) for m in members):
            raise Malformed(f"{what}: members must be a non-empty list of node ids")
        return cls(sorted(set(members)), _field(doc, "master_epoch", int, what))


@dataclass(frozen=True, slots=True)
class TopicRecord:
    #: the Kafka topic id, 32 hex digits
    topic_id: str
    #: topic-level settings that differ from the defaults (name -> value, as Kafka spells them)
    configs: dict[str, str]
    #: partition p lives in broker group partitions[p][0], as queue partitions[p][1] of that group's store
    partitions: list[tuple[str, int]] = field(default_factory=list)
    #: the epoch of the controller that wrote this version
    controller_epoch: int = 0
    #: the replication factor it was created with (-1: any group): added partitions go to groups that big
    replication_factor: int = -1
    #: partitions being moved to another broker group (AlterPartitionReassignments), by partition
    moves: list[PartitionMove] = field(default_factory=list)
    #: per partition, what its group's master epoch is raised by to give its leader epoch (empty: 0 for all). A
    #: partition that moved to another group keeps leader epochs that only go up (clients ignore a leader whose
    #: epoch went back), whatever the epoch of the group it moved to
    epoch_bases: list[int] = field(default_factory=list)
    #: [partition, leader epoch, offset] for each partition that moved: it arrived in its group at that leader
    #: epoch, with that end offset (OffsetForLeaderEpoch answers older epochs with it)
    arrivals: list[list[int]] = field(default_factory=list)
    #: [partition, group, end offset] for each group a partition moved away from (and has not come back to): the
    #: group deletes its records below that end (mqk.broker.cluster.reconcile), and a copy back into it must not
    #: need them (mqk.broker.moves)
    departures: list[list[Any]] = field(default_factory=list)

    @classmethod
    def decode(cls, data: bytes) -> TopicRecord:
        what = "topic record"
        doc = _load(data, what)
        topic_id = _field(doc, "topic_id", str, what)
        if len(topic_id) != 32 or any(c not in "0123456789abcdef" for c in topic_id):
            raise Malformed(f"{what}: topic_id must be 32 lower-case hex digits")
        configs = _field(doc, "configs", dict, what)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in configs.items()):
            raise Malformed(f"{what}: configs must map names to strings")
        raw = _field(doc, "partitions", list, what)
        partitions = []
        for item in raw:
            if (
                not isinstance(item, list)
                or len(item) != 2
                or not isinstance(item[0], str)
                or not isinstance(item[1], int)
                or item[1] < 0
            ):
                raise Malformed(f"{what}: a partition is [group, queue]")
            partitions.append((item[0], item[1]))
        if not partitions:
            raise Malformed(f"{what}: no partitions")
        rf = doc.get("replication_factor", -1)
        if not isinstance(rf, int) or isinstance(rf, bool):
            raise Malformed(f"{what}: replication_factor must be an integer")
        moves = [PartitionMove.decode(m, len(partitions)) for m in doc.get("moves", [])]
        bases = doc.get("epoch_bases", [])
        if not isinstance(bases, list) or not all(_is_int(b) for b in bases) or len(bases) > len(partitions):
            raise Malformed(f"{what}: epoch_bases must be a list of integers, at most one per partition")
        arrivals = doc.get("arrivals", [])
        if not isinstance(arrivals, list) or not all(
            isinstance(a, list) and len(a) == 3 and all(_is_int(v) for v in a) and 0 <= a[0] < len(partitions)
            for a in arrivals
        ):
            raise Malformed(f"{what}: arrivals must be [partition, leader epoch, offset] triples")
        departures = doc.get("departures", [])
        if not isinstance(departures, list) or not all(
            isinstance(d, list)
            and len(d) == 3
            and _is_int(d[0])
            and 0 <= d[0] < len(partitions)
            and isinstance(d[1], str)
            and _is_int(d[2])
            for d in departures
        ):
            raise Malformed(f"{what}: departures must be [partition, group, end offset] triples")
        return cls(
            topic_id,
            configs,
            partitions,
            _field(doc, "controller_epoch", int, what),
            rf,
            moves,
            bases,
            arrivals,
            departures,
        )

    @property
    def topic_id_bytes(self) -> bytes:
        return bytes.fromhex(self.topic_id)

    def queues_of(self, group: str) -> list[int]:
        """The partitions placed in `group`, in partition order (their queue ids there are the same numbers)."""
        return [p for p, (g, _q) in enumerate(self.partitions) if g == group]

    def epoch_base(self, partition: int) -> int:
        """What partition `partition`'s leader epoch adds to its group's master epoch (see `epoch_bases`)."""
        return self.epoch_bases[partition] if partition < len(self.epoch_bases) else 0

    def arrival(self, partition: int) -> tuple[int, int] | None:
        """(leader epoch, end offset) with which the partition arrived in its group, if it moved there."""
        for p, epoch, offset in self.arrivals:
            if p == partition:
                return epoch, offset
        return None

    def departure(self, partition: int, group: str) -> int | None:
        """The end offset at which the partition left `group`, if it did and has not come back."""
        for p, g, end in self.departures:
            if p == partition and g == group:
                return int(end)
        return None

    def move_of(self, partition: int) -> PartitionMove | None:
        for move in self.moves:
            if move.partition == partition:
                return move
        return None

    def moving_into(self, group: str) -> list[PartitionMove]:
        return [m for m in self.moves if m.target == group]

    def involves(self, group: str) -> bool:
        """Whether `group` holds one of the topic's partitions or is receiving one."""
        return any(g == group for g, _q in self.partitions) or any(m.target == group for m in self.moves)


#: a PartitionMove's states: its records are being copied to the target group; the source takes no more writes
#: for it (the copy catches up to its final end, then the partition switches groups)
MOVE_COPYING, MOVE_SEALED = "copying", "sealed"


@dataclass(frozen=True, slots=True)
class PartitionMove:
    """A partition on its way to another broker group (mqk.broker.moves says who does what at each step)."""

    partition: int
    #: the broker group it goes to (its queue id there is its partition number, as everywhere)
    target: str
    #: MOVE_COPYING or MOVE_SEALED
    state: str = MOVE_COPYING

    @classmethod
    def decode(cls, doc: Any, partition_count: int) -> PartitionMove:
        what = "partition move"
        if not isinstance(doc, dict):
            raise Malformed(f"{what}: not a JSON object")
        partition = _field(doc, "partition", int, what)
        if not 0 <= partition < partition_count:
            raise Malformed(f"{what}: no partition {partition}")
        state = _field(doc, "state", str, what)
        if state not in (MOVE_COPYING, MOVE_SEALED):
            raise Malformed(f"{what}: unknown state {state!r}")
        return cls(partition, _field(doc, "target", str, what), state)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """A metadata change a broker asks of the controller."""

    #: "create", "delete", "partitions", "configs"; moving a partition to another group: "move" (start, or
    #: cancel when `group` is ""), "move-seal", "move-switch" (mqk.broker.moves)
    op: str
    topic: str
    #: "create", "partitions": a partition count; the move ops: the partition
    partitions: int = 0
    configs: dict[str, str] = field(default_factory=dict)
    #: for "configs": the topic key's mod revision the new configs were computed from (0: any)
    base_revision: int = 0
    validate_only: bool = False
    #: the asker's lease: the controller writes the result under it
    lease: int = 0
    #: "create": how many brokers each partition's group must have (-1: any group)
    replication_factor: int = -1
    #: the move ops: the group the partition goes to
    group: str = ""
    #: "move-switch": the partition's end offset, which the target group's copy holds
    offset: int = -1

    @classmethod
    def decode(cls, data: bytes) -> RequestRecord:
        what = "request record"
        doc = _load(data, what)
        op = _field(doc, "op", str, what)
        if op not in REQUEST_OPS:
            raise Malformed(f"{what}: unknown op {op!r}")
        configs = doc.get("configs", {})
        if not isinstance(configs, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in configs.items()
        ):
            raise Malformed(f"{what}: configs must map names to strings")
        return cls(
            op,
            _field(doc, "topic", str, what),
            int(doc.get("partitions", 0)),
            configs,
            int(doc.get("base_revision", 0)),
            bool(doc.get("validate_only", False)),
            int(doc.get("lease", 0)),
            int(doc.get("replication_factor", -1)),
            str(doc.get("group", "")),
            int(doc.get("offset", -1)),
        )


REQUEST_OPS = ("create", "delete", "partitions", "configs", "move", "move-seal", "move-switch")


@dataclass(frozen=True, slots=True)
class ResultRecord:
    """The controller's answer: `error` is "" on success, else the mqk error class name, with `message`."""

    error: str = ""
    message: str = ""

    @classmethod
    def decode(cls, data: bytes) -> ResultRecord:
        doc = _load(data, "result record")
        return cls(str(doc.get("error", "")), str(doc.get("message", "")))


__all__ = [
    "BrokerRecord",
    "ControllerRecord",
    "Keys",
    "Malformed",
    "MasterRecord",
    "PartitionMove",
    "RequestRecord",
    "ResultRecord",
    "SyncStateRecord",
    "TopicRecord",
    "dump",
    "load_int",
    "load_members",
]


#: a TxnPartitionsRecord's states: the transaction is under way, or its coordinator decided it
TXN_ONGOING, TXN_COMMIT, TXN_ABORT = "ongoing", "commit", "abort"


@dataclass(frozen=True, slots=True)
class TxnPartitionsRecord:
    """The partitions a Kafka transaction writes in one broker group that does not coordinate it, and what its
    coordinator decided (mqk.broker.cluster.txn_partitions says who writes and deletes it)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    #: TXN_ONGOING, TXN_COMMIT or TXN_ABORT
    state: str
    #: [[topic, partition], ...] placed in the key's group
    partitions: list[list[Any]]
    #: the node that wrote it (the coordinator)
    coordinator: int

    @classmethod
    def decode(cls, data: bytes) -> TxnPartitionsRecord:
        what = "transaction partitions record"
        doc = _load(data, what)
        state = _field(doc, "state", str, what)
        if state not in (TXN_ONGOING, TXN_COMMIT, TXN_ABORT):
            raise Malformed(f"{what}: unknown state {state!r}")
        partitions = _field(doc, "partitions", list, what)
        for tp in partitions:
            if not (
                isinstance(tp, list)
                and len(tp) == 2
                and isinstance(tp[0], str)
                and isinstance(tp[1], int)
                and not isinstance(tp[1], bool)
            ):
                raise Malformed(f"{what}: partitions must be [topic, partition] pairs")
        return cls(
            _field(doc, "transactional_id", str, what),
            _field(doc, "producer_id", int, what),
            _field(doc, "producer_epoch", int, what),
            state,
            partitions,
            _field(doc, "coordinator", int, what),
        )

    def holds(self, topic: str, partition: int) -> bool:
        return [topic, partition] in self.partitions
