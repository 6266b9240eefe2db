"""Micro-benchmark of the generated Kafka message codecs (mqk.protocol.kafka.messages): per-call time of decode and
encode for the request and response bodies of Metadata, OffsetCommit, JoinGroup and ListOffsets (no hand-written
`_fast` kernel) and Fetch (whose kernels fall back to them, and every client's path), at an old, a middle and a
recent version of each.

Usage:  python bench/codec_bench.py [--repeat N] [--min-time SECONDS] [--only API]

Each line: `<message> v<version> <bytes> B  decode <us> us/call  encode <us> us/call`, the best of `--repeat` runs
of a loop that lasts at least `--min-time` (the minimum is the figure least disturbed by other work on the machine).
It calls the untyped entry points by api key, the ones the connection codec uses, so the figures include the
version lookup; the bodies below are the shapes a small cluster sees (a handful of topics, partitions, members).
"""

from __future__ import annotations

import argparse
import timeit
import uuid

from mqk.protocol.kafka import messages

TOPICS = [f"topic-{i}" for i in range(5)]
IDS = [uuid.UUID(int=i + 1) for i in range(5)]


def metadata_request() -> dict:
    return {
        "topics": [{"name": t, "topic_id": u} for t, u in zip(TOPICS, IDS)],
        "allow_auto_topic_creation": True,
        "include_topic_authorized_operations": False,
    }


def metadata_response() -> dict:
    brokers = [{"node_id": n, "host": "127.0.0.1", "port": 9092 + n, "rack": None} for n in range(3)]
    topics = [
        {
            "error_code": 0,
            "name": t,
            "topic_id": u,
            "is_internal": False,
            "topic_authorized_operations": -2147483648,
            "partitions": [
                {
                    "error_code": 0,
                    "partition_index": p,
                    "leader_id": p % 3,
                    "leader_epoch": 4,
                    "replica_nodes": [0, 1, 2],
                    "isr_nodes": [0, 1, 2],
                    "offline_replicas": [],
                }
                for p in range(4)
            ],
        }
        for t, u in zip(TOPICS, IDS)
    ]
    return {
        "throttle_time_ms": 0,
        "brokers": brokers,
        "cluster_id": "mqk-cluster",
        "controller_id": 0,
        "topics": topics,
    }


def offset_commit_request() -> dict:
    return {
        "group_id": "orders-consumers",
        "generation_id_or_member_epoch": 7,
        "member_id": "consumer-1-4f1d",
        "group_instance_id": None,
        "retention_time_ms": -1,
        "topics": [
            {
                "name": t,
                "topic_id": u,
                "partitions": [
                    {
                        "partition_index": p,
                        "committed_offset": 100_000 + p,
                        "committed_leader_epoch": 4,
                        "commit_timestamp": -1,
                        "committed_metadata": "",
                    }
                    for p in range(4)
                ],
            }
            for t, u in zip(TOPICS[:3], IDS)
        ],
    }


def offset_commit_response() -> dict:
    return {
        "throttle_time_ms": 0,
        "topics": [
            {"name": t, "topic_id": u, "partitions": [{"partition_index": p, "error_code": 0} for p in range(4)]}
            for t, u in zip(TOPICS[:3], IDS)
        ],
    }


def join_group_request() -> dict:
    meta = bytes(range(40))
    return {
        "group_id": "orders-consumers",
        "session_timeout_ms": 45_000,
        "rebalance_timeout_ms": 300_000,
        "member_id": "consumer-1-4f1d",
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": meta}, {"name": "cooperative-sticky", "metadata": meta}],
        "reason": None,
    }


def join_group_response() -> dict:
    meta = bytes(range(40))
    return {
        "throttle_time_ms": 0,
        "error_code": 0,
        "generation_id": 7,
        "protocol_type": "consumer",
        "protocol_name": "range",
        "leader": "consumer-1-4f1d",
        "skip_assignment": False,
        "member_id": "consumer-1-4f1d",
        "members": [{"member_id": f"consumer-{i}-4f1d", "group_instance_id": None, "metadata": meta} for i in range(5)],
    }


