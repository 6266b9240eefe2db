"""/metrics: the broker's counters and state as Prometheus metric families, built only when scraped.

A scrape takes two steps. `snapshot` runs on the event loop: it copies the plain counters of the fetch and request
paths (mqk.broker.stats), reads offsets, group commits, store, service and listener figures, and waits for what needs
waiting (log sizes and what each partition took in, counted from the store incrementally: mqk.broker.logsizes; the
data directory's disk use, measured in a thread). `render` then runs in a worker thread on that copy alone: it
builds the families with prometheus-client and encodes them (text format, or OpenMetrics when the scraper asks for
it), so formatting thousands of samples never holds up the loop and never reads state the loop is changing.

Names and labels follow Prometheus conventions: `mqk_` prefix, base units (bytes, seconds), counters ending in
`_total`. Per partition: `topic`, `partition`; per consumer group: `group`; requests: `listener` (kafka, rocketmq,
namesrv), `protocol` (kafka, rocketmq), `api` (Kafka's API name, RocketMQ's request code name) and, for errors,
`error` (Kafka's error name, RocketMQ's response code name). The process's own figures come from prometheus-client's
process collector (`process_*`).
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from mqk import __version__
from mqk.broker.stats import LATENCY_BOUNDS_S
from mqk.errors import KafkaError
from mqk.protocol.kafka import messages as kafka_messages
from mqk.protocol.kafka.api import ApiKey
from mqk.protocol.kafka.codec import DECLINED, Declined
from mqk.protocol.kafka.records import PlanStop
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.server.admin.health import readiness
from mqk.server.admin.parts import BrokerParts

PROTOCOL_LISTENERS = {"kafka": "kafka", "rocketmq": "rocketmq", "namesrv": "rocketmq"}


# --- names ---------------------------------------------------------------------------------------------------


#: the APIs whose bodies hand-written kernels decode or encode (mqk.protocol.kafka.codec)
_KERNEL_APIS = (ApiKey.PRODUCE, ApiKey.FETCH)


def kafka_api_name(key: int) -> str:
    entry = kafka_messages.MESSAGES.get(key)
    return entry[0] if entry is not None else f"api_{key}"


def kafka_error_name(code: int) -> str:
    """Kafka's name of an error code (UNKNOWN_TOPIC_OR_PARTITION), as its ErrorsPerSec metric labels it."""
    cls = KafkaError.for_code(code)
    if cls.code != code:
        return f"CODE_{code}"
    name = cls.__name__.removesuffix("Error")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def rocketmq_code_name(code: int, table: type[RequestCode] | type[ResponseCode]) -> str:
    try:
        return table(code).name
    except ValueError:
        return f"CODE_{code}"


def rocketmq_api(code: int) -> str:
    return rocketmq_code_name(code, RequestCode)


def rocketmq_error(code: int) -> str:
    return rocketmq_code_name(code, ResponseCode)


# --- the snapshot (on the loop) ------------------------------------------------------------------------------


@dataclass
class MeterSnapshot:
    listener: str
    protocol: str
    #: (api name, count, latency sum in seconds, bucket counts)
    apis: list[tuple[str, int, float, list[int]]]
    #: (api name, error name, count)
    errors: list[tuple[str, str, int]]
    accepted: int
    live: int


@dataclass
class Snapshot:
    info: dict[str, str]
    ready: bool
    #: (topic, bytes out, records out), one list entry per partition
    traffic: list[tuple[str, list[int], list[int]]] = field(default_factory=list)
    #: (topic, partition, log start offset, log end offset, log size in bytes, records appended, bytes appended)
    partitions: list[tuple[str, int, int, int, int, int, int]] = field(default_factory=list)
    #: (group, state, members, [(topic, partition, committed offset, log end offset)])
    groups: list[tuple[str, str, int, list[tuple[str, int, int, int]]]] = field(default_factory=list)
    meters: list[MeterSnapshot] = field(default_factory=list)
    #: (why, how many): produced partitions left to the Produce handler's general path (records.PlanStop)
    produce_general_path: list[tuple[str, int]] = field(default_factory=list)
    #: (api, why, how many): Produce and Fetch bodies the hand-written codec kernels left to the generated codec
    codec_declined: list[tuple[str, str, int]] = field(default_factory=list)
    #: the file engine's figures (empty without one)
    store: dict[str, Any] = field(default_factory=dict)
    #: data directory: used bytes, file system size and available bytes; disk guard figures
    disk: dict[str, float] = field(default_factory=dict)
    services: dict[str, float] = field(default_factory=dict)
    #: (topic, partition, offset the compactor has cleaned up to)
    cleaned: list[tuple[str, int, int]] = field(default_factory=list)


