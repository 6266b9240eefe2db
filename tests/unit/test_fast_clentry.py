"""clentry kernels (CommitLog entry): round trips, the stamped base offset, CRC and magic checks, impossible sizes,
blank and end-of-data handling, and bounds. Every test runs on the twin and, when built, the compiled module."""
from __future__ import annotations

import errno
import os
import struct

import pytest
from crc32c import crc32c

from mqk._fast import compiled, twin
from mqk.errors import Corrupt, OutOfBounds

IMPLS = [pytest.param((twin("clentry"), twin("recbatch")), id="twin")]
if compiled("clentry") is not None and compiled("recbatch") is not None:
    IMPLS.append(pytest.param((compiled("clentry"), compiled("recbatch")), id="compiled"))


@pytest.fixture(params=IMPLS)
def impl(request):
    return request.param


def a_batch(rb, n=3):
    records = b"".join(rb.encode_record(i, i, b"k%d" % i, b"value-%d" % i, []) for i in range(n))
    return bytes(rb.build_batch(0, 1000, 1000 + n, records, n, n - 1))


def write(ce, rb, buf, pos=0, topic=b"orders", **kw):
    args = dict(queue_id=2, queue_offset=500, physical_offset=4096 + pos, store_timestamp=1_700_000_000_123,
                max_timestamp=1_700_000_000_456, tags_code=-12345, flags=0x11, record_count=3)
    args.update(kw)
    body = kw.pop("body", None) or a_batch(rb)
    args.pop("body", None)
    head = bytearray(ce.head_size(len(topic)))
    size = ce.encode_head(head, topic, args["queue_id"], args["queue_offset"], args["physical_offset"],
                          args["store_timestamp"], args["max_timestamp"], args["tags_code"], args["flags"],
                          args["record_count"], body)
    buf[pos:pos + size] = bytes(head) + body[8:]  # the entry: its head, then the batch after its base offset
    return size, body, args


def test_round_trip_and_layout(impl):
    ce, rb = impl
    buf = bytearray(4096)
    size, body, a = write(ce, rb, buf, pos=10)
    assert size == ce.entry_size(6, len(body)) == 66 + 6 + len(body)
    entry = ce.read_entry(buf, 10, len(buf))
    assert entry == (1, size, 2, 0x11, 500, 4106, 3, 1_700_000_000_123, 1_700_000_000_456, -12345, "orders",
                     10 + 66 + 6)
    # the layout, field by field, as documented
    fixed = struct.unpack_from(">iIIiiqqiqqqH", buf, 10)
    assert fixed[0] == size and fixed[1] == ce.MAGIC_MESSAGE == 0xDAA320A7
    assert fixed[2] == crc32c(bytes(buf[10 + 12:10 + size]))
    assert fixed[3:] == (2, 0x11, 500, 4106, 3, 1_700_000_000_123, 1_700_000_000_456, -12345, 6)
    # the stored batch now carries base offset = queue offset and is still valid
    stored = bytes(buf[entry[11]:10 + size])
    assert rb.parse_header(stored)[0] == 500 and stored[8:] == body[8:]
    assert rb.scan_batches(stored)[0][4] == 3


def test_unicode_topic(impl):
    ce, rb = impl
    buf = bytearray(1024)
    topic = "tópico-ü".encode()
    write(ce, rb, buf, topic=topic)
    assert ce.read_entry(buf, 0, len(buf))[10] == "tópico-ü"


def test_crc_mismatch_detected_for_every_byte_and_skippable(impl):
    ce, rb = impl
    buf = bytearray(512)
    size, _, _ = write(ce, rb, buf)
    for i in range(12, size):
        buf[i] ^= 0x40
        try:
            with pytest.raises(Corrupt) as err:
                ce.read_entry(buf, 0, len(buf))
            assert err.value.position == 0
        finally:
            buf[i] ^= 0x40
    buf[size - 1] ^= 0x40
    assert ce.read_entry(buf, 0, len(buf), verify=False)[0] == 1
    assert ce.read_entry(buf, 0, len(buf), False)[0] == 1


