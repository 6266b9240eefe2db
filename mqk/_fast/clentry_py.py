"""CommitLog entry kernels, pure Python: the twin of `clentry.pyx`, same API, byte-identical results.

Owns the byte layout of one CommitLog entry (big-endian) and the append kernel (`AppendRun`), which stages, writes
and publishes a run of entries against the store's queue table (a flat buffer of per-queue positions: the kernel
never touches the store's Python objects). Segments, files and flushing are the file store's. The layout:
  0 total_size i32 | 4 magic u32 | 8 crc u32 (CRC32C of bytes [12, total_size)) | 12 queue_id i32 | 16 flags i32 |
  20 queue_offset i64 | 28 physical_offset i64 | 36 record_count i32 | 40 store_timestamp i64 |
  48 max_timestamp i64 | 56 tags_code i64 | 64 topic_len u16 | 66 topic (UTF-8) | body (a Kafka record batch v2)
A BLANK entry (total_size, MAGIC_BLANK) fills the unused end of a segment; it is at least BLANK_MIN_SIZE bytes, so a
writer must only place an entry where `entry_size + BLANK_MIN_SIZE <= bytes left` (RocketMQ's rule) — the space
that remains can then always take a BLANK.

`read_entry` answers kind 0 (end of data) where total_size is 0 or fewer than BLANK_MIN_SIZE bytes remain before
`limit`, kind 1 for a message, kind 2 for a blank; any other magic, an impossible size or a CRC mismatch is
`Corrupt(message, position)`. For kinds 0 and 2 the fields after total_size are 0, topic "" and body_pos -1.
A message's body is a whole record batch (at least its 61-byte header), so a message entry is at least 127 bytes;
`encode_head` refuses a shorter body with ValueError. A read window outside the buffer (pos < 0, pos > limit,
limit > len(buf)) and writes that do not fit raise `OutOfBounds`.

An entry is never assembled in memory: the file store writes its *head* (the fixed header, the topic and the body's
first 8 bytes, which are the batch's base offset, set to the queue offset) and then the rest of the body straight
from the producer's buffer, in one `pwritev` (`write_entry`). `encode_head` builds such a head, CRC included
(computed over the head and the body's tail, as if they were one buffer), so `head + body[8:]` is the entry.
`AppendRun.plan` builds the heads of a run of entries side by side and their ConsumeQueue units (layout in
`cqunit_py`) past each queue's published end; `write` puts them in the segment with `write_entries`; `publish` moves
the queue table's positions, the only place they move.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from mqk._fast.api import LogEntry, StagedBatch
from mqk._fast.crc import crc32c
from mqk._fast.recbatch_py import HEADER_SIZE as _BATCH_HEADER_SIZE
from mqk._fast.recbatch_py import _i32, _i64, _ssize, _view, _writable  # shared argument coercion
from mqk.errors import Corrupt, OutOfBounds

if TYPE_CHECKING:
    from typing_extensions import Buffer

FIXED_HEADER_SIZE = 66
MAGIC_MESSAGE = 0xDAA320A7
MAGIC_BLANK = 0xCBD43194
BLANK_MIN_SIZE = 8
CRC_START = 12
KIND_END, KIND_MESSAGE, KIND_BLANK = 0, 1, 2
MAX_TOPIC_LEN = 0xFFFF
_INT32_MAX = (1 << 31) - 1

_FIXED = struct.Struct(">iIIiiqqiqqqH")
_SIZE_MAGIC = struct.Struct(">iI")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
#: the ConsumeQueue unit append_head writes (cqunit's layout)
_UNIT = struct.Struct(">qiiqqqq")
_UNIT_SIZE = 48

_END: LogEntry = (KIND_END, 0, 0, 0, 0, 0, 0, 0, 0, 0, "", -1)
#: a batch staged in an AppendRun: slot, queue, entry, index, qpos, phys, base, span, running, size
_Staged: TypeAlias = tuple[int, int, int, int, int, int, int, int, int, int]


def entry_size(topic_len: int, body_len: int) -> int:
    """Bytes an entry with this topic and body takes. ValueError if the topic is too long or the entry over 2 GiB."""
    topic_len = _ssize(topic_len)
    body_len = _ssize(body_len)
    if topic_len < 0 or topic_len > MAX_TOPIC_LEN:
        raise ValueError(f"topic length {topic_len} outside [0, {MAX_TOPIC_LEN}]")
    if body_len < 0 or body_len > _INT32_MAX - FIXED_HEADER_SIZE - topic_len:
        raise ValueError(f"body length {body_len} does not fit an entry")
    return FIXED_HEADER_SIZE + topic_len + body_len


def head_size(topic_len: int) -> int:
    """Bytes of an entry's head (fixed header, topic, the body's 8-byte base offset): see `encode_head`."""
    return FIXED_HEADER_SIZE + _ssize(topic_len) + 8


def encode_head(
    head: Buffer,
    topic: bytes,
    queue_id: int,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    max_timestamp: int,
    tags_code: int,
    flags: int,
    record_count: int,
    body: Buffer,
) -> int:
    """Write the head of a message entry for the record batch `body` into `head[0:head_size(len(topic))]`: the
    fixed header with these fields, the topic, and the batch's base offset set to queue_offset, with the CRC
    covering `body[8:]` too, so that head + body[8:] is the entry. Returns the entry's size (not the head's).
    OutOfBounds if the head does not fit `head`; ValueError if body is no batch."""
    fields, view = _entry_fields(
        topic,
        queue_id,
        queue_offset,
        physical_offset,
        store_timestamp,
        max_timestamp,
        tags_code,
        flags,
        record_count,
        body,
    )
    mv = _writable(head)
    n = FIXED_HEADER_SIZE + len(topic) + 8
    if n > mv.nbytes:
        raise OutOfBounds(f"entry head of {n} bytes does not fit buffer of {mv.nbytes} bytes")
    _pack_head(mv, 0, fields, topic)
    _U32.pack_into(mv, 8, crc32c(view[8:], crc32c(mv[CRC_START:n])))
    return fields[0]


def _entry_fields(
    topic: bytes,
    queue_id: int,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    max_timestamp: int,
    tags_code: int,
    flags: int,
    record_count: int,
    body: Buffer,
) -> tuple[tuple[int, ...], memoryview]:
    """The checked header fields (size first) of a message entry, and the body as a memoryview."""
    queue_id = _i32(queue_id)
    queue_offset = _i64(queue_offset)
    physical_offset = _i64(physical_offset)
    store_timestamp = _i64(store_timestamp)
    max_timestamp = _i64(max_timestamp)
    tags_code = _i64(tags_code)
    flags = _i32(flags)
    record_count = _i32(record_count)
    if not isinstance(topic, bytes):
        raise TypeError("topic must be bytes")
    view = _view(body)
    if view.nbytes < _BATCH_HEADER_SIZE:
        raise ValueError(f"body of {view.nbytes} bytes is not a record batch")
    size = entry_size(len(topic), view.nbytes)
    return (
        size,
        queue_id,
        flags,
        queue_offset,
        physical_offset,
        record_count,
        store_timestamp,
        max_timestamp,
        tags_code,
    ), view


def _pack_head(mv: memoryview, pos: int, fields: tuple[int, ...], topic: bytes) -> int:
    """Fixed header (CRC left 0), topic and base offset (= queue offset) at `pos`; returns the body's position."""
    _FIXED.pack_into(mv, pos, fields[0], MAGIC_MESSAGE, 0, *fields[1:], len(topic))
    p = pos + FIXED_HEADER_SIZE
    mv[p : p + len(topic)] = topic
    p += len(topic)
    # the stored batch's base offset is the queue offset (outside the batch CRC, so the batch stays valid)
    _I64.pack_into(mv, p, fields[3])
    return p