async def snapshot(parts: BrokerParts, *, disk: bool = True) -> Snapshot:
    """Copy what /metrics reports, on the event loop (see the module docstring). `disk=False` leaves out the data
    directory's disk use (a walk of the directory), for a caller that polls often and does not show it."""
    config = parts.config
    ready, _checks = readiness(parts)
    info = {
        "version": __version__,
        "node_id": str(config.node_id),
        "cluster_id": config.cluster_id,
        "broker_group": config.group_name,
        "cluster_mode": "true" if config.cluster else "false",
    }
    snap = Snapshot(info, ready)
    broker = parts.broker
    # (the store answers once it started, which is when the runtime makes the Broker)
    store = parts.store if broker is not None else None
    stats = broker.stats if broker is not None else None
    topics = store.topics() if store is not None else {}

    if stats is not None:
        stats.traffic.forget(set(topics))
        for name, t in sorted(stats.traffic.topics.items()):
            snap.traffic.append((name, list(t.bytes_out), list(t.records_out)))
        general = stats.produce_general_path
        snap.produce_general_path = [
            (stop.name.lower(), general.get(stop, 0)) for stop in PlanStop if stop is not PlanStop.END
        ]
        snap.codec_declined = [
            (kafka_api_name(api), why.name.lower(), DECLINED[(api, why)]) for api in _KERNEL_APIS for why in Declined
        ]
        live = _live_connections(parts)
        for listener, meter in sorted(stats.meters.items()):
            api_name, error_name = (
                (kafka_api_name, kafka_error_name) if meter.protocol == "kafka" else (rocketmq_api, rocketmq_error)
            )
            snap.meters.append(
                MeterSnapshot(
                    listener,
                    meter.protocol,
                    [
                        (api_name(api), s.count, s.sum_ns / 1e9, list(s.buckets))
                        for api, s in sorted(meter.apis.items())
                    ],
                    [(api_name(api), error_name(code), n) for (api, code), n in sorted(meter.errors.items())],
                    meter.connections_accepted,
                    live.get(listener, 0),
                )
            )

    if store is not None:
        assert broker is not None
        sizes = broker.log_sizes
        sizes.forget_deleted()
        for name, shard in sorted(topics.items()):
            bounds = store.offset_bounds_many(name, list(range(shard.queue_count)))
            for partition, bound in enumerate(bounds):
                if bound is None:
                    continue
                size = await sizes.size(name, partition)
                appended = await sizes.bytes_appended(name, partition)
                records = sizes.records_appended(name, partition)
                snap.partitions.append((name, partition, bound[0], bound[1], size, records, appended))
        snap.groups = _groups(parts)
        snap.store = _store_figures(store)
        if disk:
            snap.disk = await _disk(parts)
    snap.services = _services(parts)
    if parts.compaction is not None and store is not None:
        snap.cleaned = _cleaned(parts)
    return snap


def _live_connections(parts: BrokerParts) -> dict[str, int]:
    live = {}
    if parts.kafka is not None:
        live["kafka"] = len(parts.kafka.connections)
    if parts.native is not None:
        live["rocketmq"] = len(parts.native.connections)
    if parts.namesrv is not None:
        live["namesrv"] = len(parts.namesrv.connections)
    return live


