"""Parity of the _fast kernels: the compiled modules and their pure-Python twins must agree byte for byte.

Two kinds of property tests, neither of which is ever skipped:
- reference tests, parametrised over every available implementation (the twin always, the compiled module when it
  is built): inputs are built independently here with struct.pack and a local varint encoder, and each
  implementation must produce exactly the expected values;
- cross-implementation tests on fuzzed and mutated bytes and out-of-range integers: the outcome (result, or
  exception type, message and position) of every available implementation is collected and they must all be equal;
  every outcome must also be a result or a typed error (mqk errors, or OverflowError/TypeError/ValueError for bad
  arguments), never anything else. With only the twin available (MQK_NO_EXTENSIONS=1, no compiler) the second kind
  still runs and checks the twin never fails untyped.
"""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqk._fast import compiled, twin
from mqk.errors import Corrupt, InvalidRecord, OutOfBounds


def implementations(name: str) -> list:
    impls = [twin(name)]
    built = compiled(name)
    if built is not None:
        impls.append(built)
    return impls


RB = implementations("recbatch")
CE = implementations("clentry")
CQ = implementations("cqunit")


def ids(impls):
    return ["twin" if m.__name__.endswith("_py") else "compiled" for m in impls]


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

I16 = st.integers(-(2**15), 2**15 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
WIDE = st.one_of(I64, st.integers(-(2**70), 2**70), st.sampled_from([2**31, -(2**31) - 1, 2**15, 2**63, -(2**63) - 1]))
ALLOWED_ERRORS = (Corrupt, InvalidRecord, OutOfBounds, OverflowError, TypeError, ValueError, BufferError)


# --- independent reference encoders ---------------------------------------------------------------------


def ref_uvarint(u: int) -> bytes:
    out = bytearray()
    while True:
        if u < 0x80:
            out.append(u)
            return bytes(out)
        out.append(0x80 | (u & 0x7F))
        u >>= 7


def ref_varint(v: int) -> bytes:
    return ref_uvarint((2 * v) if v >= 0 else (-2 * v - 1))


ref_varlong = ref_varint  # zigzag is width-independent for in-range values


def ref_record(offset_delta, timestamp_delta, key, value, headers) -> bytes:
    body = b"\x00" + ref_varlong(timestamp_delta) + ref_varint(offset_delta)
    for field in (key, value):
        body += ref_varint(-1) if field is None else ref_varint(len(field)) + field
    body += ref_varint(len(headers))
    for hk, hv in headers:
        raw = hk.encode()
        body += ref_varint(len(raw)) + raw
        body += ref_varint(-1) if hv is None else ref_varint(len(hv)) + hv
    return ref_varint(len(body)) + body


def ref_batch(f: dict, records: bytes) -> bytes:
    head = struct.pack(">qiib", f["base_offset"], 49 + len(records), f["leader_epoch"], 2)
    rest = (
        struct.pack(
            ">hiqqqhii",
            f["attributes"],
            f["last_offset_delta"],
            f["base_ts"],
            f["max_ts"],
            f["pid"],
            f["epoch"],
            f["seq"],
            f["count"],
        )
        + records
    )
    return head + struct.pack(">I", crc32c(rest)) + rest


def outcome(fn, *args):
    """What a call did: ("ok", result) or (exception type, message, position). Untyped failures fail the test."""
    try:
        return ("ok", fn(*args))
    except ALLOWED_ERRORS as exc:
        return (
            type(exc).__name__,
            str(exc) if isinstance(exc, (Corrupt, InvalidRecord, OutOfBounds)) else "",
            getattr(exc, "position", None),
        )


def same_outcome(impls, call):
    results = [call(m) for m in impls]
    for r in results[1:]:
        assert r == results[0], (ids(impls), results)
    return results[0]


# --- strategies ----------------------------------------------------------------------------------------

records_st = st.lists(
    st.tuples(
        I32,
        I64,
        st.none() | st.binary(max_size=40),
        st.none() | st.binary(max_size=40),
        st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3),
    ),
    max_size=6,
)

batch_fields_st = st.fixed_dictionaries(
    {
        "base_offset": I64,
        "leader_epoch": I32,
        "attributes": I16.map(lambda a: a & ~0x07),
        "last_offset_delta": I32,
        "base_ts": I64,
        "max_ts": I64,
        "pid": I64,
        "epoch": I16,
        "seq": I32,
    }
)


