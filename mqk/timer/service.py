"""TimerService: delayed and scheduled delivery for both protocols (RocketMQ's TimerMessageStore, simplified).

Arrival: a put-hook on the store (`store.hooks`) looks at every append; a delayed one (see `mqk.timer.delay`) is
rerouted, as one wrapped record per batch, to the internal timer topic `__mqk_timer`, so it is in the CommitLog,
durable, before the producer is acknowledged. The producer's answer then names the timer topic's offset (RocketMQ
answers with its schedule topic's offset the same way). A delay beyond `BrokerConfig.timer_max_delay_ms` is refused
(`PutRejected`, MESSAGE_ILLEGAL over remoting).

Scheduling: a reader follows the timer topic (woken by the store's data listener). A message due within
`HORIZON_MS` goes into an in-memory `SortedList` of (due, timer offset); one due later goes into the spill index
(`mqk.timer.wheel.SpillIndex`: 24 bytes in a scratch file `timer/spill.idx` under the data directory, chained per
second of due time, as RocketMQ's TimerLog and TimerWheel keep them), so the memory the schedule holds grows with the
messages due soon, not with all that are pending (a spilled message's payload is read back from the timer topic
when it is due). A deliverer sleeps until the head is due or the next spilled
bucket comes within the horizon (on the injected `Clock`, which also says what "now" is for due times, so tests move
time with a `FakeClock` instead of waiting for it), moves such buckets into the `SortedList`, and re-appends due
batches, byte for byte, to their real topic and queue, with their tags code and keys. Its own re-appends are
recognised by a context variable set in the deliverer task and pass the hook untouched.

A record the timer cannot read (not one `wrap` made: written by hand before Kafka clients were kept out of the
timer topic, or by another build) never stops it: it is logged, counted (`unreadable`) and skipped as if delivered
(`_skip`), at start and while running alike, so a broker always starts and every readable message is delivered.

Restart without loss or duplicates: the state document `timer` holds `floor` (every timer offset below it is
delivered), `covered` (rectangles [scanned, below]: every offset below `scanned` due before `below` is delivered,
`mqk.timer.wheel.Coverage`), `done` (the other delivered offsets above the floor, as runs) and `intent` (the burst
being delivered: offsets with their real queue's end offset before the appends); in memory, the delivered offsets
above the floor are a bitmap based at the floor (`mqk.timer.wheel.DoneSet`). Messages go out in due order, so the
floor stays at the oldest one waiting; the rectangles keep the document a few lines long however the due times of
what lies above it are spread. The intent is saved before a burst's re-appends and the rest after them (the next
burst's save, or a stop cutting a burst short, carries it). At start each open intent is settled by looking for its
batch (same length and CRC) in its real queue after the recorded end offset; then the reader rebuilds the schedule
(spill index included: it is recreated empty) by re-reading the timer topic from the floor, in the background: the
broker serves meanwhile, and delivery (and saving) begins once that read has reached the topic's end.

Where the document lives (mqk.store.statelog): a broker on its own keeps it in a side file (store.save_state:
atomic + fsync). A cluster broker keeps it in the log, as the records of the compacted internal topic
`__mqk_timer_state` (the last record is the document), and runs as `standby`: it takes delayed messages (the hook)
always, but reads the schedule and delivers only while it is its group's master (`activate` when it becomes
master, `deactivate` when it stops; `may_deliver` is checked before every append, so a broker that just lost its
mastership appends nothing more). A new master thus loads the document its predecessor saved, settles the
predecessor's open intent against the real queues it replicated, and delivers what is left, once. A topic of its
own rather than records in the timer topic: the timer topic's offsets are the messages `floor` and `done` count,
and a load reads one record (the last) instead of scanning the timer topic for the last marker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from sortedcontainers import SortedList

from mqk._fast import load
from mqk.clock import SYSTEM_CLOCK, Clock, wait_event
from mqk.config import BrokerConfig, TopicConfig
from mqk.errors import PutRejected, ShardExists, StorageError, UnknownShard
from mqk.store.adapter import PutContext, delayed_only
from mqk.store.statelog import LogStateDocs, SideStateDocs, StateDocs
from mqk.timer.delay import (
    Waiting,
    batch_may_be_delayed,
    decoded_batch_due_time,
    due_time,
    recall_record,
    unique_key,
    unwrap,
    wrap,
)
from mqk.timer.wheel import NO_DUE, Coverage, DoneSet, SpillIndex

log = logging.getLogger("mqk.timer")
recbatch = load("recbatch")

TIMER_TOPIC = "__mqk_timer"
#: cluster mode: the timer's state document, kept in the log (see the module docstring)
TIMER_STATE_TOPIC = "__mqk_timer_state"
#: true in the deliverer task's context: its re-appends (still carrying their delay headers) pass the hook. A
#: context variable rather than batch identity, so a hook that copies batches cannot make a message loop.
DELIVERING: contextvars.ContextVar[bool] = contextvars.ContextVar("mqk_timer_delivering", default=False)
STATE_NAME = "timer"
#: re-appends per delivery burst (one state save per burst, plus one when the due backlog is cleared)
BURST = 4096
_READ_BYTES = 4 << 20
#: timer records the reader handles between two yields to the event loop
READ_SLICE = 512
#: payload reads from the timer topic in flight at once while a burst is prepared
LOAD_CONCURRENCY = 64
#: memory the timer may hold for waiting payloads; beyond it payloads are re-read from the timer topic when due
PAYLOAD_BUDGET = 64 << 20
#: what a cached payload costs beyond its batch's bytes (its `Waiting`, topic string, keys tuple and dict slot),
#: counted against PAYLOAD_BUDGET so that many small messages cannot hold far more than the budget
PAYLOAD_OVERHEAD = 256
#: messages due within this much of now are kept in memory; later ones wait in the spill index. A minute keeps the
#: in-memory schedule to what a minute of due traffic holds while promotions (one chain walk per bucket) stay rare
HORIZON_MS = 60_000
#: the spill index's bucket width: a bucket is moved into memory whole, once its start is within the horizon
BUCKET_MS = 1000
#: in-memory schedule entries beyond which buckets not yet due stay spilled (the horizon shrinks for them), so a
#: burst of messages all due within one minute does not pull them all into memory ahead of time
SCHEDULE_CAP = 250_000
#: the longest the deliverer sleeps at once (it re-reads the schedule's head when it wakes)
MAX_WAIT_SECONDS = 3600.0


class TimerService:
    def __init__(
        self,
        config: BrokerConfig,
        store: Any,
        *,
        clock: Clock = SYSTEM_CLOCK,
        standby: bool = False,
        may_deliver: Callable[[], bool] | None = None,
    ) -> None:
        """`standby` (cluster mode): the state document lives in the log, and the schedule is read and delivered
        only between `activate` and `deactivate`; `may_deliver` says whether this broker may append now (its
        group's master), asked before every append while standby."""
        self.config = config
        self.store = store
        self.clock = clock
        self.standby = standby
        self.may_deliver = may_deliver or (lambda: True)
        self.docs: StateDocs = LogStateDocs(store, TIMER_STATE_TOPIC) if standby else SideStateDocs(store)
        #: the floor of the last document saved or loaded (what retention may not pass)
        self.saved_floor = 0
        self.max_delay_ms = config.timer_max_delay_ms
        self._schedule: SortedList = SortedList()  # (due, timer offset), every one due in a bucket <= _horizon
        data_dir = getattr(getattr(store, "config", None), "data_dir", None)
        spill_path = data_dir / "timer" / "spill.idx" if getattr(store, "persistent", False) and data_dir else None
        self._spill = SpillIndex(spill_path, BUCKET_MS)  # the rest, every one due in a bucket > _horizon
        self._horizon = 0  # the last bucket of due time kept in memory (only grows until a reset)
        self._floor = 0
        self._done = DoneSet()  # delivered offsets above the floor
        self._coverage = Coverage()  # what the document says of them (see the module docstring)
        self._scan = 0
        #: the reader has read the timer topic to its end since the state was loaded (until then nothing is
        #: delivered or saved: the loaded document is what holds)
        self._scanned = asyncio.Event()
        # payloads read by the reader, kept (within a memory budget) so delivery need not read them again
        self._payloads: dict[int, Waiting] = {}
        self._payload_bytes = 0
        self._data = asyncio.Event()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.delivered = 0
        #: timer records skipped because they cannot be read (`_skip`)
        self.unreadable = 0
        #: (topic, unique key) -> recall records read and not yet due: a message they name is not delivered
        self._recalled: collections.Counter[tuple[str, str]] = collections.Counter()
        #: messages not delivered because they were recalled
        self.recalled = 0
        self._intent: dict[str, list] = {}  # the delivery burst in progress (saved before its appends)

    # --- life cycle --------------------------------------------------------------------------------------------

    async def start(self) -> TimerService:
        if self.store.topic(TIMER_TOPIC) is None:
            retention = max(7 * 24 * 3600 * 1000, 2 * self.max_delay_ms)
            with contextlib.suppress(ShardExists):
                await self.store.create_topic(TIMER_TOPIC, 1, TopicConfig({"retention.ms": str(retention)}))
        if isinstance(self.docs, LogStateDocs):
            await self.docs.prepare()
        if not self.standby:
            await self._begin()
        self.store.add_listener(self._on_data)
        self.store.hooks.append(self.hook)
        if not self.standby:
            self._tasks = [asyncio.create_task(self._reader()), asyncio.create_task(self._deliverer())]
        return self

    async def wait_loaded(self) -> None:
        """Until the schedule has been read from the floor to the timer topic's end (after `start`, or `activate`
        in cluster mode): from then on `pending` counts every message waiting, and delivery runs."""
        await self._scanned.wait()

    async def _begin(self) -> None:
        """Load the state document and settle its open intent; the reader then reads the schedule from the floor."""
        state = await self.docs.load(STATE_NAME) or {}
        self._floor = max(int(state.get("floor", 0)), self.store.log_start_offset(TIMER_TOPIC, 0))
        self.saved_floor = self._floor
        self._done.load(self._floor, _unruns(state.get("done", [])))
        self._coverage.load(_unruns(state.get("covered", [])))
        self._floor = self._done.advance(self._floor)
        await self._settle_intents(state.get("intent", {}))
        self._scan = self._floor
        self._horizon = (self.clock.time_ms() + HORIZON_MS) // BUCKET_MS
        self._data.set()  # the reader reads the schedule from the floor (the broker serves meanwhile)

    async def stop(self) -> None:
        if self.hook in self.store.hooks:
            self.store.hooks.remove(self.hook)
        await self._cancel_tasks()
        if not self.standby:
            # a burst cut short keeps its intent: whether its last append landed is settled at the next start
            await self._save(self._intent)
        self._spill.close()

    async def _cancel_tasks(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- mastership (standby) ------------------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether the schedule is read and delivered now."""
        return bool(self._tasks)

    async def activate(self, epoch: int = 0) -> None:
        """This broker became its group's master: load the state its predecessor left in the log, settle its open
        intent, and deliver from there (on a task of its own, so the broker serves meanwhile)."""
        await self.deactivate()
        self._tasks = [asyncio.create_task(self._run_as_master(), name="mqk-timer")]

    async def deactivate(self) -> None:
        """This broker stopped being master: stop reading and delivering, at once and without saving (the log
        holds the last intent; the next master settles it), and forget the schedule."""
        await self._cancel_tasks()
        self._reset()

    async def _run_as_master(self) -> None:
        while True:
            try:
                await self._begin()
                break
            except Exception:  # a master must deliver eventually: say why, and try again
                log.exception("timer: cannot load its state from the log; retrying")
                self._reset()
                await self.clock.sleep(1)
        await asyncio.gather(self._reader(), self._deliverer())

    def _reset(self) -> None:
        self._schedule.clear()
        self._spill.close()
        self._horizon = 0
        self._floor = self._scan = 0
        self._done.clear()
        self._coverage.clear()
        self._scanned.clear()
        self._payloads.clear()
        self._payload_bytes = 0
        self._intent = {}
        self._recalled.clear()

    async def retention_pins(self) -> dict[tuple[str, int], int]:
        """The timer topic's offset retention must not pass: the floor of the document in the log (every
        message below it is delivered, and the next master starts from it)."""
        if self.active:
            floor = self.saved_floor
        else:
            try:
                floor = int((await self.docs.load(STATE_NAME) or {}).get("floor", 0))
            except (StorageError, ValueError, TypeError):
                floor = 0
        return {(TIMER_TOPIC, 0): max(floor, 0)}

    @property
    def pending(self) -> int:
        return len(self._schedule) + self._spill.count

    def upcoming(self, limit: int) -> list[tuple[int, int]]:
        """(due time in ms, timer-topic offset) of the `limit` pending messages due first, soonest first (the
        admin console lists them; the payloads stay in the timer topic, read from there by offset)."""
        out = [(int(due), int(offset)) for due, offset in self._schedule.islice(0, max(0, limit))]
        if len(out) < limit:  # every spilled message is due after every one in memory
            out += self._spill.peek(limit - len(out))
        return out

    # --- arrival -------------------------------------------------------------------------------------------------

    @delayed_only  # an append said to carry no delay header (and no properties) returns below untouched
    def hook(self, ctx: PutContext) -> None:
        # half messages wait for their commit, not their time: a delay applies when the commit appends them
        if ctx.topic == TIMER_TOPIC or DELIVERING.get() or ctx.topic.startswith("RMQ_SYS_TRANS_"):
            return
        if ctx.properties:  # a native message: its properties are its headers, no need to decode
            now = self.clock.time_ms()
            due = due_time(ctx.properties, now)
        elif ctx.delay_headers is False:  # the producer's record check found none (no walk, no decompression)
            return
        else:
            now = -1
            due = None
            for batch in ctx.batches:
                if not batch_may_be_delayed(batch):
                    continue
                if now < 0:  # the clock is read only for a batch that may carry a delay header (almost none do)
                    now = self.clock.time_ms()
                at = decoded_batch_due_time(batch, now)
                if at is not None and (due is None or at > due):
                    due = at
        if due is None or due <= now:
            return
        if due - now > self.max_delay_ms:
            raise PutRejected(f"delivery time {due} is more than timer_max_delay_ms ({self.max_delay_ms} ms) away")
        waiting = [
            Waiting(ctx.topic, ctx.queue, due, ctx.tags_code, tuple(bytes(k) for k in ctx.keys), bytes(b))
            for b in ctx.batches
        ]
        ctx.batches = [wrap(waiting, now)]
        ctx.topic, ctx.queue, ctx.tags_code, ctx.keys = TIMER_TOPIC, 0, 0, ()

    def _on_data(self, topic: str, queue_ends: Sequence[tuple[int, int]]) -> None:
        if topic == TIMER_TOPIC:
            self._data.set()

    async def _reader(self) -> None:
        while True:
            await self._data.wait()
            self._data.clear()
            try:
                await self._read_new()
            except StorageError:
                log.exception("timer: cannot read the timer topic")
                await self.clock.sleep(1)

    async def _read_new(self) -> None:
        while self._scan < self.store.end_offset(TIMER_TOPIC, 0):
            start = self.store.log_start_offset(TIMER_TOPIC, 0)
            if self._scan < start:
                self._scan = start
            result = await self.store.read(TIMER_TOPIC, 0, self._scan, _READ_BYTES)
            if not result.batches:
                break
            head = self._schedule[0][0] if self._schedule else None
            first_spilled = self._spill.first_bucket()
            skipped = False
            for handled, batch in enumerate(result.batches, 1):
                if handled % READ_SLICE == 0:
                    # a chunk holds tens of thousands of messages: the broker serves (and, at start, goes on
                    # starting) between slices of it rather than after the whole chunk
                    await asyncio.sleep(0)
                unreadable: list[tuple[int, str]] = []
                try:
                    entries = list(unwrap(batch.data, self._scan, unreadable))
                except Exception as exc:  # noqa: BLE001 - whatever fails to decode is skipped, never a stop
                    first = max(batch.base_offset, self._scan)
                    self._skip(range(first, batch.next_offset), f"timer batch at offset {first} is unreadable: {exc}")
                    skipped = True
                    continue
                for offset, reason in unreadable:
                    self._skip((offset,), reason)
                    skipped = True
                # (`_scan` only grows until a reset, so no offset is read twice: the done bits are the only check)
                for offset, waiting in entries:
                    if offset < self._floor:
                        continue
                    if offset in self._done:  # named delivered by the loaded document: now its due time is known
                        self._coverage.delivered(offset, waiting.due)
                    elif self._coverage.covers(offset, waiting.due):
                        self._mark_done(offset)  # delivered before the restart (a rectangle names it already)
                    else:
                        if waiting.recalls:  # known from now on, kept until the recalled message's due time
                            self._recalled[(waiting.topic, waiting.recalls)] += 1
                        if waiting.due // BUCKET_MS > self._horizon:
                            self._spill.add(waiting.due, offset)  # its payload is read again when it is due
                            continue
                        self._schedule.add((waiting.due, offset))
                        cost = len(waiting.batch) + PAYLOAD_OVERHEAD
                        if self._payload_bytes + cost <= PAYLOAD_BUDGET:
                            self._payloads[offset] = waiting
                            self._payload_bytes += cost
            self._scan = result.next_offset
            if self._schedule and (head is None or self._schedule[0][0] < head):
                self._wake.set()
            spilled = self._spill.first_bucket()
            if spilled is not None and (first_spilled is None or spilled < first_spilled):
                self._wake.set()  # the deliverer may sleep past this bucket's promotion
            if skipped:
                # the floor may have moved past them: saved with the burst in progress (if any), so a restart
                # neither counts them again nor loses that burst's intent
                await self._save(self._intent)
        if not self._scanned.is_set():
            self._scanned.set()  # the schedule holds everything up to the topic's end: delivery may begin
            self._wake.set()

    def _skip(self, offsets: Iterable[int], reason: str) -> None:
        """Quarantine timer records that cannot be read (written by hand, or by a build that wrapped otherwise): one
        log line, counted in `unreadable` (/metrics: mqk_timer_unreadable_records), and marked delivered so they
        never hold the floor or the schedule back. They stay in the timer topic, for an operator to look at, until
        retention removes them."""
        count = 0
        for offset in offsets:
            if offset < self._floor:
                continue
            if offset in self._done:  # skipped before the restart: named again, not counted again
                self._coverage.delivered(offset, NO_DUE)
            else:  # (never scheduled: see `_read_new`)
                self._mark_done(offset, NO_DUE)
                count += 1
        if count:
            self.unreadable += count
            log.warning("timer: skipping %d unreadable record(s): %s", count, reason)

    # --- delivery ------------------------------------------------------------------------------------------------

    async def _deliverer(self) -> None:
        DELIVERING.set(True)  # this task's context only: its appends pass the hook
        await self._scanned.wait()  # (a message due first may lie anywhere from the floor on)
        while True:
            promote_at = self._promote()
            now = self.clock.time_ms()
            delay = MAX_WAIT_SECONDS
            if self._schedule:
                delay = (self._schedule[0][0] - now) / 1000
            if delay <= 0 and not self._may_append():
                delay = 1.0  # no longer master: `deactivate` stops this task; until then, nothing is appended
            if delay > 0:
                if promote_at is not None:
                    delay = min(delay, max((promote_at - now) / 1000, 0.001))
                self._wake.clear()
                await wait_event(self.clock, self._wake, min(delay, MAX_WAIT_SECONDS))
                continue
            try:
                await self._deliver_due()
            except StorageError:
                log.exception("timer: delivery failed; retrying")
                await self.clock.sleep(0.5)

    def _promote(self) -> int | None:
        """Move the spilled buckets now within the horizon into the in-memory schedule; the time (ms) at which one
        is next due to move, or None when nothing is spilled."""
        now = self.clock.time_ms()
        target = (now + HORIZON_MS) // BUCKET_MS
        while (first := self._spill.first_bucket()) is not None and first <= target:
            start = first * BUCKET_MS
            if start > now and len(self._schedule) >= SCHEDULE_CAP:
                # full: this bucket and later ones wait (and so do new arrivals due in them) until it is due or
                # deliveries make room; every spilled message stays due after every one in memory
                self._horizon = max(self._horizon, first - 1)
                return start
            self._schedule.update(self._spill.take_first())
        self._horizon = max(self._horizon, target)
        first = self._spill.first_bucket()
        return None if first is None else first * BUCKET_MS - HORIZON_MS

    async def _deliver_due(self) -> None:
        now = self.clock.time_ms()
        due = []
        for item in self._schedule.irange(maximum=(now, 1 << 62)):
            due.append(item)
            if len(due) >= BURST:
                break
        # payloads not cached (spilled, or beyond the budget) are read in log order, LOAD_CONCURRENCY reads in
        # flight: one after another, a burst of them would wait on each disk read's round trip in turn
        missing = sorted(offset for _, offset in due if offset not in self._payloads)
        fetched: dict[int, Waiting | None] = {}
        for start in range(0, len(missing), LOAD_CONCURRENCY):
            chunk = missing[start : start + LOAD_CONCURRENCY]
            fetched.update(zip(chunk, await asyncio.gather(*(self._load(offset) for offset in chunk))))
        loaded: list[tuple[int, Waiting]] = []
        for at, offset in due:
            waiting = self._payloads.pop(offset, None)
            if waiting is not None:
                self._payload_bytes -= len(waiting.batch) + PAYLOAD_OVERHEAD
            else:
                waiting = fetched.get(offset)
            # (a record gone from the timer topic, a recall, or a recalled message: nothing to append)
            if waiting is None or ((waiting.recalls or self._recalled) and self._settles_recall(waiting)):
                self._mark_done(offset, at)
            else:
                loaded.append((offset, waiting))
        intent: dict[str, list] = {}
        for offset, w in loaded:
            try:
                intent[str(offset)] = [w.topic, w.queue, self.store.end_offset(w.topic, w.queue)]
            except UnknownShard:
                intent[str(offset)] = [w.topic, w.queue, -1]
        self._intent = intent
        if not self._may_append():
            return
        await self._save(intent)
        # batches for one queue with one tags code and no keys share an append call (order within a queue kept)
        groups: dict[tuple, list[tuple[int, Waiting]]] = {}
        for offset, w in loaded:
            key = (w.topic, w.queue, w.tags_code) if not w.keys else ("keyed", offset)
            groups.setdefault(key, []).append((offset, w))
        for members in groups.values():
            for start in range(0, len(members), 256):
                chunk = members[start : start + 256]
                w = chunk[0][1]
                batches = [bytearray(entry.batch) for _, entry in chunk]
                if not self._may_append():
                    return  # the saved intent covers this burst: the next master settles it
                try:
                    queue = self._deliverable_queue(w.topic, w.queue)
                    await self.store.append(w.topic, queue, batches, tags_code=w.tags_code, keys=list(w.keys))
                    self.delivered += len(chunk)
                except UnknownShard:
                    log.warning(
                        "timer: topic %s/%s is gone; dropping %d message(s) due at %s",
                        w.topic,
                        w.queue,
                        len(chunk),
                        w.due,
                    )
                for offset, entry in chunk:
                    self._mark_done(offset, entry.due)
                    self._schedule.discard((entry.due, offset))  # (a burst cut short must not repeat it)
        for item in due:
            self._schedule.discard(item)
        self._intent = {}
        if not self._schedule or self._schedule[0][0] > self.clock.time_ms():
            await self._save()  # else the next burst's intent save records this burst as done, one fsync less

    def _settles_recall(self, waiting: Waiting) -> bool:
        """Whether a due record goes without an append: a recall (its time has come, so it is forgotten) or a
        message a recall names. Due records come in (due, offset) order, and a recall is written after the message
        it names with the same due time, so the message is met first."""
        if waiting.recalls:
            key = (waiting.topic, waiting.recalls)
            self._recalled[key] -= 1
            if self._recalled[key] <= 0:
                del self._recalled[key]
            return True
        try:
            key = (waiting.topic, unique_key(waiting.batch) or "")
        except StorageError:  # (a batch the hook took whole: it is delivered as it is)
            return False
        if key in self._recalled:
            self.recalled += 1
            log.info("timer: message %s of %s was recalled; not delivered", key[1], key[0])
            return True
        return False

    # --- recall --------------------------------------------------------------------------------------------------

    async def recall(self, topic: str, unique_key: str, due: int) -> None:
        """Recall `topic`'s message `unique_key`, waiting until `due`: a record in the timer topic (durable, and
        replicated with it) that keeps the message from being delivered. A message already delivered, or never
        sent, is not affected (RocketMQ's recall is the same blind delete marker)."""
        if not unique_key:
            raise PutRejected("a recall must name the message's unique key")
        record = wrap([recall_record(topic, due, unique_key)], self.clock.time_ms())
        await self.store.append(TIMER_TOPIC, 0, [record])

    async def _load(self, offset: int) -> Waiting | None:
        try:
            result = await self.store.read(TIMER_TOPIC, 0, offset, 1)
        except StorageError:
            return None
        for batch in result.batches:
            try:
                for got, waiting in unwrap(batch.data, offset, []):
                    if got == offset:
                        return waiting
            except StorageError:  # (never scheduled, so never asked for; a neighbour's fault is no reason to fail)
                return None
        return None

    def _deliverable_queue(self, topic: str, queue: int) -> int:
        """The queue a due message goes to: its own, unless that queue takes no appends here (cluster mode: its
        partition moved to another broker group, StoreManager.fence); then the first one of the topic that does,
        so the message is delivered, to another partition of its topic. None left: its own (the append raises
        PartitionFenced, a StorageError, and the burst is tried again: a partition sealed while it moves is
        fenced for a moment only, and a topic with no partition left here is deleted, and dropped as such)."""
        store = self.store
        if not store.fenced(topic, queue):
            return queue
        info = store.topic(topic)
        for other in range(info.queue_count if info is not None else 0):
            if not store.fenced(topic, other):
                log.info(
                    "timer: %s-%d moved to another broker group; its due messages go to %s-%d",
                    topic,
                    queue,
                    topic,
                    other,
                )
                return other
        return queue

    def _mark_done(self, offset: int, due: int | None = None) -> None:
        """Delivered (or skipped): `due` given, the document names it until a rectangle covers it; None when one
        does already."""
        self._done.add(offset)
        if due is not None:
            self._coverage.delivered(offset, due)
        if offset == self._floor:
            self._floor = self._done.advance(self._floor)

    def _may_append(self) -> bool:
        return not self.standby or self.may_deliver()

    async def _save(self, intent: dict[str, list] | None = None) -> None:
        if not self._may_append() or not self._scanned.is_set():
            return  # (before the first read from the floor has ended, the loaded document still holds)
        floor = self._floor
        # every message read and not delivered is in the schedule or spilled (a spilled one due no earlier than
        # its bucket's start): nothing read is waiting with a due time below `below`
        below = NO_DUE
        if self._schedule:
            below = int(self._schedule[0][0])
        first_spilled = self._spill.first_bucket()
        if first_spilled is not None:
            below = min(below, first_spilled * BUCKET_MS)
        self._coverage.add(self._scan, below, floor)
        state = {
            "floor": floor,
            "covered": [list(r) for r in self._coverage.rectangles],
            "done": self._coverage.uncovered_runs(),
            "intent": intent or {},
        }
        await self.docs.save(STATE_NAME, state)
        self.saved_floor = floor

    async def _settle_intents(self, intent: dict[str, list]) -> None:
        """After a crash mid-burst: an intent whose batch reached its real queue counts as delivered. Each real
        queue is scanned once from the lowest end offset recorded for it, matching batches by (length, CRC)."""
        by_queue: dict[tuple[str, int], list[tuple[int, int, Waiting]]] = {}
        for key, (topic, queue, end_before) in intent.items():
            if int(key) < self._floor or int(key) in self._done:
                continue  # its append was recorded as done before the stop
            waiting = await self._load(int(key))
            if waiting is not None and int(end_before) >= 0:
                by_queue.setdefault((topic, int(queue)), []).append((int(key), int(end_before), waiting))
        for (topic, queue), entries in by_queue.items():
            landed: dict[tuple[int, int], int] = {}  # (length, crc) -> how many times seen
            try:
                offset = max(min(e[1] for e in entries), self.store.log_start_offset(topic, queue))
                while offset < self.store.end_offset(topic, queue):
                    result = await self.store.read(topic, queue, offset, _READ_BYTES)
                    if not result.batches:
                        break
                    for stored in result.batches:
                        header = recbatch.parse_header(stored.data, 0)
                        landed[(header[1], header[4])] = landed.get((header[1], header[4]), 0) + 1
                    offset = result.next_offset
            except StorageError:
                continue
            for timer_offset, _, waiting in entries:
                header = recbatch.parse_header(waiting.batch, 0)
                if landed.get((header[1], header[4]), 0) > 0:
                    landed[(header[1], header[4])] -= 1
                    self._mark_done(timer_offset, waiting.due)


def _unruns(runs: list) -> Iterator[tuple[int, int]]:
    """The state document's [first, last] runs of delivered offsets, checked to be pairs of ints."""
    for first, last in runs:
        yield int(first), int(last)