def test_bad_magic_and_impossible_sizes(impl):
    ce, rb = impl
    buf = bytearray(512)
    size, _, _ = write(ce, rb, buf)
    bad = bytearray(buf)
    struct.pack_into(">I", bad, 4, 0x12345678)
    with pytest.raises(Corrupt, match="magic"):
        ce.read_entry(bad, 0, len(bad))
    with pytest.raises(Corrupt, match="size"):
        ce.read_entry(buf, 0, size - 1)  # entry runs past the limit
    for impossible in (-5, 1, 65, 66 + 60):
        bad = bytearray(buf)
        struct.pack_into(">i", bad, 0, impossible)
        with pytest.raises(Corrupt):
            ce.read_entry(bad, 0, len(bad), verify=False)
    bad = bytearray(buf)
    struct.pack_into(">H", bad, 64, 0xFFFF)  # topic longer than the entry
    with pytest.raises(Corrupt):
        ce.read_entry(bad, 0, len(bad), verify=False)


def test_end_of_data_and_blank(impl):
    ce, rb = impl
    buf = bytearray(1000)
    assert ce.read_entry(buf, 0, len(buf))[:2] == (0, 0)
    size, _, _ = write(ce, rb, buf)
    assert ce.read_entry(buf, size, len(buf))[0] == 0
    buf[size:size + 8] = ce.blank_head(len(buf) - size)
    blank = ce.read_entry(buf, size, len(buf))
    assert blank[:2] == (2, len(buf) - size)
    assert struct.unpack_from(">iI", buf, size) == (len(buf) - size, ce.MAGIC_BLANK)
    # fewer than BLANK_MIN_SIZE bytes before the limit can hold no entry
    assert ce.read_entry(buf, 0, 7)[0] == 0
    assert ce.read_entry(buf, len(buf), len(buf))[0] == 0
    with pytest.raises(Corrupt):
        ce.read_entry(buf, size, len(buf) - 1)  # blank claims more than the limit
    with pytest.raises(ValueError):
        ce.blank_head(7)
    with pytest.raises(OverflowError):
        ce.blank_head(2**31)


def test_bounds(impl):
    ce, rb = impl
    body = a_batch(rb)
    need = ce.entry_size(6, len(body))
    buf = bytearray(need)
    assert write(ce, rb, buf)[0] == need
    with pytest.raises(OutOfBounds):
        ce.read_entry(buf, 0, len(buf) + 1)
    with pytest.raises(OutOfBounds):
        ce.read_entry(buf, 10, 5)
    with pytest.raises(OutOfBounds):
        ce.read_entry(buf, -1, 5)
    with pytest.raises(ValueError):
        write(ce, rb, bytearray(need), body=body[:60])
    with pytest.raises(ValueError):
        ce.entry_size(70000, 10)
    with pytest.raises(ValueError):
        write(ce, rb, bytearray(70000 + need), topic=b"t" * 70000)
    with pytest.raises(TypeError):
        write(ce, rb, bytearray(need), topic="str-topic")


def test_entries_back_to_back(impl):
    ce, rb = impl
    buf = bytearray(4096)
    pos, offsets = 0, []
    for i in range(5):
        size, _, _ = write(ce, rb, buf, pos=pos, queue_offset=i * 3)
        offsets.append(pos)
        pos += size
    seen, p = [], 0
    while True:
        e = ce.read_entry(buf, p, len(buf))
        if e[0] == 0:
            break
        seen.append((p, e[4]))
        p += e[1]
    assert seen == [(o, i * 3) for i, o in enumerate(offsets)]


# --- encode_head / append_head: an entry written as its head + the batch's tail -----------------------------------

UNIT = struct.Struct(">qiiqqqq")


@pytest.mark.parametrize("records", [3, 400])  # 400 records: past 32 KiB, where the CRC runs without the GIL
def test_the_head_crc_covers_head_and_batch_tail(impl, records):
    ce, rb = impl
    body = a_batch(rb, records)
    head = bytearray(ce.head_size(6) + 10)
    size = ce.encode_head(head, b"orders", 2, 500, 4096, 1_700_000_000_123, 77, -12345, 0x11, 3, body)
    n = ce.head_size(6)
    assert n == 66 + 6 + 8 and size == ce.entry_size(6, len(body)) == n + len(body) - 8
    assert head[n:] == bytes(10)  # nothing past the head
    entry = bytes(head[:n]) + body[8:]
    assert struct.unpack_from(">I", entry, 8)[0] == crc32c(entry[12:])
    assert ce.read_entry(entry, 0, size)[4] == 500


def test_encode_head_bounds_and_bad_bodies_write_nothing(impl):
    ce, rb = impl
    body = a_batch(rb)
    head = bytearray(ce.head_size(6) - 1)
    with pytest.raises(OutOfBounds):
        ce.encode_head(head, b"orders", 0, 0, 0, 0, 0, 0, 0, 1, body)
    with pytest.raises(ValueError):
        ce.encode_head(bytearray(100), b"orders", 0, 0, 0, 0, 0, 0, 0, 1, body[:60])
    assert head == bytes(len(head))


