"""Both ends of one replication link over asyncio streams: `MasterLink` (the master streaming its CommitLog to one
replica) and `follow` (a replica pulling from its master). The frames are protocol.py's; the decisions (who is
master, what is in sync, what is committed) belong to the `Replication` that owns them (__init__.py).

The master's side, per replica connection:
  1. read HELLO, refuse what is not a member of this group of this cluster with the same segment size;
  2. answer START: where the replica cuts its log (epochs.truncation_point), this master's history, its commit;
     a replica whose log ends (or diverged) before this master's oldest segment is told to start over there
     (`restart`, with each queue's first offset at that point), as Kafka's follower truncates fully;
  3. stream DATA from there, as fast as the socket drains, and HEARTBEAT while there is nothing new;
  4. read ACKs: each tells the tracker how far the replica holds the log.
The replica's side: connect to the master its view names, HELLO, cut (or empty) its log as START says, adopt the
history, then write each DATA through the engine's `ReplicaLog` (creating topics it does not hold yet through `resolve`)
and ACK what it holds. Any error drops the link; the replica connects again (from its own end) after a pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from mqk.broker.cluster.epochs import truncation_point
from mqk.broker.replication import protocol as P
from mqk.errors import Corrupt, MqkError, ProtocolError, StorageError

if TYPE_CHECKING:
    from mqk.broker.cluster import ClusterMember
    from mqk.broker.replication.tracker import CommitTracker
    from mqk.clock import Clock
    from mqk.store.file.engine import FileEngine


class Replication(Protocol):
    """What a link needs of the `Replication` that owns it (mqk.broker.replication)."""

    member: ClusterMember
    engine: FileEngine
    tracker: CommitTracker
    clock: Clock
    links: dict[int, MasterLink]
    is_master: bool
    master_epoch: int
    following: bool

    def acked(self, node: int, end: int) -> None: ...

    def heard_commit(self, commit: int) -> None: ...

    async def replica_durable(self, end: int) -> None: ...


log = logging.getLogger("mqk.replication")

#: a master's refusal while its epoch is not in its history yet (the moment between its election and the record)
NOT_RECORDED = "this master's epoch is not recorded yet"
#: how soon a replica asks again a master that was not ready (its epoch being recorded: a matter of milliseconds)
NOT_READY_RETRY_S = 0.02


class MasterNotReady(ProtocolError):
    """The master refused the link only because its epoch is not recorded yet: ask again shortly."""


#: how often an idle link carries a heartbeat (and the replica's ack of it)
HEARTBEAT_S = 0.25
#: how long a replica waits before connecting again after a link failed
RETRY_S = 0.2


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    kind, length = P.parse_head(await reader.readexactly(P.HEAD.size))
    return kind, await reader.readexactly(length) if length else b""


#: how long closing a link waits for its transport to finish (wait_closed can wait for good on a dead peer)
CLOSE_WAIT_S = 1.0


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        async with asyncio.timeout(CLOSE_WAIT_S):
            await writer.wait_closed()


class MasterLink:
    """The master's end of one replica's link (see the module docstring)."""

    def __init__(self, repl: Replication, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.repl = repl
        self.reader = reader
        self.writer = writer
        self.node = -1
        self.wake = asyncio.Event()
        self.peer = writer.get_extra_info("peername")

    async def run(self, first: tuple[int, bytes]) -> None:
        """Serve the replica whose first frame (kind, body) was `first` until the link ends."""
        repl = self.repl
        kind, body = first
        try:
            if kind != P.HELLO:
                raise ProtocolError(f"expected HELLO, got frame kind {kind}")
            hello = P.decode_control(kind, body)
            refusal = self._refusal(hello)
            if refusal == NOT_RECORDED:
                log.info(
                    "replication: node %d asked to follow before epoch %d was recorded", self.node, repl.master_epoch
                )
            elif refusal:
                log.warning("replication: refused %s: %s", self.peer, refusal)
            if refusal:
                self.writer.write(P.control(P.REFUSE, {"error": refusal}))
                await self.writer.drain()
                return
            replica_end = P.field(hello, "end", int, "HELLO")
            start = self._start(hello, replica_end)
            engine = repl.engine
            restart = start < engine.log_start
            if restart:
                # the replica's log ends, or parts from this one, before this log's oldest segment: it cannot catch
                # up from there, so it empties its log and copies this one from its start
                start = engine.log_start
            start_doc: dict[str, Any] = {
                "truncate_to": start,
                "log_start": engine.log_start,
                "epoch": repl.master_epoch,
                "history": repl.member.epochs.document(),
                "commit": repl.tracker.commit,
                "restart": restart,
            }
            if restart or (start > 0 and replica_end == 0):
                # (where each queue starts there: an empty replica copying from a later start learns the
                # numbering of queues with no entry left past it only from this)
                start_doc["queue_starts"] = [list(q) for q in engine.queue_starts_at(start)]
            if restart:
                log.warning(
                    "replication: node %d's log (end %d) is behind this master's oldest segment: it starts over at %d",
                    self.node,
                    replica_end,
                    start,
                )
            self.writer.write(P.control(P.START, start_doc))
            log.info("replication: node %d follows from CommitLog offset %d", self.node, start)
            repl.links[self.node] = self
            repl.tracker.replica(self.node, repl.clock.monotonic()).connected = True
            sender = asyncio.get_running_loop().create_task(self._send(start), name=f"mqk-repl-send-{self.node}")
            try:
                await self._receive(sender)
            finally:
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await sender
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass  # the replica went away: it connects again
        except (MqkError, OSError) as exc:
            log.warning("replication: link with node %d (%s) dropped: %s", self.node, self.peer, exc)
        finally:
            if repl.links.get(self.node) is self:
                del repl.links[self.node]
                state = repl.tracker.replicas.get(self.node)
                if state is not None:
                    state.connected = False
            await close_writer(self.writer)

    def _refusal(self, hello: dict[str, Any]) -> str:
        repl = self.repl
        if hello.get("version") != P.VERSION:
            return f"replication protocol version {hello.get('version')!r}, this master speaks {P.VERSION}"
        self.node = P.field(hello, "node", int, "HELLO")
        if hello.get("cluster") != repl.member.node.config.cluster_id or hello.get("group") != repl.member.group:
            return f"node {self.node} is of {hello.get('cluster')}/{hello.get('group')}, not this group"
        if self.node == repl.member.node_id:
            return "a link to itself"
        if not repl.is_master:
            return "this broker is not its group's master"
        if repl.member.epochs.current != repl.master_epoch:
            return NOT_RECORDED
        if hello.get("segment_bytes") != repl.engine.clog.segment_bytes:
            return (
                f"CommitLog segment size {hello.get('segment_bytes')} differs from the master's "
                f"{repl.engine.clog.segment_bytes} (set the same commitlog_segment_bytes on every member)"
            )
        return ""

    def _start(self, hello: dict[str, Any], end: int) -> int:
        epochs = hello.get("epochs", [])
        if not isinstance(epochs, list) or not all(
            isinstance(e, list) and len(e) == 2 and all(isinstance(x, int) for x in e) for e in epochs
        ):
            raise ProtocolError("replication HELLO: epochs must be [[epoch, offset], ...]")
        engine = self.repl.engine
        if end == 0:
            return engine.log_start  # an empty replica starts where the master's log starts
        return truncation_point(self.repl.member.epochs.log_starts(), engine.log_end, epochs, end)

    async def _send(self, pos: int) -> None:
        repl = self.repl
        engine = repl.engine
        writer = self.writer
        tracker = repl.tracker
        clock = repl.clock
        # the log starts go first, whenever one moves, and once more when the replica has caught up (a replica
        # moves a start no further than what it holds)
        starts_sent, caught_up = -1, False
        while True:
            end = engine.log_end
            if engine.registry.log_start_version != starts_sent or (not caught_up and pos >= end):
                caught_up = caught_up or pos >= end
                starts_sent = engine.registry.log_start_version
                writer.write(P.control(P.LOG_STARTS, {"starts": [list(s) for s in engine.log_starts()]}))
            if pos < end:
                chunk = engine.read_log(pos, P.DATA_CHUNK)
                writer.write(P.data_head(pos, tracker.commit, len(chunk)))
                writer.write(chunk)
                pos += len(chunk)
                if pos == engine.log_end:
                    tracker.mark(self.node, pos, clock.monotonic())
                await writer.drain()
                continue
            self.wake.clear()
            tracker.mark(self.node, end, clock.monotonic())
            writer.write(P.heartbeat(end, tracker.commit))
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEARTBEAT_S):
                    await self.wake.wait()

    async def _receive(self, sender: asyncio.Task[None]) -> None:
        repl = self.repl
        while not sender.done():
            kind, body = await read_frame(self.reader)
            if kind != P.ACK:
                raise ProtocolError(f"expected ACK, got frame kind {kind}")
            repl.acked(self.node, P.decode_ack(body))
        sender.result()  # (its error, if it stopped with one)


async def follow(
    repl: Replication,
    address: tuple[str, int],
    master_epoch: int,
    resolve: Callable[[str, int], Awaitable[bool]],
) -> None:
    """Pull the master's CommitLog until cancelled or the link fails (the caller connects again). `resolve(topic,
    queue)` makes the shard exist here and says whether it does (False: its topic is gone; the entry is written
    undispatched)."""
    engine = repl.engine
    rlog = engine.replica_log
    # (asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation that meets the end of what
    # it waits for, and a link that outlives its cancellation keeps its replica off the next master)
    async with asyncio.timeout(5.0):
        reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(
            P.control(
                P.HELLO,
                {
                    "version": P.VERSION,
                    "cluster": repl.member.node.config.cluster_id,
                    "group": repl.member.group,
                    "node": repl.member.node_id,
                    "segment_bytes": engine.clog.segment_bytes,
                    "end": engine.log_end,
                    "epochs": repl.member.epochs.log_starts(),
                },
            )
        )
        await writer.drain()
        async with asyncio.timeout(10.0):
            kind, body = await read_frame(reader)
        doc = P.decode_control(kind, body) if kind in (P.START, P.REFUSE) else {}
        if kind == P.REFUSE:
            if doc.get("error") == NOT_RECORDED:
                raise MasterNotReady(NOT_RECORDED)
            raise ProtocolError(f"the master refused the link: {doc.get('error')}")
        if kind != P.START:
            raise ProtocolError(f"expected START, got frame kind {kind}")
        truncate_to = P.field(doc, "truncate_to", int, "START")
        history = doc.get("history")
        if not isinstance(history, dict):
            raise ProtocolError("replication START: history must be an object")
        epoch = P.field(doc, "epoch", int, "START")
        if _last_epoch(history) != epoch:
            # a history without the master's own epoch, adopted, would make this replica cut a later master's log
            # back to where the missing epoch began (the master refuses links until its epoch is recorded)
            raise ProtocolError(f"the master's epoch history does not end with its epoch {epoch}")
        if doc.get("restart") is True:
            engine.restart_log(truncate_to, _queue_starts(doc))  # (on the loop, as truncate_log: nothing else runs)
        elif "queue_starts" in doc and engine.log_end == 0:
            engine.adopt_queue_starts(_queue_starts(doc))
        elif truncate_to < engine.log_end:
            log.warning(
                "replication: this log diverged from master epoch %d's: cutting it from %d to %d",
                master_epoch,
                engine.log_end,
                truncate_to,
            )
            engine.truncate_log(truncate_to)
        await asyncio.to_thread(repl.member.epochs.adopt, history)
        repl.heard_commit(P.field(doc, "commit", int, "START"))
        start = truncate_to if engine.log_end == 0 else engine.log_end
        rlog.reset(start)
        writer.write(P.ack(engine.log_end))
        await writer.drain()
        log.info("replication: following master epoch %d at %s from CommitLog offset %d", master_epoch, address, start)
        repl.following = True
        while True:
            kind, body = await read_frame(reader)
            if kind == P.DATA:
                offset, commit, data = P.decode_data(body)
                got = rlog.receive(offset, data)
                while got.missing:
                    topic, queue = got.missing[0]
                    if await resolve(topic, queue):
                        got = rlog.receive(offset + len(data), b"")
                    else:
                        rlog.skip_entry()
                        got = rlog.receive(offset + len(data), b"")
                repl.heard_commit(commit)
                await repl.replica_durable(got.end)
                writer.write(P.ack(got.end))
            elif kind == P.HEARTBEAT:
                _end, commit = P.decode_heartbeat(body)
                repl.heard_commit(commit)
                writer.write(P.ack(engine.log_end))
            elif kind == P.LOG_STARTS:
                await engine.adopt_log_starts(_log_starts(P.decode_control(kind, body)))
                continue
            else:
                raise ProtocolError(f"unexpected frame kind {kind} from the master")
            await writer.drain()
    except Corrupt as exc:
        log.error("replication: the master's stream does not check (%s); connecting again", exc)
        rlog.reset(engine.log_end)
        raise
    except StorageError:
        rlog.reset(engine.log_end)
        raise
    finally:
        repl.following = False
        await close_writer(writer)


def _log_starts(doc: dict[str, Any]) -> list[tuple[str, int, int]]:
    """A LOG_STARTS frame's `starts`."""
    return _queue_offsets(doc, "starts", "LOG_STARTS")


def _queue_starts(doc: dict[str, Any]) -> dict[tuple[str, int], int]:
    """A restarting START's `queue_starts` as a dict."""
    return {(topic, queue): offset for topic, queue, offset in _queue_offsets(doc, "queue_starts", "START")}


def _queue_offsets(doc: dict[str, Any], name: str, kind: str) -> list[tuple[str, int, int]]:
    """A control frame's `name` field, [[topic, queue, offset], ...] (queue and offset not negative);
    ProtocolError when it is not that."""
    items = doc.get(name)
    if not isinstance(items, list) or not all(
        isinstance(i, list)
        and len(i) == 3
        and isinstance(i[0], str)
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in i[1:])
        for i in items
    ):
        raise ProtocolError(f"replication {kind}: {name} must be [[topic, queue, offset], ...]")
    return [(topic, queue, offset) for topic, queue, offset in items]


def _last_epoch(history: dict[str, Any]) -> int | None:
    """The newest epoch of a history document (EpochHistory.document()), None if it holds none."""
    epochs = history.get("epochs")
    if not isinstance(epochs, list):
        return None
    return max((e[0] for e in epochs if isinstance(e, list) and e and isinstance(e[0], int)), default=None)


__all__ = ["HEARTBEAT_S", "NOT_READY_RETRY_S", "RETRY_S", "MasterLink", "MasterNotReady", "follow", "read_frame"]
