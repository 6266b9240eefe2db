"""The file engine's recovery (RocketMQ's recoverNormally / recoverAbnormally, one pass for both): what a start does
before anything is served.

Runs at every start, off the event loop, from the older of the checkpoint's safe offset and the start of the last
RECOVER_SEGMENTS segments:
1. load queues.json, the CommitLog segments and every ConsumeQueue;
2. cut each ConsumeQueue back to the units of entries below that point (those are durable and intact);
3. scan the CommitLog forward with CRC checks, re-dispatching every entry (`ReputMessageService.dispatch`, which
   also shows it to the dispatch hooks); the log is cut at the first bad entry (logged with its
   position; everything before it is served). A bad last entry with only zeros after it is a torn tail; anything
   after it is damage in the middle, and the entries after it cannot be trusted to line up either;
4. a ConsumeQueue found missing units for entries before the scan start (a damaged tail) is rebuilt from the
   CommitLog from its last intact unit on;
5. cut every ConsumeQueue to the recovered CommitLog end and write a new checkpoint.

Owns the invariant that after a start every published unit points at a whole, CRC-checked CommitLog entry below the
log's end, whatever state a crash (kill -9 between any two steps of an append) left the files in.
"""

from __future__ import annotations

import logging
from typing import Any

from mqk.store.file.checkpoint import AbortMarker, Checkpoint
from mqk.store.file.commitlog import CommitLog
from mqk.store.file.dispatch import ReputMessageService
from mqk.store.file.mapped_file import MappedFile
from mqk.store.file.shards import Shard, ShardRegistry

log = logging.getLogger(__name__)

#: segments always re-verified at start (RocketMQ's recoverNormally checks the last three files)
RECOVER_SEGMENTS = 3


