"""How fast `mqk serve` starts and how much memory it idles at, beside the machine's own Python start-up.

Starts `python -m mqk serve` (every listener on port 0, `--admin-listen 127.0.0.1:0`) `--runs` times and measures
the wall time from spawn to the ready line on its stdout, then, after it has idled `--idle` seconds, its resident
set (VmRSS in /proc/PID/status) and stops it. Each start gets a fresh empty data directory, unless `--partitions`
asks for a prepared one: a file-store data directory with one topic of that many partitions holding `--log-bytes`
of records between them, written once through the store's own API and then started `--runs` times (the broker
recovers it, as after a clean stop, at every start). The baseline, `python -c pass` from the same interpreter, is
timed in the same run, interleaved with the broker's starts, because the machine may be busy with other work.

`--after-kill` stops every broker with SIGKILL instead of SIGTERM, and all starts share one data directory (or the
prepared one): each start after the first recovers from a crash, as after a power cut or a kill -9. The first,
fresh start is not counted.

`--env NAME=VALUE` sets a variable for the broker and the baseline (e.g. `PYTHONDONTWRITEBYTECODE=1`, which makes
Python compile every module whose bytecode is not cached ahead: `make setup` caches the package's).

    python bench/start_rss.py
    python bench/start_rss.py --env PYTHONDONTWRITEBYTECODE=1
    python bench/start_rss.py --partitions 1000 --log-bytes 1GiB
    python bench/start_rss.py --after-kill
    python bench/start_rss.py --serve-arg=--grpc-listen --serve-arg=off
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from perfutil import REPO, parse_props, percentile

START_GOAL_MS = 120.0
RSS_GOAL_MB = 35.0
READY = "mqk ready "


def parse_size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
    t = text.strip().lower()
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num) :]
    if unit not in units:
        raise SystemExit(f"unknown size unit in {text!r}")
    return int(float(num) * units[unit])


def prepare(data_dir: Path, partitions: int, log_bytes: int, batch_bytes: int) -> None:
    """One topic `bench` of `partitions` partitions, `log_bytes` of 1 KiB records spread evenly over them in
    batches of `batch_bytes`, written through the file store and closed cleanly."""
    from mqk._fast import load
    from mqk.config import StoreConfig
    from mqk.store.manager import StoreManager

    recbatch = load("recbatch")
    record = os.urandom(1000)
    count = max(1, batch_bytes // 1024)
    records = b"".join(recbatch.encode_record(i, i, b"k%d" % i, record, []) for i in range(count))
    now_ms = int(time.time() * 1000)
    batch = bytes(recbatch.build_batch(0, now_ms, now_ms, records, count, count - 1))
    batches = max(partitions, log_bytes // len(batch))

    async def fill() -> None:
        store = StoreManager(StoreConfig(data_dir=data_dir, storage="file"))
        await store.start()
        try:
            await store.create_topic("bench", partitions)
            for i in range(0, batches, partitions):
                entries = [(p, [batch]) for p in range(min(partitions, batches - i))]
                for result in await store.append_many("bench", entries):
                    if isinstance(result, Exception):
                        raise result
        finally:
            await store.close()

    started = time.perf_counter()
    asyncio.run(fill())
    print(
        f"prepared {data_dir}: {partitions} partitions, {batches * len(batch) / (1 << 20):.0f} MiB of log "
        f"in {batches} batches of {len(batch)} bytes ({time.perf_counter() - started:.1f} s)",
        flush=True,
    )


def baseline_ms(env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return (time.perf_counter() - started) * 1000


RSS_FIELDS = ("VmRSS", "RssAnon", "RssFile")


def rss_mb(pid: int) -> dict[str, float]:
    """VmRSS and its parts from /proc/PID/status, in MB: RssAnon (the heap: what the process itself holds) and
    RssFile (pages of mapped files, the store's CommitLog and ConsumeQueues among them, which the kernel may reclaim
    and which grow with what the broker has read or written through its maps)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in RSS_FIELDS:
                out[key] = int(line.split()[1]) / 1024
    return out