def write_entry(fd: int, pos: int, head: Buffer, head_len: int, body: Buffer) -> None:
    """Write the entry whose head is `head[:head_len]` (see `encode_head`) and whose batch is `body` at offset `pos`
    of file `fd`: one pwritev of the head and body[8:] (the batch's base offset is in the head), finishing a short
    write. OSError as os.pwritev raises it; OutOfBounds for a head length outside `head`, a body under 8 bytes or a
    negative position."""
    pos = _ssize(pos)
    head_len = _ssize(head_len)
    h = _view(head)
    b = _view(body)
    if head_len < 0 or head_len > h.nbytes or b.nbytes < 8 or pos < 0:
        raise OutOfBounds(f"entry write of head {head_len}/{h.nbytes} and body {b.nbytes} bytes at {pos}")
    _write_all(fd, pos, [h[:head_len], b[8:]])


#: entries `write_entries` hands to one pwritev (two buffers each; Linux's IOV_MAX is 1024)
WRITE_ENTRIES_CHUNK = 512
#: and bytes, at most (but a larger entry goes alone). Pipelined Produce requests into many partitions make runs of
#: several MB; written in one call, the kernel's copy into the page cache (copy_folio_from_iter_atomic) costs
#: several times the CPU per byte it costs in 1 MiB calls, where the page cache sizes its folios by the write and
#: large folios come from memory the host may have taken back (docs/decisions.md has the figures and their bench
#: command).
WRITE_BYTES_CHUNK = 1 << 20


