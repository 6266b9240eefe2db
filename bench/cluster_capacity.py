"""Cluster mode on one machine: the ingest capacity of N broker processes against one, and how fast metadata spreads.

    python bench/cluster_capacity.py                      # 2 brokers vs 1, then metadata over 3 brokers
    python bench/cluster_capacity.py --brokers 2 --rounds 3 --records 4000000

1. Capacity (as bench/produce_capacity.py: pre-built Produce requests, no client library's per-record cost). A
   standalone broker (no cluster) takes `--records` 100 B records in 100-record batches into a `--partitions`
   topic; then a cluster of `--brokers` processes (etcd on loopback, `mqk.cluster_local.LocalCluster`) takes the
   same, the topic's partitions spread over the brokers by the controller and each broker sent the requests for
   the partitions it leads, all from one client thread (`--in-flight` requests outstanding per broker; frames go
   to the kernel as built, several per `sendmsg`, and answers are taken from a receive buffer several at a time,
   so the client's share of the cores is little more than the kernel's work of sending). Rounds alternate single
   and cluster. Each line is a producer-perf-test line with every broker's CPU per million records and the
   client's; the summary gives the ratio of the cluster's records/s to the single broker's (goal: at least 1.6
   with 2 brokers on a 2-core machine) and what this machine allows it to be. The brokers and the client share
   the cores, so the cluster can take at most cores / (its brokers' CPU per record + the client's) records/s;
   that over the single broker's rate is the round's bound, printed beside its ratio with how busy the cluster
   kept the cores. The standalone broker has a core to itself (its client uses part of the other), so the more
   a broker does per core, the lower that bound: the ratio measures the machine as much as the brokers.
2. Metadata: CreateTopics of a `--metadata-partitions` topic sent to one broker of a 3-broker cluster, then every
   broker is asked for its Metadata until each shows every partition with a leader; the time from the request to
   the last broker's complete answer (goal: at most 2 s for 1,000 partitions).

Needs the `etcd` binary (Debian's etcd-server) and `mqk[cluster]`.
"""

from __future__ import annotations

import argparse
import collections
import os
import selectors
import socket
import statistics
import struct
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import perfutil
import produce_capacity

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mqk.cluster_local import LocalCluster
from mqk.protocol.kafka.api import ApiKey
from mqk.protocol.kafka.codec import decode_response_frame
from mqk.server.kafka.rawclient import make_batch

_SIZE = struct.Struct(">i")


