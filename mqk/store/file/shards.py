"""The file engine's shards: which topic-queues exist, their ConsumeQueues and rows, and `queues.json`.

Owns:
- `Shard`: one topic-queue (its ConsumeQueue, the CommitLog offset at which its topic was created, its log start);
- `ShardRegistry`: the shards by (topic, queue), by topic, and as each topic's *slot map* (queue id -> row of the
  queue table, an int64 array the append kernel reads), and the metadata file `queues.json` (queue counts, creation
  points, log start offsets), written atomically whenever it changes.

A topic re-created under an old name starts at offset 0; entries of the old incarnation are told apart by the
CommitLog offset at which the topic was created (`created_phys`), which recovery and the key index compare.
"""

from __future__ import annotations

import array
import asyncio
import logging
from pathlib import Path
from typing import Any

from mqk.errors import Corrupt, UnknownShard
from mqk.store.file.commitlog import FIXED
from mqk.store.file.consumequeue import ConsumeQueue
from mqk.store.file.queue_table import LOG_START, ROW_FIELDS, QueueTable
from mqk.store.fsutil import atomic_write_json, read_json

log = logging.getLogger(__name__)

#: what `queues.json` holds per topic: queue count, CommitLog offset at creation, log start offset per queue
TopicMeta = dict[str, Any]


class Shard:
    """One topic-queue: its ConsumeQueue and logical log start (kept in the queue's row of the queue table)."""

    __slots__ = ("cq", "created_phys", "fixed", "queue", "topic", "topic_b")

    def __init__(self, topic: str, queue: int, cq: ConsumeQueue, created_phys: int, log_start: int = 0) -> None:
        self.topic = topic
        self.topic_b = topic.encode()
        self.queue = queue
        self.cq = cq
        self.created_phys = created_phys
        self.fixed = FIXED + len(self.topic_b)  # bytes of entry header before the batch
        self.log_start = log_start

    @property
    def log_start(self) -> int:
        cq = self.cq
        return cq.table.cols[cq.slot * ROW_FIELDS + LOG_START]

    @log_start.setter
    def log_start(self, value: int) -> None:
        cq = self.cq
        cq.table.cols[cq.slot * ROW_FIELDS + LOG_START] = value

    def __repr__(self) -> str:
        return f"Shard({self.topic}-{self.queue})"


