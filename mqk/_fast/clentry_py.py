"""CommitLog entry kernels, pure Python: the twin of `clentry.pyx`, same API, byte-identical results.

Owns the byte layout of one CommitLog entry (big-endian); segments, positions and flushing are the file store's,
except that `append_run` (the store's append of one batch to each of many queues) moves the positions the store
hands it, so that such an append costs one call and no Python per entry. The layout:
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
`append_head` is the file store's single-batch append in one call: it checks the batch header, builds the head and
writes the entry's ConsumeQueue unit (layout in `cqunit_py`), so an append costs one kernel call instead of a header
parse, an encode and a unit pack.
"""
from __future__ import annotations

import errno
import os
import struct

from crc32c import crc32c

from mqk._fast.recbatch_py import HEADER_SIZE as BATCH_HEADER_SIZE
from mqk._fast.recbatch_py import _i32, _i64, _ssize, _view, _writable  # shared argument coercion
from mqk.errors import Corrupt, OutOfBounds

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

_END = (KIND_END, 0, 0, 0, 0, 0, 0, 0, 0, 0, "", -1)


def entry_size(topic_len, body_len) -> int:
    """Bytes an entry with this topic and body takes. ValueError if the topic is too long or the entry over 2 GiB."""
    topic_len = _ssize(topic_len)
    body_len = _ssize(body_len)
    if topic_len < 0 or topic_len > MAX_TOPIC_LEN:
        raise ValueError(f"topic length {topic_len} outside [0, {MAX_TOPIC_LEN}]")
    if body_len < 0 or body_len > _INT32_MAX - FIXED_HEADER_SIZE - topic_len:
        raise ValueError(f"body length {body_len} does not fit an entry")
    return FIXED_HEADER_SIZE + topic_len + body_len


def head_size(topic_len) -> int:
    """Bytes of an entry's head (fixed header, topic, the body's 8-byte base offset): see `encode_head`."""
    return FIXED_HEADER_SIZE + _ssize(topic_len) + 8


def encode_head(head, topic, queue_id, queue_offset, physical_offset, store_timestamp, max_timestamp, tags_code,
                flags, record_count, body) -> int:
    """Write the head of a message entry for the record batch `body` into `head[0:head_size(len(topic))]`: the
    fixed header with these fields, the topic, and the batch's base offset set to queue_offset, with the CRC
    covering `body[8:]` too, so that head + body[8:] is the entry. Returns the entry's size (not the head's).
    OutOfBounds if the head does not fit `head`; ValueError if body is no batch."""
    fields, body = _entry_fields(topic, queue_id, queue_offset, physical_offset, store_timestamp, max_timestamp,
                                 tags_code, flags, record_count, body)
    mv = _writable(head)
    n = FIXED_HEADER_SIZE + len(topic) + 8
    if n > mv.nbytes:
        raise OutOfBounds(f"entry head of {n} bytes does not fit buffer of {mv.nbytes} bytes")
    _pack_head(mv, 0, fields, topic)
    _U32.pack_into(mv, 8, crc32c(body[8:], crc32c(mv[CRC_START:n])))
    return fields[0]


def _entry_fields(topic, queue_id, queue_offset, physical_offset, store_timestamp, max_timestamp, tags_code, flags,
                  record_count, body) -> tuple[tuple, memoryview]:
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
    body = _view(body)
    if body.nbytes < BATCH_HEADER_SIZE:
        raise ValueError(f"body of {body.nbytes} bytes is not a record batch")
    size = entry_size(len(topic), body.nbytes)
    return (size, queue_id, flags, queue_offset, physical_offset, record_count, store_timestamp, max_timestamp,
            tags_code), body


def _pack_head(mv: memoryview, pos: int, fields: tuple, topic: bytes) -> int:
    """Fixed header (CRC left 0), topic and base offset (= queue offset) at `pos`; returns the body's position."""
    _FIXED.pack_into(mv, pos, fields[0], MAGIC_MESSAGE, 0, *fields[1:], len(topic))
    p = pos + FIXED_HEADER_SIZE
    mv[p:p + len(topic)] = topic
    p += len(topic)
    # the stored batch's base offset is the queue offset (outside the batch CRC, so the batch stays valid)
    _I64.pack_into(mv, p, fields[3])
    return p


