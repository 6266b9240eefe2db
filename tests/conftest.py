"""Fixtures the test suites share. Plain helpers (batch builders, engine set-up, waiting) are in tests/helpers.py;
the in-process broker and clock fixtures come from mqk's own pytest plugin (mqk.testing: `mqk_broker`,
`mqk_file_broker`, `mqk_fake_clock`, `mqk_clock`).

- `engine_name` / `harness`: every test that takes `harness` runs once per storage engine (`memory`, `rocksdb`,
  `file`), the file engine with tiny CommitLog segments and ConsumeQueue files (see helpers.store_config).
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import ENGINE_NAMES, Harness


@pytest.fixture(params=ENGINE_NAMES)
def engine_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def harness(engine_name: str, tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(engine_name, tmp_path / "data")
    await h.open()
    try:
        yield h
    finally:
        await h.close()
