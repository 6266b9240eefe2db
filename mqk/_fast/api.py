"""The typed faces of the `_fast` kernels: one `typing.Protocol` per module, which both of its twins satisfy.

`mqk._fast.load(name)` returns the compiled module or its pure-Python twin typed as the module's Protocol here, so
the store and the protocol layer are type-checked against these signatures whichever twin runs. mypy checks each
twin module against its Protocol (`mqk/_fast/conformance.py` assigns the module to it), and
tests/unit/test_fast_api.py holds the compiled modules to the same names, parameters and defaults, so a kernel and
its twin cannot drift apart. A change of a kernel's API starts here.

Buffers are anything with the buffer protocol (bytes, bytearray, memoryview, mmap, array); arguments written
into must be writable. Integer arguments are range-checked by the kernels (OverflowError outside the field's
range, TypeError for a non-integer), which a type cannot say. Results that are fixed-size records are tuples,
named by the aliases below; their fields are documented at the function in the twin.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar
from uuid import UUID

if TYPE_CHECKING:
    # (3.12 has collections.abc.Buffer; typing_extensions ships with the type checker, not needed at run time)
    from typing_extensions import Buffer

_T = TypeVar("_T")

#: parse_header: base_offset, batch_length, partition_leader_epoch, magic, crc, attributes, last_offset_delta,
#: base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, record_count
BatchHeader: TypeAlias = tuple[int, int, int, int, int, int, int, int, int, int, int, int, int]
#: scan_batches, per batch: pos, size, last_offset_delta, max_timestamp, record_count, attributes, producer_id,
#: producer_epoch, base_sequence, base_timestamp, named (None: records not walked)
ScannedBatch: TypeAlias = tuple[int, int, int, int, int, int, int, int, int, int, bool | None]
#: a record header: key, value (None: null)
RecordHeader: TypeAlias = tuple[str, bytes | None]
#: decode_records, per record: attributes, timestamp_delta, offset_delta, key, value, headers
Record: TypeAlias = tuple[int, int, int, bytes | None, bytes | None, list[RecordHeader]]
#: read_entry: kind, total_size, queue_id, flags, queue_offset, physical_offset, record_count, store_timestamp,
#: max_timestamp, tags_code, topic, body_pos
LogEntry: TypeAlias = tuple[int, int, int, int, int, int, int, int, int, int, str, int]
#: AppendRun.batch: entry index, index in the entry, queue id, base offset, span, CommitLog offset, entry size
StagedBatch: TypeAlias = tuple[int, int, int, int, int, int, int]
#: unpack_unit: physical_offset, size, record_count, tags_code, store_ts, max_ts, base_offset
Unit: TypeAlias = tuple[int, int, int, int, int, int, int]


class RecbatchApi(Protocol):
    """Kafka record batch v2 kernels (recbatch.pyx / recbatch_py.py)."""

    __name__: str
    HEADER_SIZE: int
    MAGIC: int
    MIN_BATCH_LENGTH: int
    CRC_START: int
    ATTR_COMPRESSION_MASK: int
    ATTR_LOG_APPEND_TIME: int
    MIN_RECORD_BODY: int
    PLAN_END: int
    PLAN_SHAPE: int
    PLAN_NO_QUEUE: int
    PLAN_LEGACY: int
    PLAN_IDEMPOTENT: int
    PLAN_INVALID: int
    PLAN_COMPRESSED: int
    PLAN_TOO_LARGE: int
    PLAN_CONTROL: int

    def crc32c_direct(self) -> bool: ...
    def parse_header(self, buf: Buffer, pos: int = 0) -> BatchHeader: ...
    def scan_batches(
        self,
        buf: Buffer,
        verify_crc: bool = True,
        walk_records: bool = False,
        names: tuple[bytes, ...] = (),
        require_keys: bool = False,
        timestamps: tuple[int, int] | None = None,
    ) -> list[ScannedBatch]: ...
    def plan_plain_appends(
        self,
        partitions: list[Any],
        start: int,
        queue_count: int,
        max_batch_bytes: int,
        names: tuple[bytes, ...],
        require_keys: bool,
        timestamps: tuple[int, int] | None,
        entries: list[tuple[int, list[Any]]],  # (the kernel appends (queue id, [memoryview of each batch]))
        delays: list[bool],
        slots: list[int],
        answers: list[Any],
    ) -> tuple[int, int]: ...  # (where it stopped, why: PLAN_*)
    def count_records(self, buf: Buffer, pos: int, size: int) -> int: ...
    def has_header(self, buf: Buffer, pos: int, size: int, names: tuple[bytes, ...]) -> bool: ...
    def check_records(
        self,
        data: Buffer,
        expected: int,
        names: tuple[bytes, ...] = (),
        require_keys: bool = False,
        timestamps: tuple[int, int] | None = None,
        base_timestamp: int = 0,
    ) -> bool: ...
    def decode_records(self, data: Buffer, count: int) -> list[Record]: ...
    def encode_record(
        self,
        offset_delta: int,
        timestamp_delta: int,
        key: Buffer | None,
        value: Buffer | None,
        headers: Sequence[tuple[str, Buffer | None]],
    ) -> bytes: ...
    def build_batch(
        self,
        base_offset: int,
        base_timestamp: int,
        max_timestamp: int,
        records: Buffer,
        record_count: int,
        last_offset_delta: int,
        attributes: int = 0,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
        partition_leader_epoch: int = -1,
    ) -> bytearray: ...
    def set_base_offset(self, buf: Buffer, pos: int, base_offset: int) -> None: ...
    def set_log_append_time(self, buf: Buffer, pos: int, ts: int) -> None: ...
    def new_buffer(self, size: int) -> bytearray: ...


class CqunitApi(Protocol):
    """ConsumeQueue unit kernels (cqunit.pyx / cqunit_py.py)."""

    UNIT_SIZE: int

    def pack_unit(
        self,
        buf: Buffer,
        pos: int,
        physical_offset: int,
        size: int,
        record_count: int,
        tags_code: int,
        store_ts: int,
        max_ts: int,
        base_offset: int,
    ) -> None: ...
    def unpack_unit(self, buf: Buffer, pos: int) -> Unit: ...
    def search_offset(self, buf: Buffer, n_units: int, offset: int) -> int: ...
    def search_timestamp(self, buf: Buffer, n_units: int, ts: int) -> int: ...
    def hash_tag(self, tag: str) -> int: ...


class AppendRunApi(Protocol):
    """The file store's append kernel (clentry.AppendRun): plan, write and publish a run of entries against the
    queue table `rows`. Read-only counters and the last plan's window; see clentry_py.AppendRun."""

    @property
    def capacity(self) -> int: ...
    @property
    def batches(self) -> int: ...
    @property
    def entries(self) -> int: ...
    @property
    def stop(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def pos(self) -> int: ...
    @property
    def end_pos(self) -> int: ...
    @property
    def seg_start(self) -> int: ...
    @property
    def store_timestamp(self) -> int: ...
    @property
    def published_entries(self) -> int: ...
    @property
    def published_batches(self) -> int: ...
    @property
    def published_bytes(self) -> int: ...

    def plan(
        self,
        rows: Buffer,
        slot_map: Buffer,
        unit_bufs: list[memoryview | None],
        # (queue id, [record batch, ...]) pairs; an entry of another shape stops the plan (STOP_SHAPE)
        entries: list[Any],
        start: int,
        topic: bytes,
        store_timestamp: int,
        tags_code: int,
        seg_start: int,
        pos: int,
        seg_size: int,
        write_to: int = -1,
    ) -> int: ...
    def write(self, fd: int) -> None: ...
    def publish(
        self, rows: Buffer, out: list[_T], grown: list[tuple[int, int]], dirtied: list[int], result_type: type[_T]
    ) -> int: ...
    def abandon(self, rows: Buffer) -> None: ...
    def batch(self, i: int) -> StagedBatch: ...


class ClentryApi(Protocol):
    """CommitLog entry kernels and the append kernel (clentry.pyx / clentry_py.py)."""

    FIXED_HEADER_SIZE: int
    MAGIC_MESSAGE: int
    MAGIC_BLANK: int
    BLANK_MIN_SIZE: int
    CRC_START: int
    KIND_END: int
    KIND_MESSAGE: int
    KIND_BLANK: int
    MAX_TOPIC_LEN: int
    WRITE_ENTRIES_CHUNK: int
    WRITE_BYTES_CHUNK: int
    ROW_END: int
    ROW_MAX_TS: int
    ROW_CQ_WROTE: int
    ROW_CQ_RESERVED: int
    ROW_DIRTY_PHYS: int
    ROW_DIRTY_MS: int
    ROW_LOG_START: int
    ROW_STAGED: int
    ROW_FIELDS: int
    ROW_BYTES: int
    STOP_END: int
    STOP_FULL: int
    STOP_SEGMENT: int
    STOP_UNIT_ROOM: int
    STOP_NO_SHARD: int
    STOP_BATCH: int
    STOP_SHAPE: int

    def AppendRun(self, capacity: int = 4096) -> AppendRunApi: ...  # (the kernel's class: its constructor)
    def entry_size(self, topic_len: int, body_len: int) -> int: ...
    def head_size(self, topic_len: int) -> int: ...
    def encode_head(
        self,
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
    ) -> int: ...
    def write_entry(self, fd: int, pos: int, head: Buffer, head_len: int, body: Buffer) -> None: ...
    def write_entries(self, fd: int, pos: int, heads: Buffer, head_len: int, bodies: Sequence[Buffer]) -> None: ...
    def blank_head(self, size: int) -> bytes: ...
    def read_entry(self, buf: Buffer, pos: int, limit: int, verify: bool = True) -> LogEntry: ...
    def acceptable_batch(self, body: Buffer) -> bool: ...


class ProducereqApi(Protocol):
    """Produce request bodies decoded by hand (producereq.pyx / producereq_py.py)."""

    ZERO_UUID: UUID
    FIRST_VERSION: int
    LAST_VERSION: int

    def decode_produce_request(self, buf: memoryview, version: int) -> dict[str, Any]: ...


class FetchreqApi(Protocol):
    """Fetch request bodies decoded by hand (fetchreq.pyx / fetchreq_py.py); an int: left to the generated codec,
    and why (handwritten.DECLINE_FIELD: a tagged field)."""

    ZERO_UUID: UUID
    FIRST_VERSION: int
    LAST_VERSION: int

    def decode_fetch_request(self, buf: memoryview, version: int) -> dict[str, Any] | int: ...


class ProducerespApi(Protocol):
    """Produce response bodies encoded by hand (produceresp.pyx / produceresp_py.py): DECLINE_NONE (0) when it
    wrote the body into `out`, else why it left it to the generated codec (a handwritten.DECLINE_* code), `out`
    untouched."""

    FIRST_VERSION: int
    LAST_VERSION: int

    def encode_produce_response(self, body: object, version: int, out: bytearray) -> int: ...


class FetchrespApi(Protocol):
    """Fetch response bodies encoded by hand (fetchresp.pyx / fetchresp_py.py): the answer as buffers, `out`
    first; an int: left to the generated codec, and why (a handwritten.DECLINE_* code), `out` untouched."""

    FIRST_VERSION: int
    LAST_VERSION: int
    INLINE_MAX: int

    def encode_fetch_response(
        self, body: object, version: int, out: bytearray
    ) -> list[bytes | bytearray | memoryview] | int: ...


#: each kernel module's face, by the name `mqk._fast.load` takes
FACES: dict[str, type[Any]] = {
    "clentry": ClentryApi,
    "cqunit": CqunitApi,
    "fetchreq": FetchreqApi,
    "fetchresp": FetchrespApi,
    "producereq": ProducereqApi,
    "produceresp": ProducerespApi,
    "recbatch": RecbatchApi,
}
