"""Faults in a cluster, for real: etcd and `mqk serve --cluster` processes on loopback, killed with SIGKILL, paused with
SIGSTOP, and etcd itself stopped and started again under running brokers.

- a broker killed: once its lease expires, its partitions are unavailable (Metadata: leader -1, LEADER_NOT_AVAILABLE;
  Produce: NOT_LEADER_OR_FOLLOWER) while the others keep taking writes; restarted, it leads them again (a new
  leader epoch) with every record an idempotent acks=all producer had acknowledged;
- the controller killed, or paused past its lease: metadata changes asked of the other brokers, before and after
  the lease expired, are made by a new controller within 5 s of the expiry; the paused one, resumed, writes nothing
  (every topic key as the new controller left it, written under its epoch) and a change asked through it is made
  once, by the new controller;
- etcd stopped: the brokers serve produce, fetch and their consumer groups with the metadata they hold, answer a
  metadata change with a retriable REQUEST_TIMED_OUT at once, and take metadata changes again once etcd is back
  (their leases kept);
- the etcd client: a call whose channel another call dropped (it timed out) ends retriable, not cancelled.

(A broker started against an etcd nobody runs exits with code 3: tests/integration/test_cluster_local.py.)

What the cluster wrote is read from etcd through a watch (`ClusterKeys`), so a wait ends on the change it waits for;
what clients see is asked over the wire (mqk's raw Kafka client for exact error codes, confluent-kafka for a real
producer and consumer). Every wait is bounded; every process is stopped by pid by the fixtures' teardown.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from helpers import CLUSTER_TESTS, WatchedKeys, produce_body, wait_until, wait_until_async

from mqk import errors as E
from mqk.broker.cluster.model import ControllerRecord, MasterRecord, TopicRecord
from mqk.cluster_local import EtcdProcess, LocalCluster
from mqk.meta import EtcdClient, MetaUnavailable
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient, make_batch

pytestmark = [pytest.mark.timeout(240), CLUSTER_TESTS]

#: the brokers' lease TTL (BrokerConfig.cluster_session_timeout_ms): a dead or paused broker's keys go after it
SESSION_TIMEOUT_S = 6
#: how long a wait for a lease to expire may take: the session timeout, and room for a machine busy with other tests
EXPIRY_WAIT_S = SESSION_TIMEOUT_S + 24
#: how long a metadata change may take once the controller's lease expired (the issue's bound)
TAKEOVER_S = 5
PARTITIONS = 12
#: metadata changes asked at once as the controller is paused
BURST = 20


# --- the cluster's keys in etcd, followed by a watch ----------------------------------------------------------


class ClusterKeys(WatchedKeys):
    """Every key of one cluster, by its name under `/mqk/<cluster-id>/`."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(cluster.etcd_endpoints, f"/mqk/{cluster.cluster_id}/")

    def controller(self) -> ControllerRecord | None:
        record = self.records.get("controller")
        return ControllerRecord.decode(record.value) if record is not None else None

    def master(self, group: str) -> MasterRecord | None:
        record = self.records.get(f"groups/{group}/master")
        return MasterRecord.decode(record.value) if record is not None else None

    def topic(self, name: str) -> TopicRecord | None:
        record = self.records.get(f"topics/{name}")
        return TopicRecord.decode(record.value) if record is not None else None

    def topic_keys(self) -> dict[str, tuple[int, bytes]]:
        """Every topic key: name -> (its mod revision, its value)."""
        return {k: (r.mod_revision, r.value) for k, r in self.records.items() if k.startswith("topics/")}


# --- Kafka requests, sent to one broker -------------------------------------------------------------------------


async def connect(cluster: LocalCluster, node: int) -> RawKafkaClient:
    address = cluster.broker(node).kafka
    assert address is not None
    return await RawKafkaClient.connect(*address, f"faults-to-{node}")


def create_body(name: str, partitions: int, timeout: float = 60) -> dict[str, Any]:
    return {
        "timeout_ms": int(timeout * 1000),
        "validate_only": False,
        "topics": [
            {"name": name, "num_partitions": partitions, "replication_factor": -1, "assignments": [], "configs": []}
        ],
    }


async def create_topic(client: RawKafkaClient, name: str, partitions: int, timeout: float = 60) -> int:  # noqa: ASYNC109 - a bound the failure names
    """CreateTopics of one topic; its error code."""
    (result,) = (await client.call(ApiKey.CREATE_TOPICS, 5, create_body(name, partitions, timeout), timeout))["topics"]
    return int(result["error_code"])


