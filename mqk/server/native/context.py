"""State the broker's remoting processors share: the broker services (topic registry, wake-up hub, clock; see
mqk.broker), the broker's own address, message lookup by commit-log offset, and RocketMQ's view of topics.

Lookup by commit-log offset: RocketMQ clients name a message by it (CONSUMER_SEND_MSG_BACK, VIEW_MESSAGE_BY_ID;
the message id carries it). A message's commit-log offset is its batch's physical offset plus the record's offset
delta, and `store.read_at(physical offset)` finds the batch durably on every engine (after a restart too), so the
first record of a batch (every RocketMQ-produced message: one record a batch) needs no memory here. What
`read_at` cannot name is remembered in a bounded LRU: later records of a multi-record (Kafka-produced) batch, and
messages of batches without a physical offset (compacted file batches), whose synthetic offset `resolve` can also
decode on a miss. A miss answers "not found", which RocketMQ clients handle by re-sending the message themselves.

RocketMQ's view of a topic (`topic_config`): read and write queue numbers are both the topic's partition count
(a RocketMQ queue is a Kafka partition); perm is read+write (mqk has no per-topic permissions); the filter type
is SINGLE_TAG (the ConsumeQueue keeps one tags code per entry); no sys flag, not ordered.

Queue ids in cluster mode: RocketMQ numbers a topic's queues per broker (0..n-1 on each broker group), Kafka numbers
partitions across the cluster. A cluster topic's queues on this broker are the partitions placed in its group, in
partition order: RocketMQ queue i here is `local_partitions(topic)[i]`. Processors turn a client's queue id into
the partition (`to_partition`) as they read a request and back (`to_queue`) as they answer; everything between
(the store, message ids, committed offsets: shared with Kafka consumers of the same group) speaks partitions. On a
broker on its own, and for topics local by nature (retry, DLQ, the timer's), both numberings are the same.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from mqk.broker import Broker
from mqk.config import BrokerConfig
from mqk.errors import StorageError
from mqk.protocol.native.codes import PERM_READ, PERM_WRITE
from mqk.protocol.native.message import MessageExt
from mqk.protocol.native.records import batch_to_messages, synthetic_matches, synthetic_queue_offset
from mqk.store.adapter import StoredBatch
from mqk.store.manager import StoreManager

# typing only: cluster mode's modules (etcd client, controller, replication) load with --cluster alone (start-up)
if TYPE_CHECKING:
    from mqk.broker.replication import Replication

log = logging.getLogger("mqk.native")

#: ~150 bytes an entry: 100k recent messages cost ~15 MB
LOCATION_CACHE_SIZE = 100_000


class BrokerContext:
    def __init__(self, config: BrokerConfig, store: StoreManager, *, broker: Broker | None = None) -> None:
        """`broker`: the broker services shared with the other front doors (one is made for this context alone
        when not given)."""
        self.config = config
        self.store = store
        self.broker = broker if broker is not None else Broker(config, store)
        self.topics = self.broker.topics
        self.hub = self.broker.hub
        self.clock = self.broker.clock
        self.host: tuple[str, int] = config.native_listen
        #: cluster mode with the file engine: the group's CommitLog replication (a SYNC_MASTER's sends wait on it)
        self.replication: Replication | None = None
        self._locations: OrderedDict[int, tuple[str, int, int]] = OrderedDict()

    # --- traffic counters (/metrics) -------------------------------------------------------------------------

    def count_out(self, topic: str, partition: int, records: int, nbytes: int, group: str = "") -> None:
        """Messages a pull of `group` served (the bytes of their encoded form), when metrics are on."""
        stats = self.broker.stats
        if stats is not None:
            counts = stats.traffic.topic(topic, partition + 1)
            counts.records_out[partition] += records
            counts.bytes_out[partition] += nbytes
            key = (group, topic)
            stats.group_reads[key] = stats.group_reads.get(key, 0) + records

    def now_ms(self) -> int:
        """Wall-clock milliseconds on the broker's clock."""
        return self.clock.time_ms()

    # --- message locations -------------------------------------------------------------------------------

    def remember(self, commit_offset: int, topic: str, queue: int, offset: int) -> None:
        locations = self._locations
        locations[commit_offset] = (topic, queue, offset)
        locations.move_to_end(commit_offset)
        if len(locations) > LOCATION_CACHE_SIZE:
            locations.popitem(last=False)

    async def resolve(self, commit_offset: int, topics: Iterable[str] | None = None) -> MessageExt | None:
        """The message a commit-log offset names, or None. `topics`, when given, are the only topics it may be in
        (a send-back names the original topic; the message may also sit in the group's retry topic): the cache
        and the synthetic form can both collide across topics, the topic cannot."""
        allowed = None if topics is None else set(topics)
        found = await self.store.read_at(commit_offset)
        if found is not None and (allowed is None or found[0] in allowed):
            topic, queue, batch = found
            for msg in self.to_messages(topic, queue, batch):
                if msg.commit_log_offset == commit_offset:
                    return msg
        candidates: list[tuple[str, int, int]] = []
        where = self._locations.get(commit_offset)
        if where is not None and (allowed is None or where[0] in allowed):
            candidates.append(where)
        offset = synthetic_queue_offset(commit_offset)
        for topic, info in self.topics.all().items():
            if allowed is not None and topic not in allowed:
                continue
            for queue in range(info.queue_count):
                if synthetic_matches(commit_offset, topic, queue) and (topic, queue, offset) not in candidates:
                    candidates.append((topic, queue, offset))
        for topic, queue, offset in candidates:
            for msg in await self.read_messages(topic, queue, offset, 1):
                if msg.queue_offset == offset and msg.commit_log_offset == commit_offset:
                    return msg
        return None

    async def read_messages(
        self, topic: str, queue: int, offset: int, max_count: int, max_bytes: int = 1 << 20
    ) -> list[MessageExt]:
        try:
            result = await self.store.read(topic, queue, offset, max_bytes)
        except StorageError:
            return []
        out: list[MessageExt] = []
        for batch in result.batches:
            out += self.to_messages(topic, queue, batch, offset)
            if len(out) >= max_count:
                break
        return out[:max_count]

    def to_messages(self, topic: str, queue: int, batch: StoredBatch, min_offset: int = 0) -> list[MessageExt]:
        phys = batch.physical_offset
        msgs = batch_to_messages(batch.data, topic, queue, batch.store_timestamp, phys, self.host, min_offset)
        for msg in msgs:
            if msg.commit_log_offset != phys:  # read_at names only a batch's first record
                self.remember(msg.commit_log_offset, topic, queue, msg.queue_offset)
        return msgs

    # --- topics ---------------------------------------------------------------------------------------------

    def local_partitions(self, topic: str) -> list[int] | None:
        """Cluster mode: the partitions of a cluster topic placed in this broker's group, in order (its RocketMQ
        queues here); None where queue ids are partitions (a broker on its own, a topic local by nature)."""
        cluster = self.broker.cluster
        if cluster is None:
            return None
        record = cluster.topic(topic)
        return None if record is None else record.queues_of(cluster.group)

    def topic_identity(self, topic: str) -> tuple[uuid.UUID, int] | None:
        """(topic id, partition count) of a stored topic, or None (what the share groups' engine asks)."""
        info = self.store.topic(topic)
        return None if info is None else (uuid.UUID(bytes=bytes(info.topic_id)), info.queue_count)

    def queue_count(self, topic: str) -> int:
        """How many RocketMQ queues the topic has on this broker (0: the topic does not exist)."""
        local = self.local_partitions(topic)
        return self.topics.queue_count(topic) if local is None else len(local)

    def to_partition(self, topic: str, queue: int) -> int:
        """The partition behind RocketMQ queue `queue` of `topic` here (the caller checked queue < queue_count)."""
        local = self.local_partitions(topic)
        return queue if local is None else local[queue]

    def to_queue(self, topic: str, partition: int) -> int:
        """The RocketMQ queue id partition `partition` has on this broker."""
        local = self.local_partitions(topic)
        return partition if local is None or partition not in local else local.index(partition)

    async def ensure_topic(self, topic: str, queues: int) -> int:
        """Create `topic` with `queues` queues unless it exists; returns its queue count here."""
        await self.topics.ensure(topic, queues)
        return self.queue_count(topic)

    @staticmethod
    def topic_config(topic: str, queues: int) -> dict[str, Any]:
        """RocketMQ's TopicConfig of a topic with `queues` queues (see the module docstring)."""
        return {
            "topicName": topic,
            "readQueueNums": queues,
            "writeQueueNums": queues,
            "perm": PERM_READ | PERM_WRITE,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": False,
        }
