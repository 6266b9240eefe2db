"""The Kafka server over real sockets with mqk's raw client: bad input, ordering, long poll, produce/fetch
semantics, idempotence, admin. Every bad-input test also proves that another connection and the stored data
are unaffected."""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from pathlib import Path

import pytest
from helpers import fetch_body, produce_body, raw_records, values_of, wait_until_async

from mqk import errors as E
from mqk._fast import load
from mqk.config import BrokerConfig, StoreConfig
from mqk.protocol.kafka.api import ApiKey
from mqk.protocol.kafka.codec import decode_response_frame, encode_request
from mqk.server.kafka.rawclient import RawKafkaClient, make_batch
from mqk.server.kafka.server import KafkaServer
from mqk.store.manager import StoreManager

recbatch = load("recbatch")


def config(**kw) -> BrokerConfig:
    store = kw.pop("store", StoreConfig(storage="memory"))
    return BrokerConfig(kafka_listen=("127.0.0.1", 0), store=store, group_min_session_timeout_ms=10, **kw)


@pytest.fixture
async def broker():
    cfg = config()
    store = StoreManager(cfg.store)
    await store.start()
    server = KafkaServer(cfg, store)
    await server.start()
    yield server
    await server.stop()
    await store.close()


@pytest.fixture
async def client(broker):
    c = await RawKafkaClient.connect(broker.host, broker.port)
    yield c
    await c.close()


async def produce(client, topic, batch, **kw) -> dict:
    resp = await client.call(ApiKey.PRODUCE, 9, produce_body(topic, batch, **kw))
    return resp["responses"][0]["partition_responses"][0]


async def fetch(client, topic, offset, version=12, **kw) -> dict:
    resp = await client.call(ApiKey.FETCH, version, fetch_body(topic, offset, **kw))
    return resp["responses"][0]["partitions"][0]


async def assert_healthy(broker, topic="keep", expect=(b"a", b"b")) -> None:
    """A fresh connection still works and the stored records are intact."""
    async with await RawKafkaClient.connect(broker.host, broker.port) as other:
        versions = await other.call(
            ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}
        )
        assert versions["error_code"] == 0
        part = await fetch(other, topic, 0)
        assert part["error_code"] == 0 and values_of(part["records"]) == list(expect)


async def seed(client, topic="keep"):
    part = await produce(client, topic, make_batch([b"a", b"b"]))
    assert part["error_code"] == 0


# --- ApiVersions and bad input ------------------------------------------------------------------------


async def test_api_versions_lists_every_handled_api(client, broker):
    resp = await client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
    keys = {k["api_key"]: (k["min_version"], k["max_version"]) for k in resp["api_keys"]}
    assert resp["error_code"] == 0
    assert set(keys) == set(broker.handlers)
    assert keys[ApiKey.PRODUCE][1] >= 9 and keys[ApiKey.FETCH][1] >= 12


async def test_api_versions_too_high_gets_v0_unsupported_with_list(client):
    await seed(client)
    # version 99: the answer uses the v0 schema, so the raw client decodes it with v0
    raw = struct.pack(">hhih", ApiKey.API_VERSIONS, 99, 7, 1) + b"x" + b"\x00" + b"\x02t\x021\x00"
    client.write_raw(struct.pack(">i", len(raw)) + raw)
    head = await client.reader.readexactly(4)
    frame = await client.reader.readexactly(struct.unpack(">i", head)[0])

    cid, body = decode_response_frame(ApiKey.API_VERSIONS, 0, frame)
    assert cid == 7 and body["error_code"] == E.UnsupportedVersionError.code
    assert any(k["api_key"] == ApiKey.FETCH for k in body["api_keys"])
    # the connection stays usable
    assert (await client.call(ApiKey.API_VERSIONS, 0, {}))["error_code"] == 0


@pytest.mark.parametrize("prefix", [struct.pack(">i", 200 * 1024 * 1024), struct.pack(">i", -5)])
async def test_oversized_or_negative_frame_closes_only_that_connection(broker, client, prefix):
    await seed(client)
    async with await RawKafkaClient.connect(broker.host, broker.port) as bad:
        bad.write_raw(prefix + b"\x00" * 16)
        assert await bad.closed_by_peer()
    await assert_healthy(broker)


async def test_big_trickled_and_abandoned_frames(broker, client):
    # a 900 KB request (bigger than a shared read buffer: read into a buffer of its own), one trickled in 7-byte
    # writes, and a peer that announces 90 MiB and leaves: each request is whole, the broker stays up
    values = [bytes([i % 251]) * 1000 for i in range(900)]
    assert (await produce(client, "frames", make_batch(values)))["error_code"] == 0
    async with await RawKafkaClient.connect(broker.host, broker.port) as slow:
        raw = b"".join(
            bytes(p)
            for p in encode_request(ApiKey.PRODUCE, 9, 1, "slow", produce_body("frames", make_batch([b"trickled"])))
        )
        for at in range(0, len(raw), 7):
            slow.write_raw(raw[at : at + 7])
            await slow.writer.drain()
            # a real pause between the pieces, so they reach the broker as separate reads: no event on this side
            # can make the kernel deliver them apart
            await asyncio.sleep(0.001)
        head = await asyncio.wait_for(slow.reader.readexactly(4), 10)
        cid, answer = decode_response_frame(
            ApiKey.PRODUCE, 9, await slow.reader.readexactly(struct.unpack(">i", head)[0])
        )
        assert cid == 1 and answer["responses"][0]["partition_responses"][0]["error_code"] == 0
    async with await RawKafkaClient.connect(broker.host, broker.port) as leaving:
        leaving.write_raw(struct.pack(">i", 90 * 1024 * 1024) + b"\x00" * 1000)
        await leaving.writer.drain()
    async with await RawKafkaClient.connect(broker.host, broker.port) as other:
        got: list[bytes] = []
        while len(got) < len(values) + 1:
            part = await fetch(other, "frames", len(got), max_bytes=8 << 20)
            assert part["error_code"] == 0 and part["records"]
            got += values_of(part["records"])
    assert got == [*values, b"trickled"]


async def test_unknown_api_key_and_garbage_close_the_connection(broker, client):
    await seed(client)
    async with await RawKafkaClient.connect(broker.host, broker.port) as bad:
        body = struct.pack(">hhih", 9999, 0, 1, 1) + b"x"
        bad.write_raw(struct.pack(">i", len(body)) + body)
        assert await bad.closed_by_peer()
    async with await RawKafkaClient.connect(broker.host, broker.port) as bad:
        junk = bytes(range(256)) * 3
        bad.write_raw(struct.pack(">i", len(junk)) + junk)
        assert await bad.closed_by_peer()
    async with await RawKafkaClient.connect(broker.host, broker.port) as bad:
        # a known API whose body is truncated: Metadata v9 with a topic array claiming 1000 entries
        head = struct.pack(">hhih", ApiKey.METADATA, 9, 1, 1) + b"x" + b"\x00"
        body = head + b"\xe9\x07"
        bad.write_raw(struct.pack(">i", len(body)) + body)
        assert await bad.closed_by_peer()
    await assert_healthy(broker)


