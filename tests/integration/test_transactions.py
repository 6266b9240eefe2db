"""Kafka transactions over the wire (mqk.server.kafka.transactions and its handlers), request by request, with a
raw client: the answers Kafka gives for fencing, bad states and bad input; the last stable offset and the aborted
list a read_committed fetch gets; the state surviving a restart, including a transaction caught between its
Prepare and Complete records; timeouts on an injected clock; the log cleaner forgetting an aborted transaction
before it drops its ABORT marker, read_committed readers still getting what its producer committed after it. The
real clients' side is compat/test_transactions_clients.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import Proxy, committed_values, fetch_body, produce_body, raw_records, values_of

from mqk import errors as E
from mqk._fast import load
from mqk.clock import FakeClock
from mqk.config import BrokerConfig, StoreConfig, TopicConfig
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient, make_batch
from mqk.server.kafka.server import KafkaServer
from mqk.server.kafka.transactions import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    ONGOING,
    PREPARE_COMMIT,
    TransactionCoordinator,
)
from mqk.services.compaction import CompactionService
from mqk.store.manager import StoreManager

TOPIC = "txn-topic"
HOUR = 3600 * 1000


class Broker:
    """A KafkaServer (on the file store unless told) with a raw client, restartable on the same data directory."""

    def __init__(self, data_dir: Path, clock: FakeClock | None = None, storage: str = "file", **config: Any) -> None:
        self.config = BrokerConfig(
            kafka_listen=("127.0.0.1", 0), store=StoreConfig(storage=storage, data_dir=data_dir), **config
        )
        self.clock = clock
        self.store: StoreManager
        self.server: KafkaServer
        self.client: RawKafkaClient

    async def start(self) -> Broker:
        self.store = StoreManager(self.config.store)
        await self.store.start()
        self.server = KafkaServer(self.config, self.store, clock=self.clock)
        await self.server.start()
        self.client = await RawKafkaClient.connect(self.server.host, self.server.port)
        return self

    async def stop(self) -> None:
        await self.client.close()
        await self.server.stop()
        await self.store.close()

    @property
    def txns(self) -> TransactionCoordinator:
        assert self.server.ctx.transactions is not None
        return self.server.ctx.transactions

    async def call(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        return await self.client.call(api_key, version, body)

    async def init(self, txn_id: str, timeout_ms: int = 60_000, pid: int = -1, epoch: int = -1) -> dict[str, Any]:
        return await self.call(
            ApiKey.INIT_PRODUCER_ID,
            4,
            {
                "transactional_id": txn_id,
                "transaction_timeout_ms": timeout_ms,
                "producer_id": pid,
                "producer_epoch": epoch,
            },
        )

    async def add(self, txn_id: str, pid: int, epoch: int, *partitions: int, version: int = 3) -> dict[int, int]:
        answer = await self.call(
            ApiKey.ADD_PARTITIONS_TO_TXN,
            version,
            {
                "v3_and_below_transactional_id": txn_id,
                "v3_and_below_producer_id": pid,
                "v3_and_below_producer_epoch": epoch,
                "v3_and_below_topics": [{"name": TOPIC, "partitions": list(partitions)}],
            },
        )
        return {
            r["partition_index"]: r["partition_error_code"]
            for t in answer["results_by_topic_v3_and_below"]
            for r in t["results_by_partition"]
        }

    async def produce(
        self, txn_id: str | None, pid: int, epoch: int, seq: int, values: list[bytes], partition: int = 0, **kw: Any
    ) -> tuple[int, int]:
        batch = make_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=True, **kw)
        answer = await self.call(
            ApiKey.PRODUCE,
            9,
            produce_body(TOPIC, batch, partition, transactional_id=txn_id),
        )
        part = answer["responses"][0]["partition_responses"][0]
        return part["error_code"], part["base_offset"]

    async def end(self, txn_id: str, pid: int, epoch: int, commit: bool, version: int = 3) -> int:
        answer = await self.call(
            ApiKey.END_TXN,
            version,
            {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch, "committed": commit},
        )
        return answer["error_code"]

    async def fetch(self, offset: int, committed: bool, partition: int = 0) -> dict[str, Any]:
        body = fetch_body(TOPIC, offset, partition)
        body["isolation_level"] = 1 if committed else 0
        answer = await self.call(ApiKey.FETCH, 11, body)
        return answer["responses"][0]["partitions"][0]

    async def latest(self, committed: bool, partition: int = 0) -> int:
        answer = await self.call(
            ApiKey.LIST_OFFSETS,
            5,
            {
                "replica_id": -1,
                "isolation_level": 1 if committed else 0,
                "topics": [
                    {
                        "name": TOPIC,
                        "partitions": [{"partition_index": partition, "current_leader_epoch": -1, "timestamp": -1}],
                    }
                ],
            },
        )
        return answer["topics"][0]["partitions"][0]["offset"]


@pytest.fixture
async def broker(tmp_path: Path):
    b = await Broker(tmp_path / "data").start()
    await b.store.create_topic(TOPIC, 2)
    yield b
    await b.stop()


def _txn_offsets_body(txn_id: str, group: str, pid: int, epoch: int, offset: int) -> dict[str, Any]:
    """A TxnOffsetCommit of `offset` for partition 1 of the topic."""
    return {
        "transactional_id": txn_id,
        "group_id": group,
        "producer_id": pid,
        "producer_epoch": epoch,
        "generation_id": -1,
        "member_id": "",
        "group_instance_id": None,
        "topics": [
            {
                "name": TOPIC,
                "partitions": [
                    {
                        "partition_index": 1,
                        "committed_offset": offset,
                        "committed_leader_epoch": -1,
                        "committed_metadata": "",
                    }
                ],
            }
        ],
    }


async def _begin(b: Broker, txn_id: str, *partitions: int) -> tuple[int, int]:
    init = await b.init(txn_id)
    assert init["error_code"] == 0
    pid, epoch = init["producer_id"], init["producer_epoch"]
    assert await b.add(txn_id, pid, epoch, *partitions) == dict.fromkeys(partitions, 0)
    return pid, epoch


async def test_read_committed_stops_at_the_open_transaction_and_skips_the_aborted_one(broker: Broker) -> None:
    pid, epoch = await _begin(broker, "t-abort", 0)
    assert (await broker.produce("t-abort", pid, epoch, 0, [b"a1", b"a2"]))[0] == 0
    assert await broker.end("t-abort", pid, epoch, commit=False) == 0
    other_pid, other_epoch = await _begin(broker, "t-open", 0)
    code, open_offset = await broker.produce("t-open", other_pid, other_epoch, 0, [b"o1"])
    assert code == 0 and open_offset == 3  # after the two aborted records and their marker

    committed = await broker.fetch(0, committed=True)
    assert committed["last_stable_offset"] == open_offset
    assert committed["high_watermark"] == open_offset + 1
    assert committed["aborted_transactions"] == [{"producer_id": pid, "first_offset": 0}]
    assert values_of(committed["records"])[:2] == [b"a1", b"a2"]  # (then the ABORT marker's control record)
    assert b"o1" not in values_of(committed["records"])
    assert await broker.latest(committed=True) == open_offset
    assert await broker.latest(committed=False) == open_offset + 1
    uncommitted = await broker.fetch(0, committed=False)
    assert uncommitted["aborted_transactions"] is None
    assert b"o1" in values_of(uncommitted["records"])
    assert uncommitted["last_stable_offset"] == open_offset  # the LSO is the partition's, whatever the isolation

    # DescribeProducers names the open transaction's first offset and its coordinator's epoch
    described = await broker.call(ApiKey.DESCRIBE_PRODUCERS, 0, {"topics": [{"name": TOPIC, "partition_indexes": [0]}]})
    producers = {p["producer_id"]: p for p in described["topics"][0]["partitions"][0]["active_producers"]}
    assert producers[other_pid]["current_txn_start_offset"] == open_offset
    assert producers[other_pid]["coordinator_epoch"] == 0
    assert producers[pid]["current_txn_start_offset"] == -1  # (its transaction was aborted)
    # the open one commits: read_committed reaches the end, past its COMMIT marker
    assert await broker.end("t-open", other_pid, other_epoch, commit=True) == 0
    after = await broker.fetch(open_offset, committed=True)
    assert after["last_stable_offset"] == after["high_watermark"] == open_offset + 2
    assert values_of(after["records"])[0] == b"o1"


async def test_a_second_init_fences_the_first_producer(broker: Broker) -> None:
    pid, epoch = await _begin(broker, "t-fence", 0, 1)
    assert (await broker.produce("t-fence", pid, epoch, 0, [b"old"]))[0] == 0
    again = await broker.init("t-fence")
    assert again["error_code"] == 0 and again["producer_id"] == pid and again["producer_epoch"] > epoch
    # what the fenced producer had open was aborted: nothing of it is readable as committed
    part = await broker.fetch(0, committed=True)
    assert part["last_stable_offset"] == part["high_watermark"]
    assert part["aborted_transactions"] == [{"producer_id": pid, "first_offset": 0}]
    # every request of the old epoch is refused
    assert (await broker.produce("t-fence", pid, epoch, 1, [b"late"]))[0] == E.InvalidProducerEpochError.code
    assert await broker.add("t-fence", pid, epoch, 0) == {0: E.ProducerFencedError.code}
    assert await broker.add("t-fence", pid, epoch, 0, version=1) == {0: E.InvalidProducerEpochError.code}
    assert await broker.end("t-fence", pid, epoch, commit=True) == E.ProducerFencedError.code
    assert await broker.end("t-fence", pid, epoch, commit=True, version=1) == E.InvalidProducerEpochError.code
    # KIP-360: naming an epoch that is not the current one is fenced too
    assert (await broker.init("t-fence", pid=pid, epoch=epoch))["error_code"] == E.ProducerFencedError.code


async def test_bad_requests_get_kafkas_codes_and_write_nothing(broker: Broker) -> None:
    assert (await broker.init("t-bad", timeout_ms=900_001))["error_code"] == E.InvalidTransactionTimeoutError.code
    assert (await broker.init("t-bad", timeout_ms=0))["error_code"] == E.InvalidTransactionTimeoutError.code
    assert await broker.end("nobody", 12345, 0, commit=True) == E.InvalidProducerIdMappingError.code
    init = await broker.init("t-bad")
    pid, epoch = init["producer_id"], init["producer_epoch"]
    assert await broker.end("t-bad", pid, epoch, commit=True) == E.InvalidTxnStateError.code  # nothing begun
    # a partition never added: refused, nothing appended
    assert (await broker.produce("t-bad", pid, epoch, 0, [b"x"]))[0] == E.InvalidTxnStateError.code
    assert (await broker.add("t-bad", pid, epoch, 0, 7)) == {0: E.OperationNotAttemptedError.code, 7: 3}
    assert (await broker.produce("t-bad", pid, epoch, 0, [b"x"]))[0] == E.InvalidTxnStateError.code
    assert broker.store.end_offset(TOPIC, 0) == 0
    # delayed delivery inside a transaction is refused with a clear error
    assert await broker.add("t-bad", pid, epoch, 0) == {0: 0}
    code, _ = await broker.produce("t-bad", pid, epoch, 0, [b"later"], headers=[[("mqk-delay-ms", b"1000")]])
    assert code == E.InvalidRecordError.code
    assert broker.store.end_offset(TOPIC, 0) == 0
    # a retried EndTxn is answered as the first; the opposite decision is refused
    assert (await broker.produce("t-bad", pid, epoch, 0, [b"y"]))[0] == 0
    assert await broker.end("t-bad", pid, epoch, commit=True) == 0
    assert await broker.end("t-bad", pid, epoch, commit=True) == 0
    assert await broker.end("t-bad", pid, epoch, commit=False) == E.InvalidTxnStateError.code
    # a client may not pose as a transaction without its id on the request: its partitions were not added
    assert (await broker.produce(None, pid, epoch, 1, [b"z"], partition=1))[0] == E.InvalidTxnStateError.code


async def test_transaction_state_survives_a_restart(tmp_path: Path) -> None:
    b = await Broker(tmp_path / "data").start()
    await b.store.create_topic(TOPIC, 2)
    pid, epoch = await _begin(b, "t-open", 0)
    assert (await b.produce("t-open", pid, epoch, 0, [b"open"]))[0] == 0
    done_pid, done_epoch = await _begin(b, "t-aborted", 1)
    assert (await b.produce("t-aborted", done_pid, done_epoch, 0, [b"gone"], partition=1))[0] == 0
    assert await b.end("t-aborted", done_pid, done_epoch, commit=False) == 0
    await b.stop()

    b = await Broker(tmp_path / "data").start()
    try:
        assert b.txns.txns["t-open"].state == ONGOING
        assert b.txns.txns["t-aborted"].state == COMPLETE_ABORT
        part = await b.fetch(0, committed=True)
        assert part["last_stable_offset"] == 0 and part["high_watermark"] == 1
        aborted = await b.fetch(0, committed=True, partition=1)
        assert aborted["aborted_transactions"] == [{"producer_id": done_pid, "first_offset": 0}]
        # the producer goes on with its transaction after the restart
        assert (await b.produce("t-open", pid, epoch, 1, [b"more"]))[0] == 0
        assert await b.end("t-open", pid, epoch, commit=True) == 0
        part = await b.fetch(0, committed=True)
        assert part["last_stable_offset"] == part["high_watermark"] == 3
        assert values_of(part["records"])[:2] == [b"open", b"more"]
    finally:
        await b.stop()


async def test_a_transaction_stopped_between_prepare_and_complete_is_completed_at_start(tmp_path: Path) -> None:
    b = await Broker(tmp_path / "data").start()
    await b.store.create_topic(TOPIC, 2)
    pid, epoch = await _begin(b, "t-prepared", 0, 1)
    assert (await b.produce("t-prepared", pid, epoch, 0, [b"p0"]))[0] == 0

    async def stop_before_markers(txn: Any, commit: bool) -> None:
        raise RuntimeError("the broker stops here")

    b.txns._complete = stop_before_markers  # type: ignore[method-assign]  # the crash point
    with pytest.raises(Exception):  # noqa: B017 - the answer is lost with the "crash"
        await b.end("t-prepared", pid, epoch, commit=True)
    await b.client.close()
    b.client = await RawKafkaClient.connect(b.server.host, b.server.port)
    assert (await b.fetch(0, committed=True))["last_stable_offset"] == 0  # PrepareCommit: not visible yet
    await b.stop()

    b = await Broker(tmp_path / "data").start()
    try:
        assert b.txns.txns["t-prepared"].state == COMPLETE_COMMIT
        part = await b.fetch(0, committed=True)
        assert part["last_stable_offset"] == part["high_watermark"] == 2  # the record and its COMMIT marker
        assert values_of(part["records"])[0] == b"p0"
        assert b.store.end_offset(TOPIC, 1) == 1  # the marker went to the partition with no record too
        # the producer's retried EndTxn is answered as done
        assert await b.end("t-prepared", pid, epoch, commit=True) == 0
    finally:
        await b.stop()


async def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(tmp_path: Path) -> None:
    clock = FakeClock()
    b = await Broker(tmp_path / "data", clock, transaction_abort_timed_out_transaction_cleanup_interval_ms=1000).start()
    try:
        await b.store.create_topic(TOPIC, 2)
        init = await b.init("t-slow", timeout_ms=5000)
        pid, epoch = init["producer_id"], init["producer_epoch"]
        assert await b.add("t-slow", pid, epoch, 0) == {0: 0}
        assert (await b.produce("t-slow", pid, epoch, 0, [b"slow"]))[0] == 0
        await clock.advance(4)
        assert b.txns.txns["t-slow"].state == ONGOING
        await clock.advance(2)
        assert b.txns.txns["t-slow"].state == COMPLETE_ABORT
        part = await b.fetch(0, committed=True)
        assert part["last_stable_offset"] == part["high_watermark"] == 2
        assert part["aborted_transactions"] == [{"producer_id": pid, "first_offset": 0}]
        assert await b.end("t-slow", pid, epoch, commit=True) == E.ProducerFencedError.code
        # KIP-360: the timed-out producer re-initialises with its old epoch and goes on with a newer one
        again = await b.init("t-slow", timeout_ms=5000, pid=pid, epoch=epoch)
        assert again["error_code"] == 0 and again["producer_id"] == pid and again["producer_epoch"] > epoch
    finally:
        await b.stop()


async def test_transactional_offsets_are_committed_with_the_transaction_only(broker: Broker) -> None:
    async def commit_offset(txn_id: str, pid: int, epoch: int, offset: int) -> int:
        assert (
            await broker.call(
                ApiKey.ADD_OFFSETS_TO_TXN,
                3,
                {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch, "group_id": "eos"},
            )
        )["error_code"] == 0
        answer = await broker.call(ApiKey.TXN_OFFSET_COMMIT, 3, _txn_offsets_body(txn_id, "eos", pid, epoch, offset))
        return answer["topics"][0]["partitions"][0]["error_code"]

    async def committed(require_stable: bool = False) -> tuple[int, int]:
        answer = await broker.call(
            ApiKey.OFFSET_FETCH,
            7,
            {
                "group_id": "eos",
                "topics": [{"name": TOPIC, "partition_indexes": [1]}],
                "require_stable": require_stable,
            },
        )
        part = answer["topics"][0]["partitions"][0]
        return part["error_code"], part["committed_offset"]

    pid, epoch = await _begin(broker, "t-eos", 0)
    assert await commit_offset("t-eos", pid, epoch, 10) == 0
    assert await committed() == (0, -1)
    assert (await committed(require_stable=True))[0] == E.UnstableOffsetCommitError.code
    assert await broker.end("t-eos", pid, epoch, commit=False) == 0
    assert await committed(require_stable=True) == (0, -1)
    assert await broker.add("t-eos", pid, epoch, 0) == {0: 0}
    assert await commit_offset("t-eos", pid, epoch, 20) == 0
    assert await broker.end("t-eos", pid, epoch, commit=True) == 0
    assert await committed(require_stable=True) == (0, 20)


async def _mqk(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mqk", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_the_cli_lists_describes_and_aborts_a_transaction(broker: Broker) -> None:
    bootstrap = f"{broker.server.host}:{broker.server.port}"
    pid, epoch = await _begin(broker, "t-cli", 0, 1)
    assert (await broker.produce("t-cli", pid, epoch, 0, [b"stuck"]))[0] == 0
    listed = json.loads(await _mqk("transactions", "list", "--json", "--bootstrap", bootstrap))
    assert listed == [{"transactional_id": "t-cli", "producer_id": pid, "transaction_state": ONGOING}]
    assert (
        json.loads(await _mqk("transactions", "list", "--state", "CompleteCommit", "--json", "--bootstrap", bootstrap))
        == []
    )
    described = json.loads(
        await _mqk("transactions", "describe", "--transactional-id", "t-cli", "--json", "--bootstrap", bootstrap)
    )
    assert described["transaction_state"] == ONGOING and described["producer_epoch"] == epoch
    assert described["topics"] == [{"topic": TOPIC, "partitions": [0, 1]}]
    assert (await broker.fetch(0, committed=True))["last_stable_offset"] == 0

    out = await _mqk("transactions", "abort", "--transactional-id", "t-cli", "--bootstrap", bootstrap)
    assert "aborted the transaction under way" in out
    assert broker.txns.txns["t-cli"].state == COMPLETE_ABORT
    part = await broker.fetch(0, committed=True)
    assert part["last_stable_offset"] == part["high_watermark"] == 2
    assert await broker.end("t-cli", pid, epoch, commit=True) == E.ProducerFencedError.code


async def test_no_client_may_write_a_control_batch(broker: Broker) -> None:
    from mqk.server.kafka.transactions import control_batch

    pid, epoch = await _begin(broker, "t-forger", 0)
    for forged in (
        control_batch(-1, -1, commit=True, timestamp=0),
        control_batch(pid, epoch, commit=False, timestamp=0),
    ):
        answer = await broker.call(
            ApiKey.PRODUCE,
            9,
            produce_body(TOPIC, forged, 0, transactional_id=None),
        )
        part = answer["responses"][0]["partition_responses"][0]
        assert part["error_code"] == E.InvalidRecordError.code, part
    assert broker.store.end_offset(TOPIC, 0) == 0


async def test_an_end_whose_markers_fail_is_finished_by_the_retry(broker: Broker) -> None:
    pid, epoch = await _begin(broker, "t-full", 0, 1)
    assert (await broker.produce("t-full", pid, epoch, 0, [b"r"]))[0] == 0
    append = broker.store.append

    async def full_on_partition_1(topic: str, partition: int, *args: Any, **kw: Any) -> Any:
        if topic == TOPIC and partition == 1:
            raise E.StorageFull("no space left on the device")
        return await append(topic, partition, *args, **kw)

    broker.store.append = full_on_partition_1  # type: ignore[method-assign]  # a full disk for one partition
    assert await broker.end("t-full", pid, epoch, commit=True) == E.CoordinatorNotAvailableError.code
    assert broker.txns.txns["t-full"].state == PREPARE_COMMIT
    assert (await broker.fetch(0, committed=True))["last_stable_offset"] == 2  # its marker is written
    broker.store.append = append  # type: ignore[method-assign]  # room again
    assert await broker.end("t-full", pid, epoch, commit=True) == 0  # the client's retry finishes it
    assert broker.txns.txns["t-full"].state == COMPLETE_COMMIT
    assert broker.store.end_offset(TOPIC, 1) >= 1  # partition 1 got its marker


async def test_an_idle_transactional_id_is_forgotten_after_its_expiration(tmp_path: Path) -> None:
    clock = FakeClock()
    b = await Broker(
        tmp_path / "data",
        clock,
        transaction_abort_timed_out_transaction_cleanup_interval_ms=1000,
        transactional_id_expiration_ms=60_000,
    ).start()
    try:
        await b.store.create_topic(TOPIC, 2)
        pid, epoch = await _begin(b, "t-idle", 0)
        assert await b.end("t-idle", pid, epoch, commit=False) == 0
        busy_pid, busy_epoch = await _begin(b, "t-busy", 0)
        await clock.advance(30)
        assert await b.end("t-busy", busy_pid, busy_epoch, commit=True) == 0  # (busy again: its idle time restarts)
        await clock.advance(31)
        assert "t-idle" not in b.txns.txns and pid not in b.txns.by_pid
        assert "t-busy" in b.txns.txns
    finally:
        await b.stop()
    b = await Broker(tmp_path / "data").start()
    try:
        assert "t-idle" not in b.txns.txns and "t-busy" in b.txns.txns  # (the tombstone is in the state log)
    finally:
        await b.stop()


# --- transaction version 2 (KIP-890 part 2) ------------------------------------------------------------------------


async def _produce_v12(
    client: RawKafkaClient, txn_id: str, pid: int, epoch: int, seq: int, values: list[bytes], partition: int = 0
) -> tuple[int, int]:
    batch = make_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=True)
    answer = await client.call(
        ApiKey.PRODUCE,
        12,
        produce_body(TOPIC, batch, partition, transactional_id=txn_id),
    )
    part = answer["responses"][0]["partition_responses"][0]
    return part["error_code"], part["base_offset"]


def _end_v5_body(txn_id: str, pid: int, epoch: int, commit: bool) -> dict[str, Any]:
    return {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch, "committed": commit}


async def test_api_versions_finalizes_transaction_version_2(broker: Broker) -> None:
    answer = await broker.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
    assert {"name": "transaction.version", "max_version_level": 2, "min_version_level": 2} in answer[
        "finalized_features"
    ]
    versions = {k["api_key"]: k["max_version"] for k in answer["api_keys"]}
    assert versions[ApiKey.END_TXN] == 5 and versions[ApiKey.TXN_OFFSET_COMMIT] == 5


async def test_transaction_version_2_adds_implicitly_and_bumps_the_epoch_at_every_end(broker: Broker) -> None:
    init = await broker.init("t-v2")
    pid, epoch = init["producer_id"], init["producer_epoch"]
    # no AddPartitionsToTxn: the Produce v12 batch adds its partition
    assert (await _produce_v12(broker.client, "t-v2", pid, epoch, 0, [b"one"]))[0] == 0
    assert (await broker.fetch(0, committed=True))["last_stable_offset"] == 0
    # no AddOffsetsToTxn either: TxnOffsetCommit v5 adds its group
    answer = await broker.call(ApiKey.TXN_OFFSET_COMMIT, 5, _txn_offsets_body("t-v2", "g-v2", pid, epoch, 7))
    assert answer["topics"][0]["partitions"][0]["error_code"] == 0
    ended = await broker.call(ApiKey.END_TXN, 5, _end_v5_body("t-v2", pid, epoch, commit=True))
    assert ended["error_code"] == 0 and ended["producer_id"] == pid and ended["producer_epoch"] == epoch + 1
    part = await broker.fetch(0, committed=True)
    assert part["last_stable_offset"] == part["high_watermark"] == 2
    assert broker.server.groups.fetch_offsets("g-v2")[(TOPIC, 1)].offset == 7
    # the same EndTxn again (its answer lost) is answered as the first; the other decision is fenced
    again = await broker.call(ApiKey.END_TXN, 5, _end_v5_body("t-v2", pid, epoch, commit=True))
    assert (again["error_code"], again["producer_epoch"]) == (0, epoch + 1)
    other = await broker.call(ApiKey.END_TXN, 5, _end_v5_body("t-v2", pid, epoch, commit=False))
    assert other["error_code"] == E.ProducerFencedError.code
    # the next transaction goes on at the new epoch, from sequence 0
    assert (await _produce_v12(broker.client, "t-v2", pid, epoch + 1, 0, [b"two"]))[0] == 0
    assert (await broker.call(ApiKey.END_TXN, 5, _end_v5_body("t-v2", pid, epoch + 1, commit=False)))[
        "producer_epoch"
    ] == epoch + 2


async def test_a_late_end_txn_cannot_end_the_next_transaction(broker: Broker) -> None:
    """KIP-890's scenario: the EndTxn of transaction N is held up on one connection (an in-test TCP proxy), the
    producer retries it on another and goes on with transaction N+1; when the held EndTxn (and a held produce of
    N) finally arrive, N+1 is untouched: still open, its records still invisible to read_committed."""
    proxy = Proxy((broker.server.host, broker.server.port))
    slow = await RawKafkaClient.connect("127.0.0.1", proxy.port)
    try:
        init = await broker.init("t-late")
        pid, epoch = init["producer_id"], init["producer_epoch"]
        assert (await _produce_v12(broker.client, "t-late", pid, epoch, 0, [b"n"]))[0] == 0
        proxy.hold()
        held_end = slow.send(ApiKey.END_TXN, 5, _end_v5_body("t-late", pid, epoch, commit=True))
        batch = make_batch([b"late"], producer_id=pid, producer_epoch=epoch, base_sequence=1, transactional=True)
        held_produce = slow.send(
            ApiKey.PRODUCE,
            12,
            produce_body(TOPIC, batch, 0, transactional_id="t-late"),
        )
        await slow.writer.drain()
        # the producer gives up waiting and retries on its other connection: N commits, N+1 begins
        ended = await broker.call(ApiKey.END_TXN, 5, _end_v5_body("t-late", pid, epoch, commit=True))
        assert ended["error_code"] == 0
        next_epoch = ended["producer_epoch"]
        code, open_offset = await _produce_v12(broker.client, "t-late", pid, next_epoch, 0, [b"n+1"])
        assert code == 0
        proxy.release()
        late_end_cid, late_end = await slow.receive()
        late_produce_cid, late_produce = await slow.receive()
        assert (late_end_cid, late_produce_cid) == (held_end, held_produce)
        # the held EndTxn names N's epoch, behind N+1's: it is fenced, and N+1 is not ended by it (under
        # transaction version 1 the epoch would not have moved, and it would have committed N+1)
        assert late_end["error_code"] == E.ProducerFencedError.code
        assert broker.txns.txns["t-late"].state == ONGOING
        assert broker.txns.txns["t-late"].producer_epoch == next_epoch
        part = await broker.fetch(0, committed=True)
        assert part["last_stable_offset"] == open_offset  # N+1's record is still undecided
        # and the held produce of N is refused: its epoch is behind
        produce_code = late_produce["responses"][0]["partition_responses"][0]["error_code"]
        assert produce_code == E.InvalidProducerEpochError.code
        assert b"late" not in values_of((await broker.fetch(0, committed=False))["records"])
    finally:
        await slow.close()
        proxy.close()


class _Aborts:
    """Three producers' transactions on a compacted partition, written on `clock` (which starts 3 hours back):
    A aborts one and commits the next; B aborts one, its marker its last batch; then, 3 hours on (now), C aborts
    one and commits the next. Only A's ABORT marker is both older than delete.retention.ms (an hour) and not its
    producer's last batch."""

    #: what a read_committed reader gets before the heads
    COMMITTED = (b"A-committed", b"C-committed")

    def __init__(self) -> None:
        #: producer name -> the offset of its ABORT marker
        self.markers: dict[str, int] = {}

    async def write(self, b: Broker, clock: FakeClock) -> None:
        await b.store.create_topic(
            TOPIC,
            1,
            TopicConfig(
                {
                    "cleanup.policy": "compact",
                    "segment.bytes": "1",
                    "min.cleanable.dirty.ratio": "0.01",
                    "delete.retention.ms": str(HOUR),
                }
            ),
        )
        await self._transaction(b, clock, "A", commit_next=True)
        await self._transaction(b, clock, "B", commit_next=False)
        clock.set_time_ms(clock.time_ms() + 3 * HOUR)
        await self._transaction(b, clock, "C", commit_next=True)
        await self.head(b, clock)

    async def _transaction(self, b: Broker, clock: FakeClock, name: str, commit_next: bool) -> None:
        txn_id = "t-" + name
        pid, epoch = await _begin(b, txn_id, 0)

        async def produce(seq: int, value: bytes) -> None:
            key = b"%s-%d" % (value, clock.time_ms())
            assert (await b.produce(txn_id, pid, epoch, seq, [value], keys=[key], timestamp=clock.time_ms()))[0] == 0

        await produce(0, name.encode() + b"-aborted")
        assert await b.end(txn_id, pid, epoch, commit=False) == 0
        self.markers[name] = b.txns.aborted_ranges(TOPIC, 0)[-1][0]
        if commit_next:
            assert await b.add(txn_id, pid, epoch, 0) == {0: 0}
            await produce(1, name.encode() + b"-committed")
            assert await b.end(txn_id, pid, epoch, commit=True) == 0

    @staticmethod
    async def head(b: Broker, clock: FakeClock) -> None:
        """A new last batch: the one before it becomes cleanable, and dirty."""
        await b.store.append(TOPIC, 0, [make_batch([b"head"], keys=[b"head"], timestamp=clock.time_ms())])

    def offsets(self, b: Broker) -> set[int]:
        return {marker for marker, _pid, _first in b.txns.aborted_ranges(TOPIC, 0)}