# --- recbatch: reference -------------------------------------------------------------------------------


@pytest.mark.parametrize("rb", RB, ids=ids(RB))
@SETTINGS
@given(fields=batch_fields_st, records=records_st)
def test_recbatch_matches_reference(rb, fields, records):
    encoded = [ref_record(*r) for r in records]
    assert [rb.encode_record(*r) for r in records] == encoded
    fields = dict(fields, count=len(records))
    expected = ref_batch(fields, b"".join(encoded))
    built = rb.build_batch(
        fields["base_offset"],
        fields["base_ts"],
        fields["max_ts"],
        b"".join(encoded),
        len(records),
        fields["last_offset_delta"],
        fields["attributes"],
        fields["pid"],
        fields["epoch"],
        fields["seq"],
        fields["leader_epoch"],
    )
    assert isinstance(built, bytearray) and bytes(built) == expected
    f = fields
    assert rb.parse_header(expected) == (
        f["base_offset"],
        len(expected) - 12,
        f["leader_epoch"],
        2,
        struct.unpack_from(">I", expected, 17)[0],
        f["attributes"],
        f["last_offset_delta"],
        f["base_ts"],
        f["max_ts"],
        f["pid"],
        f["epoch"],
        f["seq"],
        len(records),
    )
    assert rb.count_records(expected, 0, len(expected)) == len(records)
    decoded = rb.decode_records(expected[61:], len(records))
    assert decoded == [(0, td, od, k, v, [(hk, hv) for hk, hv in h]) for od, td, k, v, h in records]


@pytest.mark.parametrize("rb", RB, ids=ids(RB))
@SETTINGS
@given(batches=st.lists(st.tuples(batch_fields_st, records_st), max_size=5), pad=st.integers(0, 3))
def test_scan_batches_matches_reference(rb, batches, pad):
    buf, expected, pos = bytearray(), [], 0
    for fields, records in batches:
        fields = dict(fields, count=len(records))
        b = ref_batch(fields, b"".join(ref_record(*r) for r in records))
        expected.append(
            (
                pos,
                len(b),
                fields["last_offset_delta"],
                fields["max_ts"],
                len(records),
                fields["attributes"],
                fields["pid"],
                fields["epoch"],
                fields["seq"],
                fields["base_ts"],
                None,
            )
        )
        buf += b
        pos += len(b)
    assert rb.scan_batches(buf) == expected
    assert rb.scan_batches(bytes(buf), False) == expected
    # and every uncompressed batch's records walk clean (no names asked for: none found)
    walked = [(*e[:10], None if e[5] & 7 else False) for e in expected]
    assert rb.scan_batches(buf, True, True) == walked
    assert rb.scan_batches(memoryview(b"\x00" * pad + bytes(buf))[pad:]) == expected
    for p, size, *_ in expected:
        assert rb.parse_header(buf, p)[1] == size - 12


@pytest.mark.parametrize("rb", RB, ids=ids(RB))
@SETTINGS
@given(fields=batch_fields_st, records=records_st, new_base=I64, ts=I64, lead=st.integers(0, 5))
def test_in_place_edits_match_reference(rb, fields, records, new_base, ts, lead):
    fields = dict(fields, count=len(records))
    batch = ref_batch(fields, b"".join(ref_record(*r) for r in records))
    buf = bytearray(lead) + bytearray(batch)
    rb.set_base_offset(buf, lead, new_base)
    assert bytes(buf[lead:]) == struct.pack(">q", new_base) + batch[8:]
    rb.set_log_append_time(buf, lead, ts)
    expected = ref_batch(
        dict(fields, base_offset=new_base, attributes=fields["attributes"] | 0x08, max_ts=ts), batch[61:]
    )
    assert bytes(buf[lead:]) == expected


# --- recbatch: cross-implementation on bad bytes ---------------------------------------------------------


