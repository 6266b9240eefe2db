"""What N pending delayed messages cost a broker's memory, and whether they come out on time:

    python bench/timer_pending.py --count 10000000 --spread-s 3600

1. An idle broker on an empty file-store data directory: its RSS is the baseline.
2. The same kind of data directory is filled, through the store API, with `--count` timer records exactly as the
   timer's put-hook writes them (one wrapped message per record, each with its own due time, spread uniformly and
   in random order over `--spread-s` seconds starting `--lead-s` seconds after the fill began), bound for the topic
   `pending`. No client sits in the measurement: the bytes on disk are what N delayed produces would leave.
3. A broker is started on it. It prints its ready line at once; its timer re-reads the timer topic from the floor
   (the restart path) in the background, and once that read is done every message is pending (polled on /metrics:
   mqk_timer_pending_messages; both times are printed). Its RSS (VmRSS) and peak (VmHWM) are printed beside the
   baseline, with the bytes per pending message above the baseline.
4. For `--watch-s` seconds from the first due time, /metrics is polled: the delivered count at each poll is checked
   against the due times (none delivered early; lateness of each delivered message at most the poll time minus its
   due time, printed as p50/p99/max), and every message due `--late-s` before the watch ends must have come out.
   With a spread no longer than the watch every message is checked. The timer's state document (`state/timer.json`)
   is measured at each poll: its largest size is printed (it names delivered messages by rule, not one by one).

RSS is printed whole and as its anonymous part (RssAnon): the rest is CommitLog pages the file store maps (the
timer's start-up read touches every timer record once), clean pages the kernel reclaims under pressure.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import random
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import perfutil

TOPIC = "pending"
_CHUNK = 2000


def _rss_kb(pid: int) -> tuple[int, int, int]:
    """(VmRSS, VmHWM, RssAnon) of `pid` in kB. RssAnon is the process's own memory (heap, Python objects); the rest
    of VmRSS is mapped files (the CommitLog's pages), which the kernel reclaims under pressure."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value
    return tuple(int(fields[name].split()[0]) for name in ("VmRSS", "VmHWM", "RssAnon"))  # type: ignore[return-value]  # three fields


def _metric(admin: tuple[str, int], name: str) -> float:
    with urllib.request.urlopen(f"http://{admin[0]}:{admin[1]}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    m = re.search(rf"^{name}(?:_total)?(?:{{[^}}]*}})? (\S+)$", text, re.M)
    if m is None:
        raise RuntimeError(f"/metrics has no {name}")
    return float(m.group(1))


async def _fill(data_dir: Path, dues: list[int], now_ms: int) -> float:
    """Append one timer record per due time (in the given order) as the put-hook would; returns seconds taken."""
    from mqk.config import StoreConfig, TopicConfig
    from mqk.protocol.native.records import message_to_batch
    from mqk.store.manager import StoreManager
    from mqk.timer.delay import Waiting, wrap
    from mqk.timer.service import TIMER_TOPIC

    store = StoreManager(StoreConfig(storage="file", data_dir=data_dir))
    await store.start()
    start = time.perf_counter()
    try:
        await store.create_topic(TOPIC, 1)
        await store.create_topic(TIMER_TOPIC, 1, TopicConfig({"retention.ms": str(7 * 24 * 3600 * 1000)}))
        for first in range(0, len(dues), _CHUNK):
            batches = [
                wrap([Waiting(TOPIC, 0, due, 0, (), bytes(message_to_batch(b"%d" % i, {}, now_ms)))], now_ms)
                for i, due in enumerate(dues[first : first + _CHUNK], first)
            ]
            await store.append(TIMER_TOPIC, 0, batches)
            if first % 500_000 == 0 and first:
                print(f"filled {first} of {len(dues)}", file=sys.stderr, flush=True)
    finally:
        await store.close()
    return time.perf_counter() - start


