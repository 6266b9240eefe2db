"""DescribeLogDirs and AlterReplicaLogDirs, answered as a Kafka broker with one log directory answers them.

mqk keeps every partition in one data directory (`StoreConfig.data_dir`, one CommitLog for all of them), which is
this broker's only log directory, named by its absolute path as Kafka names its `log.dirs`.

- DescribeLogDirs: the directory with the partitions asked for (every partition held here when the request names
  no topics), each with its size (the bytes of its record batches still readable: mqk.broker.logsizes), its offset
  lag (below) and no future replica; from v4 the total and usable bytes of the directory's file system (-1 when the
  directory does not exist, as with a memory store that never created it). Admin UIs and `kafka-log-dirs` read
  disk use here. A partition moving into this broker's group (mqk.broker.moves) has as offset lag, on the group's
  master, the offsets its copy still lacks: a reassignment's progress, as Kafka shows it for a replica being added.
- AlterReplicaLogDirs: a partition asked to move into the directory it is in is answered NONE (nothing to move); a
  directory that is not this broker's log directory LOG_DIR_NOT_FOUND; a partition this broker does not hold
  REPLICA_NOT_AVAILABLE (what Kafka answers for a replica it does not have).

Both ask of the cluster (Kafka's rule): DESCRIBE to describe (CLUSTER_AUTHORIZATION_FAILED, no directories), ALTER
to move (CLUSTER_AUTHORIZATION_FAILED for every partition).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from mqk import errors as E
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer
from mqk.server.kafka.handlers.common import NONE, allowed_cluster

# typing only: an API's codec module is imported with its first request (messages.module_for), not at start-up
if TYPE_CHECKING:
    from mqk.protocol.kafka.messages.alter_replica_log_dirs import (
        AlterReplicaLogDirsRequest,
        AlterReplicaLogDirsResponse,
        AlterReplicaLogDirsResponseAlterReplicaLogDirTopicResult,
    )
    from mqk.protocol.kafka.messages.describe_log_dirs import (
        DescribeLogDirsRequest,
        DescribeLogDirsResponse,
        DescribeLogDirsTopic,
    )


def log_dir(ctx: KafkaContext) -> str:
    """This broker's one log directory: the data directory's absolute path."""
    return str(Path(ctx.config.store.data_dir).absolute())


def volume_bytes(path: str) -> tuple[int, int]:
    """(total, usable) bytes of the file system holding `path`; (-1, -1) when it cannot be measured."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1, -1
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


async def describe_log_dirs(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[DescribeLogDirsRequest]
) -> DescribeLogDirsResponse:
    if not allowed_cluster(ctx, peer, "DESCRIBE"):
        return {"throttle_time_ms": 0, "error_code": E.ClusterAuthorizationFailedError.code, "results": []}
    held = ctx.store.topics()
    asked = req.body["topics"]
    wanted: list[tuple[str, list[int]]]
    if asked is None:
        wanted = [(name, list(range(info.queue_count))) for name, info in sorted(held.items())]
    else:
        wanted = []
        for t in asked:
            info = held.get(t["topic"])
            if info is not None:  # Kafka leaves out what it does not hold
                wanted.append((t["topic"], [p for p in t["partitions"] if 0 <= p < info.queue_count]))
    sizes = ctx.log_sizes
    topics: list[DescribeLogDirsTopic] = []
    for name, partitions in wanted:
        if not partitions:
            continue
        topics.append(
            {
                "name": name,
                "partitions": [
                    {
                        "partition_index": p,
                        "partition_size": 0 if sizes is None else await sizes.size(name, p),
                        "offset_lag": 0 if ctx.moves is None else ctx.moves.lag(name, p),
                        "is_future_key": False,
                    }
                    for p in partitions
                ],
            }
        )
    path = log_dir(ctx)
    total, usable = volume_bytes(path)
    return {
        "throttle_time_ms": 0,
        "error_code": NONE,
        "results": [
            {
                "error_code": NONE,
                "log_dir": path,
                "topics": topics,
                "total_bytes": total,
                "usable_bytes": usable,
                "is_cordoned": False,
            }
        ],
    }


async def alter_replica_log_dirs(
    ctx: KafkaContext, peer: Peer, req: KafkaRequest[AlterReplicaLogDirsRequest]
) -> AlterReplicaLogDirsResponse:
    ours = log_dir(ctx)
    held = ctx.store.topics()
    permitted = allowed_cluster(ctx, peer, "ALTER")
    by_topic: dict[str, AlterReplicaLogDirsResponseAlterReplicaLogDirTopicResult] = {}
    for d in req.body["dirs"]:
        known = os.path.normpath(d["path"]) == ours  # noqa: ASYNC240 - a string rewrite; no file is touched
        for t in d["topics"]:
            name = t["name"]
            result = by_topic.setdefault(name, {"topic_name": name, "partitions": []})
            info = held.get(name)
            for p in t["partitions"]:
                if not permitted:
                    code = E.ClusterAuthorizationFailedError.code
                elif not known:
                    code = E.LogDirNotFoundError.code
                elif info is None or not 0 <= p < info.queue_count:
                    code = E.ReplicaNotAvailableError.code
                else:
                    code = NONE
                result["partitions"].append({"partition_index": p, "error_code": code})
    return {"throttle_time_ms": 0, "results": list(by_topic.values())}