async def test_unsupported_version_of_other_api_closes(broker, client):
    await seed(client)
    async with await RawKafkaClient.connect(broker.host, broker.port) as bad:
        body = struct.pack(">hhih", ApiKey.METADATA, 99, 1, 1) + b"x"
        bad.write_raw(struct.pack(">i", len(body)) + body)
        assert await bad.closed_by_peer()
    await assert_healthy(broker)


async def test_produce_is_listed_from_v0_but_v0_to_v2_requests_are_refused(broker, client, caplog):
    # KAFKA-18659: librdkafka <= 2.11 compresses with gzip, snappy or lz4 only when Produce v0 is listed
    resp = await client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
    keys = {k["api_key"]: (k["min_version"], k["max_version"]) for k in resp["api_keys"]}
    assert keys[ApiKey.PRODUCE][0] == 0
    assert keys[ApiKey.FETCH][0] == 4  # only Produce is listed below what is accepted
    await seed(client)
    for version in (0, 2):
        async with await RawKafkaClient.connect(broker.host, broker.port) as old:
            # a magic 1 era Produce header (acks, timeout, then an empty topic array): refused, not decoded
            body = struct.pack(">hhih", ApiKey.PRODUCE, version, 1, 3) + b"old" + struct.pack(">hii", 1, 1000, 0)
            old.write_raw(struct.pack(">i", len(body)) + body)
            assert await old.closed_by_peer()
    assert "api key 0 version 2 is not supported" in caplog.text
    await assert_healthy(broker)


# --- produce ---------------------------------------------------------------------------------------------


async def test_produce_then_fetch_round_trip_and_offsets(client):
    first = await produce(client, "t", make_batch([b"1", b"2", b"3"], keys=[b"k", None, b"k"]))
    second = await produce(client, "t", make_batch([b"4"]))
    assert (first["error_code"], first["base_offset"]) == (0, 0)
    assert (second["error_code"], second["base_offset"]) == (0, 3)
    assert first["log_append_time_ms"] == -1
    part = await fetch(client, "t", 0)
    assert part["high_watermark"] == 4 and part["last_stable_offset"] == 4 and part["log_start_offset"] == 0
    assert values_of(part["records"]) == [b"1", b"2", b"3", b"4"]
    # an offset inside a batch returns the whole batch
    assert values_of((await fetch(client, "t", 1))["records"]) == [b"1", b"2", b"3", b"4"]
    assert values_of((await fetch(client, "t", 3))["records"]) == [b"4"]
    at_end = await fetch(client, "t", 4)
    assert at_end["error_code"] == 0 and raw_records(at_end["records"]) == b""
    assert (await fetch(client, "t", 5))["error_code"] == E.OffsetOutOfRangeError.code


async def test_corrupt_crc_is_refused_and_stored_data_untouched(client, broker):
    await seed(client)
    batch = make_batch([b"x"])
    batch[-1] ^= 0xFF
    part = await produce(client, "keep", batch)
    assert part["error_code"] == E.CorruptMessageError.code
    truncated = make_batch([b"y"])[:-3]
    assert (await produce(client, "keep", truncated))["error_code"] == E.CorruptMessageError.code
    # a right CRC over records that do not parse (a header with a null key): refused as Kafka refuses it
    body = b"\x00\x02\x02\x02k\x02v\x02\x01"
    good = recbatch.encode_record(0, 0, b"k", b"v", [])
    unparsable = recbatch.build_batch(0, 0, 0, good + bytes([2 * len(body)]) + body, 2, 1, 0)
    part = await produce(client, "keep", unparsable)
    assert part["error_code"] == E.CorruptMessageError.code and "header key length" in part["error_message"]
    await assert_healthy(broker)


async def test_message_too_large_unknown_partition_and_bad_acks(client, broker):
    await broker.store.create_topic("small", 2)
    from mqk.config import TopicConfig

    await broker.store.alter_topic_config("small", TopicConfig({"max.message.bytes": "200"}))
    assert (await produce(client, "small", make_batch([b"x" * 500])))["error_code"] == E.MessageTooLargeError.code
    assert (await produce(client, "small", make_batch([b"x"]), partition=7))["error_code"] == (
        E.UnknownTopicOrPartitionError.code
    )
    assert (await produce(client, "small", make_batch([b"x"]), acks=5))["error_code"] == (
        E.InvalidRequiredAcksError.code
    )
    assert broker.store.end_offset("small", 0) == 0


async def test_auto_create_off_gives_unknown_topic():
    cfg = config(auto_create_topics=False)
    store = StoreManager(cfg.store)
    await store.start()
    server = KafkaServer(cfg, store)
    await server.start()
    try:
        async with await RawKafkaClient.connect(server.host, server.port) as c:
            part = await produce(c, "nope", make_batch([b"x"]))
            assert part["error_code"] == E.UnknownTopicOrPartitionError.code
            md = await c.call(
                ApiKey.METADATA,
                9,
                {
                    "topics": [{"name": "nope"}],
                    "allow_auto_topic_creation": True,
                    "include_topic_authorized_operations": False,
                },
            )
            assert md["topics"][0]["error_code"] == E.UnknownTopicOrPartitionError.code
            assert store.topic("nope") is None
    finally:
        await server.stop()
        await store.close()


async def test_acks_zero_has_no_response_but_is_stored(client, broker):
    client.send(ApiKey.PRODUCE, 9, produce_body("z", make_batch([b"q"]), acks=0), expect_response=False)
    md = await client.call(
        ApiKey.METADATA,
        9,
        {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False},
    )
    assert "z" in {t["name"] for t in md["topics"]}
    assert broker.store.end_offset("z", 0) == 1


async def test_log_append_time_topic(client, broker):
    from mqk.config import TopicConfig

    await broker.store.create_topic("lat", 1, TopicConfig({"message.timestamp.type": "LogAppendTime"}))
    before = int(time.time() * 1000)
    part = await produce(client, "lat", make_batch([b"x"], timestamp=1000))
    assert part["error_code"] == 0 and part["log_append_time_ms"] >= before
    data = raw_records((await fetch(client, "lat", 0))["records"])
    h = recbatch.parse_header(data, 0)
    assert h[5] & 0x08 and h[8] == part["log_append_time_ms"]


