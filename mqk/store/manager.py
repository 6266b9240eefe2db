"""StoreManager: the broker's one door to storage. Owns topic metadata, the engines, and per-topic routing.

What it owns:
- topic metadata (`ShardInfo`: queue count, per-topic config overrides, engine, a stable random 16-byte topic id),
  persisted in `data_dir/config/topics.json` by atomic write-then-rename + fsync (fsutil) after every change;
- the engines: each created once, lazily, on first use, and shared by every topic routed to it. A topic's engine is
  its `storage.type` override, else the broker default (`StoreConfig.storage`), fixed at creation;
- routing of every StorageAdapter data call to the topic's engine, with `UnknownShard` for unknown topics/queues;
- the put-message hooks (`hooks`, run in order before each append; a hook may reject with `PutRejected` or reroute by
  rewriting the context's topic/queue) and the data listeners (registered with every engine, present and future);
- group offsets, kept by the default engine (so they live wherever the broker's default storage lives), unless
  another keeper is installed (`use_offsets`: cluster mode keeps them in the log, mqk.store.offsets_log);
- small durable JSON documents for services (`load_state` / `save_state`) in `data_dir/state/`.

With `memory` as the default engine nothing is written to disk at all: metadata and state live in this process.

Start-up reconciles metadata with the engines: every topic in topics.json gets its shards (re)created (idempotent;
a memory-engine topic comes back empty), and shards an engine holds for topics that topics.json no longer lists
(a crash between the metadata write and the engine's delete) are deleted. If topics.json is missing while an engine
holds shards (an older data dir, a lost config), those topics are adopted with default settings instead.

Metadata changes are written before the engines act on them, under one admin lock, so a crash leaves at worst a
topic whose shards are recreated or deleted at the next start.

Topic names and settings are the broker's policy (mqk.broker.topics checks them before calling here); the store
refuses only what it cannot hold: a partition count outside [1, MAX_QUEUES], an unknown engine, a storage.type
change, and whatever name an engine cannot store (a file engine's directory name).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
from collections.abc import Awaitable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mqk.config import ENGINES, StoreConfig, TopicConfig
from mqk.errors import (
    Corrupt,
    InvalidConfigError,
    InvalidPartitionsError,
    PartitionFenced,
    ShardExists,
    StorageError,
    UnknownShard,
)
from mqk.store.adapter import (
    AppendResult,
    Buffer,
    DataListener,
    GroupOffset,
    PutContext,
    PutHook,
    ReadResult,
    ShardInfo,
    StorageAdapter,
    StoredBatch,
    is_delayed_only,
    physical_engine,
)
from mqk.store.fsutil import atomic_write_bytes, read_json

if TYPE_CHECKING:
    from mqk.store.file.engine import FileEngine

log = logging.getLogger(__name__)

#: far above any real topic; refuses absurd requests before allocating per-queue state
MAX_QUEUES = 10_000
_STATE_RE = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,127}$")
TOPICS_FILE = "topics.json"


class GroupOffsets(Protocol):
    """What keeps committed group offsets: every engine (StorageAdapter), or mqk.store.offsets_log.LogOffsetStore."""

    async def commit_offsets(self, group: str, offsets: dict[tuple[str, int], GroupOffset]) -> None: ...

    def fetch_offsets(self, group: str) -> dict[tuple[str, int], GroupOffset]: ...

    async def delete_offsets(self, group: str, partitions: Iterable[tuple[str, int]] | None = None) -> None: ...

    def list_offset_groups(self) -> list[str]: ...


def _new_topic_id() -> bytes:
    while True:
        topic_id = os.urandom(16)
        # Kafka reserves the zero UUID and UUID 1 (the metadata topic's sentinel)
        if topic_id.lstrip(b"\x00") not in (b"", b"\x01"):
            return topic_id


class StoreManager:
    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.hooks: list[PutHook] = []
        self._listeners: list[DataListener] = []
        self._engines: dict[str, StorageAdapter] = {}
        self._topics: dict[str, ShardInfo] = {}
        #: topic -> (its ShardInfo, its started engine, its LogAppendTime setting), what `append` needs per call;
        #: an entry counts only while its ShardInfo is still the one in `_topics` (every topic change stores a new
        #: ShardInfo), and the whole cache goes when the engines change
        self._append_routes: dict[str, tuple[ShardInfo, StorageAdapter, bool]] = {}
        #: where group offsets are kept when not in the default engine (use_offsets)
        self._offsets: GroupOffsets | None = None
        self._states: dict[str, dict[str, Any]] = {}
        self._state_locks: dict[str, asyncio.Lock] = {}
        self._admin = asyncio.Lock()
        #: with a memory default nothing touches the disk (not even the data dir)
        self.persistent = config.storage != "memory"
        #: the replicated engine (file) takes local appends; False on a replica of a cluster group
        self._writable = True
        #: topic -> queues that take no appends through `append` / `append_many` (`fence`)
        self._fenced: dict[str, frozenset[int]] = {}
        self._started = False

    @property
    def topics_path(self) -> Path:
        return self.config.data_dir / "config" / TOPICS_FILE

    @property
    def engines(self) -> dict[str, StorageAdapter]:
        """The engines created so far, by name."""
        return dict(self._engines)

    @property
    def default_engine(self) -> StorageAdapter:
        return self._started_engine(self.config.storage)

    def _started_engine(self, name: str) -> StorageAdapter:
        engine = self._engines.get(name)
        if engine is None:
            raise StorageError("the store is not started (or already closed)")
        return engine

    def set_writable(self, writable: bool) -> None:
        """Let the replicated engine (file: its CommitLog is what a group replicates) take local appends, or
        refuse them with NotMaster (a replica). Applies to the engine now and to one created later."""
        self._writable = writable
        engine = self._engines.get("file")
        if engine is not None:
            engine.set_writable(writable)  # type: ignore[attr-defined]  # (the file engine's own method)

    def fence(self, fenced: dict[str, frozenset[int]]) -> None:
        """Refuse appends to these queues (topic -> queue ids) with PartitionFenced from now on, in place of the
        set given before. Cluster mode: the partitions placed in another group, and those sealed for a move.
        The check is made in the same step as the engine takes the append, so once this returns no append to a
        fenced queue can land, however long its request waited before it got here. (Engines' own `append` is
        not fenced: a partition's copy arriving from another group is written through it.)"""
        self._fenced = {topic: queues for topic, queues in fenced.items() if queues}

    def fenced(self, topic: str, queue: int) -> bool:
        queues = self._fenced.get(topic)
        return queues is not None and queue in queues

    @property
    def replicated_engine(self) -> FileEngine | None:
        """The engine whose CommitLog a cluster group replicates (the file engine), once it exists."""
        return self._engines.get("file")  # type: ignore[return-value]  # (only ever a FileEngine under "file")

    # --- life cycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        async with self._admin:
            if self._started:
                return
            doc = await asyncio.to_thread(read_json, self.topics_path) if self.persistent else None
            if doc is not None:
                self._topics = self._parse_topics(doc)
            await self._engine(self.config.storage)
            for info in self._topics.values():
                engine = await self._engine(info.engine)
                await engine.create_shards(info.topic, info.queue_count, info.config)
            if self.persistent:
                await self._reconcile(adopt=doc is None)
            self._started = True

    async def _reconcile(self, adopt: bool) -> None:
        adopted = False
        for name, engine in self._engines.items():
            for topic, count in engine.list_shards().items():
                info = self._topics.get(topic)
                if info is not None and info.engine == name:
                    continue
                if adopt and info is None:
                    overrides = {} if name == self.config.storage else {"storage.type": name}
                    self._topics[topic] = ShardInfo(topic, count, TopicConfig(overrides), name, _new_topic_id())
                    adopted = True
                else:
                    await engine.delete_shards(topic)
        if adopted:
            await self._save_topics()

    async def close(self) -> None:
        async with self._admin:
            engines, self._engines = list(self._engines.values()), {}
            self._append_routes.clear()
            self._started = False
            for engine in reversed(engines):
                await engine.close()

    async def _engine(self, name: str) -> StorageAdapter:
        """The engine called `name`, created and started on first use (callers hold the admin lock)."""
        engine = self._engines.get(name)
        if engine is not None:
            return engine
        # each engine is imported on first use: a broker without rocksdb topics never loads rocksdict
        if name == "memory":
            from mqk.store.memory import MemoryEngine

            engine = MemoryEngine()
        elif name == "rocksdb":
            from mqk.store.rocksdb import RocksEngine

            engine = RocksEngine(self.config, self.config.data_dir)
        elif name == "file":
            from mqk.store.file.engine import FileEngine

            engine = FileEngine(self.config, self.config.data_dir)
        else:
            raise InvalidConfigError(f"unknown storage.type {name!r}; expected one of {ENGINES}")
        engine.listeners.extend(self._listeners)
        if not self._writable and hasattr(engine, "set_writable"):
            engine.set_writable(False)
        await engine.start()
        self._engines[name] = engine
        return engine

    # --- topic metadata ------------------------------------------------------------------------------------

    def topics(self) -> dict[str, ShardInfo]:
        return dict(self._topics)

    def topic(self, name: str) -> ShardInfo | None:
        return self._topics.get(name)

    def engine_of(self, topic: str) -> StorageAdapter:
        info = self._topics.get(topic)
        if info is None:
            raise UnknownShard(f"unknown topic {topic!r}")
        return self._started_engine(info.engine)

    def _engine_name_for(self, config: TopicConfig) -> str:
        name = config.storage_type or self.config.storage
        if name not in ENGINES:
            raise InvalidConfigError(f"storage.type must be one of {ENGINES}, not {name!r}")
        return name

    async def create_topic(
        self, topic: str, partitions: int, config: TopicConfig | None = None, *, topic_id: bytes | None = None
    ) -> ShardInfo:
        """`topic_id`: the 16-byte id the topic is known by (a cluster's controller names it); a new one if None."""
        config = config or TopicConfig()
        _check_queue_count(partitions)
        async with self._admin:
            if topic in self._topics:
                raise ShardExists(f"topic {topic!r} already exists")
            name = self._engine_name_for(config)
            engine = await self._engine(name)
            info = ShardInfo(topic, partitions, config, name, topic_id or _new_topic_id())
            # published only once its shards exist: a request that finds the topic can append to it (one that
            # found it while the shards were being made would get UNKNOWN_TOPIC_OR_PARTITION)
            await self._save_topics({**self._topics, topic: info})
            try:
                await engine.create_shards(topic, partitions, config)
            except BaseException:
                await self._save_topics_quietly()
                raise
            self._topics[topic] = info
            return info

    async def delete_topic(self, topic: str) -> None:
        async with self._admin:
            info = self._topics.pop(topic, None)
            self._append_routes.pop(topic, None)
            if info is None:
                raise UnknownShard(f"unknown topic {topic!r}")
            await self._save_topics()
            with contextlib.suppress(UnknownShard):
                await self._started_engine(info.engine).delete_shards(topic)

    async def add_partitions(self, topic: str, total: int) -> None:
        _check_queue_count(total)
        async with self._admin:
            info = self._topics.get(topic)
            if info is None:
                raise UnknownShard(f"unknown topic {topic!r}")
            if total <= info.queue_count:
                raise InvalidPartitionsError(
                    f"topic {topic!r} has {info.queue_count} partitions; cannot change to {total}"
                )
            grown = ShardInfo(topic, total, info.config, info.engine, info.topic_id)
            await self._save_topics({**self._topics, topic: grown})
            try:
                await self._started_engine(info.engine).create_shards(topic, total, info.config)
            except BaseException:
                await self._save_topics_quietly()
                raise
            self._topics[topic] = grown  # the new partitions are served once they exist

    async def alter_topic_config(self, topic: str, config: TopicConfig) -> None:
        async with self._admin:
            info = self._topics.get(topic)
            if info is None:
                raise UnknownShard(f"unknown topic {topic!r}")
            if self._engine_name_for(config) != info.engine:
                raise InvalidConfigError(f"storage.type of topic {topic!r} is {info.engine!r} and cannot change")
            self._topics[topic] = ShardInfo(topic, info.queue_count, config, info.engine, info.topic_id)
            await self._save_topics()
            await self._started_engine(info.engine).update_config(topic, config)

    async def _save_topics(self, topics: dict[str, ShardInfo] | None = None) -> None:
        """Write `topics` (default: the published ones) to topics.json."""
        if not self.persistent:
            return
        doc = {
            "version": 1,
            "topics": {
                info.topic: {
                    "queues": info.queue_count,
                    "config": info.config.to_dict(),
                    "engine": info.engine,
                    "topic_id": info.topic_id.hex(),
                }
                for info in (self._topics if topics is None else topics).values()
            },
        }
        data = json.dumps(doc, sort_keys=True, indent=1).encode()
        await asyncio.to_thread(atomic_write_bytes, self.topics_path, data)

    async def _save_topics_quietly(self) -> None:
        try:
            await self._save_topics()
        except Exception as exc:  # noqa: BLE001 - already failing; the original error is the one to report
            log.error("could not roll back %s (%s)", self.topics_path, exc)

    def _parse_topics(self, doc: Any) -> dict[str, ShardInfo]:
        try:
            topics = {}
            for name, entry in doc["topics"].items():
                config = TopicConfig({str(k): str(v) for k, v in entry["config"].items()})
                topic_id = bytes.fromhex(entry["topic_id"])
                if len(topic_id) != 16 or entry["engine"] not in ENGINES or int(entry["queues"]) <= 0:
                    raise ValueError(f"bad entry for topic {name!r}")
                topics[name] = ShardInfo(name, int(entry["queues"]), config, entry["engine"], topic_id)
            return topics
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Corrupt(f"{self.topics_path}: malformed topic metadata ({exc})") from None

    # --- listeners and hooks -------------------------------------------------------------------------------

    def add_listener(self, listener: DataListener) -> None:
        """Call `listener(topic, queue_ends)` whenever records become visible, on every engine (DataListener:
        one (queue, new end offset) pair per queue of `topic` that grew)."""
        self._listeners.append(listener)
        for engine in self._engines.values():
            engine.listeners.append(listener)

    # --- routed data methods -------------------------------------------------------------------------------

    def _route(self, topic: str, queue: int) -> tuple[StorageAdapter, ShardInfo]:
        info = self._topics.get(topic)
        if info is None or not 0 <= queue < info.queue_count:
            raise UnknownShard(f"unknown shard {topic!r}/{queue}")
        return self._started_engine(info.engine), info

    def append(
        self,
        topic: str,
        queue: int,
        batches: Sequence[Buffer],
        *,
        tags_code: int = 0,
        keys: Sequence[bytes] = (),
        log_append_time: bool = False,
        properties: dict[str, str] | None = None,
        delay_headers: bool | None = None,
    ) -> Awaitable[AppendResult]:
        """Run the hooks, then append to the (possibly rerouted) shard. `properties` (native message properties)
        and `delay_headers` (PutContext) are only shown to the hooks. A topic configured with LogAppendTime always
        gets it.

        Not a coroutine itself: it returns the engine's append coroutine for the caller to await (one coroutine
        per append instead of two, on the hottest path). So a hook's refusal or an unknown shard raises from the
        call, which `await store.append(...)` does not tell apart."""
        hooks = self.hooks
        if hooks and delay_headers is False and not properties:
            hooks = self._undelayed_hooks()
        if hooks:
            context = PutContext(topic, queue, list(batches), tags_code, keys, properties or {}, delay_headers)
            for hook in hooks:
                hook(context)
            topic, queue, batches = context.topic, context.queue, context.batches
            tags_code, keys = context.tags_code, context.keys
        if self._fenced and self.fenced(topic, queue):
            raise _fenced_error(topic, queue)
        _info, engine, topic_log_append_time = self._append_route(topic, queue)
        return engine.append(
            topic,
            queue,
            batches,
            tags_code=tags_code,
            keys=keys,
            log_append_time=log_append_time or topic_log_append_time,
        )

    def _undelayed_hooks(self) -> list[PutHook]:
        """The hooks an append without delay headers and without properties must pass: those not marked
        `delayed_only` (the others would leave it alone)."""
        return [hook for hook in self.hooks if not is_delayed_only(hook)]

    async def append_many(
        self,
        topic: str,
        entries: Sequence[tuple[int, Sequence[Buffer]]],
        *,
        log_append_time: bool = False,
        delay_headers: Sequence[bool | None] | None = None,
    ) -> list[AppendResult | Exception]:
        """StorageAdapter.append_many through the hooks: each entry is shown to them as its own append (with
        `delay_headers[i]` as its PutContext.delay_headers, when given); one they refuse gets their exception,
        one they change (the timer rerouting a delayed batch) is appended as changed, on its own; the rest reach
        the topic's engine in one call. An entry whose `delay_headers[i]` is False skips the `delayed_only` hooks
        (no context at all when that is every hook): the usual Produce, many partitions and no delay header,
        then costs the hooks nothing per partition."""
        if self._fenced:
            fenced = self._fenced.get(topic)
            if fenced is not None and any(queue in fenced for queue, _batches in entries):
                return await self._append_many_unfenced(topic, entries, fenced, log_append_time, delay_headers)
        try:
            info, engine, topic_log_append_time = self._append_route(topic, 0)
        except UnknownShard as exc:
            return [exc] * len(entries)
        stamp = log_append_time or topic_log_append_time  # this topic's appends (a rerouted one asks its own)
        queue_count = info.queue_count
        hooks = self.hooks
        undelayed_hooks = hooks
        if hooks and delay_headers is not None:
            undelayed_hooks = self._undelayed_hooks()
            if not undelayed_hooks:
                for delayed in delay_headers:
                    if delayed is not False:
                        break
                else:
                    hooks = undelayed_hooks  # no entry needs a hook
        if not hooks:
            for queue, _batches in entries:
                if not 0 <= queue < queue_count:
                    break
            else:  # every entry goes to the engine as it is
                return await engine.append_many(topic, entries, log_append_time=stamp)
        out: list[AppendResult | Exception | None] = [None] * len(entries)
        direct: list[tuple[int, Sequence[Buffer]]] = []
        positions: list[int] = []
        for i, (queue, batches) in enumerate(entries):
            try:
                entry_hooks = hooks if delay_headers is None or delay_headers[i] is not False else undelayed_hooks
                if entry_hooks:
                    batch_list = batches if batches.__class__ is list else list(batches)
                    context = PutContext(topic, queue, batch_list)
                    if delay_headers is not None:
                        context.delay_headers = delay_headers[i]
                    for hook in entry_hooks:
                        hook(context)
                    if (
                        context.topic != topic
                        or context.queue != queue
                        or context.batches is not batch_list
                        or context.tags_code
                        or context.keys
                    ):
                        _info, other, other_log_append_time = self._append_route(context.topic, context.queue)
                        out[i] = await other.append(
                            context.topic,
                            context.queue,
                            context.batches,
                            tags_code=context.tags_code,
                            keys=context.keys,
                            log_append_time=log_append_time or other_log_append_time,
                        )
                        continue
                if not 0 <= queue < queue_count:
                    raise UnknownShard(f"unknown shard {topic!r}/{queue}")
            except Exception as exc:  # noqa: BLE001 - that entry's answer
                out[i] = exc
                continue
            direct.append((queue, batches))
            positions.append(i)
        if direct:
            results = await engine.append_many(topic, direct, log_append_time=stamp)
            for i, result in zip(positions, results):
                out[i] = result
        return out  # type: ignore[return-value]  # (every slot was filled above: its error or its result)

    async def _append_many_unfenced(
        self,
        topic: str,
        entries: Sequence[tuple[int, Sequence[Buffer]]],
        fenced: frozenset[int],
        log_append_time: bool,
        delay_headers: Sequence[bool | None] | None,
    ) -> list[AppendResult | Exception]:
        """`append_many` for the entries whose queues are not fenced; the others get PartitionFenced."""
        kept = [i for i, (queue, _batches) in enumerate(entries) if queue not in fenced]
        results = iter(
            await self.append_many(
                topic,
                [entries[i] for i in kept],
                log_append_time=log_append_time,
                delay_headers=None if delay_headers is None else [delay_headers[i] for i in kept],
            )
            if kept
            else []
        )
        return [_fenced_error(topic, queue) if queue in fenced else next(results) for queue, _batches in entries]

    def _append_route(self, topic: str, queue: int) -> tuple[ShardInfo, StorageAdapter, bool]:
        """(topic info, its started engine, its LogAppendTime setting), cached per topic incarnation; UnknownShard
        for an unknown topic or queue."""
        route = self._append_routes.get(topic)
        if route is None or route[0] is not self._topics.get(topic):
            engine, info = self._route(topic, queue)
            route = self._append_routes[topic] = (info, engine, info.config.log_append_time)
        elif not 0 <= queue < route[0].queue_count:
            raise UnknownShard(f"unknown shard {topic!r}/{queue}")
        return route

    async def read(self, topic: str, queue: int, offset: int, max_bytes: int) -> ReadResult:
        return await self._route(topic, queue)[0].read(topic, queue, offset, max_bytes)

    async def read_by_tags(
        self, topic: str, queue: int, offset: int, tags_codes: Iterable[int], max_batches: int
    ) -> ReadResult:
        return await self._route(topic, queue)[0].read_by_tags(topic, queue, offset, tags_codes, max_batches)

    async def read_by_key(
        self, topic: str, key: bytes, max_count: int, begin_ms: int = 0, end_ms: int = 1 << 62
    ) -> list[tuple[int, StoredBatch]]:
        return await self.engine_of(topic).read_by_key(topic, key, max_count, begin_ms, end_ms)

    async def read_at(self, physical_offset: int) -> tuple[str, int, StoredBatch] | None:
        """The batch at a physical offset: the offset's top bits name the engine that issued it (adapter's
        PHYSICAL_KINDS). The answer counts only if that topic is still routed to that engine (a topic deleted and
        re-created elsewhere does not own the old engine's batches)."""
        name = physical_engine(physical_offset)
        engine = self._engines.get(name) if name is not None else None
        if engine is None:
            return None
        found = await engine.read_at(physical_offset)
        if found is None:
            return None
        info = self._topics.get(found[0])
        if info is None or info.engine != name or not 0 <= found[1] < info.queue_count:
            return None
        return found

    async def delete_before(self, topic: str, queue: int, offset: int) -> int:
        return await self._route(topic, queue)[0].delete_before(topic, queue, offset)

    async def offset_for_timestamp(self, topic: str, queue: int, timestamp: int) -> tuple[int, int] | None:
        return await self._route(topic, queue)[0].offset_for_timestamp(topic, queue, timestamp)

    async def max_timestamp(self, topic: str, queue: int) -> tuple[int, int] | None:
        return await self._route(topic, queue)[0].max_timestamp(topic, queue)

    async def range_bytes(self, topic: str, queue: int, start: int, end: int) -> int:
        return await self._route(topic, queue)[0].range_bytes(topic, queue, start, end)

    def log_start_offset(self, topic: str, queue: int) -> int:
        return self._route(topic, queue)[0].log_start_offset(topic, queue)

    def end_offset(self, topic: str, queue: int) -> int:
        return self._route(topic, queue)[0].end_offset(topic, queue)

    def offset_bounds(self, topic: str, queue: int) -> tuple[int, int]:
        """(log start offset, end offset) with one routing (a Fetch asks for both of every partition)."""
        engine = self._route(topic, queue)[0]
        return engine.log_start_offset(topic, queue), engine.end_offset(topic, queue)

    def offset_bounds_many(self, topic: str, queues: Sequence[int]) -> list[tuple[int, int] | None]:
        """`offset_bounds` of each of `queues` with one routing; None for a queue the topic does not have, and
        for every queue of a topic that does not exist."""
        info = self._topics.get(topic)
        if info is None:
            return [None] * len(queues)
        return self._started_engine(info.engine).offset_bounds_many(topic, queues)

    # --- group offsets (the default engine, or the keeper installed with use_offsets) ----------------------

    def use_offsets(self, offsets: GroupOffsets | None) -> None:
        """Keep group offsets in `offsets` from now on (None: the default engine again). Every caller of the four
        group-offset methods (Kafka's coordinator, RocketMQ's offset and pull processors) follows."""
        self._offsets = offsets

    def _offset_keeper(self) -> GroupOffsets:
        return self.default_engine if self._offsets is None else self._offsets

    async def commit_offsets(self, group: str, offsets: dict[tuple[str, int], GroupOffset]) -> None:
        await self._offset_keeper().commit_offsets(group, offsets)

    def fetch_offsets(self, group: str) -> dict[tuple[str, int], GroupOffset]:
        return self._offset_keeper().fetch_offsets(group)

    async def delete_offsets(self, group: str, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        await self._offset_keeper().delete_offsets(group, partitions)

    def list_offset_groups(self) -> list[str]:
        return self._offset_keeper().list_offset_groups()

    # --- service state -------------------------------------------------------------------------------------

    def _state_path(self, name: str) -> Path:
        if not _STATE_RE.match(name):
            raise ValueError(f"bad state document name {name!r}")
        return self.config.data_dir / "state" / f"{name}.json"

    def load_state(self, name: str) -> dict[str, Any] | None:
        """The last document saved under `name` (this run or a previous one), or None."""
        path = self._state_path(name)
        if name not in self._states and self.persistent:
            doc = read_json(path)
            if doc is not None:
                if not isinstance(doc, dict):
                    raise Corrupt(f"{path}: state document is not a JSON object")
                self._states[name] = doc
        doc = self._states.get(name)
        return None if doc is None else json.loads(json.dumps(doc))  # a private copy for the caller

    async def save_state(self, name: str, obj: dict[str, Any]) -> None:
        """Durably replace the document `name` (atomic + fsync); saves of one name land in call order."""
        path = self._state_path(name)
        data = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()  # TypeError now, not in a thread
        lock = self._state_locks.setdefault(name, asyncio.Lock())
        async with lock:
            if self.persistent:
                await asyncio.to_thread(atomic_write_bytes, path, data)
            self._states[name] = json.loads(data)


def _fenced_error(topic: str, queue: int) -> PartitionFenced:
    return PartitionFenced(f"{topic}-{queue} takes no appends in this broker group now")


def _check_queue_count(count: int) -> None:
    if not isinstance(count, int) or not 0 < count <= MAX_QUEUES:
        raise InvalidPartitionsError(f"partition count must be in [1, {MAX_QUEUES}], not {count!r}")
