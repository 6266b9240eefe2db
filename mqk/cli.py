"""The `mqk` command line (also `python -m mqk`).

`mqk serve` runs a broker: the embedded default is a file store under ./mqk-data, Kafka on 127.0.0.1:9092,
RocketMQ remoting on 127.0.0.1:10911 and the name-server role on 127.0.0.1:9876. Port 0 in any listen flag picks a
free port; once every listener is bound the broker prints one line to stdout:
`mqk ready kafka=HOST:PORT native=HOST:PORT namesrv=HOST:PORT`, then, where the broker has them,
`replication=HOST:PORT` (cluster mode: where its group's replicas pull), `grpc=HOST:PORT` (the RocketMQ 5 gRPC
listener, `--grpc-listen`: 127.0.0.1:8081 by default where the `grpc` extra is installed, else off),
`admin=HOST:PORT` (the admin listener,
`--admin-listen`, default 127.0.0.1:9644) and last `kafka.NAME=HOST:PORT` for each named Kafka listener
(`--listener`; `kafka=` is the unnamed listener, or the first named one when `--kafka-listen off`). SIGTERM / SIGINT
flush, close files, remove the abort marker and exit 0; SIGUSR1 logs where every task of the broker's event loop
waits, and the broker serves on. `--log-format json` writes one JSON object per log line
(mqk.logfmt).

`mqk cluster local` runs a cluster on this machine (mqk.cluster_local): etcd and N `mqk serve --cluster` processes on
loopback, until SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import signal
import sys
import time
from typing import Any

from mqk import __version__
from mqk.config import BrokerConfig

log = logging.getLogger("mqk")


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run a broker")
    p.add_argument("--config", metavar="FILE.toml", help="TOML configuration file (flags override it)")
    p.add_argument("--data-dir", help="data directory (default ./mqk-data)")
    p.add_argument(
        "--kafka-listen", metavar="HOST:PORT", help="the unnamed PLAINTEXT Kafka listener (default 127.0.0.1:9092; off)"
    )
    p.add_argument("--native-listen", metavar="HOST:PORT", help="RocketMQ remoting listener (default 127.0.0.1:10911)")
    p.add_argument("--namesrv-listen", metavar="HOST:PORT", help="name-server listener (default 127.0.0.1:9876)")
    p.add_argument(
        "--replication-listen",
        metavar="HOST:PORT",
        help="cluster mode: where this group's replicas pull its CommitLog (default 127.0.0.1:10912)",
    )
    p.add_argument("--storage", choices=("file", "memory", "rocksdb"), help="default storage engine (default file)")
    p.add_argument("--flush", dest="flush_mode", choices=("async", "sync"), help="CommitLog flush mode")
    p.add_argument(
        "--cluster",
        metavar="etcd://HOST:PORT[,HOST:PORT...]",
        help="join the cluster whose metadata lives in this etcd (default: a broker on its own)",
    )
    p.add_argument("--node-id", type=int, help="this broker's node id, unique in its cluster (default 0)")
    p.add_argument(
        "--cluster-id", help="the cluster's name: its keys live under /mqk/<cluster-id>/ (default mqk-cluster)"
    )
    p.add_argument("--broker-group", help="the broker group this broker serves (default group-<node-id>)")
    p.add_argument("--rack", help="the rack (or zone) this broker is in (Kafka's broker.rack), told to clients")
    p.add_argument(
        "--advertise",
        nargs="+",
        metavar="HOST|NAME=HOST:PORT",
        help="addresses clients are told to connect to: one host for every listener, or "
        "kafka=HOST:PORT native=HOST:PORT namesrv=HOST:PORT (default: the bound ones)",
    )
    p.add_argument(
        "--admin-listen",
        metavar="HOST:PORT|off",
        help="admin HTTP listener: /metrics, /health/live, /health/ready (default 127.0.0.1:9644)",
    )
    p.add_argument(
        "--grpc-listen",
        metavar="HOST:PORT|off",
        help="RocketMQ 5 gRPC listener for the official RocketMQ 5 SDKs (default 127.0.0.1:8081 where the grpc "
        "extra is installed, else off; never in cluster mode yet)",
    )
    p.add_argument(
        "--no-metrics",
        dest="metrics",
        action="store_false",
        default=None,
        help="count no traffic or requests on the hot paths (/metrics then serves offsets, lag, store figures only)",
    )
    p.add_argument(
        "--admin-console-writes",
        action="store_true",
        default=None,
        help="let the admin listener's web console create topics and reset idle groups' offsets (default: read-only)",
    )
    security = p.add_argument_group("security (Kafka's listener model; more in the TOML file's [tls] table)")
    security.add_argument(
        "--listener",
        action="append",
        metavar="NAME=PROTOCOL://HOST:PORT",
        help="a named Kafka listener, PROTOCOL one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL (repeatable)",
    )
    security.add_argument(
        "--advertised-listener",
        action="append",
        metavar="NAME=HOST:PORT",
        help="the address clients are told for a named listener (repeatable; default: the bound one)",
    )
    security.add_argument("--tls-cert", metavar="PEM", help="the broker's certificate chain (TLS listeners)")
    security.add_argument("--tls-key", metavar="PEM", help="its private key")
    security.add_argument("--tls-ca", metavar="PEM", help="CA bundle client certificates are checked against")
    security.add_argument("--tls-client-auth", choices=("none", "requested", "required"), help="SSL listeners")
    security.add_argument(
        "--authorizer",
        action="store_true",
        default=None,
        help="authorize every Kafka API against the ACLs (`mqk acls`); default: everyone may do everything",
    )
    security.add_argument(
        "--super-user",
        action="append",
        metavar="User:NAME",
        help="a principal the ACLs do not apply to: it may do anything (repeatable)",
    )
    security.add_argument(
        "--allow-everyone-if-no-acl-found",
        action="store_true",
        default=None,
        help="with --authorizer: a resource no ACL names is open to everyone (default: to nobody)",
    )
    security.add_argument("--native-tls", action="store_true", default=None, help="TLS on the RocketMQ listener")
    security.add_argument("--namesrv-tls", action="store_true", default=None, help="TLS on the name server")
    security.add_argument("--grpc-tls", action="store_true", default=None, help="TLS on the RocketMQ 5 gRPC listener")
    limits = p.add_argument_group("limits (Kafka's broker settings of the same names)")
    limits.add_argument("--message-max-bytes", type=int, help="largest record batch / RocketMQ body (1048588)")
    limits.add_argument("--max-connections", type=int, help="open Kafka connections, all listeners (no limit)")
    limits.add_argument("--max-connections-per-ip", type=int, help="open Kafka connections from one address (no limit)")
    limits.add_argument(
        "--connections-max-idle-ms", type=int, help="close a Kafka connection silent this long (600000)"
    )
    p.add_argument("--log-level", default="INFO")
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text (default): one line per event; json: one JSON object per line, for machines",
    )
    p.set_defaults(func=cmd_serve)


#: where `mqk serve` listens for RocketMQ 5 gRPC clients unless told otherwise (RocketMQ's proxy port)
GRPC_DEFAULT = ("127.0.0.1", 8081)


def grpc_installed() -> bool:
    """Whether the `grpc` extra is installed (found, not imported: importing gRPC is what a start should not pay
    for when the listener is off)."""
    from importlib.util import find_spec

    return find_spec("grpc") is not None and find_spec("rocketmq") is not None


def build_config(args: argparse.Namespace) -> BrokerConfig:
    return BrokerConfig.load(
        args.config,
        grpc_default=GRPC_DEFAULT if grpc_installed() else None,
        data_dir=args.data_dir,
        kafka_listen=args.kafka_listen,
        native_listen=args.native_listen,
        namesrv_listen=args.namesrv_listen,
        replication_listen=args.replication_listen,
        storage=args.storage,
        flush_mode=args.flush_mode,
        cluster=args.cluster,
        node_id=args.node_id,
        cluster_id=args.cluster_id,
        broker_group=args.broker_group,
        broker_rack=args.rack,
        advertise=tuple(args.advertise) if args.advertise else None,
        admin_listen=args.admin_listen,
        grpc_listen=args.grpc_listen,
        grpc_tls=args.grpc_tls,
        metrics=args.metrics,
        admin_console_writes=args.admin_console_writes,
        listeners=args.listener,
        advertised_listeners=args.advertised_listener,
        tls_cert_file=args.tls_cert,
        tls_key_file=args.tls_key,
        tls_ca_file=args.tls_ca,
        tls_client_auth=args.tls_client_auth,
        native_tls=args.native_tls,
        namesrv_tls=args.namesrv_tls,
        message_max_bytes=args.message_max_bytes,
        max_connections=args.max_connections,
        max_connections_per_ip=args.max_connections_per_ip,
        connections_max_idle_ms=args.connections_max_idle_ms,
        authorizer=args.authorizer,
        super_users=tuple(args.super_user) if args.super_user else None,
        allow_everyone_if_no_acl_found=args.allow_everyone_if_no_acl_found,
    )


async def _serve(config: BrokerConfig) -> None:
    from mqk.runtime import BrokerRuntime  # (imported here: the admin commands never load the broker)

    runtime = BrokerRuntime(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, _log_task_stacks)
    _raise_open_files_limit()
    _keep_freed_buffers_mapped()
    await runtime.start()
    _freeze_startup_objects()
    _raise_young_collection_threshold()
    freezer = SurvivorFreezer(loop=loop).install()
    print(runtime.ready_line(), flush=True)
    try:
        await stop.wait()
    finally:
        freezer.uninstall()
        log.info("stopping: flushing and closing the store")
        await runtime.stop()


def _log_task_stacks() -> None:
    """SIGUSR1: log where every task of the event loop waits (the asyncio view of a JVM thread dump), to find
    what a broker that went quiet is stuck on without stopping it."""
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    lines = [f"SIGUSR1: {len(tasks)} tasks"]
    for task in tasks:
        lines.append(f"--- {task.get_name()}")
        step: Any = task.get_coro()
        for _ in range(32):  # the chain of awaits, outermost first (a task's own stack shows only its first frame)
            frame = getattr(step, "cr_frame", None) or getattr(step, "gi_frame", None)
            if frame is None:
                if step is not None:
                    lines.append(f"    awaiting {step!r}"[:300])
                break
            lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
            step = getattr(step, "cr_await", None) or getattr(step, "gi_yieldfrom", None)
    log.warning("\n".join(lines))


def _raise_open_files_limit() -> None:
    """Let the broker open as many files as the system allows, as the JVM does for Kafka (MaxFDLimit): each
    ConsumeQueue file is a mapping holding a descriptor (a CommitLog segment two), so the usual soft limit of
    1,024 would stop a broker at about 1,000 written partitions with EMFILE. Raised to the hard limit (capped by
    fs.nr_open when that is unlimited); a failure is logged, not fatal."""
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit from %d to %d: %s", soft, target, exc)
            return
        log.info("open files limit raised from %d to %d", soft, target)
    if target < 4096:
        log.warning(
            "the open files limit is %d: each written partition holds a descriptor (raise the hard "
            "limit, `ulimit -Hn`, for more than ~%d partitions)",
            target,
            target - 200,
        )


#: glibc mallopt parameters, and what `mqk serve` sets them to (see _keep_freed_buffers_mapped)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
HEAP_UP_TO = 32 << 20
KEEP_FREED_UP_TO = 64 << 20
#: the environment variables through which an operator sets these thresholds instead (then mqk leaves them)
MALLOC_ENVIRONMENT = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


def _keep_freed_buffers_mapped() -> bool:
    """Have glibc's malloc serve blocks up to HEAP_UP_TO from the heap and keep up to KEEP_FREED_UP_TO of freed heap
    mapped, rather than map each large block on its own and unmap it when freed. A connection's receive buffer is
    a fresh block of several MiB (a producer's 1 MB batches land whole in it) that is freed once its records are
    appended; with glibc's defaults every such buffer came back as new pages, so each byte a client sent cost a
    page fault and a cleared page before the socket read could copy it in. Kept mapped, the next buffer reuses
    the pages (bench/produce_capacity.py with 1 KiB records in 1 MB batches: about a fifth more MB/s and less
    broker CPU per record; docs/decisions.md). At most KEEP_FREED_UP_TO of freed memory stays with the process.
    Only `mqk serve`, whose process is the broker's; skipped where malloc is not glibc's, or where the operator
    set the thresholds in the environment. Returns whether the thresholds were set."""
    if any(name in os.environ for name in MALLOC_ENVIRONMENT):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # (no C library to ask, or a malloc without mallopt)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, HEAP_UP_TO) and mallopt(M_TRIM_THRESHOLD, KEEP_FREED_UP_TO)):
        return False  # (mallopt answers 0 for a parameter it does not take)
    log.info(
        "malloc: blocks up to %d MiB come from the heap, and up to %d MiB of freed heap stays mapped",
        HEAP_UP_TO >> 20,
        KEEP_FREED_UP_TO >> 20,
    )
    return True


def _freeze_startup_objects() -> None:
    """Move what start-up built out of the cyclic GC's reach (gc.freeze). A broker process owns its interpreter,
    and recovery builds a dozen or more long-lived objects per partition, which every full collection would walk
    again with the whole broker stopped, longer with every partition; frozen, it walks only what came since.
    Refcounting still frees a frozen object (a deleted topic's queues); only a reference cycle among them would
    stay. Not done for an embedded broker (mqk.testing), whose interpreter is the application's.

    The collection before the freeze covers the young generations only: the garbage start-up leaves is young (the
    older generation has been collected on the way), and measured on an empty broker a full collection here found
    nothing more while it took 5 ms of the start (a gen-1 collection: 0.2 ms), longer with every partition."""
    gc.collect(1)
    gc.freeze()
    log.info("start-up objects moved out of the cyclic GC's reach: %d", gc.get_freeze_count())


#: allocations between two young-generation collections in `mqk serve` (Python's default: 700)
YOUNG_COLLECTION_THRESHOLD = 10_000


def _raise_young_collection_threshold() -> None:
    """Collect the young generation every YOUNG_COLLECTION_THRESHOLD allocations instead of every 700. A Produce
    naming 100 partitions allocates several hundred dicts and tuples (its decoded partitions, their answers and
    results), so at 700 nearly every such request paid a collection walking that request's live objects. What a
    collection walks does not grow with the threshold (objects freed by reference counting leave the generation),
    so the walks become rarer, not longer (docs/decisions.md has the figures and their bench command). Only
    `mqk serve`, whose interpreter is the broker's."""
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])
    log.info("cyclic GC: the young generation is collected every %d allocations", YOUNG_COLLECTION_THRESHOLD)


