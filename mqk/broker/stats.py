"""The counters the front doors keep for /metrics: plain ints in lists and dicts, read only when scraped.

What is counted, and where:
- traffic out per topic partition (`Traffic`): record-batch bytes and records served to consumers (Kafka Fetch,
  RocketMQ pull). A fetch serves whole batches, so records out counts every record of a batch sent, including those
  before the fetch offset. What went in is not counted here: the store tells it when asked (mqk.broker.logsizes), so
  the produce path pays nothing for it;
- requests per listener and API (`RequestMeter`): how many were answered, how long each took from its decoding to
  its answer (bucket counts and the sum, a histogram's parts), and the error codes the answers carried;
- connections per listener: how many were accepted (the listener's own connection set is the live count).

Nothing here names an API or formats a metric (the broker layer does not know the protocols): the admin listener
(mqk.server.admin) turns these counters into Prometheus families when /metrics is scraped, with the protocols'
names. A count costs its path a list index and an add; with `BrokerConfig.metrics` off the Broker keeps no
`BrokerStats` and the front doors skip every count.
"""

from __future__ import annotations

from bisect import bisect_left

#: request latency histogram bucket upper bounds, in seconds (the last bucket, +Inf, is implied)
LATENCY_BOUNDS_S: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_BOUNDS_NS = tuple(round(b * 1e9) for b in LATENCY_BOUNDS_S)


class TopicTraffic:
    """One topic's traffic out, a list entry per partition (index = partition)."""

    __slots__ = ("bytes_out", "records_out")

    def __init__(self, partitions: int) -> None:
        self.bytes_out = [0] * partitions
        self.records_out = [0] * partitions

    def grow(self, partitions: int) -> None:
        more = partitions - len(self.bytes_out)
        if more > 0:
            for counts in (self.bytes_out, self.records_out):
                counts.extend([0] * more)


class Traffic:
    """Every topic's traffic out since this broker started (a topic deleted and created again starts from 0)."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicTraffic] = {}

    def topic(self, name: str, partitions: int) -> TopicTraffic:
        """The topic's counters, with an entry for each of its `partitions` (asked once per topic per request,
        so the per-partition counts index the lists without a bounds check of their own)."""
        traffic = self.topics.get(name)
        if traffic is None:
            traffic = self.topics[name] = TopicTraffic(partitions)
        elif len(traffic.bytes_out) < partitions:
            traffic.grow(partitions)
        return traffic

    def forget(self, keep: set[str]) -> None:
        """Drop the counters of topics no longer in `keep` (deleted ones), so they stop being reported."""
        for name in [n for n in self.topics if n not in keep]:
            del self.topics[name]


class ApiStats:
    """One API's answered requests: count, latency sum (ns) and latency bucket counts (LATENCY_BOUNDS_S + +Inf)."""

    __slots__ = ("buckets", "count", "sum_ns")

    def __init__(self) -> None:
        self.count = 0
        self.sum_ns = 0
        self.buckets = [0] * (len(_BOUNDS_NS) + 1)


class RequestMeter:
    """The requests of one listener, by API number (a Kafka api key, a RocketMQ request code)."""

    def __init__(self, listener: str, protocol: str) -> None:
        self.listener = listener
        self.protocol = protocol
        self.apis: dict[int, ApiStats] = {}
        #: (api, error code) -> answers that carried it (a Kafka answer counts each partition's code)
        self.errors: dict[tuple[int, int], int] = {}
        self.connections_accepted = 0

    def record(self, api: int, elapsed_ns: int) -> None:
        stats = self.apis.get(api)
        if stats is None:
            stats = self.apis[api] = ApiStats()
        stats.count += 1
        stats.sum_ns += elapsed_ns
        stats.buckets[bisect_left(_BOUNDS_NS, elapsed_ns)] += 1

    def error(self, api: int, code: int, count: int = 1) -> None:
        key = (api, code)
        self.errors[key] = self.errors.get(key, 0) + count


class BrokerStats:
    """The counters of one broker process: traffic, and a RequestMeter per listener."""

    def __init__(self) -> None:
        self.traffic = Traffic()
        self.meters: dict[str, RequestMeter] = {}
        #: (consumer group, topic) -> records served to the group by RocketMQ pulls (its consume rate); Kafka
        #: fetches name no group
        self.group_reads: dict[tuple[str, str], int] = {}
        #: produced partitions that the append planning kernel left to the general path, by its stop code (a
        #: partition it plans costs nothing here)
        self.produce_general_path: dict[int, int] = {}

    def meter(self, listener: str, protocol: str) -> RequestMeter:
        """The listener's meter (made on first use)."""
        meter = self.meters.get(listener)
        if meter is None:
            meter = self.meters[listener] = RequestMeter(listener, protocol)
        return meter


__all__ = ["LATENCY_BOUNDS_S", "ApiStats", "BrokerStats", "RequestMeter", "TopicTraffic", "Traffic"]