def test_append_head_writes_what_encode_head_and_pack_unit_write(impl):
    ce, rb = impl
    records = b"".join(rb.encode_record(i, i, b"k", b"v" * 30, []) for i in range(4))
    # a compacted batch: 4 records over an offset span of 10 (last_offset_delta 9)
    body = bytes(rb.build_batch(0, 5000, 5009, records, 4, 9))
    head, cq = bytearray(200), bytearray(200)
    got = ce.append_head(head, b"orders", 2, 500, 4096, 1_700_000_000_123, -12345, body, cq, 48, 9000)
    size = ce.entry_size(6, len(body))
    assert got == (size, 10, 9000)  # the running max stays where it was: this batch's max (5009) is below it
    # the same bytes as the two-step path: a head with record_count = span, flags 0, the batch's max timestamp
    ref = bytearray(200)
    ce.encode_head(ref, b"orders", 2, 500, 4096, 1_700_000_000_123, 5009, -12345, 0, 10, body)
    n = ce.head_size(6)
    entry_bytes = bytes(head[:n]) + body[8:]
    assert head == ref
    assert UNIT.unpack_from(cq, 48) == (4096, size, 10, -12345, 1_700_000_000_123, 9000, 500)
    assert cq[:48] == bytes(48) and cq[96:] == bytes(104)
    entry = ce.read_entry(entry_bytes, 0, size)
    assert entry[:10] == (1, size, 2, 0, 500, 4096, 10, 1_700_000_000_123, 5009, -12345)
    assert struct.unpack_from(">q", entry_bytes, entry[11])[0] == 500  # the stored batch's base offset
    # a later batch with a higher max timestamp raises the running max
    assert ce.append_head(head, b"orders", 2, 510, 4096 + size, 1, 0, body, cq, 96, 100)[2] == 5009


def test_append_head_declines_what_is_not_exactly_one_batch_and_writes_nothing(impl):
    ce, rb = impl
    body = bytearray(a_batch(rb))
    two = bytes(body) * 2
    bad_magic = bytearray(body)
    bad_magic[16] = 1
    bad_length = bytearray(body)
    struct.pack_into(">i", bad_length, 8, len(body) - 12 + 1)
    negative_delta = bytearray(body)
    struct.pack_into(">i", negative_delta, 23, -1)
    max_delta = bytearray(body)
    struct.pack_into(">i", max_delta, 23, 2**31 - 1)  # a span of 2**31 does not fit the entry's record count
    negative_count = bytearray(body)
    struct.pack_into(">i", negative_count, 57, -1)
    for bad in (body[:60], two, bad_magic, bad_length, negative_delta, max_delta, negative_count, body + b"x"):
        head, cq = bytearray(100), bytearray(48)
        assert ce.append_head(head, b"t", 0, 0, 0, 0, 0, bytes(bad), cq, 0, -1) is None
        assert head == bytes(100) and cq == bytes(48)


def test_append_head_bounds_write_nothing(impl):
    ce, rb = impl
    body = a_batch(rb)
    need = ce.head_size(1)
    for head_len, cq_len, cq_pos in ((need - 1, 48, 0), (need, 47, 0), (need, 96, 49), (need, 48, -1)):
        head, cq = bytearray(head_len), bytearray(cq_len)
        with pytest.raises(OutOfBounds):
            ce.append_head(head, b"t", 0, 0, 0, 0, 0, body, cq, cq_pos, -1)
        assert head == bytes(head_len) and cq == bytes(cq_len)
    with pytest.raises(OverflowError):
        ce.append_head(bytearray(need), b"t", 2**31, 0, 0, 0, 0, body, bytearray(48), 0, -1)
    with pytest.raises(TypeError):
        ce.append_head(bytearray(need), "t", 0, 0, 0, 0, 0, body, bytearray(48), 0, -1)