def write_entries(fd: int, pos: int, heads: Buffer, head_len: int, bodies: Sequence[Buffer]) -> None:
    """Write len(bodies) consecutive entries at offset `pos` of file `fd`: entry i is heads[i * head_len:(i + 1) *
    head_len] (its head, see `encode_head`) followed by bodies[i][8:], as `write_entry` writes one, with one pwritev
    per WRITE_ENTRIES_CHUNK entries or WRITE_BYTES_CHUNK bytes, whichever comes first (an entry larger than that
    goes alone), finishing short writes. OSError as os.pwritev raises it (bytes before the failure may be
    written); OutOfBounds, writing nothing, for a head length below 1, heads shorter than len(bodies) * head_len,
    a body under 8 bytes or a negative position."""
    pos = _ssize(pos)
    head_len = _ssize(head_len)
    h = _view(heads)
    views = [_view(body) for body in bodies]
    if head_len < 1 or h.nbytes < len(views) * head_len or pos < 0 or any(b.nbytes < 8 for b in views):
        raise OutOfBounds(f"write of {len(views)} entries with heads of {head_len} bytes in {h.nbytes} at {pos}")
    i = 0
    while i < len(views):
        parts: list[memoryview] = []
        nbytes = 0
        for k in range(i, min(i + WRITE_ENTRIES_CHUNK, len(views))):
            nbytes += head_len + views[k].nbytes - 8
            if parts and nbytes > WRITE_BYTES_CHUNK:
                break
            parts.append(h[k * head_len : (k + 1) * head_len])
            parts.append(views[k][8:])
        i += len(parts) // 2  # (counted first: _write_all consumes `parts`)
        pos = _write_all(fd, pos, parts)


def _write_all(fd: int, pos: int, parts: list[memoryview]) -> int:
    """pwritev `parts` at `pos` through short writes; returns the position after them."""
    while parts:
        done: int = os.pwritev(fd, parts, pos)
        if done == 0:
            raise OSError(0, f"pwritev wrote nothing at {pos}")
        pos += done
        while parts and done >= parts[0].nbytes:  # a short write (a signal, a device error to come): the rest
            done -= parts.pop(0).nbytes
        if parts and done:
            parts[0] = parts[0][done:]
    return pos


def blank_head(size: int) -> bytes:
    """The bytes a BLANK entry of `size` bytes starts with (its size and magic; what follows them is never read).
    ValueError if size < BLANK_MIN_SIZE."""
    size = _i32(size)
    if size < BLANK_MIN_SIZE:
        raise ValueError(f"blank of {size} bytes is below the minimum {BLANK_MIN_SIZE}")
    return _SIZE_MAGIC.pack(size, MAGIC_BLANK)


