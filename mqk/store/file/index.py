"""The file engine's key index (RocketMQ's IndexFile / IndexService): message key → CommitLog entries.

Owns `index/` under the engine root:
  <20-digit sequence>   fixed-size mapped index files, the newest last
  checkpoint            (offset indexed up to, last file, its entry count) behind a CRC, written after a flush
  topics.json           the topics whose Kafka record keys are indexed (`index.keys=true`), known before the
                        broker's topic metadata is, so the tail rebuilt at start indexes them the same way

One index file, all big-endian (RocketMQ's layout, plus a magic, a version and a second key hash):
  header (64 bytes): 0 magic u32 | 4 version u32 | 8 begin_ts i64 | 16 end_ts i64 | 24 begin_phys i64 |
                     32 end_phys i64 (CommitLog offset the file has seen entries up to) | 40 slot_count u32 |
                     44 max_entries u32 | 48 entry_count u32 | 52 used_slots u32 | 56 reserved
  slot table:        slot_count × u32: number of the newest entry whose key hashes to the slot (0 = none)
  entries:           max_entries × 24 bytes, numbered from 1: key_hash u32 | key_check u32 | phys i64 |
                     time_diff u32 (ms after begin_ts) | prev u32 (the slot's previous entry, 0 = none)

An index key is `topic + "#" + key` (RocketMQ's). `key_hash` (CRC32C) picks the slot; `key_check` (zlib CRC-32,
another polynomial) is compared too, so two keys share a chain entry only if both 32-bit hashes collide. The real
resolution of collisions is reading the CommitLog entry and finding the key in it: the `KEYS` header of a
RocketMQ message (space-separated) or a Kafka record key. Keys a caller passed to `append` out of band (not in
the record) cannot be checked that way; for an entry that carries no key at all the 64-bit hash match stands.

Which keys are indexed per CommitLog entry: the `keys` given to `append` (the RocketMQ server passes `KEYS`), plus
every record key of the batch when the topic has `index.keys=true`. When an entry is re-read from the CommitLog
(the tail after a crash), the keys come from the body: `KEYS` headers plus, for those topics, the record keys.

A file is full when it has `max_entries` entries or an entry's time would not fit its u32 ms difference (about
49 days); the next key opens a new file. Files whose time range misses a query's [begin, end] are skipped, and a
chain walk stops at the first entry older than `begin` (chains run newest to oldest).

Durability and recovery: the engine's checkpoint pass flushes the files then writes `checkpoint` (the entries
counted there are durable). At start the index cuts back to its checkpoint (dropping later files, cutting the
last one to its counted entries and rebuilding that file's slot table from them), cuts entries pointing past the
recovered CommitLog end, and indexes the CommitLog from its checkpoint offset to the end: only the tail, never a
full rescan (`recovery_report["scanned"]` counts the entries it read). Only a lost checkpoint forces a rebuild
from the oldest CommitLog segment. Files whose entries all point below the oldest CommitLog segment are deleted.

Every read of a file is bounds-checked; damage raises `Corrupt` (the service logs it and skips that file: the
CommitLog stays the truth). Writes happen on the event loop only; flushes run in the engine's checkpoint thread.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqk._fast import load
from mqk._fast.crc import crc32c
from mqk.errors import Corrupt, OutOfBounds, StorageError
from mqk.store.adapter import StoredBatch
from mqk.store.batches import decompress as _decompress
from mqk.store.file.mapped_file import MappedFile
from mqk.store.fsutil import atomic_write_bytes, atomic_write_json, read_json

if TYPE_CHECKING:
    from mqk.config import TopicConfig
    from mqk.store.adapter import Buffer
    from mqk.store.file.commitlog import CommitLog
    from mqk.store.file.shards import Shard

    Shards = dict[tuple[str, int], Shard]

log = logging.getLogger(__name__)
recbatch = load("recbatch")

MAGIC = 0x4D514B49  # "MQKI"
VERSION = 1
HEADER = struct.Struct(">IIqqqqIIII8x")
HEADER_SIZE = HEADER.size  # 64
SLOT = struct.Struct(">I")
ENTRY = struct.Struct(">IIqII")
ENTRY_SIZE = ENTRY.size  # 24
_I64 = struct.Struct(">q")
_BODY_MAX_TS = 35  # a record batch's max timestamp field
#: defaults for new files: ~20 MB each (RocketMQ's 5M slots / 20M entries make 420 MB files)
DEFAULT_SLOTS = 200_000
DEFAULT_MAX_ENTRIES = 800_000
MAX_TIME_DIFF = 0xFFFFFFFF
KEY_SEPARATOR = b" "
PROPERTY_KEYS = "KEYS"

_CHECKPOINT = struct.Struct(">IqqII")  # version, indexed offset, last file sequence, its entry count, crc32c


def index_key(topic: str, key: bytes) -> bytes:
    return topic.encode() + b"#" + bytes(key)


def key_hashes(ikey: bytes) -> tuple[int, int]:
    return crc32c(ikey), zlib.crc32(ikey)


def batch_keys(body: Buffer, record_keys: bool, key_headers: bool = True) -> set[bytes]:
    """Keys carried by a stored record batch: values of `KEYS` headers (split on spaces) and, with
    `record_keys`, the records' keys. Empty when the batch cannot be decoded (it was validated when written;
    a batch too large to inflate within the store's bound gives no keys rather than an unbounded allocation)."""
    out: set[bytes] = set()
    try:
        header = recbatch.parse_header(body, 0)
        section = bytes(memoryview(body)[recbatch.HEADER_SIZE :])
        codec = header[5] & 0x07
        if codec:
            section = _decompress(codec, section)
        records = recbatch.decode_records(section, header[12])
    except Exception as exc:  # noqa: BLE001 - codec libraries raise their own types; no keys is the answer
        log.debug("index: cannot decode a batch for its keys: %s", exc)
        return out
    for record in records:
        key = record[3]
        if record_keys and key is not None:
            out.add(bytes(key))
        if key_headers:
            for name, value in record[5]:
                if name == PROPERTY_KEYS and value:
                    out.update(k for k in bytes(value).split(KEY_SEPARATOR) if k)
    return out


