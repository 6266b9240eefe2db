"""The web console on the admin listener: its pages (`/console/`) and the JSON API under `/api/` they read.

What it owns:
- the static pages (mqk/server/admin/static/: one HTML page, its script and style sheet, written for mqk and served
  by it; nothing is loaded from elsewhere) with a Content-Security-Policy that allows only this origin's script and
  style, so nothing a message carries can run even if it were rendered as markup (the script renders with
  `textContent` only);
- the JSON API, read from the broker's own parts (`BrokerParts`): the topic registry (in cluster mode the cluster's
  topics, with the partitions this broker holds), store reads (offsets, sizes, records by offset, by timestamp, by
  key through the key index), the Kafka group coordinator and committed offsets, the timer's pending schedule,
  readiness and the figures /metrics has;
- the write guard: `POST` routes (create a topic, reset a group's offsets) answer 403 unless the broker's
  `admin_console_writes` is on, and take only `application/json` bodies from this origin (a cross-site form cannot
  send one without the browser asking first). A reset is refused (409) while the group has members, as Kafka's
  tool refuses it. In cluster mode any broker's console resets: the group's coordinator commits, asking each
  partition's leader for its offsets (the consoles reach each other through the admin listeners the brokers
  register in the cluster).

Message bytes are untrusted: every string the API returns is JSON with `<`, `>` and `&` written as `\\u003c`..., so
no answer can be read as markup even by a client that sniffs it; keys, values and headers are decoded as UTF-8
with replacement characters and cut at `MAX_SHOWN` bytes (the full size is reported).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from mqk import __version__
from mqk.broker import topic_config
from mqk.errors import MqkError
from mqk.protocol.native.codes import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
from mqk.protocol.native.records import HEADER_BORN_HOST, HEADER_FLAG, HEADER_RECONSUME, batch_records
from mqk.server.admin.health import readiness
from mqk.server.admin.http import HttpRequest, HttpResponse, HttpServer
from mqk.server.admin.parts import BrokerParts
from mqk.timer.delay import unwrap
from mqk.timer.service import TIMER_TOPIC

log = logging.getLogger("mqk.admin")

#: bytes of a key, value or header value the API shows (the rest is counted, not sent)
MAX_SHOWN = 4096
#: records one message query answers at most
MAX_RECORDS = 200
#: bytes one partition read takes from the store per step of a query
READ_BYTES = 1 << 20
#: pending delayed messages one query lists at most
MAX_DELAYED = 500
#: how long one /api/stats answer serves every console polling it
STATS_TTL_S = 1.0

STATIC_FILES = {
    "/console/": ("index.html", "text/html; charset=utf-8"),
    "/console/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/console/console.css": ("console.css", "text/css; charset=utf-8"),
}
SECURITY_HEADERS = [
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
]
#: header names that mark a record as a RocketMQ message (its headers are then its properties)
_ROCKETMQ_MARKS = {PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, PROPERTY_TAGS, PROPERTY_KEYS, "WAIT"}
_MQK_HEADERS = {HEADER_FLAG, HEADER_RECONSUME, HEADER_BORN_HOST}


class ApiError(Exception):
    """A request the API refuses: its HTTP status and the reason shown to the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def safe_json(obj: Any, status: int = 200) -> HttpResponse:
    """A JSON answer in which no string can close a tag or start an entity (see the module docstring)."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False)
    text = text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    return HttpResponse(status, text.encode() + b"\n", "application/json; charset=utf-8", list(SECURITY_HEADERS))


def shown_bytes(data: bytes | memoryview | None) -> dict[str, Any] | None:
    """How the API shows a key, value or header value: its size, its text (UTF-8, replacement characters for
    what is not), whether it is binary (then also its first bytes in base64), cut at MAX_SHOWN bytes."""
    if data is None:
        return None
    raw = bytes(data)
    head = raw[:MAX_SHOWN]
    try:
        text = head.decode("utf-8")
        binary = False
    except UnicodeDecodeError as exc:
        # a character cut at MAX_SHOWN is not binary data
        binary = not (len(raw) > MAX_SHOWN and exc.start >= len(head) - 3)
        text = head.decode("utf-8", "replace")
    shown: dict[str, Any] = {"size": len(raw), "text": text, "truncated": len(raw) > MAX_SHOWN, "binary": binary}
    if binary:
        shown["base64"] = base64.b64encode(head).decode()
    return shown


def decode_batch(data: bytes | memoryview, partition: int, min_offset: int = 0) -> list[dict[str, Any]]:
    """The records of one stored batch at or after `min_offset`, as the API shows them."""
    header, records = batch_records(data)
    base_offset, attributes, base_ts, max_ts = header[0], header[5], header[7], header[8]
    log_append = bool(attributes & 0x08)
    control = bool(attributes & 0x20)
    out = []
    for _attrs, ts_delta, delta, key, value, headers in records:
        offset = base_offset + delta
        if offset < min_offset:
            continue
        names = {name for name, _v in headers}
        rocketmq = bool(names & (_ROCKETMQ_MARKS | _MQK_HEADERS))
        record: dict[str, Any] = {
            "partition": partition,
            "offset": offset,
            "timestamp": max_ts if log_append else base_ts + ts_delta,
            "timestamp_type": "LogAppendTime" if log_append else "CreateTime",
            "control": control,
            "key": shown_bytes(key),
            "value": shown_bytes(value),
            "headers": [{"key": name, "value": shown_bytes(raw)} for name, raw in headers],
        }
        if rocketmq:
            props = {}
            extra: dict[str, str] = {}
            for name, raw in headers:
                text = "" if raw is None else raw.decode("utf-8", "replace")
                if name in _MQK_HEADERS:
                    extra[name.removeprefix("mqk.")] = text
                else:
                    props[name] = text
            record["rocketmq"] = {
                "properties": props,
                "tags": props.get(PROPERTY_TAGS),
                "keys": props.get(PROPERTY_KEYS, "").split() if props.get(PROPERTY_KEYS) else [],
                "flag": extra.get("flag", "0"),
                "reconsume_times": extra.get("reconsume", "0"),
                "born_host": extra.get("born"),
            }
        out.append(record)
    return out


def _carries_key(record: dict[str, Any], key: str) -> bool:
    """Whether a decoded record has `key`: as its Kafka record key, or among its RocketMQ KEYS (the key index
    finds entries by a hash of the key, so each hit is checked)."""
    shown = record["key"]
    if shown is not None and not shown["truncated"] and shown["text"] == key:
        return True
    return key in record.get("rocketmq", {}).get("keys", ())


def _int_arg(request: HttpRequest, name: str, default: int | None = None, minimum: int | None = None) -> int:
    raw = request.arg(name)
    if raw is None or raw == "":
        if default is None:
            raise ApiError(400, f"missing parameter {name!r}")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"parameter {name!r} must be an integer") from None
    if minimum is not None and value < minimum:
        raise ApiError(400, f"parameter {name!r} must be at least {minimum}")
    return value


Endpoint = Callable[[HttpRequest], Awaitable[Any]]


class Console:
    """The console's pages and JSON API on an admin HttpServer (see the module docstring)."""

    def __init__(self, parts: BrokerParts) -> None:
        self.parts = parts
        self._static: dict[str, bytes] = {}
        self._stats: tuple[float, dict[str, Any]] | None = None
        self._stats_lock = asyncio.Lock()

    def install(self, http: HttpServer) -> None:
        http.route("GET", "/", self.root)
        http.route("GET", "/console", self.root)
        http.route("GET", "/favicon.ico", self.no_icon)
        for path in STATIC_FILES:
            http.route("GET", path, self.page)
        reads: dict[str, Endpoint] = {
            "/api/overview": self.overview,
            "/api/stats": self.stats,
            "/api/topics": self.topics,
            "/api/topic": self.topic,
            "/api/groups": self.groups,
            "/api/group": self.group,
            "/api/messages": self.messages,
            "/api/delayed": self.delayed,
        }
        for path, endpoint in reads.items():
            http.route("GET", path, self._json(endpoint))
        http.route("POST", "/api/topics", self._json(self._write(self.create_topic)))
        http.route("POST", "/api/group/reset-offsets", self._json(self._write(self.reset_offsets)))
        # (cluster mode: the group's coordinator asks each partition's leader here for its reset target)
        http.route("GET", "/api/reset-target", self._json(self.reset_target))

    # --- plumbing --------------------------------------------------------------------------------------------

    def _json(self, endpoint: Endpoint) -> Callable[[HttpRequest], Awaitable[HttpResponse]]:
        async def handler(request: HttpRequest) -> HttpResponse:
            try:
                return safe_json(await endpoint(request))
            except ApiError as exc:
                return safe_json({"error": str(exc)}, exc.status)

        return handler

    def _write(self, endpoint: Endpoint) -> Endpoint:
        """The write guard: writes enabled, a JSON body, from this origin (see the module docstring)."""

        async def guarded(request: HttpRequest) -> Any:
            if not self.parts.config.admin_console_writes:
                raise ApiError(403, "the console is read-only: set admin_console_writes = true to allow changes")
            if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
                raise ApiError(415, "a change takes a JSON body (Content-Type: application/json)")
            origin = request.headers.get("origin")
            host = request.headers.get("host", "")
            if origin is not None and origin not in (f"http://{host}", f"https://{host}"):
                raise ApiError(403, "a change must come from the console's own origin")
            return await endpoint(request)

        return guarded

    def _broker(self) -> Any:
        broker = self.parts.broker
        if broker is None or self.parts.store is None:
            raise ApiError(503, "the broker is starting (its store is not open yet)")
        return broker

    @staticmethod
    def _body(request: HttpRequest) -> dict[str, Any]:
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            raise ApiError(400, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        return body

    # --- pages -----------------------------------------------------------------------------------------------

    async def root(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(302, b"", headers=[("Location", "/console/")])

    async def no_icon(self, request: HttpRequest) -> HttpResponse:
        # (browsers ask for it on every page: an empty answer, not a 404 in their logs)
        return HttpResponse(204, b"")

    async def page(self, request: HttpRequest) -> HttpResponse:
        name, content_type = STATIC_FILES[request.path]
        body = self._static.get(name)
        if body is None:
            body = self._static[name] = resources.files("mqk.server.admin").joinpath("static", name).read_bytes()
        return HttpResponse(200, body, content_type, list(SECURITY_HEADERS))

    # --- reads -----------------------------------------------------------------------------------------------

    async def overview(self, request: HttpRequest) -> dict[str, Any]:
        parts, config = self.parts, self.parts.config
        ready, checks = readiness(parts)
        listeners = {
            "kafka": parts.kafka_address,
            "rocketmq": parts.native_address,
            "namesrv": parts.namesrv_address,
        }
        return {
            "broker": {
                "version": __version__,
                "node_id": config.node_id,
                "cluster_id": config.cluster_id,
                "broker_group": config.group_name,
                "cluster_mode": bool(config.cluster),
                "storage": config.store.storage,
            },
            "listeners": {k: f"{v[0]}:{v[1]}" for k, v in listeners.items() if v is not None},
            "ready": ready,
            "checks": checks,
            "writes": config.admin_console_writes,
        }

    async def stats(self, request: HttpRequest) -> dict[str, Any]:
        """The figures the console charts: /metrics' snapshot summed over partitions, listeners and groups (the
        counters as totals: the page makes rates of them). Every open console polls it: one answer serves all of
        them for STATS_TTL_S, and the data directory is not walked for it."""
        async with self._stats_lock:
            cached = self._stats
            now = time.monotonic()
            if cached is None or now - cached[0] >= STATS_TTL_S:
                cached = self._stats = (now, await self._stats_now())
        return cached[1]

    async def _stats_now(self) -> dict[str, Any]:
        # (prometheus-client comes with the metrics module: loaded when the console first polls, not at start)
        from mqk.server.admin import metrics

        snap = await metrics.snapshot(self.parts, disk=False)
        requests = errors = connections = 0
        for meter in snap.meters:
            requests += sum(count for _api, count, _s, _b in meter.apis)
            errors += sum(count for _api, _e, count in meter.errors)
            connections += meter.live
        lag = 0
        for _group, _state, _members, commits in snap.groups:
            lag += sum(max(0, end - committed) for _t, _p, committed, end in commits)
        return {
            "time_ms": int(time.time() * 1000),
            "ready": snap.ready,
            "records_in": sum(p[5] for p in snap.partitions),
            "bytes_in": sum(p[6] for p in snap.partitions),
            "records_out": sum(sum(t[2]) for t in snap.traffic),
            "bytes_out": sum(sum(t[1]) for t in snap.traffic),
            "log_bytes": sum(p[4] for p in snap.partitions),
            "requests": requests,
            "request_errors": errors,
            "connections": connections,
            "consumer_lag": lag,
            "timer_pending": int(snap.services.get("timer_pending", 0)),
            "dispatch_lag_bytes": snap.store.get("dispatch_lag", 0),
            "flush_lag_bytes": snap.store.get("flush_lag", 0),
        }

    async def topics(self, request: HttpRequest) -> dict[str, Any]:
        broker = self._broker()
        store = broker.store
        out = []
        for name, info in sorted(broker.topics.all().items()):
            bounds = store.offset_bounds_many(name, list(range(info.queue_count)))
            size = records = 0
            local = 0
            for partition, bound in enumerate(bounds):
                if bound is None or not self._held(name, partition)[0]:
                    continue
                local += 1
                records += bound[1] - bound[0]
                size += await broker.log_sizes.size(name, partition)
            out.append(
                {
                    "name": name,
                    "partitions": info.queue_count,
                    "local_partitions": local,
                    "internal": broker.topics.is_internal(name),
                    "records": records,
                    "size_bytes": size,
                    "engine": info.engine,
                    "overrides": dict(info.config.overrides),
                }
            )
        return {"topics": out}

    def _held(self, topic: str, partition: int) -> tuple[bool, dict[str, Any]]:
        """Whether this broker holds the partition's log, and (in cluster mode) where the cluster places it: its
        broker group, its leader's node id, whether this broker leads it. A single broker holds every partition.
        (In a cluster every broker's store has a queue for each partition; only its group's have records.)"""
        cluster = self.parts.cluster
        if cluster is None or self._broker().topics.is_internal(topic):
            return True, {}
        record = cluster.topic(topic)
        if record is None or not 0 <= partition < len(record.partitions):
            return False, {}
        group = record.partitions[partition][0]
        placement = {
            "broker_group": group,
            "leader": cluster.leader(topic, partition)[0],
            "leads": cluster.leads(topic, partition),
        }
        return group == cluster.group, placement

    def _topic_info(self, name: str | None) -> Any:
        broker = self._broker()
        if not name:
            raise ApiError(400, "missing parameter 'name'")
        info = broker.topics.get(name)
        if info is None:
            raise ApiError(404, f"no topic {name!r}")
        return info

    async def topic(self, request: HttpRequest) -> dict[str, Any]:
        broker = self._broker()
        info = self._topic_info(request.arg("name"))
        name = info.topic
        store = broker.store
        partitions = []
        for partition, bound in enumerate(store.offset_bounds_many(name, list(range(info.queue_count)))):
            held, placement = self._held(name, partition)
            if bound is None or not held:
                partitions.append({"partition": partition, "local": False, **placement})
                continue
            partitions.append(
                {
                    "partition": partition,
                    "local": True,
                    **placement,
                    "log_start_offset": bound[0],
                    "log_end_offset": bound[1],
                    "records": bound[1] - bound[0],
                    "size_bytes": await broker.log_sizes.size(name, partition),
                }
            )
        configs = [
            {"name": s.key.name, "value": s.value, "default": not s.overridden, "acted_on": s.key.acted_on}
            for s in topic_config.describe(info.config)
        ]
        return {
            "name": name,
            "internal": broker.topics.is_internal(name),
            "engine": info.engine,
            "topic_id": base64.urlsafe_b64encode(bytes(info.topic_id)).decode().rstrip("="),
            "partitions": partitions,
            "configs": configs,
            "key_index": info.config.get("index.keys") == "true",
        }

    def _coordinator(self) -> Any:
        kafka = self.parts.kafka
        return kafka.groups if kafka is not None else None

    def _group_rows(self, group_id: str) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]], str, str]:
        """(state, members, committed offsets with lag, protocol type, protocol) of a group."""
        store = self._broker().store
        coordinator = self._coordinator()
        state, members, ptype, protocol = "Empty", [], "", ""
        described = coordinator.describe(group_id) if coordinator is not None else None
        if described is not None:
            state, ptype, protocol = described["group_state"], described["protocol_type"], described["protocol_data"]
            members = [
                {
                    "member_id": m["member_id"],
                    "instance_id": m["group_instance_id"],
                    "client_id": m["client_id"],
                    "client_host": m["client_host"],
                }
                for m in described["members"]
            ]
        offsets = []
        for (topic, partition), committed in sorted(store.fetch_offsets(group_id).items()):
            info = store.topic(topic)
            end = None
            if info is not None and 0 <= partition < info.queue_count:
                end = store.end_offset(topic, partition)
            offsets.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "committed_offset": committed.offset,
                    "log_end_offset": end,
                    "lag": None if end is None else max(0, end - committed.offset),
                    "metadata": committed.metadata,
                }
            )
        return state, members, offsets, ptype, protocol

    def _group_ids(self) -> list[str]:
        store = self._broker().store
        ids = set(store.list_offset_groups())
        coordinator = self._coordinator()
        if coordinator is not None:
            ids.update(coordinator.group_ids())
        return sorted(ids)

    async def groups(self, request: HttpRequest) -> dict[str, Any]:
        out = []
        for group_id in self._group_ids():
            state, members, offsets, ptype, _protocol = self._group_rows(group_id)
            out.append(
                {
                    "group": group_id,
                    "state": state,
                    "protocol_type": ptype,
                    "members": len(members),
                    "partitions": len(offsets),
                    "lag": sum(o["lag"] or 0 for o in offsets),
                }
            )
        return {"groups": out}

    async def group(self, request: HttpRequest) -> dict[str, Any]:
        group_id = request.arg("id")
        if not group_id:
            raise ApiError(400, "missing parameter 'id'")
        if group_id not in self._group_ids():
            raise ApiError(404, f"no group {group_id!r}")
        state, members, offsets, ptype, protocol = self._group_rows(group_id)
        return {
            "group": group_id,
            "state": state,
            "protocol_type": ptype,
            "protocol": protocol,
            "members": members,
            "offsets": offsets,
            "lag": sum(o["lag"] or 0 for o in offsets),
        }

    async def messages(self, request: HttpRequest) -> dict[str, Any]:
        """Records of a topic: `partition` from `offset` (default its log start), or from the first record at or
        after `timestamp` (ms); or, with `key`, the newest records carrying that key, through the key index."""
        broker = self._broker()
        info = self._topic_info(request.arg("topic"))
        topic = info.topic
        limit = min(_int_arg(request, "limit", 20, 1), MAX_RECORDS)
        key = request.arg("key")
        store = broker.store
        if key is not None and key != "":
            wanted = key.encode()
            records = []
            for partition, batch in await store.read_by_key(topic, wanted, MAX_RECORDS):
                for record in decode_batch(batch.data, partition):
                    if _carries_key(record, key):
                        records.append(record)
            records.sort(key=lambda r: (r["timestamp"], r["partition"], r["offset"]), reverse=True)
            return {
                "topic": topic,
                "by": "key",
                "key": key,
                "key_index": info.config.get("index.keys") == "true",
                "records": records[:limit],
            }
        partition = _int_arg(request, "partition", 0, 0)
        if partition >= info.queue_count:
            raise ApiError(404, f"topic {topic!r} has no partition {partition}")
        bound = store.offset_bounds_many(topic, [partition])[0]
        held, placement = self._held(topic, partition)
        if bound is None or not held:
            where = f" (its leader is node {placement['leader']})" if "leader" in placement else ""
            raise ApiError(404, f"partition {partition} of {topic!r} is not held by this broker{where}")
        start, end = bound
        by = "offset"
        if request.arg("timestamp"):
            by = "timestamp"
            found = await store.offset_for_timestamp(topic, partition, _int_arg(request, "timestamp"))
            offset = end if found is None else found[0]
        else:
            offset = _int_arg(request, "offset", start)
        offset = max(offset, start)
        records = []
        position = offset
        while position < end and len(records) < limit:
            result = await store.read(topic, partition, position, READ_BYTES)
            if not result.batches:
                break
            for batch in result.batches:
                records.extend(decode_batch(batch.data, partition, position))
            position = max(position + 1, result.next_offset)
        return {
            "topic": topic,
            "by": by,
            "partition": partition,
            "from_offset": offset,
            "log_start_offset": start,
            "log_end_offset": end,
            "records": records[:limit],
            "next_offset": records[limit - 1]["offset"] + 1 if len(records) >= limit else min(position, end),
        }

    async def delayed(self, request: HttpRequest) -> dict[str, Any]:
        """The timer's backlog: how many delayed messages wait, and the first ones due, with their target."""
        store = self._broker().store
        timer = self.parts.timer
        limit = min(_int_arg(request, "limit", 50, 1), MAX_DELAYED)
        if timer is None:
            return {"enabled": False, "pending": 0, "delivered": 0, "items": []}
        items = []
        for due, timer_offset in timer.upcoming(limit):
            item: dict[str, Any] = {"due_ms": due, "timer_offset": timer_offset}
            try:
                result = await store.read(TIMER_TOPIC, 0, timer_offset, 64 * 1024)
                for batch in result.batches[:1]:
                    for offset, waiting in unwrap(batch.data, timer_offset):
                        if offset == timer_offset:
                            _header, records = batch_records(waiting.batch)
                            # (RocketMQ KEYS travel beside the batch; a Kafka record's key is in it)
                            keys = list(dict.fromkeys([*waiting.keys, *(r[3] for r in records if r[3] is not None)]))
                            item.update(
                                topic=waiting.topic,
                                queue=waiting.queue,
                                keys=[shown_bytes(k) for k in keys[:10]],
                                records=len(records),
                                size_bytes=len(waiting.batch),
                            )
                            break
            except MqkError as exc:  # a message retention already took: listed with its due time only
                item["error"] = str(exc)
            items.append(item)
        return {"enabled": True, "pending": timer.pending, "delivered": timer.delivered, "items": items}

    # --- writes ----------------------------------------------------------------------------------------------

    async def create_topic(self, request: HttpRequest) -> dict[str, Any]:
        body = self._body(request)
        name = body.get("name")
        partitions = body.get("partitions", self.parts.config.num_partitions)
        configs = body.get("configs") or {}
        if not isinstance(name, str) or not name:
            raise ApiError(400, "a topic needs a name")
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise ApiError(400, "partitions must be a positive integer")
        if not isinstance(configs, dict) or not all(isinstance(v, str) for v in configs.values()):
            raise ApiError(400, "configs must map names to string values")
        try:
            info = await self._broker().topics.create(name, partitions, configs)
        except MqkError as exc:
            raise ApiError(400, f"cannot create {name!r}: {exc}") from None
        log.info("admin console: created topic %s with %d partitions", name, partitions)
        return {"created": info.topic, "partitions": info.queue_count}

    async def reset_offsets(self, request: HttpRequest) -> dict[str, Any]:
        """Set a group's committed offsets of one topic (every partition, or those listed) to the earliest or
        latest offset, a given offset, or the first offset at a timestamp. Refused while the group has members.

        In cluster mode the group's coordinator commits and each partition's leader knows its offsets, perhaps
        other brokers: a broker that does not coordinate the group hands the request to the console of the one
        that does (its admin listener, registered in the cluster), and that one asks each leader's console for the
        partition's target (`/api/reset-target`), as Kafka's tool asks the coordinator and the leaders."""
        body = self._body(request)
        group_id, topic, to = body.get("group"), body.get("topic"), body.get("to")
        if not isinstance(group_id, str) or not group_id or not isinstance(topic, str):
            raise ApiError(400, "a reset names a group and a topic")
        if to not in RESET_TO:
            raise ApiError(400, "to must be one of earliest, latest, offset, timestamp")
        value = body.get("value")
        if to in ("offset", "timestamp") and (not isinstance(value, int) or isinstance(value, bool)):
            raise ApiError(400, f"to={to} needs an integer value")
        coordinator = self._coordinator()
        if coordinator is None:
            raise ApiError(503, "the Kafka front door is not running")
        cluster = self.parts.cluster
        if cluster is not None and cluster.coordinator(group_id) < 0:
            # no offsets topic yet (Kafka makes it on the first FindCoordinator): made now, as a client would
            await cluster.ensure_offsets_topic()
            await cluster.view.wait_until(lambda _state: cluster.coordinator(group_id) >= 0, PEER_TIMEOUT_S / 3)
        if cluster is not None and not cluster.coordinates(group_id):
            return await self._at_coordinator(request, group_id, body)
        info = self._topic_info(topic)
        described = coordinator.describe(group_id)
        if described is not None and (described["members"] or described["group_state"] not in ("Empty", "Dead")):
            raise ApiError(
                409,
                f"group {group_id!r} is {described['group_state']} with {len(described['members'])} member(s): "
                "stop its consumers before resetting its offsets",
            )
        wanted = body.get("partitions")
        partitions = list(range(info.queue_count)) if wanted in (None, []) else wanted
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 <= p < info.queue_count for p in partitions
        ):
            raise ApiError(400, f"partitions must be a list of partitions of {topic!r}")
        targets: dict[tuple[str, int], tuple[int, int, str | None]] = {}
        for partition in partitions:
            if cluster is not None and not cluster.leads(topic, partition):
                offset = await self._target_at_leader(topic, partition, to, value)
            else:
                offset = await self._target(topic, partition, to, value)
            targets[(topic, partition)] = (offset, -1, "")
        codes = await coordinator.commit_offsets(group_id, -1, "", targets)
        failed = {f"{t}/{p}": code for (t, p), code in codes.items() if code}
        if failed:
            raise ApiError(409, f"the group refused the commit (Kafka error codes {failed})")
        log.info("admin console: reset group %s on %s to %s", group_id, topic, to)
        return {
            "group": group_id,
            "offsets": [{"topic": t, "partition": p, "offset": o[0]} for (t, p), o in sorted(targets.items())],
        }

    async def reset_target(self, request: HttpRequest) -> dict[str, Any]:
        """The offset a reset `to` (and `value`) sets for a partition this broker holds."""
        topic, to, given = request.arg("topic"), request.arg("to"), request.arg("value")
        try:
            partition = int(request.arg("partition") or "")
            value = int(given) if given is not None else None
        except ValueError:
            raise ApiError(400, "partition and value must be integers") from None
        if to not in RESET_TO or (to in ("offset", "timestamp") and value is None):
            raise ApiError(400, "to must be one of earliest, latest, offset, timestamp (the last two with a value)")
        name = self._topic_info(topic).topic
        return {"topic": name, "partition": partition, "offset": await self._target(name, partition, to, value)}

    async def _target(self, topic: str, partition: int, to: str, value: int | None) -> int:
        """The offset of this broker's log of `topic`[`partition`] that a reset `to` sets (clamped to the log)."""
        store = self._broker().store
        in_range = 0 <= partition < self._topic_info(topic).queue_count
        bound = store.offset_bounds_many(topic, [partition])[0] if in_range else None
        if bound is None or (self.parts.cluster is not None and not self._held(topic, partition)[0]):
            raise ApiError(404, f"partition {partition} of {topic!r} is not held by this broker")
        start, end = bound
        if to == "earliest":
            return int(start)
        if to == "latest":
            return int(end)
        assert value is not None
        if to == "offset":
            return int(min(max(value, start), end))
        found = await store.offset_for_timestamp(topic, partition, value)
        return int(end if found is None else found[0])

    def _admin_of(self, node: int, what: str) -> tuple[str, int]:
        """The admin listener of broker `node` as the cluster's metadata registers it (503 when there is none)."""
        cluster = self.parts.cluster
        assert cluster is not None
        record = cluster.view.broker(node) if node >= 0 else None
        address = record.address("admin") if record is not None else None
        if address is None:
            raise ApiError(
                503,
                f"{what} (node {node}) is not live or has no admin listener now: reset with `mqk groups "
                "reset-offsets GROUP --topic TOPIC --to-... --execute`, or try again",
            )
        return address

    async def _at_coordinator(self, request: HttpRequest, group_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Hand a reset to the console of the group's coordinator (once: a broker that was handed it and does not
        coordinate the group either, the two views of the cluster disagreeing for a moment, answers 503)."""
        cluster = self.parts.cluster
        assert cluster is not None
        node = cluster.coordinator(group_id)
        if request.headers.get(FORWARDED_HEADER.lower()) is not None:
            raise ApiError(503, f"group {group_id!r} is coordinated by node {node} now, not here: try again")
        host, port = self._admin_of(node, f"the coordinator of group {group_id!r}")
        status, answer = await _admin_call(
            "POST", host, port, "/api/group/reset-offsets", json.dumps(body).encode(), {FORWARDED_HEADER: "1"}
        )
        if status != 200:
            raise ApiError(status, str(answer.get("error", answer)))
        return answer

    async def _target_at_leader(self, topic: str, partition: int, to: str, value: int | None) -> int:
        cluster = self.parts.cluster
        assert cluster is not None
        node = cluster.leader(topic, partition)[0]
        host, port = self._admin_of(node, f"the leader of {topic}[{partition}]")
        query = urllib.parse.urlencode(
            {"topic": topic, "partition": partition, "to": to, **({"value": value} if value is not None else {})}
        )
        status, answer = await _admin_call("GET", host, port, f"/api/reset-target?{query}")
        if status != 200:
            raise ApiError(status, f"the leader of {topic}[{partition}] (node {node}): {answer.get('error', answer)}")
        return int(answer["offset"])


#: what a reset may set a group's offsets to
RESET_TO = ("earliest", "latest", "offset", "timestamp")
#: marks a reset one console handed to another (which does not hand it on)
FORWARDED_HEADER = "X-Mqk-Forwarded"
#: how long a console waits for another broker's console
PEER_TIMEOUT_S = 30.0


async def _admin_call(
    method: str, host: str, port: int, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """(status, JSON answer) of a request to another broker's console; 502 when it cannot be reached or answers
    what is not JSON."""

    def call() -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(f"http://{host}:{port}{path}", data=body, method=method)
        request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=PEER_TIMEOUT_S) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    try:
        return await asyncio.to_thread(call)
    except (OSError, ValueError) as exc:
        raise ApiError(502, f"the console at {host}:{port} did not answer: {exc}") from None


__all__ = ["Console", "decode_batch", "safe_json", "shown_bytes"]
