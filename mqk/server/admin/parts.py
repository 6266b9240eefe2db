"""What the admin listener reads: the running broker's parts, as `BrokerParts` names them.

The runtime (mqk.runtime.BrokerRuntime) is one: the admin listener starts before the store and the front doors, so
every part may still be None (start-up, recovery) or be None again (stopping); readers cope with that. The admin
package sees the parts through this protocol only, never the runtime module above it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from mqk.clock import Clock
from mqk.config import BrokerConfig
from mqk.server.kafka.server import KafkaServer
from mqk.server.native.namesrv import NameServer
from mqk.server.native.server import NativeServer
from mqk.services.compaction import CompactionService
from mqk.services.diskguard import DiskGuard
from mqk.services.retention import RetentionService
from mqk.store.manager import StoreManager
from mqk.timer import TimerService

# typing only: cluster mode's modules (etcd client, controller, replication) load with --cluster alone (start-up)
if TYPE_CHECKING:
    from mqk.broker import Broker
    from mqk.broker.cluster import ClusterMember
    from mqk.broker.replication import Replication

Address = tuple[str, int]


class BrokerParts(Protocol):
    config: BrokerConfig
    clock: Clock
    #: True once every part started (the ready line is due), False before and from the start of a stop
    started: bool
    store: StoreManager | None
    broker: Broker | None
    kafka: KafkaServer | None
    native: NativeServer | None
    namesrv: NameServer | None
    timer: TimerService | None
    retention: RetentionService | None
    diskguard: DiskGuard | None
    compaction: CompactionService | None
    cluster: ClusterMember | None
    replication: Replication | None
    kafka_address: Address | None
    native_address: Address | None
    namesrv_address: Address | None


__all__ = ["Address", "BrokerParts"]
