"""The `mqk` admin commands against a cluster (etcd and two `mqk serve --cluster` processes), given either broker as
`--bootstrap`: each request goes to the broker that must answer it, as Kafka's admin client routes them (a
partition's leader: produce, consume, offsets, delete-records, sizes; a group's coordinator: describe, reset; every
broker: the group list), so the commands work whichever broker the operator names."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

from helpers import CLUSTER_TESTS, leaders_seen_by, wait_until

from mqk.cluster_local import LocalCluster

pytestmark = CLUSTER_TESTS


def mqk(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mqk", *args], capture_output=True, text=True, timeout=60)


def ok(*args: str) -> str:
    done = mqk(*args)
    assert done.returncode == 0, (args, done.stderr[-2000:])
    return done.stdout


def test_admin_commands_reach_each_partitions_leader_and_each_groups_coordinator(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = mqk_cluster_factory(2)
    b0, b1 = cluster.brokers
    ok("topics", "create", "ledger", "--partitions", "4", "--bootstrap", b0.bootstrap)
    # b0 answered once its own view had the topic; b1 learns it by its etcd watch a moment later
    assert b1.kafka is not None
    wait_until(lambda: len(leaders_seen_by(b1.kafka, "ledger")) == 4, 30, "b1 to know the topic")
    described = json.loads(ok("topics", "describe", "ledger", "--json", "--bootstrap", b1.bootstrap))
    leaders = {p["partition"]: p["leader"] for p in described["partitions"]}
    assert set(leaders.values()) == {b0.node_id, b1.node_id}, leaders  # placement spread them: both must answer

    # every partition written and read through one broker, whichever leads it
    for partition in range(4):
        ok("produce", "--topic", "ledger", "--partition", str(partition), "--bootstrap", b0.bootstrap,
           *[arg for i in range(partition + 1) for arg in ("--value", f"p{partition}-v{i}")])  # fmt: skip
    for partition in range(4):
        out = ok("consume", "--topic", "ledger", "--partition", str(partition), "--max-messages", str(partition + 1),
                 "--bootstrap", b0.bootstrap)  # fmt: skip
        assert out.split() == [f"p{partition}-v{i}" for i in range(partition + 1)], out

    # offsets and sizes come from each leader
    described = json.loads(ok("topics", "describe", "ledger", "--json", "--bootstrap", b0.bootstrap))
    by_partition = {p["partition"]: p for p in described["partitions"]}
    assert [by_partition[p]["end_offset"] for p in range(4)] == [1, 2, 3, 4]
    assert all(by_partition[p]["start_offset"] == 0 and by_partition[p]["size_bytes"] > 0 for p in range(4))
    ok("topics", "delete-records", "ledger", "--partition", "3", "--before", "2", "--bootstrap", b0.bootstrap)
    ok("topics", "delete-records", "ledger", "--partition", "2", "--before", "1", "--bootstrap", b1.bootstrap)
    described = json.loads(ok("topics", "describe", "ledger", "--json", "--bootstrap", b1.bootstrap))
    assert {p["partition"]: p["start_offset"] for p in described["partitions"]} == {0: 0, 1: 0, 2: 1, 3: 2}

    # a group's offsets are set, described and listed through either broker (one of them is not its coordinator)
    for bootstrap, to in ((b0.bootstrap, "--to-latest"), (b1.bootstrap, "--to-earliest")):
        ok("groups", "reset-offsets", "audit", "--topic", "ledger", to, "--execute", "--bootstrap", bootstrap)
        for asked in (b0, b1):
            group = json.loads(ok("groups", "describe", "audit", "--json", "--bootstrap", asked.bootstrap))
            rows = {r["partition"]: r for r in group["partitions"]}
            expected = [1, 2, 3, 4] if to == "--to-latest" else [0, 0, 1, 2]
            assert [rows[p]["current_offset"] for p in range(4)] == expected, (to, asked.node_id, rows)
            assert [rows[p]["log_end_offset"] for p in range(4)] == [1, 2, 3, 4]
    for asked in (b0, b1):
        listed = json.loads(ok("groups", "list", "--json", "--bootstrap", asked.bootstrap))
        assert [g["group"] for g in listed] == ["audit"], listed
