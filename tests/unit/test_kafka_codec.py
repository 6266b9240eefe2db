"""Kafka frame + header codec: header version rules, ApiVersions' exceptions, frame-size refusal before allocation,
chunking, zero-copy frames, typed errors on garbage, and header byte parity with kafka-python 3."""

from __future__ import annotations

import importlib.util
import random
import struct
import warnings
from pathlib import Path

import pytest

from mqk.errors import FrameTooLarge, MqkError, ProtocolError
from mqk.protocol.kafka import api, codec, messages
from mqk.protocol.kafka.errors import MalformedMessage, UnknownApiKey, UnsupportedApiVersion

ROOT = Path(__file__).resolve().parents[2]


def join(parts) -> bytes:
    return b"".join(bytes(p) for p in parts)


def frame(api_key, version, body, correlation_id=1, client_id="cli") -> bytes:
    return join(codec.encode_request(api_key, version, correlation_id, client_id, body))


def feed(data: bytes, **kw) -> codec.KafkaConnectionCodec:
    c = codec.KafkaConnectionCodec(**kw)
    c.receive_data(data)
    return c


META_V1 = {"topics": [{"name": "a"}]}


# --- request header v1 / v2 ----------------------------------------------------------------------------


def test_request_header_v1_layout():
    raw = frame(3, 1, META_V1, correlation_id=0x01020304, client_id="xy")
    assert raw[4:].startswith(struct.pack(">hhi", 3, 1, 0x01020304) + b"\x00\x02xy")
    req = feed(raw).next_request()
    assert (req.api_key, req.api_version, req.correlation_id, req.client_id) == (3, 1, 0x01020304, "xy")
    assert req.body["topics"] == [{"name": "a", "topic_id": messages._ZU}]


def test_request_header_v2_has_tagged_fields_and_non_compact_client_id():
    raw = frame(3, 9, {"topics": None}, client_id="xy")
    # client_id stays an int16-length string in header v2, followed by an empty tag section
    assert raw[12:17] == b"\x00\x02xy\x00"
    # a header tagged field the broker does not know is skipped
    patched = raw[:16] + b"\x01\x05\x02zz" + raw[17:]
    patched = struct.pack(">i", len(patched) - 4) + patched[4:]
    req = feed(patched).next_request()
    assert req.client_id == "xy" and req.body["topics"] is None


def test_null_client_id():
    assert feed(frame(12, 0, {"group_id": "g"}, client_id=None)).next_request().client_id is None


# --- response header v0 / v1 and ApiVersions ------------------------------------------------------------


def test_response_header_v1_for_flexible_versions_only():
    req = codec.Request(12, 4, 77, "c", {})
    raw = join(codec.encode_response(req, {"error_code": 0}))
    assert raw == struct.pack(">ii", len(raw) - 4, 77) + b"\x00" + b"\x00\x00\x00\x00\x00\x00" + b"\x00"
    req0 = codec.Request(12, 3, 77, "c", {})
    raw0 = join(codec.encode_response(req0, {"error_code": 0}))
    assert raw0 == struct.pack(">ii", len(raw0) - 4, 77) + b"\x00\x00\x00\x00\x00\x00"


def test_api_versions_response_header_is_always_v0():
    req = feed(frame(18, 3, {"client_software_name": "a", "client_software_version": "1"})).next_request()
    raw = join(codec.encode_response(req, api.api_versions_body()))
    assert struct.unpack_from(">h", raw, 8)[0] == 0  # error code right after the 4-byte correlation id
    cid, body = codec.decode_response_frame(18, 3, raw[4:])
    assert cid == 1 and {k["api_key"] for k in body["api_keys"]} == set(api.SUPPORTED)


def test_api_versions_unsupported_version_gets_v0_answer_with_full_list():
    raw = frame(18, 3, {"client_software_name": "a", "client_software_version": "1"})
    raw = raw[:6] + struct.pack(">h", 99) + raw[8:]  # ask for ApiVersions v99
    req = feed(raw).next_request()
    assert req.unsupported and req.api_version == 99 and req.body == {}
    out = join(codec.encode_response(req, api.api_versions_unsupported_body()))
    size, cid, err, n = struct.unpack_from(">iihi", out, 0)
    assert (size, cid, err) == (len(out) - 4, 1, 35)
    assert n == len(api.SUPPORTED)  # v0 schema: int32 array length, no tags, no throttle time
    assert len(out) == 4 + 4 + 2 + 4 + 6 * n
    _cid, body = codec.decode_response_frame(18, 99, out[4:])
    assert body["error_code"] == 35 and len(body["api_keys"]) == n


