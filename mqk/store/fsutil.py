"""Small durable-file helpers shared by the store and the services: atomic replace of a whole file, and one
sync for a whole filesystem.

`atomic_write_bytes` is the one way mqk rewrites a small file in place (topic metadata, offset snapshots, service
state, checkpoints): write a temporary file in the same directory, fsync it, rename it over the target, fsync the
directory. A crash at any point leaves either the old file or the new one, never a mix, and once it returns the new
content survives power loss. These functions block; callers on the event loop run them with `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mqk.errors import Corrupt


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename or file creation inside `directory` durable (POSIX keeps names in the directory)."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _libc_syncfs() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).syncfs  # glibc and musl on Linux
    except (OSError, AttributeError):
        return None


_syncfs = _libc_syncfs()


def syncfs(fd: int) -> bool:
    """syncfs(2): make every file of the filesystem holding `fd` durable (data, metadata, directories) in one
    call, where an fdatasync per file would commit the journal once per file. Blocks without the GIL. False when
    the platform has no syncfs (the caller syncs file by file); OSError when it fails (a writeback error since the
    descriptor was opened included)."""
    if _syncfs is None:
        return False
    if _syncfs(fd) != 0:
        err = ctypes.get_errno()
        if err == errno.ENOSYS:
            return False
        raise OSError(err, f"syncfs: {os.strerror(err)}")
    return True


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> None:
    """Replace `path` with `data` atomically and durably (creating parent directories if needed)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Unique per process and thread, so concurrent writers of the same target never share a temp file.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, target)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    fsync_dir(target.parent)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """`atomic_write_bytes` of `obj` as UTF-8 JSON (sorted keys, so equal states give equal files)."""
    atomic_write_bytes(path, json.dumps(obj, sort_keys=True, separators=(",", ":")).encode())


def read_json(path: str | os.PathLike[str]) -> Any | None:
    """The JSON document at `path`, or None if there is no such file; `Corrupt` if it is not valid JSON."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise Corrupt(f"{path}: not valid JSON ({exc})") from None


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
