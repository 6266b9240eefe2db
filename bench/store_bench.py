"""File-store benchmark: append, read-by-offset scan and timestamp lookup against the same disk's raw write speed.

For each flush mode (`async`, `sync`) it appends `--size` bytes of record batches (16 KiB batches of 1 KiB records
by default) to a fresh FileEngine, scans them back by offset, and times random timestamp lookups. Beside each mode
it runs a dd-style raw write of the same number of bytes, in the same batch-sized chunks, to the same directory:
buffered (like `dd bs=16k`), and with one fdatasync at the end (like `dd conv=fdatasync`) for the sync mode, once
just before and once just after the store run, and compares with their mean (the machine may be shared).

`sync` appends come from `--writers` concurrent producers (group commit: one fsync serves everyone waiting), which
is how a broker under load sees them; a lone synchronous producer pays one fsync per batch.

Also: compiled `_fast` vs its pure-Python twin for batch validation and ConsumeQueue search.

    python bench/store_bench.py                 # 1 GiB, both modes
    python bench/store_bench.py --size 64MiB --modes async
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mqk._fast import compiled, load, twin
from mqk.config import StoreConfig, TopicConfig
from mqk.store.file.engine import FileEngine

recbatch = load("recbatch")
MB = 1024 * 1024


def parse_size(text: str) -> int:
    units = {"k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30, "": 1}
    t = text.strip().lower()
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(float(num) * units[t[len(num) :]])


def make_batch(record_bytes: int, batch_bytes: int, base_ts: int) -> bytearray:
    rng = random.Random(7)
    count = max(1, batch_bytes // record_bytes)
    records = b"".join(
        recbatch.encode_record(i, i, b"key-%d" % i, rng.randbytes(record_bytes), []) for i in range(count)
    )
    return recbatch.build_batch(0, base_ts, base_ts + count - 1, records, count, count - 1)


def rate(nbytes: int, n: int, seconds: float) -> str:
    return f"{nbytes / MB / seconds:8.1f} MB/s {n / seconds:10.0f} batches/s"


def raw_write(directory: Path, chunk: bytes, n: int, sync: bool) -> float:
    path = directory / "raw.dat"
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(n):
            os.write(fd, chunk)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - t0
    path.unlink()
    return elapsed


async def run_mode(
    mode: str, directory: Path, batch: bytearray, n: int, writers: int, lookups: int, segment: int
) -> dict:
    root = directory / f"store-{mode}"
    shutil.rmtree(root, ignore_errors=True)
    config = StoreConfig(data_dir=root, flush_mode=mode, commitlog_segment_bytes=segment)
    engine = FileEngine(config, root)
    await engine.start()
    await engine.create_shards("bench", 1, TopicConfig())
    append = engine.append
    batches = [batch]
    # CPU per append beside the wall clock: on a shared machine wall time drifts with the neighbours, CPU much less
    # (process = every thread: event loop, flush, segment warm-up; loop = the event-loop thread alone)
    cpu0, loop0 = time.process_time(), time.thread_time()
    t0 = time.perf_counter()
    if mode == "sync":
        per = n // writers

        async def producer(count: int) -> None:
            for _ in range(count):
                await append("bench", 0, batches)

        counts = [per + (1 if i < n - per * writers else 0) for i in range(writers)]
        await asyncio.gather(*(producer(c) for c in counts))
    else:
        for _ in range(n):
            await append("bench", 0, batches)
    t_append = time.perf_counter() - t0
    cpu_append, loop_append = time.process_time() - cpu0, time.thread_time() - loop0
    stored = engine.stats.put_bytes
    fsyncs = engine.flusher.flush_count
    fsync_s = engine.flusher.flush_seconds

    # read-by-offset scan, 1 MiB per read like a consumer fetch
    end = engine.end_offset("bench", 0)
    t0 = time.perf_counter()
    offset, nb, nbytes = 0, 0, 0
    while offset < end:
        result = await engine.read("bench", 0, offset, MB)
        for b in result.batches:
            nbytes += len(b.data)
        nb += len(result.batches)
        offset = result.next_offset
    t_read = time.perf_counter() - t0

    # timestamp lookups at random points (record timestamps = the batch's base + record index)
    first_ts = (await engine.read("bench", 0, 0, 1)).batches[0].max_timestamp
    rng = random.Random(1)
    t0 = time.perf_counter()
    for _ in range(lookups):
        await engine.offset_for_timestamp("bench", 0, first_ts - 16 + rng.randrange(16))
    t_ts = time.perf_counter() - t0
    await engine.close()
    shutil.rmtree(root, ignore_errors=True)
    return {
        "append": t_append,
        "stored": stored,
        "read": t_read,
        "read_bytes": nbytes,
        "read_batches": nb,
        "ts": t_ts,
        "fsyncs": fsyncs,
        "fsync_s": fsync_s,
        "cpu": cpu_append,
        "loop_cpu": loop_append,
    }


def kernel_bench(batch: bytearray) -> list[str]:
    """Compiled vs twin on work where the kernel, not CRC or memcpy, dominates: walking 1,000 small batches
    (headers, lengths, CRC of 200 bytes each; then also their records, the check every produce runs) and bisecting
    300,000 ConsumeQueue units."""
    lines = []
    small = b"".join(bytes(make_batch(100, 200, 1000)) for _ in range(1000))
    for label, walk in (
        ("recbatch.scan_batches (1000 small batches, CRC on)", False),
        ("recbatch.scan_batches + record walk (the produce check, same batches)", True),
    ):
        res = []
        for mod in (compiled("recbatch"), twin("recbatch")):
            res.append(None if mod is None else _per_call(lambda m=mod, w=walk: m.scan_batches(small, True, w)))
        lines.append(_kernel_line(label, res))
    slow = twin("cqunit")
    units = bytearray(300_000 * 48)
    for i in range(300_000):
        slow.pack_unit(units, i * 48, i * 1000, 1000, 16, 0, i, i, i * 16)
    rng = random.Random(3)
    keys = [rng.randrange(300_000 * 16) for _ in range(200)]
    res = []
    for mod in (compiled("cqunit"), slow):
        res.append(
            None
            if mod is None
            else _per_call(lambda m=mod: [m.search_offset(units, 300_000, k) for k in keys]) / len(keys)
        )
    lines.append(_kernel_line("cqunit.search_offset (300k units)", res))
    return lines


def _per_call(fn) -> float:
    fn()
    k, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        fn()
        k += 1
    return (time.perf_counter() - t0) / k


def _kernel_line(name: str, res: list) -> str:
    fast, slow = res
    if fast is None:
        return f"{name}: compiled module not built; twin {slow * 1e6:.1f} us/call"
    return f"{name}: compiled {fast * 1e6:.2f} us/call, twin {slow * 1e6:.1f} us/call ({slow / fast:.0f}x)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GiB", help="bytes to append per mode (e.g. 64MiB, 1GiB)")
    ap.add_argument("--batch-bytes", default="16KiB")
    ap.add_argument("--record-bytes", default="1KiB")
    ap.add_argument("--modes", default="async,sync")
    ap.add_argument("--writers", type=int, default=64, help="concurrent producers in sync mode")
    ap.add_argument("--lookups", type=int, default=20000)
    ap.add_argument("--segment", default="1GiB", help="CommitLog segment size")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir in the current directory)")
    ap.add_argument("--no-kernels", action="store_true")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per mode (each beside its own raw writes); >1 also prints the median ratio: on a shared "
        "VM identical runs differ 2-3x",
    )
    args = ap.parse_args()
    size = parse_size(args.size)
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="mqk-bench-", dir="."))
    base.mkdir(parents=True, exist_ok=True)
    try:
        batch = make_batch(parse_size(args.record_bytes), parse_size(args.batch_bytes), int(time.time() * 1000))
        n = max(1, size // len(batch))
        total = n * len(batch)
        print(
            f"store_bench: {n} batches of {len(batch)} bytes ({total / MB:.0f} MiB) in {base.resolve()}, "
            f"_fast={'compiled' if compiled('clentry') else 'twin'}"
        )
        for mode in args.modes.split(","):
            ratios = []
            for _ in range(args.repeat):
                # raw write before and after the store run, averaged: on a shared machine the disk and CPUs drift.
                # Each phase starts with no dirty pages left by the one before (os.sync, untimed): otherwise the
                # writeback of the previous phase's gigabyte competes with whichever phase runs next.
                os.sync()
                raw_before = raw_write(base, bytes(batch), n, sync=(mode == "sync"))
                os.sync()
                r = asyncio.run(run_mode(mode, base, batch, n, args.writers, args.lookups, parse_size(args.segment)))
                os.sync()
                raw_after = raw_write(base, bytes(batch), n, sync=(mode == "sync"))
                raw = (raw_before + raw_after) / 2
                raw_label = "raw write+fdatasync" if mode == "sync" else "raw buffered write"
                raw_mbs = total / MB / raw
                app_mbs = total / MB / r["append"]
                extra = (
                    f", {args.writers} writers, {r['fsyncs']} fsyncs taking {r['fsync_s']:.2f} s"
                    if mode == "sync"
                    else ""
                )
                print(
                    f"[{mode}] append   {rate(total, n, r['append'])} | {raw_label} {raw_mbs:8.1f} MB/s "
                    f"(before {total / MB / raw_before:.0f}, after {total / MB / raw_after:.0f}) | "
                    f"ratio {app_mbs / raw_mbs:5.2f}{extra}"
                )
                print(
                    f"[{mode}] cpu      {r['cpu'] / n * 1e6:.1f} us/append in the process, "
                    f"{r['loop_cpu'] / n * 1e6:.1f} us on the event loop; raw write "
                    f"{raw / n * 1e6:.1f} us wall per batch"
                )
                print(
                    f"[{mode}] read     {rate(r['read_bytes'], r['read_batches'], r['read'])} | {raw_label} "
                    f"{raw_mbs:8.1f} MB/s | ratio {r['read_bytes'] / MB / r['read'] / raw_mbs:5.2f}"
                )
                print(
                    f"[{mode}] ts-lookup {args.lookups / r['ts']:9.0f} lookups/s "
                    f"({r['ts'] / args.lookups * 1e6:.1f} us each) | {raw_label} {raw_mbs:8.1f} MB/s"
                )
                ratios.append(app_mbs / raw_mbs)
            if len(ratios) > 1:
                ratios.sort()
                print(
                    f"[{mode}] append ratio over {len(ratios)} runs: median {ratios[len(ratios) // 2]:.2f} "
                    f"(min {ratios[0]:.2f}, max {ratios[-1]:.2f})"
                )
        if not args.no_kernels:
            for line in kernel_bench(batch):
                print(line)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