#: a full collection longer than this is a stall every connection feels (it adds to the latency of every request
#: in flight)
SLOW_FULL_COLLECTION_S = 0.002


class SurvivorFreezer:
    """Freezes what a slow full collection found alive, so the next ones do not walk it again.

    Topics created while the broker runs (CreateTopics, auto-create, the RocketMQ side) build the same long-lived
    objects per partition that recovery builds, after the start-up freeze, and every later full collection walks
    them with the event loop stopped, longer with every partition created. A full collection has just removed
    every unreachable cycle, so freezing its survivors at its end (a list splice, no pause) puts nothing but live
    objects out of reach; the ones that die later are still freed by reference counting: a deleted topic's
    queues hold no cycles, nor does a connection closed under uvloop (asyncio's own transports do, which would
    keep ~1 KB per connection open at a freeze). Installed only by `mqk serve`, like the start-up freeze."""

    def __init__(self, slow_s: float = SLOW_FULL_COLLECTION_S, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.slow_s = slow_s
        #: where the log line is written from: a collection runs in whichever thread allocated, possibly in the
        #: middle of that thread's own logging call
        self.loop = loop
        self.freezes = 0
        self._started = 0.0

    def install(self) -> SurvivorFreezer:
        gc.callbacks.append(self._on_collection)
        return self

    def uninstall(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)

    def _on_collection(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        if took < self.slow_s:
            return
        gc.freeze()
        self.freezes += 1
        # no object count in the line: gc.get_freeze_count() walks every frozen object, and this runs while every
        # thread waits for the collection to end
        args = ("a full collection took %.1f ms: what it found alive moved out of the cyclic GC's reach", took * 1000)
        if self.loop is None:
            log.info(*args)
            return
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody reads the log line any more
            self.loop.call_soon_threadsafe(log.info, *args)


def cmd_serve(args: argparse.Namespace) -> int:
    from mqk.logfmt import configure_logging

    configure_logging(args.log_level, args.log_format)
    try:
        config = build_config(args)
    except (ValueError, TypeError, OSError) as exc:
        print(f"mqk serve: {exc}", file=sys.stderr)
        return 2
    from mqk.errors import ClusterStartError

    try:
        try:
            import uvloop
        except ImportError:
            asyncio.run(_serve(config))
        else:
            uvloop.run(_serve(config))
    except ClusterStartError as exc:
        print(f"mqk serve: {exc}", file=sys.stderr)
        return 3
    return 0


def _cluster_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="clusters on this machine")
    csub = p.add_subparsers(dest="action", required=True)
    p = csub.add_parser(
        "local",
        help="run etcd and N brokers on loopback until SIGINT / SIGTERM",
        description="Start etcd (unless --etcd is given) and N `mqk serve --cluster` processes on 127.0.0.1, print "
        "each broker's addresses and the bootstrap list, and run until SIGINT / SIGTERM, then stop them all. The same "
        "--data-dir again is the same cluster (its cluster id, etcd data and, where free, ports are kept there).",
    )
    p.add_argument("--brokers", type=int, default=3, help="number of broker processes (default 3)")
    p.add_argument(
        "--group-size",
        type=int,
        default=1,
        help="brokers per broker group: each group's CommitLog is replicated to all of its brokers (default 1)",
    )
    p.add_argument("--data-dir", required=True, help="directory for etcd's and every broker's data and logs")
    p.add_argument("--etcd", metavar="etcd://HOST:PORT[,HOST:PORT...]", help="use this etcd instead of starting one")
    p.add_argument("--cluster-id", help="the cluster's name (default: the one --data-dir holds, else a new one)")
    p.set_defaults(func=cmd_cluster_local)


class _Interrupted(Exception):
    """SIGINT / SIGTERM / SIGHUP reached `mqk cluster local`."""


def _interrupt(signum: int, frame: object) -> None:
    raise _Interrupted(signal.Signals(signum).name)


def cmd_cluster_local(args: argparse.Namespace) -> int:
    # (imported here: the other verbs need none of it)
    from mqk.cluster_local import EtcdNotFound, LocalCluster, LocalClusterError

    def report(what: str, code: int) -> None:
        print(f"mqk cluster local: {what} exited with code {code}", file=sys.stderr, flush=True)

    try:
        cluster = LocalCluster(
            args.data_dir,
            args.brokers,
            etcd=args.etcd,
            cluster_id=args.cluster_id,
            group_size=args.group_size,
            on_exit=report,
        )
    except (ValueError, LocalClusterError) as exc:
        print(f"mqk cluster local: {exc}", file=sys.stderr)
        return 2
    # a signal ends the wait below, or a start still under way: either way what was started is stopped
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        cluster.start()
        print(f"etcd={cluster.etcd_url} cluster-id={cluster.cluster_id}")
        for broker in cluster.brokers:
            print(broker.describe())
        print(f"bootstrap={cluster.bootstrap}", flush=True)
        print(f"mqk cluster local: logs in {cluster.data_dir}/*.log; Ctrl-C stops the cluster", file=sys.stderr)
        while True:
            signal.pause()
    except _Interrupted:
        pass
    except EtcdNotFound as exc:
        print(f"mqk cluster local: {exc}", file=sys.stderr)
        return 2
    except LocalClusterError as exc:
        print(f"mqk cluster local: {exc}", file=sys.stderr)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the stop below is bounded: let it finish
        cluster.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mqk", description="Kafka- and RocketMQ-compatible message broker")
    parser.add_argument("--version", action="version", version=f"mqk {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _cluster_parser(sub)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["serve"]:
        # imported only for the other verbs, to keep start-up cheap: the admin and perf commands load the clients
        # and their codecs, which a broker (`mqk serve`, whose parser is all it reads) never uses
        from mqk import cli_admin, cli_perf

        cli_admin.register(sub)
        cli_perf.register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