def test_append_head_compiled_and_twin_agree_on_arbitrary_bodies():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    impls = [m for m in (compiled("clentry"), twin("clentry")) if m is not None]  # the twin alone if not built
    rb = twin("recbatch")
    good = a_batch(rb, 5)

    @settings(max_examples=300, deadline=None)
    @given(flips=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 255)), max_size=4),
           cut=st.integers(0, 8), ints=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=6, max_size=6),
           cq_pos=st.integers(-2, 60), head_len=st.integers(75, 90))
    def check(flips, cut, ints, cq_pos, head_len):
        body = bytearray(good[: len(good) - cut])
        for at, value in flips:
            body[at] = value
        results = []
        for m in impls:
            head, cq = bytearray(head_len), bytearray(100)
            try:
                r = ("ok", m.append_head(head, b"topic", ints[0] % 2**32 - 2**31, ints[1], ints[2], ints[3],
                                         ints[4], bytes(body), cq, cq_pos, ints[5]))
            except (OutOfBounds, OverflowError, ValueError) as exc:
                r = (type(exc).__name__, str(exc))
            results.append((r, bytes(head), bytes(cq)))
        assert all(r == results[0] for r in results)

    check()


# --- write_entry: head and batch tail into a file in one pwritev -----------------------------------------------


def test_write_entry_puts_head_and_batch_tail_into_the_file(impl, tmp_path):
    ce, rb = impl
    body = a_batch(rb, 5)
    head = bytearray(200)
    size = ce.encode_head(head, b"orders", 2, 500, 4096, 1_700_000_000_123, 77, -12345, 0, 5, body)
    ref = bytes(head[:ce.head_size(6)]) + body[8:]
    path = tmp_path / "log"
    path.write_bytes(b"\xee" * 3000)
    fd = os.open(path, os.O_RDWR)
    try:
        assert ce.write_entry(fd, 100, head, ce.head_size(6), memoryview(body)) is None
    finally:
        os.close(fd)
    data = path.read_bytes()
    assert data[:100] == b"\xee" * 100 and data[100:100 + size] == bytes(ref[:size])
    assert data[100 + size:] == b"\xee" * (3000 - 100 - size)


