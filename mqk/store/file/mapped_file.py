"""Fixed-size memory-mapped segment files and the ordered queue of them (RocketMQ's MappedFile / MappedFileQueue).

A `MappedFile` is one file of exactly `file_size` bytes, named by the 20-digit logical offset of its first byte, mapped
shared and read/write. It keeps three positions: `wrote` (bytes in place in the file's page cache), `committed`
(equal to `wrote`: there is no transient buffer pool holding bytes not yet in the file) and `flushed` (known
durable). Every read and write is bounds-checked and raises `OutOfBounds`; a position only moves after the bytes
are in place, so a reader that trusts positions never sees half-written data.

Two ways in, one way out. Small fixed-size structures (ConsumeQueue units, index slots) are stored straight into the
mapping (`append`, `write_at`). CommitLog entries are written through the file descriptor (the append pipeline's
pwritev of entry heads and producers' batches, append.py; `write` here for anything else), because storing into a
shared mapping costs the writer a page fault per fresh page, and every flush a write-protect pass over the pages the
writer dirtied through it; a pwritev does neither. Reads of both are zero-copy views of the mapping, which shows the
same page cache.

`MappedFileQueue` is the ordered list of segments of one log (the CommitLog, or one ConsumeQueue). It finds the segment
holding a logical offset, pre-allocates the next segment in a background thread (so an append that crosses a segment
end never waits for file creation), truncates the dirty tail at recovery, and deletes expired head segments.

Descriptors: Python's `mmap` keeps a duplicate of the descriptor it maps, so a mapped file holding its own too
costs two. CommitLog segments keep theirs (every entry is written through it). A queue of small files written only
through the mapping (`hold_fd=False`: ConsumeQueues, one per partition) gives its own up once mapped and opens the
file again for the rare calls that need one (a reservation, a flush): a thousand partitions then hold a thousand
descriptors, not two thousand, against the process's limit.

Nothing here knows entry formats; that belongs to `commitlog` / `consumequeue` and `mqk._fast`.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import ctypes
import errno
import logging
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from mqk.errors import OutOfBounds, StorageError, StorageFull
from mqk.store.fsutil import fsync_dir

log = logging.getLogger(__name__)

#: zero-fill granularity for truncation (avoid allocating a segment-sized zero buffer)
_ZERO_CHUNK = bytes(1 << 20)
PAGE = mmap.PAGESIZE
#: page cache dropped per madvise/fadvise pair (`MappedFileQueue.drop_cache_below`)
CACHE_DROP_CHUNK = 16 << 20
#: the ends of the ranges dropped: the largest folio the page cache uses (x86-64: 2 MiB) is aligned to its size
#: in the file, and one straddling a range's end would stay cached (the kernel drops only whole folios)
CACHE_DROP_ALIGN = 2 << 20


_scratch = threading.local()


def _libc_madvise() -> Callable[..., int] | None:
    """libc's madvise through ctypes, which releases the GIL for the call (mmap.madvise holds it for the whole
    call, which grows with the pages Fetch touched, and the event loop cannot run meanwhile); None where there is no
    such symbol (the mmap module's is used then)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_madvise = _libc_madvise()
#: held while a mapping's pages are dropped without the GIL, and while a mapping is closed: a mapping is never
#: unmapped (and its addresses reused) under a running madvise
_unmap_lock = threading.Lock()


def _fault_in_scratch() -> memoryview:
    """This thread's buffer for `MappedFileQueue.fault_in` reads (their bytes are not used)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None:
        buf = _scratch.buf = memoryview(bytearray(1 << 20))
    return buf


def segment_name(start_offset: int) -> str:
    return f"{start_offset:020d}"


class MappedFile:
    """One mapped segment. Not thread-safe for writes: the store writes from the event loop thread only; flush
    (`fdatasync`) may run in a worker thread concurrently with writes, which the kernel allows."""

    __slots__ = (
        "_address",
        "_closed",
        "buf",
        "committed",
        "device",
        "fd",
        "file_size",
        "flushed",
        "mm",
        "path",
        "reserve_step",
        "reserved",
        "start_offset",
        "wrote",
    )

    def __init__(
        self, path: Path, file_size: int, start_offset: int, reserve_step: int = 0, *, hold_fd: bool = True
    ) -> None:
        """`reserve_step` 0 reserves the whole file's blocks at creation (CommitLog segments); a positive step
        reserves them ahead of the writer (`ensure_reserved`), as much again as is reserved already, from one
        page up to `reserve_step` bytes at a time, so a ConsumeQueue file of a quiet queue holds a page of disk
        and page cache, not megabytes it may never use. Without `hold_fd` the file keeps no descriptor of its
        own once mapped (`fd` is -1; see the module docstring)."""
        if file_size <= 0:
            raise StorageError(f"mapped file size must be positive, not {file_size}")
        self.path = Path(path)
        self.file_size = file_size
        self.start_offset = start_offset
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        actual = -1
        try:
            stat = os.fstat(fd)
            actual = stat.st_size
            if actual != file_size:
                # new file (size 0): extend sparsely; a file cut short is extended too (zeros read as "end of
                # data"); a longer one is never shrunk, we have not examined what it holds
                if actual > file_size:
                    raise StorageError(f"{self.path} is {actual} bytes, expected {file_size}")
                os.ftruncate(fd, file_size)
                # reserve the blocks now: on a full disk this fails here with ENOSPC (StorageFull) instead of a
                # later write into a sparse hole of the mapping killing the process with SIGBUS
                if reserve_step <= 0:
                    _allocate(fd, 0, file_size, self.path)
            self.mm = mmap.mmap(fd, file_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            if actual == 0:
                _unlink_quietly(self.path)  # a new file we could not set up must not look like a segment later
            raise
        if not hold_fd:
            os.close(fd)  # the mapping holds its own duplicate
            fd = -1
        self.fd = fd
        #: the filesystem the file is on (st_dev): a filesystem-wide sync covers every file with the same device
        self.device = stat.st_dev
        #: one writable view over the whole mapping; slices of it are the zero-copy reads handed out
        self.buf = memoryview(self.mm)
        self.wrote = 0
        self.committed = 0
        self.flushed = 0
        self.reserve_step = reserve_step
        #: bytes [0, reserved) have disk blocks (an existing file's allocation is unknown: re-reserved on demand,
        #: which costs nothing where blocks already exist)
        self.reserved = file_size if reserve_step <= 0 else 0
        self._closed = False
        self._address = 0  # where the mapping starts, once drop_cache needed it

    # --- positions -------------------------------------------------------------------------------------

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.file_size

    @property
    def wrote_offset(self) -> int:
        return self.start_offset + self.wrote

    def available(self) -> int:
        return self.file_size - self.wrote

    def is_full(self) -> bool:
        return self.wrote >= self.file_size

    def set_positions(self, pos: int) -> None:
        """Recovery: everything below `pos` is verified data (and durable: it was read back from the file)."""
        if not 0 <= pos <= self.file_size:
            raise OutOfBounds(f"position {pos} outside [0, {self.file_size}] of {self.path.name}")
        self.wrote = self.committed = self.flushed = pos

    def advance(self, n: int) -> None:
        """Publish `n` bytes the caller has already written at the write position."""
        new = self.wrote + n
        if n < 0 or new > self.file_size:
            raise OutOfBounds(f"advance by {n} at {self.wrote} beyond {self.file_size} in {self.path.name}")
        self.wrote = self.committed = new

    def ensure_reserved(self, end: int) -> None:
        """Make sure bytes [0, end) have disk blocks before anything is written there (StorageFull if the disk
        is full); a write into an unreserved hole of a shared mapping on a full disk is a SIGBUS, not an error."""
        if end <= self.reserved:
            return
        if end > self.file_size:
            raise OutOfBounds(f"reserve up to {end} beyond {self.file_size} in {self.path.name}")
        # doubling from one page: a new queue's first unit costs a 4 KiB write of zeros, not a whole step's (1,000
        # new partitions: 4 MB of zeros instead of 64 MB, and the pages they take)
        step = min(self.reserve_step, max(PAGE, self.reserved)) if self.reserve_step > 0 else self.file_size
        new = min(self.file_size, -(-end // step) * step)
        if self.reserve_step > 0:
            # write zeros rather than fallocate: the first store into a fallocated (unwritten) extent through the
            # mapping is far more expensive than into written pages (a cost paid per file, so per new partition);
            # a pwrite of zeros makes the pages ordinary cached pages and still fails with ENOSPC on a full disk.
            # Only bytes at or past the write position are zeroed: nothing there is published data.
            start = max(self.reserved, self.wrote)
            if new > start:
                with self.descriptor() as fd:
                    _zero_fill(fd, start, new - start, self.path)
        else:
            with self.descriptor() as fd:
                _allocate(fd, self.reserved, new - self.reserved, self.path)
        self.reserved = new

    # --- bytes -----------------------------------------------------------------------------------------

    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Copy `data` at the write position; returns the file-relative position it landed at."""
        pos = self.wrote
        n = len(data)
        if n > self.file_size - pos:
            raise OutOfBounds(f"append of {n} bytes at {pos} overflows {self.path.name} ({self.file_size} bytes)")
        self.buf[pos : pos + n] = data
        self.wrote = self.committed = pos + n
        return pos

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Overwrite in place below the file end (index files, repairs); moves only `flushed`, back to `pos`."""
        n = len(data)
        if pos < 0 or n > self.file_size - pos:
            raise OutOfBounds(f"write of {n} bytes at {pos} outside {self.path.name} ({self.file_size} bytes)")
        self.buf[pos : pos + n] = data
        if pos < self.flushed:  # flushes sync from `flushed` on (sync_range): this write must be in the next one
            self.flushed = pos

    def write(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Write `data` at `pos` through the file descriptor (a pwrite into the page cache, see the module
        docstring), below the file end. Moves no position: the caller publishes the bytes once all of them are in
        place. StorageFull on a full disk, StorageError on any other failure (EIO)."""
        n = len(data)
        if pos < 0 or n > self.file_size - pos:
            raise OutOfBounds(f"write of {n} bytes at {pos} outside {self.path.name} ({self.file_size} bytes)")
        view = memoryview(data)
        try:
            with self.descriptor() as fd:
                done = 0
                while done < n:  # a regular file's write stops short only for a signal or a device error: finish it
                    done += os.pwrite(fd, view[done:], pos + done)
        except OSError as exc:
            raise storage_error(exc, self.path, n) from None
        if pos < self.flushed:
            self.flushed = pos

    def view(self, pos: int, size: int) -> memoryview:
        """Zero-copy view of [pos, pos+size), which must lie inside written data."""
        if pos < 0 or size < 0 or pos + size > self.wrote:
            raise OutOfBounds(f"read [{pos}, {pos + size}) outside written [0, {self.wrote}) of {self.path.name}")
        return self.buf[pos : pos + size]

    def raw_view(self, pos: int, size: int) -> memoryview:
        """Like `view` but bounded by the file end, not the write position (recovery scans unknown data)."""
        if pos < 0 or size < 0 or pos + size > self.file_size:
            raise OutOfBounds(f"read [{pos}, {pos + size}) outside [0, {self.file_size}) of {self.path.name}")
        return self.buf[pos : pos + size]

    def zero_from(self, pos: int) -> bool:
        """Zero [pos, file end) and make `pos` the write position: a torn tail must not be read back later.
        Returns whether any byte changed (then the caller must make the zeros durable)."""
        if not 0 <= pos <= self.file_size:
            raise OutOfBounds(f"truncate at {pos} outside [0, {self.file_size}] of {self.path.name}")
        # after a crash the positions say nothing about what lies beyond `pos`, so zero to the file end, but
        # compare first: writing zeros over sparse, never-written pages would allocate them for nothing. Only the
        # file's data regions are looked at: a hole reads as zeros, and comparing a sparse 1 GiB segment page by
        # page cost every restart after a crash about 9 s
        changed = False
        with self.descriptor() as fd:
            regions = list(data_regions(fd, pos, self.file_size))
        for start, end in regions:
            p = start
            while p < end:
                n = min(len(_ZERO_CHUNK), end - p)
                zeros = _ZERO_CHUNK if n == len(_ZERO_CHUNK) else _ZERO_CHUNK[:n]
                # skip pages that are already zero (reading is cheaper than dirtying pages). The slice of the
                # mmap is a bytes copy on purpose: bytes == bytes is a memcmp, while comparing a memoryview walks
                # it element by element, far slower over a whole segment
                if self.mm[p : p + n] != zeros:
                    self.buf[p : p + n] = zeros
                    changed = True
                p += n
        self.wrote = self.committed = pos
        self.flushed = min(self.flushed, pos)
        return changed

    # --- durability ------------------------------------------------------------------------------------

    def flush(self) -> int:
        """Make the written bytes durable (blocking: call from a worker thread); returns the new flushed position.
        fdatasync: on Linux a shared mapping's dirty pages are the file's page cache, so it writes those stored
        through the mapping as well as those written through the descriptor, and it releases the GIL."""
        target = self.wrote
        if target > self.flushed and not self._closed:
            self.datasync()
            self.flushed = max(self.flushed, target)
        return self.flushed

    def datasync(self) -> None:
        """fdatasync the file now, whatever the positions say (blocking). A file closed meanwhile (its segment
        deleted) has nothing left to make durable."""
        try:
            with self.descriptor() as fd:
                os.fdatasync(fd)
        except FileNotFoundError:
            if not self._closed:
                raise

    def descriptor(self) -> _Descriptor:
        """A context giving a descriptor of the file: its own, or (a file without one) the file opened again for
        the duration of the block."""
        return _Descriptor(self.fd, self.path)

    def drop_cache(self, start: int, end: int) -> None:
        """Let the kernel drop the page cache of bytes [start, end), which must be flushed (blocking: call from a
        worker thread). Our own mapping's page table entries go first: the kernel keeps pages a process has
        mapped. Reads of the range afterwards (views handed out before included) fault the bytes back in from
        the file. `start` is page-aligned or 0."""
        if self._closed or end <= start:
            return
        try:
            self._unmap_pages(start, end)
            with self.descriptor() as fd:
                os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
        except (ValueError, OSError) as exc:  # closed under us (a deleted segment): nothing left to drop
            log.debug("dropping cached pages of %s failed: %s", self.path.name, exc)

    def _unmap_pages(self, start: int, end: int) -> None:
        """madvise(MADV_DONTNEED) bytes [start, end) of our mapping, without the GIL where libc's is at hand."""
        if end > self.file_size or start < 0:
            raise ValueError(f"range [{start}, {end}) outside {self.path.name}")
        if _madvise is None:
            self.mm.madvise(mmap.MADV_DONTNEED, start, end - start)
            return
        with _unmap_lock:
            if self._closed:
                return
            if not self._address:
                view = ctypes.c_char.from_buffer(self.mm)  # (an export of the mapping only for this line)
                self._address = ctypes.addressof(view)
                del view
            if _madvise(self._address + start, end - start, mmap.MADV_DONTNEED) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"madvise: {os.strerror(err)}")

    # --- life cycle ------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        with _unmap_lock:  # (waits for a madvise of this mapping still running in the flush thread)
            self._closed = True
        with contextlib.suppress(BufferError):
            self.buf.release()
        # readers may still hold zero-copy views; the mapping then lives until they drop them (no madvise reaches it
        # any more: `_closed` is set)
        with contextlib.suppress(BufferError):
            self.mm.close()
        if self.fd >= 0:
            os.close(self.fd)

    def destroy(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, wrote={self.wrote}, flushed={self.flushed})"