def start_broker(
    data_dir: Path, env: dict[str, str], idle_s: float, storage: str, kill: bool = False, more: Sequence[str] = ()
) -> tuple[float, dict[str, float]]:
    """One start: (ms from spawn to the ready line, rss_mb after idling `idle_s`); stopped with SIGKILL if `kill`."""
    cmd = [
        sys.executable, "-m", "mqk", "serve",
        "--data-dir", str(data_dir),
        "--storage", storage,
        "--kafka-listen", "127.0.0.1:0",
        "--native-listen", "127.0.0.1:0",
        "--namesrv-listen", "127.0.0.1:0",
        "--admin-listen", "127.0.0.1:0",
        *more,
    ]  # fmt: skip
    log_path = data_dir.parent / f"{data_dir.name}.log"
    with open(log_path, "ab") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=REPO)
    try:
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the broker exited before its ready line; log: {log_path.read_text()[-2000:]}")
            if line.startswith(READY):
                ready_ms = (time.perf_counter() - started) * 1000
                break
        time.sleep(idle_s)
        rss = rss_mb(proc.pid)
    finally:
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    if proc.returncode != 0 and not kill:
        raise RuntimeError(f"the broker exited with {proc.returncode}; log: {log_path.read_text()[-2000:]}")
    return ready_ms, rss


def summary(name: str, values: list[float], unit: str) -> str:
    s = sorted(values)
    return (
        f"{name}: {len(s)} runs, {percentile(s, 50):.1f} {unit} p50, {percentile(s, 90):.1f} {unit} p90, "
        f"{s[0]:.1f} {unit} min, {s[-1]:.1f} {unit} max"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="broker starts (default 10)")
    parser.add_argument("--idle", type=float, default=1.0, help="seconds idle before reading RSS (default 1)")
    parser.add_argument("--env", action="append", metavar="NAME=VALUE", help="set for the broker and the baseline")
    parser.add_argument("--storage", default="file", choices=("file", "memory", "rocksdb"), help="(default file)")
    parser.add_argument("--partitions", type=int, help="start on a prepared data dir: one topic of N partitions")
    parser.add_argument("--log-bytes", default="1GiB", help="log in the prepared data dir (default 1GiB)")
    parser.add_argument("--batch-bytes", default="64KiB", help="batch size in the prepared data dir (default 64KiB)")
    parser.add_argument("--dir", help="where data directories go (default: a temporary directory)")
    parser.add_argument(
        "--serve-arg", action="append", default=[], metavar="ARG", help="one more argument for mqk serve"
    )
    parser.add_argument("--after-kill", action="store_true", help="kill -9 each broker; time the recovering starts")
    args = parser.parse_args()
    if args.runs < 1:
        raise SystemExit("--runs must be at least 1")
    extra_env = parse_props(args.env)
    env = {**os.environ, **extra_env}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))

    with tempfile.TemporaryDirectory(prefix="mqk-start-", dir=args.dir) as tmp:
        root = Path(tmp)
        prepared = None
        if args.partitions:
            prepared = root / "prepared"
            prepare(prepared, args.partitions, parse_size(args.log_bytes), parse_size(args.batch_bytes))
        ready: list[float] = []
        rss: dict[str, list[float]] = {field: [] for field in RSS_FIELDS}
        base: list[float] = []
        if args.after_kill:  # the first start makes the data directory the others recover
            start_broker(prepared or root / "data", env, 0.0, args.storage, kill=True, more=args.serve_arg)
        for run in range(args.runs):
            base.append(baseline_ms(env))
            data_dir = prepared or root / ("data" if args.after_kill else f"data-{run}")
            ms, mb = start_broker(data_dir, env, args.idle, args.storage, kill=args.after_kill, more=args.serve_arg)
            ready.append(ms)
            for field in RSS_FIELDS:
                rss[field].append(mb.get(field, 0.0))
            base.append(baseline_ms(env))
            if prepared is None and not args.after_kill:
                shutil.rmtree(data_dir)

    what = f"{args.partitions} partitions, {args.log_bytes} of log" if prepared else "an empty data dir"
    if args.after_kill:
        what += ", each start recovering from a kill -9"
    env_text = f"PYTHONDONTWRITEBYTECODE={env.get('PYTHONDONTWRITEBYTECODE', '')!r}"
    serve = " ".join(["mqk serve --storage", args.storage, *args.serve_arg])
    print(f"{serve} on {what} ({env_text}), {sys.executable}:")
    print(summary("python -c pass (baseline)", base, "ms"))
    print(summary("spawn to ready line", ready, "ms"))
    for field in RSS_FIELDS:
        print(summary(f"{field} after {args.idle:g} s idle", rss[field], "MB"))
    median_ready = statistics.median(ready)
    median_rss = statistics.median(rss["VmRSS"])
    print(
        f"goal: ready <= {START_GOAL_MS:.0f} ms (median) {'met' if median_ready <= START_GOAL_MS else 'NOT met'} "
        f"({median_ready - statistics.median(base):.1f} ms above the baseline); "
        f"VmRSS <= {RSS_GOAL_MB:.0f} MB {'met' if median_rss <= RSS_GOAL_MB else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