def test_unsupported_version_of_other_api_is_typed():
    raw = frame(3, 12, {"topics": None})
    raw = raw[:6] + struct.pack(">h", 40) + raw[8:]
    with pytest.raises(UnsupportedApiVersion) as e:
        feed(raw).next_request()
    assert (e.value.api_key, e.value.api_version, e.value.correlation_id) == (3, 40, 1)
    # inside the spec but outside the broker's range (ListOffsets v11 came after Kafka 4.1)
    with pytest.raises(UnsupportedApiVersion):
        feed(frame(2, 11, {"replica_id": -1, "isolation_level": 0, "topics": []})).next_request()


def test_unknown_api_key_is_typed():
    raw = struct.pack(">ihhih", 10, 9999, 0, 5, -1)
    with pytest.raises(UnknownApiKey) as e:
        feed(raw).next_request()
    assert e.value.api_key == 9999 and e.value.correlation_id == 5
    # known to the specs but not offered by this broker (WriteTxnMarkers: broker to broker)
    with pytest.raises(UnknownApiKey):
        feed(frame(27, 1, {"markers": []})).next_request()


# --- framing -------------------------------------------------------------------------------------------


def test_frame_size_refused_before_allocation():
    c = codec.KafkaConnectionCodec(max_request_bytes=1000)
    c.receive_data(struct.pack(">i", 1001))
    with pytest.raises(FrameTooLarge):
        c.next_request()
    c = codec.KafkaConnectionCodec(max_request_bytes=1000)
    c.receive_data(struct.pack(">i", -5))
    with pytest.raises(FrameTooLarge):
        c.next_request()
    # a 2 GiB declaration with only 4 bytes present: refused at once, nothing allocated
    c = codec.KafkaConnectionCodec()
    c.receive_data(b"\x7f\xff\xff\xff")
    with pytest.raises(FrameTooLarge):
        c.next_request()


def test_truncated_frames_wait_for_more_data():
    raw = frame(3, 12, {"topics": [{"name": "t"}]}) + frame(12, 4, {"group_id": "g"}, correlation_id=2)
    c = codec.KafkaConnectionCodec()
    got = []
    for i in range(len(raw)):  # one byte at a time: every prefix is "need more data", never an error
        c.receive_data(raw[i : i + 1])
        while (r := c.next_request()) is not None:
            got.append(r)
    assert [(r.api_key, r.correlation_id) for r in got] == [(3, 1), (12, 2)]
    assert c.buffered == 0


def test_many_frames_in_one_chunk_and_split_sizes():
    frames = [frame(12, 4, {"group_id": f"g{i}"}, correlation_id=i) for i in range(50)]
    blob = b"".join(frames)
    c = codec.KafkaConnectionCodec()
    c.receive_data(blob[:7])
    c.receive_data(blob[7:])
    ids = []
    while (r := c.next_request()) is not None:
        ids.append((r.correlation_id, r.body["group_id"]))
    assert ids == [(i, f"g{i}") for i in range(50)]


def produce_frame(records: bytes, correlation_id: int = 1) -> bytes:
    return frame(
        0,
        9,
        {
            "acks": 1,
            "timeout_ms": 5,
            "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": records}]}],
        },
        correlation_id=correlation_id,
    )


def read_into(c: codec.KafkaConnectionCodec, data: bytes) -> memoryview:
    """What a buffered transport does: one read of `data` into the room the codec offers; returns that room."""
    room = c.get_buffer(-1)
    assert len(room) >= len(data)
    room[: len(data)] = data
    c.buffer_updated(len(data))
    return room


def records_of(req) -> memoryview:
    return req.body["topic_data"][0]["partition_data"][0]["records"]


def test_produce_records_are_views_into_the_receive_buffer():
    records = bytes(range(256)) * 40
    c = codec.KafkaConnectionCodec()
    room = read_into(c, produce_frame(records))
    rec = records_of(c.next_request())
    assert isinstance(rec, memoryview) and rec == records and rec.obj is room.obj  # read in place, no copy
    assert len(c._buf) == 0  # all of it handed out: the codec lets the buffer go (the view keeps it alive)
    del room
    assert rec == records