def read_entry(buf: Buffer, pos: int, limit: int, verify: bool = True) -> LogEntry:
    """The entry at `pos`, not reading at or past `limit`: (kind, total_size, queue_id, flags, queue_offset,
    physical_offset, record_count, store_timestamp, max_timestamp, tags_code, topic, body_pos)."""
    pos = _ssize(pos)
    limit = _ssize(limit)
    mv = _view(buf)
    if limit < 0 or limit > mv.nbytes or pos < 0 or pos > limit:
        raise OutOfBounds(f"read at {pos} with limit {limit} outside buffer of {mv.nbytes} bytes")
    remaining = limit - pos
    if remaining < BLANK_MIN_SIZE:
        return _END
    total_size, magic = _SIZE_MAGIC.unpack_from(mv, pos)
    if total_size == 0:
        return _END
    if magic == MAGIC_BLANK:
        if total_size < BLANK_MIN_SIZE or total_size > remaining:
            raise Corrupt(f"impossible blank size {total_size}", pos)
        return (KIND_BLANK, total_size, 0, 0, 0, 0, 0, 0, 0, 0, "", -1)
    if magic != MAGIC_MESSAGE:
        raise Corrupt(f"bad entry magic {magic:#x}", pos)
    if total_size < FIXED_HEADER_SIZE + _BATCH_HEADER_SIZE or total_size > remaining:
        raise Corrupt(f"impossible entry size {total_size}", pos)
    (
        crc,
        queue_id,
        flags,
        queue_offset,
        physical_offset,
        record_count,
        store_timestamp,
        max_timestamp,
        tags_code,
        topic_len,
    ) = _FIXED.unpack_from(mv, pos)[2:]
    body_pos = pos + FIXED_HEADER_SIZE + topic_len
    if total_size - FIXED_HEADER_SIZE - topic_len < _BATCH_HEADER_SIZE:
        raise Corrupt(f"topic length {topic_len} leaves no record batch", pos)
    if verify and crc32c(mv[pos + CRC_START : pos + total_size]) != crc:
        raise Corrupt("entry CRC mismatch", pos)
    try:
        topic = str(mv[pos + FIXED_HEADER_SIZE : body_pos], "utf-8")
    except UnicodeDecodeError:
        raise Corrupt("topic is not UTF-8", pos) from None
    return (
        KIND_MESSAGE,
        total_size,
        queue_id,
        flags,
        queue_offset,
        physical_offset,
        record_count,
        store_timestamp,
        max_timestamp,
        tags_code,
        topic,
        body_pos,
    )


# --- the append pipeline's kernel: plan, write, publish ------------------------------------------------------------

ROW_END = 0  #: the queue's end offset (the offset its next record gets)
ROW_MAX_TS = 1  #: running maximum record timestamp over the queue
ROW_CQ_WROTE = 2  #: write position in the queue's last ConsumeQueue file (published units end here)
ROW_CQ_RESERVED = 3  #: bytes of that file with disk blocks (a unit is only staged below this)
ROW_DIRTY_PHYS = 4  #: CommitLog offset of the first unit not yet flushed (-1: none)
ROW_DIRTY_MS = 5  #: store time of that unit
ROW_LOG_START = 6  #: the queue's log start offset (answered with every append)
ROW_STAGED = 7  #: 1 + index of the queue's last batch staged in the current run (0: none); plan's scratch
ROW_FIELDS = 8
ROW_BYTES = 64

STOP_END = 0  #: every entry was planned
STOP_FULL = 1  #: the run holds as many batches as it can (`capacity`)
STOP_SEGMENT = 2  #: the entry does not fit the rest of the CommitLog segment
STOP_UNIT_ROOM = 3  #: the queue's last ConsumeQueue file has no reserved room for the entry's units
STOP_NO_SHARD = 4  #: the entry's queue is not a shard of the topic
STOP_BATCH = 5  #: a buffer of the entry is not exactly one acceptable record batch v2
STOP_SHAPE = 6  #: the entry is not a (queue id, sequence of buffers) pair


def acceptable_batch(body: Buffer) -> bool:
    """Whether `body` is exactly one record batch v2 the store takes as it is: at least its 61-byte header, magic 2,
    batch_length + 12 == len(body), 0 <= last_offset_delta < 2**31 - 1 and record_count >= 0."""
    b = _view(body)
    n = b.nbytes
    if n < _BATCH_HEADER_SIZE or b[16] != 2 or _I32.unpack_from(b, 8)[0] + 12 != n:
        return False
    last_offset_delta: int = _I32.unpack_from(b, 23)[0]
    record_count: int = _I32.unpack_from(b, 57)[0]
    return 0 <= last_offset_delta < _INT32_MAX and record_count >= 0