def append_head(head, topic, queue_id, queue_offset, physical_offset, store_timestamp, tags_code, body, cq_buf,
                cq_pos, running_max_ts):
    """Append one record batch: if `body` is exactly one Kafka record batch v2 (at least its header, magic 2,
    batch_length + 12 == len(body), 0 <= last_offset_delta < 2**31 - 1, record_count >= 0), write its entry's
    head into `head` as `encode_head` does with flags 0, max_timestamp = the batch's and record_count = its offset
    span (last_offset_delta + 1), and its ConsumeQueue unit at `cq_pos` in `cq_buf`: (physical_offset, entry size,
    span, tags_code, store_timestamp, max(running_max_ts, the batch's max_timestamp), queue_offset).

    Returns (entry size, span, new running max timestamp), or None, writing nothing, when `body` is not exactly
    one such batch (the caller's general path then says what is wrong). OutOfBounds, writing nothing, when the
    head or the unit does not fit its buffer."""
    mv = _writable(head)
    if not isinstance(topic, bytes):
        raise TypeError("topic must be bytes")
    queue_id = _ssize(queue_id)
    queue_offset = _ssize(queue_offset)
    physical_offset = _ssize(physical_offset)
    store_timestamp = _ssize(store_timestamp)
    tags_code = _ssize(tags_code)
    body = _view(body)
    cq = _writable(cq_buf)
    cq_pos = _ssize(cq_pos)
    running_max_ts = _ssize(running_max_ts)
    n = body.nbytes
    if n < BATCH_HEADER_SIZE or body[16] != 2 or _I32.unpack_from(body, 8)[0] + 12 != n:
        return None
    last_offset_delta = _I32.unpack_from(body, 23)[0]
    if last_offset_delta < 0 or last_offset_delta == _INT32_MAX or _I32.unpack_from(body, 57)[0] < 0:
        return None
    span = last_offset_delta + 1
    batch_max_ts = _I64.unpack_from(body, 35)[0]
    queue_id = _i32(queue_id)
    size = entry_size(len(topic), n)
    if FIXED_HEADER_SIZE + len(topic) + 8 > mv.nbytes:
        raise OutOfBounds(f"entry head of {FIXED_HEADER_SIZE + len(topic) + 8} bytes does not fit buffer of "
                          f"{mv.nbytes} bytes")
    if cq_pos < 0 or _UNIT_SIZE > cq.nbytes - cq_pos:
        raise OutOfBounds(f"unit at {cq_pos} outside buffer of {cq.nbytes} bytes")
    running = max(running_max_ts, batch_max_ts)
    encode_head(mv, topic, queue_id, queue_offset, physical_offset, store_timestamp, batch_max_ts, tags_code, 0, span,
                body)
    _UNIT.pack_into(cq, cq_pos, physical_offset, size, span, tags_code, store_timestamp, running, queue_offset)
    return (size, span, running)


def write_entry(fd, pos, head, head_len, body) -> None:
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
#: and bytes, at most (but a larger entry goes alone). Measured on the test VM: 5 pipelined Produce requests to 100
#: partitions each were written 5.5 MB at a time, and the kernel's copy into the page cache
#: (copy_folio_from_iter_atomic) took 5-15x the CPU it took for the same bytes written 1.1 MB at a time; broker
#: CPU per record into 1,000 partitions with 100-record batches 0.16-0.20 us, 0.09-0.14 us in 1 MiB writes (1
#: partition: 0.06-0.11 either way; bench/produce_capacity.py, three alternating runs of each). Likely cause: the
#: page cache sizes its folios by the write, and large ones come from memory the VM's host has taken back.
WRITE_BYTES_CHUNK = 1 << 20


def write_entries(fd, pos, heads, head_len, bodies) -> None:
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
        parts = []
        nbytes = 0
        for k in range(i, min(i + WRITE_ENTRIES_CHUNK, len(views))):
            nbytes += head_len + views[k].nbytes - 8
            if parts and nbytes > WRITE_BYTES_CHUNK:
                break
            parts.append(h[k * head_len:(k + 1) * head_len])
            parts.append(views[k][8:])
        i += len(parts) // 2  # (counted first: _write_all consumes `parts`)
        pos = _write_all(fd, pos, parts)