class _Descriptor:
    """`MappedFile.descriptor`: the file's own descriptor (kept open), or the path opened for the block."""

    __slots__ = ("_opened", "fd", "path")

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path
        self._opened = False

    def __enter__(self) -> int:
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_RDWR)
            self._opened = True
        return self.fd

    def __exit__(self, *exc_info: object) -> None:
        if self._opened:
            os.close(self.fd)


def storage_error(exc: OSError, path: Path, size: int) -> StorageError:
    """The typed error for a failed write or reservation of `size` bytes in `path`."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFull(f"no space for {size} bytes in {path.name}: {exc.strerror}")
    return StorageError(f"writing {size} bytes to {path.name} failed: {exc.strerror or exc}")


def data_regions(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The parts of [start, end) of a file that may hold bytes other than zeros: its data regions as the kernel
    reports them (lseek SEEK_DATA / SEEK_HOLE, which count dirty cached pages and delayed allocations as data). A
    filesystem that cannot tell reports the whole range."""
    p = start
    while p < end:
        try:
            data = os.lseek(fd, p, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data at or after p
                return
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):  # no hole reporting here: look at everything
                yield p, end
                return
            raise
        if data >= end:
            return
        hole = min(end, os.lseek(fd, data, os.SEEK_HOLE))
        yield data, hole
        p = hole


