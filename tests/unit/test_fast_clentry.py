"""clentry kernels (CommitLog entry): round trips, the stamped base offset, CRC and magic checks, impossible sizes,
blank and end-of-data handling, and bounds. Every test runs on the twin and, when built, the compiled module."""

from __future__ import annotations

import array
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
    args = {
        "queue_id": 2,
        "queue_offset": 500,
        "physical_offset": 4096 + pos,
        "store_timestamp": 1_700_000_000_123,
        "max_timestamp": 1_700_000_000_456,
        "tags_code": -12345,
        "flags": 0x11,
        "record_count": 3,
    }
    args.update(kw)
    body = kw.pop("body", None) or a_batch(rb)
    args.pop("body", None)
    head = bytearray(ce.head_size(len(topic)))
    size = ce.encode_head(
        head,
        topic,
        args["queue_id"],
        args["queue_offset"],
        args["physical_offset"],
        args["store_timestamp"],
        args["max_timestamp"],
        args["tags_code"],
        args["flags"],
        args["record_count"],
        body,
    )
    buf[pos : pos + size] = bytes(head) + body[8:]  # the entry: its head, then the batch after its base offset
    return size, body, args


def test_round_trip_and_layout(impl):
    ce, rb = impl
    buf = bytearray(4096)
    size, body, _a = write(ce, rb, buf, pos=10)
    assert size == ce.entry_size(6, len(body)) == 66 + 6 + len(body)
    entry = ce.read_entry(buf, 10, len(buf))
    assert entry == (
        1,
        size,
        2,
        0x11,
        500,
        4106,
        3,
        1_700_000_000_123,
        1_700_000_000_456,
        -12345,
        "orders",
        10 + 66 + 6,
    )
    # the layout, field by field, as documented
    fixed = struct.unpack_from(">iIIiiqqiqqqH", buf, 10)
    assert fixed[0] == size and fixed[1] == ce.MAGIC_MESSAGE == 0xDAA320A7
    assert fixed[2] == crc32c(bytes(buf[10 + 12 : 10 + size]))
    assert fixed[3:] == (2, 0x11, 500, 4106, 3, 1_700_000_000_123, 1_700_000_000_456, -12345, 6)
    # the stored batch now carries base offset = queue offset and is still valid
    stored = bytes(buf[entry[11] : 10 + size])
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
    buf[size : size + 8] = ce.blank_head(len(buf) - size)
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


def test_write_entry_puts_head_and_batch_tail_into_the_file(impl, tmp_path):
    ce, rb = impl
    body = a_batch(rb, 5)
    head = bytearray(200)
    size = ce.encode_head(head, b"orders", 2, 500, 4096, 1_700_000_000_123, 77, -12345, 0, 5, body)
    ref = bytes(head[: ce.head_size(6)]) + body[8:]
    path = tmp_path / "log"
    path.write_bytes(b"\xee" * 3000)
    fd = os.open(path, os.O_RDWR)
    try:
        assert ce.write_entry(fd, 100, head, ce.head_size(6), memoryview(body)) is None
    finally:
        os.close(fd)
    data = path.read_bytes()
    assert data[:100] == b"\xee" * 100 and data[100 : 100 + size] == bytes(ref[:size])
    assert data[100 + size :] == b"\xee" * (3000 - 100 - size)


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
        head = memoryview(heads)[i * hl : (i + 1) * hl]
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
    assert path.read_bytes() == b"".join(heads[i * hl : (i + 1) * hl] + b[8:] for i, b in enumerate(bodies))


def test_write_entries_refuses_bad_arguments_before_writing(impl, tmp_path):
    ce, rb = impl
    body = a_batch(rb)
    path = tmp_path / "f"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDWR)
    try:
        for pos, heads, head_len, bodies in (
            (-1, bytes(20), 10, [body]),
            (0, bytes(19), 10, [body, body]),
            (0, bytes(20), 0, [body]),
            (0, bytes(20), 10, [body, b"1234567"]),
        ):
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


# --- AppendRun: the append pipeline's kernel (plan, write, publish) ---------------------------------------------

ROWS = 8
UNIT = 48


