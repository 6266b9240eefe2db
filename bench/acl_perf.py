"""What authorization costs the produce path: broker CPU per million records with the ACL authorizer on and 100 ACLs
loaded, beside the same broker without an authorizer, in alternating rounds:

    python bench/acl_perf.py                       # 3 rounds, 1 and 100 partitions, 10-record batches
    python bench/acl_perf.py --rounds 5 --batch-records 1 --batches-per-request 10

Each round starts one broker without an authorizer and one with `--authorizer` (the order alternating) on a file
store whose `security/acls.json` holds `--acls` ACLs written before the start: the producer's own (ANONYMOUS on the
PLAINTEXT listener, so no SASL cost is mixed in: ALL on the cluster, ALL on the `capacity-` topics as a PREFIXED
pattern), and the rest for other users, half of them on names the measured topic matches (PREFIXED `c`, `ca`, ...
and the wildcard), so a decision has real bindings to weigh. The load is bench/produce_capacity.py's: pre-built
Produce v9 requests, acks=1. The end prints each mode's median and the difference (the issue's goal: at most 5 %).
Decisions are cached per (principal, host, operation, resource), so the cost per request is one cache lookup per
topic; small batches (`--batch-records 1`) make that cost per record as large as it gets.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import perfutil
import produce_capacity


def acl_doc(count: int) -> dict[str, Any]:
    """`count` ACLs (at least 2): the producer's two, then others' on names near and far from the measured topics."""
    mine = [
        ("CLUSTER", "kafka-cluster", "LITERAL", "User:ANONYMOUS", "ALL", "ALLOW"),
        ("TOPIC", "capacity-", "PREFIXED", "User:ANONYMOUS", "ALL", "ALLOW"),
    ]
    others = []
    for i in range(max(0, count - len(mine))):
        user = f"User:user-{i}"
        if i % 2 == 0:  # applies to the measured topics' names (another principal): weighed, then left out
            name, pattern = ("capacity-"[: 1 + i % 9], "PREFIXED") if i % 10 else ("*", "LITERAL")
        else:
            name, pattern = f"other-{i}", "LITERAL" if i % 3 else "PREFIXED"
        rtype = "GROUP" if i % 7 == 0 else "TOPIC"
        permission = "DENY" if i % 5 == 0 else "ALLOW"
        others.append((rtype, name, pattern, user, ("READ", "WRITE", "DESCRIBE")[i % 3], permission))
    keys = ("resource_type", "name", "pattern_type", "principal", "operation", "permission")
    return {"acls": [{**dict(zip(keys, b, strict=True)), "host": "*"} for b in [*mine, *others]]}


def measure(args: argparse.Namespace, authorizer: bool) -> dict[int, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="mqk-acl-bench-") as tmp:
        security = Path(tmp) / "data" / "security"
        security.mkdir(parents=True)
        (security / "acls.json").write_text(json.dumps(acl_doc(args.acls)))
        extra = ("--authorizer",) if authorizer else ()
        with perfutil.Broker("file", tmp, extra_args=extra) as broker:
            return {
                n: produce_capacity.run(
                    broker,
                    n,
                    args.records,
                    args.record_size,
                    args.batch_records,
                    args.batches_per_request,
                    args.in_flight,
                )
                for n in args.partitions
            }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--acls", type=int, default=100, help="ACLs loaded (default 100)")
    p.add_argument("--partitions", type=int, nargs="+", default=[1, 100])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--batch-records", type=int, default=10, help="records per batch")
    p.add_argument("--batches-per-request", type=int, default=100)
    p.add_argument("--in-flight", type=int, default=5)
    args = p.parse_args(argv)
    cpu: dict[tuple[bool, int], list[float]] = {}
    errors = 0
    for round_no in range(args.rounds):
        for authorizer in (True, False) if round_no % 2 == 0 else (False, True):
            results = measure(args, authorizer)
            base = results[args.partitions[0]]
            for n, r in results.items():
                errors += r["errors"]
                cpu.setdefault((authorizer, n), []).append(r["cpu_s_per_million"])
                label = f"acls on ({args.acls})" if authorizer else "acls off     "
                print(
                    f"round {round_no + 1} {label}: "
                    + produce_capacity.line(r, n, args.batch_records, base, args.partitions[0]),
                    flush=True,
                )
    for n in args.partitions:
        on, off = statistics.median(cpu[(True, n)]), statistics.median(cpu[(False, n)])
        print(
            f"{n} partition(s), {args.batch_records} records per batch: broker cpu per million records, median of "
            f"{args.rounds}: {on:.3f} s with the authorizer and {args.acls} ACLs, {off:.3f} s without "
            f"({(on - off) / off:+.1%}; goal: at most +5%)",
            flush=True,
        )
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
