"""Moving a partition to another broker group (Kafka's AlterPartitionReassignments): copy, catch up, seal, switch,
and the copy left behind deleted.

In mqk a partition's replicas are the members of the broker group it is placed in, so a reassignment moves it from
one group to another. The controller records each step in the topic's metadata (TopicRecord.moves, written by
mqk.broker.cluster.controller alone); this module does the work between the steps:

1. **start** ("move"): the partition gets a PartitionMove to its target group, state copying. The target's
   reconciler makes the topic there (its queue id there is its partition number, as in every group).
2. **copy**: the target group's master pulls the partition's record batches from the source group's master over
   the replication listener (FETCH / FETCHED frames, replication/protocol.py), from its own end on, below the
   source's high watermark, and appends them as they are, at the same offsets, through its engine (not through
   StoreManager.append: the partition is fenced there, and the timer's hooks must not see a copy). Its own
   replicas get them as any append. A gap in the source's offsets (a batch compaction removed, a log start past
   the copy's end) is kept as an empty batch spanning it, what Kafka's own compaction leaves for a producer's
   last batch, which every client skips.
3. **seal** ("move-seal"): once a pull reaches the source's high watermark, the copier asks the controller to seal
   the move. Every broker of the source group fences the partition (StoreManager.fence, from the view:
   mqk.broker.cluster.reconcile): its producers get NOT_LEADER_OR_FOLLOWER and retry, and its end is final. The
   source says "sealed" in its FETCHED answers only once its own fence is up.
4. **switch** ("move-switch"): once the copy holds the sealed source's end and every in-sync replica of the target
   group holds the copy, the copier asks the controller to switch: the partition is placed in the target group,
   with a leader epoch above every one it had (TopicRecord.epoch_bases) and its arrival recorded for
   OffsetForLeaderEpoch. Clients learn the new leader from Metadata; consumers keep their offsets.
5. **delete**: the source group's reconciler deletes the records of a partition that left it (TopicRecord.departures,
   written by the switch), or the whole topic when no partition of it is left in the group.

A move can be cancelled (AlterPartitionReassignments with null replicas, or with the partition's current replicas)
until it switches: the switch is one compare-and-set of the topic record, refused for a cancelled move. The copier
itself cancels a move it cannot finish without losing records, with a log line saying why: a partition moving back
to a group it left, whose records there were deleted, while the source still holds records from before it left (a
group's copy only grows at its end; deleting those records at the source, or waiting for retention, lets it go).
The copier runs on the target group's master only, and starts again from its own end after a failover on either
side.

RocketMQ clients see a partition's queue in the group it is in: a group numbers its queues in partition order
(mqk.server.native), so a move renumbers the queues of both groups after it; RocketMQ clients re-read their routes
and rebalance; the offsets they committed for the moved queue (to the source's group, as RocketMQ keeps them with
a queue's broker) come along with the partition's share group states before the switch (PARTITION_STATES).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from mqk._fast import load
from mqk.broker.cluster.model import MOVE_SEALED, PartitionMove, TopicRecord
from mqk.broker.replication import protocol as P
from mqk.broker.replication.link import close_writer, read_frame
from mqk.errors import MqkError, ProtocolError, StorageError
from mqk.protocol.kafka.aborted import AbortedScan
from mqk.store.adapter import GroupOffset, store_time_ms

if TYPE_CHECKING:
    from mqk.broker.cluster import ClusterMember
    from mqk.broker.replication import Replication
    from mqk.store.adapter import Buffer, StorageAdapter
    from mqk.store.manager import StoreManager

log = logging.getLogger("mqk.moves")
recbatch = load("recbatch")
#: a batch's base offset and length fields, which its length does not count
BATCH_LOG_OVERHEAD = 12

#: how much one pull asks for
FETCH_BYTES = 1 << 20
#: how long the copier waits before it pulls again when the source had nothing new
IDLE_S = 0.05
#: how long the copier waits after a failed pull, or for a source group without a master
RETRY_S = 0.5
#: the most offsets one empty batch spans (its last offset delta is an int32)
GAP_SPAN = (1 << 31) - 1
#: how long a pull waits for the source's answer (a paused source: its group elects another master meanwhile)
PULL_TIMEOUT_S = 5.0
#: how long the copier waits for the target's in-sync replicas to hold the copy before it asks again
REPLICATED_WAIT_S = 10.0


class Unmovable(MqkError):
    """The copy cannot be finished without losing records: the move is cancelled."""


class PartitionMoves:
    """This broker's part in moving partitions between groups: the source's answers to FETCH, and the copiers
    of the partitions moving into its group while it is that group's master."""

    def __init__(self, member: ClusterMember, store: StoreManager, replication: Replication) -> None:
        self.member = member
        self.store = store
        self.replication = replication
        self._copiers: dict[tuple[str, int], asyncio.Task[None]] = {}
        #: (topic, partition) -> offsets the copy still lacks, as of its last pull (DescribeLogDirs' offset lag)
        self.lags: dict[tuple[str, int], int] = {}
        #: Kafka transactions (set by the runtime): whether one is under way in a partition (a source seals only
        #: without one), and where a copy's aborted transactions go before the partition is served here
        self.under_way: Callable[[str, int], bool] | None = None
        self.adopt_aborted: Callable[[str, int, Sequence[tuple[int, int, int]]], Awaitable[None]] | None = None
        #: share groups' record states (set by the runtime): given by a source, taken by a target, before the switch
        self.share_states: ShareStates | None = None
        self._stopped = False

    def start(self) -> None:
        self.replication.partition_reads = self.serve_fetch
        self.member.view.add_listener(self._copy_what_moves_here)
        self.member.node.on_role.append(self._copy_what_moves_here)
        self._copy_what_moves_here()

    async def stop(self) -> None:
        self._stopped = True
        for task in list(self._copiers.values()):
            task.cancel()
        for task in list(self._copiers.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._copiers.clear()

    def lag(self, topic: str, partition: int) -> int:
        return self.lags.get((topic, partition), 0)

    # --- the target: one copier per partition moving into this group ------------------------------------------

    def _copy_what_moves_here(self) -> None:
        if self._stopped:
            return
        member = self.member
        wanted: set[tuple[str, int]] = set()
        if member.node.leading:
            for name, record in member.topics().items():
                for move in record.moving_into(member.group):
                    wanted.add((name, move.partition))
        for key, task in list(self._copiers.items()):
            if task.done():
                del self._copiers[key]
                self.lags.pop(key, None)
            elif key not in wanted:
                task.cancel()  # (cancelled, switched, or this broker is no longer master: it ends at its next await)
        for key in wanted - set(self._copiers):
            self._copiers[key] = asyncio.get_running_loop().create_task(
                self._copy(*key), name=f"mqk-move-{key[0]}-{key[1]}"
            )

    def _move(self, topic: str, partition: int) -> tuple[TopicRecord, PartitionMove] | None:
        """The topic and the move of `partition` into this group, while there is one and this broker leads."""
        record = self.member.topic(topic)
        if record is None:
            return None
        move = record.move_of(partition)
        if move is None or move.target != self.member.group or not self.member.node.leading:
            return None
        return record, move

    async def _copy(self, topic: str, partition: int) -> None:
        asked_seal = False
        #: (source node, reader, writer) of the connection to the source group's master
        link: tuple[int, asyncio.StreamReader, asyncio.StreamWriter] | None = None
        scan: AbortedScan | None = None
        try:
            while (found := self._move(topic, partition)) is not None:
                record, move = found
                master = self.member.view.master_of(record.partitions[partition][0])
                broker = self.member.view.broker(master.node_id) if master is not None else None
                address = broker.address("replication") if broker is not None else None
                if broker is None or address is None:
                    await asyncio.sleep(RETRY_S)
                    continue
                try:
                    if scan is None:  # (the topic is made here by the reconciler, maybe a moment after the move)
                        scan = await self._scan_copy(topic, partition)
                    if link is None or link[0] != broker.node_id:
                        if link is not None:
                            await close_writer(link[2])
                            link = None
                        reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), 5.0)
                        link = (broker.node_id, reader, writer)
                    done = await self._pull(topic, partition, record, link[1], link[2], move, asked_seal, scan)
                except Unmovable:
                    raise
                except (OSError, asyncio.IncompleteReadError, TimeoutError, MqkError) as exc:
                    # (the link, the source's answer, the store, etcd or the controller: the step is tried again)
                    log.info(
                        "moves: copying %s-%d from node %d: %s; again shortly", topic, partition, broker.node_id, exc
                    )
                    if link is not None:
                        await close_writer(link[2])
                        link = None
                    await asyncio.sleep(RETRY_S)
                    continue
                if done == "switched":
                    return
                if done in ("sealing", "unsealed"):
                    asked_seal = done == "sealing"
                elif done == "idle":
                    await asyncio.sleep(IDLE_S)
        except Unmovable as exc:
            log.error(
                "moves: %s-%d cannot move to group %s: %s; the move is cancelled",
                topic,
                partition,
                self.member.group,
                exc,
            )
            with contextlib.suppress(MqkError):
                await self.member.change_topic("move", topic, partitions=partition, group="")
        except Exception:  # a bug must not end a copier unseen: logged; the next change of the view starts it again
            log.exception("moves: copying %s-%d failed", topic, partition)
        finally:
            if link is not None:
                await close_writer(link[2])

    async def _pull(
        self,
        topic: str,
        partition: int,
        record: TopicRecord,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        move: PartitionMove,
        asked_seal: bool,
        scan: AbortedScan,
    ) -> str:
        """One pull and what it leads to: "switched" (the move is done), "sealing" (the seal was asked for),
        "unsealed" (a transaction got under way before the seal: the move copies again), "more" (pull again now),
        "idle" (pull again shortly). `scan` sees every batch the copy takes."""
        store = self.store
        engine = store.engine_of(topic)
        end = store.end_offset(topic, partition)
        request = {
            "cluster": self.member.keys.root,
            "topic": topic,
            "topic_id": record.topic_id,
            "partition": partition,
            "offset": end,
            "max_bytes": FETCH_BYTES,
        }
        source_start, source_end, high_watermark, flags, batches = await _ask(reader, writer, request)
        start = store.log_start_offset(topic, partition)
        if end > source_end:
            raise Unmovable(f"this group's copy ends at {end}, past the source's end {source_end}")
        left_at = record.departure(partition, self.member.group)
        if left_at is not None and source_start < start:
            raise Unmovable(
                f"it left this group at offset {left_at} and its records here were deleted up to {start}; the "
                f"source still holds them from {source_start}"
            )
        if end < source_start and not batches:
            # the source's log starts past the copy's end: ask from its start (which may lie inside a batch: the
            # batch comes whole, and the log start here moves to the source's below)
            request["offset"] = source_start
            source_start, source_end, high_watermark, flags, batches = await _ask(reader, writer, request)
            if not batches:
                end = await self._skip(topic, partition, end, min(source_start, high_watermark), engine)
        pos, size = 0, len(batches)
        while pos < size:
            if size - pos < recbatch.HEADER_SIZE:
                raise ProtocolError("a FETCHED frame ends inside a batch header")
            header = recbatch.parse_header(batches, pos)
            base, length, last_delta = header[0], header[1], header[6]
            whole = length + BATCH_LOG_OVERHEAD
            if whole > size - pos:
                raise ProtocolError("a FETCHED frame ends inside a batch")
            following = base + last_delta + 1
            if following > end:
                if base < end:
                    raise Unmovable(f"the source's batch [{base}, {following}) straddles the copy's end {end}")
                if base > end:
                    end = await self._skip(topic, partition, end, base, engine)
                batch = batches[pos : pos + whole]
                result = await engine.append(topic, partition, [batch])
                if result.base_offset != base:
                    raise StorageError(
                        f"the copy of {topic}-{partition} took the batch at {base} at offset {result.base_offset}"
                    )
                scan.feed(base, batch)
                end = following
            pos += whole
        if start < source_start <= end:  # (the source's log start moved: here too)
            await store.delete_before(topic, partition, source_start)
        self.lags[(topic, partition)] = max(0, source_end - end)
        if end < high_watermark:
            return "more"
        if end < source_end:
            return "idle"  # (the source's replicas hold less than it: its high watermark will move)
        stable = bool(flags & P.FETCHED_STABLE)
        group = self.member.group
        if not flags & P.FETCHED_SEALED:
            # (sealed only with no transaction under way in it: its markers could not be written once it is)
            if stable and move.state != MOVE_SEALED and not asked_seal:
                await self.member.change_topic("move-seal", topic, partitions=partition, group=group)
                return "sealing"
            return "idle"
        if not stable:  # a transaction got its first records in just before the seal: unseal, let it end, again
            log.info("moves: %s-%d: a transaction is under way at the source; unsealed until it ends", topic, partition)
            await self.member.change_topic("move", topic, partitions=partition, group="")
            await self.member.change_topic("move", topic, partitions=partition, group=group)
            return "unsealed"
        # the source is sealed and the copy holds its every record: once this group's in-sync replicas hold them
        # too, and its transaction coordinator knows the aborted transactions in them, the partition is this group's
        await self.replication.wait_replicated(self.replication.engine.log_end, 1, REPLICATED_WAIT_S)
        if scan.aborted and self.adopt_aborted is not None:
            await self.adopt_aborted(topic, partition, scan.aborted)
        writer.write(P.control(P.PARTITION_STATES, {k: v for k, v in request.items() if k != "offset"}))
        await writer.drain()
        await self._take_states(topic, partition, await _answer(reader, P.PARTITION_STATES))
        await self.member.change_topic("move-switch", topic, partitions=partition, group=group, offset=end)
        log.info("moves: %s-%d moved to group %s at offset %d", topic, partition, group, end)
        return "switched"

    async def _scan_copy(self, topic: str, partition: int) -> AbortedScan:
        """An AbortedScan of what this group's copy already holds (a copier that starts again after a failover
        rebuilds what the last one saw)."""
        store = self.store
        start, end = store.offset_bounds(topic, partition)
        scan = AbortedScan(start)
        offset = start
        while offset < end:
            result = await store.read(topic, partition, offset, FETCH_BYTES)
            if not result.batches:
                break
            for batch in result.batches:
                scan.feed(batch.base_offset, batch.data)
            offset = result.next_offset
        return scan

    async def _take_states(self, topic: str, partition: int, body: bytes) -> None:
        """Take what the source keeps beside the partition's records (a PARTITION_STATES answer): its share groups'
        states, and the consumer offsets committed to the source's group for it (RocketMQ consumers commit to the
        queue's broker), each one a group has not committed here already."""
        doc = P.decode_control(P.PARTITION_STATES, body)
        share, offsets = doc.get("share"), doc.get("offsets")
        if not isinstance(share, dict) or not isinstance(offsets, dict):
            raise ProtocolError("replication PARTITION_STATES: share and offsets must be objects")
        if self.share_states is not None:
            try:
                await self.share_states.take(topic, partition, share)
            except ValueError as exc:
                raise ProtocolError(str(exc)) from None
        store = self.store
        for group, value in sorted(offsets.items()):
            if not (
                isinstance(value, list) and len(value) == 2 and type(value[0]) is int and isinstance(value[1], str)
            ):
                raise ProtocolError(f"replication PARTITION_STATES: group {group!r}'s offset is not [offset, metadata]")
            if (topic, partition) not in store.fetch_offsets(group):
                committed = GroupOffset(value[0], value[1], store_time_ms())
                await store.commit_offsets(group, {(topic, partition): committed})

    async def _skip(self, topic: str, partition: int, end: int, to: int, engine: StorageAdapter) -> int:
        """Keep the source's gap [end, to) a gap here: empty batches spanning it (see the module docstring)."""
        while end < to:
            span = min(to - end, GAP_SPAN)
            empty = recbatch.build_batch(end, -1, -1, b"", 0, span - 1)
            await engine.append(topic, partition, [empty])
            end += span
        return end

    # --- the source: FETCH answered ----------------------------------------------------------------------------

    async def serve_fetch(self, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer a copier's FETCH frames (the first one's body is `first`) until it goes away."""
        peer = writer.get_extra_info("peername")
        kind, body = P.FETCH, first
        try:
            while True:
                request = P.decode_control(kind, body)
                refusal = self._refusal(request)
                if refusal:
                    frame: list[Buffer] = [P.control(P.REFUSE, {"error": refusal})]
                elif kind == P.FETCH:
                    frame = await self._fetched(request)
                else:
                    frame = [await self._partition_states(request)]
                for part in frame:
                    writer.write(part)
                await writer.drain()
                kind, body = await read_frame(reader)
                if kind not in (P.FETCH, P.PARTITION_STATES):
                    raise ProtocolError(f"expected FETCH or PARTITION_STATES, got frame kind {kind}")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except (MqkError, OSError) as exc:
            log.warning("moves: a copier (%s) dropped: %s", peer, exc)
        finally:
            await close_writer(writer)

    def _refusal(self, request: dict[str, object]) -> str:
        """Why this broker does not answer a copier's request for a partition ("" when it does)."""
        member = self.member
        topic = P.field(request, "topic", str, "FETCH")
        partition = P.field(request, "partition", int, "FETCH")
        record = member.topic(topic)
        info = self.store.topic(topic)
        if request.get("cluster") != member.keys.root:
            return "another cluster"
        if record is None or record.topic_id != request.get("topic_id") or info is None:
            return f"no topic {topic} with that id here"
        if not 0 <= partition < min(len(record.partitions), info.queue_count):
            return f"no partition {topic}-{partition}"
        if record.partitions[partition][0] != member.group or not member.node.leading:
            return f"{topic}-{partition} is not led here"
        return ""

    async def _partition_states(self, request: dict[str, object]) -> bytes:
        """The PARTITION_STATES answer: the partition's share group states and the consumer offsets committed here
        for it (asked once it is sealed)."""
        topic = P.field(request, "topic", str, "PARTITION_STATES")
        partition = P.field(request, "partition", int, "PARTITION_STATES")
        share = {} if self.share_states is None else await self.share_states.give(topic, partition)
        store = self.store
        offsets = {}
        for group in store.list_offset_groups():
            committed = store.fetch_offsets(group).get((topic, partition))
            if committed is not None and committed.offset >= 0:
                offsets[group] = [committed.offset, committed.metadata or ""]
        return P.control(P.PARTITION_STATES, {"share": share, "offsets": offsets})

    async def _fetched(self, request: dict[str, object]) -> list[Buffer]:
        """The FETCHED frame (its parts) for one FETCH of a partition led here."""
        topic = P.field(request, "topic", str, "FETCH")
        partition = P.field(request, "partition", int, "FETCH")
        offset = P.field(request, "offset", int, "FETCH")
        max_bytes = min(max(P.field(request, "max_bytes", int, "FETCH"), 1), P.FETCHED_MAX)
        store = self.store
        start, end = store.offset_bounds(topic, partition)
        high_watermark = self.replication.committed_end(topic, partition, end)
        # (read after the bounds: the fence is up before those bounds were taken, or they may still grow)
        sealed = store.fenced(topic, partition)
        under_way = self.under_way is not None and self.under_way(topic, partition)
        parts: list[Buffer] = []
        size = 0
        if start <= offset < high_watermark:
            result = await store.read(topic, partition, offset, max_bytes)
            for batch in result.batches:
                if batch.base_offset >= high_watermark or size + len(batch.data) > P.FETCHED_MAX:
                    break
                parts.append(batch.data)
                size += len(batch.data)
        flags = (P.FETCHED_SEALED if sealed else 0) | (0 if under_way else P.FETCHED_STABLE)
        return [P.fetched_head(start, end, high_watermark, flags, size), *parts]


