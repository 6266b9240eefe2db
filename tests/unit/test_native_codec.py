"""Remoting codec: frames, both header serialisations, message formats; round trips and hostile input."""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqk.errors import FrameTooLarge, ProtocolError
from mqk.protocol.native.codes import FLAG_ONEWAY, FLAG_RESPONSE, RequestCode, ResponseCode, SerializeType
from mqk.protocol.native.command import FrameDecoder, RemotingCommand, RemotingProtocolError, decode_frame
from mqk.protocol.native.message import (
    BatchItem,
    MessageExt,
    MessageFormatError,
    body_crc,
    decode_batch_body,
    decode_message_id,
    decode_messages,
    encode_batch_body,
    encode_message_ext,
    encode_message_id,
    properties_to_string,
    string_to_properties,
)
from mqk.protocol.native.records import batch_to_messages, message_to_batch, synthetic_matches, synthetic_offset

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), max_size=20)
int32 = st.integers(-(1 << 31), (1 << 31) - 1)


def test_constants_match_rocketmq() -> None:
    assert RequestCode.SEND_MESSAGE_V2 == 310 and RequestCode.SEND_BATCH_MESSAGE == 320
    assert RequestCode.GET_ROUTEINFO_BY_TOPIC == 105 and RequestCode.CONSUMER_SEND_MSG_BACK == 36
    assert ResponseCode.PULL_OFFSET_MOVED == 21 and ResponseCode.TOPIC_NOT_EXIST == 17
    assert ResponseCode.REQUEST_CODE_NOT_SUPPORTED == 3


def test_pop_codes_travel_whole_as_json_and_cast_to_a_short_in_the_binary_header() -> None:
    """RocketMQ's binary header keeps a request code in a short (Java casts it), so the POP family's codes
    (200050 and up) arrive whole only as JSON, which is how RocketMQ's clients send them."""
    assert RequestCode.POP_MESSAGE == 200050 and RequestCode.BATCH_ACK_MESSAGE == 200151
    assert ResponseCode.POLLING_TIMEOUT == 210 and ResponseCode.INVALID_PARAMETER == 29
    for serialize, arrives in ((SerializeType.JSON, 200050), (SerializeType.ROCKETMQ, 200050 - 3 * 65536)):
        cmd = RemotingCommand(code=RequestCode.POP_MESSAGE, opaque=1, serialize_type=serialize)
        decoder = FrameDecoder()
        decoder.receive_data(cmd.encode())
        got = decoder.next_command()
        assert got is not None and got.code == arrives


def test_json_frame_layout_is_what_ali_ons_reads() -> None:
    cmd = RemotingCommand(code=34, opaque=7, ext_fields={"a": "1"}, body=b"xyz")
    frame = cmd.encode()
    total, word = struct.unpack_from(">ii", frame)
    assert total == len(frame) - 4
    assert word >> 24 == SerializeType.JSON
    header = json.loads(frame[8 : 8 + (word & 0xFFFFFF)])
    assert header["code"] == 34 and header["opaque"] == 7 and header["extFields"] == {"a": "1"}
    assert frame.endswith(b"xyz")


def test_json_header_accepts_js_typed_ext_fields() -> None:
    header = json.dumps(
        {
            "code": 11,
            "opaque": 3,
            "flag": 0,
            "extFields": {"queueId": 2, "commitOffset": 10, "unitMode": False, "x": None},
        }
    ).encode()
    cmd = decode_frame(struct.pack(">i", len(header)) + header)
    assert cmd.ext_fields == {"queueId": "2", "commitOffset": "10", "unitMode": "false"}
    assert cmd.get_int("queueId") == 2 and cmd.get_bool("unitMode") is False and cmd.body is None


def test_response_keeps_opaque_and_serialisation() -> None:
    req = RemotingCommand(code=10, opaque=99, serialize_type=SerializeType.ROCKETMQ, flag=FLAG_ONEWAY)
    assert req.is_oneway and not req.is_response
    resp = req.response(ResponseCode.SUCCESS, "ok", {"queueOffset": 5})
    assert resp.opaque == 99 and resp.is_response and resp.flag == FLAG_RESPONSE
    assert resp.serialize_type == SerializeType.ROCKETMQ and resp.ext_fields == {"queueOffset": "5"}


@settings(max_examples=150, deadline=None)
@given(
    code=st.integers(-(1 << 15), (1 << 15) - 1),
    opaque=int32,
    flag=st.integers(0, 3),
    version=st.integers(-(1 << 15), (1 << 15) - 1),
    remark=st.none() | texts.filter(bool),
    ext=st.dictionaries(texts, texts, max_size=5),
    body=st.none() | st.binary(min_size=1, max_size=64),
    serialize=st.sampled_from([SerializeType.JSON, SerializeType.ROCKETMQ]),
)
def test_round_trip_both_serialisations(code, opaque, flag, version, remark, ext, body, serialize) -> None:
    cmd = RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=ext,
        body=body,
        version=version,
        serialize_type=serialize,
        language="JAVA",
    )
    frame = cmd.encode()
    decoder = FrameDecoder()
    for i in range(0, len(frame), 7):  # arrives in small chunks
        decoder.receive_data(frame[i : i + 7])
    got = decoder.next_command()
    assert got == cmd
    assert decoder.next_command() is None and decoder.buffered == 0