async def test_create_times_outside_the_topic_window_are_invalid_timestamp(client, broker):
    """Kafka 4's defaults: a record more than message.timestamp.after.max.ms (one hour) ahead of the broker's clock
    is refused; message.timestamp.before.max.ms is unbounded; a LogAppendTime topic checks nothing."""
    from mqk.config import TopicConfig

    await broker.store.create_topic("ts", 1)
    now = int(time.time() * 1000)
    ahead = await produce(client, "ts", make_batch([b"later"], timestamp=now + 2 * 3600_000))
    assert ahead["error_code"] == E.InvalidTimestampError.code and "out of range" in ahead["error_message"]
    assert (await produce(client, "ts", make_batch([b"soon"], timestamp=now + 60_000)))["error_code"] == 0
    assert (await produce(client, "ts", make_batch([b"1970"], timestamp=1000)))["error_code"] == 0
    assert broker.store.end_offset("ts", 0) == 2
    await broker.store.alter_topic_config(
        "ts", TopicConfig({"message.timestamp.before.max.ms": "60000", "message.timestamp.after.max.ms": "86400000"})
    )
    assert (await produce(client, "ts", make_batch([b"1970"], timestamp=1000)))["error_code"] == (
        E.InvalidTimestampError.code
    )
    assert (await produce(client, "ts", make_batch([b"later"], timestamp=now + 2 * 3600_000)))["error_code"] == 0
    await broker.store.create_topic("ts-lat", 1, TopicConfig({"message.timestamp.type": "LogAppendTime"}))
    assert (await produce(client, "ts-lat", make_batch([b"x"], timestamp=now + 10 * 3600_000)))["error_code"] == 0


# --- pipelining and long poll ----------------------------------------------------------------------------


async def test_pipelined_responses_keep_request_order_behind_a_long_poll(broker, client):
    await seed(client)
    client.send(ApiKey.FETCH, 12, fetch_body("keep", 2, max_wait_ms=300, min_bytes=1))
    client.send(
        ApiKey.METADATA,
        9,
        {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False},
    )
    client.send(ApiKey.API_VERSIONS, 0, {})
    started = time.monotonic()
    cid1, fetched = await client.receive()
    cid2, md = await client.receive()
    cid3, av = await client.receive()
    assert cid1 < cid2 < cid3
    assert time.monotonic() - started >= 0.25  # the fetch waited its max_wait_ms with nothing to return
    assert values_of(fetched["responses"][0]["partitions"][0]["records"]) == []
    assert md["topics"] and av["error_code"] == 0


async def test_long_poll_wakes_on_new_data(broker, client):
    await seed(client)
    async with await RawKafkaClient.connect(broker.host, broker.port) as producer:
        # waits up to a minute: an answer within receive's 10 s can only come from the wake-up
        client.send(ApiKey.FETCH, 12, fetch_body("keep", 2, max_wait_ms=60_000, min_bytes=1))
        await client.writer.drain()
        await wait_until_async(lambda: broker.broker.hub.waiting_on("keep", 0), what="the fetch to be parked")
        await produce(producer, "keep", make_batch([b"late"]))
        _, resp = await client.receive(timeout=10)
        assert values_of(resp["responses"][0]["partitions"][0]["records"]) == [b"late"]


@pytest.mark.parametrize("max_bytes", [1 << 20, 1])
async def test_a_long_poll_over_many_partitions_answers_every_partition_as_it_is_after_the_wake_up(
    broker, client, max_bytes
):
    # a consumer of many partitions waits on all of them and is woken by one; the answer after the wake-up must
    # still give every partition its offsets as they are then, and the records of every partition that grew (with
    # max_bytes 1, only the first one's, as KIP-74 lets the first partition with data exceed the limit; the other
    # is answered with offsets only, its new ones)
    await broker.store.create_topic("wide", 20)
    for p in range(20):
        for _ in range(p % 3):
            await broker.store.append("wide", p, [make_batch([b"seed-%d" % p])])
    ends = [p % 3 for p in range(20)]
    body = fetch_body("wide", 0, max_wait_ms=5000, min_bytes=1, max_bytes=max_bytes)
    template = body["topics"][0]["partitions"][0]
    body["topics"][0]["partitions"] = [{**template, "partition": p, "fetch_offset": ends[p]} for p in range(20)]
    async with await RawKafkaClient.connect(broker.host, broker.port) as producer:
        client.send(ApiKey.FETCH, 12, body)
        await client.writer.drain()
        await wait_until_async(lambda: broker.broker.hub.waiting_on("wide", 0), what="the fetch to be parked")
        assert await broker.store.delete_before("wide", 5, ends[5]) == ends[5]  # moves a log start, wakes nobody
        grown = {3: [b"three"], 7: [b"seven", b"seven-2"]}
        both = {
            "transactional_id": None,
            "acks": -1,
            "timeout_ms": 5000,
            "topic_data": [
                {
                    "name": "wide",
                    "partition_data": [{"index": p, "records": bytes(make_batch(v))} for p, v in grown.items()],
                }
            ],
        }
        answer = await producer.call(ApiKey.PRODUCE, 9, both)  # one request: one append, one wake-up for both
        assert [x["error_code"] for x in answer["responses"][0]["partition_responses"]] == [0, 0]
        _, resp = await client.receive()
    parts = {x["partition_index"]: x for x in resp["responses"][0]["partitions"]}
    assert sorted(parts) == list(range(20))
    for p, part in parts.items():
        expected_end = ends[p] + len(grown.get(p, ()))
        assert (part["error_code"], part["high_watermark"], part["last_stable_offset"]) == (
            0,
            expected_end,
            expected_end,
        )
        assert part["log_start_offset"] == (ends[5] if p == 5 else 0)
        assert values_of(part["records"]) == (grown.get(p, []) if p == 3 or max_bytes > 1 else [])


async def test_fetch_by_topic_id_v13(client, broker):
    await seed(client)
    import uuid

    topic_id = uuid.UUID(bytes=bytes(broker.store.topic("keep").topic_id))
    body = fetch_body("keep", 0)
    body["topics"][0]["topic_id"] = topic_id
    resp = await client.call(ApiKey.FETCH, 13, body)
    part = resp["responses"][0]["partitions"][0]
    assert resp["responses"][0]["topic_id"] == topic_id and values_of(part["records"]) == [b"a", b"b"]
    body["topics"][0]["topic_id"] = uuid.uuid4()
    resp = await client.call(ApiKey.FETCH, 13, body)
    assert resp["responses"][0]["partitions"][0]["error_code"] == E.UnknownTopicIdError.code