async def _ask(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: dict[str, object]
) -> tuple[int, int, int, int, memoryview]:
    """One FETCH and its answer: the source's (log start, end, high watermark, flags, record batches)."""
    writer.write(P.control(P.FETCH, request))
    await writer.drain()
    return P.decode_fetched(await _answer(reader, P.FETCHED))


async def _answer(reader: asyncio.StreamReader, expected: int) -> bytes:
    """The source's next frame, of kind `expected` (its body); ProtocolError for a refusal or another kind."""
    kind, body = await asyncio.wait_for(read_frame(reader), PULL_TIMEOUT_S)
    if kind == P.REFUSE:
        raise ProtocolError(f"the source refused: {P.decode_control(kind, body).get('error')}")
    if kind != expected:
        raise ProtocolError(f"expected {P.KIND_NAMES[expected]}, got frame kind {kind}")
    return body


class ShareStates(Protocol):
    """The share groups' record states of a partition, as a moving partition takes them along (the runtime gives
    the broker's share group engine: mqk.groups.share)."""

    async def give(self, topic: str, partition: int) -> dict[str, Any]:
        """Each share group's state of the partition, as it is saved."""

    async def take(self, topic: str, partition: int, states: dict[str, Any]) -> None:
        """Take (and save) states another broker group gave; ValueError for ones that do not read."""


__all__ = ["PartitionMoves", "ShareStates", "Unmovable"]