class Table:
    """A queue table as the file store keeps one: ROWS rows, each slot's unit buffer, a topic's slot map."""

    def __init__(self, ce, slots=(3, 1, -1, 5, 0), reserved=UNIT * 4, wrote=0):
        self.rows = bytearray(ce.ROW_BYTES * ROWS)
        self.cols = memoryview(self.rows).cast("q")
        for slot in range(ROWS):
            self.set(ce, slot, MAX_TS=-1, CQ_WROTE=wrote, CQ_RESERVED=reserved, DIRTY_PHYS=-1)
        self.slot_map = array.array("q", slots)
        self.unit_bufs = [bytearray(UNIT * 6) for _ in range(ROWS)]

    def set(self, ce, slot, **fields):
        for name, value in fields.items():
            self.cols[slot * ce.ROW_FIELDS + getattr(ce, "ROW_" + name)] = value

    def get(self, ce, slot, name):
        return self.cols[slot * ce.ROW_FIELDS + getattr(ce, "ROW_" + name)]


def _file(tmp_path, name="seg", size=1 << 16):
    path = tmp_path / name
    path.write_bytes(b"\xee" * size)
    return path, os.open(path, os.O_RDWR)


def test_a_run_writes_heads_units_and_moves_rows_only_at_publish(impl, tmp_path):
    ce, rb = impl
    from mqk.store.adapter import AppendResult

    t = Table(ce)
    b1, b2, b3 = a_batch(rb, 3), a_batch(rb, 5), a_batch(rb, 1)
    t.set(ce, 3, END=40, MAX_TS=5000, LOG_START=7)  # queue 0's slot: offsets go on from 40, a later timestamp
    entries = [(0, [b1]), (1, [b2, b3]), (0, (b3,))]
    run = ce.AppendRun(16)
    path, fd = _file(tmp_path)
    try:
        assert run.plan(t.rows, t.slot_map, t.unit_bufs, entries, 0, b"orders", 1234, 9, 1 << 20, 100, 1 << 16) == 3
        assert (run.entries, run.batches, run.stop, run.pos) == (3, 4, ce.STOP_END, 100)
        before = bytes(t.rows)
        staged = [run.batch(i) for i in range(run.batches)]
        run.write(fd)
        assert path.read_bytes()[:100] == b"\xee" * 100  # nothing before the run's position
        # planning and writing moved nothing but the kernel's own staging marks
        ends = [(slot, t.get(ce, slot, "END"), t.get(ce, slot, "CQ_WROTE")) for slot in (3, 1)]
        assert ends == [(3, 40, 0), (1, 0, 0)]
        out, grown, dirtied = [], [], []
        assert run.publish(t.rows, out, grown, dirtied, AppendResult) == 4 and run.batches == 0
    finally:
        os.close(fd)
    assert bytes(t.rows) != before
    data = path.read_bytes()
    # each staged batch is an entry at its CommitLog offset: the head encode_head builds, then the batch's tail
    for (_entry, _index, queue, base, span, phys, size), body in zip(staged, [b1, b2, b3, b3]):
        at = phys - (1 << 20)
        head = bytearray(ce.head_size(6))
        max_ts = rb.parse_header(body)[8]
        assert ce.encode_head(head, b"orders", queue, base, phys, 1234, max_ts, 9, 0, span, body) == size
        assert data[at : at + size] == bytes(head) + body[8:]
    assert [s[:5] for s in staged] == [(0, 0, 0, 40, 3), (1, 0, 1, 0, 5), (1, 1, 1, 5, 1), (2, 0, 0, 43, 1)]
    assert staged[1][5] == staged[0][5] + staged[0][6]  # back to back
    # units: queue 0 (slot 3) got two, queue 1 (slot 1) two, each at the queue's write position in turn
    unit = struct.Struct(">qiiqqqq")
    assert unit.unpack_from(t.unit_bufs[3], 0) == (staged[0][5], staged[0][6], 3, 9, 1234, 5000, 40)
    assert unit.unpack_from(t.unit_bufs[3], UNIT)[6] == 43
    assert unit.unpack_from(t.unit_bufs[1], UNIT)[:3] == (staged[2][5], staged[2][6], 1)
    assert (t.get(ce, 3, "END"), t.get(ce, 3, "CQ_WROTE"), t.get(ce, 3, "MAX_TS")) == (44, 2 * UNIT, 5000)
    assert (t.get(ce, 1, "END"), t.get(ce, 1, "CQ_WROTE"), t.get(ce, 1, "STAGED")) == (6, 2 * UNIT, 0)
    assert (t.get(ce, 3, "DIRTY_PHYS"), t.get(ce, 3, "DIRTY_MS")) == (staged[0][5], 1234)
    assert dirtied == [3, 1]
    # an answer per entry (its first base to its last offset), the shard's log start, its first CommitLog offset
    assert out == [(40, 42, 1234, 7, staged[0][5]), (0, 5, 1234, 0, staged[1][5]), (43, 43, 1234, 7, staged[3][5])]
    assert all(type(r) is AppendResult for r in out)
    assert grown == [(0, 43), (1, 6), (0, 44)]
    # a queue already dirty keeps its first mark
    run.plan(t.rows, t.slot_map, t.unit_bufs, [(0, [b1])], 0, b"orders", 99, 0, 1 << 20, 2000, 1 << 16)
    run.publish(t.rows, [], [], dirtied, AppendResult)
    assert t.get(ce, 3, "DIRTY_PHYS") == staged[0][5] and dirtied == [3, 1]


