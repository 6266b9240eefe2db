"""Internal topics: the one list of the topics the broker keeps for itself, and what each front door may do with
them.

Three kinds of names are not ordinary user topics:

- INTERNAL: the broker's own logs, written only by its services. Kafka's Metadata marks them `is_internal`, so
  Kafka clients leave them out of topic listings and pattern subscriptions. Two families:
  - local by nature (`is_local`: each broker keeps its own, never placed by a cluster's controller): the timer's
    `__mqk_timer` (delayed messages wait there, mqk.timer) with, in cluster mode, its progress in
    `__mqk_timer_state`, RocketMQ's transaction topics: half messages in `RMQ_SYS_TRANS_HALF_TOPIC`, their
    commit/rollback records in `RMQ_SYS_TRANS_OP_HALF_TOPIC` (mqk.server.native.transaction), and Kafka's
    `__transaction_state` (the transaction coordinator's state, mqk.server.kafka.transactions: in a cluster,
    each group's master coordinates the transactional ids placed on it, and keeps them in its own log), and
    `__share_group_state` (the share groups' record states and RocketMQ's subscription group configs,
    mqk.groups.share: in a cluster, each group's master keeps the POP states of the queues it holds, as a RocketMQ
    broker keeps its own subscription groups);
  - Kafka's own, placed across a cluster like user topics: `__consumer_offsets` (committed offsets, cluster mode).
  Clients may read them, but never write, delete, grow or reconfigure them, whoever they are: the policy below
  (`client_change_refusal`) is applied by every front door before any authorization, as Kafka refuses appends to
  its internal topics to every client. Kafka answers a Produce with INVALID_TOPIC_EXCEPTION ("cannot append to
  internal topic"); mqk answers the admin APIs (DeleteTopics, CreatePartitions, AlterConfigs,
  IncrementalAlterConfigs, DeleteRecords) with TOPIC_AUTHORIZATION_FAILED, as a broker that protects a topic from
  deletion does; RocketMQ's send answers NO_PERMISSION ("Sending message to topic[...] is forbidden"), as RocketMQ
  does for its system topics (`ROCKETMQ_NO_SEND` adds the ones RocketMQ refuses that mqk does not use). A client
  cannot create one under an internal name either (auto-creation skips them; CreateTopics refuses them).
- GROUP: a RocketMQ consumer group's retry topic (`%RETRY%<group>`) and dead-letter topic (`%DLQ%<group>`).
  Clients read them (a consumer subscribes to its retry topic; operators read the dead letters), so they are not
  internal, but the broker creates them on demand, with one queue, whatever `auto_create_topics` says, as a
  RocketMQ broker does. Only RocketMQ's alphabet (mqk.broker.names) can name them.
- the RocketMQ auto-create key `TBW102`: the route RocketMQ producers ask for when their own topic does not exist
  yet. The name server answers it while auto-creation is on; it is never created as a topic.

The names are RocketMQ's and mqk's own and must stay as they are on disk: a renamed internal topic would orphan
the messages already in it.
"""

from __future__ import annotations

import enum

from mqk.broker.names import KAFKA
from mqk.groups.share import SHARE_GROUP_STATE_TOPIC
from mqk.protocol.kafka.offset_records import OFFSETS_TOPIC
from mqk.timer import TIMER_STATE_TOPIC, TIMER_TOPIC

#: RocketMQ's transaction topics (MQ 4.x TransactionalMessageUtil)
TRANSACTION_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANSACTION_OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
#: RocketMQ's per-consumer-group topics (MixAll.RETRY_GROUP_TOPIC_PREFIX / DLQ_GROUP_TOPIC_PREFIX)
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
#: RocketMQ's auto-create key topic (TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC)
AUTO_CREATE_KEY = "TBW102"


class TopicKind(enum.Enum):
    USER = "user"
    INTERNAL = "internal"
    GROUP = "group"


#: Kafka's transaction coordinator's topic (mqk.server.kafka.transactions; no client may make or write it)
TRANSACTION_STATE_TOPIC = "__transaction_state"

