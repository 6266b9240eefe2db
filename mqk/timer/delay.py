"""Pure helpers of delayed delivery: when a message is due, and how a delayed batch is wrapped while it waits.

When (the first that applies):
- RocketMQ properties (native messages; Kafka record headers of the same names work too):
  `DELAY` = delay level 1..18 (`1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h`; above 18 means 18,
  as in RocketMQ), `__STARTDELIVERTIME` / `TIMER_DELIVER_MS` = epoch ms, `TIMER_DELAY_SEC` = seconds from now,
  `TIMER_DELAY_MS` = ms from now;
- Kafka record headers: `mqk-deliver-at` = epoch ms, `mqk-delay-ms` = ms from now (decimal text, or an 8-byte
  big-endian integer).
A due time not in the future means "deliver now". A batch of several Kafka records is delayed as a unit, until the
latest due time any of its records asks for.

While it waits, a delayed batch is stored, unchanged, as the value of one record in the timer topic, with headers
naming its real topic, queue, due time, tags code and keys (`wrap` / `unwrap`).

A recall (RocketMQ 5's RecallMessage) is a record of the timer topic too, with no value: its headers name the
recalled message's topic, its due time and its unique key (`UNIQ_KEY`, the id RocketMQ clients give a message), as
RocketMQ's timer keeps a delete marker in the same time slot as the message it deletes.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mqk._fast import load
from mqk.errors import Corrupt
from mqk.protocol.native.codes import (
    DELAY_LEVELS_MS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_START_DELIVER_TIME,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
)
from mqk.protocol.native.records import batch_records

recbatch = load("recbatch")

HEADER_DELIVER_AT = "mqk-deliver-at"
HEADER_DELAY_MS = "mqk-delay-ms"
#: header names that carry a due time (epoch ms) and ones that carry a delay with its scale to ms, in the order
#: `due_time` tries them; `DELAY_HEADER_KEYS` is every name `due_time` reads, as the raw keys `has_header` matches
#: (and the names the Kafka produce check screens for, so the put hook is told instead of looking: PutContext)
_AT_NAMES = (PROPERTY_START_DELIVER_TIME, PROPERTY_TIMER_DELIVER_MS, HEADER_DELIVER_AT)
_DELAY_NAMES = ((PROPERTY_TIMER_DELAY_SEC, 1000), (PROPERTY_TIMER_DELAY_MS, 1), (HEADER_DELAY_MS, 1))
_DUE_NAMES = (PROPERTY_DELAY_TIME_LEVEL, *_AT_NAMES, *(name for name, _ in _DELAY_NAMES))
DELAY_HEADER_KEYS = tuple(name.encode() for name in _DUE_NAMES)
#: the same names as properties (a message with none of them is not delayed: a cheap first question)
DELAY_PROPERTY_NAMES = frozenset(_DUE_NAMES)
#: With the compiled kernels, `recbatch.has_header` answers "does any record carry a delay header?" by walking the
#: record structure and skipping keys and values by length, far cheaper than the regex pass below, which reads
#: every byte. The pure-Python twin of that walk costs more than the regex pass, so without the extensions the byte
#: pre-filter stays: it searches for roots every name contains, one pure-literal regex each (re's literal search
#: beats an alternation of the names; regexes, not `in`, because batches may be memoryviews).
#: bench/fast_bench.py's `has_header` lines compare the three.
_WALK_HEADERS = not recbatch.__name__.endswith("_py")
_MARKER_ROOTS = (b"DELAY", b"DELIVER", b"mqk-del")
assert all(any(root in name for root in _MARKER_ROOTS) for name in DELAY_HEADER_KEYS)
_MARKERS = tuple(re.compile(re.escape(root)) for root in _MARKER_ROOTS)

_W_TOPIC, _W_QUEUE, _W_AT, _W_TAGS, _W_KEY, _W_RECALLS = "t", "q", "at", "tags", "k", "recalls"


def _number(raw: str | bytes | None) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bytes):
        if len(raw) == 8 and not raw.isdigit():
            return struct.unpack(">q", raw)[0]
        try:
            raw = raw.decode("ascii")
        except UnicodeDecodeError:
            return None
    try:
        return int(raw.strip())
    except ValueError:
        return None


def due_time(props: dict[str, str] | dict[str, bytes | None], now: int) -> int | None:
    """The epoch-ms due time a message's properties/headers ask for, or None if it is not delayed."""
    level = _number(props.get(PROPERTY_DELAY_TIME_LEVEL))
    if level is not None and level > 0:
        return now + DELAY_LEVELS_MS[min(level, len(DELAY_LEVELS_MS)) - 1]
    for name in _AT_NAMES:
        at = _number(props.get(name))
        if at is not None and at > 0:
            return at
    for name, scale in _DELAY_NAMES:
        delay = _number(props.get(name))
        if delay is not None and delay > 0:
            return now + delay * scale
    return None


def batch_may_be_delayed(batch: bytes | bytearray | memoryview) -> bool:
    """False when no record of the stored-format batch can ask for a delay (the cheap answer for almost every
    batch: the timer's put hook asks it of every append); True means `batch_due_time` must decode it. `batch` is
    bytes-like with one-byte items (bytes, bytearray, a byte memoryview): its header is read by index, not parsed,
    which is a measurable share of a small append."""
    size = len(batch)
    if size < recbatch.HEADER_SIZE or batch[16] != recbatch.MAGIC:
        recbatch.parse_header(batch, 0)  # raises Corrupt with what is wrong
    if batch[22] & 0x07:  # the codec bits of the attributes (big-endian int16 at 21)
        return True  # compressed: only decoding tells
    if _WALK_HEADERS:
        return recbatch.has_header(batch, 0, size, DELAY_HEADER_KEYS)
    return any(marker.search(batch) for marker in _MARKERS)


