"""What a Kafka handler may use: `KafkaContext`, built once by the KafkaServer and handed to every handler.

A handler sees the broker's services (the store, the topic registry, the group coordinator, the producer-id
state, the wake-up hub, the clock, the security services), this broker's identity and advertised listener address,
and the API versions it serves; not the server, its connections or its sockets. From the connection that sent the
request it sees only `Peer`: whether it is closed (a long poll stops waiting), the client's host (group membership
shows it), the principal it acts as (what the authorizer is asked about), and the listener it came in through with
the address this broker is reached at there (Metadata answers with the addresses of that listener).

Handlers are `async def handler(ctx, peer, request) -> body`; see mqk.server.kafka.handlers. A handler names its
API's generated types (mqk.protocol.kafka.messages): it takes a `KafkaRequest[<Api>Request]` and returns the
`<Api>Response` body, so the type checker holds each handler to its API's fields. The handler tables erase those
types (the api key picks the handler at run time), which is why `Handler` and `Grouping` take `KafkaRequest[Any]`.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

from mqk.broker.hub import WakeupHub
from mqk.broker.logsizes import LogSizes
from mqk.broker.quotas import ClientQuotas
from mqk.broker.security import Principal, Security
from mqk.broker.stats import Traffic
from mqk.broker.topics import TopicRegistry
from mqk.clock import Clock
from mqk.config import BrokerConfig, TopicConfig
from mqk.groups.coordinator import GroupCoordinator
from mqk.server.kafka.idempotence import ProducerStates
from mqk.server.kafka.transactions import TransactionCoordinator
from mqk.server.listeners import KafkaListener
from mqk.store.manager import StoreManager

# typing only: cluster mode's modules (etcd client, controller, replication) load with --cluster alone (start-up)
if TYPE_CHECKING:
    from mqk.broker.cluster import ClusterMember
    from mqk.broker.cluster.share_ops import ShareOps
    from mqk.broker.moves import PartitionMoves
    from mqk.broker.replication import Replication


class Peer(Protocol):
    """The requesting connection, as a handler sees it."""

    @property
    def closed(self) -> bool: ...

    @property
    def client_host(self) -> str: ...

    @property
    def principal(self) -> Principal: ...

    @property
    def listener(self) -> KafkaListener: ...

    @property
    def advertised(self) -> tuple[str, int]:
        """This broker's address on the peer's listener, as clients are to be told it."""
        ...


_Body_co = TypeVar("_Body_co", covariant=True)


class KafkaRequest(Protocol[_Body_co]):
    """A decoded request as a handler sees it (mqk.protocol.kafka.codec.Request is one): `body` is the API's
    request TypedDict, with every field of the schema present (the decoder fills the ones a version lacks with
    their defaults)."""

    @property
    def api_version(self) -> int: ...

    @property
    def client_id(self) -> str | None: ...

    @property
    def body(self) -> _Body_co: ...

    @property
    def unsupported(self) -> bool: ...


@dataclass(slots=True, eq=False)
class KafkaContext:
    #: the broker's settings (read-only values: limits, flush mode, the static entries DescribeConfigs shows)
    config: BrokerConfig
    store: StoreManager
    topics: TopicRegistry
    groups: GroupCoordinator
    producers: ProducerStates
    hub: WakeupHub
    clock: Clock
    #: api key -> (min, max) version this broker serves (what ApiVersions advertises)
    supported: dict[int, tuple[int, int]]
    node_id: int
    cluster_id: str
    #: the first listener's advertised address (what was bound, port 0 resolved, unless configured) once the server
    #: has started; handlers answering with addresses use the requesting peer's listener (`Peer.advertised`)
    host: str
    port: int
    #: id(TopicConfig) -> (that config, its produce limits); see handlers.produce._limits
    produce_limits: dict[int, tuple[TopicConfig, tuple[int, bool, bool, int, int, int | None]]] = field(
        default_factory=dict
    )
    #: cluster mode: the cluster this broker is a member of (None: this broker is the whole cluster). Handlers ask
    #: it who leads a partition and who coordinates a group; what they cannot serve here they answer with
    #: NOT_LEADER_OR_FOLLOWER / NOT_COORDINATOR, which sends the client to the right broker
    cluster: ClusterMember | None = None
    #: cluster mode with the file engine: this broker's group's CommitLog replication (acks=all, high watermark)
    replication: Replication | None = None
    #: per-partition traffic-out counters for /metrics (mqk.broker.stats), None when metrics are off
    traffic: Traffic | None = None
    #: produced partitions the planning kernel left to the Produce handler's general path, by stop code
    #: (records.PlanStop), for /metrics; None when metrics are off
    produce_general_path: dict[int, int] | None = None
    #: per-partition log sizes (DescribeLogDirs); None only for a context built without a broker's
    log_sizes: LogSizes | None = None
    #: users, SASL mechanisms and the authorizer hook (the broker's; None only for a context built without one)
    security: Security | None = None
    #: produce and fetch byte-rate quotas (the broker's; None only for a context built without one)
    quotas: ClientQuotas | None = None
    #: Kafka transactions (mqk.server.kafka.transactions); None in cluster mode, which does not offer them yet
    transactions: TransactionCoordinator | None = None
    #: cluster mode: share group offset operations asked of the masters holding a group's partitions
    share_ops: ShareOps | None = None
    #: cluster mode with replication: partitions moving between broker groups (AlterPartitionReassignments)
    moves: PartitionMoves | None = None


class CloseConnection:
    """A handler's answer meaning "send nothing and close this connection once the earlier answers are out"
    (Kafka does this when an acks=0 produce fails, so the producer notices and refreshes its metadata)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


#: what a handler answers: the response body (an API's response TypedDict), None (no response) or CloseConnection
Answer: TypeAlias = Mapping[str, Any] | CloseConnection | None
#: a handler: (context, requesting connection, request) -> its answer
Handler: TypeAlias = Callable[[KafkaContext, Peer, KafkaRequest[Any]], Coroutine[Any, Any, Answer]]
#: a grouped API's pair (handlers.GROUPED): prepare(context, peer, request) -> a plan or None (answer it alone), and
#: answer(context, plans) -> one answer per plan, in order
Grouping: TypeAlias = tuple[
    Callable[[KafkaContext, Peer, KafkaRequest[Any]], object],
    Callable[[KafkaContext, list[Any]], Coroutine[Any, Any, Sequence[Answer]]],
]