def test_a_frame_split_across_reads_is_read_in_place_after_its_prefix():
    records = bytes(range(256)) * 4000  # ~1 MB: bigger than a shared read buffer
    raw = produce_frame(records)
    c = codec.KafkaConnectionCodec()
    read_into(c, raw[:100])  # the prefix and the start of the frame
    assert c.next_request() is None
    room = c.get_buffer(-1)
    assert len(room) == len(raw) - 100  # room for exactly the rest of the frame
    for at in range(100, len(raw), 65536):  # the rest in 64 KiB reads, all into that room
        chunk = raw[at : at + 65536]
        assert read_into(c, chunk).obj is room.obj
    rec = records_of(c.next_request())
    assert rec == records and rec.obj is room.obj
    assert c.buffered == 0


def test_a_size_prefix_alone_does_not_size_a_buffer_beyond_ahead_max():
    c = codec.KafkaConnectionCodec()
    read_into(c, struct.pack(">i", 90 * 1024 * 1024))  # announced, not sent
    assert c.next_request() is None
    assert len(c.get_buffer(-1)) == codec.AHEAD_MAX
    # as the bytes do arrive, the buffer grows (doubling past AHEAD_MAX) and the frame still comes out whole
    body = frame(3, 12, {"topics": [{"name": "t"}]})[4:]
    payload = body + b"\0" * (90 * 1024 * 1024 - len(body))
    sent = 0
    while sent < len(payload):
        room = c.get_buffer(-1)
        assert len(room) <= max(codec.AHEAD_MAX, 4 + sent)
        step = min(len(room), len(payload) - sent)
        room[:step] = payload[sent : sent + step]
        c.buffer_updated(step)
        sent += step
    req = c.next_request()  # the decoder ignores the padding after the Metadata body
    assert req.api_key == 3 and req.body["topics"][0]["name"] == "t" and c.buffered == 0


def test_handed_out_frames_are_never_overwritten():
    c = codec.KafkaConnectionCodec()
    kept = []
    for i in range(400):  # ~4 MB through the codec: many buffer changes, most reads split a frame
        records = bytes([i % 256]) * (7000 + i)
        raw = produce_frame(records, correlation_id=i)
        for at in range(0, len(raw), 5000):
            c.receive_data(raw[at : at + 5000])
            while (req := c.next_request()) is not None:
                kept.append((req.correlation_id, records_of(req)))
    assert len(kept) == 400
    for i, rec in kept:
        assert rec == bytes([i % 256]) * (7000 + i)


def test_a_peer_sending_large_frames_gets_buffers_that_hold_several():
    # a producer's ~1 MB requests in socket-sized reads: once a frame has not fitted a shared read buffer, fresh
    # buffers get AHEAD_MAX of room, so the frames land whole (READ_CHUNK buffers copied every frame's head, 13%
    # of the bytes here) and every record comes out as sent, none overwritten by a later read
    rnd = random.Random(1)
    sizes = [rnd.randint(900_000, 1_000_000) for _ in range(40)]
    stream = b"".join(produce_frame(bytes([i % 256]) * n, correlation_id=i) for i, n in enumerate(sizes))
    c = codec.KafkaConnectionCodec()
    kept = []
    copied = at = 0
    buffer = None
    while at < len(stream):
        held = c.buffered
        room = c.get_buffer(-1)
        if room.obj is not buffer:  # a fresh buffer: what was held and not handed out was copied into it
            copied += held
            buffer = room.obj
        step = min(len(room), rnd.randint(16_384, 262_144), len(stream) - at)
        room[:step] = stream[at : at + step]
        c.buffer_updated(step)
        at += step
        del room
        while (req := c.next_request()) is not None:
            kept.append((req.correlation_id, records_of(req)))
    assert [i for i, _ in kept] == list(range(40))
    for i, rec in kept:
        assert rec == bytes([i % 256]) * sizes[i]
    assert copied < 0.03 * len(stream)


def test_truncated_body_is_malformed():
    raw = frame(3, 12, {"topics": [{"name": "topic"}]})
    cut = raw[:-4]
    cut = struct.pack(">i", len(cut) - 4) + cut[4:]
    with pytest.raises(MalformedMessage):
        feed(cut).next_request()
    with pytest.raises(MalformedMessage):
        feed(struct.pack(">i", 3) + b"\x00\x03\x00").next_request()  # shorter than a header


def test_hostile_lengths_do_not_allocate():
    # Metadata v1 with a topic array claiming 2**31-1 entries in a tiny frame
    head = struct.pack(">hhih", 3, 1, 1, -1)
    body = struct.pack(">i", 0x7FFFFFFF)
    raw = struct.pack(">i", len(head + body)) + head + body
    with pytest.raises(MalformedMessage):
        feed(raw).next_request()
    # a string length past the end
    body = struct.pack(">i", 1) + struct.pack(">h", 30000) + b"ab"
    raw = struct.pack(">i", len(head + body)) + head + body
    with pytest.raises(MalformedMessage):
        feed(raw).next_request()


