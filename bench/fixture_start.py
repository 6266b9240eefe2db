"""How long mqk's pytest fixtures take to give a test its broker: the setup time pytest reports for each test.

Runs one pytest session in this process over a generated test module: `--runs` tests taking nothing and `--runs`
taking only `tmp_path` (pytest's own cost of a test's setup and of a tmp dir: the baselines), then `--runs` taking
`mqk_broker` (memory store), `mqk_file_broker` (file store in the test's tmp_path) and `mqk_session_broker` under
`@pytest.mark.mqk_reset` (each test leaves three topics and a group with committed offsets for the next one's reset
to delete). The first test of each kind pays the imports (the broker, the file engine) and is shown apart; the goal
(20 ms) is for the setups after it. A fresh file store makes its files durable as any other (fsyncs of its abort
marker, index checkpoint and topic metadata), so `mqk_file_broker` costs what the disk's fsync costs on top.
Extra arguments go to the inner pytest run, so the plugin's options can be measured too:

    python bench/fixture_start.py
    python bench/fixture_start.py --runs 50 -- --mqk-flush sync --mqk-partitions 4
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytest
from perfutil import percentile

GOAL_MS = 20.0

TESTS = """
import pytest

from mqk.store.adapter import GroupOffset


@pytest.mark.parametrize("n", range({runs}))
def test_0_nothing(n):
    pass


@pytest.mark.parametrize("n", range({runs}))
def test_0_tmp_path(n, tmp_path):
    pass


@pytest.mark.parametrize("n", range({runs}))
def test_1_mqk_broker(n, mqk_broker):
    assert mqk_broker.runtime.started


@pytest.mark.parametrize("n", range({runs}))
def test_2_mqk_file_broker(n, mqk_file_broker):
    assert mqk_file_broker.runtime.started


@pytest.mark.mqk_reset
@pytest.mark.parametrize("n", range({runs}))
def test_3_mqk_reset(n, mqk_session_broker):
    store = mqk_session_broker.store
    assert [t for t in store.topics() if not t.startswith("__")] == []
    for topic in ("a", "b", "c"):
        mqk_session_broker.call(store.create_topic(topic, 3))
    mqk_session_broker.call(store.commit_offsets("g", {{("a", 0): GroupOffset(0, "", 0)}}))
"""

KINDS = {
    "test_0_nothing": "no fixture (pytest's own setup)",
    "test_0_tmp_path": "tmp_path alone (a file broker's tmp dir)",
    "test_1_mqk_broker": "mqk_broker",
    "test_2_mqk_file_broker": "mqk_file_broker",
    "test_3_mqk_reset": "mqk_reset on mqk_session_broker",
}


class Recorder:
    """Setup and teardown durations per kind of test, in run order."""

    def __init__(self) -> None:
        self.setup: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.teardown: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.failed: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        kind = report.nodeid.split("::")[-1].split("[")[0]
        if report.failed:
            self.failed.append(f"{report.nodeid} ({report.when})")
        if kind in KINDS and report.when in ("setup", "teardown"):
            getattr(self, report.when)[kind].append(report.duration * 1000)


def line(name: str, setup: list[float], teardown: list[float]) -> str:
    first, rest = setup[0], sorted(setup[1:])
    return (
        f"{name}: {len(rest)} setups after the first, {statistics.fmean(rest):.2f} ms avg, {rest[-1]:.2f} ms max, "
        f"{percentile(rest, 50):.2f} ms p50, {percentile(rest, 95):.2f} ms p95, {percentile(rest, 99):.2f} ms p99 "
        f"(first: {first:.1f} ms; teardown {statistics.fmean(teardown):.2f} ms avg)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30, help="tests of each kind (default 30)")
    parser.add_argument("pytest_args", nargs="*", help="more arguments for the inner pytest run (after --)")
    args = parser.parse_args()
    if args.runs < 2:
        raise SystemExit("--runs must be at least 2 (the first of each kind is shown apart)")
    with tempfile.TemporaryDirectory(prefix="mqk-fixture-start-") as tmp:
        root = Path(tmp)
        (root / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
        (root / "test_fixture_start.py").write_text(TESTS.format(runs=args.runs))
        recorder = Recorder()
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = pytest.main(
                [str(root), "-q", "-p", "no:cacheprovider", "--basetemp", str(root / "tmp"), *args.pytest_args],
                plugins=[recorder],
            )
        elapsed = time.perf_counter() - started
    if code != 0 or recorder.failed:
        sys.stdout.write(out.getvalue())
        raise SystemExit(f"the inner pytest run failed (exit code {code}): {recorder.failed}")
    print(f"{args.runs} tests of each kind in one pytest session ({elapsed:.1f} s); setup time pytest reports:")
    for kind, name in KINDS.items():
        print(line(name, recorder.setup[kind], recorder.teardown[kind]))
    verdicts = []
    for kind in list(KINDS)[2:]:
        median = statistics.median(recorder.setup[kind][1:])
        verdicts.append(f"{KINDS[kind]} {median:.2f} ms {'met' if median <= GOAL_MS else 'NOT met'}")
    print(f"goal: <= {GOAL_MS:.0f} ms after the first (median): {'; '.join(verdicts)}")


if __name__ == "__main__":
    main()