def batch_due_time(batch: bytes | bytearray | memoryview, now: int) -> int | None:
    """The latest due time any record of a stored-format batch asks for, or None."""
    if not batch_may_be_delayed(batch):
        return None
    return decoded_batch_due_time(batch, now)


def decoded_batch_due_time(batch: bytes | bytearray | memoryview, now: int) -> int | None:
    """`batch_due_time` by decoding every record (compressed batches are decompressed first)."""
    _, records = batch_records(batch)
    latest: int | None = None
    for record in records:
        at = due_time(dict(record[5]), now)
        if at is not None and (latest is None or at > latest):
            latest = at
    return latest


@dataclass(frozen=True)
class Waiting:
    """A delayed batch as the timer keeps it."""

    topic: str
    queue: int
    due: int
    tags_code: int
    keys: tuple[bytes, ...]
    batch: bytes
    #: a recall's record: the unique key of the message of `topic` due at `due` it recalls (then `batch` is empty)
    recalls: str = ""


def recall_record(topic: str, due: int, unique_key: str) -> Waiting:
    """The timer record that recalls `topic`'s message `unique_key`, waiting until `due` (its due time)."""
    return Waiting(topic, -1, due, 0, (), b"", unique_key)


def unique_key(batch: bytes | bytearray | memoryview) -> str | None:
    """The unique key (`UNIQ_KEY`) of a stored batch's first record, None without one: a RocketMQ message is stored
    as a batch of its own (mqk.protocol.native.records), so that is the message's."""
    _, records = batch_records(batch)
    if not records:
        return None
    for name, raw in records[0][5]:
        if name == PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX and raw:
            return raw.decode("utf-8", "replace")
    return None


def wrap(entries: Sequence[Waiting], now: int) -> bytearray:
    """One timer-topic batch holding each waiting batch as one record."""
    records = bytearray()
    for i, w in enumerate(entries):
        headers: list[tuple[str, bytes | None]] = [
            (_W_TOPIC, w.topic.encode()),
            (_W_QUEUE, str(w.queue).encode()),
            (_W_AT, str(w.due).encode()),
            (_W_TAGS, str(w.tags_code).encode()),
        ]
        headers += [(_W_KEY, bytes(k)) for k in w.keys]
        if w.recalls:
            headers.append((_W_RECALLS, w.recalls.encode()))
        records += recbatch.encode_record(i, 0, None, bytes(w.batch) if not w.recalls else None, headers)
    return recbatch.build_batch(0, now, now, bytes(records), len(entries), len(entries) - 1)


def unwrap(
    stored: bytes | bytearray | memoryview, min_offset: int = 0, unreadable: list[tuple[int, str]] | None = None
) -> Iterable[tuple[int, Waiting]]:
    """(timer offset, waiting batch) per record of a timer-topic batch. A record that is not one `wrap` made (its
    routing headers missing or wrong, its value not one whole, intact record batch) raises Corrupt, or, when
    `unreadable` is given, is added to it as (offset, reason) and left out (the timer skips it: see
    mqk.timer.service). A batch that cannot be decoded at all raises Corrupt either way."""
    header, records = batch_records(stored)
    base = header[0]
    for _attrs, _ts, delta, _key, value, headers in records:
        if base + delta < min_offset:
            continue
        fields: dict[str, bytes | None] = {}
        keys: list[bytes] = []
        for name, raw in headers:
            if name == _W_KEY:
                keys.append(raw or b"")
            else:
                fields[name] = raw
        recalls = fields.get(_W_RECALLS)
        try:
            topic = (fields[_W_TOPIC] or b"").decode()
            queue, due, tags = (int(fields[n] or b"") for n in (_W_QUEUE, _W_AT, _W_TAGS))
            reason = None
        except (KeyError, ValueError, UnicodeDecodeError):
            reason = f"timer record at offset {base + delta} lacks its routing headers"
        if reason is None:
            reason = _batch_error(value) if recalls is None else None if recalls else "a recall naming no message"
            if reason is not None:
                reason = f"timer record at offset {base + delta}: {reason}"
        if reason is not None:
            if unreadable is None:
                raise Corrupt(reason)
            unreadable.append((base + delta, reason))
            continue
        if recalls is not None:
            yield base + delta, recall_record(topic, due, recalls.decode("utf-8", "replace"))
            continue
        yield base + delta, Waiting(topic, queue, due, tags, tuple(keys), value or b"")


def _batch_error(value: bytes | None) -> str | None:
    """Why a waiting record's value is not one whole record batch v2 with a good CRC (what its delivery re-appends
    byte for byte), or None."""
    if not value:
        return "no waiting batch"
    try:
        scanned = recbatch.scan_batches(value, True)
    except Exception as exc:  # noqa: BLE001 - any failure to parse is the reason itself
        return f"its waiting batch is unreadable ({exc})"
    if len(scanned) != 1:
        return f"its value holds {len(scanned)} batches, not one"
    return None