def _cleaner(b: Broker, clock: FakeClock) -> CompactionService:
    """The log cleaner as the runtime wires it: on the broker's store and clock, asking its coordinator."""
    cleaner = CompactionService(b.config, b.store, clock=clock)
    cleaner.transactions = b.txns
    return cleaner


async def _logged(b: Broker) -> list[bytes]:
    """Every value the partition holds, read_uncommitted."""
    return values_of((await b.fetch(0, committed=False))["records"])


async def _marker_there(b: Broker, offset: int) -> bool:
    """Whether the partition still holds the control batch at `offset` (a read there starts at the next batch
    left)."""
    data = raw_records((await b.fetch(offset, committed=False))["records"])
    header = load("recbatch").parse_header(data, 0)
    return bool(header[0] == offset and header[5] & 0x20)


@pytest.mark.parametrize("storage", ["file", "rocksdb"])  # (the memory engine keeps nothing over a restart)
async def test_the_cleaner_drops_an_old_abort_marker_after_its_index_entry_and_readers_see_what_followed(
    storage: str, tmp_path: Path
) -> None:
    """Kafka's cleaner with the real coordinator and Fetch: the aborted records go first; a pass later every
    aborted transaction of the partition is forgotten (nothing of theirs is left), for good (a restart reads the
    tombstones back), and only the old ABORT marker that is not its producer's last batch goes. A read_committed
    reader still gets every committed record, the aborting producers' later ones included."""
    clock = FakeClock(start_ms=int(time.time() * 1000) - 3 * HOUR)
    b = await Broker(tmp_path / "data", clock, storage=storage).start()
    aborts = _Aborts()
    try:
        await aborts.write(b, clock)
        cleaner = _cleaner(b, clock)

        await cleaner.run_once()
        assert not {b"A-aborted", b"B-aborted", b"C-aborted"} & set(await _logged(b))
        assert aborts.offsets(b) == set(aborts.markers.values())  # the markers and their entries stay a pass
        assert committed_values(await b.fetch(0, committed=True))[:2] == list(aborts.COMMITTED)

        await aborts.head(b, clock)
        await cleaner.run_once()
        assert aborts.offsets(b) == set()
        part = await b.fetch(0, committed=True)
        assert not part["aborted_transactions"]
        assert committed_values(part)[:2] == list(aborts.COMMITTED)
        assert not await _marker_there(b, aborts.markers["A"])
        assert await _marker_there(b, aborts.markers["B"])  # its producer's last batch
        assert await _marker_there(b, aborts.markers["C"])  # younger than delete.retention.ms
    finally:
        await b.stop()

    b = await Broker(tmp_path / "data", clock, storage=storage).start()
    try:
        assert b.txns.aborted_ranges(TOPIC, 0) == []
        part = await b.fetch(0, committed=True)
        assert not part["aborted_transactions"]
        assert committed_values(part)[:2] == list(aborts.COMMITTED)
    finally:
        await b.stop()