class Recovery:
    def __init__(
        self,
        clog: CommitLog,
        registry: ShardRegistry,
        dispatcher: ReputMessageService,
        checkpoint: Checkpoint,
        abort: AbortMarker,
        now_ms: Any,
    ) -> None:
        self.clog = clog
        self.registry = registry
        self.dispatcher = dispatcher
        self.checkpoint = checkpoint
        self.abort = abort
        self._now_ms = now_ms
        #: what the last run found, for tests and operators
        self.report: dict[str, Any] = {}

    def run(self) -> dict[str, Any]:
        """Blocking start-up work (see the module docstring). Returns the report."""
        registry = self.registry
        clog = self.clog
        abnormal = self.abort.exists()
        self.checkpoint.load()
        registry.load_meta()
        self.abort.create()
        clog.load()
        for topic, meta in registry.topics.items():
            for queue in range(meta["queues"]):
                registry.open_shard(topic, queue, meta).cq.load()
        files = clog.mfq.files
        report: dict[str, Any] = {
            "abnormal": abnormal,
            "scan_start": 0,
            "end": 0,
            "entries": 0,
            "error": None,
            "torn_tail": False,
            "repaired_queues": [],
        }
        self.report = report
        if not files:
            for shard in registry.shards.values():
                shard.cq.recover(0)
                _fix_empty(shard)
            clog.mfq.prepare_next()
            return report
        first = files[0].start_offset
        scan_start = files[max(0, len(files) - RECOVER_SEGMENTS)].start_offset
        if not self.checkpoint.loaded:
            scan_start = first
        elif self.checkpoint.safe_offset < scan_start:
            scan_start = max(first, self.checkpoint.safe_offset)
        report["scan_start"] = scan_start
        for shard in registry.shards.values():
            shard.cq.recover(scan_start)
        broken: dict[Shard, int] = {}  # shard -> CommitLog offset its rebuild starts at
        n = 0
        for phys, entry, mf in clog.scan(scan_start):
            n += 1
            self._replay(phys, entry, mf, broken, scan_start)
        end = clog.scan_end
        report["entries"] = n
        report["end"] = end
        if clog.scan_error is not None:
            err = clog.scan_error
            torn = not clog.has_data_after(end + clog.claimed_size(end))
            report["error"] = str(err)
            report["torn_tail"] = torn
            if torn:
                log.warning("CommitLog: torn tail at %d (%s); cutting it", end, err)
            else:
                log.error("CommitLog damaged: %s; serving everything before %d and cutting the log there", err, end)
        # after a clean stop the log ends where its writer stopped and nothing lies past it: only an abnormal stop
        # or a damaged log has a tail to zero (a torn write must not be read back later)
        clog.truncate(end, zero_tail=abnormal or clog.scan_error is not None)
        # data read back after a crash may sit only in the page cache: make it durable before building on it
        last = clog.mfq.last
        if last is not None:
            last.flushed = 0
        clog.flush()
        if broken:
            self._rebuild(broken, end)
            report["repaired_queues"] = sorted(f"{s.topic}-{s.queue}" for s in broken)
        for shard in registry.shards.values():
            shard.cq.truncate_to_phys(end)
            _fix_empty(shard)
            shard.cq.flush()
            shard.cq.dirty_since_phys = -1  # (flushed just now)
        self.dispatcher.dispatched = end
        try:
            self.checkpoint.store(end, end, self._now_ms())
        except OSError as exc:
            # a full disk must not keep the broker from starting: the checkpoint on disk is the previous one,
            # whose offsets are below what was just recovered and flushed (the next start scans a little more);
            # the checkpoint loop writes a new one once there is room
            log.warning("checkpoint not written at start-up (%s): the previous one stands", exc)
        clog.mfq.prepare_next()
        if abnormal or clog.scan_error is not None:
            log.warning(
                "file store recovered (abnormal=%s): replayed %d entries from %d, log ends at %d",
                abnormal,
                n,
                scan_start,
                end,
            )
        return report

    def _replay(
        self,
        phys: int,
        entry: tuple[Any, ...],
        mf: MappedFile,
        broken: dict[Shard, int],
        scan_start: int,
        only: dict[Shard, int] | None = None,
    ) -> None:
        (_, size, queue_id, _flags, queue_offset, _phys, record_count, store_ts, max_ts, tags_code, topic, body_pos) = (
            entry
        )
        shard = self.registry.shards.get((topic, queue_id))
        if shard is None or phys < shard.created_phys:
            return  # a deleted topic, or an earlier incarnation of this name
        if only is not None:
            if shard not in only or phys < only[shard]:
                return
        elif shard in broken:
            return
        cq = shard.cq
        if queue_offset < cq.end_offset:
            if only is None:
                log.error(
                    "recovery: %s-%d entry at %d has offset %d below the queue end %d; skipped",
                    topic,
                    queue_id,
                    phys,
                    queue_offset,
                    cq.end_offset,
                )
            return
        if queue_offset > cq.end_offset and only is None:
            resume = cq.last_unit_end_phys()
            if resume < scan_start:
                # units for entries before the scan start are missing (damaged queue tail): rebuild later
                broken[shard] = max(resume, shard.created_phys, self.clog.min_offset)
                log.error(
                    "ConsumeQueue %s-%d is missing offsets %d..%d; rebuilding it from the CommitLog",
                    topic,
                    queue_id,
                    cq.end_offset,
                    queue_offset - 1,
                )
                return
            log.error(
                "recovery: %s-%d has a gap at offsets %d..%d (entry at %d)",
                topic,
                queue_id,
                cq.end_offset,
                queue_offset - 1,
                phys,
            )
        body = mf.buf[body_pos : phys - mf.start_offset + size]
        self.dispatcher.dispatch(shard, phys, size, record_count, tags_code, store_ts, max_ts, queue_offset, None, body)

    def _rebuild(self, broken: dict[Shard, int], end: int) -> None:
        for shard, start in broken.items():
            shard.cq.recover(start)
        start = min(broken.values())
        for phys, entry, mf in self.clog.scan(start):
            if phys >= end:
                break
            self._replay(phys, entry, mf, {}, start, only=broken)


def _fix_empty(shard: Shard) -> None:
    """A queue without units keeps its numbering from the metadata (everything before was deleted)."""
    if len(shard.cq) == 0 and shard.cq.end_offset < shard.log_start:
        shard.cq.end_offset = shard.log_start


__all__ = ["RECOVER_SEGMENTS", "Recovery"]
