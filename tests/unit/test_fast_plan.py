"""recbatch.plan_plain_appends, the Produce handler's kernel for its common case: each implementation (the twin
always, the compiled module when built) must plan exactly the partitions the handler's own per-partition path would
append as plain (validate_produce_records passes, nothing compressed or converted, not idempotent), in order, stop
at the first other one and say why (PLAN_*, the same in both); Hypothesis draws mixed partition lists."""

from __future__ import annotations

import gzip

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqk._fast import compiled, twin
from mqk.protocol.kafka.records import validate_produce_records

IMPLS = [pytest.param(twin("recbatch"), id="twin")]
if compiled("recbatch") is not None:
    IMPLS.append(pytest.param(compiled("recbatch"), id="compiled"))
RB = twin("recbatch")
NAMES = (b"DELAY", b"__STARTDELIVERTIME")
QUEUES = 4


def batch(
    records=((b"k", b"v", []),), ts=1_700_000_000_000, producer_id=-1, base_sequence=-1, compress=False, control=False
):
    encoded = b"".join(RB.encode_record(i, i, k, v, h) for i, (k, v, h) in enumerate(records))
    attributes = 0x20 if control else 0  # (a control batch: only the broker writes those)
    if compress:
        encoded, attributes = gzip.compress(encoded), 1
    return bytes(
        RB.build_batch(
            0,
            ts,
            ts + len(records) - 1,
            encoded,
            len(records),
            len(records) - 1,
            producer_id=producer_id,
            producer_epoch=0 if producer_id >= 0 else -1,
            base_sequence=base_sequence,
            attributes=attributes,
        )
    )


def flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1 :]


#: the kinds of partition the strategy mixes, each as (index, records) before wrapping in the request's dict
KINDS = {
    "plain": lambda: (1, memoryview(batch())),
    "plain, two batches": lambda: (2, memoryview(batch() + batch(((None, b"x" * 40, []),)))),
    "plain, delay header": lambda: (0, memoryview(batch(((b"k", b"v", [("DELAY", b"3")]),)))),
    "plain, delay header in second batch": lambda: (
        0,
        memoryview(batch() + batch(((b"k", b"v", [("__STARTDELIVERTIME", b"1")]),))),
    ),
    "plain, sequence without producer id": lambda: (3, memoryview(batch(base_sequence=7))),
    "plain, producer id without sequence": lambda: (3, memoryview(batch(producer_id=9))),
    "null key": lambda: (1, memoryview(batch(((None, b"v", []),)))),
    "old timestamp": lambda: (1, memoryview(batch(ts=1_000))),
    "idempotent": lambda: (1, memoryview(batch(producer_id=9, base_sequence=0))),
    "plain, idempotent second batch": lambda: (1, memoryview(batch() + batch(producer_id=9, base_sequence=0))),
    "control batch": lambda: (1, memoryview(batch(control=True))),
    "control batch second": lambda: (1, memoryview(batch() + batch(control=True))),
    "compressed": lambda: (1, memoryview(batch(compress=True))),
    "compressed second batch": lambda: (1, memoryview(batch() + batch(compress=True))),
    "bad crc": lambda: (1, memoryview(flipped(batch(), 65))),
    "bad crc in second batch": lambda: (1, memoryview(batch() + flipped(batch(), 65))),
    "truncated": lambda: (1, memoryview(batch()[:-3])),
    "legacy magic": lambda: (1, memoryview(batch()[:16] + b"\x01" + batch()[17:])),
    "too large": lambda: (1, memoryview(batch(((b"k", b"v" * 1200, []),)))),
    "index out of range": lambda: (QUEUES, memoryview(batch())),
    "negative index": lambda: (-1, memoryview(batch())),
    "huge index": lambda: (1 << 70, memoryview(batch())),
    "bool index": lambda: (True, memoryview(batch())),
    "bytes records": lambda: (1, batch()),
    "no records": lambda: (1, None),
    "empty records": lambda: (1, memoryview(b"")),
    "16 bytes": lambda: (1, memoryview(batch()[:16])),
    "strided view": lambda: (1, memoryview(batch() * 2)[::2]),
    "int view": lambda: (1, memoryview(batch()[:64]).cast("i")),
}


