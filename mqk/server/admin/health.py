"""Liveness and readiness, as /health/live and /health/ready answer them.

- live: the event loop answers (the request being served is the proof); always 200 while the process runs.
- ready: 200 when every check passes, else 503, with each check's outcome in the JSON body:
  - `listeners`: the Kafka, RocketMQ and name-server listeners are bound and the start finished;
  - `recovery`: the store started (recovery of a file store done, engines open);
  - `store_writable`: every engine runs and the disk guard is not refusing appends (disk above its limit);
  - `cluster` (cluster mode only): registered (this broker's record is in the cluster view) and the view follows
    etcd (`connected`); whether it leads its group is reported, not required (a replica is ready too).
"""

from __future__ import annotations

from typing import Any

from mqk.server.admin.parts import BrokerParts


def readiness(parts: BrokerParts) -> tuple[bool, dict[str, Any]]:
    """(ready, the checks and what they found)."""
    checks: dict[str, Any] = {}
    checks["listeners"] = bool(parts.started and parts.kafka_address and parts.native_address and parts.namesrv_address)
    store = parts.store
    checks["recovery"] = store is not None and parts.kafka is not None
    writable = store is not None
    if store is not None:
        for engine in store.engines.values():
            running = getattr(engine, "running", True)  # (the file engine says; the others run once started)
            if not running:
                writable = False
    guard = parts.diskguard
    if guard is not None and guard.full:
        writable = False
    checks["store_writable"] = writable
    if parts.config.cluster:
        cluster = parts.cluster
        registered = connected = leading = False
        if cluster is not None:
            view = cluster.view
            connected = bool(view.connected)
            registered = view.broker(cluster.node_id) is not None
            leading = cluster.node.leading
        checks["cluster"] = registered and connected
        checks["cluster_detail"] = {"registered": registered, "connected": connected, "leading": leading}
    ready = all(v for k, v in checks.items() if not k.endswith("_detail"))
    return ready, checks


__all__ = ["readiness"]