def test_bad_utf8_client_id_is_malformed():
    head = struct.pack(">hhih", 12, 0, 1, 2) + b"\xff\xfe"
    raw = struct.pack(">i", len(head) + 2) + head + b"\x00\x00"
    with pytest.raises(MalformedMessage):
        feed(raw).next_request()


def test_errors_are_protocol_errors():
    for exc in (MalformedMessage, UnknownApiKey, UnsupportedApiVersion, FrameTooLarge):
        assert issubclass(exc, ProtocolError)


def test_random_bytes_smoke_only_typed_errors():
    spec = importlib.util.spec_from_file_location("fuzz_kafka_codec", ROOT / "fuzz" / "fuzz_kafka_codec.py")
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    assert fuzz.smoke(iterations=3000, seed=1234) == 3000


def test_garbage_after_valid_frame_raises_typed_error_not_crash():
    raw = frame(12, 4, {"group_id": "g"}) + struct.pack(">i", 12) + b"\xde\xad\xbe\xef" * 3
    c = feed(raw)
    assert c.next_request().body["group_id"] == "g"
    with pytest.raises(MqkError):
        c.next_request()


# --- Fetch response buffers ----------------------------------------------------------------------------


def test_fetch_response_is_header_plus_uncopied_views():
    seg = bytearray(b"R" * 10000)
    views = [memoryview(seg)[0:3000], memoryview(seg)[3000:10000]]
    req = codec.Request(1, 12, 9, "c", {})
    body = {
        "responses": [{"topic": "t", "partitions": [{"partition_index": 0, "high_watermark": 10, "records": views}]}]
    }
    parts = codec.encode_response(req, body)
    assert parts[1] is views[0] and parts[2] is views[1]
    raw = join(parts)
    assert struct.unpack_from(">i", raw)[0] == len(raw) - 4
    cid, back = codec.decode_response_frame(1, 12, raw[4:])
    p = back["responses"][0]["partitions"][0]
    assert cid == 9 and p["high_watermark"] == 10 and p["records"] == bytes(seg)


# --- parity with kafka-python's header + framing -------------------------------------------------------


def _kp():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.protocol.consumer import FetchRequest
        from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest
    return MetadataRequest, FetchRequest, ApiVersionsRequest, ApiVersionsResponse


@pytest.mark.parametrize("version", [0, 1, 8, 9, 12, 13])
def test_request_frame_parity_metadata(version):
    MetadataRequest, *_ = _kp()
    kp = MetadataRequest[version](topics=[MetadataRequest.MetadataRequestTopic(name="a")])
    kp.with_header(correlation_id=42, client_id="kp")
    theirs = bytes(kp.encode(header=True, framed=True))
    ours = frame(3, version, {"topics": [{"name": "a"}]}, correlation_id=42, client_id="kp")
    assert ours == theirs
    req = feed(theirs).next_request()
    assert req.body["topics"][0]["name"] == "a" and req.client_id == "kp"


def test_api_versions_response_parity():
    *_, ApiVersionsResponse = _kp()
    # Produce is listed from v0 though v3 is the oldest accepted (KAFKA-18659, see api.ADVERTISED_MIN)
    keys = [
        ApiVersionsResponse.ApiVersion(api_key=k, min_version=0 if k == api.ApiKey.PRODUCE else lo, max_version=hi)
        for k, (lo, hi) in sorted(api.SUPPORTED.items())
    ]
    for version in (0, 3):
        kp = ApiVersionsResponse[version](error_code=0, api_keys=keys, throttle_time_ms=0)
        kp.with_header(correlation_id=7)
        theirs = bytes(kp.encode(header=True, framed=True))
        ours = join(codec.encode_response(codec.Request(18, version, 7, "c", {}), api.api_versions_body()))
        assert ours == theirs, version


def test_malformed_body_names_the_request():
    raw = frame(3, 12, {"topics": [{"name": "topic"}]}, correlation_id=31)
    cut = raw[:-4]
    cut = struct.pack(">i", len(cut) - 4) + cut[4:]
    with pytest.raises(MalformedMessage) as e:
        feed(cut).next_request()
    assert (e.value.api_key, e.value.api_version, e.value.correlation_id) == (3, 12, 31)
    assert "Metadata v12" in str(e.value)