def list_offsets_request() -> dict:
    return {
        "replica_id": -1,
        "isolation_level": 0,
        "timeout_ms": 30_000,
        "topics": [
            {
                "name": t,
                "partitions": [
                    {"partition_index": p, "current_leader_epoch": 4, "timestamp": -1, "max_num_offsets": 1}
                    for p in range(8)
                ],
            }
            for t in TOPICS[:2]
        ],
    }


def list_offsets_response() -> dict:
    return {
        "throttle_time_ms": 0,
        "topics": [
            {
                "name": t,
                "partitions": [
                    {
                        "partition_index": p,
                        "error_code": 0,
                        "old_style_offsets": [5],
                        "timestamp": -1,
                        "offset": 1_000_000 + p,
                        "leader_epoch": 4,
                    }
                    for p in range(8)
                ],
            }
            for t in TOPICS[:2]
        ],
    }


def fetch_request() -> dict:
    return {
        "replica_id": -1,
        "max_wait_ms": 500,
        "min_bytes": 1,
        "max_bytes": 52_428_800,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": t,
                "topic_id": u,
                "partitions": [
                    {
                        "partition": p,
                        "current_leader_epoch": 4,
                        "fetch_offset": 1_000 * p,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1_048_576,
                    }
                    for p in range(4)
                ],
            }
            for t, u in zip(TOPICS[:2], IDS)
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


def fetch_response() -> dict:
    batch = memoryview(bytes(1024))
    return {
        "throttle_time_ms": 0,
        "error_code": 0,
        "session_id": 0,
        "responses": [
            {
                "topic": t,
                "topic_id": u,
                "partitions": [
                    {
                        "partition_index": p,
                        "error_code": 0,
                        "high_watermark": 5_000,
                        "last_stable_offset": 5_000,
                        "log_start_offset": 0,
                        "aborted_transactions": None,
                        "preferred_read_replica": -1,
                        "records": [batch, batch] if p % 2 else batch,
                    }
                    for p in range(4)
                ],
            }
            for t, u in zip(TOPICS[:2], IDS)
        ],
    }


# (name, api key, versions, request body, response body)
CASES = [
    ("Metadata", 3, (1, 9, 12), metadata_request, metadata_response),
    ("OffsetCommit", 8, (2, 8, 9), offset_commit_request, offset_commit_response),
    ("JoinGroup", 11, (1, 5, 9), join_group_request, join_group_response),
    ("ListOffsets", 2, (1, 7, 10), list_offsets_request, list_offsets_response),
    # the broker decodes most Fetch requests and encodes most answers with `_fast` kernels; the generated codec
    # is the fall-back and every client's path (records given as one buffer or a list of them)
    ("Fetch", 1, (4, 12, 16), fetch_request, fetch_response),
]


def per_call_us(stmt: str, env: dict, repeat: int, min_time: float) -> float:
    timer = timeit.Timer(stmt, globals=env)
    number, _elapsed = timer.autorange()
    while _elapsed < min_time:
        number *= 2
        _elapsed = timer.timeit(number)
    return min(timer.repeat(repeat=repeat, number=number)) / number * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--only", help="one API name (e.g. Metadata)")
    args = ap.parse_args(argv)
    for name, api_key, versions, make_request, make_response in CASES:
        if args.only and args.only != name:
            continue
        for kind, make in (("Request", make_request), ("Response", make_response)):
            enc = messages.encode_request if kind == "Request" else messages.encode_response
            dec = messages.decode_request if kind == "Request" else messages.decode_response
            for v in versions:
                obj = make()
                wire = memoryview(b"".join(bytes(p) for p in enc(api_key, v, obj)))  # the codec hands out views
                env = {"enc": enc, "dec": dec, "k": api_key, "v": v, "obj": obj, "wire": wire}
                d = per_call_us("dec(k, v, wire)", env, args.repeat, args.min_time)
                e = per_call_us("enc(k, v, obj)", env, args.repeat, args.min_time)
                print(
                    f"{name + kind:<22} v{v:<3} {len(wire):>5} B  decode {d:7.2f} us/call  encode {e:7.2f} us/call",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
