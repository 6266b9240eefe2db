"""What RocketMQ's admin tool (`mqadmin`) and dashboard read of a broker, answered from the counters /metrics reports
(mqk.broker.stats), the store and the offsets:

- GET_BROKER_RUNTIME_INFO (`brokerStatus`): a KVTable of RocketMQ's runtime keys (the store's put counts, sizes and
  latency distribution, put/get TPS over 10 s, 60 s and 600 s, messages put and got since midnight and yesterday
  midnight, CommitLog offsets, dispatch and flush fall-behind, disk ratios and capacity, timer backlog);
- GET_TOPIC_STATS_INFO (`topicStatus`): per queue of the topic on this broker its min and max offset and the store
  time of its last message, and the topic's put TPS;
- GET_CONSUME_STATS (`consumerProgress`): per queue of the group's topics (the topic or topic list asked for, else
  the topics the group committed offsets on or subscribes to) the broker offset, the committed offset and the store
  time of the last consumed message, and the group's consume TPS (RocketMQ pulls; Kafka fetches name no group);
- GET_TOPIC_CONFIG (`topicStatus` of RocketMQ 5 asks for it), QUERY_TOPIC_CONSUME_BY_WHO, QUERY_TOPICS_BY_CONSUMER
  and GET_BROKER_CONFIG (`getBrokerConfig`: the settings as `key=value` lines, RocketMQ's names where they map).

Bodies are written as RocketMQ's fastjson writes them (maps keyed by MessageQueue: mqk.protocol.native.fastjson),
field names as its serializers name them. Puts are the records appended since start (mqk.broker.logsizes), gets
the records pulled and fetched (mqk.broker.stats); TPS figures come from samples of them taken every 10 s. With
metrics off (`--no-metrics`) gets are not counted (0).
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from mqk import __version__
from mqk.errors import StorageError
from mqk.protocol.native import fastjson
from mqk.protocol.native.codes import RETRY_GROUP_TOPIC_PREFIX, ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.server.native.clients import ClientManager
from mqk.server.native.context import BrokerContext
from mqk.server.native.remoting import Connection

SAMPLE_INTERVAL_S = 10.0
#: samples kept: 600 s of them (the longest TPS window) and one more
SAMPLES_KEPT = 61


@dataclass
class Sample:
    at: float  #: monotonic seconds
    puts: int
    gets: int
    topic_puts: dict[str, int] = field(default_factory=dict)
    group_gets: dict[tuple[str, str], int] = field(default_factory=dict)


class StatsProcessor:
    def __init__(self, ctx: BrokerContext, clients: ClientManager) -> None:
        self.ctx = ctx
        self.clients = clients
        #: the timer service, when the runtime runs one (its backlog is reported)
        self.timer: Any = None
        self.boot_ms = ctx.now_ms()
        self._samples: collections.deque[Sample] = collections.deque(maxlen=SAMPLES_KEPT)
        #: (today, puts and gets at today's first sample, at yesterday's)
        self._day = datetime.date.today()
        self._today_morning = (0, 0)
        self._yesterday_morning = (0, 0)
        self._task: asyncio.Task[None] | None = None

    # --- sampling -------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._samples.append(self._sample())
        self._task = asyncio.get_running_loop().create_task(self._sampler(), name="mqk-rocketmq-stats")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _sampler(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_INTERVAL_S)
            sample = self._sample()
            self._samples.append(sample)
            today = datetime.date.today()
            if today != self._day:
                self._day = today
                self._yesterday_morning = self._today_morning
                self._today_morning = (sample.puts, sample.gets)

    def _sample(self) -> Sample:
        sizes = self.ctx.broker.log_sizes
        topic_puts = {
            name: sum(sizes.records_appended(name, p) for p in range(info.queue_count))
            for name, info in self.ctx.store.topics().items()
        }
        puts = sum(topic_puts.values())
        stats = self.ctx.broker.stats
        if stats is None:
            return Sample(time.monotonic(), puts, 0, topic_puts)
        gets = sum(sum(t.records_out) for t in stats.traffic.topics.values())
        return Sample(time.monotonic(), puts, gets, topic_puts, dict(stats.group_reads))

    def _rate(self, now: Sample, window_s: float, pick: Any) -> float:
        """Per-second rate of `pick(sample)` over about the last `window_s` seconds."""
        base = None
        for sample in self._samples:
            if sample.at <= now.at - window_s or base is None:
                base = sample
        if base is None or now.at <= base.at:
            return 0.0
        rate: float = max(0, pick(now) - pick(base)) / (now.at - base.at)
        return rate

    # --- GET_BROKER_RUNTIME_INFO ------------------------------------------------------------------------------

    async def runtime_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        body = json.dumps({"table": self.runtime_table()}, sort_keys=True).encode()
        return cmd.response(ResponseCode.SUCCESS, body=body)

    def runtime_table(self) -> dict[str, str]:
        now = self._sample()
        ctx = self.ctx
        table: dict[str, str] = {}
        engine: Any = ctx.store.engines.get("file")
        store_stats = getattr(engine, "stats", None)

        def tps(pick: Any) -> str:
            return " ".join(f"{self._rate(now, w, pick):.2f}" for w in (10, 60, 600))

        uptime_s = max(0, (ctx.now_ms() - self.boot_ms) // 1000)
        days, rest = divmod(uptime_s, 86400)
        hours, rest = divmod(rest, 3600)
        minutes, seconds = divmod(rest, 60)
        puts = now.puts
        table.update(
            bootTimestamp=str(self.boot_ms),
            runtime=f"[ {days} days, {hours} hours, {minutes} minutes, {seconds} seconds ]",
            brokerVersionDesc=f"mqk-{__version__}",
            brokerActive="true",
            putMessageTimesTotal=str(max(puts, 1)),
            putTps=tps(lambda s: s.puts),
            getFoundTps=tps(lambda s: s.gets),
            getTransferredTps=tps(lambda s: s.gets),
            getTotalTps=tps(lambda s: s.gets),
            getMissTps=" ".join(["0.00"] * 3),
            msgPutTotalTodayNow=str(now.puts),
            msgPutTotalTodayMorning=str(self._today_morning[0]),
            msgPutTotalYesterdayMorning=str(self._yesterday_morning[0]),
            msgGetTotalTodayNow=str(now.gets),
            msgGetTotalTodayMorning=str(self._today_morning[1]),
            msgGetTotalYesterdayMorning=str(self._yesterday_morning[1]),
            dispatchMaxBuffer="0",
            getMessageEntireTimeMax="0",
            pageCacheLockTimeMills="0",
            earliestMessageTimeStamp="0",
            startAcceptSendRequestTimeStamp="0",
            remainTransientStoreBufferNumbs="0",
        )
        if store_stats is not None:
            put_bytes = int(store_stats.put_bytes)
            count = max(int(store_stats.puts), 1)
            table.update(
                putMessageEntireTimeMax=str(store_stats.max_latency_us // 1000),
                putMessageFailedTimes=str(store_stats.put_failures),
                putMessageSizeTotal=str(put_bytes),
                putMessageAverageSize=str(put_bytes / count),
                putMessageDistributeTime=_distribution(store_stats.BOUNDS_US, store_stats.latency_buckets),
                putLatency99=f"{_percentile_ms(store_stats.BOUNDS_US, store_stats.latency_buckets, 0.99):.2f}",
                putLatency999=f"{_percentile_ms(store_stats.BOUNDS_US, store_stats.latency_buckets, 0.999):.2f}",
                dispatchBehindBytes=str(store_stats.dispatch_lag),
                commitLogMinOffset=str(engine.clog.min_offset),
                commitLogMaxOffset=str(engine.clog.max_offset),
            )
            flusher = engine.flusher
            behind = max(0, engine.clog.max_offset - flusher.flushed) if flusher is not None else 0
            table["remainHowManyDataToFlush"] = _human_bytes(behind)
        else:
            table.update(
                putMessageEntireTimeMax="0",
                putMessageFailedTimes="0",
                putMessageSizeTotal="0",
                putMessageAverageSize="0.0",
                dispatchBehindBytes="0",
                commitLogMinOffset="0",
                commitLogMaxOffset="0",
                remainHowManyDataToFlush="0 B",
            )
        data_dir = str(ctx.config.store.data_dir)
        try:
            st = os.statvfs(data_dir)
            total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
            ratio = (total - free) / total if total else 0.0
            table["commitLogDirCapacity"] = f"Total : {_human_bytes(total)}, Free : {_human_bytes(free)}."
        except OSError:  # a memory store that never made its directory
            ratio = -1.0
        table["commitLogDiskRatio"] = str(ratio)
        table["consumeQueueDiskRatio"] = str(ratio)
        pending = int(self.timer.pending) if self.timer is not None else 0
        table.update(
            timerReadBehind="0",
            timerOffsetBehind=str(pending),
            timerCongestNum="0",
            timerEnqueueTps="0.0",
            timerDequeueTps="0.0",
        )
        for pool, capacity in (("send", 10000), ("pull", 100000), ("litePull", 100000), ("query", 20000)):
            table[f"{pool}ThreadPoolQueueSize"] = "0"
            table[f"{pool}ThreadPoolQueueCapacity"] = str(capacity)
            table[f"{pool}ThreadPoolQueueHeadWaitTimeMills"] = "0"
        return table

    # --- GET_TOPIC_STATS_INFO --------------------------------------------------------------------------------

    async def topic_stats(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = cmd.get_str("topic", required=True) or ""
        ctx = self.ctx
        queues = ctx.queue_count(topic)
        if queues == 0:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        table = []
        for queue in range(queues):
            partition = ctx.to_partition(topic, queue)
            try:
                start, end = ctx.store.offset_bounds(topic, partition)
            except StorageError:
                start = end = 0
            last = await self._store_time(topic, partition, end - 1) if end > 0 else 0
            table.append(
                (
                    self._mq(topic, queue),
                    {"lastUpdateTimestamp": last, "maxOffset": max(end, 0), "minOffset": max(start, 0)},
                )
            )
        now = self._sample()
        put_tps = self._rate(now, 60, lambda s: s.topic_puts.get(topic, 0))
        body = fastjson.dumps({"offsetTable": fastjson.object_keyed(table), "topicPutTps": put_tps})
        return cmd.response(ResponseCode.SUCCESS, body=body.encode())

    # --- GET_CONSUME_STATS -----------------------------------------------------------------------------------

    async def consume_stats(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.get_str("consumerGroup", required=True) or ""
        ctx = self.ctx
        listed = [t for t in (cmd.get_str("topicList") or "").split(";") if t]
        if listed:
            topics = listed
        elif cmd.get_str("topic"):
            topics = [cmd.get_str("topic") or ""]
        else:
            topics = sorted(self._topics_of(group))
        committed = ctx.store.fetch_offsets(group)
        table = []
        now = self._sample()
        consume_tps = 0.0
        for topic in topics:
            queues = ctx.queue_count(topic)
            for queue in range(queues):
                partition = ctx.to_partition(topic, queue)
                try:
                    end = ctx.store.end_offset(topic, partition)
                except StorageError:
                    continue
                offset = committed.get((topic, partition))
                consumer = max(offset.offset, 0) if offset is not None else 0
                last = await self._store_time(topic, partition, consumer - 1) if consumer > 0 else 0
                table.append(
                    (
                        self._mq(topic, queue),
                        {
                            "brokerOffset": end,
                            "consumerOffset": consumer,
                            "lastTimestamp": last,
                            "pullOffset": consumer,
                        },
                    )
                )
            if queues:
                consume_tps += self._rate(now, 60, lambda s, key=(group, topic): s.group_gets.get(key, 0))
        body = fastjson.dumps({"consumeTps": consume_tps, "offsetTable": fastjson.object_keyed(table)})
        return cmd.response(ResponseCode.SUCCESS, body=body.encode())

    def _topics_of(self, group: str) -> set[str]:
        """The topics a group committed offsets on or subscribes to (not its retry topic)."""
        topics = {topic for topic, _partition in self.ctx.store.fetch_offsets(group)}
        known = self.clients.groups.get(group)
        if known is not None:
            topics.update(known.subscriptions)
        return {t for t in topics if not t.startswith(RETRY_GROUP_TOPIC_PREFIX) and self.ctx.queue_count(t)}

    # --- the smaller questions -------------------------------------------------------------------------------

    async def topic_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = cmd.get_str("topic", required=True) or ""
        queues = self.ctx.queue_count(topic)
        if queues == 0:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"No topic in this broker. topic: {topic}")
        config = dict(self.ctx.topic_config(topic, queues), attributes={})
        return cmd.response(ResponseCode.SUCCESS, body=fastjson.dumps(config).encode())

    async def topic_consumed_by(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = cmd.get_str("topic", required=True) or ""
        store = self.ctx.store
        groups = {g for g in store.list_offset_groups() if any(t == topic for t, _p in store.fetch_offsets(g))}
        groups.update(name for name, g in self.clients.groups.items() if topic in g.subscriptions)
        return cmd.response(ResponseCode.SUCCESS, body=fastjson.dumps({"groupList": sorted(groups)}).encode())

    async def topics_of_consumer(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.get_str("group", required=True) or ""
        host, port = self.ctx.host
        body = {"brokerAddr": f"{host}:{port}", "topicList": sorted(self._topics_of(group))}
        return cmd.response(ResponseCode.SUCCESS, body=fastjson.dumps(body).encode())

    async def broker_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        config = self.ctx.config
        host, port = self.ctx.host
        settings = {
            "brokerClusterName": config.cluster_id,
            "brokerName": config.group_name,
            "brokerId": "0",
            "brokerIP1": host,
            "listenPort": str(port),
            "brokerRole": "ASYNC_MASTER",
            "flushDiskType": "SYNC_FLUSH" if config.store.flush_mode == "sync" else "ASYNC_FLUSH",
            "storePathRootDir": str(config.store.data_dir),
            "mappedFileSizeCommitLog": str(config.store.commitlog_segment_bytes),
            "autoCreateTopicEnable": "true" if config.auto_create_topics else "false",
            "defaultTopicQueueNums": str(config.num_partitions),
            "maxMessageSize": str(config.native_max_message_size),
            "timerMaxDelaySec": str(config.timer_max_delay_ms // 1000),
            "diskMaxUsedSpaceRatio": str(round(config.store.disk_max_used_ratio * 100)),
            "fileReservedTime": str(max(config.store.file_reserved_time_ms // 3_600_000, -1)),
        }
        text = "".join(f"{k}={v}\n" for k, v in sorted(settings.items()))
        version = json.dumps({"counter": 0, "stateVersion": 0, "timestamp": self.boot_ms})
        return cmd.response(ResponseCode.SUCCESS, ext={"version": version}, body=text.encode())

    # --- helpers -----------------------------------------------------------------------------------------------

    def _mq(self, topic: str, queue: int) -> dict[str, Any]:
        return {"brokerName": self.ctx.config.group_name, "queueId": queue, "topic": topic}

    async def _store_time(self, topic: str, partition: int, offset: int) -> int:
        """The store timestamp of the batch holding `offset` (0 when it is gone or unreadable)."""
        try:
            result = await self.ctx.store.read(topic, partition, offset, 1)
        except StorageError:
            return 0
        return result.batches[0].store_timestamp if result.batches else 0


def _distribution(bounds_us: tuple[int, ...], buckets: list[int]) -> str:
    """RocketMQ's putMessageDistributeTime shape ("[<=0ms]:N [0~10ms]:N ..."), on the store's microsecond buckets."""
    parts = []
    low = 0
    for bound, count in zip(bounds_us, buckets):
        parts.append(f"[{low}~{bound}us]:{count}" if low else f"[<={bound}us]:{count}")
        low = bound
    parts.append(f"[{low}us~]:{sum(buckets[len(bounds_us) :])}")
    return " ".join(parts)


def _percentile_ms(bounds_us: tuple[int, ...], buckets: list[int], q: float) -> float:
    """The upper bound (ms) of the bucket holding the q-th quantile of the puts (0 when there were none)."""
    total = sum(buckets)
    if not total:
        return 0.0
    running = 0
    for bound, count in zip(bounds_us, buckets):
        running += count
        if running >= q * total:
            return bound / 1000
    return bounds_us[-1] / 1000


def _human_bytes(n: int) -> str:
    """RocketMQ's MixAll.humanReadableByteCount(n, false): "512 B", "1.5 KiB", "3.0 GiB"."""
    if n < 1024:
        return f"{n} B"
    exp = 0
    value = float(n)
    while value >= 1024 and exp < 6:
        value /= 1024
        exp += 1
    return f"{n / 1024**exp:.1f} {'KMGTPE'[exp - 1]}iB"


__all__ = ["StatsProcessor"]