async def create_partitions(client: RawKafkaClient, name: str, count: int, timeout: float = 60) -> int:  # noqa: ASYNC109 - a bound the failure names
    body = {
        "topics": [{"name": name, "count": count, "assignments": None}],
        "timeout_ms": int(timeout * 1000),
        "validate_only": False,
    }
    (result,) = (await client.call(ApiKey.CREATE_PARTITIONS, 1, body, timeout=timeout))["results"]
    return int(result["error_code"])


async def metadata(client: RawKafkaClient, topics: Sequence[str] | None = None) -> dict[str, Any]:
    body = {
        "topics": None if topics is None else [{"name": t, "topic_id": uuid.UUID(int=0)} for t in topics],
        "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False,
    }
    return await client.call(ApiKey.METADATA, 12, body)  # (v10+ carries topic ids)


async def topic_until(
    client: RawKafkaClient,
    name: str,
    condition: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float = 30,  # noqa: ASYNC109 - a bound the failure names
) -> dict[str, Any]:
    """The topic's Metadata entry from this broker once `condition` holds for it."""

    async def entry() -> dict[str, Any] | None:
        (topic,) = (await metadata(client, [name]))["topics"]
        return topic if condition(topic) else None

    found: dict[str, Any] = await wait_until_async(entry, timeout, what)
    return found