@st.composite
def damaged_batches(draw):
    """Valid batches, then damage: a flipped byte, a cut, trailing junk, or a forged field; or plain noise."""
    if draw(st.integers(0, 4)) == 0:
        return bytearray(draw(st.binary(max_size=200)))
    buf = bytearray()
    for _ in range(draw(st.integers(1, 3))):
        fields = dict(draw(batch_fields_st))
        records = draw(records_st)
        fields["count"] = len(records)
        buf += ref_batch(fields, b"".join(ref_record(*r) for r in records))
    kind = draw(st.integers(0, 3))
    if kind == 0:
        i = draw(st.integers(0, len(buf) - 1))
        buf[i] ^= draw(st.integers(1, 255))
    elif kind == 1:
        del buf[draw(st.integers(0, len(buf) - 1)) :]
    elif kind == 2:
        buf += draw(st.binary(min_size=1, max_size=70))
    else:
        at = draw(st.sampled_from([8, 16, 21, 57]))
        buf[at : at + 4] = draw(st.binary(min_size=4, max_size=4))
    return buf


@SETTINGS
@given(
    buf=damaged_batches(),
    pos=st.integers(-3, 300),
    size=st.integers(-3, 400),
    count=st.integers(-2, 40),
    verify=st.booleans(),
)
def test_recbatch_outcomes_agree_on_damaged_input(buf, pos, size, count, verify):
    data = bytes(buf)
    same_outcome(RB, lambda m: outcome(m.scan_batches, data, verify))
    same_outcome(RB, lambda m: outcome(m.scan_batches, data, verify, True))
    same_outcome(RB, lambda m: outcome(m.parse_header, data, pos))
    same_outcome(RB, lambda m: outcome(m.count_records, data, pos, size))
    same_outcome(RB, lambda m: outcome(m.count_records, data, 0, len(data)))
    same_outcome(RB, lambda m: outcome(m.decode_records, data[61:], count))
    same_outcome(RB, lambda m: outcome(m.decode_records, data, count))
    same_outcome(RB, lambda m: outcome(m.check_records, data[61:], count))
    same_outcome(RB, lambda m: outcome(m.check_records, data, count))
    same_outcome(RB, lambda m: outcome(m.scan_batches, data, verify, True, DELAY_KEYS))
    same_outcome(RB, lambda m: outcome(m.check_records, data[61:], count, DELAY_KEYS))
    same_outcome(RB, lambda m: outcome(m.scan_batches, data, verify, True, (), True))
    same_outcome(RB, lambda m: outcome(m.check_records, data[61:], count, (), True))
    window = (pos * 10**9, pos * 10**9 + size * 10**7)  # some windows cut through the batches' timestamps
    same_outcome(RB, lambda m: outcome(m.scan_batches, data, verify, True, (), False, window))
    same_outcome(RB, lambda m: outcome(m.check_records, data[61:], count, (), False, window, pos * 10**9))
    for edit in ("set_base_offset", "set_log_append_time"):

        def call(m, edit=edit):
            copy = bytearray(data)
            return outcome(getattr(m, edit), copy, pos, 12345), bytes(copy)

        same_outcome(RB, call)


@SETTINGS
@given(noise=st.binary(max_size=64), count=st.integers(0, 9))
def test_decode_records_agree_on_varint_noise(noise, count):
    # Bytes heavy in continuation bits exercise the 5- and 10-byte varint limits and truncation.
    data = bytes(b | 0x80 if i % 3 else b for i, b in enumerate(noise))
    same_outcome(RB, lambda m: outcome(m.decode_records, data, count))
    same_outcome(RB, lambda m: outcome(m.decode_records, noise, count))
    checked = same_outcome(RB, lambda m: outcome(m.check_records, data, count))
    # check_records accepts exactly what decode_records accepts, except that it does not check keys for UTF-8
    decoded = same_outcome(RB, lambda m: outcome(m.decode_records, data, count))
    assert checked[0] == "ok" or decoded[0] != "ok"
    if decoded[0] == "ok":
        assert checked == ("ok", count)
    elif checked[0] == "ok":
        assert "UTF-8" in decoded[1]