def test_twin_write_entry_finishes_a_short_write(tmp_path, monkeypatch):
    """The twin's loop over short writes (the compiled kernel's is the same loop over pwritev(2) itself)."""
    ce = twin("clentry")
    body = a_batch(twin("recbatch"))
    real = os.pwritev
    calls = []

    def short(fd, parts, pos):
        calls.append(pos)
        data = b"".join(bytes(p) for p in parts)
        return real(fd, [data[:7]], pos)

    monkeypatch.setattr(os, "pwritev", short)
    path = tmp_path / "log"
    path.write_bytes(bytes(400))
    fd = os.open(path, os.O_RDWR)
    try:
        ce.write_entry(fd, 0, b"0123456789AB", 10, body)
    finally:
        os.close(fd)
    expected = b"0123456789" + body[8:]
    assert path.read_bytes()[: len(expected)] == expected
    assert calls[:3] == [0, 7, 14] and len(calls) == -(-len(expected) // 7)


def test_write_entry_errors(impl, tmp_path):
    ce, rb = impl
    body = a_batch(rb)
    for head_len, bad_body, pos in ((-1, body, 0), (11, body, 0), (10, body[:7], 0), (10, body, -1)):
        with pytest.raises(OutOfBounds):
            ce.write_entry(0, pos, bytes(10), head_len, bad_body)
    path = tmp_path / "ro"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as info:
            ce.write_entry(fd, 0, bytes(10), 10, body)
        assert info.value.errno == errno.EBADF
    finally:
        os.close(fd)


# --- put_entry: append_head and write_entry in one call -----------------------------------------------------------


def test_put_entry_writes_the_entry_to_the_file_and_its_unit(impl, tmp_path):
    ce, rb = impl
    body = a_batch(rb, 5)
    path = tmp_path / "log"
    path.write_bytes(b"\xee" * 3000)
    head, cq = bytearray(200), bytearray(96)
    ref_head, ref_cq = bytearray(200), bytearray(96)
    expected = ce.append_head(ref_head, b"orders", 2, 500, 4196, 7, 3, body, ref_cq, 48, 1)
    fd = os.open(path, os.O_RDWR)
    try:
        assert ce.put_entry(fd, 100, head, b"orders", 2, 500, 4196, 7, 3, body, cq, 48, 1) == expected
        # not exactly one batch: None, and neither the file nor the unit is touched
        assert ce.put_entry(fd, 2000, bytearray(200), b"orders", 2, 0, 0, 0, 0, body + b"x", bytearray(48), 0,
                            -1) is None
    finally:
        os.close(fd)
    size = expected[0]
    data = path.read_bytes()
    assert (head, cq) == (ref_head, ref_cq)
    assert data[100:100 + size] == bytes(head[:ce.head_size(6)]) + body[8:]
    assert data[:100] + data[100 + size:] == b"\xee" * (3000 - size)
    assert ce.read_entry(data, 100, 3000)[:5] == (1, size, 2, 0, 500)


def test_put_entry_errors(impl, tmp_path):
    ce, rb = impl
    body = a_batch(rb)
    head, cq = bytearray(100), bytearray(48)
    with pytest.raises(OutOfBounds):  # a negative position is refused before anything is written
        ce.put_entry(0, -1, head, b"t", 0, 0, 0, 0, 0, body, cq, 0, -1)
    assert head == bytes(100) and cq == bytes(48)
    with pytest.raises(OutOfBounds):
        ce.put_entry(0, 0, bytearray(10), b"t", 0, 0, 0, 0, 0, body, cq, 0, -1)
    with pytest.raises(OSError) as bad_fd:  # refused before the head or the unit is built
        ce.put_entry(-1, 0, head, b"t", 0, 0, 0, 0, 0, body, cq, 0, -1)
    assert bad_fd.value.errno == errno.EBADF and head == bytes(100) and cq == bytes(48)
    path = tmp_path / "ro"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as info:
            ce.put_entry(fd, 0, head, b"t", 0, 0, 0, 0, 0, body, cq, 0, -1)
        assert info.value.errno == errno.EBADF
    finally:
        os.close(fd)
    assert path.read_bytes() == b""


# --- write_entries: consecutive entries in one pwritev ------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 3, 700])  # 700: more than one pwritev's worth (WRITE_ENTRIES_CHUNK)
def test_write_entries_writes_what_write_entry_writes_one_by_one(impl, tmp_path, count):
    ce, rb = impl
    bodies = [memoryview(a_batch(rb, 1 + i % 4)) for i in range(count)]
    hl = ce.head_size(6)
    heads = bytearray(hl * count + 5)
    pos = 100
    ref = tmp_path / "ref"
    ref.write_bytes(b"\xee" * 100)
    fd_ref = os.open(ref, os.O_RDWR)
    at = pos
    for i, body in enumerate(bodies):
        head = memoryview(heads)[i * hl:(i + 1) * hl]
        size = ce.encode_head(head, b"orders", 1, i, at, 7, 7, 0, 0, 1, body)
        ce.write_entry(fd_ref, at, head, hl, body)
        at += size
    os.close(fd_ref)
    got = tmp_path / "got"
    got.write_bytes(b"\xee" * 100)
    fd = os.open(got, os.O_RDWR)
    try:
        assert ce.write_entries(fd, pos, heads, hl, bodies) is None
    finally:
        os.close(fd)
    assert got.read_bytes() == ref.read_bytes() and len(got.read_bytes()) == at


def _write_calls() -> int:
    """Write system calls this thread has made (pwritev included)."""
    with open("/proc/thread-self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("syscw:"))


def test_write_entries_writes_at_most_write_bytes_chunk_per_call_unless_an_entry_is_larger(impl, tmp_path):
    ce, _rb = impl
    assert ce.WRITE_BYTES_CHUNK == 1 << 20
    # three that do not fit two to a call, one larger than a call on its own, two small ones together
    sizes = [600_000, 600_000, 600_000, ce.WRITE_BYTES_CHUNK + 500_000, 1000, 1000]
    bodies = [bytes([i + 1]) * n for i, n in enumerate(sizes)]
    hl = 20
    heads = bytes(range(hl)) * len(bodies)
    path = tmp_path / "f"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDWR)
    try:
        before = _write_calls()
        ce.write_entries(fd, 0, heads, hl, bodies)
        assert _write_calls() - before == 5
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(heads[i * hl:(i + 1) * hl] + b[8:] for i, b in enumerate(bodies))


def test_write_entries_refuses_bad_arguments_before_writing(impl, tmp_path):
    ce, rb = impl
    body = a_batch(rb)
    path = tmp_path / "f"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDWR)
    try:
        for pos, heads, head_len, bodies in ((-1, bytes(20), 10, [body]), (0, bytes(19), 10, [body, body]),
                                             (0, bytes(20), 0, [body]), (0, bytes(20), 10, [body, b"1234567"])):
            with pytest.raises(OutOfBounds):
                ce.write_entries(fd, pos, heads, head_len, bodies)
        assert ce.write_entries(fd, 0, b"", 10, []) is None
    finally:
        os.close(fd)
    assert path.read_bytes() == b""
    ro = tmp_path / "ro"
    ro.write_bytes(b"")
    fd = os.open(ro, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as info:
            ce.write_entries(fd, 0, bytes(10), 10, [body])
        assert info.value.errno == errno.EBADF
    finally:
        os.close(fd)


def test_twin_write_entries_finishes_short_writes_across_entries(tmp_path, monkeypatch):
    ce = twin("clentry")
    rb = twin("recbatch")
    bodies = [a_batch(rb, 1), a_batch(rb, 2)]
    real = os.pwritev

    def short(fd, parts, pos):
        data = b"".join(bytes(p) for p in parts)
        return real(fd, [data[:50]], pos)

    monkeypatch.setattr(os, "pwritev", short)
    path = tmp_path / "log"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDWR)
    try:
        ce.write_entries(fd, 0, b"A" * 12 + b"B" * 12, 12, bodies)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"A" * 12 + bodies[0][8:] + b"B" * 12 + bodies[1][8:]