def by_partition(topic: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {p["partition_index"]: p for p in topic["partitions"]}


def all_led(topic: dict[str, Any]) -> bool:
    return topic["error_code"] == 0 and all(p["leader_id"] >= 0 for p in topic["partitions"])


async def produce_raw(client: RawKafkaClient, topic: str, partition: int, value: bytes) -> int:
    """One record by Produce v8 with acks=all; its error code."""
    answer = await client.call(ApiKey.PRODUCE, 8, produce_body(topic, make_batch([value]), partition))
    return int(answer["responses"][0]["partition_responses"][0]["error_code"])


# --- a real producer and consumer (confluent-kafka, run in worker threads) --------------------------------------


class AckedProducer:
    """An idempotent acks=all producer that remembers what was acknowledged, per partition, in order."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2}
        )
        self.acked: dict[int, list[int]] = collections.defaultdict(list)
        self.failed: list[Any] = []

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(err)
        else:
            self.acked[msg.partition()].append(int(msg.value()))

    def send(self, values: range, partitions: Sequence[int]) -> None:
        """Value v to partition partitions[v % len(partitions)], and wait for every answer."""
        for v in values:
            self.producer.produce(
                self.topic, str(v).encode(), partition=partitions[v % len(partitions)], on_delivery=self._delivered
            )
        assert self.producer.flush(60) == 0
        assert not self.failed, self.failed

    async def send_async(self, values: range, partitions: Sequence[int]) -> None:
        await asyncio.to_thread(self.send, values, partitions)

    def knows_partitions(self, count: int) -> bool:
        """Whether the producer's metadata (asked again now) has `count` partitions of the topic."""
        return len(self.producer.list_topics(self.topic, timeout=10).topics[self.topic].partitions) == count


def read_all(bootstrap: str, topic: str, expected: dict[int, int], timeout: float = 60) -> dict[int, list[int]]:
    """Every partition's values from its beginning, until each holds `expected[p]` records (one consumer, assigned)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "faults-reader", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in expected])
    got: dict[int, list[int]] = collections.defaultdict(list)
    try:

        def done() -> bool:
            for m in consumer.consume(500, 0.2):
                assert m.error() is None, m.error()
                got[m.partition()].append(int(m.value()))
            return all(len(got[p]) >= n for p, n in expected.items())

        wait_until(done, timeout, f"every record of {topic}")
    finally:
        consumer.close()
    return got


# --- a broker killed ----------------------------------------------------------------------------------------------


async def test_killed_broker_partitions_are_unavailable_until_it_restarts_with_every_acked_record(
    mqk_cluster: LocalCluster,
) -> None:
    cluster = mqk_cluster
    async with ClusterKeys(cluster) as keys:
        await keys.until(lambda k: k.controller() is not None, "a controller")
        controller = keys.controller()
        assert controller is not None
        victim = next(n for n in cluster.node_ids if n != controller.node_id)  # (the controller's loss: the next tests)
        survivors = [n for n in cluster.node_ids if n != victim]
        clients = {n: await connect(cluster, n) for n in survivors}
        try:
            assert await create_topic(clients[survivors[0]], "t", PARTITIONS) == 0
            before = by_partition(await topic_until(clients[survivors[1]], "t", all_led, "t led everywhere"))
            lost = [p for p, e in before.items() if e["leader_id"] == victim]
            kept = [p for p, e in before.items() if e["leader_id"] != victim]
            assert lost and kept

            producer = AckedProducer(cluster.bootstrap, "t")
            await producer.send_async(range(240), range(PARTITIONS))

            cluster.kill(victim)
            await keys.until(
                lambda k: f"brokers/{victim}" not in k.records and k.master(f"group-{victim}") is None,
                "the killed broker's lease to expire",
                EXPIRY_WAIT_S,
            )
            for client in clients.values():
                down = by_partition(
                    await topic_until(
                        client, "t", lambda t: all(by_partition(t)[p]["leader_id"] == -1 for p in lost), "leader -1"
                    )
                )
                for p in lost:
                    assert down[p]["error_code"] == E.LeaderNotAvailableError.code
                    assert (down[p]["leader_id"], down[p]["isr_nodes"]) == (-1, [])
                    assert down[p]["offline_replicas"] == [victim]
                for p in kept:
                    assert down[p]["error_code"] == 0 and down[p]["leader_id"] == before[p]["leader_id"]
                assert sorted(b["node_id"] for b in (await metadata(client, ["t"]))["brokers"]) == survivors

                # writes to its partitions fail, wherever they are sent
                for p in lost:
                    assert await produce_raw(client, "t", p, b"nowhere") == E.NotLeaderOrFollowerError.code
            # ... and a client's write to one is not acknowledged
            stranded = Producer({"bootstrap.servers": cluster.bootstrap, "message.timeout.ms": 3000})
            errors: list[Any] = []
            stranded.produce("t", b"x", partition=lost[0], on_delivery=lambda err, msg: errors.append(err))
            await asyncio.to_thread(stranded.flush, 30)
            assert [e.code() for e in errors] == [KafkaError._MSG_TIMED_OUT]

            # the other partitions keep taking writes, from the producer that lived through the loss
            await producer.send_async(range(240, 480), kept)

            await asyncio.to_thread(cluster.restart, victim)
            for client in clients.values():
                after = by_partition(await topic_until(client, "t", all_led, "every partition led again"))
                for p in lost:
                    assert after[p]["leader_id"] == victim
                    assert after[p]["leader_epoch"] > before[p]["leader_epoch"]
            await producer.send_async(range(480, 720), range(PARTITIONS))
        finally:
            for client in clients.values():
                await client.close()

    # every acknowledged record is there, once, in the order it was acknowledged
    expected = {p: len(producer.acked[p]) for p in range(PARTITIONS)}
    got = await asyncio.to_thread(read_all, cluster.bootstrap, "t", expected)
    assert dict(got) == dict(producer.acked)
    assert sum(expected.values()) == 720


# --- the controller killed, or paused past its lease ------------------------------------------------------------


async def test_killed_controller_is_replaced_and_changes_resume_within_5_s_of_its_lease_expiry(
    mqk_cluster: LocalCluster,
) -> None:
    cluster = mqk_cluster
    async with ClusterKeys(cluster) as keys:
        await keys.until(lambda k: k.controller() is not None, "a controller")
        old = keys.controller()
        assert old is not None
        others = [n for n in cluster.node_ids if n != old.node_id]
        clients = {n: await connect(cluster, n) for n in others}
        try:
            cluster.kill(old.node_id)
            # asked while the controller is dead: it waits for the next one
            early = asyncio.create_task(create_topic(clients[others[0]], "asked-before-expiry", 6))
            await keys.until(lambda k: k.controller() != old, "the controller's lease to expire", EXPIRY_WAIT_S)
            expired = asyncio.get_running_loop().time()
            late = asyncio.create_task(create_topic(clients[others[1]], "asked-after-expiry", 6))
            codes = await asyncio.wait_for(asyncio.gather(early, late), TAKEOVER_S)
            took = asyncio.get_running_loop().time() - expired
            assert codes == [0, 0], f"answered {codes} {took:.1f} s after the expiry"

            new = keys.controller()
            assert new is not None and new.node_id in others and new.epoch > old.epoch
            for name in ("asked-before-expiry", "asked-after-expiry"):
                await keys.until(lambda k, name=name: k.topic(name) is not None, f"{name} in etcd")
                record = keys.topic(name)
                assert record is not None and record.controller_epoch == new.epoch
                # made once: asked again, it exists already; every live broker has the one topic id
                assert await create_topic(clients[others[0]], name, 6) == E.TopicAlreadyExistsError.code
                ids = {(await topic_until(c, name, all_led, f"{name} led"))["topic_id"].hex for c in clients.values()}
                assert ids == {record.topic_id}
        finally:
            for client in clients.values():
                await client.close()


async def test_paused_controller_loses_its_election_and_cannot_write_after_it_resumes(
    mqk_cluster: LocalCluster,
) -> None:
    cluster = mqk_cluster
    async with ClusterKeys(cluster) as keys:
        await keys.until(lambda k: k.controller() is not None, "a controller")
        old = keys.controller()
        assert old is not None
        others = [n for n in cluster.node_ids if n != old.node_id]
        clients = {n: await connect(cluster, n) for n in cluster.node_ids}
        try:
            assert await create_topic(clients[others[0]], "grown", PARTITIONS) == 0
            await keys.until(lambda k: k.topic("grown") is not None, "grown in etcd")
            old_lease = keys.records[f"brokers/{old.node_id}"].lease

            # a burst of changes keeps the controller busy as it is paused, so it may stop in the middle of one;
            # two more are asked while it is paused (its view frozen with itself in charge)
            burst = [f"burst-{i}" for i in range(BURST)]
            pipes = {n: await connect(cluster, n) for n in others}  # (their answers are read in order, below)
            clients.update({-1 - n: pipe for n, pipe in pipes.items()})  # (closed with the others)
            for i, name in enumerate(burst):
                pipes[others[i % 2]].send(ApiKey.CREATE_TOPICS, 5, create_body(name, 1))
            for pipe in pipes.values():
                await pipe.writer.drain()
            await keys.until(lambda k: k.topic(burst[0]) is not None, "the controller at work on the burst")
            cluster.pause(old.node_id)
            try:
                grow = asyncio.create_task(create_partitions(clients[others[0]], "grown", 16))
                made = asyncio.create_task(create_topic(clients[others[1]], "made-while-paused", 3))
                # a request whose own timeout ends before any controller answers is told so, not held for longer
                short = await connect(cluster, others[1])
                clients[-100] = short  # (closed with the others)
                answer = await short.call(ApiKey.CREATE_TOPICS, 5, create_body("short-timeout", 1, 0.5), 30)
                assert answer["topics"][0]["error_code"] == E.RequestTimedOutError.code, answer
                await keys.until(
                    lambda k: k.controller() != old, "the paused controller's lease to expire", EXPIRY_WAIT_S
                )
                expired_at = keys.deleted["controller"]

                async def burst_answers(n: int) -> list[int]:
                    answers = [await pipes[n].receive(60) for _ in burst[others.index(n) :: 2]]
                    return [body["topics"][0]["error_code"] for _cid, body in answers]

                # every change is made, once, within 5 s of the expiry (by one controller or the other)
                answered = await asyncio.wait_for(
                    asyncio.gather(grow, made, *(burst_answers(n) for n in others)), TAKEOVER_S
                )
                assert answered[:2] == [0, 0] and answered[2:] == [[0] * (BURST // 2)] * 2, answered
                new = keys.controller()
                assert new is not None and new.node_id in others and new.epoch > old.epoch
                await keys.until(lambda k: all(k.topic(name) is not None for name in burst), "the burst's topics")
                grown, fresh = keys.topic("grown"), keys.topic("made-while-paused")
                assert grown is not None and fresh is not None
                assert len(grown.partitions) == 16 and len(fresh.partitions) == 3
                # written by the new controller: its epoch is on both keys (a grown topic's too)
                assert grown.controller_epoch == new.epoch and fresh.controller_epoch == new.epoch
                written = keys.topic_keys()
            finally:
                cluster.resume(old.node_id)

            # it finds its lease gone and registers again under a new one (no longer leading or controlling by then)
            await keys.until(
                lambda k: (
                    f"brokers/{old.node_id}" in k.records and k.records[f"brokers/{old.node_id}"].lease != old_lease
                ),
                "the resumed broker to register again",
                EXPIRY_WAIT_S,
            )
            await keys.until(lambda k: k.master(f"group-{old.node_id}") is not None, "its group to have a master")
            # whatever its stale view had it try, etcd refused: every topic key is as the new controller left it,
            # and whatever was written after the old controller's lease expired carries the new epoch
            assert keys.topic_keys() == written
            assert keys.controller() == new
            for name in ["grown", "made-while-paused", *burst]:
                record = keys.records[f"topics/{name}"]
                epoch = TopicRecord.decode(record.value).controller_epoch
                assert epoch == (new.epoch if record.mod_revision > expired_at else old.epoch), name

            # a change asked through it now is made once, by the new controller
            assert await create_topic(clients[old.node_id], "asked-of-the-resumed", 2) == 0
            await keys.until(lambda k: k.topic("asked-of-the-resumed") is not None, "its topic in etcd")
            record = keys.topic("asked-of-the-resumed")
            assert record is not None and record.controller_epoch == new.epoch
            assert await create_topic(clients[others[0]], "asked-of-the-resumed", 2) == E.TopicAlreadyExistsError.code
            for n in cluster.node_ids:
                entry = await topic_until(
                    clients[n], "grown", lambda t: all_led(t) and len(t["partitions"]) == 16, "16"
                )
                assert {p["partition_index"] for p in entry["partitions"]} == set(range(16))
        finally:
            for client in clients.values():
                await client.close()


# --- etcd stopped under a running cluster ---------------------------------------------------------------------


async def test_brokers_serve_with_their_metadata_while_etcd_is_down_and_catch_up_when_it_returns(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = mqk_cluster_factory(own_etcd=True)
    clients = {n: await connect(cluster, n) for n in cluster.node_ids}
    try:
        assert await create_topic(clients[0], "t", PARTITIONS) == 0
        led = [by_partition(await topic_until(c, "t", all_led, "t led")) for c in clients.values()]
        assert {p: e["leader_id"] for p, e in led[0].items()} == {p: e["leader_id"] for p, e in led[1].items()}
        producer = AckedProducer(cluster.bootstrap, "t")
        await producer.send_async(range(240), range(PARTITIONS))
        group = GroupReader(cluster.bootstrap, "t")
        assert sorted(await asyncio.to_thread(group.read, 240)) == list(range(240))
        async with ClusterKeys(cluster) as keys:
            await keys.until(lambda k: all(f"brokers/{n}" in k.records for n in cluster.node_ids), "registrations")
            leases = {n: keys.records[f"brokers/{n}"].lease for n in cluster.node_ids}

        cluster.stop_etcd()
        assert cluster.etcd_process is not None and not cluster.etcd_process.running
        # out for longer than the brokers' lease: each has failed to renew it a session timeout's worth of times
        renewals = SESSION_TIMEOUT_S // 2  # (a keepalive every third of the session timeout)
        for b in cluster.brokers:
            await wait_until_async(
                lambda b=b: b.stderr().count("lease keepalive failed") >= renewals, EXPIRY_WAIT_S, "failed renewals"
            )
        # produce, fetch and the group's coordinator go on with the metadata each broker holds
        await producer.send_async(range(240, 480), range(PARTITIONS))
        assert sorted(await asyncio.to_thread(group.read, 240)) == list(range(240, 480))
        for client in clients.values():
            entry = by_partition(await topic_until(client, "t", all_led, "t still led"))
            assert {p: e["leader_id"] for p, e in entry.items()} == {p: e["leader_id"] for p, e in led[0].items()}
            assert sorted(b["node_id"] for b in (await metadata(client, ["t"]))["brokers"]) == cluster.node_ids
        # a metadata change is refused at once with a retriable error, not left hanging
        for client in clients.values():
            code = await create_topic(client, "while-etcd-is-down", 3, timeout=30)
            assert code == E.RequestTimedOutError.code
            assert E.RequestTimedOutError.retriable

        cluster.restart_etcd()

        # a client retrying the change gets it made (a timed-out attempt may have been made already: it exists then)
        async def made() -> bool:
            return await create_topic(clients[1], "while-etcd-is-down", 3) in (0, E.TopicAlreadyExistsError.code)

        await wait_until_async(made, 60, "a metadata change to be made after etcd's return")
        for client in clients.values():
            await topic_until(client, "while-etcd-is-down", lambda t: all_led(t) and len(t["partitions"]) == 3, "3")
        assert await create_partitions(clients[2], "t", 14) == 0
        # the brokers' registrations lived through it (etcd kept their leases, and they renew them again), and the
        # data too
        async with ClusterKeys(cluster) as keys:
            await keys.until(lambda k: all(f"brokers/{n}" in k.records for n in cluster.node_ids), "registrations")
            assert {n: keys.records[f"brokers/{n}"].lease for n in cluster.node_ids} == leases
        await asyncio.to_thread(wait_until, lambda: producer.knows_partitions(14), 30, "14 partitions")
        await producer.send_async(range(480, 560), range(14))
        expected = {p: len(producer.acked[p]) for p in range(14)}
        got = await asyncio.to_thread(read_all, cluster.bootstrap, "t", expected)
        assert dict(got) == dict(producer.acked)
        group.close()
    finally:
        for client in clients.values():
            await client.close()


class GroupReader:
    """One consumer of a group (confluent-kafka), reading what is new and committing it after each read."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "faults-group",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self.consumer.subscribe([topic])

    def read(self, count: int, timeout: float = 60) -> list[int]:
        got: list[int] = []

        def enough() -> bool:
            messages = self.consumer.consume(500, 0.2)
            for m in messages:
                assert m.error() is None, m.error()
                got.append(int(m.value()))
            if messages:
                self.consumer.commit(asynchronous=False)
            return len(got) >= count

        wait_until(enough, timeout, f"{count} records read by the group")
        return got

    def close(self) -> None:
        self.consumer.close()


# --- the etcd client when its channel is dropped under a call -----------------------------------------------------


def stopped(pid: int) -> bool:
    """Whether every thread of process `pid` is stopped (SIGSTOP obeyed), from /proc."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with open(task / "stat") as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state in ("T", "t") for state in states)


async def test_a_call_on_a_channel_another_call_dropped_ends_retriable_not_cancelled(tmp_path: Path) -> None:
    """A call that times out drops the client's channel, which cancels every other call in flight on it. Those
    must end as MetaUnavailable (retriable), as etcd's silence deserves, never as a CancelledError: that would end
    the task making the call (a broker resumed after a SIGSTOP longer than its lease lost its keepalive that
    way, and with it every way back into its cluster). etcd is paused here, so no call is answered."""
    etcd = EtcdProcess(tmp_path / "etcd").start()
    client = EtcdClient(etcd.endpoints, timeout=1.0)
    try:
        await client.connect()
        assert etcd.proc is not None
        etcd.proc.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: stopped(etcd.pid), 10, "etcd to stop")  # (a signal is delivered, not obeyed, at once)
            first = asyncio.create_task(client.get("/first"))
            await asyncio.sleep(0)  # (a yield, not a wait: `first` takes its 1 s deadline)
            client.timeout = 60.0
            second = asyncio.create_task(client.get("/second"))
            done = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 30)
        finally:
            etcd.proc.send_signal(signal.SIGCONT)
        assert [type(r) for r in done] == [MetaUnavailable, MetaUnavailable], done
        # and the client works again once etcd answers
        assert await client.get("/first") is None
    finally:
        await client.close()
        etcd.stop()


async def test_the_watch_watchdog_sees_only_writes_after_the_views_revision(mqk_etcd: EtcdProcess) -> None:
    """The watchdog asks etcd whether anything under the cluster's prefix was written after the view's revision.
    etcd's count ignores that filter (a count-only range counts every key), which made an idle cluster restart
    its watch every few seconds; keys written before the revision, or outside the prefix, must not count."""
    prefix = f"/mqk-test/{uuid.uuid4().hex}/"
    client = EtcdClient(mqk_etcd.endpoints)
    try:
        await client.put(prefix + "a", b"1")
        await client.put(prefix + "b", b"2")
        _records, revision = await client.get_prefix(prefix)
        assert await client.changed_since(prefix, revision - 1)  # (b was written at `revision`)
        assert not await client.changed_since(prefix, revision)
        await client.put(prefix.rstrip("/") + "-other/c", b"3")  # a neighbour's key is not this prefix's
        assert not await client.changed_since(prefix, revision)
        await client.put(prefix + "a", b"4")
        assert await client.changed_since(prefix, revision)
    finally:
        await client.close()