class IndexFile:
    """One mapped index file. Positions are published (entry count in the header) only after the entry and its
    slot are in place."""

    def __init__(
        self,
        path: Path,
        seq: int,
        slots: int,
        max_entries: int,
        *,
        create: bool,
        begin_phys: int = 0,
        begin_ts: int = 0,
    ) -> None:
        self.path = Path(path)
        self.seq = seq
        if create:
            if not 1 <= slots <= 1 << 28 or not 1 <= max_entries < 1 << 28:
                raise StorageError(f"index file geometry {slots} slots / {max_entries} entries is out of range")
            self.mf = MappedFile(self.path, HEADER_SIZE + slots * SLOT.size + max_entries * ENTRY_SIZE, seq)
            self.mf.set_positions(self.mf.file_size)
            try:
                self.mf.write_at(
                    0, HEADER.pack(MAGIC, VERSION, begin_ts, begin_ts, begin_phys, begin_phys, slots, max_entries, 0, 0)
                )
            except BaseException:
                self.mf.destroy()
                raise
        else:
            size = self.path.stat().st_size
            if size < HEADER_SIZE:
                raise Corrupt(f"index file {self.path.name} has only {size} bytes")
            with open(self.path, "rb") as fh:
                head = fh.read(HEADER_SIZE)
            magic, version, *_, slots, max_entries, _count, _used = HEADER.unpack(head)
            if magic != MAGIC or version != VERSION:
                raise Corrupt(f"index file {self.path.name}: bad magic or version")
            expect = HEADER_SIZE + slots * SLOT.size + max_entries * ENTRY_SIZE
            if slots < 1 or max_entries < 1 or expect != size:
                raise Corrupt(
                    f"index file {self.path.name}: {slots} slots / {max_entries} entries do not make its {size} bytes"
                )
            self.mf = MappedFile(self.path, size, seq)
            self.mf.set_positions(size)
        self.slots = slots
        self.max_entries = max_entries
        #: changed since the last checkpoint snapshot (then it must be flushed before the checkpoint is written)
        self.dirty = create
        self._entries_at = HEADER_SIZE + slots * SLOT.size
        (_, _, self.begin_ts, self.end_ts, self.begin_phys, self.end_phys, _, _, self.count, self.used_slots) = (
            HEADER.unpack_from(self.mf.buf, 0)
        )
        if self.count > max_entries:
            raise Corrupt(f"index file {self.path.name} claims {self.count} entries of {max_entries}")

    # --- writing -------------------------------------------------------------------------------------

    def is_full(self, store_ts: int) -> bool:
        count: int = self.count
        return count >= self.max_entries or (count > 0 and store_ts - self.begin_ts > MAX_TIME_DIFF)

    def put(self, key_hash: int, key_check: int, phys: int, store_ts: int) -> None:
        """Add one entry (the caller checked `is_full`)."""
        n = self.count + 1
        if n > self.max_entries:
            raise OutOfBounds(f"index file {self.path.name} is full ({self.max_entries} entries)")
        if self.count == 0:
            self.begin_ts, self.begin_phys = store_ts, phys
        diff = min(max(store_ts - self.begin_ts, 0), MAX_TIME_DIFF)
        slot_pos = HEADER_SIZE + (key_hash % self.slots) * SLOT.size
        buf = self.mf.buf
        prev = SLOT.unpack_from(buf, slot_pos)[0]
        if prev > self.count:
            prev = 0  # never link to an entry that is not published (a damaged slot)
        ENTRY.pack_into(buf, self._entries_at + (n - 1) * ENTRY_SIZE, key_hash, key_check, phys, diff, prev)
        SLOT.pack_into(buf, slot_pos, n)
        if prev == 0:
            self.used_slots += 1
        self.count = n
        self.end_ts = max(self.end_ts, store_ts)
        self._write_header()
        self.dirty = True

    def set_end_phys(self, end_phys: int) -> None:
        self.end_phys = end_phys
        _I64.pack_into(self.mf.buf, 32, end_phys)
        self.dirty = True

    def _write_header(self) -> None:
        HEADER.pack_into(
            self.mf.buf,
            0,
            MAGIC,
            VERSION,
            self.begin_ts,
            self.end_ts,
            self.begin_phys,
            self.end_phys,
            self.slots,
            self.max_entries,
            self.count,
            self.used_slots,
        )

    # --- reading -------------------------------------------------------------------------------------

    def entry(self, n: int) -> tuple[int, int, int, int, int]:
        """(key_hash, key_check, phys, store_ts, prev) of entry `n` (1-based, published)."""
        if not 1 <= n <= self.count:
            raise OutOfBounds(f"index entry {n} outside [1, {self.count}] of {self.path.name}")
        h, c, phys, diff, prev = ENTRY.unpack_from(self.mf.buf, self._entries_at + (n - 1) * ENTRY_SIZE)
        return h, c, phys, self.begin_ts + diff, prev

    def lookup(self, key_hash: int, key_check: int, begin_ms: int, end_ms: int) -> Iterator[tuple[int, int]]:
        """(phys, store_ts) of the entries with both hashes in [begin_ms, end_ms], newest first."""
        n = SLOT.unpack_from(self.mf.buf, HEADER_SIZE + (key_hash % self.slots) * SLOT.size)[0]
        if n > self.count:
            raise Corrupt(f"index file {self.path.name}: slot points at entry {n} of {self.count}")
        while n:
            h, c, phys, ts, prev = self.entry(n)
            if h == key_hash and c == key_check and begin_ms <= ts <= end_ms:
                yield phys, ts
            if ts < begin_ms:
                return  # the rest of the chain is older still
            if prev >= n:
                raise Corrupt(f"index file {self.path.name}: entry {n} links forward to {prev}")
            n = prev

    # --- recovery ------------------------------------------------------------------------------------

    def cut(self, count: int) -> None:
        """Keep only the first `count` entries and rebuild the slot table from them (the slots of cut entries
        may point anywhere; entries below `count` were durable and link only backwards)."""
        if not 0 <= count <= self.count:
            raise OutOfBounds(f"cut to {count} entries outside [0, {self.count}] of {self.path.name}")
        buf = self.mf.buf
        buf[HEADER_SIZE : self._entries_at] = bytes(self._entries_at - HEADER_SIZE)
        heads: dict[int, int] = {}
        end_ts = self.begin_ts
        base = self._entries_at
        for i, (h, _c, _phys, diff, _prev) in enumerate(ENTRY.iter_unpack(buf[base : base + count * ENTRY_SIZE])):
            heads[h % self.slots] = i + 1
            end_ts = max(end_ts, self.begin_ts + diff)
        for slot, n in heads.items():
            SLOT.pack_into(buf, HEADER_SIZE + slot * SLOT.size, n)
        tail = base + count * ENTRY_SIZE
        used = self.count * ENTRY_SIZE - count * ENTRY_SIZE
        if used > 0:
            buf[tail : tail + used] = bytes(used)
        self.count = count
        self.used_slots = len(heads)
        self.end_ts = end_ts
        self._write_header()
        self.dirty = True

    def last_below(self, phys: int) -> int:
        """How many leading entries point below `phys` (entries are in CommitLog order)."""
        lo, hi = 0, self.count
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(mid + 1)[2] < phys:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def flush(self) -> None:
        self.mf.flushed = 0  # positions do not track index writes (slots change anywhere): always sync
        self.mf.flush()

    def close(self) -> None:
        self.mf.close()

    def destroy(self) -> None:
        self.mf.destroy()


