"""Internal topics: the one list of the topics the broker keeps for itself, and what each front door may do with
them.

Three kinds of names are not ordinary user topics:

- INTERNAL: the broker's own logs, written only by its services. Kafka's Metadata marks them `is_internal`, so
  Kafka clients leave them out of topic listings and pattern subscriptions. These are the timer's
  `__mqk_timer` (delayed messages wait there, mqk.timer) with, in cluster mode, its progress in
  `__mqk_timer_state`, and RocketMQ's transaction topics: half messages in
  `RMQ_SYS_TRANS_HALF_TOPIC`, their commit/rollback records in `RMQ_SYS_TRANS_OP_HALF_TOPIC`
  (mqk.server.native.transaction). Refusing client writes and deletes to them is the authorizer's job; until then
  this module only says which they are.
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


#: internal topic -> the part of the broker that owns it
INTERNAL_TOPICS: dict[str, str] = {
    TIMER_TOPIC: "mqk.timer (delayed and scheduled messages)",
    TIMER_STATE_TOPIC: "mqk.timer (its delivery progress, cluster mode)",
    TRANSACTION_HALF_TOPIC: "mqk.server.native.transaction (half messages)",
    TRANSACTION_OP_TOPIC: "mqk.server.native.transaction (commit and rollback records)",
}
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


def created_on_demand(topic: str) -> bool:
    """A topic the broker creates when first used, whatever `auto_create_topics` says (GROUP topics)."""
    return topic.startswith(GROUP_TOPIC_PREFIXES)


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group