async def test_metadata_by_topic_id_from_v12_only(client, broker):
    await seed(client)
    topic_id = uuid.UUID(bytes=bytes(broker.store.topic("keep").topic_id))
    body = {
        "topics": [{"topic_id": topic_id, "name": None}],
        "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False,
    }
    found = (await client.call(ApiKey.METADATA, 12, body))["topics"]
    assert [(t["error_code"], t["name"], len(t["partitions"])) for t in found] == [(0, "keep", 1)]
    # v10-11 have the field but an answer there cannot carry a null name: refused, the connection stays up
    refused = (await client.call(ApiKey.METADATA, 11, body))["topics"]
    assert [(t["error_code"], t["name"]) for t in refused] == [(E.InvalidRequestError.code, "")]
    await assert_healthy(broker)


async def test_fetch_with_unknown_session_is_refused_so_client_falls_back(client):
    body = fetch_body("keep", 0)
    body["session_id"], body["session_epoch"] = 1234, 1
    resp = await client.call(ApiKey.FETCH, 12, body)
    assert resp["error_code"] == E.FetchSessionIdNotFoundError.code and resp["session_id"] == 0


# --- list offsets, delete records ------------------------------------------------------------------------


async def test_list_offsets_special_and_by_time_and_delete_records(client):
    await produce(client, "lo", make_batch([b"a", b"b"], timestamp=1000))
    await produce(client, "lo", make_batch([b"c"], timestamp=5000))

    async def lookup(ts):
        resp = await client.call(
            ApiKey.LIST_OFFSETS,
            7,
            {
                "replica_id": -1,
                "isolation_level": 0,
                "topics": [
                    {"name": "lo", "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": ts}]}
                ],
            },
        )
        p = resp["topics"][0]["partitions"][0]
        assert p["error_code"] == 0
        return p["offset"], p["timestamp"]

    assert (await lookup(-2))[0] == 0
    assert (await lookup(-1))[0] == 3
    assert await lookup(1001) == (1, 1001)
    assert await lookup(2000) == (2, 5000)
    assert await lookup(9999) == (-1, -1)
    assert await lookup(-3) == (2, 5000)
    resp = await client.call(
        ApiKey.DELETE_RECORDS,
        1,
        {
            "timeout_ms": 1000,
            "topics": [
                {"name": "lo", "partitions": [{"partition_index": 0, "offset": 2}, {"partition_index": 4, "offset": 0}]}
            ],
        },
    )
    parts = resp["topics"][0]["partitions"]
    assert parts[0]["error_code"] == 0 and parts[0]["low_watermark"] == 2
    assert parts[1]["error_code"] == E.UnknownTopicOrPartitionError.code
    assert (await lookup(-2))[0] == 2
    assert (await fetch(client, "lo", 0))["error_code"] == E.OffsetOutOfRangeError.code


# --- idempotent producer ---------------------------------------------------------------------------------


async def test_idempotent_producer_duplicates_and_gaps(client, broker):
    init = await client.call(
        ApiKey.INIT_PRODUCER_ID,
        4,
        {"transactional_id": None, "transaction_timeout_ms": 60000, "producer_id": -1, "producer_epoch": -1},
    )
    assert init["error_code"] == 0 and init["producer_id"] >= 0
    pid, epoch = init["producer_id"], init["producer_epoch"]

    def batch(seq, *values):
        return make_batch(list(values), producer_id=pid, producer_epoch=epoch, base_sequence=seq)

    assert (await produce(client, "idem", batch(0, b"a", b"b")))["base_offset"] == 0
    assert (await produce(client, "idem", batch(2, b"c")))["base_offset"] == 2
    dup = await produce(client, "idem", batch(0, b"a", b"b"))  # a retry of the first batch
    assert dup["error_code"] == 0 and dup["base_offset"] == 0
    gap = await produce(client, "idem", batch(7, b"z"))
    assert gap["error_code"] == E.OutOfOrderSequenceNumberError.code
    assert (await produce(client, "idem", batch(3, b"d")))["base_offset"] == 3
    assert values_of((await fetch(client, "idem", 0))["records"]) == [b"a", b"b", b"c", b"d"]
    # a second producer id from the allocator is different
    init2 = await client.call(
        ApiKey.INIT_PRODUCER_ID,
        4,
        {"transactional_id": None, "transaction_timeout_ms": 1, "producer_id": -1, "producer_epoch": -1},
    )
    assert init2["producer_id"] != pid
    txn = await client.call(
        ApiKey.INIT_PRODUCER_ID,
        4,
        {"transactional_id": "tx", "transaction_timeout_ms": 1, "producer_id": -1, "producer_epoch": -1},
    )
    # a transactional id gets its own producer id (the transaction coordinator's; tests/integration/test_transactions)
    assert txn["error_code"] == 0 and txn["producer_id"] not in (pid, init2["producer_id"])


def file_broker_session(tmp_path):
    """`await run(fn)`: start a file-store broker on `tmp_path`, call fn(client) on one connection, stop the broker
    (store closed cleanly); each call is one broker lifetime over the same data."""
    cfg = config(
        store=StoreConfig(
            storage="file", data_dir=Path(tmp_path), commitlog_segment_bytes=1 << 20, cq_units_per_file=1024
        )
    )

    async def run(fn):
        store = StoreManager(cfg.store)
        await store.start()
        server = KafkaServer(cfg, store)
        await server.start()
        try:
            async with await RawKafkaClient.connect(server.host, server.port) as c:
                return await fn(c)
        finally:
            await server.stop()
            await store.close()

    return run


async def test_pipelined_produces_into_a_topic_being_auto_created_all_land(tmp_path):
    # the file store makes a topic's files in awaits: the topic is published only once they exist, so the
    # requests behind the creating one wait for it instead of finding a topic without partitions
    async def pipelined(c):
        for i in range(4):
            c.send(ApiKey.PRODUCE, 9, produce_body("born", make_batch([b"r%d" % i])))
        await c.writer.drain()
        answers = [(await c.receive())[1]["responses"][0]["partition_responses"][0] for _ in range(4)]
        assert [(a["error_code"], a["base_offset"]) for a in answers] == [(0, 0), (0, 1), (0, 2), (0, 3)]
        return values_of((await fetch(c, "born", 0))["records"])

    assert await file_broker_session(tmp_path)(pipelined) == [b"r0", b"r1", b"r2", b"r3"]