async def test_a_crash_between_forgetting_an_aborted_transaction_and_dropping_its_marker_leaves_the_marker(
    tmp_path: Path,
) -> None:
    """The order the cleaner keeps: the index entries are forgotten (their tombstones in `__transaction_state`)
    before the rewrite that drops a marker. A broker stopping in between (here the rewrite fails, then the broker
    stops) comes back with the entries forgotten and the old marker still in the log, which read_committed
    readers pass over; the next pass drops it."""
    clock = FakeClock(start_ms=int(time.time() * 1000) - 3 * HOUR)
    b = await Broker(tmp_path / "data", clock).start()
    aborts = _Aborts()
    try:
        await aborts.write(b, clock)
        cleaner = _cleaner(b, clock)
        await cleaner.run_once()  # the aborted records go
        await aborts.head(b, clock)
        engine = b.store.engine_of(TOPIC)

        async def crash(*_args: object) -> None:
            raise RuntimeError("the broker stops here")

        engine.replace_range = crash  # type: ignore[method-assign]  # the crash point
        with pytest.raises(RuntimeError):
            await cleaner.run_once()
        assert aborts.offsets(b) == set()
    finally:
        await b.stop()

    b = await Broker(tmp_path / "data", clock).start()
    try:
        assert b.txns.aborted_ranges(TOPIC, 0) == []  # the tombstones were written before the rewrite
        assert await _marker_there(b, aborts.markers["A"])  # which never happened
        part = await b.fetch(0, committed=True)
        assert not part["aborted_transactions"]
        assert committed_values(part)[:2] == list(aborts.COMMITTED)
        cleaner = _cleaner(b, clock)
        await aborts.head(b, clock)
        await cleaner.run_once()
        assert not await _marker_there(b, aborts.markers["A"])
        assert committed_values(await b.fetch(0, committed=True))[:2] == list(aborts.COMMITTED)
    finally:
        await b.stop()
