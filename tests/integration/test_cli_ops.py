"""The operator's verbs against a real broker, run as a person would (subprocesses): `mqk groups describe` with lag,
`mqk groups reset-offsets` against a group of real confluent-kafka consumers (refused while they are active, then
applied and resumed from), `mqk perf produce|consume`; and RocketMQ's admin codes through mqk's native client."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time

from confluent_kafka import Consumer, ConsumerGroupState, Producer
from confluent_kafka.admin import AdminClient

from mqk.client import Message, PullConsumer
from mqk.client import Producer as NativeProducer
from mqk.client.admin import Admin
from mqk.protocol.native.codes import RequestCode, ResponseCode


def mqk(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mqk", *args], capture_output=True, text=True, timeout=120)


def consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,
        }
    )


def consume(c: Consumer, n: int) -> list:
    got: list = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        msg = c.poll(1.0)
        if msg is not None and not msg.error():
            got.append(msg)
    assert len(got) == n, f"{len(got)} of {n} records"
    return got


def dry_plan(stdout: str) -> list[tuple[int, int, int]]:
    """(partition, previous offset, new offset) of a `reset-offsets --json` dry run (refused if it executed)."""
    plan = json.loads(stdout)
    assert not plan["executed"]
    return [(p["partition"], p["previous_offset"], p["new_offset"]) for p in plan["partitions"]]


def test_reset_offsets_is_refused_while_consumers_are_active_and_they_resume_from_the_new_offsets(mqk_broker):
    b = ("--bootstrap", mqk_broker.bootstrap)
    assert mqk("topics", "create", "r", "--partitions", "2", *b).returncode == 0
    producer = Producer({"bootstrap.servers": mqk_broker.bootstrap})
    for i in range(20):
        producer.produce("r", b"v%d" % i, partition=i % 2)
    producer.flush(10)

    group = [consumer(mqk_broker.bootstrap, "rg") for _ in range(2)]
    admin = AdminClient({"bootstrap.servers": mqk_broker.bootstrap})

    def settled() -> bool:
        """Both members in the group's current generation, each with a partition. (A member whose JoinGroup comes
        after the other has read all 20 records, as a loaded machine can delay one client's start, starts a
        rebalance that the other hears of only with its next heartbeat, seconds later.)"""
        desc = admin.describe_consumer_groups(["rg"])["rg"].result(10)
        return (
            desc.state == ConsumerGroupState.STABLE
            and len(desc.members) == 2
            and all(m.assignment.topic_partitions for m in desc.members)
        )

    try:
        for c in group:
            c.subscribe(["r"])
        got: list = []
        deadline = time.monotonic() + 30
        while (len(got) < 20 or not settled()) and time.monotonic() < deadline:
            for c in group:
                msg = c.poll(0.2)
                if msg is not None and not msg.error():
                    got.append(msg)
                    c.commit(message=msg, asynchronous=False)
        assert len(got) == 20

        described = json.loads(mqk("groups", "describe", "rg", "--json", *b).stdout)
        assert described["state"] == "Stable" and len(described["members"]) == 2
        assert sorted((p["partition"], p["current_offset"], p["lag"]) for p in described["partitions"]) == [
            (0, 10, 0),
            (1, 10, 0),
        ]
        assert all(p["consumer_id"] for p in described["partitions"])  # each partition owned by a member

        refused = mqk("groups", "reset-offsets", "rg", "--topic", "r", "--to-earliest", "--execute", *b)
        assert refused.returncode == 1
        assert "inactive" in refused.stderr and "Stable" in refused.stderr
    finally:
        for c in group:
            c.close()

    dry = mqk("groups", "reset-offsets", "rg", "--topic", "r", "--shift-by", "-3", "--json", *b)
    assert dry.returncode == 0, dry.stderr
    assert dry_plan(dry.stdout) == [(0, 10, 7), (1, 10, 7)]
    text = mqk("groups", "describe", "rg", *b).stdout  # the dry run committed nothing
    assert re.search(r"rg\s+r\s+0\s+10\s+10\s+0", text), text

    applied = mqk("groups", "reset-offsets", "rg", "--topic", "r:0", "--shift-by", "-3", "--execute", *b)
    assert applied.returncode == 0, applied.stderr
    assert re.search(r"rg\s+r\s+0\s+7", applied.stdout)
    earliest = mqk("groups", "reset-offsets", "rg", "--topic", "r:1", "--to-earliest", "--execute", *b)
    assert earliest.returncode == 0, earliest.stderr

    described = json.loads(mqk("groups", "describe", "rg", "--json", *b).stdout)
    assert sorted((p["partition"], p["current_offset"], p["lag"]) for p in described["partitions"]) == [
        (0, 7, 3),
        (1, 0, 10),
    ]

    again = consumer(mqk_broker.bootstrap, "rg")
    try:
        again.subscribe(["r"])
        resumed = consume(again, 13)
    finally:
        again.close()
    firsts: dict[int, int] = {}
    for msg in resumed:
        firsts.setdefault(msg.partition(), msg.offset())
    assert firsts == {0: 7, 1: 0}


def test_reset_to_datetime_picks_the_first_offset_at_or_after_it(mqk_broker):
    b = ("--bootstrap", mqk_broker.bootstrap)
    producer = Producer({"bootstrap.servers": mqk_broker.bootstrap})
    for i in range(3):
        producer.produce("dt", b"old%d" % i, partition=0, timestamp=1_600_000_000_000 + i)
    for i in range(2):
        producer.produce("dt", b"new%d" % i, partition=0, timestamp=1_700_000_000_000 + i)
    producer.flush(10)
    out = mqk(
        "groups", "reset-offsets", "dtg", "--topic", "dt", "--to-datetime", "2023-06-01T00:00:00+00:00", "--json", *b
    )
    assert out.returncode == 0, out.stderr
    assert [(p["partition"], p["new_offset"]) for p in json.loads(out.stdout)["partitions"]] == [(0, 3)]


def test_perf_produce_and_consume_print_kafkas_perf_test_lines(mqk_broker):
    b = ("--bootstrap", mqk_broker.bootstrap)
    produced = mqk("perf", "produce", "--topic", "perf", "--num-records", "2000", "--batch-size", "50", *b)
    assert produced.returncode == 0, produced.stderr
    assert re.search(
        r"^2000 records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, [\d.]+ ms max latency, "
        r"\d+ ms 50th, \d+ ms 95th, \d+ ms 99th, \d+ ms 99.9th\.$",
        produced.stdout,
        re.M,
    ), produced.stdout
    consumed = mqk("perf", "consume", "--topic", "perf", "--messages", "2000", *b)
    assert consumed.returncode == 0, consumed.stderr
    header, line = consumed.stdout.strip().splitlines()[-2:]
    assert header.startswith("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg")
    assert line.split(", ")[4] == "2000"


def test_rocketmq_admin_codes_answer_from_the_same_stats(mqk_broker):
    host, port = mqk_broker.namesrv_address
    namesrv = f"{host}:{port}"

    async def scenario() -> None:
        async with NativeProducer(namesrv, "stats-producer") as producer:
            for i in range(5):
                await producer.send(Message("rs", b"m%d" % i))
        async with PullConsumer(namesrv, "stats-group") as pull:
            (mq,) = await pull.queues("rs")
            await pull.commit_offset(mq, 3)
        async with Admin(namesrv) as admin:
            info = await admin.broker_runtime_info()
            assert info["msgPutTotalTodayNow"] == "5" and info["putMessageTimesTotal"] == "5"
            assert len(info["putTps"].split()) == 3 and info["runtime"].startswith("[ 0 days")
            stats = await admin.topic_stats("rs")
            ((_broker, queue), offsets) = next(iter(stats.items()))
            assert queue == 0 and offsets["minOffset"] == 0 and offsets["maxOffset"] == 5
            assert offsets["lastUpdateTimestamp"] > 0
            table, _tps = await admin.consume_stats("stats-group", "rs")
            (row,) = table.values()
            assert (row["brokerOffset"], row["consumerOffset"]) == (5, 3) and row["lastTimestamp"] > 0
            # consumerProgress without a topic: the topics the group committed on
            table, _tps = await admin.consume_stats("stats-group")
            assert [key[0] for key in table] == ["rs"]
            broker = (await admin.brokers())[0]
            config = await admin.invoke(broker, RequestCode.GET_TOPIC_CONFIG, {"topic": "rs"})
            assert json.loads(config.body)["readQueueNums"] == 1
            missing = await admin.invoke(
                broker, RequestCode.GET_TOPIC_STATS_INFO, {"topic": "nope"}, ok=(ResponseCode.TOPIC_NOT_EXIST,)
            )
            assert missing.code == ResponseCode.TOPIC_NOT_EXIST
            who = await admin.invoke(broker, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "rs"})
            assert json.loads(who.body)["groupList"] == ["stats-group"]

    asyncio.run(scenario())


def test_share_groups_are_listed_described_reset_and_their_offsets_deleted(mqk_broker):
    """`mqk share-groups` as kafka-share-groups: a group whose ShareConsumer read every record of two partitions
    is listed and described (start offset past the records, lag 0, its member while it is there); a reset is
    refused while the member is there, planned without --execute, applied with it (the next consumer gets those
    records again); delete-offsets drops the states."""
    from confluent_kafka import ShareConsumer
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    b = ("--bootstrap", mqk_broker.bootstrap)
    assert mqk("topics", "create", "jobs", "--partitions", "2", *b).returncode == 0
    producer = Producer({"bootstrap.servers": mqk_broker.bootstrap})
    for i in range(20):
        producer.produce("jobs", b"%d" % i, partition=i % 2)
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": mqk_broker.bootstrap})
    earliest = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.GROUP, "sq", incremental_configs=[earliest])
    admin.incremental_alter_configs([resource])[resource].result(timeout=15)

    def read(count: int) -> tuple[ShareConsumer, list[int]]:
        share = ShareConsumer({"bootstrap.servers": mqk_broker.bootstrap, "group.id": "sq"})
        share.subscribe(["jobs"])
        got: list[int] = []
        deadline = time.monotonic() + 60
        while len(got) < count:
            assert time.monotonic() < deadline, got
            got += [int(m.value()) for m in share.poll(0.2) or [] if not m.error()]
        share.commit_sync()
        return share, got

    share, got = read(20)
    try:
        assert sorted(got) == list(range(20))
        done = mqk("share-groups", "list", "--json", *b)
        assert done.returncode == 0, done.stderr
        listed = json.loads(done.stdout)
        assert listed == [{"group": "sq", "state": "Stable"}]
        described = json.loads(mqk("share-groups", "describe", "sq", "--json", *b).stdout)
        assert [m["assignment"] for m in described["members"]] == [["jobs:0,1"]]
        assert [(r["partition"], r["start_offset"], r["lag"]) for r in described["partitions"]] == [
            (0, 10, 0),
            (1, 10, 0),
        ]
        refused = mqk("share-groups", "reset-offsets", "sq", "--topic", "jobs", "--to-earliest", "--execute", *b)
        assert refused.returncode == 1 and "member" in refused.stderr
    finally:
        share.close()

    dry = mqk("share-groups", "reset-offsets", "sq", "--all-topics", "--shift-by", "-4", "--json", *b)
    assert dry_plan(dry.stdout) == [(0, 10, 6), (1, 10, 6)]
    text = mqk("share-groups", "describe", "sq", *b).stdout  # the dry run changed nothing
    assert re.search(r"sq\s+jobs\s+0\s+10\s+0", text), text
    applied = mqk("share-groups", "reset-offsets", "sq", "--topic", "jobs:1", "--to-earliest", "--execute", *b)
    assert applied.returncode == 0, applied.stderr
    assert re.search(r"sq\s+jobs\s+1\s+0", applied.stdout), applied.stdout
    described = json.loads(mqk("share-groups", "describe", "sq", "--json", *b).stdout)
    assert [(r["partition"], r["start_offset"], r["lag"]) for r in described["partitions"]] == [(0, 10, 0), (1, 0, 10)]
    share, again = read(10)
    share.close()
    assert sorted(again) == list(range(1, 20, 2))  # partition 1's records once more

    deleted = mqk("share-groups", "delete-offsets", "sq", "--topic", "jobs", *b)
    assert deleted.returncode == 0, deleted.stderr
    described = json.loads(mqk("share-groups", "describe", "sq", "--json", *b).stdout)
    assert described["partitions"] == []
