"""A typed face over etcd v3 (through `aetcd`): get, prefix listing, compare-and-set transactions, leases, watches.

Owns:
- endpoint handling: `etcd://HOST:PORT[,HOST:PORT...]`; a call that finds its endpoint unreachable moves to the next
  one and tries again, once around the list, then raises `MetaUnavailable` (retriable for the caller); a
  transaction whose answer was lost (a timeout, a channel closed under it) is not sent again but raises
  `MetaOutcomeUnknown`;
- the value types the rest of mqk sees (`Record`, `Compare`, `Put`, `Delete`, `WatchEvent`), so nothing above this
  module depends on the client library's types;
- watches that survive a lost connection: `watch_prefix` lists the prefix, then follows it from the listing's
  revision; when the stream breaks (etcd restarted, the revision compacted) it lists again and goes on, yielding a
  `reset` event first so the reader rebuilds its view rather than patching it.

It must not: interpret keys or values (the cluster layer does), or retry a transaction whose outcome is unknown (a
timeout after sending may have committed: the caller re-reads and decides).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mqk.errors import MetaOutcomeUnknown, MetaUnavailable, MqkError

log = logging.getLogger("mqk.meta")


class LeaseExpired(MqkError):
    """etcd answered that the lease named in the call does not exist (it expired, or was revoked)."""


def parse_endpoints(url: str) -> list[tuple[str, int]]:
    """`etcd://HOST:PORT[,HOST:PORT...]` (the scheme may be left out) -> [(host, port), ...]; ValueError if bad."""
    rest = url.strip()
    if "://" in rest:
        scheme, rest = rest.split("://", 1)
        if scheme != "etcd":
            raise ValueError(f"cluster address {url!r}: expected etcd://HOST:PORT[,HOST:PORT...]")
    endpoints = []
    for part in rest.strip("/").split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"cluster address {url!r}: {part!r} is not HOST:PORT")
        endpoints.append((host.strip("[]"), int(port)))
    if not endpoints:
        raise ValueError(f"cluster address {url!r} names no etcd endpoint")
    return endpoints


@dataclass(frozen=True, slots=True)
class Record:
    """One key as etcd holds it."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a transaction: `target` of `key` `op` `value` (version 0 = the key does not exist)."""

    key: str
    target: Literal["version", "create", "mod", "value"]
    op: Literal["==", "!=", "<", ">"]
    value: int | bytes


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """`kind` "put" or "delete" of `record` (for a delete, the record's value is empty); "reset": the watch was
    (re-)established and `records` is the prefix's whole content at `revision`; "lost": etcd stopped answering (a
    "reset" follows once it answers again)."""

    kind: Literal["put", "delete", "reset", "lost"]
    record: Record | None = None
    records: tuple[Record, ...] = ()
    revision: int = 0


def _record(kv: Any) -> Record:
    return Record(kv.key.decode(), bytes(kv.value or b""), kv.create_revision, kv.mod_revision, kv.version, kv.lease)