def test_frame_too_large_refused_before_buffering() -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    decoder.receive_data(struct.pack(">i", 1025))
    with pytest.raises(FrameTooLarge):
        decoder.next_command()
    negative = FrameDecoder()
    negative.receive_data(struct.pack(">i", -5))
    with pytest.raises(FrameTooLarge):
        negative.next_command()
    default = FrameDecoder()
    default.receive_data(struct.pack(">i", 16 * 1024 * 1024 + 1))
    with pytest.raises(FrameTooLarge):
        default.next_command()


def test_impossible_header_length_detected_from_first_8_bytes() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(struct.pack(">ii", 100, 500))  # header says 500 bytes, frame only 100
    with pytest.raises(RemotingProtocolError):
        decoder.next_command()
    bad_type = FrameDecoder()
    bad_type.receive_data(struct.pack(">iI", 100, (7 << 24) | 10))
    with pytest.raises(RemotingProtocolError):
        bad_type.next_command()


@pytest.mark.parametrize(
    "header",
    [
        b"not json",
        b"[1,2]",
        b'{"code": "x"}',
        b'{"extFields": 3}',
        b'{"code": 99999999999}',
        b"\xff\xfe",
        b'{"code": true}',
    ],
)
def test_bad_json_headers_raise_typed_errors(header: bytes) -> None:
    with pytest.raises(RemotingProtocolError):
        decode_frame(struct.pack(">i", len(header)) + header)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_never_escapes_typed_errors(data: bytes) -> None:
    decoder = FrameDecoder(max_frame_bytes=4096)
    decoder.receive_data(data)
    try:
        while decoder.next_command() is not None:
            pass
    except ProtocolError:
        pass
    for serialize in (0, 1):
        with contextlib.suppress(ProtocolError):
            decode_frame(struct.pack(">I", (serialize << 24) | len(data)) + data)


def test_header_field_accessors() -> None:
    cmd = RemotingCommand(code=1, ext_fields={"n": "12", "f": "3.0", "bad": "zz"})
    assert cmd.get_int("n") == 12 and cmd.get_int("f") == 3 and cmd.get_int("missing", 5) == 5
    with pytest.raises(ProtocolError):
        cmd.get_int("bad")
    with pytest.raises(ProtocolError):
        cmd.get_str("missing", required=True)
    # Java longs only (Long.parseLong): one past either end is refused as a bad field, not passed on
    edges = RemotingCommand(
        code=1,
        ext_fields={"lo": str(-(1 << 63)), "hi": str((1 << 63) - 1), "under": str(-(1 << 63) - 1), "over": "1e30"},
    )
    assert edges.get_int("lo") == -(1 << 63) and edges.get_int("hi") == (1 << 63) - 1
    for name in ("under", "over"):
        with pytest.raises(ProtocolError, match="64-bit"):
            edges.get_int(name)


# --- messages -----------------------------------------------------------------------------------------------


@given(st.dictionaries(texts.filter(bool), texts, max_size=8))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert string_to_properties(properties_to_string(props)) == props


def test_properties_parse_is_lenient() -> None:
    assert string_to_properties("A\x011\x02garbage\x02\x02B\x01\x02") == {"A": "1", "B": ""}


def test_message_id_round_trip() -> None:
    msg_id = encode_message_id("10.1.2.3", 10911, 123456789)
    assert len(msg_id) == 32 and msg_id == msg_id.upper()
    assert msg_id.startswith("0A010203") and decode_message_id(msg_id) == ("10.1.2.3", 10911, 123456789)
    assert decode_message_id(encode_message_id("::1", 1, 2)) == ("::1", 1, 2)
    for bad in ("xyz", "Z" * 32, ""):
        with pytest.raises(MessageFormatError):
            decode_message_id(bad)


@settings(max_examples=100, deadline=None)
@given(
    body=st.binary(max_size=100),
    props=st.dictionaries(texts.filter(bool), texts, max_size=4),
    queue=st.integers(0, 1000),
    offset=st.integers(0, 1 << 40),
    phys=st.integers(0, 1 << 50),
    v6=st.booleans(),
    reconsume=st.integers(0, 20),
)
def test_message_ext_round_trip(body, props, queue, offset, phys, v6, reconsume) -> None:
    host = ("::1", 10911) if v6 else ("127.0.0.1", 10911)
    msg = MessageExt(
        topic="T-1",
        body=body,
        properties=props,
        queue_id=queue,
        queue_offset=offset,
        commit_log_offset=phys,
        born_timestamp=1700000000000,
        born_host=("127.0.0.1", 5555),
        store_timestamp=1700000000001,
        store_host=host,
        reconsume_times=reconsume,
    )
    data = encode_message_ext(msg) * 2
    got = decode_messages(data)
    assert len(got) == 2
    msg.body_crc = body_crc(body)
    msg.sys_flag = got[0].sys_flag
    assert got[0] == msg
    assert got[0].offset_msg_id == encode_message_id(host[0], host[1], phys)