@pytest.mark.parametrize(
    "case", ["segment", "unit_room", "no_unit_buf", "no_shard", "bad_batch", "shape", "full", "empty"]
)
def test_plan_stops_before_an_entry_it_cannot_take_and_says_why(impl, case):
    ce, rb = impl
    t = Table(ce)
    good, bad = a_batch(rb, 2), a_batch(rb, 2)[:-1]
    entry, expect, seg_size, capacity = (0, [good, good]), None, 1 << 16, 16
    if case == "segment":
        seg_size, expect = 100 + 2 * (66 + 6 + len(good)) + 7, ce.STOP_SEGMENT  # one entry fits, not two + a blank
    elif case == "unit_room":
        t.set(ce, 3, CQ_WROTE=3 * UNIT)  # one reserved unit left: the entry's two units do not fit
        expect = ce.STOP_UNIT_ROOM
    elif case == "no_unit_buf":
        t.unit_bufs[3] = None
        expect = ce.STOP_UNIT_ROOM
    elif case == "no_shard":
        entry, expect = (2, [good]), ce.STOP_NO_SHARD
    elif case == "bad_batch":
        entry, expect = (0, [good, bad]), ce.STOP_BATCH  # all or nothing: the good first batch is not staged
    elif case == "shape":
        entry, expect = (0, [good, "text"]), ce.STOP_SHAPE
    elif case == "full":
        capacity, expect = 2, ce.STOP_FULL
    elif case == "empty":
        entry, expect = (0, []), ce.STOP_BATCH
    run = ce.AppendRun(capacity)
    rows = bytes(t.rows)
    n = run.plan(
        t.rows, t.slot_map, t.unit_bufs, [(1, [good]), entry, (1, [good])], 0, b"orders", 1, 0, 0, 100, seg_size
    )
    assert (n, run.stop, run.batches) == (1, expect, 1)  # the first entry is staged, the second stops the run
    assert t.get(ce, 3, "STAGED") == 0 and t.get(ce, 1, "STAGED") == 1
    run.abandon(t.rows)
    # nothing published (units staged past a queue's published end are scratch: no reader looks there)
    assert bytes(t.rows) == rows and run.batches == 0


def test_plan_refuses_arguments_that_cannot_be_right(impl):
    ce, rb = impl
    t = Table(ce, slots=(9,))  # slot 9 is outside the table's 8 rows
    run = ce.AppendRun(4)
    with pytest.raises(OutOfBounds):
        run.plan(t.rows, t.slot_map, t.unit_bufs, [(0, [a_batch(rb)])], 0, b"t", 1, 0, 0, 0, 1 << 16)
    for args in ((-1, 0, 1 << 16), (0, 10, 5), (2, 0, 1 << 16)):  # entry index, position, segment size
        with pytest.raises(OutOfBounds):
            run.plan(t.rows, t.slot_map, t.unit_bufs, [], args[0], b"t", 1, 0, 0, args[1], args[2])
    for bad in ("topic", "entries", "unit_bufs"):
        kw = {"topic": b"t", "entries": [], "unit_bufs": t.unit_bufs}
        kw[bad] = "x" if bad == "topic" else (tuple(kw[bad]) if bad == "unit_bufs" else ())
        with pytest.raises(TypeError):
            run.plan(t.rows, t.slot_map, kw["unit_bufs"], kw["entries"], 0, kw["topic"], 1, 0, 0, 0, 1 << 16)
    t = Table(ce)
    run.plan(t.rows, t.slot_map, t.unit_bufs, [(0, [a_batch(rb)])], 0, b"t", 1, 0, 0, 0, 1 << 16)
    with pytest.raises(RuntimeError):  # a run must be published or abandoned first
        run.plan(t.rows, t.slot_map, t.unit_bufs, [(0, [a_batch(rb)])], 0, b"t", 1, 0, 0, 0, 1 << 16)
    with pytest.raises(OSError) as bad_fd:
        run.write(-1)
    assert bad_fd.value.errno == errno.EBADF
    run.abandon(t.rows)
    with pytest.raises(IndexError):
        run.batch(0)