#: internal topic local by nature -> the part of the broker that owns it
LOCAL_INTERNAL_TOPICS: dict[str, str] = {
    TIMER_TOPIC: "mqk.timer (delayed and scheduled messages)",
    TIMER_STATE_TOPIC: "mqk.timer (its delivery progress, cluster mode)",
    TRANSACTION_HALF_TOPIC: "mqk.server.native.transaction (half messages)",
    TRANSACTION_OP_TOPIC: "mqk.server.native.transaction (commit and rollback records)",
    TRANSACTION_STATE_TOPIC: "mqk.server.kafka.transactions (transaction coordinator state)",
    SHARE_GROUP_STATE_TOPIC: "mqk.groups.share (share groups' record states, subscription group configs)",
}
#: Kafka's internal topics (placed in a cluster like user topics) -> their owner
KAFKA_INTERNAL_TOPICS: dict[str, str] = {
    OFFSETS_TOPIC: "mqk.store.offsets_log (committed group offsets, cluster mode)",
}
#: every internal topic -> its owner
INTERNAL_TOPICS: dict[str, str] = {**LOCAL_INTERNAL_TOPICS, **KAFKA_INTERNAL_TOPICS}
#: RocketMQ's system topics its broker refuses sends to (TopicValidator's not-allowed-send set), beyond mqk's own
#: internal topics: mqk uses none of them, and refuses a send to them as RocketMQ does
ROCKETMQ_NO_SEND = frozenset(
    {"SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"}
)
GROUP_TOPIC_PREFIXES = (RETRY_PREFIX, DLQ_PREFIX)
#: the queue count of a topic created on demand (GROUP topics, the transaction topics)
ON_DEMAND_QUEUES = 1


def kind_of(topic: str) -> TopicKind:
    if topic in INTERNAL_TOPICS:
        return TopicKind.INTERNAL
    if topic.startswith(GROUP_TOPIC_PREFIXES):
        return TopicKind.GROUP
    return TopicKind.USER


def is_internal(topic: str) -> bool:
    """Written only by the broker's own services (Kafka Metadata's `is_internal`)."""
    return topic in INTERNAL_TOPICS


def is_local(topic: str) -> bool:
    """An internal topic each broker keeps for itself (never the cluster's: see the module docstring)."""
    return topic in LOCAL_INTERNAL_TOPICS


def client_change_refusal(topic: str) -> str | None:
    """Why no client may write, delete, grow or reconfigure `topic`, or None if one may (subject to its rights)."""
    if topic in INTERNAL_TOPICS:
        return f"{topic} is an internal topic, written only by the broker ({INTERNAL_TOPICS[topic]})"
    return None


def rocketmq_send_refusal(topic: str) -> str | None:
    """Why a RocketMQ producer may not send to `topic` (RocketMQ's words), or None."""
    if topic in INTERNAL_TOPICS or topic in ROCKETMQ_NO_SEND:
        return f"Sending message to topic[{topic}] is forbidden."
    return None


def rocketmq_system_refusal(topic: str) -> str | None:
    """Why a RocketMQ 5 client may not name `topic` at all (route, send, receive), as RocketMQ's proxy refuses its
    system topics: mqk's internal topics, RocketMQ's own and the auto-creation key. None if it may."""
    if topic in INTERNAL_TOPICS or topic in ROCKETMQ_NO_SEND or topic == AUTO_CREATE_KEY:
        return f"cannot access system topic [{topic}]"
    return None


def listed_to_kafka(topic: str) -> bool:
    """Whether a Kafka Metadata request for every topic lists `topic`: not a name Kafka's alphabet cannot spell
    (RocketMQ's `%RETRY%group`, `%DLQ%group`, `ns%topic`); those are answered when asked for by name."""
    return KAFKA.allows(topic)


def created_on_demand(topic: str) -> bool:
    """A topic the broker creates when first used, whatever `auto_create_topics` says (GROUP topics)."""
    return topic.startswith(GROUP_TOPIC_PREFIXES)


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group