def _groups(parts: BrokerParts) -> list[tuple[str, str, int, list[tuple[str, int, int, int]]]]:
    store = parts.store
    assert store is not None
    coordinator = parts.kafka.groups if parts.kafka is not None else None
    ids = set(store.list_offset_groups())
    if coordinator is not None:
        ids.update(coordinator.groups)
    out = []
    for group_id in sorted(ids):
        state, members = "Empty", 0
        if coordinator is not None:
            group = coordinator.groups.get(group_id)
            if group is not None:
                state, members = group.state, len(group.members)
        commits = []
        for (topic, partition), committed in sorted(store.fetch_offsets(group_id).items()):
            info = store.topic(topic)
            if info is None or not 0 <= partition < info.queue_count:
                continue
            commits.append((topic, partition, committed.offset, store.end_offset(topic, partition)))
        out.append((group_id, state, members, commits))
    return out


def _store_figures(store: Any) -> dict[str, Any]:
    engine = store.engines.get("file")
    stats = getattr(engine, "stats", None)
    if engine is None or stats is None:
        return {}
    clog = engine.clog
    figures: dict[str, Any] = {
        "puts": stats.puts,
        "put_bytes": stats.put_bytes,
        "put_failures": stats.put_failures,
        "latency_bounds_us": stats.BOUNDS_US,
        "latency_buckets": list(stats.latency_buckets),
        "latency_sum_s": stats.latency_sum_ns / 1e9,
        "commitlog_start": clog.min_offset,
        "commitlog_end": clog.max_offset,
        "dispatch_lag": stats.dispatch_lag,
    }
    flusher = engine.flusher
    if flusher is not None:
        figures["flush_lag"] = max(0, clog.max_offset - flusher.flushed)
        figures["flushes"] = flusher.flush_count
        figures["flush_seconds"] = flusher.flush_seconds
        figures["cache_kept"] = max(0, clog.max_offset - max(flusher.cache_from, clog.min_offset))
    return figures


async def _disk(parts: BrokerParts) -> dict[str, float]:
    store = parts.store
    assert store is not None
    figures: dict[str, float] = {}
    if store.persistent:
        used, total, available = await asyncio.to_thread(_measure_dir, Path(parts.config.store.data_dir))
        figures.update(used=used, total=total, available=available)
    guard = parts.diskguard
    if guard is not None:
        figures.update(ratio=guard.ratio, full=1.0 if guard.full else 0.0, refused=guard.refused)
    return figures


def _measure_dir(root: Path) -> tuple[int, int, int]:
    """(bytes the directory's files take on disk, its file system's size, the bytes available there)."""
    used = 0
    stack = [root]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                        elif entry.is_file(follow_symlinks=False):
                            used += entry.stat(follow_symlinks=False).st_blocks * 512  # (sparse files: real use)
                    except OSError:  # deleted meanwhile (retention)
                        continue
        except OSError:
            continue
    try:
        st = os.statvfs(root)
        return used, st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    except OSError:
        return used, -1, -1


def _services(parts: BrokerParts) -> dict[str, float]:
    out: dict[str, float] = {}
    replication = parts.replication
    if replication is not None:
        out["replication_master"] = 1 if replication.is_master else 0
        out["replication_log_end"] = replication.engine.log_end
        out["replication_commit"] = replication.commit
        if replication.is_master:
            out["replication_in_sync"] = len(replication.tracker.isr)
            out["replication_lag_p99_ms"] = replication.lag_p99_ms()
    if parts.timer is not None:
        out["timer_pending"] = parts.timer.pending
        out["timer_delivered"] = parts.timer.delivered
        out["timer_unreadable"] = parts.timer.unreadable
    if parts.retention is not None:
        out["retention_passes"] = parts.retention.passes
        report = parts.retention.last_report
        out["retention_last_freed"] = report.freed_bytes if report is not None else 0
        out["retention_last_moved"] = len(report.moved) if report is not None else 0
    if parts.compaction is not None:
        out["compaction_passes"] = parts.compaction.passes
        creport = parts.compaction.last_report
        removed = kept = read = written = 0
        if creport is not None:
            for stats in creport.cleaned.values():
                removed += stats.records_removed
                kept += stats.records_kept
                read += stats.bytes_read
                written += stats.bytes_written
        out.update(
            compaction_last_removed=removed,
            compaction_last_kept=kept,
            compaction_last_read=read,
            compaction_last_written=written,
        )
    return out


