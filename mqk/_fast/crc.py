"""CRC-32C, from the `crc32c` package, loaded without running the package's `__init__`.

That `__init__` looks up the package's own version through `importlib.metadata` at import: it imports `email`,
`zipfile` and `csv` and scans the installed distributions, about 18 ms, an eighth of a broker's start, for a
version string mqk never reads. The function mqk uses lives in the package's C extension module (`crc32c._crc32c`,
crc32c 2.x), which is loaded here from the package's directory and registered under its own name, so a later
`import crc32c` (a client library in the same process) finds it loaded. Any other layout falls back to the plain
import: the same function, the slower start.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

_MODULE = "crc32c._crc32c"


def _load() -> Callable[..., int]:
    loaded = sys.modules.get(_MODULE)
    if loaded is None:
        package = importlib.util.find_spec("crc32c")  # (finds the package; runs none of its code)
        places = package.submodule_search_locations if package is not None else None
        found = sorted(p for d in places or () for p in Path(d).glob("_crc32c.*") if p.suffix in (".so", ".pyd"))
        spec = importlib.util.spec_from_file_location(_MODULE, found[0]) if found else None
        if spec is None or spec.loader is None:
            from crc32c import crc32c as plain

            return plain
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[_MODULE] = loaded
        spec.loader.exec_module(loaded)
    fn: Callable[..., int] = loaded.crc32c
    return fn


crc32c = _load()

__all__ = ["crc32c"]
