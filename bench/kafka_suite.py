"""The Kafka-wire benchmark list, in one run against one freshly started file-store broker:

    python bench/kafka_suite.py                # defaults: 1,000,000 x 100 B, 200,000 x 1 KiB, native too
    python bench/kafka_suite.py --quick        # a smoke run with small counts

1. ingest of 100 B records into 1 partition, acks=1 and acks=all (and acks=1 with lz4): records/s, MB/s, broker
   CPU s per million records;
2. ingest of 1 KiB records (confluent-kafka, then the broker's own capacity from pre-built batches): MB/s, beside
   `dd` writing the same number of bytes (buffered, no fsync) next to the store on the same disk, into fresh page
   cache as the broker's ingest is, in PAIRS (5) alternating pairs (see `_dd_pairs`); a `dd` rewriting a deleted
   file's pages is printed too;
3. consume of the 100 B topic: records/s with confluent-kafka, and with a wire-level consumer that counts records
   from batch headers (what the broker serves when the Python client's per-record cost is not the limit);
   then 100 B ingest into 1 partition and consume of those records with kcat (librdkafka's C client, no Python
   in the client's path: a real client that can push what the broker takes), three runs each (kcat_perf.py);
4. end-to-end latency p50/p99 at half of the end-to-end pipeline's own maximum (unpaced producer with the
   consumer reading along; three runs: the goal's half load), at half of the acks=1 ingest rate (producer alone:
   for reference, it can be the pipeline's whole maximum), and at 1,000 records/s; then at half of the wire-level
   pipeline's maximum (three runs);
5. ingest into 1,000 partitions (records sent round-robin) against 1 partition: a first pass (which pays for
   creating 1,000 queues' files), then three alternating pairs of 1 partition and the same, now existing 1,000,
   with the client's CPU per record beside the broker's: librdkafka sends one partition per request (a few to a
   few hundred records each, depending on how fast answers come back) against thousands into 1 partition, and its
   per-partition work is mostly the client's;
   three pairs more with keyless records placed by the client's partitioner, as kafka-producer-perf-test's are
   (librdkafka's sticky partitioner: one partition's batch at a time), with how many partitions each run wrote;
   the round-robin pairs again with the client on one CPU and the broker on another, with how busy each core was;
   then the broker's own capacity with the same batches spread over 1 or 1,000 partitions
   (bench/produce_capacity.py);
6. the native (remoting) figures of bench/native_perf.py from the same run, for comparison.
Each figure is printed as its tool prints it, then a summary with the goals each is judged by. The clients are Python
(confluent-kafka / librdkafka, mqk.client) sharing the machine with the broker, so where the client is the limit
the broker's CPU per record is the figure that speaks for the broker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import consumer_perf
import e2e_latency
import kcat_perf
import native_perf
import perfutil
import produce_capacity
import producer_perf


def _quiet(broker: perfutil.Broker) -> None:
    """Start a phase with no dirty pages of an earlier one left to write back (os.sync, untimed) and the broker
    idle: an unpaced run leaves hundreds of MB for the flusher, which would otherwise land in the next phase."""
    os.sync()
    broker.settle()


def _produce(
    broker: perfutil.Broker,
    name: str,
    records: int,
    size: int,
    acks: str,
    partitions: int = 1,
    sample_every: int = 100,
    topic: str | None = None,
    props: dict[str, str] | None = None,
    pin: bool = False,
    spread: str = "round-robin",
) -> dict[str, Any]:
    """One producer_perf.py run with the broker's and the client's CPU per record; with `pin`, the client on one
    CPU and the broker on another (perfutil.pinned), and how busy each of the two cores was. `spread`: see
    producer_perf.run; with "client", also how many of the partitions the run wrote to."""
    if topic is None:
        topic = f"suite-{name}-{uuid.uuid4().hex[:6]}"
        perfutil.create_topic(broker.bootstrap, topic, partitions)
    before = perfutil.end_offsets(broker.bootstrap, topic, partitions) if spread == "client" else None
    _quiet(broker)
    cpu0 = broker.cpu_seconds()
    print(f"\n== {name}: {records} x {size} B, {partitions} partition(s), acks={acks}, {spread}", flush=True)
    client0 = time.process_time()  # this process is the client: Python's produce() loop and librdkafka's threads
    with perfutil.pinned(broker.process.proc.pid) if pin else contextlib.nullcontext(False) as pinned:
        r = producer_perf.run(
            broker.bootstrap,
            topic,
            records,
            size,
            producer_props={"acks": acks, **(props or {})},
            partitions=partitions,
            sample_every=sample_every,
            spread=spread,
        )
        client_cpu = time.process_time() - client0
        broker_cpu = broker.cpu_seconds() - cpu0
    r["client_cpu_s_per_million"] = client_cpu / records * 1e6
    broker.settle()  # background flush / dispatch of these records belongs to this phase
    r["cpu_s"] = broker.cpu_seconds() - cpu0
    r["cpu_s_per_million"] = r["cpu_s"] / records * 1e6
    r["topic"] = topic
    if before is not None:
        after = perfutil.end_offsets(broker.bootstrap, topic, partitions)
        r["partitions_written"] = sum(1 for b, a in zip(before, after) if a > b)
        print(f"the client's partitioner wrote to {r['partitions_written']} of the {partitions} partitions", flush=True)
    pinned_note = ""
    if pinned:
        r["client_core_busy"] = client_cpu / r["elapsed_s"]
        r["broker_core_busy"] = broker_cpu / r["elapsed_s"]
        pinned_note = (
            f"; a core each: client core {r['client_core_busy']:.0%} busy, broker core {r['broker_core_busy']:.0%} busy"
        )
    print(
        f"broker cpu: {r['cpu_s']:.2f} s, {r['cpu_s_per_million']:.2f} s per million records; client cpu "
        f"{r['client_cpu_s_per_million']:.2f} s per million records{pinned_note}",
        flush=True,
    )
    return r


def _dd(directory: str, nbytes: int, fdatasync: bool = False, kept: list[str] | None = None) -> float:
    """MB/s of a buffered `dd` write of `nbytes` in 1 MiB blocks (what the store's own writes go through too),
    with `fdatasync` ending in one fdatasync (dd conv=fdatasync). Starts with no dirty pages (os.sync, untimed):
    buffered, `nbytes` well below the dirty limits is a memory copy into the page cache, not a disk write.

    The file is removed at once, unless `kept` is given: then its path is added there for the caller to remove
    after the last run, so each run fills page cache that nothing just freed, as a broker keeping what it ingests
    does (see `_dd_pairs`)."""
    target = f"{directory}/dd-{uuid.uuid4().hex[:6]}.bin"
    count = max(1, nbytes // 1048576)
    os.sync()
    proc = subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={count}", *(["conv=fdatasync"] if fdatasync else [])],
        capture_output=True,
        text=True,
        check=True,
    )
    if kept is None:
        subprocess.run(["rm", "-f", target], check=True)
    else:
        kept.append(target)
    # "... bytes (...) copied, 0.25 s, 840 MB/s" -- recompute from bytes and seconds to avoid unit parsing.
    m = re.search(r"(\d+) bytes.*copied, ([\d.,]+) s", proc.stderr)
    if not m:
        raise RuntimeError(f"cannot read dd's output: {proc.stderr}")
    return int(m.group(1)) / float(m.group(2).replace(",", ".")) / 1048576


#: pairs in the series judged by their median pair: the 1 KiB ingests against dd, the broker's capacity into 1 and
#: 1,000 partitions. Three are too few: one pair in three can land in another state of the host (bench/README.md)
PAIRS = 5


def _dd_pairs(directory: str, nbytes: int, kept: list[str], ingest: Any) -> list[tuple[float, dict[str, Any]]]:
    """PAIRS pairs of a buffered `dd` of `nbytes` and `ingest()` (a broker ingest of the same bytes), in turns
    (dd first, then the broker first, and so on): [(dd MB/s, the ingest's result)].

    The like-for-like baseline for an ingest: the broker keeps every byte it is sent, so each dd keeps its file
    too (its path goes to `kept`, which the caller removes after its last pair), and both grow the page cache
    into memory nobody just freed. On a VM whose balloon reports free pages to the host such memory costs
    host-side faults, but how much changes from minute to minute (bench/README.md). Each pair's two writes run back
    to back, so each pair's ratio compares the two in one state of the host."""
    pairs = []
    for i in range(PAIRS):
        if i % 2 == 0:
            dd_mb_s = _dd(directory, nbytes, kept=kept)
            result = ingest()
        else:
            result = ingest()
            dd_mb_s = _dd(directory, nbytes, kept=kept)
        print(
            f"dd buffered write of the same {nbytes / 1048576:.0f} MiB into fresh page cache (file kept): "
            f"{dd_mb_s:.1f} MB/sec; the ingest {result['mb_per_s'] / dd_mb_s:.0%} of it",
            flush=True,
        )
        pairs.append((dd_mb_s, result))
    return pairs


def _median_dd_pair(pairs: list[tuple[float, dict[str, Any]]]) -> tuple[list[float], float, dict[str, Any], float]:
    """(every pair's ingest / dd ratio, the median pair's dd MB/s, its ingest result, its ratio)."""
    ratios = [result["mb_per_s"] / dd_mb_s for dd_mb_s, result in pairs]
    dd_mb_s, result = sorted(pairs, key=lambda pair: pair[1]["mb_per_s"] / pair[0])[len(pairs) // 2]
    return ratios, dd_mb_s, result, result["mb_per_s"] / dd_mb_s


def _pairs(
    broker: perfutil.Broker, records: int, many_topic: str, tag: str, **kw: Any
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Three alternating (1 partition, 1,000 partitions of `many_topic`) _produce runs of 100 B records."""
    return [
        (
            _produce(broker, f"partitions-1-{tag}", records, 100, "1", **kw),
            _produce(broker, f"partitions-1000-{tag}", records, 100, "1", partitions=1000, topic=many_topic, **kw),
        )
        for _ in range(3)
    ]


def _percents(ratios: list[float]) -> str:
    return ", ".join(f"{x:.0%}" for x in ratios)


def _median_pair(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> tuple[list[float], dict, dict, float]:
    """(every pair's 1,000 / 1 partition rate ratio, the median pair's two runs, its ratio)."""
    ratios = [many["records_per_s"] / one["records_per_s"] for one, many in pairs]
    one, many = sorted(pairs, key=lambda pair: pair[1]["records_per_s"] / pair[0]["records_per_s"])[len(pairs) // 2]
    return ratios, one, many, many["records_per_s"] / one["records_per_s"]


def _three(run: Any, broker: perfutil.Broker) -> dict[str, Any]:
    """Three latency runs (each started quiet): the run with the median p99, with every run's p50 and p99."""
    runs = []
    for i in range(3):
        if i:
            _quiet(broker)
        runs.append(run())
    median = sorted(runs, key=lambda r: r["p99_ms"])[1]
    return {**median, "runs": runs}


def _runs_note(r: dict[str, Any]) -> str:
    return "runs' p50 / p99 " + ", ".join(f"{x['p50_ms']:.2f} / {x['p99_ms']:.2f}" for x in r["runs"]) + " ms"


def _kcat(broker: perfutil.Broker, records: int) -> dict[str, dict[str, Any]]:
    """Three kcat ingest runs of `records` x 100 B into one fresh 1-partition topic, then three kcat consumes of
    the first `records` of it; the median run of each (by records/s) with the broker's CPU for it."""
    topic = f"suite-kcat-{uuid.uuid4().hex[:6]}"
    perfutil.create_topic(broker.bootstrap, topic, 1)
    runs: dict[str, list] = {"produce": [], "consume": []}
    with tempfile.TemporaryDirectory(prefix="mqk-bench-kcat-") as tmp:
        values = os.path.join(tmp, "values.txt")
        kcat_perf.write_records(values, records, 100)
        print(f"\n== kcat ingest: {records} x 100 B, 1 partition, acks=1, linger.ms=5 (three runs)", flush=True)
        for _ in range(3):
            _quiet(broker)
            r = kcat_perf.with_broker_cpu(
                broker, lambda: kcat_perf.produce(broker.bootstrap, topic, records, 100, input_path=values)
            )
            print(f"{kcat_perf.produce_line(r)}; {kcat_perf.broker_note(r)}", flush=True)
            runs["produce"].append(r)
    print(f"== kcat consume: the first {records} records of that topic (three runs)", flush=True)
    for _ in range(3):
        r = kcat_perf.with_broker_cpu(broker, lambda: kcat_perf.consume(broker.bootstrap, topic, records))
        print(f"{kcat_perf.consume_line(r, 100)}; {kcat_perf.broker_note(r)}", flush=True)
        runs["consume"].append(r)
    return {kind: sorted(rs, key=lambda r: r["records_per_s"])[1] for kind, rs in runs.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1_000_000, help="100 B records per ingest run")
    p.add_argument("--records-1k", type=int, default=200_000, help="1 KiB records for the dd comparison")
    p.add_argument("--partition-records", type=int, default=500_000, help="records for the 1 vs 1,000 partitions runs")
    p.add_argument(
        "--capacity-records",
        type=int,
        default=1_000_000,
        help="records per produce_capacity.py run (1 and 1,000 partitions, 100- and 10-record batches)",
    )
    p.add_argument("--kcat-records", type=int, default=2_000_000, help="100 B records per kcat run")
    p.add_argument("--e2e-seconds", type=float, default=5.0)
    p.add_argument("--native-messages", type=int, default=20_000)
    p.add_argument("--native-delayed", type=int, default=10_000)
    p.add_argument("--no-native", action="store_true")
    p.add_argument("--storage", default="file", choices=("file", "memory", "rocksdb"))
    p.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.records, args.records_1k, args.partition_records, args.capacity_records = 100_000, 20_000, 50_000, 50_000
        args.kcat_records = 200_000
        args.e2e_seconds, args.native_messages, args.native_delayed = 2.0, 2_000, 1_000

    results: dict[str, Any] = {}
    with perfutil.Broker(args.storage) as broker:
        print(f"broker pid {broker.process.proc.pid}, {args.storage} store in {broker.data_dir}", flush=True)
        # Warm-up, not reported: the first records pay for the first CommitLog segment, imports and caches.
        warm = f"suite-warmup-{uuid.uuid4().hex[:6]}"
        producer_perf.run(
            broker.bootstrap,
            warm,
            min(args.records, 100_000),
            100,
            producer_props={"acks": "1"},
            sample_every=1000,
            quiet=True,
        )
        results["acks1"] = _produce(broker, "100B-acks1", args.records, 100, "1")
        results["acksall"] = _produce(broker, "100B-acksall", args.records, 100, "all")
        # most producers compress: the broker decompresses each batch once, to check its records
        results["lz4"] = _produce(broker, "100B-acks1-lz4", args.records, 100, "1", props={"compression.type": "lz4"})

        data_dir = str(broker.data_dir)
        # 1 KiB ingest against dd of the same bytes, in alternating pairs (dd files kept, like the broker's data):
        # both then write into page cache in the same state of the host, which swings the figures tenfold
        kept: list[str] = []
        try:
            results["1k_pairs"] = _dd_pairs(
                data_dir,
                args.records_1k * 1024,
                kept,
                lambda: _produce(broker, "1KiB-acks1", args.records_1k, 1024, "1", sample_every=10),
            )
            print(
                "\n== broker ingest of 1 KiB records from pre-built 1 MB batches (produce_capacity.py), against dd",
                flush=True,
            )

            def capacity_1k() -> dict[str, Any]:
                _quiet(broker)
                r = produce_capacity.run(broker, 1, args.records_1k * 5, 1024, 1000, 1, 5)
                print(produce_capacity.line(r, 1, 1000, r), flush=True)
                return r

            results["1k_cap_pairs"] = _dd_pairs(data_dir, args.records_1k * 5 * 1024, kept, capacity_1k)
        finally:
            for path in kept:
                os.unlink(path)
        # for reference: the usual dd that deletes and rewrites its file (re-using the pages it just freed), and
        # dd with fdatasync; medians of 3
        results["dd_reused_mb_s"] = statistics.median(_dd(data_dir, args.records_1k * 1024) for _ in range(3))
        results["dd_sync_mb_s"] = statistics.median(
            _dd(data_dir, args.records_1k * 1024, fdatasync=True) for _ in range(3)
        )
        print(
            f"dd buffered write of {args.records_1k * 1024 / 1048576:.0f} MiB (medians of 3): "
            f"{results['dd_reused_mb_s']:.1f} MB/sec rewriting a deleted file's pages; with fdatasync: "
            f"{results['dd_sync_mb_s']:.1f} MB/sec",
            flush=True,
        )

        print(f"\n== consume {args.records} x 100 B", flush=True)
        broker.settle()
        cpu0 = broker.cpu_seconds()
        results["consume"] = consumer_perf.run(broker.bootstrap, results["acks1"]["topic"], args.records)
        results["consume"]["cpu_s"] = broker.cpu_seconds() - cpu0
        print(f"broker cpu: {results['consume']['cpu_s']:.2f} s", flush=True)
        cpu0 = broker.cpu_seconds()
        raw = results["consume_raw"] = consumer_perf.run_raw(broker.bootstrap, results["acks1"]["topic"], args.records)
        print(consumer_perf.raw_line(raw, broker.cpu_seconds() - cpu0), flush=True)
        results["kcat"] = _kcat(broker, args.kcat_records)

        rate = max(100.0, results["acks1"]["records_per_s"] / 2)
        _quiet(broker)
        print(f"\n== end-to-end latency at half the acks=1 ingest rate ({rate:.0f} records/s)", flush=True)
        e2e_topic = f"suite-e2e-{uuid.uuid4().hex[:6]}"
        perfutil.create_topic(broker.bootstrap, e2e_topic, 1)
        # linger.ms=1: batching like the ingest runs (which used 5) costs at most 1 ms of the budget.
        results["e2e"] = e2e_latency.run(
            broker.bootstrap, e2e_topic, rate, args.e2e_seconds, 100, producer_props={"linger.ms": "1"}
        )
        # The pipeline's own maximum: producer, consumer and broker together on this machine's cores, unpaced.
        probe = e2e_latency.run(
            broker.bootstrap,
            e2e_topic,
            float("inf"),
            0,
            100,
            producer_props={"linger.ms": "1"},
            quiet=True,
            records=int(rate * args.e2e_seconds),
        )
        results["e2e_max_rate"] = top = min(probe["rate"], probe["received_rate"])
        half = top / 2
        _quiet(broker)
        print(
            f"== end-to-end maximum (unpaced, consumer reading along): {top:.0f} records/s; "
            f"latency at half of it ({half:.0f} records/s)",
            flush=True,
        )
        # three runs: one run's p99 is its worst 1% of records, which a few milliseconds of a shared machine not
        # scheduling a process decide; the summary gives all three and judges the median run
        results["e2e_half_max"] = _three(
            lambda: e2e_latency.run(
                broker.bootstrap, e2e_topic, half, args.e2e_seconds, 100, producer_props={"linger.ms": "1"}
            ),
            broker,
        )
        _quiet(broker)
        print("== end-to-end latency at 1,000 records/s (the broker's floor, machine not saturated)", flush=True)
        results["e2e_low"] = e2e_latency.run(broker.bootstrap, e2e_topic, 1000, args.e2e_seconds, 100)
        # The broker's own share: wire-level producer and consumer, whose per-record cost is next to nothing.
        raw_topics = [f"suite-e2e-raw-{uuid.uuid4().hex[:6]}" for _ in range(4)]
        for t in raw_topics:
            perfutil.create_topic(broker.bootstrap, t, 1)
        probe = e2e_latency.run_raw(broker.bootstrap, raw_topics[0], float("inf"), 3.0, 100, quiet=True)
        results["e2e_raw_max_rate"] = top = min(probe["rate"], probe["received_rate"])
        _quiet(broker)
        print(
            f"== end-to-end, wire-level producer and consumer: maximum {top:.0f} records/s (1,000-record batches, "
            f"unpaced); latency at half of it, one batch a millisecond",
            flush=True,
        )
        # (the wire-level consumer reads its topic from offset 0: a fresh topic per run)
        results["e2e_raw"] = _three(
            lambda: e2e_latency.run_raw(broker.bootstrap, raw_topics.pop(), top / 2, args.e2e_seconds, 100), broker
        )

        results["p1000_first"] = _produce(broker, "partitions-1000", args.partition_records, 100, "1", partitions=1000)
        # three alternating pairs into 1 partition and into the now existing 1,000 (identical runs differ by
        # tens of percent on a shared machine): the summary gives every pair's ratio and the median pair
        many_topic = results["p1000_first"]["topic"]
        results["p_pairs"] = _pairs(broker, args.partition_records, many_topic, "again")
        # kafka-producer-perf-test's way: keyless records, placed by the client's partitioner (librdkafka's
        # sticky one fills one partition's batch at a time), into the same 1,000 partitions
        results["p_pairs_client"] = _pairs(broker, args.partition_records, many_topic, "partitioner", spread="client")
        # the same pairs with a core each for the client and the broker: which of the two is the limit
        results["p_pairs_pinned"] = _pairs(broker, args.partition_records, many_topic, "pinned", pin=True)

        print("\n== broker ingest capacity, 1 vs 1,000 partitions, same batches (produce_capacity.py)", flush=True)
        # PAIRS alternating 1 / 1,000 pairs: identical runs differ by tens of percent on a shared machine, so the
        # summary reports the median pair ratio (and the runs with the median rates)
        capacity = results["capacity"] = {}
        for batch_records in (100, 10):
            runs: dict[int, list] = {1: [], 1000: []}
            for _ in range(PAIRS):
                for n in (1, 1000):
                    r = produce_capacity.run(broker, n, args.capacity_records, 100, batch_records, 100, 5)
                    runs[n].append(r)
                    print(produce_capacity.line(r, n, batch_records, runs[1][-1]), flush=True)
            for n, rs in runs.items():
                capacity[(batch_records, n)] = sorted(rs, key=lambda r: r["records_per_s"])[len(rs) // 2]
            capacity[(batch_records, "ratios")] = [
                many["records_per_s"] / one["records_per_s"] for one, many in zip(runs[1], runs[1000])
            ]
            # the broker's own capacity (records per CPU second) into 1,000 against 1 partition: what the broker
            # does per record, without the client and the neighbours that share the two cores with it
            # (a run too short for one CPU clock tick reads 0 s: its capacity is unmeasured, not infinite)
            capacity[(batch_records, "cpu_ratios")] = [
                one["cpu_s_per_million"] / many["cpu_s_per_million"] if many["cpu_s_per_million"] else float("nan")
                for one, many in zip(runs[1], runs[1000])
            ]

        if not args.no_native:
            print("\n== native (remoting) path", flush=True)
            results["native"] = asyncio.run(
                native_perf.run(
                    broker.namesrv, args.native_messages, 100, 64, 4, 16, args.native_delayed, 10.0, broker.cpu_seconds
                )
            )

    a1, aa = results["acks1"], results["acksall"]
    k1_ratios, k1_dd, k1, ratio_dd = _median_dd_pair(results["1k_pairs"])
    cons, raw, e2e = results["consume"], results["consume_raw"], results["e2e"]
    p_ratios, p1, p1000, ratio_p = _median_pair(results["p_pairs"])
    us_per_record = a1["cpu_s_per_million"]  # s per million == us per record
    print("\n== summary (issue goals in brackets)")
    print(
        f"ingest 100 B acks=1   : {a1['records_per_s']:,.0f} records/s, {a1['mb_per_s']:.1f} MB/s, broker "
        f"{a1['cpu_s_per_million']:.2f} s CPU per million records [>= 1.5 M/s, or <= 0.5 us CPU per record: "
        f"{'met' if a1['records_per_s'] >= 1.5e6 or us_per_record <= 0.5 else 'NOT met'}]"
    )
    print(
        f"ingest 100 B acks=all : {aa['records_per_s']:,.0f} records/s, {aa['mb_per_s']:.1f} MB/s, broker "
        f"{aa['cpu_s_per_million']:.2f} s CPU per million records"
    )
    lz = results["lz4"]
    print(
        f"ingest 100 B lz4      : {lz['records_per_s']:,.0f} records/s, {lz['mb_per_s']:.1f} MB/s, broker "
        f"{lz['cpu_s_per_million']:.2f} s CPU per million records (acks=1, compression.type=lz4)"
    )
    # What one broker core could take if the client were not the limit: record size / broker CPU per record.
    k1_ceiling = 1024 / (k1["cpu_s_per_million"] / 1e6) / 1048576 if k1["cpu_s_per_million"] else float("inf")
    print(
        f"ingest 1 KiB          : {k1['mb_per_s']:.1f} MB/s vs dd {k1_dd:.1f} MB/s = {ratio_dd:.0%} (median of "
        f"{len(k1_ratios)} pairs: {_percents(k1_ratios)}) [>= 70%: {'met' if ratio_dd >= 0.7 else 'NOT met'}] "
        f"(dd rewriting freed pages {results['dd_reused_mb_s']:.1f} MB/s: "
        f"{k1['mb_per_s'] / results['dd_reused_mb_s']:.0%}); "
        f"broker {k1['cpu_s_per_million']:.2f} us CPU per record = {k1_ceiling:.0f} MB/s per broker core"
    )
    cap_ratios, cap_dd_mb_s, cap, cap_dd = _median_dd_pair(results["1k_cap_pairs"])
    print(
        f"ingest 1 KiB, broker  : {cap['mb_per_s']:.1f} MB/s from pre-built 1 MB batches (produce_capacity.py) vs "
        f"dd {cap_dd_mb_s:.1f} MB/s = {cap_dd:.0%} (median of {len(cap_ratios)} pairs: {_percents(cap_ratios)}) "
        f"[>= 70%: {'met' if cap_dd >= 0.7 else 'NOT met'}] (dd rewriting freed pages: "
        f"{cap['mb_per_s'] / results['dd_reused_mb_s']:.0%}; dd with fdatasync: "
        f"{cap['mb_per_s'] / results['dd_sync_mb_s']:.0%})"
    )
    print(
        f"consume 100 B         : {cons['messages_per_s']:,.0f} records/s ({cons['fetch_messages_per_s']:,.0f} "
        f"after the rebalance, confluent-kafka), broker {cons['cpu_s']:.2f} s CPU; wire-level consumer "
        f"{raw['messages_per_s']:,.0f} records/s [>= 2 M/s: confluent-kafka "
        f"{'met' if cons['fetch_messages_per_s'] >= 2e6 else 'NOT met'}, broker "
        f"{'met' if raw['messages_per_s'] >= 2e6 else 'NOT met'}]"
    )
    kp, kc = results["kcat"]["produce"], results["kcat"]["consume"]
    print(
        f"ingest 100 B, kcat    : {kp['records_per_s']:,.0f} records/s, {kp['mb_per_s']:.1f} MB/s (median of 3, "
        f"acks=1), broker {kp['broker_cpu_s'] / kp['records'] * 1e6:.2f} s CPU per million records, kcat "
        f"{kp['client_cpu_s'] / kp['records'] * 1e6:.2f} us CPU per record [>= 1.5 M/s: "
        f"{'met' if kp['records_per_s'] >= 1.5e6 else 'NOT met'}]"
    )
    print(
        f"consume 100 B, kcat   : {kc['records_per_s']:,.0f} records/s (median of 3), broker "
        f"{kc['broker_cpu_s'] / kc['records'] * 1e6:.2f} s CPU per million records, kcat "
        f"{kc['client_cpu_s'] / kc['records'] * 1e6:.2f} us CPU per record [>= 2 M/s: "
        f"{'met' if kc['records_per_s'] >= 2e6 else 'NOT met'}]"
    )
    # not a goal line: with a producer that alone ingests more than twice what producer, consumer and broker manage
    # together on these cores, half of it is no half load for the pipeline (the next line is)
    print(
        f"e2e at {e2e['rate']:,.0f} records/s  : p50 {e2e['p50_ms']:.2f} ms, p99 {e2e['p99_ms']:.2f} ms = half of "
        f"the producer-alone ingest, {e2e['rate'] / results['e2e_max_rate']:.0%} of the pipeline's maximum"
    )
    half = results["e2e_half_max"]
    print(
        f"e2e at {half['rate']:,.0f} records/s  : p50 {half['p50_ms']:.2f} ms, p99 {half['p99_ms']:.2f} ms (median "
        f"of 3 runs by p99: {_runs_note(half)}) = half of the pipeline's maximum ({results['e2e_max_rate']:,.0f} "
        f"records/s with producer, consumer and broker on these cores) [p99 <= 5 ms: "
        f"{'met' if half['p99_ms'] <= 5 else 'NOT met'}]"
    )
    low = results["e2e_low"]
    print(f"e2e at 1,000 records/s: p50 {low['p50_ms']:.2f} ms, p99 {low['p99_ms']:.2f} ms")
    raw_e2e = results["e2e_raw"]
    print(
        f"e2e, wire-level       : at {raw_e2e['rate']:,.0f} records/s p50 {raw_e2e['p50_ms']:.2f} ms, p99 "
        f"{raw_e2e['p99_ms']:.2f} ms (median of 3 runs by p99: {_runs_note(raw_e2e)}) = half of the wire-level "
        f"pipeline's maximum "
        f"({results['e2e_raw_max_rate']:,.0f} records/s) [p99 <= 5 ms: "
        f"{'met' if raw_e2e['p99_ms'] <= 5 else 'NOT met'}]"
    )
    first = results["p1000_first"]
    print(
        f"1,000 vs 1, round-robin: pair ratios {_percents(p_ratios)}, median pair "
        f"{p1000['records_per_s']:,.0f} vs {p1['records_per_s']:,.0f} records/s = {ratio_p:.0%} [>= 80%: "
        f"{'met' if ratio_p >= 0.8 else 'NOT met'}]; CPU per record 1,000 vs 1 partition: client "
        f"{p1000['client_cpu_s_per_million']:.2f} vs {p1['client_cpu_s_per_million']:.2f} us, broker "
        f"{p1000['cpu_s_per_million']:.2f} vs {p1['cpu_s_per_million']:.2f} us; first pass into the new "
        f"partitions {first['records_per_s']:,.0f} records/s, broker {first['cpu_s']:.1f} s CPU"
    )
    client_pairs = results["p_pairs_client"]
    c_ratios, c1, c1000, ratio_c = _median_pair(client_pairs)
    print(
        f"1,000 vs 1, partitioner: pair ratios {_percents(c_ratios)}, median pair "
        f"{c1000['records_per_s']:,.0f} vs {c1['records_per_s']:,.0f} records/s = {ratio_c:.0%} [>= 80%: "
        f"{'met' if ratio_c >= 0.8 else 'NOT met'}]; keyless records placed by librdkafka's sticky partitioner, "
        f"as kafka-producer-perf-test's are; the runs wrote to "
        f"{', '.join(str(many['partitions_written']) for _one, many in client_pairs)} of the 1,000 partitions; "
        f"broker {c1000['cpu_s_per_million']:.2f} vs {c1['cpu_s_per_million']:.2f} us CPU per record"
    )
    pinned_pairs = results["p_pairs_pinned"]
    if "client_core_busy" in pinned_pairs[0][0]:

        def busy(key: str) -> str:
            return ", ".join(f"{one[key]:.0%} / {many[key]:.0%}" for one, many in pinned_pairs)

        print(
            "1,000 vs 1, a core each: pair ratios "
            + ", ".join(f"{many['records_per_s'] / one['records_per_s']:.0%}" for one, many in pinned_pairs)
            + f"; client core busy (1 / 1,000 partitions) {busy('client_core_busy')}; broker core busy "
            + f"{busy('broker_core_busy')} (a client core at 100% while the broker's is not: the client is the "
            + "limit)"
        )
    for batch_records in (100, 10):
        one, many = results["capacity"][(batch_records, 1)], results["capacity"][(batch_records, 1000)]
        ratios = results["capacity"][(batch_records, "ratios")]
        cpu_ratios = results["capacity"][(batch_records, "cpu_ratios")]
        cpu_ratio = statistics.median(cpu_ratios)
        print(
            f"broker, {batch_records:3d}-record batches: {many['records_per_s']:,.0f} vs {one['records_per_s']:,.0f} "
            f"records/s into 1,000 vs 1 partition (medians of {len(ratios)}), pair ratios "
            f"{_percents(ratios)} (median {statistics.median(ratios):.0%}); broker "
            f"{many['cpu_s_per_million']:.2f} vs {one['cpu_s_per_million']:.2f} us CPU per record, capacity "
            f"(records per CPU second) pair ratios {_percents(cpu_ratios)}, median "
            f"{cpu_ratio:.0%} [>= 80%: {'met' if cpu_ratio >= 0.8 else 'NOT met'}]"
        )
    if "native" in results:
        n = results["native"]
        print(
            f"native send-1 / batch / pull: {n['send1']['count'] / n['send1']['elapsed']:,.0f} / "
            f"{n['batch']['count'] / n['batch']['elapsed']:,.0f} / {n['pull']['count'] / n['pull']['elapsed']:,.0f}"
            f" records/s"
            + (
                f"; delayed {n['delayed']['delivered']}/{n['delayed']['count']} delivered, lateness "
                f"p99 {n['delayed']['p99']:.0f} ms"
                if "delayed" in n
                else ""
            )
        )
    print(
        f"(run finished {time.strftime('%Y-%m-%d %H:%M:%S')}; clients and broker share this machine's "
        f"{len(os.sched_getaffinity(0))} CPUs)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