def _cleaned(parts: BrokerParts) -> list[tuple[str, int, int]]:
    store = parts.store
    assert store is not None
    try:
        doc = store.load_state("compaction") or {}
    except Exception:  # noqa: BLE001 - a figure, not worth a failed scrape
        return []
    out = []
    for key, upto in sorted(dict(doc.get("clean", {})).items()):
        topic, _, partition = str(key).rpartition("/")
        if topic and partition.isdigit():
            out.append((topic, int(partition), int(upto)))
    return out


#: Snapshot.services key -> (metric name, type, help)
SERVICE_METRICS: dict[str, tuple[str, str, str]] = {
    "replication_master": ("mqk_replication_master", "gauge", "1 while this broker is its group's master"),
    "replication_log_end": ("mqk_replication_log_end_bytes", "gauge", "Where the group's CommitLog ends here"),
    "replication_commit": (
        "mqk_replication_commit_bytes",
        "gauge",
        "CommitLog offset every in-sync replica holds (the high watermark, in bytes)",
    ),
    "replication_in_sync": ("mqk_replication_in_sync_replicas", "gauge", "Members of the group's in-sync set"),
    "replication_lag_p99_ms": (
        "mqk_replication_lag_p99_ms",
        "gauge",
        "99th percentile of recent replication lags: an append to the last in-sync replica's ack",
    ),
    "timer_pending": ("mqk_timer_pending_messages", "gauge", "Delayed messages waiting for their time"),
    "timer_delivered": ("mqk_timer_delivered", "counter", "Delayed messages delivered"),
    "timer_unreadable": ("mqk_timer_unreadable_records", "counter", "Timer records skipped as unreadable"),
    "retention_passes": ("mqk_retention_passes", "counter", "Retention passes run"),
    "retention_last_freed": (
        "mqk_retention_last_pass_freed_bytes",
        "gauge",
        "Bytes the last retention pass gave back",
    ),
    "retention_last_moved": (
        "mqk_retention_last_pass_partitions_moved",
        "gauge",
        "Partitions whose log start the last retention pass moved",
    ),
    "compaction_passes": ("mqk_compaction_passes", "counter", "Compaction passes run"),
    "compaction_last_removed": (
        "mqk_compaction_last_pass_records_removed",
        "gauge",
        "Records the last compaction pass removed",
    ),
    "compaction_last_kept": ("mqk_compaction_last_pass_records_kept", "gauge", "Records the last compaction pass kept"),
    "compaction_last_read": ("mqk_compaction_last_pass_read_bytes", "gauge", "Bytes the last compaction pass read"),
    "compaction_last_written": (
        "mqk_compaction_last_pass_written_bytes",
        "gauge",
        "Bytes the last compaction pass wrote",
    ),
}


# --- rendering (in a worker thread) --------------------------------------------------------------------------


class _Families(Collector):
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> Any:
        return iter(self.families)


