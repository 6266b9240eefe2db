"""The broker layer: protocol-neutral policy and services both front doors (Kafka, RocketMQ) use.

- `Broker` (core): one per process; holds the store, the topic registry, the wake-up hub and the clock;
- `topics.TopicRegistry`: lookup, creation (with the auto-create policy), deletion, partitions, settings, ids;
- `names`: the topic-name rule set; `internal`: the internal topics and their policy;
- `topic_config`: the per-topic settings schema applied on every creation and alteration;
- `hub.WakeupHub`: long polls (Kafka Fetch, RocketMQ pull) wait here for their partitions to grow;
- `accepted.AcceptedTransports`: the sockets a listener accepted (every front door's, the replication listener's),
  so that a stopped listener leaves none open.

Layering: imported by mqk.server (and the runtime); imports the store, the timer, the clock and mqk.config, never
mqk.protocol or mqk.server.
"""

from __future__ import annotations

from mqk.broker.core import Broker
from mqk.broker.hub import WakeupHub
from mqk.broker.topics import TopicRegistry

__all__ = ["Broker", "TopicRegistry", "WakeupHub"]