class IndexService:
    """The index files of one engine, the dispatch hook that fills them, lookups, checkpoint and recovery."""

    def __init__(self, directory: Path, slots: int = DEFAULT_SLOTS, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.dir = Path(directory)
        #: geometry of files created from now on (existing files keep theirs: the header says)
        self.slots = slots
        self.max_entries = max_entries
        self.files: list[IndexFile] = []
        #: CommitLog offset below which every entry has been considered for the index
        self.indexed_offset = 0
        self.keyed_topics: set[str] = set()
        #: False until recovery is done: the engine's own replay calls the hook too, and the index rebuilds its
        #: tail itself from its own checkpoint instead
        self.ready = False
        self.recovery_report: dict[str, Any] = {}
        #: entries written since start (tests and operators)
        self.entries_written = 0
        self._stored: tuple[int, int, int] | None = None

    # --- topics --------------------------------------------------------------------------------------

    async def configure(self, topic: str, config: TopicConfig | None) -> None:
        """Learn a topic's `index.keys` (None: the topic is gone); persisted when it changes."""
        keyed = config is not None and config.get("index.keys").strip().lower() == "true"
        if keyed == (topic in self.keyed_topics):
            return
        if keyed:
            self.keyed_topics.add(topic)
        else:
            self.keyed_topics.discard(topic)
        doc = {"version": 1, "keyed_topics": sorted(self.keyed_topics)}
        await asyncio.to_thread(self._save_topics, doc)

    def _save_topics(self, doc: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.dir / "topics.json", doc)

    # --- the dispatch hook ---------------------------------------------------------------------------

    def dispatch(
        self,
        topic: str,
        queue: int,
        base_offset: int,
        count: int,
        phys: int,
        size: int,
        store_ts: int,
        keys: Sequence[bytes] | None,
        body: Buffer,
    ) -> None:
        """ReputMessageService hook: index one CommitLog entry (`keys` None: take them from `body`)."""
        if not self.ready or phys < self.indexed_offset:
            return
        keyed = topic in self.keyed_topics
        if keys is None:
            found = batch_keys(body, keyed, True)
        elif keyed:
            found = set(map(bytes, keys)) | batch_keys(body, True, False)
        elif keys:
            found = set(map(bytes, keys))
        else:
            found = None
        if found:
            prefix = topic.encode() + b"#"
            for key in found:
                self._put(prefix + key, phys, store_ts)
            self.files[-1].set_end_phys(phys + size)
        self.indexed_offset = phys + size

    def _put(self, ikey: bytes, phys: int, store_ts: int) -> None:
        h, c = key_hashes(ikey)
        f = self.files[-1] if self.files else None
        if f is None or f.is_full(store_ts):
            f = self._new_file(phys, store_ts)
        f.put(h, c, phys, store_ts)
        self.entries_written += 1

    def _new_file(self, phys: int, store_ts: int) -> IndexFile:
        seq = self.files[-1].seq + 1 if self.files else 1
        self.dir.mkdir(parents=True, exist_ok=True)
        f = IndexFile(
            self.dir / f"{seq:020d}", seq, self.slots, self.max_entries, create=True, begin_phys=phys, begin_ts=store_ts
        )
        self.files.append(f)
        return f

    # --- queries -------------------------------------------------------------------------------------

    def candidates(self, topic: str, key: bytes, begin_ms: int, end_ms: int) -> Iterator[int]:
        """CommitLog offsets of entries that may hold `key`, newest first, each once."""
        h, c = key_hashes(index_key(topic, key))
        seen: set[int] = set()
        for f in reversed(list(self.files)):
            if f.count == 0 or f.end_ts < begin_ms or f.begin_ts > end_ms:
                continue
            try:
                for phys, _ts in f.lookup(h, c, begin_ms, end_ms):
                    if phys not in seen:
                        seen.add(phys)
                        yield phys
            except StorageError as exc:
                log.error("key index file %s is damaged (%s); skipping it", f.path.name, exc)

    def find(
        self,
        clog: CommitLog,
        shards: Shards,
        topic: str,
        key: bytes,
        max_count: int,
        begin_ms: int,
        end_ms: int,
        candidates: Iterable[int] | None = None,
    ) -> list[tuple[int, StoredBatch]]:
        """(queue, batch) pairs whose entry holds `key`, newest first: each candidate is checked against the
        CommitLog entry (still there, same topic incarnation, not below the log start, in the time range, key
        really in it). `candidates`: the caller's own walk of `candidates`, if it took one."""
        out: list[tuple[int, StoredBatch]] = []
        if max_count <= 0:
            return out
        key = bytes(key)
        for phys in self.candidates(topic, key, begin_ms, end_ms) if candidates is None else candidates:
            found = live_entry(clog, shards, phys, verify=False)
            if found is None or found[0] != topic or not begin_ms <= found[2].store_timestamp <= end_ms:
                continue
            _topic, queue, batch = found
            carried = batch_keys(batch.data, True, True)
            if carried and key not in carried:
                continue  # a hash collision
            out.append((queue, batch))
            if len(out) >= max_count:
                break
        return out

    # --- checkpoint ----------------------------------------------------------------------------------

    def snapshot(self, min_phys: int = 0, considered: int = 0) -> tuple[int, list[IndexFile], int, int]:
        """What a checkpoint will record, taken on the event loop where the index is written: (indexed offset,
        files to flush, last file's sequence, its entry count). `considered` is a CommitLog offset below which the
        caller knows every entry was either shown to `dispatch` or had nothing to index (the engine does not call
        the hook for those); the indexed offset moves up to it. Also drops files that only point below `min_phys`
        (CommitLog segments reclaimed), never the last one."""
        if self.ready and considered > self.indexed_offset:
            self.indexed_offset = considered
        while len(self.files) > 1 and self.files[0].end_phys <= min_phys:
            f = self.files.pop(0)
            log.info("key index file %s only covers reclaimed CommitLog; deleting it", f.path.name)
            f.destroy()
        last = self.files[-1] if self.files else None
        dirty = [f for f in self.files if f.dirty]
        for f in dirty:
            f.dirty = False
        return self.indexed_offset, dirty, last.seq if last else 0, last.count if last else 0

    def store_checkpoint(self, snap: tuple[int, list[IndexFile], int, int]) -> None:
        """Blocking: flush the files the snapshot found changed, then record it (skipped when nothing moved)."""
        offset, files, seq, count = snap
        for f in files:
            try:
                f.flush()
            except (OSError, ValueError) as exc:  # a file deleted under us by a later snapshot
                log.debug("key index flush of %s skipped: %s", f.path.name, exc)
        if self._stored == (offset, seq, count):
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.dir / "checkpoint", encode_checkpoint(offset, seq, count))
        self._stored = (offset, seq, count)

    # --- recovery ------------------------------------------------------------------------------------

    def recover(self, clog: CommitLog, shards: Shards) -> None:
        """Blocking start-up work, after the CommitLog is recovered: load, cut back to the checkpoint and to the
        CommitLog end, then index the tail the checkpoint does not cover."""
        self.dir.mkdir(parents=True, exist_ok=True)
        doc = None
        try:
            doc = read_json(self.dir / "topics.json")
        except Corrupt as exc:
            log.error("key index topics.json unreadable (%s); Kafka record keys of the tail are not indexed", exc)
        if isinstance(doc, dict):
            self.keyed_topics = {str(t) for t in doc.get("keyed_topics", ())}
        end = clog.max_offset
        start_min = clog.min_offset
        report = {"from": 0, "scanned": 0, "indexed": 0, "cut_entries": 0, "checkpoint": False}
        self.recovery_report = report
        ckpt = decode_checkpoint(self.dir / "checkpoint")
        names = sorted(p for p in self.dir.iterdir() if p.is_file() and p.name.isdigit() and len(p.name) == 20)
        files: list[IndexFile] = []
        offset = start_min
        if ckpt is None:
            if names:
                log.warning("key index has no usable checkpoint; rebuilding it from the CommitLog")
            for p in names:
                p.unlink()
        else:
            report["checkpoint"] = True
            offset, ck_seq, ck_count = ckpt
            for p in names:
                seq = int(p.name)
                if seq > ck_seq:
                    p.unlink()  # made after the checkpoint: rebuilt from the CommitLog
                    continue
                try:
                    f = IndexFile(p, seq, self.slots, self.max_entries, create=False)
                except (StorageError, OSError) as exc:
                    log.error("key index file %s unreadable (%s); rebuilding from the file before it", p.name, exc)
                    for later in names[names.index(p) :]:
                        later.unlink(missing_ok=True)
                    offset = files[-1].end_phys if files else start_min
                    break
                if seq == ck_seq and f.count != ck_count:
                    if f.count < ck_count:
                        # entries the checkpoint counted are missing: trust the file only as far as it goes
                        offset = min(offset, f.end_phys)
                    else:
                        report["cut_entries"] += f.count - ck_count
                        f.cut(ck_count)
                    f.set_end_phys(offset)
                files.append(f)
            if ck_seq and not any(f.seq == ck_seq for f in files):
                # the file the checkpoint counted in is gone: index again after the last one we have
                offset = min(offset, files[-1].end_phys if files else start_min)
        self.files = files
        # a CommitLog cut below what was indexed (torn tail): drop entries pointing at or past its end
        if offset > end:
            report["cut_entries"] += self._cut_files(end)
            offset = end
        offset = max(offset, start_min)
        self.indexed_offset = offset
        report["from"] = offset
        self.ready = True
        if offset < end:
            self._index_tail(clog, shards, offset, end, report)
        self.indexed_offset = end
        for f in self.files:
            f.dirty = True  # cut or extended above: make it durable before the checkpoint says so
        try:
            self.store_checkpoint(self.snapshot(start_min))
        except OSError as exc:
            # a full disk must not keep the broker from starting: the checkpoint on disk is the previous one,
            # which the next start cuts back to and re-reads from, as after a crash; the running checkpoint
            # loop writes a new one once there is room
            log.warning("key index checkpoint not written at start-up (%s): the previous one stands", exc)
        if report["scanned"] or report["cut_entries"]:
            log.info(
                "key index recovered: cut %d entries, re-read %d CommitLog entries from %d",
                report["cut_entries"],
                report["scanned"],
                offset,
            )

    def cut_to(self, end: int) -> None:
        """The CommitLog was cut back to `end` (a replica's diverged tail): forget the entries past it."""
        if self.indexed_offset > end:
            self._cut_files(end)
            self.indexed_offset = end
            for f in self.files:
                f.dirty = True

    def _cut_files(self, end: int) -> int:
        """Drop index entries pointing at or past CommitLog offset `end`; how many went."""
        cut = 0
        files = self.files
        while files:
            f = files[-1]
            keep = f.last_below(end)
            cut += f.count - keep
            if keep:
                f.cut(keep)
                f.set_end_phys(end)
                break
            files.pop()
            f.destroy()
        return cut

    def _index_tail(self, clog: CommitLog, shards: Shards, start: int, end: int, report: dict[str, Any]) -> None:
        for phys, entry, mf in clog.scan(start):
            if phys >= end:
                break
            report["scanned"] += 1
            size, queue, base, count, store_ts, topic, body_pos = (
                entry[1],
                entry[2],
                entry[4],
                entry[6],
                entry[7],
                entry[10],
                entry[11],
            )
            shard = shards.get((topic, queue))
            if shard is None or phys < shard.created_phys:
                self.indexed_offset = phys + size
                continue
            body = mf.buf[body_pos : phys - mf.start_offset + size]
            before = self.entries_written
            self.dispatch(topic, queue, base, count, phys, size, store_ts, None, body)
            report["indexed"] += self.entries_written - before

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.ready = False