def _watch(
    admin: tuple[str, int], dues_sorted: list[int], until_ms: int, tolerance_ms: int, state_doc: Path
) -> dict[str, float]:
    """Poll the delivered count until `until_ms`; early deliveries, per-message lateness bounds, and the largest
    size the timer's state document reached."""
    lateness: list[float] = []
    seen = 0
    early = 0
    doc_bytes = 0
    while True:
        with contextlib.suppress(OSError):  # (replaced atomically: briefly absent is not an error)
            doc_bytes = max(doc_bytes, state_doc.stat().st_size)
        delivered = int(_metric(admin, "mqk_timer_delivered"))
        after = time.time() * 1000
        due_by_now = bisect.bisect_right(dues_sorted, after)
        early = max(early, delivered - due_by_now)
        for k in range(seen, min(delivered, len(dues_sorted))):
            lateness.append(after - dues_sorted[k])
        seen = max(seen, delivered)
        if after >= until_ms or seen >= len(dues_sorted):
            break
        time.sleep(0.1)
    expected = bisect.bisect_right(dues_sorted, until_ms - tolerance_ms)  # due that long before the end: there
    lateness.sort()
    return {
        "checked": len(lateness),
        "expected": expected,
        "missing": max(0, expected - seen),
        "early": early,
        "p50": perfutil.percentile(lateness, 50) if lateness else 0.0,
        "p99": perfutil.percentile(lateness, 99) if lateness else 0.0,
        "max": lateness[-1] if lateness else 0.0,
        "doc_bytes": doc_bytes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10_000_000, help="delayed messages pending (default 10 M)")
    parser.add_argument("--spread-s", type=float, default=3600.0, help="due times spread over this long (1 h)")
    parser.add_argument(
        "--lead-s", type=float, default=None, help="first due time after the fill began (default: 60 s + 25 us each)"
    )
    parser.add_argument("--watch-s", type=float, default=60.0, help="deliveries watched this long from the first due")
    parser.add_argument(
        "--late-s", type=float, default=2.0, help="a message this late at the end of the watch is missing (2 s)"
    )
    parser.add_argument("--ordered", action="store_true", help="write in due order (default: random order)")
    parser.add_argument("--data-dir", help="where both data directories go (default: a temporary one)")
    args = parser.parse_args()

    from mqk.testing import BrokerProcess

    root_tmp = None
    if args.data_dir is None:
        root_tmp = tempfile.TemporaryDirectory(prefix="mqk-timer-bench-")
        root = Path(root_tmp.name)
    else:
        root = Path(args.data_dir)
    try:
        idle = BrokerProcess(root / "idle", storage="file").start()
        try:
            time.sleep(2.0)
            base_rss, base_hwm, base_anon = _rss_kb(idle.pid)
        finally:
            idle.stop()
        print(
            f"idle broker: RSS {base_rss / 1024:.1f} MB (peak {base_hwm / 1024:.1f} MB, anonymous "
            f"{base_anon / 1024:.1f} MB)",
            flush=True,
        )

        lead_s = args.lead_s if args.lead_s is not None else 60.0 + args.count * 25e-6
        now_ms = int(time.time() * 1000)
        first_due = now_ms + int(lead_s * 1000)
        rng = random.Random(29)
        span = int(args.spread_s * 1000)
        dues = [first_due + rng.randrange(span) for _ in range(args.count)]
        if args.ordered:
            dues.sort()
        fill_s = asyncio.run(_fill(root / "full", dues, now_ms))
        dues.sort()
        print(
            f"fill: {args.count} timer records in {fill_s:.1f} s, {args.count / fill_s:.0f} records/sec "
            f"({'due order' if args.ordered else 'random due order'}, due over {args.spread_s:.0f} s)",
            flush=True,
        )

        t0 = time.perf_counter()
        broker = BrokerProcess(root / "full", storage="file", timeout=3600.0).start()
        try:
            ready_s = time.perf_counter() - t0
            assert broker.admin_address is not None
            pending = int(_metric(broker.admin_address, "mqk_timer_pending_messages"))
            while pending < args.count and time.perf_counter() - t0 < 3600:  # the schedule is read after ready
                time.sleep(0.05)
                pending = int(_metric(broker.admin_address, "mqk_timer_pending_messages"))
            read_s = time.perf_counter() - t0
            rss, hwm, anon = _rss_kb(broker.pid)
            above = (anon - base_anon) * 1024 / max(pending, 1)
            print(
                f"pending: {pending} of {args.count} delayed messages; ready line after {ready_s:.2f} s, schedule "
                f"read after {read_s:.1f} s ({args.count / read_s:.0f} records/sec read); "
                f"broker RSS {rss / 1024:.1f} MB "
                f"(peak {hwm / 1024:.1f} MB, anonymous {anon / 1024:.1f} MB; idle: {base_rss / 1024:.1f} MB, "
                f"anonymous {base_anon / 1024:.1f} MB); {above:.1f} anonymous bytes/message above idle",
                flush=True,
            )
            spill = root / "full" / "timer" / "spill.idx"
            if spill.exists():
                print(f"spill index: {spill.stat().st_size / 1048576:.1f} MB on disk", flush=True)
            if time.time() * 1000 > first_due:
                print(f"warning: the first due time passed {time.time() - first_due / 1000:.1f} s before ready")
            wait = first_due / 1000 - time.time()
            if wait > 0:
                time.sleep(wait)
            tolerance_ms = int(args.late_s * 1000)
            state_doc = root / "full" / "state" / "timer.json"
            watched = _watch(broker.admin_address, dues, first_due + int(args.watch_s * 1000), tolerance_ms, state_doc)
            rss2, hwm2, anon2 = _rss_kb(broker.pid)
            print(
                f"delivery: {watched['checked']} delivered in the first {args.watch_s:.0f} s of due times "
                f"({watched['expected']} due {args.late_s:g} s before its end, {watched['missing']} of them missing), "
                f"{watched['early']} early; lateness p50 {watched['p50']:.0f} ms, p99 {watched['p99']:.0f} ms, "
                f"max {watched['max']:.0f} ms (at most: poll time minus due time); RSS then {rss2 / 1024:.1f} MB, "
                f"peak {hwm2 / 1024:.1f} MB, anonymous {anon2 / 1024:.1f} MB; timer state document at most "
                f"{watched['doc_bytes']:.0f} bytes",
                flush=True,
            )
            ok = pending == args.count and watched["missing"] == 0 and watched["early"] == 0
        finally:
            broker.stop()
    finally:
        if root_tmp is not None:
            root_tmp.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
