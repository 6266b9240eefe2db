"""The idempotent producer's sequence checks driven by Hypothesis over the wire, against a file-store broker that
is restarted between steps: new batches, retries of any of the last five (librdkafka retries whole batches after a
timeout), pipelined pairs with a retry in flight, gaps, epoch bumps the producer makes itself (the Java client's),
InitProducerId with the current id and epoch (librdkafka's bump, KIP-360: a new id, as from Kafka), batches from a
fenced epoch, and broker restarts (the producer state is rebuilt from the log's tail).

The model is the producer's own view: what it was told was written, at which offsets. Invariants: every answer is
the one Kafka gives (the original offsets for a retry, OUT_OF_ORDER_SEQUENCE_NUMBER for a gap,
INVALID_PRODUCER_EPOCH for a fenced epoch), and the partition holds exactly the batches that were acknowledged as
new, once each, in order, after every restart. This found InitProducerId refusing a bump with
INVALID_PRODUCER_EPOCH after a restart, and pipelined produces into a topic still being auto-created getting
UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from helpers import fetch_body, produce_body, values_of
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mqk import errors as E
from mqk.config import BrokerConfig, StoreConfig
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient, make_batch
from mqk.server.kafka.server import KafkaServer
from mqk.store.manager import StoreManager

TOPIC = "idem"
CACHED = 5  # batches per producer and partition the broker remembers (Kafka's window)


def _answer(response: dict) -> tuple[int, int]:
    part = response["responses"][0]["partition_responses"][0]
    return part["error_code"], part["base_offset"]


class IdempotenceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory(prefix="mqk-idem-")
        store = StoreConfig(
            storage="file", data_dir=Path(self.tmp.name), commitlog_segment_bytes=1 << 20, cq_units_per_file=1024
        )
        self.config = BrokerConfig(kafka_listen=("127.0.0.1", 0), store=store)
        self.store = self.server = self.client = None
        self.pid = -1
        self.epoch = -1
        self.next_seq = 0
        self.written_epoch: dict[int, int] = {}  # producer id -> the highest epoch of a batch the partition holds
        # (producer id, epoch, first seq, values, base offset) of every batch acknowledged as new
        self.acked: list[tuple[int, int, int, list[bytes], int]] = []
        self.values: list[bytes] = []  # the partition's records, as the producer was told
        self.counter = 0
        self.runs = 0  # broker starts so far
        self.allocated_in: dict[int, int] = {}  # producer id -> the broker start that handed it out

    def _run(self, coro):
        return self.loop.run_until_complete(coro)

    async def _start(self) -> None:
        self.store = StoreManager(self.config.store)
        await self.store.start()
        self.server = KafkaServer(self.config, self.store)
        await self.server.start()
        self.client = await RawKafkaClient.connect(self.server.host, self.server.port)
        self.runs += 1

    async def _stop(self) -> None:
        await self.client.close()
        await self.server.stop()
        await self.store.close()

    def teardown(self) -> None:
        try:
            if self.server is not None:
                self._run(self._stop())
        finally:
            self.loop.close()
            self.tmp.cleanup()

    def _values(self, count: int) -> list[bytes]:
        out = [f"v{self.counter + i}".encode() for i in range(count)]
        self.counter += count
        return out

    def _batch(self, epoch: int, seq: int, values: list[bytes], pid: int | None = None):
        return make_batch(values, producer_id=self.pid if pid is None else pid, producer_epoch=epoch, base_sequence=seq)

    def _send(self, batch) -> tuple[int, int]:
        return _answer(self._run(self.client.call(ApiKey.PRODUCE, 9, produce_body(TOPIC, batch))))

    def _init_producer_id(self, pid: int, epoch: int) -> dict:
        return self._run(
            self.client.call(
                ApiKey.INIT_PRODUCER_ID,
                4,
                {
                    "transactional_id": None,
                    "transaction_timeout_ms": 60000,
                    "producer_id": pid,
                    "producer_epoch": epoch,
                },
            )
        )

    def _accepted(self, seq: int, values: list[bytes], base_offset: int) -> None:
        assert base_offset == len(self.values), (base_offset, len(self.values))
        self.acked.append((self.pid, self.epoch, seq, values, base_offset))
        self.values += values
        self.next_seq += len(values)
        self.written_epoch[self.pid] = max(self.written_epoch.get(self.pid, -1), self.epoch)

    @initialize()
    def start(self) -> None:
        self._run(self._start())
        init = self._init_producer_id(-1, -1)
        assert init["error_code"] == 0
        self.pid, self.epoch = init["producer_id"], init["producer_epoch"]
        self.allocated_in[self.pid] = self.runs

    @rule(count=st.integers(1, 3))
    def send_new(self, count: int) -> None:
        values = self._values(count)
        code, base = self._send(self._batch(self.epoch, self.next_seq, values))
        assert code == 0, code
        self._accepted(self.next_seq, values, base)

    def _current(self) -> list[tuple[int, int, int, list[bytes], int]]:
        return [entry for entry in self.acked if entry[:2] == (self.pid, self.epoch)]

    @precondition(lambda self: self._current())
    @rule(back=st.integers(1, CACHED))
    def retry(self, back: int) -> None:
        """A batch whose answer the producer never saw, sent again unchanged."""
        mine = self._current()[-CACHED:]
        pid, epoch, seq, values, base = mine[-min(back, len(mine))]
        assert self._send(self._batch(epoch, seq, values, pid)) == (0, base)

    @rule(count=st.integers(1, 2))
    def pipelined_with_retry_in_flight(self, count: int) -> None:
        """Two new batches and a retry of the first, sent back to back (max.in.flight > 1)."""
        first, second = self._values(count), self._values(1)
        seq = self.next_seq
        for batch in (
            self._batch(self.epoch, seq, first),
            self._batch(self.epoch, seq + count, second),
            self._batch(self.epoch, seq, first),
        ):
            self.client.send(ApiKey.PRODUCE, 9, produce_body(TOPIC, batch))
        self._run(self.client.writer.drain())
        answers = [_answer(self._run(self.client.receive())[1]) for _ in range(3)]
        assert answers[0][0] == 0 and answers[1][0] == 0 and answers[2] == answers[0], answers
        self._accepted(seq, first, answers[0][1])
        self._accepted(seq + count, second, answers[1][1])

    @rule(ahead=st.integers(1, 3))
    def gap(self, ahead: int) -> None:
        seq, values = self.next_seq + ahead, self._values(1)
        code, base = self._send(self._batch(self.epoch, seq, values))
        if self.pid in self.written_epoch or self.allocated_in[self.pid] == self.runs:
            assert code == E.OutOfOrderSequenceNumberError.code, code
        else:
            # an id from before this start with nothing in the partition: the broker cannot know where its
            # sequence stands and accepts it (Kafka accepts an unknown producer's first batch at any sequence)
            assert code == 0, code
            self.next_seq = seq
            self._accepted(seq, values, base)

    @rule()
    def bump_epoch(self) -> None:
        """The producer bumps its epoch itself and starts the new epoch at sequence 0 (the Java client)."""
        self.epoch += 1
        self.next_seq = 0

    @rule()
    def init_again(self) -> None:
        """InitProducerId with the current id and epoch (librdkafka's epoch bump): Kafka hands out a new id."""
        init = self._init_producer_id(self.pid, self.epoch)
        assert init["error_code"] == 0 and init["producer_epoch"] == 0 and init["producer_id"] > self.pid, init
        self.pid, self.epoch, self.next_seq = init["producer_id"], 0, 0
        self.allocated_in[self.pid] = self.runs

    @precondition(lambda self: self.written_epoch.get(self.pid, 0) > 0)
    @rule()
    def fenced_epoch(self) -> None:
        """A batch from an epoch older than one the partition has already seen (a zombie producer)."""
        code, _ = self._send(self._batch(self.written_epoch[self.pid] - 1, 0, self._values(1)))
        assert code == E.InvalidProducerEpochError.code, code

    @rule()
    def restart(self) -> None:
        self._run(self._stop())
        self._run(self._start())

    @invariant()
    def partition_holds_exactly_the_acknowledged_batches(self) -> None:
        if self.client is None:
            return
        got: list[bytes] = []
        while True:
            response = self._run(self.client.call(ApiKey.FETCH, 12, fetch_body(TOPIC, len(got))))
            part = response["responses"][0]["partitions"][0]
            if part["error_code"] == E.UnknownTopicOrPartitionError.code and not self.values:
                return
            assert part["error_code"] == 0, part["error_code"]
            batch = values_of(part["records"])
            if not batch:
                break
            got += batch
        assert got == self.values


TestIdempotentProducerInterleavings = IdempotenceMachine.TestCase
TestIdempotentProducerInterleavings.settings = settings(
    max_examples=15,
    stateful_step_count=25,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
