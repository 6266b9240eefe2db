"""Throughput over the RocketMQ remoting protocol with mqk's own client (`mqk.client`), and the timer's injection
of many delayed messages due at the same second:

    python bench/native_perf.py --start-broker --messages 50000 --batch 64 --delayed 10000

Four measurements, each printed as one line:
- `send-1`: one message per SEND_MESSAGE_V2, `--concurrency` requests in flight; records/s, MB/s, p50/p99 ms.
- `send-batch`: SEND_BATCH_MESSAGE of `--batch` messages each; records/s, MB/s.
- `pull`: PULL_MESSAGE of everything just sent, all queues in parallel; records/s, MB/s.
- `delayed`: `--delayed` messages with `__STARTDELIVERTIME` all at one second a few seconds ahead, consumed by
  long-polling pulls; all delivered?, none early?, lateness p50/p99/max against the due time (receipt time on
  this host, which shares the broker's clock).
With `--start-broker` the broker's CPU seconds per phase are printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from typing import Any

import perfutil


def _line(name: str, count: int, elapsed: float, size: int, extra: str = "") -> str:
    rate = count / max(elapsed, 1e-9)
    return (
        f"{name}: {count} records in {elapsed:.2f} s, {rate:.1f} records/sec "
        f"({rate * size / 1048576:.2f} MB/sec){extra}"
    )


async def _send_single(namesrv: str, topic: str, count: int, size: int, concurrency: int) -> dict[str, Any]:
    from mqk.client import Producer

    body = b"n" * size
    latencies: list[float] = []
    next_index = iter(range(count))
    async with Producer(namesrv, group="perf-producer") as producer:
        await producer.send(topic, body)  # route lookup and connection outside the timing

        async def worker() -> None:
            for _ in next_index:
                t0 = time.perf_counter()
                await producer.send(topic, body, tags="perf")
                latencies.append((time.perf_counter() - t0) * 1000)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "count": count + 1,
        "elapsed": elapsed,
        "p50": perfutil.percentile(latencies, 50),
        "p99": perfutil.percentile(latencies, 99),
    }


async def _send_batches(
    namesrv: str, topic: str, count: int, size: int, batch: int, concurrency: int
) -> dict[str, Any]:
    from mqk.client import Message, Producer

    body = b"b" * size
    sizes = [batch] * (count // batch) + ([count % batch] if count % batch else [])
    todo = iter(sizes)
    async with Producer(namesrv, group="perf-producer") as producer:
        await producer.send_batch([Message(topic, body)])

        async def worker() -> None:
            for n in todo:
                await producer.send_batch([Message(topic, body, tags="perf") for _ in range(n)])

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {"count": count + 1, "elapsed": elapsed}


async def _pull_all(namesrv: str, topic: str, expected: int, max_nums: int) -> dict[str, Any]:
    from mqk.client import PullConsumer

    async with PullConsumer(namesrv, group=f"perf-pull-{uuid.uuid4().hex[:6]}") as consumer:
        queues = await consumer.queues(topic)
        totals = [0]
        nbytes = [0]

        async def drain(mq: Any) -> None:
            offset = 0
            end = await consumer.max_offset(mq)
            while offset < end:
                r = await consumer.pull(mq, offset, max_nums=max_nums)
                if not r.messages and r.next_offset <= offset:
                    break
                totals[0] += len(r.messages)
                nbytes[0] += sum(len(m.body) for m in r.messages)
                offset = r.next_offset

        start = time.perf_counter()
        await asyncio.gather(*(drain(mq) for mq in queues))
        elapsed = time.perf_counter() - start
    return {"count": totals[0], "elapsed": elapsed, "bytes": nbytes[0], "expected": expected}


async def _delayed(namesrv: str, topic: str, count: int, lead_s: float, concurrency: int) -> dict[str, Any]:
    from mqk.client import Message, Producer, PullConsumer

    due_ms = (int(time.time()) + int(lead_s)) * 1000  # a whole second, like "all due at 12:00:05"
    pending = iter(range(count))
    sent_done = 0.0
    async with Producer(namesrv, group="perf-delay-producer") as producer:

        async def sender() -> None:
            for i in pending:
                await producer.send(Message(topic, str(i).encode(), tags="delayed", deliver_at_ms=due_ms))

        t0 = time.time()
        await asyncio.gather(*(sender() for _ in range(concurrency)))
        sent_done = time.time()
    if sent_done * 1000 >= due_ms:
        raise SystemExit(
            f"sending {count} delayed messages took {sent_done - t0:.1f} s, past the due time; raise --delay-lead"
        )

    seen: dict[int, float] = {}
    early = duplicates = 0
    async with PullConsumer(namesrv, group=f"perf-delay-{uuid.uuid4().hex[:6]}") as consumer:
        queues = await consumer.queues(topic)
        deadline = due_ms / 1000 + 60

        async def drain(mq: Any) -> None:
            nonlocal early, duplicates
            offset = await consumer.max_offset(mq)  # only what the timer injects from now on
            while len(seen) < count and time.time() < deadline:
                r = await consumer.pull(mq, offset, max_nums=256, suspend_ms=1000)
                now = time.time() * 1000
                for m in r.messages:
                    duplicates += int(m.body) in seen
                    seen[int(m.body)] = now
                    if now < due_ms:
                        early += 1
                offset = max(offset, r.next_offset)

        await asyncio.gather(*(drain(mq) for mq in queues))
    lateness = sorted(t - due_ms for t in seen.values())
    return {
        "count": count,
        "delivered": len(seen),
        "early": early,
        "duplicates": duplicates,
        "send_s": sent_done - t0,
        "p50": perfutil.percentile(lateness, 50),
        "p99": perfutil.percentile(lateness, 99),
        "max": lateness[-1] if lateness else float("nan"),
    }


async def run(
    namesrv: str,
    messages: int,
    size: int,
    batch: int,
    queues: int,
    concurrency: int,
    delayed: int,
    delay_lead_s: float,
    cpu: Any = None,
) -> dict[str, Any]:
    from mqk.client import Admin

    topic = f"native-perf-{uuid.uuid4().hex[:6]}"
    delayed_topic = topic + "-delayed"
    async with Admin(namesrv) as admin:
        await admin.create_topic(topic, queues)
        await admin.create_topic(delayed_topic, queues)

    def cpu_note(c0: float | None) -> str:
        return f", broker cpu {cpu() - c0:.2f} s" if cpu is not None and c0 is not None else ""

    out: dict[str, Any] = {}
    c0 = cpu() if cpu else None
    r = await _send_single(namesrv, topic, messages, size, concurrency)
    print(
        _line(
            "send-1",
            r["count"] - 1,
            r["elapsed"],
            size,
            f", p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms (concurrency {concurrency}){cpu_note(c0)}",
        ),
        flush=True,
    )
    out["send1"] = r
    c0 = cpu() if cpu else None
    r = await _send_batches(namesrv, topic, messages, size, batch, concurrency)
    print(_line("send-batch", r["count"] - 1, r["elapsed"], size, f" (batches of {batch}){cpu_note(c0)}"), flush=True)
    out["batch"] = r
    expected = out["send1"]["count"] + out["batch"]["count"]
    c0 = cpu() if cpu else None
    r = await _pull_all(namesrv, topic, expected, 32)
    print(
        _line("pull", r["count"], r["elapsed"], size, f" (expected {expected}, maxMsgNums 32){cpu_note(c0)}"),
        flush=True,
    )
    out["pull"] = r
    if delayed:
        r = await _delayed(namesrv, delayed_topic, delayed, delay_lead_s, concurrency)
        print(
            f"delayed: {r['delivered']} of {r['count']} delivered, {r['early']} early, {r['duplicates']} "
            f"duplicates; lateness p50 "
            f"{r['p50']:.0f} ms, p99 {r['p99']:.0f} ms, max {r['max']:.0f} ms (sent in {r['send_s']:.1f} s)",
            flush=True,
        )
        out["delayed"] = r
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--namesrv", help="name server host:port of a running broker")
    p.add_argument("--start-broker", action="store_true")
    p.add_argument("--storage", default="file", choices=("file", "memory", "rocksdb"))
    p.add_argument("--data-dir")
    p.add_argument("--messages", type=int, default=20000, help="messages per send phase")
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    p.add_argument("--delayed", type=int, default=10000, help="delayed messages due at one second (0: skip)")
    p.add_argument("--delay-lead", type=float, default=10.0, help="seconds from now to the due time")
    args = p.parse_args(argv)
    broker = perfutil.Broker(args.storage, args.data_dir) if args.start_broker else None
    try:
        namesrv = broker.namesrv if broker else args.namesrv
        if not namesrv:
            p.error("give --namesrv or --start-broker")
        out = asyncio.run(
            run(
                namesrv,
                args.messages,
                args.record_size,
                args.batch,
                args.queues,
                args.concurrency,
                args.delayed,
                args.delay_lead,
                broker.cpu_seconds if broker else None,
            )
        )
    finally:
        if broker:
            broker.close()
    ok = out["pull"]["count"] == out["pull"]["expected"]
    if "delayed" in out:
        d = out["delayed"]
        ok = ok and d["delivered"] == args.delayed and d["early"] == 0 and d["duplicates"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