def test_message_ext_layout_offsets() -> None:
    data = encode_message_ext(MessageExt(topic="t", body=b"b", queue_id=3, queue_offset=9, commit_log_offset=77))
    total, magic, crc, queue_id, _flag, qoff, phys = struct.unpack_from(">iIiiiqq", data)
    assert total == len(data) and magic == 0xDAA320A7 and queue_id == 3 and qoff == 9 and phys == 77
    import zlib

    assert crc == zlib.crc32(b"b") & 0x7FFFFFFF


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_messages_raise_typed_errors(data: bytes) -> None:
    for decoder in (decode_messages, decode_batch_body):
        with contextlib.suppress(MessageFormatError):
            decoder(data)


@given(
    st.lists(
        st.tuples(st.binary(max_size=50), st.dictionaries(texts.filter(bool), texts, max_size=3), int32), max_size=5
    )
)
def test_batch_body_round_trip(items) -> None:
    batch = [BatchItem(body, props, flag) for body, props, flag in items]
    assert decode_batch_body(encode_batch_body(batch)) == batch


def test_batch_body_count_limit() -> None:
    data = encode_batch_body([BatchItem(b"x", {})] * 5)
    with pytest.raises(MessageFormatError):
        decode_batch_body(data, max_count=4)


# --- the bridge to record batches --------------------------------------------------------------------------


def test_message_becomes_one_record_batch_and_back() -> None:
    props = {"TAGS": "TagA", "KEYS": "order-1 order-2", "UNIQ_KEY": "ABC"}
    batch = message_to_batch(b"payload", props, 1700000000000, flag=4, reconsume_times=3, born_host=("10.0.0.9", 4242))
    from mqk._fast import load

    recbatch = load("recbatch")
    header = recbatch.parse_header(batch, 0)
    assert header[12] == 1  # one record
    records = recbatch.decode_records(bytes(batch[61:]), 1)
    assert records[0][3] == b"order-1" and records[0][4] == b"payload"
    assert ("TAGS", b"TagA") in records[0][5]
    recbatch.set_base_offset(batch, 0, 41)
    (msg,) = batch_to_messages(batch, "T", 2, 1700000000005, -1, ("127.0.0.1", 10911))
    assert msg.properties == props and msg.flag == 4 and msg.reconsume_times == 3
    assert msg.born_host == ("10.0.0.9", 4242) and msg.store_host == ("127.0.0.1", 10911)
    assert msg.queue_offset == 41 and msg.born_timestamp == 1700000000000
    assert msg.commit_log_offset == synthetic_offset("T", 2, 41) < 1 << 53
    assert synthetic_matches(msg.commit_log_offset, "T", 2)
    (with_phys,) = batch_to_messages(batch, "T", 2, 1, 5000, ("127.0.0.1", 10911))
    assert with_phys.commit_log_offset == 5000


def test_kafka_batch_with_many_records_and_compression() -> None:
    import gzip

    from mqk._fast import load

    recbatch = load("recbatch")
    records = b"".join(recbatch.encode_record(i, i, None, b"v%d" % i, [("h", b"x")]) for i in range(3))
    batch = recbatch.build_batch(10, 1000, 1002, gzip.compress(records), 3, 2, attributes=1)
    msgs = batch_to_messages(batch, "K", 0, 2000, 800, ("127.0.0.1", 1), min_offset=11)
    assert [m.queue_offset for m in msgs] == [11, 12]
    assert [m.body for m in msgs] == [b"v1", b"v2"] and msgs[0].properties == {"h": "x"}
    assert [m.commit_log_offset for m in msgs] == [801, 802]
    assert msgs[1].born_timestamp == 1002


def test_synthetic_offsets_fit_javascript_numbers_and_name_their_queue() -> None:
    from mqk.protocol.native.records import synthetic_queue_offset

    for topic in ("a", "orders", "%RETRY%group", "x" * 249):
        for queue in (0, 7, 255):
            value = synthetic_offset(topic, queue, (1 << 29) - 1)
            assert 0 <= value < 1 << 53
            assert synthetic_matches(value, topic, queue) and not synthetic_matches(value, topic, (queue + 1) % 256)
            assert synthetic_queue_offset(synthetic_offset(topic, queue, 12345)) == 12345
