"""DiskGuard's put hook is in the store's hooks (first) only while the disk counts as full, so appends on a healthy
disk pay nothing for it; a stopped guard leaves no hook behind."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from mqk.config import BrokerConfig, StoreConfig
from mqk.errors import StorageFull
from mqk.services.diskguard import DiskGuard
from mqk.store.adapter import PutContext


class _Retention:
    async def run_once(self):
        return SimpleNamespace(freed_bytes=0)


async def test_hook_present_only_while_full(tmp_path: Path) -> None:
    def other(ctx) -> None:
        pass

    store = SimpleNamespace(persistent=True, hooks=[other])
    guard = DiskGuard(BrokerConfig(store=StoreConfig(data_dir=tmp_path, disk_max_used_ratio=1.0)), store, _Retention())
    await guard.start()
    try:
        assert store.hooks == [other] and not guard.full
        guard.max_ratio = 0.0  # every disk is fuller than that
        assert await guard.check()
        assert store.hooks == [guard.hook, other]
        assert await guard.check()  # still full: still there once
        assert store.hooks == [guard.hook, other]
        try:
            store.hooks[0](PutContext("t", 0, []))
            raise AssertionError("the full disk's hook let an append through")
        except StorageFull:
            assert guard.refused == 1
        guard.max_ratio = 1.0
        assert not await guard.check()
        assert store.hooks == [other]
        guard.max_ratio = 0.0
        await guard.check()
    finally:
        await guard.stop()
    assert store.hooks == [other]
    await guard.check()  # a stopped guard measures but never puts its hook back
    assert guard.full and store.hooks == [other]
