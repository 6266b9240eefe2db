"""Hot-path kernels: each Cython module `<name>.pyx` here has a pure-Python twin `<name>_py.py` with the same API.

`load(name)` binds the compiled module, or the twin when `MQK_NO_EXTENSIONS=1` is set. A compiled module that is
missing (no compiler at install time) falls back to the twin loudly: a RuntimeWarning at import, never silently.
Results are byte-for-byte identical either way (tests/unit/test_fast_parity.py).
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Literal, overload

from mqk._fast.api import (
    ClentryApi,
    CqunitApi,
    FetchreqApi,
    FetchrespApi,
    ProducereqApi,
    ProducerespApi,
    RecbatchApi,
)

NO_EXTENSIONS = os.environ.get("MQK_NO_EXTENSIONS", "") not in ("", "0")
_missing: list[str] = []


# Each kernel's name gives its typed face (mqk._fast.api), whichever twin is bound.
@overload
def load(name: Literal["clentry"]) -> ClentryApi: ...
@overload
def load(name: Literal["cqunit"]) -> CqunitApi: ...
@overload
def load(name: Literal["fetchreq"]) -> FetchreqApi: ...
@overload
def load(name: Literal["fetchresp"]) -> FetchrespApi: ...
@overload
def load(name: Literal["producereq"]) -> ProducereqApi: ...
@overload
def load(name: Literal["produceresp"]) -> ProducerespApi: ...
@overload
def load(name: Literal["recbatch"]) -> RecbatchApi: ...
def load(name: str) -> object:
    """The kernel module `name`: compiled, or its pure-Python twin (MQK_NO_EXTENSIONS=1, or not built)."""
    if not NO_EXTENSIONS:
        try:
            return importlib.import_module(f"mqk._fast.{name}")
        except ImportError:
            _missing.append(name)
            warnings.warn(
                f"mqk._fast.{name} is not compiled; using the pure-Python twin (much slower). "
                "Reinstall with a C compiler, or set MQK_NO_EXTENSIONS=1 to silence this.",
                RuntimeWarning,
                stacklevel=2,
            )
    return importlib.import_module(f"mqk._fast.{name}_py")


def twin(name: str) -> ModuleType:
    """The pure-Python twin, always (for parity tests and benchmarks)."""
    return importlib.import_module(f"mqk._fast.{name}_py")


def compiled(name: str) -> ModuleType | None:
    """The compiled module, or None if it is not built."""
    try:
        return importlib.import_module(f"mqk._fast.{name}")
    except ImportError:
        return None


def crc32c_native_address(crc_fn: Callable[..., int]) -> int:
    """Address of the C function the crc32c package selected for `crc_fn` (its `crc32c.crc32c`), or 0.

    The compiled kernels call it directly, skipping the Python call's argument parsing and buffer handling, which
    costs more than the CRC of a small record batch. The package exports `get_state(module)`, whose state's first
    field is that function (crc32c 2.x); the kernels self-test the function against `crc_fn` before using it.
    0 (the kernels then call `crc_fn`: same results, slower) when the package is not a loaded shared library
    or does not export get_state: the two ways ctypes fails here, OSError and AttributeError.
    """
    import ctypes  # (only the compiled kernels ask, once: no ctypes for the twins)

    module = getattr(crc_fn, "__self__", None)
    path = getattr(module, "__file__", None)
    if not path:
        return 0
    try:
        library = ctypes.PyDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        get_state = library.get_state
    except (OSError, AttributeError):
        return 0
    get_state.restype = ctypes.c_void_p
    get_state.argtypes = [ctypes.py_object]
    state = get_state(module)
    if not state:
        return 0
    return ctypes.c_void_p.from_address(state).value or 0