def test_a_failed_write_is_abandoned_and_the_next_run_writes_the_same_place(impl, tmp_path):
    ce, rb = impl
    from mqk.store.adapter import AppendResult

    t = Table(ce)
    run = ce.AppendRun(8)
    rows = bytes(t.rows)
    run.plan(t.rows, t.slot_map, t.unit_bufs, [(0, [a_batch(rb)]), (1, [a_batch(rb)])], 0, b"t", 5, 0, 0, 64, 4096)
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        with pytest.raises(OSError) as info:
            run.write(full)
        assert info.value.errno == errno.ENOSPC
    finally:
        os.close(full)
    run.abandon(t.rows)
    assert bytes(t.rows) == rows  # nothing published, no staging mark left behind
    path, fd = _file(tmp_path)
    try:
        assert run.plan(t.rows, t.slot_map, t.unit_bufs, [(0, [a_batch(rb)])], 0, b"t", 5, 0, 0, 64, 4096) == 1
        run.write(fd)
        out = []
        run.publish(t.rows, out, [], [], AppendResult)
    finally:
        os.close(fd)
    entry = ce.read_entry(path.read_bytes(), 64, 4096)
    assert out[0][4] == 64 and entry[0] == 1 and entry[2:5] == (0, 0, 0)


def _random_entries(rb, rng, count):
    """Entries of every shape the kernel meets: good single and multi-batch ones, repeated queues, refused ones."""
    good = [a_batch(rb, n) for n in (1, 2, 5)]
    entries = []
    for _ in range(count):
        roll = rng.random()
        queue = rng.randrange(-1, 6)
        if roll < 0.7:
            entries.append((queue, [rng.choice(good) for _ in range(rng.randrange(1, 4))]))
        elif roll < 0.8:
            entries.append((queue, [rng.choice(good)[: -rng.randrange(1, 20)]]))
        elif roll < 0.85:
            entries.append((queue, []))
        elif roll < 0.9:
            entries.append([queue, [rng.choice(good)]])  # a list, not a tuple
        else:
            entries.append((queue, (rng.choice(good),)))
    return entries


def test_compiled_and_twin_runs_agree_byte_for_byte(tmp_path):
    """The same entries, tables and segment through both kernels: the same stops, staged batches, files, units,
    rows and answers, including when plan stops (each stop skips its entry here, as the store would answer it)."""
    import random

    from mqk.store.adapter import AppendResult

    ce_c = compiled("clentry")
    if ce_c is None:
        pytest.skip("the compiled kernels are not built (MQK_NO_EXTENSIONS)")
    rb = twin("recbatch")
    for seed in range(20):
        outcomes = []
        for ce in (ce_c, twin("clentry")):
            rng = random.Random(seed)
            entries = _random_entries(rb, rng, 60)
            t = Table(ce, reserved=UNIT * rng.randrange(1, 6))
            path, fd = _file(tmp_path, f"{ce.__name__}-{seed}")
            run = ce.AppendRun(rng.randrange(1, 12))
            log, pos, i = [], 0, 0
            try:
                while i < len(entries) and pos < 30_000:
                    n = run.plan(t.rows, t.slot_map, t.unit_bufs, entries, i, b"orders", seed, seed * 3, 0, pos, 30_000)
                    staged = [run.batch(k) for k in range(run.batches)]
                    run.write(fd)
                    out, grown, dirtied = [], [], []
                    run.publish(t.rows, out, grown, dirtied, AppendResult)
                    log.append((n, run.stop, run.end_pos, staged, out, grown, dirtied))
                    pos = run.end_pos
                    i += n if n or run.stop == ce.STOP_END else 1
            finally:
                os.close(fd)
            outcomes.append((log, bytes(t.rows), [bytes(u) for u in t.unit_bufs], path.read_bytes()))
        assert outcomes[0] == outcomes[1], seed