class AppendRun:
    """The file store's append kernel: a run of entries of one topic planned, written and published in three calls.

    Per-queue positions live in the caller's *queue table* `rows`: ROW_FIELDS native-endian int64 per queue (a
    *slot*), fields ROW_*. `slot_map` (int64 buffer) maps a queue id of the topic to its slot, -1 for none;
    `unit_bufs[slot]` is the writable buffer of the queue's last ConsumeQueue file (None: none).

    `plan` stages entries from `entries[start]` on. An entry is `(queue id, [batch, ...])` (a tuple; the batches a
    list or tuple of buffers); it is planned whole or not at all. For each batch, plan checks it
    (`acceptable_batch`), writes its entry's head (see `encode_head`: flags 0, the batch's max timestamp, record
    count = its offset span, tags code `tags_code`, store time `store_timestamp`) into the run's own head buffer
    and its 48-byte ConsumeQueue unit (cqunit's layout: physical offset, entry size, span, tags code, store time,
    running max timestamp, base offset) at the queue's staged write position in `unit_bufs[slot]`, past what is
    published. Entries follow each other in the CommitLog segment from position `pos` (the segment starts at
    CommitLog offset `seg_start` and holds `seg_size` bytes); each must leave BLANK_MIN_SIZE bytes free. A queue may
    appear several times in a run: each entry builds on what the one before staged (the row's ROW_STAGED says
    where; plan's scratch, left 0 by publish and abandon). Plan stops at the first entry it cannot take and says why
    in `stop` (STOP_*); the entries before it are staged. Returns the number of entries planned (`entries`);
    `batches` is the number of batches staged, `end_pos` the segment position after them.

    `write(fd)` writes the staged entries (head i + batch i from its 9th byte) at `pos` of the segment file `fd`,
    one pwritev per WRITE_ENTRIES_CHUNK entries or WRITE_BYTES_CHUNK bytes (`write_entries`), finishing short
    writes; OSError as os.pwritev raises it, after which the caller must `abandon` the run. `plan` with
    `write_to` >= 0 writes what it staged to that file before returning (one call instead of two, for a caller
    with nothing to do in between).

    `publish` moves, per batch in order, its queue's row: ROW_CQ_WROTE past its unit, ROW_END past its span,
    ROW_MAX_TS to the running maximum, ROW_STAGED to 0, and (when ROW_DIRTY_PHYS < 0) ROW_DIRTY_PHYS/ROW_DIRTY_MS to
    the batch's CommitLog offset and the store time, appending the slot to `dirtied`; after an entry's last batch
    it appends `result_type(base offset, last offset, store time, ROW_LOG_START, the entry's first CommitLog
    offset)` to `out` and `(queue id, new end offset)` to `grown`. Returns the batches published; the run is empty
    afterwards. `published_entries`, `published_batches` and `published_bytes` count what every publish of this
    run object made visible (the store's put statistics). `abandon` empties the run without publishing
    (ROW_STAGED reset). `batch(i)` describes staged batch i: (entry index, index in the entry, queue id, base
    offset, span, CommitLog offset, entry size).

    Problems with an entry are `stop` reasons, never exceptions; arguments that cannot be right raise: OutOfBounds
    for a window outside the segment or a slot outside the table, RuntimeError for a plan over an unpublished run,
    TypeError as the compiled kernel's typed arguments refuse them."""

    def __init__(self, capacity: int = 4096) -> None:
        capacity = _ssize(capacity)
        if capacity < 1 or capacity > 1 << 20:
            raise ValueError(f"run capacity {capacity} outside [1, 1048576]")
        self.capacity = capacity
        self._staged: list[_Staged] = []
        self._bodies: list[memoryview] = []
        self._heads: list[bytes] = []
        self.entries = 0
        self.stop = STOP_END
        self.start = self.pos = self.end_pos = 0
        self.seg_start = 0
        self.store_timestamp = 0
        self.published_entries = self.published_batches = self.published_bytes = 0

    @property
    def batches(self) -> int:
        return len(self._staged)

    def plan(
        self,
        rows: Buffer,
        slot_map: Buffer,
        unit_bufs: list[memoryview | None],
        entries: list[Any],
        start: int,
        topic: bytes,
        store_timestamp: int,
        tags_code: int,
        seg_start: int,
        pos: int,
        seg_size: int,
        write_to: int = -1,
    ) -> int:
        for name, value, kind in (("unit_bufs", unit_bufs, list), ("entries", entries, list), ("topic", topic, bytes)):
            if type(value) is not kind:  # as the compiled kernel's typed arguments refuse them
                raise TypeError(
                    f"Argument {name!r} has incorrect type (expected {kind.__name__}, got {type(value).__name__})"
                )
        if self._staged:
            raise RuntimeError("an AppendRun must be published or abandoned before it plans again")
        start, pos, seg_size, seg_start = _ssize(start), _ssize(pos), _ssize(seg_size), _i64(seg_start)
        store_timestamp, tags_code = _i64(store_timestamp), _i64(tags_code)
        if start < 0 or start > len(entries) or pos < 0 or seg_size < pos or seg_start < 0:
            raise OutOfBounds(f"run from entry {start} at {pos} of a {seg_size}-byte segment at {seg_start}")
        if len(topic) > MAX_TOPIC_LEN:
            raise ValueError(f"topic length {len(topic)} outside [0, {MAX_TOPIC_LEN}]")
        table = _writable(rows).cast("B").cast("q")
        slots = _view(slot_map).cast("B").cast("q")
        n_rows = len(table) // ROW_FIELDS
        head_len = head_size(len(topic))
        self.start, self.pos, self.end_pos = start, pos, pos
        self.seg_start, self.store_timestamp = seg_start, store_timestamp
        self.entries = 0
        self.stop = STOP_END
        cur = pos
        for e in range(start, len(entries)):
            entry = entries[e]
            if type(entry) is not tuple or len(entry) != 2:
                self.stop = STOP_SHAPE
                break
            queue, batches = entry
            if type(queue) is not int or type(batches) not in (list, tuple):
                self.stop = STOP_SHAPE
                break
            if not 0 <= queue < len(slots) or slots[queue] < 0:
                self.stop = STOP_NO_SHARD
                break
            slot = slots[queue]
            if slot >= n_rows or slot >= len(unit_bufs):
                raise OutOfBounds(f"queue {queue} maps to slot {slot} outside the table of {n_rows} rows")
            if not batches:
                self.stop = STOP_BATCH
                break
            if len(self._staged) + len(batches) > self.capacity:
                self.stop = STOP_FULL
                break
            row = slot * ROW_FIELDS
            staged_at = table[row + ROW_STAGED]
            if staged_at > 0:  # the queue is in this run already: build on what was staged for it
                prev = self._staged[staged_at - 1]
                end, running, qpos = prev[6] + prev[7], prev[8], prev[4] + _UNIT_SIZE
            else:
                end, running, qpos = table[row + ROW_END], table[row + ROW_MAX_TS], table[row + ROW_CQ_WROTE]
            reserved = table[row + ROW_CQ_RESERVED]
            ubuf = unit_bufs[slot]
            staged: list[_Staged] = []
            bodies: list[memoryview] = []
            heads: list[bytes] = []
            entry_cur = cur
            stop = STOP_END
            for j, obj in enumerate(batches):
                try:
                    body = memoryview(obj)
                except TypeError:
                    stop = STOP_SHAPE
                    break
                body = _view(body)
                if not acceptable_batch(body) or body.nbytes > _INT32_MAX - FIXED_HEADER_SIZE - len(topic):
                    stop = STOP_BATCH
                    break
                size = FIXED_HEADER_SIZE + len(topic) + body.nbytes
                if size + BLANK_MIN_SIZE > seg_size - entry_cur:
                    stop = STOP_SEGMENT
                    break
                if ubuf is None or qpos < 0 or qpos + _UNIT_SIZE > reserved:
                    stop = STOP_UNIT_ROOM
                    break
                head = bytearray(head_len)
                span = _I32.unpack_from(body, 23)[0] + 1
                batch_max_ts = _I64.unpack_from(body, 35)[0]
                running = max(running, batch_max_ts)
                phys = seg_start + entry_cur
                encode_head(head, topic, queue, end, phys, store_timestamp, batch_max_ts, tags_code, 0, span, body)
                units = _writable(ubuf)
                if qpos + _UNIT_SIZE > units.nbytes:
                    raise OutOfBounds(f"unit at {qpos} outside buffer of {units.nbytes} bytes")
                _UNIT.pack_into(units, qpos, phys, size, span, tags_code, store_timestamp, running, end)
                staged.append((slot, queue, e, j, qpos, phys, end, span, running, size))
                bodies.append(body)
                heads.append(bytes(head))
                entry_cur += size
                end += span
                qpos += _UNIT_SIZE
            if stop != STOP_END:  # the entry is planned whole or not at all
                self.stop = stop
                break
            self._staged.extend(staged)
            self._bodies.extend(bodies)
            self._heads.extend(heads)
            table[row + ROW_STAGED] = len(self._staged)
            self.entries += 1
            cur = self.end_pos = entry_cur
        if _ssize(write_to) >= 0 and self._staged:
            self.write(write_to)
        return self.entries

    def write(self, fd: int) -> None:
        if not self._staged:
            return None
        if fd < 0:
            raise OSError(errno.EBADF, "AppendRun.write: bad file descriptor")
        head_len = len(self._heads[0])
        write_entries(fd, self.pos, b"".join(self._heads), head_len, self._bodies)
        return None

    def publish(
        self, rows: Buffer, out: list[Any], grown: list[tuple[int, int]], dirtied: list[int], result_type: type[Any]
    ) -> int:
        for name, value in (("out", out), ("grown", grown), ("dirtied", dirtied)):
            if type(value) is not list:
                raise TypeError(f"Argument {name!r} has incorrect type (expected list, got {type(value).__name__})")
        n = len(self._staged)
        if n == 0:
            return 0
        table = _writable(rows).cast("B").cast("q")
        n_rows = len(table) // ROW_FIELDS
        for st in self._staged:
            if st[0] >= n_rows:
                raise OutOfBounds(f"staged slot {st[0]} outside the table of {n_rows} rows")
        first_base = first_phys = 0
        for i, (slot, queue, entry, index, qpos, phys, base, span, running, _size) in enumerate(self._staged):
            row = slot * ROW_FIELDS
            if index == 0:
                first_base, first_phys = base, phys
            end = base + span
            table[row + ROW_CQ_WROTE] = qpos + _UNIT_SIZE
            table[row + ROW_END] = end
            table[row + ROW_MAX_TS] = running
            table[row + ROW_STAGED] = 0
            if table[row + ROW_DIRTY_PHYS] < 0:  # the queue's first unit not yet flushed
                table[row + ROW_DIRTY_PHYS] = phys
                table[row + ROW_DIRTY_MS] = self.store_timestamp
                dirtied.append(slot)
            if i + 1 == n or self._staged[i + 1][2] != entry:  # the entry's last batch
                out.append(
                    tuple.__new__(
                        result_type, (first_base, end - 1, self.store_timestamp, table[row + ROW_LOG_START], first_phys)
                    )
                )
                grown.append((queue, end))
                self.published_entries += 1
        self.published_batches += n
        self.published_bytes += self.end_pos - self.pos
        self._clear()
        return n

    def abandon(self, rows: Buffer) -> None:
        if not self._staged:
            return None
        table = _writable(rows).cast("B").cast("q")
        n_rows = len(table) // ROW_FIELDS
        for st in self._staged:
            if st[0] < n_rows:
                table[st[0] * ROW_FIELDS + ROW_STAGED] = 0
        self._clear()
        return None

    def batch(self, i: int) -> StagedBatch:
        i = _ssize(i)
        if i < 0 or i >= len(self._staged):
            raise IndexError(f"batch {i} of a run of {len(self._staged)}")
        _slot, queue, entry, index, _qpos, phys, base, span, _running, size = self._staged[i]
        return (entry, index, queue, base, span, phys, size)

    def _clear(self) -> None:
        self._staged.clear()
        self._bodies.clear()
        self._heads.clear()