def leaders(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> dict[int, list[int]]:
    """node id -> the partitions it leads (waits until every partition has a leader)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(topic, timeout=10)
        parts = md.topics[topic].partitions if topic in md.topics else {}
        if len(parts) == partitions and all(p.leader >= 0 for p in parts.values()):
            out: dict[int, list[int]] = {}
            for index, p in sorted(parts.items()):
                out.setdefault(p.leader, []).append(index)
            return out
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic}: not every partition has a leader after {timeout} s")
        time.sleep(0.05)  # (a benchmark polls the metadata it measures)


#: one answer in this many is decoded whole (its error codes counted); that the records all landed is checked by
#: the topic's end offsets instead, so the client's share of the two cores goes to sending
CHECK_EVERY = 16
#: received answers are parsed out of a buffer this large (a Produce answer is a few hundred bytes)
RECEIVE_BUFFER = 1 << 20


class _Link:
    """One broker's connection in `produce_all`: the requests it sends in turn, `in_flight` outstanding, and what
    came back. A broker answers a connection's requests in the order they were sent (Kafka's rule), so the answer
    at the head of the input is the one for the oldest request sent: a queue of send times gives each latency."""

    def __init__(self, bootstrap: str, requests: list[bytearray], per_request: int, records: int) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.requests = [memoryview(bytes(r)) for r in requests]
        self.correlation_ids = [_SIZE.unpack_from(r, 8)[0] for r in requests]
        self.n_requests = max(1, records // per_request)
        self.per_request = per_request
        self.sent = self.answered = self.errors = 0
        self.sent_at: collections.deque[tuple[int, float]] = collections.deque()
        self.unsent: list[memoryview] = []
        self.inbox = bytearray(RECEIVE_BUFFER)
        self.filled = 0
        self.latencies: list[float] = []

    def queue(self, count: int, now: float) -> None:
        for _ in range(min(count, self.n_requests - self.sent)):
            index = self.sent % len(self.requests)
            self.unsent.append(self.requests[index])
            self.sent_at.append((self.correlation_ids[index], now))
            self.sent += 1

    def send(self) -> None:
        """Write what is queued, as much as the socket takes now, in one system call per at most 64 frames."""
        while self.unsent:
            try:
                written = self.sock.sendmsg(self.unsent[:64])
            except BlockingIOError:
                return
            while written:
                head = self.unsent[0]
                if written >= len(head):
                    written -= len(head)
                    del self.unsent[0]
                else:
                    self.unsent[0] = head[written:]
                    written = 0

    def receive(self) -> int:
        """Read what arrived and account for every whole answer in it; returns how many were whole."""
        view = memoryview(self.inbox)
        try:
            got = self.sock.recv_into(view[self.filled :])
        except BlockingIOError:
            return 0
        if not got:
            raise ConnectionError("the broker closed the connection")
        self.filled += got
        now = time.perf_counter()
        done = pos = 0
        while self.filled - pos >= 4:
            (size,) = _SIZE.unpack_from(self.inbox, pos)
            if self.filled - pos - 4 < size:
                if size + 4 > len(self.inbox):
                    raise ValueError(f"a {size} B answer does not fit the receive buffer")
                break
            expected, sent_at = self.sent_at.popleft()
            (cid,) = _SIZE.unpack_from(self.inbox, pos + 4)
            if cid != expected:
                raise ValueError(f"answer for correlation id {cid} where {expected} was due")
            if self.answered % CHECK_EVERY == 0:
                _, body = decode_response_frame(
                    ApiKey.PRODUCE, produce_capacity.PRODUCE_VERSION, bytes(view[pos + 4 : pos + 4 + size])
                )
                self.errors += sum(1 for t in body["responses"] for p in t["partition_responses"] if p["error_code"])
            self.latencies.append((now - sent_at) * 1000)
            self.answered += 1
            done += 1
            pos += 4 + size
        if pos:
            self.inbox[: self.filled - pos] = self.inbox[pos : self.filled]
            self.filled -= pos
        return done


def produce_all(targets: list[tuple[str, list[bytearray], int, int]], in_flight: int) -> list[dict[str, Any]]:
    """Send each (bootstrap, requests, records per request, records) target its requests, `in_flight` outstanding
    per broker, from this one thread. The requests are sent as built (no per-request encoding, no copy: each frame
    goes to the kernel from where it lies, several in one `sendmsg`), and answers are taken from a receive buffer
    several at a time, so the client, which shares the machine's cores with the brokers, costs little per request:
    what is measured is the brokers."""
    links = [_Link(*target) for target in targets]
    selector = selectors.DefaultSelector()
    start = time.perf_counter()
    try:
        for link in links:
            link.queue(in_flight, time.perf_counter())
            link.send()
            selector.register(link.sock, selectors.EVENT_READ, link)
        busy = len(links)
        while busy:
            for key, _events in selector.select():
                link = key.data
                if key.events & selectors.EVENT_WRITE:
                    link.send()
                if key.events & selectors.EVENT_READ:
                    done = link.receive()
                    if done:
                        link.queue(done, time.perf_counter())
                        link.send()
                    if link.answered >= link.n_requests:
                        selector.unregister(link.sock)
                        busy -= 1
                        continue
                wanted = selectors.EVENT_READ | (selectors.EVENT_WRITE if link.unsent else 0)
                if wanted != key.events:
                    selector.modify(link.sock, wanted, link)
    finally:
        selector.close()
        for link in links:
            link.sock.close()
    elapsed = time.perf_counter() - start
    out = []
    for link in links:
        lat = sorted(link.latencies)
        records = link.n_requests * link.per_request
        out.append(
            {
                "records": records,
                "elapsed": elapsed,
                "records_per_s": records / elapsed,
                "errors": link.errors,
                "avg_ms": sum(lat) / len(lat),
                "p50_ms": perfutil.percentile(lat, 50),
                "p99_ms": perfutil.percentile(lat, 99),
                "max_ms": lat[-1],
            }
        )
    return out


def end_offsets_sum(bootstrap: str, topic: str, partitions: int) -> int:
    """The sum of the topic's partitions' high watermarks (each asked of its leader)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"capacity-check-{uuid.uuid4().hex[:6]}"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions))
    finally:
        consumer.close()