async def test_idempotence_and_producer_ids_survive_restart(tmp_path):
    run = file_broker_session(tmp_path)

    async def first(c):
        init = await c.call(
            ApiKey.INIT_PRODUCER_ID,
            4,
            {"transactional_id": None, "transaction_timeout_ms": 1, "producer_id": -1, "producer_epoch": -1},
        )
        pid = init["producer_id"]
        b = make_batch([b"a"], producer_id=pid, producer_epoch=0, base_sequence=0)
        assert (await produce(c, "idem", b))["base_offset"] == 0
        return pid

    pid = await run(first)

    async def second(c):
        retry = make_batch([b"a"], producer_id=pid, producer_epoch=0, base_sequence=0)
        dup = await produce(c, "idem", retry)
        assert dup["error_code"] == 0 and dup["base_offset"] == 0
        gap = make_batch([b"x"], producer_id=pid, producer_epoch=0, base_sequence=5)
        assert (await produce(c, "idem", gap))["error_code"] == E.OutOfOrderSequenceNumberError.code
        nxt = make_batch([b"b"], producer_id=pid, producer_epoch=0, base_sequence=1)
        assert (await produce(c, "idem", nxt))["base_offset"] == 1
        init = await c.call(
            ApiKey.INIT_PRODUCER_ID,
            4,
            {"transactional_id": None, "transaction_timeout_ms": 1, "producer_id": -1, "producer_epoch": -1},
        )
        assert init["producer_id"] > pid  # ids are never reused across restarts
        return values_of((await fetch(c, "idem", 0))["records"])

    assert await run(second) == [b"a", b"b"]


# --- admin and groups over the wire ----------------------------------------------------------------------


async def test_create_describe_alter_delete_topic(client, broker):
    resp = await client.call(
        ApiKey.CREATE_TOPICS,
        5,
        {
            "timeout_ms": 1000,
            "validate_only": False,
            "topics": [
                {
                    "name": "adm",
                    "num_partitions": 3,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [{"name": "retention.ms", "value": "1000"}],
                },
                {"name": "bad", "num_partitions": 1, "replication_factor": 3, "assignments": [], "configs": []},
                {
                    "name": "badcfg",
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [{"name": "no.such", "value": "1"}],
                },
                {"name": "dry", "num_partitions": 2, "replication_factor": -1, "assignments": [], "configs": []},
            ],
        },
    )
    # (validate_only applies to the whole request, so "dry" is created here too)
    codes = [t["error_code"] for t in resp["topics"]]
    assert codes == [0, E.InvalidReplicationFactorError.code, E.InvalidConfigError.code, 0]
    assert resp["topics"][0]["num_partitions"] == 3
    assert broker.store.topic("adm").queue_count == 3
    again = await client.call(
        ApiKey.CREATE_TOPICS,
        5,
        {
            "timeout_ms": 1000,
            "validate_only": True,
            "topics": [
                {"name": "adm", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []},
                {
                    "name": "only-validated",
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [],
                },
            ],
        },
    )
    assert [t["error_code"] for t in again["topics"]] == [E.TopicAlreadyExistsError.code, 0]
    assert broker.store.topic("only-validated") is None

    def describe():
        return client.call(
            ApiKey.DESCRIBE_CONFIGS,
            4,
            {
                "include_synonyms": True,
                "include_documentation": False,
                "resources": [{"resource_type": 2, "resource_name": "adm", "configuration_keys": None}],
            },
        )

    configs = {c["name"]: c for c in (await describe())["results"][0]["configs"]}
    assert configs["retention.ms"]["value"] == "1000" and configs["retention.ms"]["config_source"] == 1
    assert configs["cleanup.policy"]["value"] == "delete" and configs["cleanup.policy"]["config_source"] == 5
    assert configs["max.message.bytes"]["value"] == "1048588"
    inc = await client.call(
        ApiKey.INCREMENTAL_ALTER_CONFIGS,
        1,
        {
            "validate_only": False,
            "resources": [
                {
                    "resource_type": 2,
                    "resource_name": "adm",
                    "configs": [
                        {"name": "cleanup.policy", "config_operation": 2, "value": "compact"},
                        {"name": "retention.ms", "config_operation": 1, "value": None},
                    ],
                }
            ],
        },
    )
    assert inc["responses"][0]["error_code"] == 0
    configs = {c["name"]: c for c in (await describe())["results"][0]["configs"]}
    assert configs["cleanup.policy"]["value"] == "delete,compact"
    assert configs["retention.ms"]["config_source"] == 5
    bad = await client.call(
        ApiKey.ALTER_CONFIGS,
        1,
        {
            "validate_only": False,
            "resources": [
                {"resource_type": 2, "resource_name": "adm", "configs": [{"name": "segment.bytes", "value": "abc"}]}
            ],
        },
    )
    assert bad["responses"][0]["error_code"] == E.InvalidConfigError.code
    parts = await client.call(
        ApiKey.CREATE_PARTITIONS,
        2,
        {
            "timeout_ms": 1000,
            "validate_only": False,
            "topics": [
                {"name": "adm", "count": 5, "assignments": None},
                {"name": "adm2", "count": 5, "assignments": None},
            ],
        },
    )
    assert [r["error_code"] for r in parts["results"]] == [0, E.UnknownTopicOrPartitionError.code]
    assert broker.store.topic("adm").queue_count == 5
    broker_cfg = await client.call(
        ApiKey.DESCRIBE_CONFIGS,
        4,
        {
            "include_synonyms": False,
            "include_documentation": False,
            "resources": [{"resource_type": 4, "resource_name": "0", "configuration_keys": None}],
        },
    )
    names = {c["name"]: c for c in broker_cfg["results"][0]["configs"]}
    assert names["message.max.bytes"]["read_only"] is True
    assert names["message.max.bytes"]["documentation"] is None and names["message.max.bytes"]["synonyms"] == []
    # the listener settings clients read, at the address the broker was reached on; documentation when asked
    assert names["advertised.listeners"]["value"] == f"PLAINTEXT://{broker.host}:{broker.port}"
    assert names["listeners"]["value"].startswith("PLAINTEXT://127.0.0.1:")
    assert names["transaction.max.timeout.ms"]["value"] == "900000"
    documented = await client.call(
        ApiKey.DESCRIBE_CONFIGS,
        4,
        {
            "include_synonyms": True,
            "include_documentation": True,
            "resources": [{"resource_type": 4, "resource_name": "0", "configuration_keys": ["num.partitions"]}],
        },
    )
    [num_partitions] = documented["results"][0]["configs"]
    assert "partition count" in num_partitions["documentation"]
    assert num_partitions["synonyms"] == [{"name": "num.partitions", "value": num_partitions["value"], "source": 4}]
    deleted = await client.call(ApiKey.DELETE_TOPICS, 4, {"topic_names": ["adm", "ghost"], "timeout_ms": 1000})
    assert [r["error_code"] for r in deleted["responses"]] == [0, E.UnknownTopicOrPartitionError.code]
    assert broker.store.topic("adm") is None