# --- append_run: the file store's run of single-batch entries ----------------------------------------------------


class _File:
    """A ConsumeQueue file as append_run sees it (MappedFile's positions and buffer)."""

    __slots__ = ("buf", "committed", "reserved", "wrote")

    def __init__(self, size: int, wrote: int, reserved: int, view: bool = False) -> None:
        self.buf = memoryview(bytearray(size)) if view else bytearray(size)  # MappedFile's is a memoryview
        self.wrote = self.committed = wrote
        self.reserved = reserved


class _Files:
    __slots__ = ("files",)

    def __init__(self, files: list) -> None:
        self.files = files


class _Queue:
    __slots__ = ("dirty_since_ms", "dirty_since_phys", "end_offset", "max_ts", "mfq")

    def __init__(self, files: list, end_offset: int, max_ts: int, dirty_since_phys: int) -> None:
        self.mfq = _Files(files)
        self.end_offset = end_offset
        self.max_ts = max_ts
        self.dirty_since_phys = dirty_since_phys
        self.dirty_since_ms = 0


class _Shard:
    __slots__ = ("cq", "log_start")

    def __init__(self, cq: _Queue, log_start: int) -> None:
        self.cq = cq
        self.log_start = log_start


class _Result(tuple):
    """Stands in for AppendResult (a tuple subclass built with tuple.__new__)."""


def _run_state(spec: dict) -> tuple[list, list]:
    """Fresh shards (None where the spec says) and entries from a generated spec."""
    shards = []
    for q, (present, units_free, files, end, max_ts, dirty) in enumerate(spec["queues"]):
        if not present:
            shards.append(None)
            continue
        file_list = [] if not files else [_File(48 * 8, 48 * 2, 48 * 2 + 48 * units_free, spec.get("views", False))]
        shards.append(_Shard(_Queue(file_list, end, max_ts, dirty), log_start=q * 3))
    return shards, [(queue, list(batches)) if not bad_shape else [queue, batches]
                    for queue, batches, bad_shape in spec["entries"]]


def _run_outcome(ce, spec: dict, tmp_path, name: str) -> tuple:
    shards, entries = _run_state(spec)
    path = tmp_path / name
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        out, grown, dirty = ["before"], [], set()
        heads = bytearray(ce.head_size(len(spec["topic"])) * spec["slots"])
        got = ce.append_run(fd, 1 << 20, spec["pos"], spec["seg_size"], shards, entries, spec["start"], heads,
                            spec["topic"], 1_700_000_000_999, out, grown, _Result, dirty)
    finally:
        os.close(fd)
    count, end, error = got
    state = [None if s is None else (s.cq.end_offset, s.cq.max_ts, s.cq.dirty_since_phys, s.cq.dirty_since_ms,
                                     [(bytes(f.buf), f.wrote, f.committed) for f in s.cq.mfq.files])
             for s in shards]
    written = path.read_bytes()
    return ((count, end, type(error).__name__), [(type(r).__name__, tuple(r)) if isinstance(r, tuple) else r
                                                 for r in out], grown,
            [q for q, s in enumerate(shards) if s is not None and s.cq in dirty],
            state, written if error is None else b"", bytes(heads[:count * ce.head_size(len(spec["topic"]))]))