@SETTINGS
@given(ints=st.lists(WIDE, min_size=11, max_size=11), records=st.binary(max_size=20))
def test_recbatch_integer_arguments_agree(ints, records):
    same_outcome(RB, lambda m: outcome(m.build_batch, ints[0], ints[1], ints[2], records, *ints[3:]))
    same_outcome(RB, lambda m: outcome(m.encode_record, ints[0], ints[1], records, None, []))
    same_outcome(RB, lambda m: outcome(m.decode_records, records, ints[0]))
    same_outcome(RB, lambda m: outcome(m.parse_header, bytes(100), ints[0]))
    same_outcome(RB, lambda m: outcome(m.count_records, bytes(100), ints[0], ints[1]))
    same_outcome(RB, lambda m: outcome(m.check_records, records, ints[0]))
    same_outcome(RB, lambda m: outcome(m.check_records, records, 0, (), False, (ints[1], ints[2]), ints[3]))
    same_outcome(RB, lambda m: outcome(m.scan_batches, records, False, True, (), False, (ints[4], ints[5])))


@pytest.mark.parametrize("bad", [None, "text", 3, b"bytes-header-key", ("k",)])
def test_recbatch_bad_argument_types_agree(bad):
    same_outcome(RB, lambda m: outcome(m.encode_record, 0, 0, bad, None, []))
    same_outcome(RB, lambda m: outcome(m.encode_record, 0, 0, None, None, [(bad, b"")]))
    same_outcome(RB, lambda m: outcome(m.scan_batches, bad))
    same_outcome(RB, lambda m: outcome(m.check_records, bad, 0))
    same_outcome(RB, lambda m: outcome(m.check_records, b"", bad))
    same_outcome(RB, lambda m: outcome(m.build_batch, 0, 0, 0, bad, 0, 0))
    same_outcome(RB, lambda m: outcome(m.set_base_offset, bytes(100), 0, 1))  # read-only buffer
    same_outcome(RB, lambda m: outcome(m.parse_header, bytes(100), 1.5))


# --- recbatch.has_header: records with random headers, names that are and are not among them ----------------

DELAY_KEYS = (
    b"DELAY",
    b"__STARTDELIVERTIME",
    b"TIMER_DELIVER_MS",
    b"mqk-deliver-at",
    b"TIMER_DELAY_SEC",
    b"TIMER_DELAY_MS",
    b"mqk-delay-ms",
)
header_key_st = st.one_of(
    st.text(max_size=8),
    st.sampled_from([k.decode() for k in DELAY_KEYS]),
    st.sampled_from(["DELAYX", "DELA", "mqk-delay-m", "n" * 70]),
)
headed_records_st = st.lists(
    st.tuples(
        I32,
        I64,
        st.none() | st.binary(max_size=40),
        st.none() | st.binary(max_size=40),
        st.lists(st.tuples(header_key_st, st.none() | st.binary(max_size=8)), max_size=4),
    ),
    max_size=8,
)
names_st = st.one_of(st.just(DELAY_KEYS), st.lists(header_key_st.map(str.encode), max_size=4).map(tuple))


@pytest.mark.parametrize("rb", RB, ids=ids(RB))
@SETTINGS
@given(fields=batch_fields_st, records=headed_records_st, names=names_st, lead=st.integers(0, 5))
def test_has_header_matches_reference(rb, fields, records, names, lead):
    fields = dict(fields, count=len(records))
    batch = ref_batch(fields, b"".join(ref_record(*r) for r in records))
    expected = any(hk.encode() in names for *_, headers in records for hk, _ in headers)
    # and the same answer from the decoded records, as the timer used to get it
    decoded = rb.decode_records(batch[61:], len(records))
    assert expected == any(hk.encode() in names for *_, headers in decoded for hk, _ in headers)
    buf = bytes(lead) + batch + bytes(lead)
    assert rb.has_header(buf, lead, len(batch), names) is expected
    # the produce check's walk answers the same question for every uncompressed batch it scans
    assert rb.scan_batches(batch, True, True, names)[0][10] is expected
    assert rb.check_records(batch[61:], len(records), names) is expected


@SETTINGS
@given(buf=damaged_batches(), pos=st.integers(-3, 300), size=st.integers(-3, 400), names=names_st)
def test_has_header_outcomes_agree_on_damaged_input(buf, pos, size, names):
    data = bytes(buf)
    same_outcome(RB, lambda m: outcome(m.has_header, data, pos, size, names))
    whole = same_outcome(RB, lambda m: outcome(m.has_header, data, 0, len(data), names))
    if len(data) < 61 or data[22] & 0x07:
        assert whole[0] == "Corrupt"
        return
    # has_header accepts exactly what decode_records accepts, except that it does not check keys for UTF-8
    count = struct.unpack_from(">i", data, 57)[0]
    decoded = same_outcome(RB, lambda m: outcome(m.decode_records, data[61:], count))
    if decoded[0] == "ok":
        assert whole == ("ok", any(hk.encode() in names for *_, headers in decoded[1] for hk, _ in headers))
    elif whole[0] == "ok":
        assert decoded[0] == "Corrupt" and "UTF-8" in decoded[1]
    else:
        assert whole[0] == decoded[0] == "Corrupt"