def plan_prefetch(shard_type, queue_type, file_queue_type, file_type) -> bool:
    """The compiled kernel prefetches each partition's objects for `append_run` (reading their classes' slots);
    a hint with no effect on any result, so the twin prefetches nothing and says so (False)."""
    return False


def append_run(fd, seg_start, pos, seg_size, shards, entries, start, heads, topic, store_timestamp, out, grown,
               result_type, dirty) -> tuple:
    """The file store's append of many single-batch entries of one topic in one call (FileEngine._put_staged):
    stage a run of entries from `entries[start]` on, write it at offset `pos` of the CommitLog segment `fd`
    (which starts at CommitLog offset `seg_start` and holds `seg_size` bytes) with `write_entries`, then publish
    each entry. Returns (entries in the run, segment position after it, None), or (entries in the run, `pos`,
    the OSError) when the write failed, in which case nothing is published and `out` is untouched.

    An entry `(queue, [batch])` joins the run while: `shards[queue]` is a shard (`.cq`, `.log_start`) whose
    ConsumeQueue's last file (`cq.mfq.files[-1]`: `.wrote`, `.reserved`, `.buf`) has a reserved unit free; its
    queue is not already in the run; the batch is exactly one valid record batch (`append_head`); and its entry
    leaves BLANK_MIN_SIZE bytes free in the segment. The first entry that does not stops the run (the caller
    appends it on its own; a run of 0 entries writes nothing). Staging writes each entry's head into its slot of
    `heads` (head_size(len(topic)) bytes each; the run is at most as long as `heads` has slots) and its unit past
    the queue's published end, as `append_head` does with tags code 0 and store time `store_timestamp`.

    Publishing moves, per entry, the unit file's `wrote` and `committed` past its unit, the queue's `end_offset`
    past its span and its `max_ts` to the running maximum; marks a queue whose `dirty_since_phys` is below 0 with
    the entry's CommitLog offset and `store_timestamp` (`dirty_since_ms`) and adds it to `dirty`; appends
    `result_type(base, last offset, store_timestamp, shard.log_start, CommitLog offset)` to `out` and
    `(queue, new end offset)` to `grown`."""
    for name, value, kind in (("shards", shards, list), ("entries", entries, list), ("topic", topic, bytes),
                              ("out", out, list), ("grown", grown, list), ("dirty", dirty, set)):
        if type(value) is not kind:  # as the compiled kernel's typed arguments refuse them
            raise TypeError(f"Argument {name!r} has incorrect type (expected {kind.__name__}, got "
                            f"{type(value).__name__})")
    head_len = head_size(len(topic))
    h = _writable(heads)
    seg_start = _ssize(seg_start)
    pos = _ssize(pos)
    seg_size = _ssize(seg_size)
    start = _ssize(start)
    if start < 0 or pos < 0 or seg_size < pos or seg_start < 0:
        raise OutOfBounds(f"run from entry {start} at {pos} of a {seg_size}-byte segment at {seg_start}")
    limit = min(len(entries) - start, h.nbytes // head_len)
    staged: list[tuple] = []
    in_run: set[int] = set()
    cur = pos
    while len(staged) < limit:
        entry = entries[start + len(staged)]
        if type(entry) is not tuple or len(entry) != 2:
            break
        queue, batches = entry
        if type(queue) is not int or not 0 <= queue < len(shards) or queue in in_run:
            break  # a queue appears once in a run: its second entry builds on the first one's published end
        shard = shards[queue]
        if shard is None or len(batches) != 1:
            break
        try:
            cq = shard.cq
            files = cq.mfq.files
            if not files:
                break
            qf = files[-1]
            qpos = _ssize(qf.wrote)
            if qpos + _UNIT_SIZE > qf.reserved:
                break
            base = _i64(cq.end_offset)
            running = _i64(cq.max_ts)
            body = _view(batches[0])
        except Exception:  # noqa: BLE001 - a shape _put reports
            break
        try:
            slot = h[len(staged) * head_len:(len(staged) + 1) * head_len]
            done = None
            if (body.nbytes <= _INT32_MAX - FIXED_HEADER_SIZE - len(topic)
                    and FIXED_HEADER_SIZE + len(topic) + body.nbytes + BLANK_MIN_SIZE <= seg_size - cur):
                done = append_head(slot, topic, queue, base, seg_start + cur, store_timestamp, 0, body, qf.buf, qpos,
                                   running)
        except Exception:  # noqa: BLE001 - _put gives this entry its own answer
            done = None
        if done is None:
            break
        size, span, running = done
        staged.append((shard, cq, qf, queue, qpos, seg_start + cur, base, span, running, body))
        in_run.add(queue)
        cur += size
    if not staged:
        return (0, pos, None)
    try:
        write_entries(fd, pos, h, head_len, [entry[9] for entry in staged])
    except OSError as exc:
        return (len(staged), pos, exc)
    for shard, cq, qf, queue, qpos, phys, base, span, running, _body in staged:
        qf.wrote = qf.committed = qpos + _UNIT_SIZE
        end = cq.end_offset = base + span
        cq.max_ts = running
        if cq.dirty_since_phys < 0:
            cq.dirty_since_phys = phys
            cq.dirty_since_ms = store_timestamp
            dirty.add(cq)
        out.append(tuple.__new__(result_type, (base, end - 1, store_timestamp, shard.log_start, phys)))
        grown.append((queue, end))
    return (len(staged), cur, None)


def _write_all(fd, pos, parts) -> int:
    """pwritev `parts` at `pos` through short writes; returns the position after them."""
    while parts:
        done = os.pwritev(fd, parts, pos)
        if done == 0:
            raise OSError(0, f"pwritev wrote nothing at {pos}")
        pos += done
        while parts and done >= parts[0].nbytes:  # a short write (a signal, a device error to come): the rest
            done -= parts.pop(0).nbytes
        if parts and done:
            parts[0] = parts[0][done:]
    return pos


def put_entry(fd, pos, head, topic, queue_id, queue_offset, physical_offset, store_timestamp, tags_code, body,
              cq_buf, cq_pos, running_max_ts):
    """The file store's single-batch append in one call: `append_head` (same arguments but `fd` and `pos`, same
    None and OutOfBounds), then `write_entry` of that head and `body` at `pos` of `fd`. Returns what append_head
    returns. An OSError from the write leaves the unit written in `cq_buf`; the caller has not published it."""
    if _ssize(pos) < 0:
        raise OutOfBounds(f"entry write at {pos}")
    if fd < 0:
        raise OSError(errno.EBADF, "put_entry: bad file descriptor")
    done = append_head(head, topic, queue_id, queue_offset, physical_offset, store_timestamp, tags_code, body,
                       cq_buf, cq_pos, running_max_ts)
    if done is not None:
        write_entry(fd, pos, head, FIXED_HEADER_SIZE + len(topic) + 8, body)
    return done


def blank_head(size) -> bytes:
    """The bytes a BLANK entry of `size` bytes starts with (its size and magic; what follows them is never read).
    ValueError if size < BLANK_MIN_SIZE."""
    size = _i32(size)
    if size < BLANK_MIN_SIZE:
        raise ValueError(f"blank of {size} bytes is below the minimum {BLANK_MIN_SIZE}")
    return _SIZE_MAGIC.pack(size, MAGIC_BLANK)


def read_entry(buf, pos, limit, verify=True) -> tuple:
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
    if total_size < FIXED_HEADER_SIZE + BATCH_HEADER_SIZE or total_size > remaining:
        raise Corrupt(f"impossible entry size {total_size}", pos)
    (crc, queue_id, flags, queue_offset, physical_offset, record_count, store_timestamp, max_timestamp, tags_code,
     topic_len) = _FIXED.unpack_from(mv, pos)[2:]
    body_pos = pos + FIXED_HEADER_SIZE + topic_len
    if total_size - FIXED_HEADER_SIZE - topic_len < BATCH_HEADER_SIZE:
        raise Corrupt(f"topic length {topic_len} leaves no record batch", pos)
    if verify and crc32c(mv[pos + CRC_START:pos + total_size]) != crc:
        raise Corrupt("entry CRC mismatch", pos)
    try:
        topic = str(mv[pos + FIXED_HEADER_SIZE:body_pos], "utf-8")
    except UnicodeDecodeError:
        raise Corrupt("topic is not UTF-8", pos) from None
    return (KIND_MESSAGE, total_size, queue_id, flags, queue_offset, physical_offset, record_count, store_timestamp,
            max_timestamp, tags_code, topic, body_pos)