class ShardRegistry:
    def __init__(self, root: Path, table: QueueTable, units_per_file: int) -> None:
        self.root = root
        self.table = table
        self.units_per_file = units_per_file
        self.shards: dict[tuple[str, int], Shard] = {}
        #: per topic, its shards indexed by queue id
        self.by_topic: dict[str, list[Shard | None]] = {}
        #: per topic, queue id -> queue-table slot (-1: no such queue), as the append kernel reads it
        self.slot_maps: dict[str, array.array[int]] = {}
        #: per topic, (its slot map, its name as bytes): what an append looks up first
        self.routes: dict[str, tuple[array.array[int], bytes]] = {}
        #: per slot, its ConsumeQueue (the kernel names the queues it dirtied by slot)
        self.queue_at: dict[int, ConsumeQueue] = {}
        self.topics: dict[str, TopicMeta] = {}
        #: a replica copying its master's log from a later start: where queues it does not hold yet start when
        #: they are created ((topic, queue) -> first offset; mqk.store.file.replica.adopt_queue_starts)
        self.pending_starts: dict[tuple[str, int], int] = {}
        #: counts log start moves (DeleteRecords, retention, a replica told by its master): a master's replication
        #: links send the log starts again when it changed (link.py)
        self.log_start_version = 0

    # --- lookup ---------------------------------------------------------------------------------------------

    def get(self, topic: str, queue: int) -> Shard:
        shard = self.shards.get((topic, queue))
        if shard is None:
            raise UnknownShard(f"unknown shard {topic}-{queue}")
        return shard

    def queue_counts(self) -> dict[str, int]:
        return {name: meta["queues"] for name, meta in self.topics.items()}

    # --- opening and closing ----------------------------------------------------------------------------------

    def open_shard(self, topic: str, queue: int, meta: TopicMeta) -> Shard:
        cq = ConsumeQueue(self.root / "consumequeue" / topic / str(queue), self.units_per_file, self.table)
        shard = Shard(topic, queue, cq, meta["created"], meta["log_start"].get(queue, 0))
        self.shards[(topic, queue)] = shard
        self.queue_at[cq.slot] = cq
        queues = self.by_topic.setdefault(topic, [])
        queues.extend([None] * (queue + 1 - len(queues)))
        queues[queue] = shard
        slots = self.slot_maps.get(topic)
        if slots is None:
            slots = self.slot_maps[topic] = array.array("q")
            self.routes[topic] = (slots, shard.topic_b)
        slots.extend([-1] * (queue + 1 - len(slots)))
        slots[queue] = cq.slot
        return shard

    def add_topic(self, topic: str, queue_count: int, created_phys: int) -> tuple[TopicMeta, bool]:
        """Open the queues of `topic` up to `queue_count` (creating its entry at `created_phys` when new); returns
        its metadata and whether it changed (a new topic, more queues)."""
        meta = self.topics.get(topic)
        changed = meta is None or queue_count > meta["queues"]
        if meta is None:
            meta = {"queues": 0, "created": created_phys, "log_start": {}}
            self.topics[topic] = meta
        for queue in range(meta["queues"], queue_count):
            shard = self.open_shard(topic, queue, meta)
            shard.cq.dir.mkdir(parents=True, exist_ok=True)
        meta["queues"] = max(meta["queues"], queue_count)
        return meta, changed

    def drop_topic(self, topic: str) -> list[Shard]:
        """Forget `topic` (UnknownShard if there is none) and close its queues; returns its shards."""
        meta = self.topics.pop(topic, None)
        if meta is None:
            raise UnknownShard(f"unknown topic {topic!r}")
        self.by_topic.pop(topic, None)
        self.slot_maps.pop(topic, None)
        self.routes.pop(topic, None)
        dropped = []
        for queue in range(meta["queues"]):
            shard = self.shards.pop((topic, queue), None)
            if shard is not None:
                self.queue_at.pop(shard.cq.slot, None)
                shard.cq.close()
                dropped.append(shard)
        return dropped

    def close(self) -> None:
        for shard in self.shards.values():
            shard.cq.close()

    def set_log_start(self, shard: Shard, offset: int) -> None:
        shard.log_start = offset
        self.topics[shard.topic]["log_start"][shard.queue] = offset
        self.log_start_version += 1

    # --- queues.json ------------------------------------------------------------------------------------------

    @property
    def meta_path(self) -> Path:
        return self.root / "queues.json"

    def load_meta(self) -> None:
        """Read `queues.json` (or, unreadable or missing, rebuild the topic list from consumequeue/)."""
        try:
            doc = read_json(self.meta_path)
        except Corrupt as exc:
            log.error("file store metadata unreadable (%s); rebuilding it from consumequeue/", exc)
            doc = None
        topics = (doc or {}).get("topics")
        if not isinstance(topics, dict):
            topics = self._scan_cq_dirs()
        self.topics = {}
        for name, meta in topics.items():
            try:
                self.topics[str(name)] = {
                    "queues": int(meta["queues"]),
                    "created": int(meta.get("created", 0)),
                    "log_start": {int(k): int(v) for k, v in dict(meta.get("log_start", {})).items()},
                }
            except (KeyError, TypeError, ValueError):
                log.error("file store metadata for topic %r is malformed; ignoring it", name)
        self.pending_starts = {}
        for entry in (doc or {}).get("pending_starts") or ():
            try:
                topic, queue, first = entry
                self.pending_starts[(str(topic), int(queue))] = int(first)
            except (TypeError, ValueError):
                log.error("file store metadata: pending queue start %r is malformed; ignoring it", entry)

    def _scan_cq_dirs(self) -> dict[str, TopicMeta]:
        topics = {}
        base = self.root / "consumequeue"
        if base.is_dir():
            for tdir in base.iterdir():
                queues = [int(q.name) for q in tdir.iterdir() if q.name.isdigit()] if tdir.is_dir() else []
                if queues:
                    topics[tdir.name] = {"queues": max(queues) + 1, "created": 0}
        return topics

    def meta_doc(self) -> dict[str, Any]:
        out = {}
        for name, meta in self.topics.items():
            out[name] = {
                "queues": meta["queues"],
                "created": meta["created"],
                "log_start": {str(q): s for q, s in meta["log_start"].items() if s},
            }
        doc: dict[str, Any] = {"version": 1, "topics": out}
        if self.pending_starts:
            doc["pending_starts"] = [[t, q, first] for (t, q), first in sorted(self.pending_starts.items())]
        return doc

    async def save_meta(self) -> None:
        await asyncio.to_thread(self.save_meta_now)

    def save_meta_now(self) -> None:
        """`save_meta`, blocking (a replica that moves log starts while it copies its master's log)."""
        atomic_write_json(self.meta_path, self.meta_doc())


__all__ = ["Shard", "ShardRegistry", "TopicMeta"]
