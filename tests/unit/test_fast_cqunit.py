"""cqunit kernels (ConsumeQueue unit): pack/unpack round trips, bounds, the offset and timestamp binary searches
(empty, gaps, before first, past last, duplicate max timestamps) checked against a linear scan, and hash_tag against
values Java's String.hashCode gives. Every test runs on the twin and, when built, the compiled module."""

from __future__ import annotations

import random
import struct

import pytest

from mqk._fast import compiled, twin
from mqk.errors import OutOfBounds

IMPLS = [pytest.param(twin("cqunit"), id="twin")]
if compiled("cqunit") is not None:
    IMPLS.append(pytest.param(compiled("cqunit"), id="compiled"))


@pytest.fixture(params=IMPLS)
def cq(request):
    return request.param


def units(cq, spans, max_ts=None):
    """A buffer of units from [(base_offset, record_count)], max timestamps as given or 10 * index."""
    buf = bytearray(48 * len(spans))
    for i, (base, count) in enumerate(spans):
        ts = max_ts[i] if max_ts else 10 * i
        cq.pack_unit(buf, 48 * i, 1000 * i, 100 + i, count, i - 5, ts - 1, ts, base)
    return buf


def linear_offset(spans, offset):
    if not spans:
        return 0
    if offset < spans[0][0]:
        return -1
    for i, (base, count) in enumerate(spans):
        if offset < base + count:
            return i  # inside the unit, or in the gap before it
    return len(spans)


def test_pack_unpack_layout(cq):
    buf = bytearray(100)
    cq.pack_unit(buf, 4, 2**63 - 1, 2**31 - 1, -1, -(2**63), 5, 6, 7)
    assert cq.unpack_unit(buf, 4) == (2**63 - 1, 2**31 - 1, -1, -(2**63), 5, 6, 7)
    assert struct.unpack_from(">qiiqqqq", buf, 4) == (2**63 - 1, 2**31 - 1, -1, -(2**63), 5, 6, 7)
    assert cq.UNIT_SIZE == 48


def test_bounds(cq):
    buf = bytearray(95)
    cq.pack_unit(buf, 47, 1, 2, 3, 4, 5, 6, 7)
    for pos in (48, -1, 95):
        with pytest.raises(OutOfBounds):
            cq.pack_unit(buf, pos, 1, 2, 3, 4, 5, 6, 7)
        with pytest.raises(OutOfBounds):
            cq.unpack_unit(buf, pos)
    with pytest.raises(OutOfBounds):
        cq.search_offset(buf, 2, 0)
    with pytest.raises(OutOfBounds):
        cq.search_timestamp(buf, -1, 0)
    with pytest.raises(OverflowError):
        cq.pack_unit(buf, 0, 1, 2**31, 3, 4, 5, 6, 7)


def test_search_offset_edges(cq):
    spans = [(10, 5), (15, 1), (20, 3), (30, 2)]  # gaps [16, 20) and [23, 30)
    buf = units(cq, spans)
    expect = {
        0: -1,
        9: -1,
        10: 0,
        14: 0,
        15: 1,
        16: 2,
        19: 2,
        20: 2,
        22: 2,
        23: 3,
        29: 3,
        30: 3,
        31: 3,
        32: 4,
        10**12: 4,
        -(2**63): -1,
        2**63 - 1: 4,
    }
    for offset, index in expect.items():
        assert cq.search_offset(buf, len(spans), offset) == index, offset
    assert cq.search_offset(b"", 0, 5) == 0
    assert cq.search_offset(buf, 0, 5) == 0
    assert cq.search_offset(buf, 1, 15) == 1  # only the first unit counts
    # a unit with no records (Kafka keeps empty batches after compaction) holds no offset
    buf = units(cq, [(0, 2), (2, 0), (3, 1)])
    assert [cq.search_offset(buf, 3, o) for o in range(5)] == [0, 0, 2, 2, 3]


def test_search_offset_random_against_linear_scan(cq):
    rng = random.Random(7)
    for _ in range(200):
        spans, base = [], rng.randrange(0, 50)
        for _ in range(rng.randrange(0, 20)):
            count = rng.randrange(1, 6)
            spans.append((base, count))
            base += count + rng.choice([0, 0, 0, 1, 4])
        buf = units(cq, spans)
        for offset in range(-2, base + 3):
            assert cq.search_offset(buf, len(spans), offset) == linear_offset(spans, offset)


def test_search_timestamp_edges(cq):
    max_ts = [100, 100, 200, 200, 200, 300]
    buf = units(cq, [(i, 1) for i in range(6)], max_ts)
    expect = {-(2**63): 0, 0: 0, 100: 0, 101: 2, 200: 2, 201: 5, 300: 5, 301: 6, 2**63 - 1: 6}
    for ts, index in expect.items():
        assert cq.search_timestamp(buf, 6, ts) == index, ts
    assert cq.search_timestamp(b"", 0, 5) == 0
    buf = units(cq, [(i, 1) for i in range(4)], [7, 7, 7, 7])
    assert cq.search_timestamp(buf, 4, 7) == 0 and cq.search_timestamp(buf, 4, 8) == 4


def test_search_timestamp_random_against_linear_scan(cq):
    rng = random.Random(11)
    for _ in range(200):
        n = rng.randrange(0, 25)
        ts, max_ts = 0, []
        for _ in range(n):
            ts += rng.choice([0, 0, 1, 5])
            max_ts.append(ts)
        buf = units(cq, [(i, 1) for i in range(n)], max_ts)
        for q in range(-1, ts + 2):
            assert cq.search_timestamp(buf, n, q) == next((i for i, t in enumerate(max_ts) if t >= q), n)


# Values Java gives for "<s>".hashCode() (computed with int32 arithmetic: s[0]*31^(n-1) + ... + s[n-1]).
JAVA_HASHES = {
    "": 0,
    "a": 97,
    "TagA": 2598919,
    "hello": 99162322,
    "Hello, World!": 1498789909,
    "polygenelubricants": -2147483648,
    "\U0001f600": 1772899,  # one code point, two UTF-16 units (D83D DE00)
    "é": 233,
}


@pytest.mark.parametrize("tag", list(JAVA_HASHES))
def test_hash_tag_matches_java(cq, tag):
    assert cq.hash_tag(tag) == JAVA_HASHES[tag]


def test_hash_tag_is_signed_int32(cq):
    rng = random.Random(3)
    for _ in range(200):
        tag = "".join(
            chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0xD800), rng.randrange(0x10000, 0x110000)]))
            for _ in range(rng.randrange(0, 40))
        )
        h = cq.hash_tag(tag)
        assert -(2**31) <= h < 2**31
        units16 = struct.unpack(f"<{len(tag.encode('utf-16-le')) // 2}H", tag.encode("utf-16-le"))
        ref = 0
        for u in units16:
            ref = (ref * 31 + u) % 2**32
        assert h == (ref - 2**32 if ref >= 2**31 else ref)
    with pytest.raises(TypeError):
        cq.hash_tag(b"bytes")
