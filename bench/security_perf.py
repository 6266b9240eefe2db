"""What TLS and SASL cost: produce and consume throughput over SASL_SSL (SCRAM-SHA-512) beside PLAINTEXT, on one
broker in the same run, 1 KiB records (confluent-kafka, as producer_perf.py and consumer_perf.py measure).

    python bench/security_perf.py --num-records 300000 --rounds 3

starts a broker (its own temporary data directory and test certificates, made with the `cryptography` package)
with the unnamed PLAINTEXT listener and a SASL_SSL one, adds a SCRAM user through the PLAINTEXT listener, then
runs `--rounds` rounds of: produce over PLAINTEXT, produce over SASL_SSL, consume each topic over the same listener
it was written through (the order of the two alternates from round to round). Every phase prints Kafka's perf-test
line and the broker's CPU seconds per million records; the end prints each mode's median and what SASL_SSL costs
against PLAINTEXT (the goal: at most 30 % less throughput). The client runs beside the broker on the same cores and
does its own half of the TLS work, so on a small shared machine the figures move from run to run: compare the
modes of one run, not runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import consumer_perf
import perfutil
import producer_perf

sys.path.insert(0, str(perfutil.REPO / "tests"))  # tests/pki.py makes the certificates

USER, PASSWORD = "perf", "perf-secret"


def secure_props(pki: Any) -> dict[str, str]:
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": USER,
        "sasl.password": PASSWORD,
        "ssl.ca.location": str(pki.ca),
    }


def phase(broker: perfutil.Broker, what: str, run: Any, count: int) -> dict[str, Any]:
    broker.settle()
    cpu0 = broker.cpu_seconds()
    result = run()
    broker.settle()  # the background flush of these records belongs to this phase
    cpu = broker.cpu_seconds() - cpu0
    result["cpu_per_million"] = cpu / max(count, 1) * 1e6
    print(f"  ({what}: broker cpu {cpu:.2f} s, {result['cpu_per_million']:.2f} s per million records)", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-records", type=int, default=300_000)
    p.add_argument("--record-size", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--storage", default="file", choices=("file", "memory", "rocksdb"))
    p.add_argument("--producer-props", nargs="*", default=["acks=1"], metavar="KEY=VALUE")
    args = p.parse_args(argv)

    from pki import make_pki

    with tempfile.TemporaryDirectory(prefix="mqk-bench-tls-") as tmp:
        pki = make_pki(Path(tmp) / "pki")
        extra = (
            "--listener", "SECURE=SASL_SSL://127.0.0.1:0",
            "--tls-cert", str(pki.server),
            "--tls-key", str(pki.server_key),
        )  # fmt: skip
        with perfutil.Broker(args.storage, tmp, extra_args=extra) as broker:
            added = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "mqk",
                    "users",
                    "add",
                    USER,
                    "--password-stdin",
                    "--bootstrap",
                    broker.bootstrap,
                ],
                input=PASSWORD + "\n",
                capture_output=True,
                text=True,
                timeout=60,
            )
            if added.returncode:
                raise SystemExit(added.stderr)
            host, port = broker.process.listeners["SECURE"]
            modes = {
                "PLAINTEXT": (broker.bootstrap, {}),
                "SASL_SSL": (f"{host}:{port}", secure_props(pki)),
            }
            produced: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
            consumed: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
            n, size = args.num_records, args.record_size
            for r in range(args.rounds):
                order = list(modes) if r % 2 == 0 else list(reversed(modes))
                topics = {m: f"tls-perf-{m.lower()}-{uuid.uuid4().hex[:6]}" for m in modes}
                for mode in order:
                    bootstrap, props = modes[mode]
                    print(f"round {r + 1}: produce over {mode}", flush=True)
                    produced[mode].append(
                        phase(
                            broker,
                            f"produce {mode}",
                            lambda b=bootstrap, t=topics[mode], pr=props: producer_perf.run(
                                b, t, n, size, producer_props={**perfutil.parse_props(args.producer_props), **pr}
                            ),
                            n,
                        )
                    )
                for mode in order:
                    bootstrap, props = modes[mode]
                    print(f"round {r + 1}: consume over {mode}", flush=True)
                    consumed[mode].append(
                        phase(
                            broker,
                            f"consume {mode}",
                            lambda b=bootstrap, t=topics[mode], pr=props: consumer_perf.run(b, t, n, consumer_props=pr),
                            n,
                        )
                    )
    print()
    print(f"medians of {args.rounds} rounds, {n} records of {size} B each:")
    cost = {}
    for what, results, key in (
        ("produce", produced, "records_per_s"),
        ("consume", consumed, "fetch_messages_per_s"),
    ):
        medians = {m: statistics.median(x[key] for x in results[m]) for m in results}
        cpu = {m: statistics.median(x["cpu_per_million"] for x in results[m]) for m in results}
        for mode in results:
            print(
                f"  {what} {mode:9s} {medians[mode]:10.0f} records/sec ({medians[mode] * size / 1048576:7.2f} MB/sec), "
                f"broker cpu {cpu[mode]:.2f} s per million records"
            )
        cost[what] = 1 - medians["SASL_SSL"] / medians["PLAINTEXT"]
    for what, value in cost.items():
        verdict = "within" if value <= 0.30 else "above"
        print(f"SASL_SSL costs {value * 100:.1f} % of PLAINTEXT {what} throughput ({verdict} the 30 % goal)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