@SETTINGS
@given(ints=st.lists(WIDE, min_size=2, max_size=2))
def test_has_header_integer_arguments_agree(ints):
    same_outcome(RB, lambda m: outcome(m.has_header, bytes(100), ints[0], ints[1], DELAY_KEYS))


@pytest.mark.parametrize("bad", [None, "text", 3, [b"DELAY"], ("DELAY",), (b"DELAY", 1), b"DELAY", 1.5])
def test_has_header_bad_argument_types_agree(bad):
    batch = ref_batch(
        {
            "base_offset": 0,
            "leader_epoch": 0,
            "attributes": 0,
            "last_offset_delta": 0,
            "base_ts": 0,
            "max_ts": 0,
            "pid": -1,
            "epoch": -1,
            "seq": -1,
            "count": 0,
        },
        b"",
    )
    assert same_outcome(RB, lambda m: outcome(m.has_header, batch, 0, len(batch), bad))[0] == "TypeError"
    same_outcome(RB, lambda m: outcome(m.has_header, bad, 0, 61, DELAY_KEYS))
    same_outcome(RB, lambda m: outcome(m.has_header, batch, bad, 61, DELAY_KEYS))


@pytest.mark.parametrize("walk", [True, False], ids=["has_header", "regex"])
@SETTINGS
@given(
    records=headed_records_st,
    values=st.lists(st.sampled_from([b"0", b"3", b"250", b"99", b"x", b""]), min_size=40, max_size=40),
)
def test_batch_due_time_equals_decoding_every_record(walk, records, values):
    # batch_due_time skips decoding when no record names a delay header; that must never change its answer
    from mqk.timer import delay

    # without the extensions, exercise the walk through the twin
    walk_module = twin("recbatch") if walk and delay.recbatch.__name__.endswith("_py") else delay.recbatch
    rb = twin("recbatch")
    vals = iter(values * 2)
    records = [(od, 0, k, v, [(hk, next(vals)) for hk, _ in hs]) for od, _, k, v, hs in records]
    batch = ref_batch(
        {
            "base_offset": 0,
            "leader_epoch": 0,
            "attributes": 0,
            "last_offset_delta": max(len(records) - 1, 0),
            "base_ts": 0,
            "max_ts": 0,
            "pid": -1,
            "epoch": -1,
            "seq": -1,
            "count": len(records),
        },
        b"".join(ref_record(*r) for r in records),
    )
    now = 1_000_000
    expected = None
    for *_, headers in rb.decode_records(batch[61:], len(records)):
        at = delay.due_time(dict(headers), now)
        if at is not None and (expected is None or at > expected):
            expected = at
    saved = delay._WALK_HEADERS, delay.recbatch
    try:
        delay._WALK_HEADERS, delay.recbatch = walk, walk_module
        assert delay.batch_due_time(batch, now) == expected
        assert delay.batch_due_time(memoryview(batch), now) == expected
    finally:
        delay._WALK_HEADERS, delay.recbatch = saved


# --- clentry -------------------------------------------------------------------------------------------

entry_st = st.fixed_dictionaries(
    {
        "topic": st.text(max_size=20).map(str.encode),
        "queue_id": I32,
        "queue_offset": I64,
        "physical_offset": I64,
        "store_ts": I64,
        "max_ts": I64,
        "tags": I64,
        "flags": I32,
        "count": I32,
        "body": st.binary(min_size=61, max_size=150),
        "pos": st.integers(0, 20),
        "slack": st.integers(0, 20),
    }
)