@pytest.fixture
def prefetch_plan():
    """Sets the compiled kernel's prefetch plan for a test (a no-op on the twin), then puts back the file engine's."""
    from mqk.store.file import engine

    ce = compiled("clentry")
    yield (lambda *classes: ce.plan_prefetch(*classes)) if ce is not None else (lambda *classes: False)
    if ce is not None:
        assert ce.plan_prefetch(engine.Shard, engine.ConsumeQueue, engine.MappedFileQueue, engine.MappedFile)


@pytest.mark.parametrize("planned", [True, False], ids=["prefetch", "no-prefetch"])
def test_append_run_compiled_and_twin_agree(tmp_path, prefetch_plan, planned):
    """The same run, state and arguments through both builds: the same answer, the same published positions,
    units, heads and file bytes, including every way an entry stops a run; with the compiled kernel prefetching
    the run's objects (planned for these classes, so it walks odd queues, missing shards and empty file lists)
    and without."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    assert prefetch_plan(*((_Shard, _Queue, _Files, _File) if planned else (None,) * 4)) == (
        planned and compiled("clentry") is not None)
    impls = [m for m in (twin("clentry"), compiled("clentry")) if m is not None]  # the twin alone if not built
    rb = twin("recbatch")
    good = [a_batch(rb, n) for n in (1, 2, 5)]
    compacted = bytearray(good[2])
    struct.pack_into(">i", compacted, 23, 9)  # a span beyond its record count
    def rarely(usual, *unusual):
        """`usual`, or about one time in twenty one of the `unusual` ones: most entries join the run, and every way
        of stopping one still comes up."""
        return st.integers(0, 19).flatmap(lambda r: st.one_of(*unusual) if r == 0 else usual)

    bad_batch = st.sampled_from([bytes(compacted), good[0][:-1], b"", good[1] + b"x"])
    batches = rarely(st.lists(st.sampled_from(good), min_size=1, max_size=1),
                     st.lists(bad_batch, min_size=1, max_size=1), st.lists(st.sampled_from(good), max_size=3))
    queue = rarely(st.integers(0, 5), st.sampled_from([-1, 6, True, 1 << 70, "1"]))
    spec = st.fixed_dictionaries({
        "queues": st.lists(st.tuples(rarely(st.just(True), st.just(False)), rarely(st.integers(1, 4), st.just(0)),
                                     rarely(st.just(True), st.just(False)), st.integers(0, 1 << 40),
                                     st.integers(-1, 1 << 41), st.sampled_from([-1, 77])),
                           min_size=6, max_size=6),
        # the third field: a list instead of a (queue, batches) tuple
        "entries": st.lists(st.tuples(queue, batches, rarely(st.just(False), st.just(True))), max_size=10),
        "start": rarely(st.just(0), st.integers(1, 3)),
        "pos": st.integers(0, 300),
        "seg_size": rarely(st.integers(1200, 4000), st.integers(300, 1200)),
        "slots": rarely(st.just(12), st.integers(0, 4)),
        "topic": st.sampled_from([b"orders", b"", "é".encode() * 3]),
        "views": st.booleans(),
    })

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(spec=spec)
    def check(spec):
        outcomes = [_run_outcome(ce, spec, tmp_path, ce.__name__) for ce in impls]
        assert all(outcome == outcomes[0] for outcome in outcomes[1:])

    check()


@pytest.mark.parametrize("fail", [False, True])
def test_append_run_writes_stages_and_publishes(impl, tmp_path, fail):
    """A run of three queues (the fourth entry names the first queue again, so the run stops there): the file
    holds their entries back to back, each unit and end offset moves only once the write succeeded, and a failed
    write (ENOSPC) publishes nothing and leaves `out` untouched."""
    ce, rb = impl
    body = a_batch(rb, 2)
    spec = {"queues": [(True, 2, True, 10 * q, 5, -1) for q in range(3)], "topic": b"orders", "start": 0, "pos": 64,
            "seg_size": 4096, "slots": 8,
            "entries": [(0, [body], False), (1, [body], False), (2, [body], False), (0, [body], False)]}
    shards, entries = _run_state(spec)
    path = tmp_path / "seg"
    fd = os.open("/dev/full", os.O_WRONLY) if fail else os.open(path, os.O_RDWR | os.O_CREAT)
    out, grown, dirty = [], [], set()
    try:
        count, end, error = ce.append_run(fd, 1000, 64, 4096, shards, entries, 0, bytearray(400 * 8), b"orders",
                                          1234, out, grown, _Result, dirty)
    finally:
        os.close(fd)
    size = ce.entry_size(6, len(body))
    assert count == 3
    if fail:
        assert (end, error.errno, out, grown, dirty) == (64, errno.ENOSPC, [], [], set())
        assert [(s.cq.end_offset, s.cq.mfq.files[0].wrote) for s in shards] == [(0, 96), (10, 96), (20, 96)]
        return
    assert error is None and end == 64 + 3 * size
    assert [tuple(r) for r in out] == [(10 * q, 10 * q + 1, 1234, q * 3, 1064 + q * size) for q in range(3)]
    assert grown == [(q, 10 * q + 2) for q in range(3)]
    assert {id(s.cq) for s in shards} == {id(cq) for cq in dirty}
    assert [(s.cq.end_offset, s.cq.mfq.files[0].wrote, s.cq.mfq.files[0].committed, s.cq.dirty_since_phys)
            for s in shards] == [(10 * q + 2, 144, 144, 1064 + q * size) for q in range(3)]
    data = path.read_bytes()
    for q in range(3):
        entry = ce.read_entry(data, 64 + q * size, len(data))
        assert entry[:6] == (1, size, q, 0, 10 * q, 1064 + q * size)
        assert twin("cqunit").unpack_unit(shards[q].cq.mfq.files[0].buf, 96) == (
            1064 + q * size, size, 2, 0, 1234, entry[8], 10 * q)


@pytest.mark.parametrize("spare", [8, 7])
def test_append_run_leaves_room_for_a_blank_at_the_segment_end(impl, tmp_path, spare):
    """An entry joins the run only if BLANK_MIN_SIZE bytes stay free after it (the segment's end can always take
    a blank); with one byte fewer the run stops before it and nothing is staged or written."""
    ce, rb = impl
    body = a_batch(rb, 1)
    spec = {"queues": [(True, 1, True, 0, -1, -1)], "entries": [(0, [body], False)]}
    shards, entries = _run_state(spec)
    size = ce.entry_size(6, len(body))
    fd = os.open(tmp_path / "seg", os.O_RDWR | os.O_CREAT)
    try:
        count, end, error = ce.append_run(fd, 0, 100, 100 + size + spare, shards, entries, 0, bytearray(200),
                                          b"orders", 1, [], [], _Result, set())
    finally:
        os.close(fd)
    assert (count, end, error) == ((1, 100 + size, None) if spare == 8 else (0, 100, None))
    assert shards[0].cq.end_offset == (1 if spare == 8 else 0)


def test_prefetch_plan_takes_slot_classes_only(prefetch_plan):
    """The compiled kernel reads the planned classes' slots at their offsets, so it takes a plan only when every
    attribute it reads is a __slots__ member; anything else leaves it prefetching nothing. The twin never plans."""
    from mqk.store.file import engine

    class DictShard:  # attributes in an instance dict, no slot offsets
        def __init__(self) -> None:
            self.cq = self.log_start = None

    class PropertyFile:
        __slots__ = ("buf", "committed", "reserved")
        wrote = property(lambda self: 0)  # a property where a slot is expected

    # another class's slots (their offsets are that class's layout)
    borrowed = type("Borrowed", (), {name: _Shard.__dict__[name] for name in ("cq", "log_start")})

    built = compiled("clentry") is not None
    assert twin("clentry").plan_prefetch(_Shard, _Queue, _Files, _File) is False
    assert prefetch_plan(engine.Shard, engine.ConsumeQueue, engine.MappedFileQueue, engine.MappedFile) is built
    assert prefetch_plan(_Shard, _Queue, _Files, _File) is built
    assert prefetch_plan(DictShard, _Queue, _Files, _File) is False
    assert prefetch_plan(_Shard, _Queue, _Files, PropertyFile) is False
    assert prefetch_plan(_Shard, _Queue, _Files, "MappedFile") is False
    assert prefetch_plan(borrowed, _Queue, _Files, _File) is False


@pytest.mark.parametrize("bad", ["topic", "shards", "dirty"])
def test_append_run_refuses_the_argument_types_the_compiled_kernel_refuses(impl, bad):
    ce, _rb = impl
    args = {"shards": [], "entries": [], "topic": b"t", "out": [], "grown": [], "dirty": set()}
    args[bad] = {"topic": "t", "shards": type("Shards", (list,), {})(), "dirty": frozenset()}[bad]
    with pytest.raises(TypeError, match=bad):
        ce.append_run(0, 0, 0, 0, args["shards"], args["entries"], 0, bytearray(100), args["topic"], 0, args["out"],
                      args["grown"], _Result, args["dirty"])