async def test_metadata_describe_cluster_find_coordinator_sasl(client, broker):
    md = await client.call(
        ApiKey.METADATA,
        12,
        {
            "topics": [{"name": "mdt", "topic_id": uuid.UUID(int=0)}],
            "allow_auto_topic_creation": True,
            "include_topic_authorized_operations": False,
        },
    )
    assert md["brokers"] == [{"node_id": 0, "host": broker.host, "port": broker.port, "rack": None}]
    assert md["cluster_id"] == broker.config.cluster_id and md["controller_id"] == 0
    topic = md["topics"][0]
    assert topic["error_code"] == 0 and topic["partitions"][0]["leader_id"] == 0
    assert topic["topic_id"].bytes == bytes(broker.store.topic("mdt").topic_id)
    dc = await client.call(ApiKey.DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": False})
    assert dc["cluster_id"] == broker.config.cluster_id and dc["brokers"][0]["port"] == broker.port
    fc = await client.call(ApiKey.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["g1", "g2"]})
    assert [(c["key"], c["port"], c["error_code"]) for c in fc["coordinators"]] == [
        ("g1", broker.port, 0),
        ("g2", broker.port, 0),
    ]
    # a PLAINTEXT listener has no SASL exchange: Kafka answers ILLEGAL_SASL_STATE
    sasl = await client.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    assert sasl == {"error_code": E.IllegalSaslStateError.code, "mechanisms": []}


async def test_group_over_the_wire_join_sync_commit_fetch(client, broker):
    join = {
        "group_id": "wg",
        "session_timeout_ms": 10000,
        "rebalance_timeout_ms": 10000,
        "member_id": "",
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"\x00\x00\x00\x00\x00\x00"}],
        "reason": None,
    }
    first = await client.call(ApiKey.JOIN_GROUP, 5, join)
    assert first["error_code"] == E.MemberIdRequiredError.code
    joined = await client.call(ApiKey.JOIN_GROUP, 5, dict(join, member_id=first["member_id"]))
    assert joined["error_code"] == 0 and joined["leader"] == first["member_id"]
    me, gen = joined["member_id"], joined["generation_id"]
    sync = await client.call(
        ApiKey.SYNC_GROUP,
        3,
        {
            "group_id": "wg",
            "generation_id": gen,
            "member_id": me,
            "group_instance_id": None,
            "assignments": [{"member_id": me, "assignment": b"A"}],
        },
    )
    assert sync["error_code"] == 0 and sync["assignment"] == b"A"
    hb = await client.call(
        ApiKey.HEARTBEAT, 3, {"group_id": "wg", "generation_id": gen, "member_id": me, "group_instance_id": None}
    )
    assert hb["error_code"] == 0
    await broker.store.create_topic("ct", 2)
    commit = await client.call(
        ApiKey.OFFSET_COMMIT,
        7,
        {
            "group_id": "wg",
            "generation_id_or_member_epoch": gen,
            "member_id": me,
            "group_instance_id": None,
            "topics": [
                {
                    "name": "ct",
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": 42,
                            "committed_leader_epoch": -1,
                            "committed_metadata": "m",
                        },
                        {
                            "partition_index": 9,
                            "committed_offset": 1,
                            "committed_leader_epoch": -1,
                            "committed_metadata": "",
                        },
                    ],
                }
            ],
        },
    )
    assert [p["error_code"] for p in commit["topics"][0]["partitions"]] == [0, E.UnknownTopicOrPartitionError.code]
    fetched = await client.call(
        ApiKey.OFFSET_FETCH,
        8,
        {
            "groups": [{"group_id": "wg", "topics": [{"name": "ct", "partition_indexes": [0, 1]}]}],
            "require_stable": False,
        },
    )
    parts = fetched["groups"][0]["topics"][0]["partitions"]
    assert [(p["committed_offset"], p["metadata"]) for p in parts] == [(42, "m"), (-1, "")]
    described = await client.call(
        ApiKey.DESCRIBE_GROUPS, 5, {"groups": ["wg", "nope"], "include_authorized_operations": False}
    )
    assert described["groups"][0]["group_state"] == "Stable"
    assert described["groups"][0]["members"][0]["member_assignment"] == b"A"
    assert described["groups"][1]["group_state"] == "Dead"
    listed = await client.call(ApiKey.LIST_GROUPS, 4, {"states_filter": ["Stable"]})
    assert [g["group_id"] for g in listed["groups"]] == ["wg"]
    leave = await client.call(
        ApiKey.LEAVE_GROUP, 3, {"group_id": "wg", "members": [{"member_id": me, "group_instance_id": None}]}
    )
    assert leave["error_code"] == 0 and leave["members"][0]["error_code"] == 0
    od = await client.call(
        ApiKey.OFFSET_DELETE, 0, {"group_id": "wg", "topics": [{"name": "ct", "partitions": [{"partition_index": 0}]}]}
    )
    assert od["error_code"] == 0 and od["topics"][0]["partitions"][0]["error_code"] == 0
    dg = await client.call(ApiKey.DELETE_GROUPS, 1, {"groups_names": ["wg", "nope"]})
    assert [r["error_code"] for r in dg["results"]] == [0, E.GroupIdNotFoundError.code]


async def test_pipelined_idempotent_batches_and_in_flight_retry(client, broker):
    """max.in.flight > 1: several sequenced batches (and a retry of one still in flight) sent back to back."""
    init = await client.call(
        ApiKey.INIT_PRODUCER_ID,
        4,
        {"transactional_id": None, "transaction_timeout_ms": 1, "producer_id": -1, "producer_epoch": -1},
    )
    pid = init["producer_id"]

    def body(seq, value):
        return produce_body("pipe", make_batch([value], producer_id=pid, producer_epoch=0, base_sequence=seq))

    for seq, value in [(0, b"a"), (1, b"b"), (1, b"b"), (2, b"c"), (4, b"gap")]:
        client.send(ApiKey.PRODUCE, 9, body(seq, value))
    await client.writer.drain()
    results = [(await client.receive())[1]["responses"][0]["partition_responses"][0] for _ in range(5)]
    assert [(r["error_code"], r["base_offset"]) for r in results[:4]] == [(0, 0), (0, 1), (0, 1), (0, 2)]
    assert results[4]["error_code"] == E.OutOfOrderSequenceNumberError.code
    assert values_of((await fetch(client, "pipe", 0))["records"]) == [b"a", b"b", b"c"]
    # a producer that bumps its epoch itself (the Java client's idempotent epoch bump) restarts its sequence at 0,
    # and its older epoch is fenced on that partition
    fresh = make_batch([b"d"], producer_id=pid, producer_epoch=1, base_sequence=0)
    assert (await produce(client, "pipe", fresh))["base_offset"] == 3
    stale = make_batch([b"e"], producer_id=pid, producer_epoch=0, base_sequence=3)
    assert (await produce(client, "pipe", stale))["error_code"] == E.InvalidProducerEpochError.code
    # InitProducerId with the current id and epoch (KIP-360, librdkafka's bump) gets a new id at epoch 0, as from
    # Kafka: no epoch is kept per producer id outside the partitions, so one a restart forgot cannot refuse it
    again = await client.call(
        ApiKey.INIT_PRODUCER_ID,
        4,
        {"transactional_id": None, "transaction_timeout_ms": 1, "producer_id": pid, "producer_epoch": 1},
    )
    assert again["error_code"] == 0 and again["producer_id"] > pid and again["producer_epoch"] == 0