def render(snap: Snapshot, accept: str = "") -> tuple[bytes, str]:
    """(body, content type) of /metrics for `snap`: the text format, or OpenMetrics when `accept` asks for it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families(snap)))
    ProcessCollector(registry=registry)
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


def _histogram_buckets(bounds_s: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    """Prometheus buckets (cumulative, +Inf last) from per-bucket counts (the last one above every bound)."""
    out: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip(bounds_s, counts):
        running += count
        out.append((repr(float(bound)), running))
    out.append(("+Inf", running + sum(counts[len(bounds_s) :])))
    return out


def families(snap: Snapshot) -> list[Any]:
    fams: list[Any] = []
    add = fams.append

    info = GaugeMetricFamily(
        "mqk_broker_info", "This broker: version, node id, cluster, broker group", labels=list(snap.info)
    )
    info.add_metric(list(snap.info.values()), 1)
    add(info)
    ready = GaugeMetricFamily("mqk_broker_ready", "1 when /health/ready answers ready")
    ready.add_metric([], 1 if snap.ready else 0)
    add(ready)

    tp = ["topic", "partition"]
    if snap.traffic:
        kinds = (
            ("bytes_out", "Record batch bytes served to consumers (Fetch, pull)"),
            ("records_out", "Records served to consumers (whole batches: a fetch inside a batch serves all of it)"),
        )
        for k, (kind, doc) in enumerate(kinds):
            fam = CounterMetricFamily(f"mqk_partition_{kind}", doc, labels=tp)
            for row in snap.traffic:
                counts: list[int] = row[k + 1]  # type: ignore[assignment]  # (items 1 and 2 of a row are the lists)
                for partition, count in enumerate(counts):
                    fam.add_metric([row[0], str(partition)], count)
            add(fam)

    start = GaugeMetricFamily("mqk_partition_log_start_offset", "First offset still readable", labels=tp)
    end = GaugeMetricFamily(
        "mqk_partition_log_end_offset", "Offset the next record will get (high watermark)", labels=tp
    )
    size = GaugeMetricFamily("mqk_partition_log_size_bytes", "Bytes of the record batches still readable", labels=tp)
    records_in = CounterMetricFamily(
        "mqk_partition_records_in", "Records appended to the partition (by any producer, the timer too)", labels=tp
    )
    bytes_in = CounterMetricFamily("mqk_partition_bytes_in", "Record batch bytes appended to the partition", labels=tp)
    for topic, partition, first, last, nbytes, appended_records, appended_bytes in snap.partitions:
        labels = [topic, str(partition)]
        start.add_metric(labels, first)
        end.add_metric(labels, last)
        size.add_metric(labels, nbytes)
        records_in.add_metric(labels, appended_records)
        bytes_in.add_metric(labels, appended_bytes)
    fams += [start, end, size, records_in, bytes_in]

    gtp = ["group", "topic", "partition"]
    committed = GaugeMetricFamily("mqk_consumer_group_committed_offset", "Offset the group committed", labels=gtp)
    lag = GaugeMetricFamily("mqk_consumer_group_lag", "Log end offset minus the committed offset", labels=gtp)
    lag_sum = GaugeMetricFamily("mqk_consumer_group_lag_sum", "The group's lag over its partitions", labels=["group"])
    members = GaugeMetricFamily("mqk_consumer_group_members", "Members of the group (Kafka protocol)", labels=["group"])
    state = GaugeMetricFamily("mqk_consumer_group_state", "1 for the group's current state", labels=["group", "state"])
    for group, group_state, count, commits in snap.groups:
        total = 0
        for topic, partition, offset, log_end in commits:
            behind = max(0, log_end - offset)
            total += behind
            committed.add_metric([group, topic, str(partition)], offset)
            lag.add_metric([group, topic, str(partition)], behind)
        lag_sum.add_metric([group], total)
        members.add_metric([group], count)
        state.add_metric([group, group_state], 1)
    fams += [committed, lag, lag_sum, members, state]

    if snap.meters:
        lpa = ["listener", "protocol", "api"]
        requests = CounterMetricFamily("mqk_requests", "Requests answered", labels=lpa)
        errors = CounterMetricFamily(
            "mqk_request_errors",
            "Error codes in answers (a Kafka answer counts each partition's)",
            labels=[*lpa, "error"],
        )
        latency = HistogramMetricFamily(
            "mqk_request_duration_seconds", "Time from a request's decoding to its answer", labels=lpa
        )
        conns = GaugeMetricFamily("mqk_connections", "Open client connections", labels=["listener"])
        accepted = CounterMetricFamily("mqk_connections_accepted", "Client connections accepted", labels=["listener"])
        for m in snap.meters:
            for api, count, total_s, buckets in m.apis:
                requests.add_metric([m.listener, m.protocol, api], count)
                latency.add_metric(
                    [m.listener, m.protocol, api], _histogram_buckets(LATENCY_BOUNDS_S, buckets), total_s
                )
            for api, error, count in m.errors:
                errors.add_metric([m.listener, m.protocol, api, error], count)
            conns.add_metric([m.listener], m.live)
            accepted.add_metric([m.listener], m.accepted)
        fams += [requests, errors, latency, conns, accepted]

    if snap.produce_general_path:
        general = CounterMetricFamily(
            "mqk_kafka_produce_general_path_partitions",
            "Produced partitions the append planning kernel left to the general path, by why (compressed, "
            "idempotent, invalid, ...); plain ones take the kernel's path and are not counted",
            labels=["reason"],
        )
        for reason, count in snap.produce_general_path:
            general.add_metric([reason], count)
        add(general)

    if snap.codec_declined:
        declined = CounterMetricFamily(
            "mqk_kafka_codec_declined",
            "Produce and Fetch requests and answers the hand-written codec kernels left to the generated codec, by "
            "API and why (shape, value, text, field, version); the usual ones take the kernels and are not counted",
            labels=["api", "reason"],
        )
        for api, reason, count in snap.codec_declined:
            declined.add_metric([api, reason], count)
        add(declined)

    store: dict[str, Any] = snap.store
    if store:
        for name, doc, key in (
            ("mqk_store_puts", "Entries appended to the CommitLog", "puts"),
            ("mqk_store_put_bytes", "Bytes appended to the CommitLog", "put_bytes"),
            ("mqk_store_put_failures", "Entries whose append failed", "put_failures"),
        ):
            fam = CounterMetricFamily(name, doc)
            fam.add_metric([], store[key])
            add(fam)
        append = HistogramMetricFamily("mqk_store_append_latency_seconds", "CommitLog append latency per entry")
        bounds = tuple(b / 1e6 for b in store["latency_bounds_us"])
        append.add_metric([], _histogram_buckets(bounds, store["latency_buckets"]), store["latency_sum_s"])
        add(append)
        for name, doc, key in (
            ("mqk_store_commitlog_start_offset", "First CommitLog byte offset kept", "commitlog_start"),
            ("mqk_store_commitlog_end_offset", "CommitLog byte offset the next entry gets", "commitlog_end"),
            ("mqk_store_dispatch_lag_bytes", "CommitLog bytes written but not yet dispatched", "dispatch_lag"),
            (
                "mqk_store_flush_lag_bytes",
                "CommitLog bytes written but not yet on disk (disk fall-behind)",
                "flush_lag",
            ),
            (
                "mqk_store_page_cache_kept_bytes",
                "CommitLog bytes at the end of the log whose page cache is kept",
                "cache_kept",
            ),
        ):
            if key in store:
                gauge = GaugeMetricFamily(name, doc)
                gauge.add_metric([], store[key])
                add(gauge)
        if "flushes" in store:
            flush = SummaryMetricFamily("mqk_store_flush_seconds", "CommitLog flushes (fsync) and the time they took")
            flush.add_metric([], store["flushes"], store["flush_seconds"])
            add(flush)

    d = snap.disk
    for name, doc, key in (
        ("mqk_data_dir_used_bytes", "Disk space the data directory's files take", "used"),
        ("mqk_data_dir_filesystem_size_bytes", "Size of the file system holding the data directory", "total"),
        ("mqk_data_dir_filesystem_available_bytes", "Bytes available on that file system", "available"),
        ("mqk_disk_used_ratio", "Share of the file system in use, as the disk guard last measured it", "ratio"),
        ("mqk_disk_full", "1 while the disk guard refuses appends (disk above its limit)", "full"),
    ):
        if key in d:
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], d[key])
            add(gauge)
    if "refused" in d:
        refused = CounterMetricFamily("mqk_disk_appends_refused", "Appends the disk guard refused")
        refused.add_metric([], d["refused"])
        add(refused)

    v = snap.services
    for key, (name, kind, doc) in SERVICE_METRICS.items():
        if key in v:
            figure: CounterMetricFamily | GaugeMetricFamily = (
                CounterMetricFamily(name, doc) if kind == "counter" else GaugeMetricFamily(name, doc)
            )
            figure.add_metric([], v[key])
            add(figure)
    if snap.cleaned:
        cleaned = GaugeMetricFamily(
            "mqk_compaction_cleaned_offset", "Offset the compactor has cleaned up to", labels=tp
        )
        for topic, partition, upto in snap.cleaned:
            cleaned.add_metric([topic, str(partition)], upto)
        add(cleaned)
    return fams


__all__ = ["Snapshot", "families", "render", "snapshot"]
