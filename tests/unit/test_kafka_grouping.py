"""Produce requests that arrive together on a connection are answered by one call (KafkaConnection's grouping,
handlers.produce.prepare / answer_prepared): every request gets the answer it would get alone, in order, the
appends keep arrival order around other requests, and a group never strands requests or answers.

The connection is fed bytes directly (`buffer_updated`, as the event loop does after one read), so what arrives
together is exact; a fake transport keeps what the broker writes."""

from __future__ import annotations

import asyncio
import struct
import time

import pytest

from mqk import errors as E
from mqk._fast import load
from mqk.clock import settle
from mqk.config import BrokerConfig, StoreConfig
from mqk.protocol.kafka.api import ApiKey
from mqk.protocol.kafka.codec import decode_response_frame, encode_request
from mqk.server.kafka.rawclient import make_batch
from mqk.server.kafka.server import MAX_IN_FLIGHT, KafkaConnection, KafkaServer
from mqk.store.manager import StoreManager

recbatch = load("recbatch")


class Transport:
    """What a connection writes, and whether it was closed."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def writelines(self, parts) -> None:
        for part in parts:
            self.data += part

    def write(self, data) -> None:
        self.data += data

    def get_extra_info(self, _name):
        return ("127.0.0.1", 1)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:  # (the server's stop aborts what is still open)
        self.closed = True


class Wire:
    """Requests encoded with correlation ids 1, 2, ...; answers decoded in the order they were written."""

    def __init__(self, conn: KafkaConnection, transport: Transport) -> None:
        self.conn, self.transport = conn, transport
        self.sent: list[tuple[int, int, int]] = []  # (correlation id, api key, version) expecting an answer
        self.read = 0  # bytes of the transport's output already decoded
        self.answered = 0  # answers already decoded

    def frame(self, api_key: int, version: int, body: dict, answered: bool = True) -> bytes:
        cid = len(self.sent) + 1 if answered else 10_000 + len(self.sent)
        if answered:
            self.sent.append((cid, api_key, version))
        return b"".join(bytes(p) for p in encode_request(api_key, version, cid, "t", body))

    def feed(self, *frames: bytes) -> None:
        data = b"".join(frames)
        room = self.conn.get_buffer(len(data))
        room[: len(data)] = data
        self.conn.buffer_updated(len(data))

    def answers(self) -> list[tuple[int, dict]]:
        out = []
        data = self.transport.data
        while self.read + 4 <= len(data):
            (size,) = struct.unpack_from(">i", data, self.read)
            frame = bytes(data[self.read + 4 : self.read + 4 + size])
            cid, api_key, version = self.sent[self.answered + len(out)]
            got, body = decode_response_frame(api_key, version, frame)
            assert got == cid, "answers must leave in request order"
            out.append((cid, body))
            self.read += 4 + size
        self.answered += len(out)
        return out


async def start(store_config: StoreConfig | None = None) -> KafkaServer:
    cfg = BrokerConfig(kafka_listen=("127.0.0.1", 0), store=store_config or StoreConfig(storage="memory"))
    store = StoreManager(cfg.store)
    await store.start()
    server = KafkaServer(cfg, store)
    await server.start()
    return server


async def stop(server: KafkaServer) -> None:
    await server.stop()
    await server.store.close()


async def drained(wire: Wire, timeout: float = 10.0) -> None:  # noqa: ASYNC109 - one deadline for the whole drain
    """Return once the connection has answered everything fed to it: wait for the tasks (and futures) it holds for
    its requests, then let it write their answers; again while answering starts more."""
    conn = wire.conn
    while conn.pending or conn._group_tasks:
        waiting = {task for _request, task in conn.pending} | set(conn._group_tasks)
        await asyncio.wait_for(asyncio.wait(waiting), timeout)
        await settle()


def connect(server: KafkaServer) -> Wire:
    conn = KafkaConnection(server)
    transport = Transport()
    conn.connection_made(transport)
    return Wire(conn, transport)


def produce_body(topic: str, partitions: dict[int, bytes], acks: int = -1) -> dict:
    return {
        "transactional_id": None,
        "acks": acks,
        "timeout_ms": 5000,
        "topic_data": [
            {"name": topic, "partition_data": [{"index": i, "records": bytes(b)} for i, b in partitions.items()]}
        ],
    }


def parts_of(body: dict) -> list[tuple]:
    """(topic, partition, error code, base offset) of a Produce answer."""
    return [
        (t["name"], p["index"], p["error_code"], p["base_offset"])
        for t in body["responses"]
        for p in t["partition_responses"]
    ]


def count_calls(obj, name: str) -> list:
    calls: list = []
    original = getattr(obj, name)

    async def counted(*args, **kwargs):
        calls.append(args)
        return await original(*args, **kwargs)

    setattr(obj, name, counted)
    return calls


@pytest.fixture
async def server():
    s = await start()
    yield s
    await stop(s)


async def test_produce_requests_arriving_together_take_one_append_per_topic(server):
    await server.store.create_topic("a", 4)
    await server.store.create_topic("b", 2)
    calls = count_calls(server.store, "append_many")
    wire = connect(server)
    frames = []
    for i in range(12):  # librdkafka's shape: one partition per request, topics and partitions round-robin
        topic, parts = ("a", 4) if i % 2 == 0 else ("b", 2)
        frames.append(wire.frame(ApiKey.PRODUCE, 9, produce_body(topic, {i % parts: make_batch([b"%d" % i] * 3)})))
    wire.feed(*frames)
    assert sorted(args[0] for args in calls) == ["a", "b"]  # one call per topic for all twelve requests
    got = [parts_of(body)[0] for _cid, body in wire.answers()]
    # partition offsets grow by each batch's three records, in arrival order
    assert got == [
        ("a", 0, 0, 0),
        ("b", 1, 0, 0),
        ("a", 2, 0, 0),
        ("b", 1, 0, 3),
        ("a", 0, 0, 3),
        ("b", 1, 0, 6),
        ("a", 2, 0, 3),
        ("b", 1, 0, 9),
        ("a", 0, 0, 6),
        ("b", 1, 0, 12),
        ("a", 2, 0, 6),
        ("b", 1, 0, 15),
    ]
    assert server.store.end_offset("a", 0) == 9 and server.store.end_offset("b", 1) == 18


async def test_more_grouped_requests_than_the_in_flight_limit_are_all_answered(server):
    """A read holding more Produce requests than MAX_IN_FLIGHT: each full group is answered before decoding
    on, so no request is left in the buffer waiting for a read that never comes (librdkafka then times out)."""
    await server.store.create_topic("t", 1)
    wire = connect(server)
    count = 3 * MAX_IN_FLIGHT + 5
    wire.feed(*(wire.frame(ApiKey.PRODUCE, 9, produce_body("t", {0: make_batch([b"x"])})) for _ in range(count)))
    answers = wire.answers()
    assert len(answers) == count
    assert [parts_of(body)[0][3] for _cid, body in answers] == list(range(count))
    assert not wire.conn.pending and wire.conn.codec.buffered == 0


async def test_a_group_appends_after_earlier_requests_and_before_later_ones(server):
    await server.store.create_topic("t", 1)
    wire = connect(server)

    def produce(value: bytes) -> bytes:
        return wire.frame(ApiKey.PRODUCE, 9, produce_body("t", {0: make_batch([value])}))

    fetch = {
        "replica_id": -1,
        "max_wait_ms": 0,
        "min_bytes": 0,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "forgotten_topics_data": [],
        "rack_id": "",
        "topics": [
            {
                "topic": "t",
                "partitions": [
                    {
                        "partition": 0,
                        "current_leader_epoch": -1,
                        "fetch_offset": 0,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 20,
                    }
                ],
            }
        ],
    }
    list_offsets = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [{"name": "t", "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}]}],
    }
    wire.feed(
        produce(b"1"),
        produce(b"2"),
        wire.frame(ApiKey.LIST_OFFSETS, 7, list_offsets),
        produce(b"3"),
        wire.frame(ApiKey.FETCH, 12, fetch),
        produce(b"4"),
    )
    answers = [body for _cid, body in wire.answers()]
    assert len(answers) == 6
    assert answers[2]["topics"][0]["partitions"][0]["offset"] == 2  # the two before it, not the two after
    assert answers[4]["responses"][0]["partitions"][0]["high_watermark"] == 3
    assert [parts_of(answers[i])[0][3] for i in (0, 1, 3, 5)] == [0, 1, 2, 3]


async def answer_alone_and_together(bodies: list[dict], setup, store_config) -> tuple[list, list]:
    """The answers to the same Produce requests sent one per read, and all in one read, each to a fresh broker;
    and what each broker stored."""
    results = []
    for together in (False, True):
        server = await start(store_config(together))
        try:
            await setup(server)
            wire = connect(server)
            frames = [wire.frame(ApiKey.PRODUCE, 9, body, answered=body["acks"] != 0) for body in bodies]
            if together:
                wire.feed(*frames)
            else:
                for frame in frames:
                    wire.feed(frame)
            expected = sum(1 for body in bodies if body["acks"] != 0)
            await drained(wire)  # idempotent appends, topic creation and sync flushes take loop turns and threads
            assert _count_frames(wire.transport.data) == expected
            answers = []
            for _cid, body in wire.answers():
                for topic in body["responses"]:
                    for part in topic["partition_responses"]:
                        part.pop("log_append_time_ms")
                answers.append(body)
            stored = {
                (t, q): server.store.end_offset(t, q)
                for t in sorted(server.store.topics())
                for q in range(server.store.topic(t).queue_count)
            }
            results.append((answers, stored, wire.transport.closed))
        finally:
            await stop(server)
    return results[0], results[1]


def _count_frames(data: bytearray) -> int:
    count = pos = 0
    while pos + 4 <= len(data):
        pos += 4 + struct.unpack_from(">i", data, pos)[0]
        count += 1
    return count


@pytest.mark.parametrize("flush", ["memory", "sync"])
async def test_every_request_of_a_group_gets_the_answer_it_gets_alone(flush, tmp_path):
    """Refused partitions (bad index, bad CRC, compacted topic without keys), a topic to auto-create (that
    request is answered alone, between the groups), idempotent batches with a duplicate and a gap across requests,
    compressed and multi-batch partitions, acks=0 in the middle: the same answers and the same stored offsets."""
    from mqk.config import TopicConfig
    from mqk.protocol.kafka import records

    pids = []

    async def setup(server):
        await server.store.create_topic("t", 3)
        await server.store.create_topic("c", 1, TopicConfig({"cleanup.policy": "compact"}))
        error, pid, epoch = await server.producers.init_producer_id()
        assert (error, epoch) == (0, 0)
        pids.append(pid)

    # the producer id the idempotent batches carry: a fresh broker allocates the same first id every time
    probe = await start()
    await setup(probe)
    await stop(probe)
    pid = pids[0]

    corrupt = make_batch([b"bad"])
    corrupt[-1] ^= 0xFF
    now = int(time.time() * 1000)
    zipped = records.compress(
        records.GZIP, b"".join(recbatch.encode_record(i, i, None, v, []) for i, v in enumerate([b"z1", b"z2"]))
    )
    compressed = recbatch.build_batch(0, now, now + 1, zipped, 2, 1, records.GZIP)

    def seq(n: int, value: bytes) -> bytes:
        return make_batch([value], producer_id=pid, producer_epoch=0, base_sequence=n)

    bodies = [
        produce_body("t", {0: make_batch([b"a"]), 1: make_batch([b"b", b"c"])}),
        produce_body("t", {7: make_batch([b"no such partition"])}),
        produce_body("t", {2: corrupt}),
        produce_body("c", {0: make_batch([b"v"], keys=[None])}),
        produce_body("t", {0: seq(0, b"s0")}),
        produce_body("t", {0: seq(1, b"s1"), 1: make_batch([b"d"])}),
        produce_body("t", {0: seq(1, b"s1")}),  # a retry of a stored batch: its original offset
        produce_body("t", {0: seq(5, b"gap")}),
        produce_body("t", {2: bytes(make_batch([b"m1"])) + bytes(make_batch([b"m2", b"m3"]))}),
        produce_body("t", {1: make_batch([b"quiet"])}, acks=0),
        produce_body("new-topic", {0: make_batch([b"n"])}),
        produce_body("t", {2: compressed}, acks=1),
        {"transactional_id": "tx", "acks": -1, "timeout_ms": 5000, "topic_data": []},
        produce_body("t", {0: make_batch([b"e"])}, acks=5),
    ]

    def store_config(together: bool) -> StoreConfig:
        if flush == "memory":
            return StoreConfig(storage="memory")
        # under sync flush the idempotent partitions of a group are appended concurrently (one flush for all)
        return StoreConfig(storage="file", data_dir=tmp_path / f"together-{together}", flush_mode="sync")

    alone, together = await answer_alone_and_together(bodies, setup, store_config)
    assert pids == [pid, pid, pid]
    assert together == alone
    answers = alone[0]
    codes = [[p["error_code"] for t in a["responses"] for p in t["partition_responses"]] for a in answers]
    assert codes[1] == [E.UnknownTopicOrPartitionError.code]
    assert codes[2] == [E.CorruptMessageError.code]
    assert codes[3] == [E.InvalidRecordError.code]
    assert codes[6] == [0] and codes[7] == [E.OutOfOrderSequenceNumberError.code]
    assert parts_of(answers[6])[0][3] == parts_of(answers[5])[0][3]  # the duplicate: the original offset
    assert alone[1][("new-topic", 0)] == 1 and alone[1][("t", 1)] == 4


async def test_a_failing_group_closes_the_connection_after_the_answers_before_it(server):
    await server.store.create_topic("t", 1)
    prepare, _answer = server.grouped[ApiKey.PRODUCE]

    async def failing(_server, _plans, suspend: bool):
        if suspend:
            await settle(0)  # one turn of the loop: the answer is not ready at once
        raise RuntimeError("a bug in the group's answer")

    for suspend in (False, True):
        server.grouped = {ApiKey.PRODUCE: (prepare, lambda s, p, suspend=suspend: failing(s, p, suspend))}
        wire = connect(server)
        wire.feed(
            wire.frame(ApiKey.API_VERSIONS, 0, {}),
            *(wire.frame(ApiKey.PRODUCE, 9, produce_body("t", {0: make_batch([b"x"])})) for _ in range(3)),
        )
        await settle()
        answers = wire.answers()
        assert [cid for cid, _body in answers] == [1]  # ApiVersions, then nothing
        assert wire.transport.closed and wire.conn.closed and not wire.conn._group_tasks


async def test_a_suspended_group_is_cancelled_with_its_connection(server):
    await server.store.create_topic("t", 1)
    prepare, _answer = server.grouped[ApiKey.PRODUCE]
    never = asyncio.get_running_loop().create_future()

    async def waiting(_server, plans):
        await never
        return [None] * len(plans)

    server.grouped = {ApiKey.PRODUCE: (prepare, waiting)}
    wire = connect(server)
    wire.feed(*(wire.frame(ApiKey.PRODUCE, 9, produce_body("t", {0: make_batch([b"x"])})) for _ in range(2)))
    await settle()
    (task,) = wire.conn._group_tasks
    assert len(wire.conn.pending) == 2
    wire.conn.connection_lost(None)
    await settle()  # the cancellation, then the task's done callback
    assert task.cancelled() and not wire.conn._group_tasks and not wire.conn.pending


async def test_a_group_under_sync_flush_waits_for_one_flush(tmp_path):
    server = await start(StoreConfig(storage="file", data_dir=tmp_path, flush_mode="sync"))
    try:
        await server.store.create_topic("t", 8)
        calls = count_calls(server.store, "append_many")
        wire = connect(server)
        wire.feed(
            *(wire.frame(ApiKey.PRODUCE, 9, produce_body("t", {i % 8: make_batch([b"x" * 100])})) for i in range(40))
        )
        assert wire.answers() == []  # nothing is acknowledged before its flush
        assert len(calls) == 1 and len(wire.conn._group_tasks) == 1
        await drained(wire)
        answers = wire.answers()
        assert len(answers) == 40 and all(parts_of(body)[0][2] == 0 for _cid, body in answers)
        assert [parts_of(body)[0][3] for _cid, body in answers] == [i // 8 for i in range(40)]
    finally:
        await stop(server)