def ref_entry(e: dict) -> bytes:
    body = struct.pack(">q", e["queue_offset"]) + e["body"][8:]
    size = 66 + len(e["topic"]) + len(body)
    after_crc = (
        struct.pack(
            ">iiqqiqqqH",
            e["queue_id"],
            e["flags"],
            e["queue_offset"],
            e["physical_offset"],
            e["count"],
            e["store_ts"],
            e["max_ts"],
            e["tags"],
            len(e["topic"]),
        )
        + e["topic"]
        + body
    )
    return struct.pack(">iII", size, 0xDAA320A7, crc32c(after_crc)) + after_crc


@pytest.mark.parametrize("ce", CE, ids=ids(CE))
@SETTINGS
@given(e=entry_st)
def test_clentry_matches_reference(ce, e):
    expected = ref_entry(e)
    head = bytearray(ce.head_size(len(e["topic"])) + e["slack"])
    size = ce.encode_head(
        head,
        e["topic"],
        e["queue_id"],
        e["queue_offset"],
        e["physical_offset"],
        e["store_ts"],
        e["max_ts"],
        e["tags"],
        e["flags"],
        e["count"],
        e["body"],
    )
    assert size == len(expected) == ce.entry_size(len(e["topic"]), len(e["body"]))
    n = ce.head_size(len(e["topic"]))
    assert bytes(head[:n]) + e["body"][8:] == expected and not any(head[n:])
    buf = bytearray(e["pos"]) + expected + bytearray(e["slack"])
    assert ce.read_entry(buf, e["pos"], e["pos"] + size) == (
        1,
        size,
        e["queue_id"],
        e["flags"],
        e["queue_offset"],
        e["physical_offset"],
        e["count"],
        e["store_ts"],
        e["max_ts"],
        e["tags"],
        e["topic"].decode(),
        e["pos"] + 66 + len(e["topic"]),
    )
    if e["slack"] >= 8:
        at = e["pos"] + size
        buf[at : at + 8] = ce.blank_head(e["slack"])
        assert ce.read_entry(buf, at, len(buf))[:2] == (2, e["slack"])


@SETTINGS
@given(
    e=entry_st,
    flip=st.integers(0, 400),
    xor=st.integers(1, 255),
    cut=st.integers(0, 300),
    pos=st.integers(-2, 300),
    limit=st.integers(-2, 400),
    verify=st.booleans(),
    noise=st.binary(max_size=120),
)
def test_clentry_outcomes_agree_on_damaged_input(e, flip, xor, cut, pos, limit, verify, noise):
    entry = bytearray(ref_entry(e))
    entry[flip % len(entry)] ^= xor
    for buf in (bytes(entry), bytes(entry[:cut]), noise, struct.pack(">iI", cut - 100, 0xCBD43194) + noise):
        same_outcome(CE, lambda m, buf=buf: outcome(m.read_entry, buf, 0, len(buf), verify))
        same_outcome(CE, lambda m, buf=buf: outcome(m.read_entry, buf, pos, limit, verify))

    def head(m):
        out = bytearray(cut % 100)
        return outcome(
            m.encode_head,
            out,
            e["topic"],
            e["queue_id"],
            e["queue_offset"],
            e["physical_offset"],
            e["store_ts"],
            e["max_ts"],
            e["tags"],
            e["flags"],
            e["count"],
            noise,
        ), bytes(out)

    same_outcome(CE, head)
    same_outcome(CE, lambda m: outcome(m.blank_head, limit))
    same_outcome(CE, lambda m: outcome(m.entry_size, pos * 1000, limit))


@SETTINGS
@given(ints=st.lists(WIDE, min_size=9, max_size=9))
def test_clentry_integer_arguments_agree(ints):
    same_outcome(CE, lambda m: outcome(m.entry_size, ints[0], ints[1]))
    same_outcome(CE, lambda m: outcome(m.read_entry, bytes(100), ints[0], ints[1]))
    same_outcome(CE, lambda m: outcome(m.blank_head, ints[0]))

    def head(m):
        out = bytearray(100)
        return outcome(m.encode_head, out, b"t", *ints[1:], bytes(61)), bytes(out)

    same_outcome(CE, head)


# --- cqunit --------------------------------------------------------------------------------------------