#: why each kind that is not plain stops the plan (no keys required, no timestamp window, max.message.bytes 1000)
STOPS = {
    "null key": "END",
    "old timestamp": "END",
    "idempotent": "IDEMPOTENT",
    "plain, idempotent second batch": "END",  # (only the first batch's producer fields decide)
    "control batch": "CONTROL",
    "control batch second": "CONTROL",
    "compressed": "COMPRESSED",
    "compressed second batch": "COMPRESSED",
    "bad crc": "INVALID",
    "bad crc in second batch": "INVALID",
    "truncated": "INVALID",
    "16 bytes": "LEGACY",
    "empty records": "LEGACY",
    "legacy magic": "LEGACY",
    "too large": "TOO_LARGE",
    "index out of range": "NO_QUEUE",
    "negative index": "NO_QUEUE",
    "huge index": "NO_QUEUE",
    "bool index": "SHAPE",
    "bytes records": "SHAPE",
    "no records": "SHAPE",
    "strided view": "SHAPE",
    "int view": "SHAPE",
}


#: the kinds with a record without a key (what a compacted topic refuses)
KEYLESS = {"null key", "plain, two batches"}


def expected_stop(kind: str, require_keys: bool, timestamps) -> int:
    if (kind in KEYLESS and require_keys) or (kind == "old timestamp" and timestamps is not None):
        return RB.PLAN_INVALID
    return getattr(RB, "PLAN_" + STOPS.get(kind, "END"))


def partition(kind: str):
    index, records = KINDS[kind]()
    return {"index": index, "records": records, "_tagged_fields": {}}


def reference(partitions, start, max_batch_bytes, require_keys, timestamps):
    """What the handler's per-partition path plans as plain: (stop position, [(index, [batch bytes], delayed)])."""
    planned = []
    i = start
    while i < len(partitions):
        p = partitions[i]
        if type(p) is not dict:
            break
        index, records = p.get("index"), p.get("records")
        if type(index) is not int or type(records) is not memoryview or not 0 <= index < QUEUES:
            break
        if records.ndim != 1 or records.itemsize != 1 or not records.c_contiguous:
            break
        try:
            infos = validate_produce_records(
                records, max_batch_bytes, header_names=NAMES, require_keys=require_keys, timestamps=timestamps
            )
        except Exception:  # noqa: BLE001 - refused: the handler answers it itself
            break
        if any(info.compression or info.converted for info in infos):
            break
        if infos[0].producer_id >= 0 and infos[0].base_sequence >= 0:
            break
        planned.append((index, [bytes(info.data) for info in infos], any(info.named_header for info in infos)))
        i += 1
    return i, planned


def plan(rb, partitions, start, max_batch_bytes, require_keys, timestamps, answers_before=0):
    entries, delays, slots, answers = [], [], [], ["earlier"] * answers_before
    stop, why = rb.plan_plain_appends(
        partitions, start, QUEUES, max_batch_bytes, NAMES, require_keys, timestamps, entries, delays, slots, answers
    )
    assert (why == rb.PLAN_END) == (stop >= len(partitions))
    assert len(entries) == len(delays) == len(slots) == stop - start
    assert slots == list(range(answers_before, answers_before + len(entries)))
    assert answers == ["earlier"] * answers_before + [None] * len(entries)
    for (_index, views), p in zip(entries, partitions[start:]):
        assert all(type(v) is memoryview for v in views)
        assert views[0].obj is p["records"].obj  # views into the request, never copies
    return stop, [(index, [bytes(v) for v in views], delayed) for (index, views), delayed in zip(entries, delays)]


def stop_reason(rb, partitions, start, max_batch_bytes, require_keys, timestamps):
    return rb.plan_plain_appends(
        partitions, start, QUEUES, max_batch_bytes, NAMES, require_keys, timestamps, [], [], [], []
    )


