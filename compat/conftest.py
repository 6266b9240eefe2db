"""Shared fixtures for the compat suite: real, unmodified clients against a real `mqk serve` subprocess.

The broker always runs as a separate process (`mqk.testing.BrokerProcess`): restart and kill -9 tests need one,
and a broker in its own process does not compete with the clients for this interpreter's GIL, so client-side
timing (rebalances, heartbeats, long polls) behaves as it would against a real deployment.

Owns the fixtures: the shared memory-store broker for the session (most tests only need topics, and unique topic
names keep them apart), a fresh file-store broker per test for restart / crash tests, unique names, the kcat path.
Plain helpers (node runner, admin, group scenario) live in compat_helpers.py so test modules can import them.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compat_helpers import hostport, unique
from helpers import measure_only_this_process, save_coverage, serialize_ast_parse

from mqk.cluster_local import free_port

# kafka-python 3 reads its bundled message specs with importlib.resources' legacy API, whose DeprecationWarning is
# attributed to importlib (not kafka.*), so setup.cfg's filter misses it; import it once here with it silenced.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka
    import kafka.admin  # noqa: F401 - imported for the warning filter around it, used by the tests later

serialize_ast_parse()
measure_only_this_process()


def pytest_sessionfinish(session: pytest.Session) -> None:
    save_coverage()


def start_broker(data_dir: Path, storage: str, extra_args: tuple[str, ...] = ()) -> Any:
    from mqk.testing import BrokerProcess

    return BrokerProcess(data_dir, storage=storage, extra_args=extra_args).start()


def stop_broker(broker: Any) -> None:
    try:
        broker.stop()
    except Exception:  # noqa: BLE001 - teardown must not mask the test's own failure
        try:
            broker.kill()
        except Exception as exc:  # noqa: BLE001 - teardown must not mask the test's own failure
            print(f"broker teardown failed: {exc!r}")


@pytest.fixture(scope="session")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One memory-store broker for every test that needs no restart."""
    broker = start_broker(tmp_path_factory.mktemp("mqk-compat"), "memory")
    yield broker
    stop_broker(broker)


@pytest.fixture
def bootstrap(shared_broker: Any) -> str:
    return hostport(shared_broker.bootstrap)


@pytest.fixture
def namesrv(shared_broker: Any) -> str:
    return hostport(shared_broker.namesrv_address)


@pytest.fixture
def file_broker(tmp_path: Path) -> Iterator[Any]:
    """A file-store broker of this test's own, for stop / restart / kill -9.

    Its listeners are on fixed free ports (the flags after BrokerProcess's port-0 ones win), so `restart()` comes
    back on the same addresses and a client that lived through the restart (idempotent producer) reconnects. The
    admin listener's too: on port 0 it could be given, at a restart, a port another listener is about to take
    back (the native one's, free since the kill), and that listener would then fail to bind."""
    ports = [free_port() for _ in range(4)]
    # Small segments and ConsumeQueue files (like mqk_file_broker's): tests write little, and a start scans and
    # maps whole segments.
    config = tmp_path / "broker.toml"
    config.write_text("[store]\ncommitlog_segment_bytes = 16777216\ncq_units_per_file = 10000\n")
    fixed = (
        "--config",
        str(config),
        "--kafka-listen",
        f"127.0.0.1:{ports[0]}",
        "--native-listen",
        f"127.0.0.1:{ports[1]}",
        "--namesrv-listen",
        f"127.0.0.1:{ports[2]}",
        "--admin-listen",
        f"127.0.0.1:{ports[3]}",
    )
    broker = start_broker(tmp_path / "data", "file", fixed)
    yield broker
    stop_broker(broker)


@pytest.fixture
def topic() -> str:
    return unique("topic")


@pytest.fixture
def group() -> str:
    return unique("group")


@pytest.fixture(scope="session")
def kcat() -> str:
    path = shutil.which("kcat") or shutil.which("kafkacat")
    assert path, "kcat is not installed (make compat-deps installs it from Debian's packages)"
    return path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Same legacy importlib.resources warning if kafka-python loads a spec lazily during a test.
    for item in items:
        if str(item.path).startswith(str(Path(__file__).parent)):
            item.add_marker(pytest.mark.filterwarnings("ignore:(open|read)_text is deprecated:DeprecationWarning"))