@st.composite
def queues(draw):
    """Units sorted by base offset with random gaps and counts, max_timestamp a running maximum."""
    n = draw(st.integers(0, 40))
    base = draw(st.integers(-(2**40), 2**40))
    ts = draw(st.integers(-(2**40), 2**40))
    units = []
    for _ in range(n):
        count = draw(st.integers(0, 8))
        ts = max(ts, ts + draw(st.sampled_from([0, 0, 1, 1000])))
        units.append((draw(I64), draw(st.integers(0, 2**31 - 1)), count, draw(I64), draw(I64), ts, base))
        base += count + draw(st.sampled_from([0, 0, 0, 1, 7]))
    return units


def ref_units(units) -> bytes:
    return b"".join(struct.pack(">qiiqqqq", *u) for u in units)


def ref_search_offset(units, offset):
    if not units:
        return 0
    if offset < units[0][6]:
        return -1
    for i, u in enumerate(units):
        if offset < u[6] + u[2]:
            return i
    return len(units)


def ref_search_timestamp(units, ts):
    return next((i for i, u in enumerate(units) if u[5] >= ts), len(units))


@pytest.mark.parametrize("cq", CQ, ids=ids(CQ))
@SETTINGS
@given(units=queues(), probes=st.lists(I64, max_size=10), near=st.integers(-3, 3))
def test_cqunit_matches_reference(cq, units, probes, near):
    expected = ref_units(units)
    buf = bytearray(len(expected) + 48)
    for i, u in enumerate(units):
        cq.pack_unit(buf, 48 * i, *u)
    assert bytes(buf[: len(expected)]) == expected and not any(buf[len(expected) :])
    assert [cq.unpack_unit(buf, 48 * i) for i in range(len(units))] == units
    offsets = list(probes) + [u[6] + d for u in units for d in (near, u[2] - 1, u[2])]
    for o in offsets:
        if -(2**63) <= o < 2**63:
            assert cq.search_offset(buf, len(units), o) == ref_search_offset(units, o), o
    stamps = list(probes) + [u[5] + near for u in units]
    for t in stamps:
        if -(2**63) <= t < 2**63:
            assert cq.search_timestamp(buf, len(units), t) == ref_search_timestamp(units, t), t


@SETTINGS
@given(noise=st.binary(max_size=48 * 6), n=st.integers(-2, 8), probe=WIDE, pos=st.integers(-2, 300))
def test_cqunit_outcomes_agree_on_arbitrary_bytes(noise, n, probe, pos):
    # On arbitrary (unsorted) units the searches still must agree exactly, and never read past the buffer.
    same_outcome(CQ, lambda m: outcome(m.search_offset, noise, n, probe))
    same_outcome(CQ, lambda m: outcome(m.search_timestamp, noise, n, probe))
    same_outcome(CQ, lambda m: outcome(m.unpack_unit, noise, pos))

    def pack(m):
        out = bytearray(noise)
        return outcome(m.pack_unit, out, pos, probe, n, probe, 1, 2, 3, probe), bytes(out)

    same_outcome(CQ, pack)


def java_hash(tag: str) -> int:
    data = tag.encode("utf-16-be", "surrogatepass")
    h = 0
    for (unit,) in struct.iter_unpack(">H", data):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - 2**32 if h >= 2**31 else h


@pytest.mark.parametrize("cq", CQ, ids=ids(CQ))
@SETTINGS
@given(tag=st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=30))
def test_hash_tag_matches_reference(cq, tag):
    assert cq.hash_tag(tag) == java_hash(tag)


# --- recbatch.new_buffer: a receive buffer (contents unspecified, so only size, type and refusals compare) ---


@pytest.mark.parametrize("size", [0, 1, 4096, 300_000, -1, 1.5, "8"])
def test_new_buffer_agrees(size):
    same_outcome(RB, lambda m: outcome(lambda n: (type(m.new_buffer(n)), len(m.new_buffer(n))), size))


@pytest.mark.parametrize(
    "buf", [memoryview(bytes(200))[::2], memoryview(bytearray(200)).cast("i"), __import__("array").array("q", [0] * 25)]
)
def test_buffers_of_other_shapes_agree(buf):
    # strided: refused (BufferError) by both; other item formats: read as their bytes by both
    same_outcome(RB, lambda m: outcome(m.parse_header, buf, 0))
    same_outcome(RB, lambda m: outcome(m.count_records, buf, 0, 100))
    same_outcome(CQ, lambda m: outcome(m.search_offset, buf, 2, 0))