@pytest.mark.parametrize("rb", IMPLS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_of_partition_is_planned_as_the_handler_would(rb, kind):
    partitions = [partition("plain"), partition(kind), partition("plain, two batches")]
    window = (1_600_000_000_000, 1_800_000_000_000)
    for require_keys, timestamps in ((False, None), (True, None), (False, window)):
        expected = reference(partitions, 0, 1000, require_keys, timestamps)
        assert plan(rb, partitions, 0, 1000, require_keys, timestamps) == expected
        stop = expected[0]
        kinds = ["plain", kind, "plain, two batches"]
        why = expected_stop(kinds[stop], require_keys, timestamps) if stop < len(kinds) else RB.PLAN_END
        assert stop_reason(rb, partitions, 0, 1000, require_keys, timestamps) == (stop, why)
        # resuming after the partition it stopped at goes on with the rest
        if stop < len(partitions):
            assert plan(rb, partitions, stop + 1, 1000, require_keys, timestamps, answers_before=2) == reference(
                partitions, stop + 1, 1000, require_keys, timestamps
            )


@pytest.mark.parametrize("rb", IMPLS)
def test_plain_partitions_keep_their_batches_and_delay_flags(rb):
    partitions = [partition("plain"), partition("plain, two batches"), partition("plain, delay header")]
    stop, planned = plan(rb, partitions, 0, 1 << 20, False, None)
    assert stop == 3
    assert planned == [
        (1, [batch()], False),
        (2, [batch(), batch(((None, b"x" * 40, []),))], False),
        (0, [bytes(partitions[2]["records"])], True),
    ]


@pytest.mark.parametrize("rb", IMPLS)
def test_a_start_at_or_past_the_end_plans_nothing_and_a_negative_start_is_refused(rb):
    partitions = [partition("plain")]
    assert plan(rb, partitions, 1, 1000, False, None) == (1, [])
    assert plan(rb, partitions, 5, 1000, False, None) == (5, [])
    with pytest.raises(ValueError):
        plan(rb, partitions, -1, 1000, False, None)


@pytest.mark.parametrize("rb", IMPLS)
def test_bad_arguments_are_refused_alike(rb):
    with pytest.raises(TypeError):
        rb.plan_plain_appends(None, 0, QUEUES, 1000, NAMES, False, None, [], [], [], [])
    with pytest.raises(TypeError):
        rb.plan_plain_appends([partition("plain")], 0, QUEUES, 1000, NAMES, False, None, None, [], [], [])
    with pytest.raises(TypeError):
        rb.plan_plain_appends([partition("plain")], 0, QUEUES, 1000, [b"DELAY"], False, None, [], [], [], [])
    with pytest.raises(TypeError):
        rb.plan_plain_appends([partition("plain")], 0, QUEUES, 1000, NAMES, False, (1, 2, 3), [], [], [], [])


def test_only_a_failed_batch_check_stops_the_plan(monkeypatch):
    """A partition whose batches fail their check (Corrupt, InvalidRecord, InvalidTimestamp) stops the plan, and
    nothing else does: any other error in the kernel is a bug that must surface, not a silent fall-back to the
    handler's slower path. (Shown on the twin, whose inner call can be replaced; the compiled kernel catches the
    same two error types.)"""

    def renamed(*args, **kwargs):
        raise AttributeError("a renamed attribute")

    monkeypatch.setattr(RB, "scan_batches", renamed)
    with pytest.raises(AttributeError, match="a renamed attribute"):
        plan(RB, [partition("plain")], 0, 1000, False, None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(sorted(KINDS)), max_size=8),
    start=st.integers(0, 3),
    max_batch_bytes=st.sampled_from([100, 1000, 1 << 20]),
    require_keys=st.booleans(),
    windowed=st.booleans(),
)
def test_mixed_partition_lists_agree_with_the_handlers_path(kinds, start, max_batch_bytes, require_keys, windowed):
    partitions = [partition(kind) for kind in kinds]
    timestamps = (1_600_000_000_000, 1_800_000_000_000) if windowed else None
    expected = reference(partitions, start, max_batch_bytes, require_keys, timestamps)
    for impl in IMPLS:
        assert plan(impl.values[0], partitions, start, max_batch_bytes, require_keys, timestamps) == expected
    # and every implementation gives the same reason for where it stopped
    reasons = {
        stop_reason(impl.values[0], partitions, start, max_batch_bytes, require_keys, timestamps) for impl in IMPLS
    }
    assert len(reasons) == 1, reasons


def test_the_reasons_are_the_kernels_codes_and_the_kinds_give_each():
    """PLAN_* are distinct, the handler's PlanStop names them all, and the kinds above reach every one."""
    from mqk.protocol.kafka.records import PlanStop

    codes = {name: getattr(RB, name) for name in dir(RB) if name.startswith("PLAN_")}
    assert len(set(codes.values())) == len(codes)
    assert {"PLAN_" + stop.name: stop.value for stop in PlanStop} == codes
    assert {"PLAN_" + stop for stop in STOPS.values()} == set(codes)


def test_the_kinds_cover_both_outcomes():
    """The strategy above means something only if its kinds both plan and stop."""
    outcomes = {kind: reference([partition(kind)], 0, 1000, False, None)[0] for kind in KINDS}
    planned = {kind for kind, stop in outcomes.items() if stop == 1}
    assert planned == {kind for kind in KINDS if kind.startswith("plain")} | {"null key", "old timestamp"}
    assert reference([partition("null key")], 0, 1000, True, None)[0] == 0
    assert reference([partition("old timestamp")], 0, 1000, False, (1_600_000_000_000, 1_800_000_000_000))[0] == 0
