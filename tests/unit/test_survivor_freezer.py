"""`mqk serve`'s SurvivorFreezer: a slow full collection freezes what it found alive, and only that."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path

import pytest
from helpers import wait_until_async

from mqk.cli import SurvivorFreezer
from mqk.config import StoreConfig
from mqk.server.kafka.rawclient import make_batch
from mqk.store.file.consumequeue import ConsumeQueue
from mqk.store.file.mapped_file import MappedFile, MappedFileQueue
from mqk.store.manager import StoreManager


class _Node:
    """A GC-tracked object that can take part in a cycle and be watched with a weak reference."""

    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def freezer():
    """Installs a freezer and leaves the interpreter as it was: callbacks removed, nothing left frozen."""
    installed: list[SurvivorFreezer] = []

    def install(slow_s: float) -> SurvivorFreezer:
        f = SurvivorFreezer(slow_s).install()
        installed.append(f)
        return f

    gc.collect()
    yield install
    for f in installed:
        f.uninstall()
    gc.unfreeze()


@pytest.mark.parametrize("slow_s, freezes", [(0.0, 1), (3600.0, 0)], ids=["slow", "quick"])
def test_only_a_slow_full_collection_freezes_its_survivors(freezer, slow_s, freezes):
    f = freezer(slow_s)
    long_lived = [[i] for i in range(20_000)]
    before = gc.get_freeze_count()
    gc.collect()
    assert f.freezes == freezes
    if freezes:
        assert gc.get_freeze_count() - before >= len(long_lived)
    else:
        assert gc.get_freeze_count() == before


def test_young_collections_never_freeze(freezer):
    f = freezer(0.0)
    _young = [[i] for i in range(1_000)]
    gc.collect(0)
    gc.collect(1)
    assert f.freezes == 0


def test_cyclic_garbage_is_collected_not_frozen(freezer):
    f = freezer(0.0)
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert f.freezes == 1
    assert gone() is None


def test_an_uninstalled_freezer_does_nothing(freezer):
    f = freezer(0.0)
    f.uninstall()
    f.uninstall()  # twice is harmless
    gc.collect()
    assert f.freezes == 0


def test_a_deleted_topics_frozen_queues_are_freed_by_reference_counting(freezer, tmp_path):
    """Frozen objects are out of the cyclic GC's reach: a deleted topic's queues must hold no cycles, or each
    deleted topic would stay in memory for good."""
    freezer(0.0)

    def alive() -> list:
        """The topic's queue objects still in memory (its ConsumeQueue directory is named after it)."""
        kinds = (ConsumeQueue, MappedFileQueue, MappedFile)
        return [
            o
            for o in gc.get_objects()
            if isinstance(o, kinds) and "doomed" in Path(getattr(o, "dir", None) or getattr(o, "path", "")).parts
        ]

    async def scenario() -> None:
        m = StoreManager(StoreConfig(data_dir=tmp_path / "data", storage="file"))
        await m.start()
        try:
            await m.create_topic("doomed", 20)
            for q in range(20):
                await m.append("doomed", q, [bytes(make_batch([b"v" * 50] * 3))])
            assert len(alive()) >= 3 * 20  # what to look for: each queue, its file list and its file
            before = gc.get_freeze_count()
            gc.collect()  # the freezer freezes the queues
            assert gc.get_freeze_count() > before
            await m.delete_topic("doomed")
        finally:
            await m.close()

    asyncio.run(scenario())
    gc.unfreeze()  # back in the collector's lists: anything still there was kept alive, not freed
    assert alive() == []


def test_connections_closed_under_uvloop_leave_no_cycles(freezer, tmp_path):
    """`mqk serve` runs on uvloop: a connection open when the freezer freezes must still be freed when it closes,
    which it is only if closing it leaves no reference cycle behind (asyncio's own transports would)."""
    import re

    import uvloop

    from mqk.protocol.kafka.api import ApiKey
    from mqk.runtime import BrokerRuntime
    from mqk.server.kafka.rawclient import RawKafkaClient
    from mqk.testing import broker_config

    freezer(0.0)

    async def serve_and_close() -> None:
        runtime = BrokerRuntime(broker_config("file", tmp_path))
        await runtime.start()
        try:
            host, port = re.search(r"kafka=([\d.]+):(\d+)", runtime.ready_line()).groups()
            clients = [await RawKafkaClient.connect(host, int(port)) for _ in range(3)]
            for client in clients:
                await client.call(
                    ApiKey.METADATA,
                    9,
                    {
                        "topics": None,
                        "allow_auto_topic_creation": True,
                        "include_cluster_authorized_operations": False,
                        "include_topic_authorized_operations": False,
                    },
                )
            gc.collect()  # the freezer freezes the open connections
            for client in clients:
                await client.close()
            await wait_until_async(lambda: not runtime.kafka.connections, what="the server to see the closes")
            gc.unfreeze()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                gc.collect()
                leftovers = [type(o).__name__ for o in gc.garbage]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
            assert leftovers == []
        finally:
            await runtime.stop()

    uvloop.run(serve_and_close())
