"""`mqk serve` keeps freed large buffers mapped (mqk.cli._keep_freed_buffers_mapped): on glibc, a freed 8 MiB block
(the size of a connection's receive buffer for a producer's large batches) stays in the process, so the next one
reuses its pages instead of faulting in fresh ones; with glibc's defaults it is returned at once. Each case runs in
a fresh interpreter (malloc's settings are process-wide), measuring resident memory around a free."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

PROBE = """
import json, os, sys
from mqk import cli
tuned = cli._keep_freed_buffers_mapped() if sys.argv[1] == "tuned" else False
page = os.sysconf("SC_PAGE_SIZE")
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
block = bytearray(8 << 20)
block[:] = b"x" * len(block)  # every page touched
held = resident()
del block
print(json.dumps({"tuned": tuned, "released": held - resident()}))
"""

GLIBC = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"


def probe(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_machine_is_one_the_thresholds_apply_to() -> None:
    """The tests below assert glibc's behaviour; on another C library the function must say it did nothing."""
    if GLIBC:
        assert probe("tuned")["tuned"] is True
    else:
        assert probe("tuned")["tuned"] is False


@pytest.mark.parametrize("mode", ["tuned", "default"])
def test_a_freed_receive_buffer_stays_mapped_only_when_tuned(mode: str) -> None:
    result = probe(mode)
    assert result["tuned"] is (mode == "tuned" and GLIBC)
    if not GLIBC:
        return  # (what another C library does with a freed block is its own affair)
    if mode == "tuned":
        assert result["released"] < 1 << 20, result  # kept: the next buffer reuses the pages
    else:
        assert result["released"] >= 7 << 20, result  # glibc's default: a block this large is unmapped when freed


def test_thresholds_an_operator_set_in_the_environment_are_left_alone() -> None:
    result = probe("tuned", MALLOC_TRIM_THRESHOLD_="131072")
    assert result["tuned"] is False
    if GLIBC:
        assert result["released"] >= 7 << 20, result
