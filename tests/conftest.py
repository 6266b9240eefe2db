"""Fixtures the test suites share. Plain helpers (batch builders, engine set-up, waiting) are in tests/helpers.py;
the in-process broker and clock fixtures come from mqk's own pytest plugin (mqk.testing: `mqk_broker`,
`mqk_file_broker`, `mqk_fake_clock`, `mqk_clock`).

- `engine_name` / `harness` / `manager`: a test that takes `harness` (an engine alone) or `manager` (a StoreManager)
  runs once per storage engine (`memory`, `rocksdb`, `file`), the file engine with tiny CommitLog segments and
  ConsumeQueue files (see helpers.store_config);
- `memory_store`: a StoreManager on the memory engine;
- `engine_broker`: an in-process broker, once on the memory and once on the file store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import ENGINE_NAMES, Harness, measure_only_this_process, save_coverage, serialize_ast_parse, store_config

from mqk.config import StoreConfig
from mqk.store.manager import StoreManager
from mqk.testing import ThreadedBroker

serialize_ast_parse()
measure_only_this_process()


def pytest_sessionfinish(session: pytest.Session) -> None:
    save_coverage()


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


@pytest.fixture
async def memory_store() -> AsyncIterator[StoreManager]:
    """A started StoreManager on the memory engine (nothing on disk)."""
    manager = StoreManager(StoreConfig(storage="memory"))
    await manager.start()
    try:
        yield manager
    finally:
        await manager.close()


@pytest.fixture
async def manager(engine_name: str, tmp_path: Path) -> AsyncIterator[StoreManager]:
    """A started StoreManager whose default engine is `engine_name` (so once per engine), on the scenario suite's
    small files."""
    m = StoreManager(store_config(engine_name, tmp_path / "data"))
    await m.start()
    try:
        yield m
    finally:
        await m.close()


@pytest.fixture(params=["memory", "file"])
def engine_broker(request: pytest.FixtureRequest) -> ThreadedBroker:
    """The in-process broker of mqk's plugin, once on the memory store (`mqk_broker`) and once on a file store
    (`mqk_file_broker`)."""
    return request.getfixturevalue("mqk_broker" if request.param == "memory" else "mqk_file_broker")
