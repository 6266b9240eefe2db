"""Client quotas, Kafka's model (KIP-13, KIP-55, KIP-219, KIP-546): produce and fetch byte rates per user and client id,
protocol-neutral; the Kafka front door measures its requests against them and throttles.

Entities are Kafka's: a user, a client id, or a user and a client id, where either name may be the default (None:
`<default>` in Kafka's tools). A quota key is `producer_byte_rate` or `consumer_byte_rate` (bytes per second); mqk
refuses the others (`request_percentage`, `controller_mutation_rate`, IP quotas), which it does not enforce.

Which quota applies to a request of user U with client id C: per key, the first entity in Kafka's order that sets it:
/users/U/clients/C, /users/U/clients/<default>, /users/U, /users/<default>/clients/C,
/users/<default>/clients/<default>, /users/<default>, /clients/C, /clients/<default>. The rate is measured per
matched entity with the default names replaced by the request's (a default user quota applies to each user on its
own, as in Kafka), so every client id of U shares a quota set on /users/U.

Measuring (Kafka's windowed rate): bytes are recorded into 1-second samples; the rate is the bytes of the last
`SAMPLES` samples over the time they span, counted as at least one second (Kafka counts at least ten: see
`Rate.span`). A request that takes the rate over the quota is answered with throttle_time_ms = (rate - quota) /
quota * span, at most the whole window (mqk's bound, so one huge request cannot mute a client for longer than the
window remembers it); the connection then reads nothing for that long (KIP-219: the client is told, and the broker
mutes it, so old clients are slowed too). Produce is measured by request size, Fetch by response size (a throttled
Fetch is answered empty and its bytes are not counted, as Kafka does).

Where quotas live: a broker on its own, `<data-dir>/security/client-quotas.json` (atomically replaced); a
memory-store broker, in memory. In cluster mode they are the cluster's, as in Kafka: one etcd key per entity
(`quotas/<quoted entity>`), changed through any broker and followed by every broker through its view; each broker
measures and throttles what it serves itself (Kafka's quotas are per broker too).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from mqk.clock import Clock
from mqk.store.fsutil import atomic_write_json, read_json

if TYPE_CHECKING:
    from mqk.broker.cluster import ClusterMember

log = logging.getLogger("mqk.quotas")

USER, CLIENT_ID = "user", "client-id"
PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE = "producer_byte_rate", "consumer_byte_rate"
KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)
FILE = "client-quotas.json"
#: Kafka's quota.window.num and quota.window.size.seconds
SAMPLES = 11
SAMPLE_S = 1.0

#: an entity: its (type, name) components in the order (user, client-id); name None is the default
Entity = tuple[tuple[str, str | None], ...]


class QuotaError(ValueError):
    """A quota change refused (INVALID_REQUEST in Kafka's AlterClientQuotas)."""


def entity_of(components: Iterable[tuple[str, str | None]]) -> Entity:
    """The entity of these components, checked: user and/or client-id, each at most once, no empty user name."""
    seen: dict[str, str | None] = {}
    for kind, name in components:
        if kind not in (USER, CLIENT_ID):
            raise QuotaError(f"entity type {kind!r} is not supported (user and client-id are)")
        if kind in seen:
            raise QuotaError(f"entity type {kind!r} given twice")
        if kind == USER and name == "":
            raise QuotaError("an empty user name")
        seen[kind] = name
    if not seen:
        raise QuotaError("an entity needs a user or a client-id")
    return tuple((kind, seen[kind]) for kind in (USER, CLIENT_ID) if kind in seen)


def _order(user: str, client_id: str) -> tuple[Entity, ...]:
    """The entities that may hold a request's quota, most specific first (Kafka's order)."""
    return (
        ((USER, user), (CLIENT_ID, client_id)),
        ((USER, user), (CLIENT_ID, None)),
        ((USER, user),),
        ((USER, None), (CLIENT_ID, client_id)),
        ((USER, None), (CLIENT_ID, None)),
        ((USER, None),),
        ((CLIENT_ID, client_id),),
        ((CLIENT_ID, None),),
    )


class Rate:
    """Bytes over the last SAMPLES one-second samples (Kafka's windowed Rate)."""

    __slots__ = ("_samples",)

    def __init__(self) -> None:
        self._samples: list[list[float]] = []  # [sample start, bytes]

    def record(self, value: float, now: float) -> None:
        samples = self._samples
        if not samples or now - samples[-1][0] >= SAMPLE_S:
            samples.append([now, 0.0])
            if len(samples) > SAMPLES:
                del samples[0]
        samples[-1][1] += value

    def unrecord(self, value: float) -> None:
        if self._samples:
            self._samples[-1][1] -= value

    def span(self, now: float) -> float:
        """The time the samples cover, at least one sample's length: a client starting with a burst is allowed one
        second's worth of it (Kafka counts at least ten seconds, which lets a tenfold burst through at start and
        again, in a sawtooth, each time it leaves the window; mqk keeps a client at its rate instead)."""
        start = self._samples[0][0] if self._samples else now
        return max(now - start, SAMPLE_S)

    def value(self, now: float) -> float:
        samples = self._samples
        while samples and now - samples[0][0] >= SAMPLES * SAMPLE_S:
            del samples[0]
        return sum(s[1] for s in samples) / self.span(now)


@dataclass(frozen=True, slots=True)
class Throttle:
    """A request's quota verdict: how long to throttle (ms), and what was measured."""

    ms: int
    key: str
    entity: Entity


NOT_THROTTLED = Throttle(0, "", ())


class ClientQuotas:
    def __init__(self, clock: Clock, path: Path | None) -> None:
        """`path`: the JSON file the quotas live in (None: in memory only)."""
        self.clock = clock
        self.path = path
        self._quotas: dict[Entity, dict[str, float]] = {}
        self._rates: dict[tuple[str, Entity], Rate] = {}
        #: throttled responses so far (for /metrics and tests)
        self.throttled = 0
        #: cluster mode: the membership whose etcd keys hold the quotas (`attach_cluster`)
        self._cluster: ClusterMember | None = None
        self._seen: tuple[object, int] = (None, -1)

    # --- the quotas ---------------------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether any quota is set (requests are measured only then)."""
        return bool(self._quotas)

    def load(self) -> None:
        if self.path is None:
            return
        doc = read_json(self.path)
        if not doc:
            return
        for item in doc.get("quotas", []):
            entity = entity_of((kind, name) for kind, name in item["entity"])
            self._quotas[entity] = {k: float(v) for k, v in item["values"].items() if k in KEYS}

    def attach_cluster(self, cluster: ClusterMember) -> None:
        """Cluster mode: the quotas are the cluster's (in etcd) from now on, followed through the view's changes."""
        self._cluster = cluster
        if self._quotas:
            log.warning(
                "client quotas: the %d kept in %s are not the cluster's and are not applied",
                len(self._quotas),
                self.path,
            )
        self._quotas = {}
        self._follow()
        cluster.view.add_listener(self._follow)

    def _follow(self) -> None:
        """A view change: the quotas read again if it touched their keys."""
        assert self._cluster is not None
        table = self._cluster.table(self._cluster.keys.quotas)
        seen = table.generation()
        if seen == self._seen:
            return
        self._seen = seen
        quotas: dict[Entity, dict[str, float]] = {}
        for tail, value in table.values.items():
            try:
                doc = json.loads(value)
                entity = entity_of((kind, name) for kind, name in doc["entity"])
                quotas[entity] = {k: float(v) for k, v in doc["values"].items() if k in KEYS}
            except (ValueError, KeyError, TypeError, QuotaError) as exc:
                log.error("client quotas: cluster key %s skipped: %s", tail, exc)
        self._quotas = quotas
        self._rates.clear()

    def _save(self) -> None:
        if self.path is None or self._cluster is not None:
            return
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        items = [{"entity": [list(c) for c in e], "values": v} for e, v in sorted(self._quotas.items(), key=_sort_key)]
        atomic_write_json(self.path, {"quotas": items})

    def entries(self) -> dict[Entity, dict[str, float]]:
        return {e: dict(v) for e, v in self._quotas.items()}

    def check(self, entity: Entity, ops: Iterable[tuple[str, float, bool]]) -> None:
        """QuotaError if the ops (key, value, remove) cannot be applied to `entity`."""
        seen = set()
        for key, value, remove in ops:
            if key not in KEYS:
                raise QuotaError(f"quota {key!r} is not supported (mqk enforces {', '.join(KEYS)})")
            if key in seen:
                raise QuotaError(f"quota {key!r} given twice")
            seen.add(key)
            if not remove and not (value > 0 and math.isfinite(value)):
                raise QuotaError(f"{key} must be a positive number of bytes per second, not {value}")

    async def alter(self, entity: Entity, ops: Iterable[tuple[str, float, bool]]) -> None:
        """Apply the ops (key, value, remove) to `entity`'s quotas: QuotaError if they cannot be; OSError if the
        local file cannot be written; MetaUnavailable in cluster mode when etcd cannot take the change."""
        ops = list(ops)
        self.check(entity, ops)
        values = dict(self._quotas.get(entity, {}))
        for key, value, remove in ops:
            if remove:
                values.pop(key, None)
            else:
                values[key] = float(value)
        if self._cluster is not None:
            tail = quote(json.dumps([list(c) for c in entity]), safe="")
            if values:
                doc = {"entity": [list(c) for c in entity], "values": values}
                await self._cluster.write_table(self._cluster.keys.quotas, {tail: json.dumps(doc).encode()}, [])
            else:
                await self._cluster.write_table(self._cluster.keys.quotas, {}, [tail])
            log.info("client quotas of %s: %s (the cluster's)", describe(entity), values or "none")
            return
        if values:
            self._quotas[entity] = values
        else:
            self._quotas.pop(entity, None)
        self._rates.clear()  # which entity a client is measured under may have changed: measure afresh
        self._save()
        log.info("client quotas of %s: %s", describe(entity), values or "none")

    # --- measuring ----------------------------------------------------------------------------------------

    def quota_for(self, key: str, user: str, client_id: str) -> tuple[float, Entity] | None:
        """The quota of `key` that applies to (user, client id) and the entity it is measured under, or None."""
        quotas = self._quotas
        for entity in _order(user, client_id):
            values = quotas.get(entity)
            if values is not None and key in values:
                named = tuple((kind, user if kind == USER else client_id) for kind, _name in entity)
                return values[key], named
        return None

    def record(self, key: str, user: str, client_id: str, size: int) -> Throttle:
        """Count `size` bytes against the quota of `key` that applies, and say how long to throttle."""
        found = self.quota_for(key, user, client_id)
        if found is None:
            return NOT_THROTTLED
        quota, entity = found
        now = self.clock.monotonic()
        rate = self._rates.get((key, entity))
        if rate is None:
            rate = self._rates[(key, entity)] = Rate()
        rate.record(size, now)
        value = rate.value(now)
        if value <= quota:
            return NOT_THROTTLED
        ms = min((value - quota) / quota * rate.span(now), SAMPLES * SAMPLE_S) * 1000
        self.throttled += 1
        return Throttle(max(1, int(ms)), key, entity)

    def unrecord(self, throttle: Throttle, size: int) -> None:
        """Take back bytes recorded for a request that was answered without them (a throttled Fetch)."""
        rate = self._rates.get((throttle.key, throttle.entity))
        if rate is not None:
            rate.unrecord(size)


def _sort_key(item: tuple[Entity, Any]) -> list[tuple[str, str]]:
    return [(kind, name if name is not None else "") for kind, name in item[0]]


def describe(entity: Entity) -> str:
    """An entity as Kafka's tools write it: `user 'alice', client-id <default>`."""
    return ", ".join(f"{kind} {repr(name) if name is not None else '<default>'}" for kind, name in entity)