def live_entry(clog: CommitLog, shards: Shards, phys: int, verify: bool = True) -> tuple[str, int, StoredBatch] | None:
    """(topic, queue, batch) of the message entry starting at CommitLog offset `phys` if it is still served, else
    None: inside the log (not reclaimed, not cut at recovery), a message entry that names itself (so `phys` is an
    entry boundary, not bytes inside another entry), of a shard that exists and was created before it (not an
    older incarnation of a re-created topic), not wholly below the log start, dispatched. Shared by the key index
    (hits are only candidates) and `FileEngine.read_at` (ids clients hold); `verify` also checks the CRC."""
    if phys < clog.min_offset or phys >= clog.max_offset:
        return None  # reclaimed, or cut at recovery
    try:
        mf = clog.mfq.find(phys)
        entry = clog.read_entry(phys, verify=verify)
    except StorageError:
        return None  # not an entry boundary (bad magic or size), or damaged
    kind, size, queue, _flags, base, entry_phys, count, store_ts, _max_ts, tags, topic, body_pos = entry
    if kind != 1 or entry_phys != phys:
        return None
    shard = shards.get((topic, queue))
    if shard is None or phys < shard.created_phys or base + count <= shard.log_start:
        return None
    if base >= shard.cq.end_offset:
        return None  # not dispatched (cannot happen while dispatch is synchronous)
    body = mf.buf[body_pos : phys - mf.start_offset + size]
    max_ts = _I64.unpack_from(body, _BODY_MAX_TS)[0]
    return topic, queue, StoredBatch(base, count, body, store_ts, max_ts, tags, phys)


def encode_checkpoint(offset: int, seq: int, count: int) -> bytes:
    head = _CHECKPOINT.pack(VERSION, offset, seq, count, 0)[:-4]
    return head + SLOT.pack(crc32c(head))


def decode_checkpoint(path: Path) -> tuple[int, int, int] | None:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    if len(data) != _CHECKPOINT.size:
        log.error("key index checkpoint has %d bytes, expected %d; ignoring it", len(data), _CHECKPOINT.size)
        return None
    version, offset, seq, count, crc = _CHECKPOINT.unpack(data)
    if crc != crc32c(data[:-4]) or version != VERSION or offset < 0:
        log.error("key index checkpoint fails its check; ignoring it")
        return None
    return offset, seq, count


__all__ = ["IndexFile", "IndexService", "batch_keys", "index_key"]