class EtcdClient:
    """One connection to an etcd cluster (any of `endpoints`)."""

    def __init__(self, endpoints: Sequence[tuple[str, int]], *, timeout: float = 5.0) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self._current = 0
        self._client: Any = None
        self._closed = False

    # --- connection -------------------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        host, port = self.endpoints[self._current]
        return f"{host}:{port}"

    async def connect(self) -> None:
        """Connect to the first endpoint that answers (MetaUnavailable when none does)."""
        await self._call(lambda client: client.status())

    async def close(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.close()
            except Exception as exc:  # noqa: BLE001 - closing a broken channel: nothing left to do but log
                log.debug("closing the etcd client: %s", exc)

    def _new_client(self) -> Any:
        try:
            import aetcd
        except ImportError as exc:
            raise MetaUnavailable(
                "cluster mode needs the etcd client: pip install 'mqk[cluster]' (it brings aetcd)"
            ) from exc
        host, port = self.endpoints[self._current]
        return aetcd.Client(host=host, port=port, timeout=max(1, round(self.timeout)))

    async def reset_channel(self) -> None:
        """Close the current channel (its watches end) so the next call opens a fresh one."""
        await self._drop_channel()

    async def _drop_channel(self, client: Any = None) -> None:
        """Close the current channel (a broken one); given `client`, only if that is still the current one (a call
        that failed on a channel another call has replaced already leaves the new one alone)."""
        if client is not None and client is not self._client:
            return
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.close()
            except Exception as exc:  # noqa: BLE001 - the channel is broken already
                log.debug("closing a broken etcd channel: %s", exc)

    async def _call(self, op: Any, *, resend: bool = True) -> Any:
        """Run `op(client)` against the current endpoint, moving to the next one when it is unreachable, once around
        the list; MetaUnavailable after that. With `resend` False (a transaction: sending it twice is not sending
        it once) an answer lost after sending raises MetaOutcomeUnknown at once; only a connection that could not be
        made moves on to the next endpoint."""
        import aetcd.exceptions as aex

        if self._closed:
            raise MetaUnavailable("the etcd client is closed")
        last: BaseException | None = None
        for _ in range(len(self.endpoints)):
            if self._client is None:
                self._client = self._new_client()
            client = self._client
            unknown = False
            try:
                return await asyncio.wait_for(op(client), self.timeout)
            except aex.ConnectionFailedError as exc:
                last = exc
            except (aex.ConnectionTimeoutError, TimeoutError) as exc:
                last, unknown = exc, True
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the caller is being cancelled (a stop): not etcd's doing
                # another call dropped the channel under this one (closing a channel cancels the calls on it): the
                # outcome is unknown, as after a timeout, and must not end the caller's task
                last, unknown = ConnectionError("the channel was closed during the call"), True
            except aex.ClientError as exc:
                if "lease not found" in str(exc):
                    raise LeaseExpired(str(exc)) from None
                raise
            endpoint = self.endpoint
            log.debug("etcd at %s: %s", endpoint, last)
            if client is self._client:
                await self._drop_channel(client)
                self._current = (self._current + 1) % len(self.endpoints)
            if unknown and not resend:
                raise MetaOutcomeUnknown(f"etcd at {endpoint}: no answer to a transaction ({last or 'timeout'})")
        where = ", ".join(f"{h}:{p}" for h, p in self.endpoints)
        detail = str(last) if last is not None and str(last) else f"no answer in {self.timeout:g} s"
        raise MetaUnavailable(f"etcd unreachable at {where}: {detail}")

    # --- keys ---------------------------------------------------------------------------------------------------

    async def get(self, key: str) -> Record | None:
        found = await self._call(lambda c: c.get(key.encode()))
        return None if found is None else _record(found)

    async def get_prefix(self, prefix: str) -> tuple[list[Record], int]:
        """Every key under `prefix` and the store's revision at the time of the read."""

        async def op(client: Any) -> tuple[list[Record], int]:
            found = await client.get_prefix(prefix.encode())
            # the header's revision is the store's, not the newest key's: a watch from revision + 1 misses nothing
            return [_record(kv) for kv in found], found.header.revision

        result: tuple[list[Record], int] = await self._call(op)
        return result

    async def put(self, key: str, value: bytes, lease: int = 0) -> None:
        await self._call(lambda c: c.put(key.encode(), value, lease=lease or None))

    async def delete(self, key: str) -> None:
        await self._call(lambda c: c.delete(key.encode()))

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Put | Delete], failure: Sequence[Put | Delete] = ()
    ) -> bool:
        """A compare-and-set transaction: `success` if every compare holds, else `failure`. Returns which."""
        return (await self.txn_at(compares, success, failure))[0]

    async def txn_at(
        self, compares: Sequence[Compare], success: Sequence[Put | Delete], failure: Sequence[Put | Delete] = ()
    ) -> tuple[bool, int]:
        """`txn`, and the store's revision after it (a watcher has seen the transaction once it reaches that)."""

        def build(client: Any) -> Any:
            t = client.transactions
            conds = []
            for c in compares:
                target = {"version": t.version, "create": t.create, "mod": t.mod, "value": t.value}[c.target]
                subject = target(c.key.encode())
                # (each comparison operator sets the compare object's op: evaluate only the one asked for)
                if c.op == "==":
                    conds.append(subject == c.value)
                elif c.op == "!=":
                    conds.append(subject != c.value)
                elif c.op == "<":
                    conds.append(subject < c.value)
                else:
                    conds.append(subject > c.value)

            def ops(items: Sequence[Put | Delete]) -> list[Any]:
                return [
                    t.put(i.key.encode(), i.value, lease=i.lease or None)
                    if isinstance(i, Put)
                    else t.delete(i.key.encode())
                    for i in items
                ]

            async def run() -> tuple[bool, int]:
                succeeded, responses = await client.transaction(
                    compare=conds, success=ops(success), failure=ops(failure)
                )
                # (aetcd keeps the transaction's own header to itself; each put or delete answers with one)
                revision = 0
                for response in responses:
                    for kind in ("response_put", "response_delete_range"):
                        if response.HasField(kind):
                            revision = max(revision, getattr(response, kind).header.revision)
                return bool(succeeded), revision

            return run()

        result: tuple[bool, int] = await self._call(build, resend=False)
        return result

    # --- leases -------------------------------------------------------------------------------------------------

    async def grant(self, ttl: int) -> int:
        lease = await self._call(lambda c: c.lease(ttl))
        return int(lease.id)

    async def keepalive(self, lease_id: int) -> int:
        """Refresh the lease; its remaining TTL in seconds, 0 when it has expired (its keys are gone)."""
        reply = await self._call(lambda c: c.refresh_lease(lease_id))
        return int(reply.TTL) if reply is not None else 0

    async def revoke(self, lease_id: int) -> None:
        await self._call(lambda c: c.revoke_lease(lease_id))

    async def changed_since(self, prefix: str, revision: int) -> bool:
        """Whether a key under `prefix` was written after `revision`. etcd applies the revision filters to the
        keys it returns but not to its `count` (a count-only range counts every key), so this asks for at most
        one key, without its value; aetcd's range helpers drop the filters, so the request is built here."""
        from aetcd import rpc, utils

        request = rpc.RangeRequest(
            key=prefix.encode(),
            range_end=utils.prefix_range_end(prefix.encode()),
            keys_only=True,
            limit=1,
            min_mod_revision=revision + 1,
        )

        async def op(client: Any) -> bool:
            await client.connect()
            answer = await client.kvstub.Range(request, timeout=client._timeout, metadata=client.metadata)
            return len(answer.kvs) > 0

        result: bool = await self._call(op)
        return result

    # --- watches ------------------------------------------------------------------------------------------------

    async def watch_prefix(self, prefix: str, retry_seconds: float = 0.5) -> AsyncIterator[WatchEvent]:
        """The prefix's content as a `reset` event, then its changes; after a broken stream a new `reset` and the
        changes from there. MetaUnavailable is not raised: while etcd is unreachable this waits (with
        `retry_seconds` between attempts) and the caller keeps its last view."""
        import aetcd.exceptions as aex

        lost = False
        while not self._closed:
            try:
                records, revision = await self.get_prefix(prefix)
            except MetaUnavailable as exc:
                log.debug("watch %s: %s", prefix, exc)
                if not lost:
                    lost = True
                    yield WatchEvent("lost")
                await asyncio.sleep(retry_seconds)
                continue
            lost = False
            yield WatchEvent("reset", records=tuple(records), revision=revision)
            try:
                watch = await self._call(lambda c, r=revision: c.watch_prefix(prefix.encode(), start_revision=r + 1))
                async for event in watch:
                    kind: Literal["put", "delete"] = "put" if str(event.kind).endswith("PUT") else "delete"
                    yield WatchEvent(kind, record=_record(event.kv), revision=event.kv.mod_revision)
            except (MetaUnavailable, aex.ClientError) as exc:
                log.info("watch of %s broken (%s); listing it again", prefix, exc)
                lost = True
                yield WatchEvent("lost")
                await self._drop_channel()  # a fresh channel for the next attempt
                await asyncio.sleep(retry_seconds)


__all__ = [
    "Compare",
    "Delete",
    "EtcdClient",
    "LeaseExpired",
    "MetaUnavailable",
    "Put",
    "Record",
    "WatchEvent",
    "parse_endpoints",
]