async def test_storage_failure_is_kafka_storage_error_and_compacted_topic_needs_keys(client, broker):
    await seed(client)

    def refuse(context):  # what the disk guard's put hook does when the disk fills up
        raise E.StorageFull("disk full")

    broker.store.hooks.insert(0, refuse)
    try:
        part = await produce(client, "keep", make_batch([b"lost"]))
        assert part["error_code"] == E.KafkaStorageError.code and "disk full" in part["error_message"]
    finally:
        broker.store.hooks.remove(refuse)
    await assert_healthy(broker)

    from mqk.config import TopicConfig

    await broker.store.create_topic("compacted", 1, TopicConfig({"cleanup.policy": "compact"}))
    keyless = await produce(
        client, "compacted", make_batch([b"v1", b"v2", b"v3", b"v4"], keys=[b"k", None, b"k3", None])
    )
    assert keyless["error_code"] == E.InvalidRecordError.code
    # KIP-467: every keyless record of the batch is named, by its index in the batch
    assert [e["batch_index"] for e in keyless["record_errors"]] == [1, 3]
    assert "needs a key" in keyless["record_errors"][0]["batch_index_error_message"]
    keyed = await produce(client, "compacted", make_batch([b"v1", b"v2"], keys=[b"k", b"k2"]))
    assert keyed["error_code"] == 0 and broker.store.end_offset("compacted", 0) == 2


async def test_fetch_max_bytes_spans_partitions_with_at_least_one_batch(client, broker):
    await broker.store.create_topic("mp", 3)
    for p in range(3):
        for _ in range(3):
            assert (await produce(client, "mp", make_batch([b"x" * 1000]), partition=p))["error_code"] == 0
    body = fetch_body("mp", 0, max_bytes=1500)
    body["topics"][0]["partitions"] = [
        {
            "partition": p,
            "current_leader_epoch": -1,
            "fetch_offset": 0,
            "log_start_offset": -1,
            "partition_max_bytes": 1 << 20,
        }
        for p in range(3)
    ]
    resp = await client.call(ApiKey.FETCH, 12, body)
    counts = [len(values_of(p["records"])) for p in resp["responses"][0]["partitions"]]
    # the first partition returns one whole batch although it exceeds max_bytes; then the response is full
    assert counts == [1, 0, 0]
    assert [p["high_watermark"] for p in resp["responses"][0]["partitions"]] == [3, 3, 3]


async def test_flood_of_requests_is_answered_in_order_with_bounded_work(client, broker):
    from mqk.server.kafka.server import MAX_IN_FLIGHT

    for _ in range(1000):
        client.send(ApiKey.API_VERSIONS, 0, {})
    await client.writer.drain()
    answers = [await client.receive() for _ in range(1000)]
    assert [cid for cid, _ in answers] == sorted(cid for cid, _ in answers)
    assert all(body["error_code"] == 0 for _, body in answers)
    assert all(len(conn.pending) <= MAX_IN_FLIGHT for conn in broker.connections)


async def test_reader_that_does_not_read_is_paused_not_buffered(client, broker):
    for _ in range(20):
        assert (await produce(client, "big", make_batch([b"x" * 100_000])))["error_code"] == 0
    async with await RawKafkaClient.connect(broker.host, broker.port) as slow:
        for _ in range(40):  # 40 answers of 2 MB each that the client does not read for now
            slow.send(ApiKey.FETCH, 12, fetch_body("big", 0, max_bytes=50 << 20))
        await slow.writer.drain()
        (conn,) = [c for c in broker.connections if c.peer.endswith(str(slow.writer.get_extra_info("sockname")[1]))]
        # paused writing stops the answers (and the reading) until the client reads: the buffer is final
        await wait_until_async(lambda: conn.writing_paused, what="the connection to pause writing")
        assert conn.transport.get_write_buffer_size() < 8 << 20  # one answer beyond the high-water mark, not 80 MB
        # another connection is served meanwhile
        assert (await produce(client, "big", make_batch([b"y"])))["error_code"] == 0
        sizes = []
        for _ in range(40):
            _, body = await slow.receive(timeout=30)
            sizes.append(len(raw_records(body["responses"][0]["partitions"][0]["records"])))
        assert len(sizes) == 40 and all(size >= 2_000_000 for size in sizes)


async def test_committed_offsets_and_topics_survive_restart(tmp_path):
    run = file_broker_session(tmp_path)

    def fetch_offsets(c):
        return c.call(ApiKey.OFFSET_FETCH, 7, {"group_id": "rg", "topics": None, "require_stable": False})

    async def first(c):
        await produce(c, "rt", make_batch([b"a", b"b", b"c"]))
        commit = await c.call(
            ApiKey.OFFSET_COMMIT,
            7,
            {
                "group_id": "rg",
                "generation_id_or_member_epoch": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": [
                    {
                        "name": "rt",
                        "partitions": [
                            {
                                "partition_index": 0,
                                "committed_offset": 2,
                                "committed_leader_epoch": 0,
                                "committed_metadata": "note",
                            }
                        ],
                    }
                ],
            },
        )
        assert commit["topics"][0]["partitions"][0]["error_code"] == 0
        return await fetch_offsets(c)

    before = await run(first)

    async def second(c):
        listed = await c.call(ApiKey.LIST_GROUPS, 4, {"states_filter": []})
        assert [g["group_id"] for g in listed["groups"]] == ["rg"]
        assert values_of((await fetch(c, "rt", 2))["records"]) == [b"a", b"b", b"c"]
        return await fetch_offsets(c)

    after = await run(second)
    part = after["topics"][0]["partitions"][0]
    assert (part["committed_offset"], part["metadata"], part["committed_leader_epoch"]) == (2, "note", 0)
    assert after == before


async def test_failed_acks_zero_produce_closes_the_connection(broker, client):
    await seed(client)
    async with await RawKafkaClient.connect(broker.host, broker.port) as fire_and_forget:
        bad = make_batch([b"x"])
        bad[-1] ^= 1
        fire_and_forget.send(ApiKey.PRODUCE, 9, produce_body("keep", bad, acks=0), expect_response=False)
        await fire_and_forget.writer.drain()
        assert await fire_and_forget.closed_by_peer()
    await assert_healthy(broker)