def requests_for(topic: str, mine: list[int], batch: bytes, per_request: int) -> list[bytearray]:
    """Requests carrying one batch for each of `per_request` of the partitions `mine`, in turn (each its own
    correlation id: its index)."""
    from mqk.protocol.kafka.api import ApiKey
    from mqk.protocol.kafka.codec import encode_request

    out = []
    for r in range(max(1, len(mine) // per_request)):
        chosen = [mine[(r * per_request + i) % len(mine)] for i in range(min(per_request, len(mine)))]
        body = {
            "transactional_id": None,
            "acks": 1,
            "timeout_ms": 30000,
            "topic_data": [{"name": topic, "partition_data": [{"index": i, "records": batch} for i in chosen]}],
        }
        out.append(
            bytearray(b"".join(encode_request(ApiKey.PRODUCE, produce_capacity.PRODUCE_VERSION, r, "capacity", body)))
        )
    return out


def measure(
    bootstraps: dict[int, str],
    pids: dict[int, int],
    topic: str,
    partitions: int,
    records: int,
    batch_records: int,
    per_request: int,
    in_flight: int,
) -> dict[str, Any]:
    """One measured pass over the brokers in `bootstraps` (node id -> its own address)."""
    any_bootstrap = ",".join(bootstraps.values())
    led = leaders(any_bootstrap, topic, partitions)
    batch = bytes(make_batch([b"v" * 100] * batch_records))
    share = records // len(bootstraps)
    targets = []
    for node, address in bootstraps.items():
        mine = led.get(node, [])
        if not mine:
            raise RuntimeError(f"broker {node} leads no partition of {topic}: {led}")
        reqs = requests_for(topic, mine, batch, per_request)
        per = batch_records * min(per_request, len(mine))
        targets.append((address, reqs, per, share))
    before = end_offsets_sum(any_bootstrap, topic, partitions)
    # a first pass creates every partition's files; the measured pass appends to existing queues
    warm = [(a, r, p, p * len(r)) for a, r, p, _s in targets]
    produce_all(warm, in_flight)
    # no dirty pages at the start (untimed): the pass before wrote as many bytes, and the kernel writing them back
    # would take CPU from this pass, which for the cluster means from the brokers (the standalone broker's pass has
    # a core mostly idle to absorb it), so without this the order of the passes would bias the ratio
    os.sync()
    for pid in pids.values():
        _settle(pid)
    cpu0 = {n: perfutil.proc_cpu_seconds(pid) for n, pid in pids.items()}
    client0 = time.process_time()
    wall0 = time.perf_counter()
    results = produce_all(targets, in_flight)
    wall = time.perf_counter() - wall0
    client = time.process_time() - client0
    cpu = {n: perfutil.proc_cpu_seconds(pid) - cpu0[n] for n, pid in pids.items()}
    total = sum(r["records"] for r in results)
    latencies = sorted(r["p99_ms"] for r in results)
    landed = end_offsets_sum(any_bootstrap, topic, partitions) - before
    missing = sum(t[3] for t in warm) + total - landed
    return {
        "records": total,
        "elapsed": wall,
        "records_per_s": total / wall,
        "errors": sum(r["errors"] for r in results) + abs(missing),
        "avg_ms": statistics.mean(r["avg_ms"] for r in results),
        "max_ms": max(r["max_ms"] for r in results),
        "p50_ms": statistics.mean(r["p50_ms"] for r in results),
        "p99_ms": latencies[-1],
        "broker_cpu_s": cpu,
        "client_cpu_s": client,
    }


def _settle(pid: int, quiet_s: float = 0.5, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        c0 = perfutil.proc_cpu_seconds(pid)
        time.sleep(quiet_s)
        if perfutil.proc_cpu_seconds(pid) - c0 < 0.02:
            return


def line(name: str, r: dict[str, Any]) -> str:
    cpu = ", ".join(
        f"node {n}: {c / r['records'] * 1e6 * len(r['broker_cpu_s']):.2f}" for n, c in sorted(r["broker_cpu_s"].items())
    )
    busy = sum(r["broker_cpu_s"].values()) / r["elapsed"]
    return (
        f"{r['records']} records sent, {r['records_per_s']:.1f} records/sec ({r['records_per_s'] * 100 / 1048576:.2f}"
        f" MB/sec), {r['avg_ms']:.2f} ms avg latency, {r['max_ms']:.2f} ms max latency, {r['p50_ms']:.0f} ms "
        f"50th, {r['p99_ms']:.0f} ms 99th.   [{name}; broker cpu s per million records each took {cpu}; brokers "
        f"busy {busy:.2f} cores, client {r['client_cpu_s'] / r['elapsed']:.2f} cores; errors and records missing "
        f"{r['errors']}]"
    )


def capacity(args: argparse.Namespace) -> tuple[float, float]:
    """The medians of the rounds' ratios (cluster over single) and of their bounds on this machine."""
    ratios, bounds = [], []
    cores = len(os.sched_getaffinity(0))
    batch_records, per_request = 100, args.batches_per_request
    with tempfile.TemporaryDirectory(prefix="mqk-bench-cluster-") as tmp:
        single = perfutil.Broker("file", str(Path(tmp) / "single"))
        cluster = LocalCluster(Path(tmp) / "cluster", args.brokers).start()
        try:
            topic = f"capacity-{uuid.uuid4().hex[:6]}"
            perfutil.create_topic(single.bootstrap, topic, args.partitions)
            perfutil.create_topic(cluster.bootstrap, topic, args.partitions)
            nodes = {b.node_id: b.bootstrap for b in cluster.brokers}
            for round_ in range(args.rounds):
                one = measure(
                    {0: single.bootstrap},
                    {0: single.process.proc.pid},
                    topic,
                    args.partitions,
                    args.records,
                    batch_records,
                    per_request,
                    args.in_flight,
                )
                print(line(f"round {round_ + 1}: 1 standalone broker", one), flush=True)
                many = measure(
                    nodes,
                    cluster.pids,
                    topic,
                    args.partitions,
                    args.records,
                    batch_records,
                    per_request,
                    args.in_flight,
                )
                print(line(f"round {round_ + 1}: {args.brokers} brokers in a cluster", many), flush=True)
                ratios.append(many["records_per_s"] / one["records_per_s"])
                cpu_s = sum(many["broker_cpu_s"].values()) + many["client_cpu_s"]
                bounds.append(cores * many["records"] / cpu_s / one["records_per_s"])
                print(
                    f"    ratio {ratios[-1]:.2f}x; bound on this machine {bounds[-1]:.2f}x ({cores} cores / the "
                    f"cluster's brokers' and client's CPU per record); the cluster kept "
                    f"{cpu_s / many['elapsed'] / cores:.0%} of the cores busy",
                    flush=True,
                )
        finally:
            cluster.stop()
            single.close()
    return statistics.median(ratios), statistics.median(bounds)


def metadata(args: argparse.Namespace) -> float:
    from confluent_kafka.admin import AdminClient, NewTopic

    with tempfile.TemporaryDirectory(prefix="mqk-bench-meta-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", 3).start()
        try:
            topic = f"meta-{uuid.uuid4().hex[:6]}"
            n = args.metadata_partitions
            admins = {b.node_id: AdminClient({"bootstrap.servers": b.bootstrap}) for b in cluster.brokers}
            for admin in admins.values():
                admin.list_topics(timeout=10)  # connections up before the clock starts
            start = time.perf_counter()
            admins[0].create_topics([NewTopic(topic, n)])[topic].result(60)
            created = time.perf_counter() - start
            done_at: dict[int, float] = {}
            while len(done_at) < len(admins):
                for node, admin in admins.items():
                    if node in done_at:
                        continue
                    md = admin.list_topics(topic, timeout=10)
                    parts = md.topics[topic].partitions if topic in md.topics else {}
                    if len(parts) == n and all(p.leader >= 0 for p in parts.values()):
                        done_at[node] = time.perf_counter() - start
                if time.perf_counter() - start > 60:
                    raise TimeoutError("metadata did not reach every broker within 60 s")
            spread = max(done_at.values())
            print(
                f"CreateTopics of {n} partitions answered in {created * 1000:.0f} ms; every broker's Metadata "
                f"showed it in {spread * 1000:.0f} ms (per broker: "
                + ", ".join(f"node {k}: {v * 1000:.0f} ms" for k, v in sorted(done_at.items()))
                + ")",
                flush=True,
            )
            return spread
        finally:
            cluster.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--brokers", type=int, default=2)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--records", type=int, default=4_000_000)
    p.add_argument("--batches-per-request", type=int, default=4)
    p.add_argument("--in-flight", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--metadata-partitions", type=int, default=1000)
    p.add_argument("--skip-capacity", action="store_true")
    args = p.parse_args(argv)
    print(f"== cluster capacity and metadata, {os.cpu_count()} CPUs", flush=True)
    ok = True
    if not args.skip_capacity:
        ratio, bound = capacity(args)
        print(
            f"SUMMARY capacity: {args.brokers} brokers / 1 broker = {ratio:.2f}x (median of {args.rounds} rounds; "
            f"goal >= 1.6x; this machine's bound {bound:.2f}x, the median of the rounds')",
            flush=True,
        )
    spread = metadata(args)
    print(
        f"SUMMARY metadata: {args.metadata_partitions} partitions on every broker in {spread * 1000:.0f} ms "
        f"(goal <= 2000 ms)",
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