def _allocate(fd: int, offset: int, size: int, path: Path) -> None:
    try:
        os.posix_fallocate(fd, offset, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # filesystems without fallocate stay sparse
            return
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise storage_error(exc, path, size) from None
        raise


def _zero_fill(fd: int, offset: int, size: int, path: Path) -> None:
    try:
        while size > 0:
            n = os.pwrite(fd, _ZERO_CHUNK[: min(size, len(_ZERO_CHUNK))], offset)
            offset += n
            size -= n
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise storage_error(exc, path, size) from None
        raise


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


class _Allocator:
    """Creates the next segment in a background thread so a roll only swaps a pointer (RocketMQ's
    AllocateMappedFileService). One request in flight at a time per queue."""

    def __init__(self, name: str) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"mqk-alloc-{name}")
        self._pending: dict[int, concurrent.futures.Future[MappedFile]] = {}

    def request(self, path: Path, size: int, start: int) -> None:
        """Create the segment at `start` in the background."""
        if start not in self._pending:
            self._pending[start] = self._pool.submit(MappedFile, path, size, start)

    def take(self, path: Path, size: int, start: int) -> MappedFile:
        fut = self._pending.pop(start, None)
        if fut is None:
            return MappedFile(path, size, start)
        return fut.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.discard()

    def discard(self) -> None:
        """Remove the segments made ahead and not taken (the log will not roll where they start)."""
        for fut in self._pending.values():
            try:
                mf = fut.result()
            except Exception as exc:  # noqa: BLE001 - a failed pre-allocation is simply not used
                log.warning("pre-allocating a segment failed: %s", exc)
                continue
            # never handed out, so never written: remove it so a restart does not find an empty trailing segment
            mf.destroy()
        self._pending.clear()


