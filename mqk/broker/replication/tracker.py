"""The master's view of its replicas: how far each holds the CommitLog, which are in sync, the commit offset, and
the produce requests waiting for it.

- `ack(node, end, now)`: a replica holds every byte below `end`. `marks` (what the master had when it sent or
  heartbeated, and when) turn acks into "caught up at": a replica that acks at least the master's end as of time t
  was caught up at t (Kafka's lastCaughtUpTimeMs), the clock an in-sync replica is dropped by after
  `replica.lag.time.max.ms`.
- `commit`: the CommitLog offset every in-sync replica holds (the master's own end counts for itself). It only
  moves forward, and every master starts from the commit offset it last heard as a replica, so a promoted replica
  never shows consumers less than its old master did. Kafka's high watermark, in CommitLog bytes.
- `wait(target, min_insync)`: a produce with acks=all waits until the commit offset passes its entries; it is
  answered NOT_ENOUGH_REPLICAS_AFTER_APPEND when the in-sync set shrank below `min.insync.replicas` meanwhile,
  NOT_LEADER_OR_FOLLOWER when this broker stops being master first (`fail_all`).
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Callable

from mqk import errors as E


class ReplicaState:
    """One replica as the master sees it."""

    __slots__ = ("acked", "caught_up_at", "connected", "marks")

    def __init__(self, caught_up_at: float) -> None:
        #: the replica holds every CommitLog byte below this
        self.acked = 0
        #: the last time the replica held everything the master had
        self.caught_up_at = caught_up_at
        #: (master end, time) at each send and heartbeat, oldest first, until an ack covers them
        self.marks: deque[tuple[int, float]] = deque()
        self.connected = False


class CommitTracker:
    def __init__(self, node_id: int, log_end: Callable[[], int]) -> None:
        self.node_id = node_id
        self.log_end = log_end
        self.replicas: dict[int, ReplicaState] = {}
        #: the in-sync set this master works with (itself included)
        self.isr: frozenset[int] = frozenset({node_id})
        self.commit = 0
        #: (target, arrival number, min.insync.replicas, future): a heap, lowest target first
        self._waiters: list[tuple[int, int, int, asyncio.Future[None]]] = []
        self._arrivals = 0
        #: called whenever the commit offset moves (readers waiting for it, the ISR writer)
        self.on_commit: list[Callable[[int], None]] = []

    # --- life cycle ---------------------------------------------------------------------------------------------

    def reset(self, isr: frozenset[int], commit: int, now: float) -> None:
        """A new mastership: the in-sync set as elected, the commit offset last heard, every replica given a full
        lag allowance from now (nothing is known of them yet)."""
        self.fail_all(E.NotLeaderOrFollowerError("the master changed"))
        self.replicas = {n: ReplicaState(now) for n in isr if n != self.node_id}
        self.isr = frozenset(isr | {self.node_id})
        self.commit = commit
        self._advance()

    def fail_all(self, error: Exception) -> None:
        waiters, self._waiters = self._waiters, []
        for _target, _n, _min_insync, fut in waiters:
            if not fut.done():
                fut.set_exception(error)

    # --- what replicas report -------------------------------------------------------------------------------

    def replica(self, node: int, now: float) -> ReplicaState:
        state = self.replicas.get(node)
        if state is None:
            state = self.replicas[node] = ReplicaState(now if node in self.isr else float("-inf"))
        return state

    def mark(self, node: int, end: int, now: float) -> None:
        """The master sent (or heartbeated) the replica everything up to its end `end` at `now`."""
        marks = self.replica(node, now).marks
        if not marks or marks[-1][0] < end:
            marks.append((end, now))
        elif marks[-1][0] == end:
            marks[-1] = (end, marks[-1][1])

    def ack(self, node: int, end: int, now: float) -> None:
        state = self.replica(node, now)
        state.acked = max(state.acked, end)
        marks = state.marks
        while marks and marks[0][0] <= end:
            state.caught_up_at = max(state.caught_up_at, marks.popleft()[1])
        if end >= self.log_end():
            state.caught_up_at = now
        if node in self.isr:
            self._advance()

    # --- the in-sync set ------------------------------------------------------------------------------------

    def set_isr(self, isr: frozenset[int]) -> None:
        self.isr = frozenset(isr | {self.node_id})
        self._advance()

    def desired_isr(self, now: float, lag_max_s: float, live: set[int]) -> frozenset[int]:
        """What the in-sync set should be now: members still registered and caught up within `lag_max_s`, and
        replicas outside it that hold everything committed and were caught up within it."""
        keep = {self.node_id}
        for node, state in self.replicas.items():
            if node not in live or now - state.caught_up_at > lag_max_s:
                continue
            if node in self.isr or (state.connected and state.acked >= self.commit):
                keep.add(node)
        return frozenset(keep)

    # --- commit and waiters ----------------------------------------------------------------------------------

    def _advance(self) -> None:
        commit = self.log_end()
        for node in self.isr:
            if node != self.node_id:
                state = self.replicas.get(node)
                commit = min(commit, state.acked if state is not None else 0)
        if commit > self.commit:
            self.commit = commit
            for callback in self.on_commit:
                callback(commit)
        waiters = self._waiters
        while waiters and waiters[0][0] <= self.commit:
            _target, _n, min_insync, fut = heapq.heappop(waiters)
            if fut.done():
                continue
            if len(self.isr) < min_insync:
                fut.set_exception(
                    E.NotEnoughReplicasAfterAppendError(
                        f"written, but the in-sync replicas fell to {len(self.isr)}, below {min_insync}"
                    )
                )
            else:
                fut.set_result(None)

    def appended(self) -> None:
        """The master's log grew: with no other in-sync replica that alone moves the commit offset."""
        if len(self.isr) == 1:
            self._advance()

    def wait(self, target: int, min_insync: int) -> asyncio.Future[None]:
        """Done once every in-sync replica holds the CommitLog below `target` (see the module docstring)."""
        fut = asyncio.get_running_loop().create_future()
        self._arrivals += 1
        heapq.heappush(self._waiters, (target, self._arrivals, min_insync, fut))
        self._advance()
        return fut


__all__ = ["CommitTracker", "ReplicaState"]