async def test_multi_partition_produce_under_sync_flush(tmp_path):
    cfg = config(
        store=StoreConfig(
            storage="file",
            data_dir=Path(tmp_path),
            flush_mode="sync",
            commitlog_segment_bytes=1 << 20,
            cq_units_per_file=1024,
        )
    )
    store = StoreManager(cfg.store)
    await store.start()
    server = KafkaServer(cfg, store)
    await server.start()
    try:
        await store.create_topic("many", 8)
        async with await RawKafkaClient.connect(server.host, server.port) as c:
            body = {
                "transactional_id": None,
                "acks": -1,
                "timeout_ms": 5000,
                "topic_data": [
                    {
                        "name": "many",
                        "partition_data": [
                            {"index": p, "records": bytes(make_batch([str(p).encode()]))} for p in range(8)
                        ]
                        + [{"index": 99, "records": bytes(make_batch([b"x"]))}],
                    }
                ],
            }
            resp = await c.call(ApiKey.PRODUCE, 9, body)
            parts = resp["responses"][0]["partition_responses"]
            assert [(p["index"], p["error_code"], p["base_offset"]) for p in parts[:8]] == [(p, 0, 0) for p in range(8)]
            assert parts[8]["error_code"] == E.UnknownTopicOrPartitionError.code
            for p in range(8):
                assert values_of((await fetch(c, "many", 0, partition=p))["records"]) == [str(p).encode()]
    finally:
        await server.stop()
        await store.close()


async def test_produce_v13_names_topics_by_id(client, broker):
    await broker.store.create_topic("by-id", 2)
    topic_id = uuid.UUID(bytes=broker.store.topic("by-id").topic_id)
    ghost = uuid.uuid4()
    resp = await client.call(
        ApiKey.PRODUCE,
        13,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout_ms": 5000,
            "topic_data": [
                {"topic_id": topic_id, "partition_data": [{"index": 1, "records": bytes(make_batch([b"v13"]))}]},
                {"topic_id": ghost, "partition_data": [{"index": 0, "records": bytes(make_batch([b"lost"]))}]},
            ],
        },
    )
    known, unknown = resp["responses"]
    assert known["topic_id"] == topic_id and known["partition_responses"][0]["error_code"] == 0
    assert unknown["topic_id"] == ghost
    assert unknown["partition_responses"][0]["error_code"] == E.UnknownTopicIdError.code
    assert values_of((await fetch(client, "by-id", 0, partition=1))["records"]) == [b"v13"]


async def test_offset_commit_and_fetch_v10_name_topics_by_id(client, broker):
    await broker.store.create_topic("ids", 2)
    topic_id = uuid.UUID(bytes=broker.store.topic("ids").topic_id)
    ghost = uuid.uuid4()
    committed = await client.call(
        ApiKey.OFFSET_COMMIT,
        10,
        {
            "group_id": "g10",
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [
                {
                    "topic_id": topic_id,
                    "partitions": [{"partition_index": 1, "committed_offset": 42, "committed_metadata": "m"}],
                },
                {
                    "topic_id": ghost,
                    "partitions": [{"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}],
                },
            ],
        },
    )
    known, unknown = committed["topics"]
    assert known["topic_id"] == topic_id and known["partitions"][0]["error_code"] == 0
    assert unknown["topic_id"] == ghost and unknown["partitions"][0]["error_code"] == E.UnknownTopicIdError.code

    def fetch_body10(topics):
        return {
            "groups": [{"group_id": "g10", "member_id": None, "member_epoch": -1, "topics": topics}],
            "require_stable": False,
        }

    asked = await client.call(
        ApiKey.OFFSET_FETCH,
        10,
        fetch_body10([{"topic_id": topic_id, "partition_indexes": [1]}, {"topic_id": ghost, "partition_indexes": [0]}]),
    )
    found, missing = asked["groups"][0]["topics"]
    assert found["topic_id"] == topic_id and found["partitions"][0]["committed_offset"] == 42
    assert missing["topic_id"] == ghost and missing["partitions"][0]["error_code"] == E.UnknownTopicIdError.code
    every = await client.call(ApiKey.OFFSET_FETCH, 10, fetch_body10(None))
    assert [(t["topic_id"], t["partitions"][0]["committed_offset"]) for t in every["groups"][0]["topics"]] == [
        (topic_id, 42)
    ]


async def test_describe_topic_partitions_pages_with_its_cursor(client, broker):
    await broker.store.create_topic("dtp-a", 3)
    await broker.store.create_topic("dtp-b", 2)

    async def describe(names, limit, cursor=None):
        return await client.call(
            ApiKey.DESCRIBE_TOPIC_PARTITIONS,
            0,
            {"topics": [{"name": n} for n in names], "response_partition_limit": limit, "cursor": cursor},
        )

    first = await describe(["dtp-b", "dtp-a", "dtp-none"], 4)
    assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in first["topics"]] == [
        ("dtp-a", [0, 1, 2]),
        ("dtp-b", [0]),
    ]
    assert first["topics"][0]["topic_id"] == uuid.UUID(bytes=broker.store.topic("dtp-a").topic_id)
    assert first["topics"][0]["partitions"][0]["leader_id"] == 0
    assert first["next_cursor"] == {"topic_name": "dtp-b", "partition_index": 1}
    rest = await describe(["dtp-b", "dtp-a", "dtp-none"], 4, first["next_cursor"])
    assert [(t["name"], t["error_code"], [p["partition_index"] for p in t["partitions"]]) for t in rest["topics"]] == [
        ("dtp-b", 0, [1]),
        ("dtp-none", E.UnknownTopicOrPartitionError.code, []),
    ]
    assert rest["next_cursor"] is None
    assert broker.store.topic("dtp-none") is None  # never auto-created
    every = await describe([], 100)
    assert {"dtp-a", "dtp-b"} <= {t["name"] for t in every["topics"]}


async def test_list_config_resources_lists_topics_brokers_and_groups(client, broker):
    await broker.store.create_topic("lcr", 1)
    await client.call(
        ApiKey.OFFSET_COMMIT,
        8,
        {
            "group_id": "lcr-group",
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [
                {"name": "lcr", "partitions": [{"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}]}
            ],
        },
    )
    every = await client.call(ApiKey.LIST_CONFIG_RESOURCES, 1, {"resource_types": []})
    listed = {(r["resource_type"], r["resource_name"]) for r in every["config_resources"]}
    assert {(2, "lcr"), (4, "0"), (32, "lcr-group")} <= listed
    topics = await client.call(ApiKey.LIST_CONFIG_RESOURCES, 1, {"resource_types": [2]})
    assert {r["resource_type"] for r in topics["config_resources"]} == {2}
    bad = await client.call(ApiKey.LIST_CONFIG_RESOURCES, 1, {"resource_types": [99]})
    assert bad["error_code"] == E.InvalidRequestError.code