class MappedFileQueue:
    """The ordered segments of one log, each `file_size` bytes, named by start offset."""

    __slots__ = (
        "_allocator",
        "_lock",
        "_spare",
        "_starts",
        "_unsynced_dirs",
        "dir",
        "file_size",
        "file_type",
        "files",
        "hold_fd",
        "reserve_step",
    )

    def __init__(
        self,
        directory: Path,
        file_size: int,
        *,
        preallocate: bool = True,
        reserve_step: int = 0,
        hold_fd: bool = True,
        file_type: type[MappedFile] = MappedFile,
    ) -> None:
        """`hold_fd` False: the segments keep no descriptor of their own (see the module docstring). `file_type`:
        the class of the segments (ConsumeQueues use a subclass whose last file's positions live in the store's
        queue table)."""
        self.dir = Path(directory)
        self.file_type = file_type
        self.file_size = file_size
        self.reserve_step = reserve_step
        self.hold_fd = hold_fd
        self.files: list[MappedFile] = []
        self._starts: list[int] = []  # parallel to files, for bisect
        self._allocator = _Allocator(self.dir.name) if preallocate else None
        self._lock = threading.Lock()  # guards `files` against the flush thread iterating it
        #: the next file, created ahead by `reserve_next` (queues without an allocator), taken by `roll`
        self._spare: MappedFile | None = None
        #: directories whose entries changed (a segment or a directory was created) and are not yet fsynced:
        #: the next `flush` syncs them, so a segment whose bytes it made durable is found again after a crash
        self._unsynced_dirs: set[Path] = set()

    # --- loading ---------------------------------------------------------------------------------------

    def load(self, *, strict_size: bool = False) -> None:
        """Map every segment on disk (positions unknown until recovery sets them).

        A segment larger than the configured size was made with other settings: with `strict_size` (the
        CommitLog, whose data cannot be rebuilt) that refuses the start with StorageError naming both sizes;
        otherwise (ConsumeQueues, rebuilt from the CommitLog) it and every later file are set aside. Files that
        do not follow their predecessor are set aside too. "Set aside" = renamed to `<name>.unusable`, so their
        names are free for new segments and nothing is lost for an operator to inspect."""
        self.dir.mkdir(parents=True, exist_ok=True)
        names = sorted(p for p in self.dir.iterdir() if p.is_file() and p.name.isdigit() and len(p.name) == 20)
        files: list[MappedFile] = []
        aside: list[Path] = []
        for i, p in enumerate(names):
            start = int(p.name)
            size = p.stat().st_size
            if size > self.file_size:
                if strict_size:
                    for mf in files:
                        mf.close()
                    raise StorageError(
                        f"segment {p} is {size} bytes but the configured segment size is "
                        f"{self.file_size}; start with the size the data was written with"
                    )
                log.error(
                    "%s is %d bytes, more than %d; setting it and every later file aside", p, size, self.file_size
                )
                aside = names[i:]
                break
            if files and start != files[-1].end_offset:
                log.error("%s does not follow %s; setting it and every later file aside", p, files[-1].path)
                aside = names[i:]
                break
            if size < self.file_size:
                # cut short (by hand or a crash while it was being created): it is extended with zeros, which
                # recovery reads as the end of data
                log.warning("segment %s is %d bytes, less than %d; extending it", p, size, self.file_size)
            files.append(self.file_type(p, self.file_size, start, self.reserve_step, hold_fd=self.hold_fd))
        for p in aside:
            p.rename(p.with_name(p.name + ".unusable"))
        with self._lock:
            self.files = files
            self._starts = [f.start_offset for f in files]
        # every loaded file counts as fully written until recovery says otherwise
        for f in files:
            f.set_positions(self.file_size)

    # --- lookup ----------------------------------------------------------------------------------------

    @property
    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    @property
    def min_offset(self) -> int:
        return self.files[0].start_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        """Logical offset one past the last byte written."""
        return self.files[-1].wrote_offset if self.files else 0

    @property
    def flushed_offset(self) -> int:
        for f in reversed(self.files):
            if f.flushed > 0:
                return f.start_offset + f.flushed
        return self.min_offset

    def find(self, offset: int) -> MappedFile:
        """The segment holding logical `offset`; OutOfBounds if none does."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0 or offset >= self.files[i].end_offset:
            raise OutOfBounds(f"offset {offset} is not in any segment of {self.dir}")
        return self.files[i]

    def view(self, offset: int, size: int) -> memoryview:
        mf = self.find(offset)
        return mf.view(offset - mf.start_offset, size)

    # --- growth ----------------------------------------------------------------------------------------

    def _path(self, start: int) -> Path:
        return self.dir / segment_name(start)

    def get_last_for_write(self, start_if_empty: int = 0) -> MappedFile:
        """The segment to append to, creating (or rolling to) a new one if there is none or it is full."""
        last = self.files[-1] if self.files else None
        if last is not None and not last.is_full():
            return last
        return self.roll(start_if_empty)

    def prepare_next(self, start_if_empty: int = 0) -> None:
        """Ask the allocator for the segment after the last one now (at start), so the first roll is instant."""
        if self._allocator is None:
            return
        last = self.files[-1] if self.files else None
        nxt = last.end_offset if last is not None else start_if_empty
        self._make_dir()
        self._allocator.request(self._path(nxt), self.file_size, nxt)

    def roll(self, start_if_empty: int = 0) -> MappedFile:
        """Open the segment after the last one (the current one must already be logically full)."""
        last = self.files[-1] if self.files else None
        start = last.end_offset if last is not None else start_if_empty
        if last is not None:
            last.wrote = last.committed = last.file_size  # the rest of it is a BLANK (CommitLog) or padding
        self._make_dir()
        path = self._path(start)
        if self._allocator is not None:
            mf = self._allocator.take(path, self.file_size, start)
            nxt = start + self.file_size
            self._allocator.request(self._path(nxt), self.file_size, nxt)
        elif self._spare is not None and self._spare.start_offset == start:
            mf, self._spare = self._spare, None
        else:
            mf = self.file_type(path, self.file_size, start, self.reserve_step, hold_fd=self.hold_fd)
        with self._lock:
            self.files.append(mf)
            self._starts.append(start)
            self._unsynced_dirs.add(self.dir)
        return mf

    def _make_dir(self) -> None:
        """Create the queue's directory if needed, noting every directory whose entries that changed."""
        if self.dir.is_dir():
            return
        missing = [d for d in (self.dir, *self.dir.parents) if not d.exists()]
        self.dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._unsynced_dirs.update(d.parent for d in missing)

    def reserve_next(self, start_if_empty: int = 0) -> None:
        """Create (and allocate) the file the next `roll` will open, now: a writer that must not fail halfway
        (the store appends to the CommitLog before the ConsumeQueue) calls this first, so a full disk refuses
        the whole append up front (StorageFull) instead of between the two writes."""
        last = self.files[-1] if self.files else None
        start = last.end_offset if last is not None else start_if_empty
        if self._spare is not None:
            if self._spare.start_offset == start:
                return
            self._spare.destroy()
            self._spare = None
        self._make_dir()
        self._spare = self.file_type(self._path(start), self.file_size, start, self.reserve_step, hold_fd=self.hold_fd)

    # --- durability ------------------------------------------------------------------------------------

    def snapshot(self) -> list[MappedFile]:
        with self._lock:
            return list(self.files)

    def flush(self) -> int:
        """fdatasync every segment with unflushed bytes (blocking; run in a worker thread). Returns the logical
        offset now known durable."""
        durable = None
        for mf in self.snapshot():
            if mf.flushed < mf.wrote:
                mf.flush()
            if mf.flushed > 0 or durable is None:
                durable = mf.start_offset + mf.flushed
        # after the data: every segment of the snapshot was created (and its directory noted) before it was taken
        if self._unsynced_dirs:
            with self._lock:
                dirs, self._unsynced_dirs = self._unsynced_dirs, set()
            for directory in sorted(dirs, key=lambda d: len(d.parts), reverse=True):
                fsync_dir(directory)
        return durable if durable is not None else 0

    def sync_marks(self) -> tuple[list[tuple[MappedFile, int]], set[Path]]:
        """What a filesystem-wide sync (fsutil.syncfs) started after this call makes durable here: each segment
        with unflushed bytes with its write position now, and the directories whose new entries are unsynced.
        Hand them to `note_synced` once the sync returned."""
        with self._lock:
            files = list(self.files)
            dirs = set(self._unsynced_dirs)
        return [(mf, mf.wrote) for mf in files if mf.flushed < mf.wrote], dirs

    def note_synced(self, marks: tuple[list[tuple[MappedFile, int]], set[Path]]) -> None:
        """Record that a filesystem-wide sync ran after `sync_marks` returned `marks`."""
        files, dirs = marks
        for mf, wrote in files:
            if wrote > mf.flushed:
                mf.flushed = wrote
        if dirs:
            with self._lock:
                self._unsynced_dirs -= dirs

    def drop_point(self, offset: int) -> int:
        """`offset` rounded down to where a `drop_cache_below` may start (the log's start if it is below it)."""
        with self._lock:
            files, starts = self.files, self._starts
        i = bisect.bisect_right(starts, offset) - 1
        if i < 0:
            return starts[0] if starts else 0
        mf = files[i]
        if offset >= mf.end_offset:
            return mf.end_offset
        return offset - (offset - mf.start_offset) % CACHE_DROP_ALIGN

    def drop_cache_below(self, start: int, upto: int, budget: int) -> int:
        """Drop the page cache of logical bytes [start, upto), flushed ones, at most about `budget` bytes of it,
        in chunks of CACHE_DROP_CHUNK (blocking: call from a worker thread). Returns where the next call starts:
        `upto` once done. Every range dropped ends on a multiple of CACHE_DROP_ALIGN in its segment (or at the
        segment's end), so `upto` is rounded down to one; `start` must be such an end, or 0."""
        done = start
        for mf in self.snapshot():
            if mf.end_offset <= done:
                continue
            if mf.start_offset >= upto or budget <= 0:
                break
            pos = max(done, mf.start_offset) - mf.start_offset
            end = min(upto, mf.end_offset) - mf.start_offset
            if end < mf.file_size:
                end -= end % CACHE_DROP_ALIGN
            while pos < end and budget > 0:
                step = min(end - pos, CACHE_DROP_CHUNK, max(budget, CACHE_DROP_ALIGN))
                if pos + step < mf.file_size:
                    step -= (pos + step) % CACHE_DROP_ALIGN
                mf.drop_cache(pos, pos + step)
                pos += step
                budget -= step
            done = mf.start_offset + pos
            if pos < mf.file_size:
                break
        return done

    def fault_in(self, start: int, end: int, ahead: int = 0) -> None:
        """Read logical bytes [start, end) through the descriptors, so that they are in the page cache when
        views of the mapping are read next, and ask the kernel to read `ahead` bytes more in the background
        (blocking: call from a worker thread; preadv and posix_fadvise release the GIL). A segment closed
        meanwhile is skipped: its reader gets whatever it would have got."""
        scratch = _fault_in_scratch()
        for mf in self.snapshot():
            if mf.end_offset <= start:
                continue
            if mf.start_offset >= end:
                break
            pos = max(start, mf.start_offset) - mf.start_offset
            stop = min(end, mf.end_offset) - mf.start_offset
            try:
                with mf.descriptor() as fd:
                    while pos < stop:
                        n = os.preadv(fd, [scratch[: stop - pos]], pos)
                        if n <= 0:
                            break
                        pos += n
                    if ahead > 0 and stop < mf.file_size:
                        os.posix_fadvise(fd, stop, min(ahead, mf.file_size - stop), os.POSIX_FADV_WILLNEED)
            except (OSError, ValueError):
                continue

    def dirty_bytes(self) -> int:
        last = self.files[-1] if self.files else None
        if last is None:
            return 0
        n = last.wrote - last.flushed
        if len(self.files) > 1:
            prev = self.files[-2]
            n += prev.wrote - prev.flushed
        return n

    # --- recovery and retention --------------------------------------------------------------------------

    def truncate(self, offset: int, zero_tail: bool = True) -> None:
        """Make `offset` the end of the log: zero the rest of its segment and delete every later segment.
        `zero_tail=False` leaves the rest of the segment as it is: only for an end the writer itself left there
        (a clean stop), past which it never wrote; comparing the rest of a 1 GiB segment with zeros costs
        seconds."""
        keep = [mf for mf in self.files if mf.start_offset < offset]
        drop = [mf for mf in self.files if mf.start_offset >= offset]
        if not keep and drop:
            keep, drop = drop[:1], drop[1:]  # the log keeps its first segment, empty
        if keep:
            last = keep[-1]
            pos = max(0, offset - last.start_offset)
            if pos < last.file_size and not zero_tail:
                last.set_positions(pos)
            elif pos < last.file_size:
                if last.zero_from(pos):
                    # durable now: a cut tail that came back after another crash could pass for data
                    last.datasync()
            else:
                last.set_positions(last.file_size)
        with self._lock:
            self.files = keep
            self._starts = [f.start_offset for f in keep]
        for mf in drop:
            log.info("removing segment %s past the recovered end %d", mf.path, offset)
            mf.destroy()
        if drop:
            fsync_dir(self.dir)

    def remove_all(self) -> None:
        """Delete every segment, and those made ahead: the log is empty, and its next roll starts where the writer
        says (a replica taking its master's log from a later start)."""
        with self._lock:
            drop, self.files, self._starts = self.files, [], []
        if self._allocator is not None:
            self._allocator.discard()
        if self._spare is not None:
            self._spare.destroy()
            self._spare = None
        for mf in drop:
            log.info("removing segment %s: the log starts over", mf.path)
            mf.destroy()
        if drop:
            fsync_dir(self.dir)

    def delete_before(self, offset: int) -> int:
        """Delete whole segments that end at or before `offset` (never the last one). Returns how many."""
        n = 0
        while len(self.files) > 1 and self.files[0].end_offset <= offset:
            with self._lock:
                mf = self.files.pop(0)
                self._starts.pop(0)
            mf.destroy()
            n += 1
        return n

    def close(self) -> None:
        if self._allocator is not None:
            self._allocator.close()
        if self._spare is not None:  # never written: a restart must not find it
            self._spare.destroy()
            self._spare = None
        for mf in self.snapshot():
            mf.close()

    def destroy(self) -> None:
        self.close()
        for mf in self.files:
            with contextlib.suppress(FileNotFoundError):
                mf.path.unlink()
        with self._lock:
            self.files = []
            self._starts = []
