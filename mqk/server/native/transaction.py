"""Transactional (half) messages, RocketMQ 4.x style: SEND with the prepared sys flag stores the message in the
half topic, END_TRANSACTION commits (re-appends it to its real topic and queue) or rolls back, and a check loop
asks the producer group (CHECK_TRANSACTION_STATE, broker → client) about half messages left open too long.

Storage: half messages live in the internal topic `RMQ_SYS_TRANS_HALF_TOPIC` (their real topic and queue in
`REAL_TOPIC` / `REAL_QID`); each commit or rollback appends one record (the half offset) to the internal
`RMQ_SYS_TRANS_OP_HALF_TOPIC` (both named in mqk.broker.internal), so
the resolved set is rebuilt from the op topic at start and a commit is never applied twice. A commit writes the
message before its op record: a crash between them may apply it again when the producer re-sends
END_TRANSACTION after a check (at-least-once, as in RocketMQ). A half message still open after
`MAX_CHECKS` checks is rolled back.

Cluster mode: only the group's master checks; a broker that becomes master reads the resolved set again from the
op topic (`become_master`), which replication filled with what the previous master resolved.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from mqk.broker.internal import ON_DEMAND_QUEUES, TRANSACTION_HALF_TOPIC, TRANSACTION_OP_TOPIC
from mqk.errors import MqkError, StorageError
from mqk.protocol.native.codes import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    RequestCode,
    ResponseCode,
)
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.errors import response_code_for
from mqk.protocol.native.message import MessageExt, encode_message_ext, encode_message_id
from mqk.protocol.native.records import keys_of, message_to_batch, tags_code_for
from mqk.server.native.clients import ClientManager
from mqk.server.native.context import BrokerContext
from mqk.server.native.remoting import Connection

log = logging.getLogger("mqk.native")

HALF_TOPIC = TRANSACTION_HALF_TOPIC
OP_TOPIC = TRANSACTION_OP_TOPIC
COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0  # MessageSysFlag transaction types, as END_TRANSACTION sends them
#: RocketMQ's transactionTimeOut (the default of `native_transaction_timeout_ms`) and transactionCheckMax
CHECK_AFTER_MS = 6_000
MAX_CHECKS = 15


class TransactionService:
    def __init__(
        self,
        ctx: BrokerContext,
        clients: ClientManager,
        check_interval_s: float = 5.0,
        check_after_ms: int = CHECK_AFTER_MS,
    ) -> None:
        self.ctx = ctx
        self.clients = clients
        self.check_interval_s = check_interval_s
        self.check_after_ms = check_after_ms
        self.resolved: set[int] = set()
        self._checks: dict[int, int] = {}
        self._scan_from = 0
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        #: how the other front doors ask their producers about a half message no remoting producer can be asked
        #: about (True: asked); the RocketMQ 5 gRPC front door registers one
        self.other_checks: list[Callable[[MessageExt], Awaitable[bool]]] = []

    async def start(self) -> None:
        self._task = asyncio.create_task(self._check_loop())
        await self._load_resolved()

    async def become_master(self, epoch: int) -> None:
        """Cluster mode: this broker became its group's master. The op topic now holds what the previous master
        resolved (replicated): the resolved set is read again, so no half message is committed twice."""
        async with self._lock:
            self.resolved.clear()
            self._checks.clear()
            await self._load_resolved()

    async def _load_resolved(self) -> None:
        store = self.ctx.store
        if store.topic(OP_TOPIC) is None or store.topic(HALF_TOPIC) is None:
            return  # no transaction yet: the topics appear with the first half message
        offset = store.log_start_offset(OP_TOPIC, 0)
        while offset < store.end_offset(OP_TOPIC, 0):
            read = await store.read(OP_TOPIC, 0, offset, 1 << 20)
            if not read.batches:
                break
            for batch in read.batches:
                for msg in self.ctx.to_messages(OP_TOPIC, 0, batch, offset):
                    try:
                        self.resolved.add(int(msg.body))
                    except ValueError:
                        log.warning("transaction op record %s is not an offset", msg.queue_offset)
            offset = read.next_offset
        self._scan_from = store.log_start_offset(HALF_TOPIC, 0)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # --- prepare / end ---------------------------------------------------------------------------------------

    async def prepare(
        self,
        cmd: RemotingCommand,
        topic: str,
        queue: int,
        body: bytes,
        props: dict[str, str],
        flag: int,
        born: int,
        born_host: tuple[str, int],
    ) -> RemotingCommand:
        try:
            half_offset, msg_id = await self.store_half(topic, queue, body, props, flag, born, born_host)
        except StorageError as exc:
            return cmd.response(response_code_for(exc), str(exc))
        return cmd.response(
            ResponseCode.SUCCESS,
            ext={
                "msgId": msg_id,
                "queueId": queue,
                "queueOffset": half_offset,
                "transactionId": props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, msg_id),
            },
        )

    async def store_half(
        self,
        topic: str,
        queue: int,
        body: bytes,
        props: dict[str, str],
        flag: int,
        born: int,
        born_host: tuple[str, int],
    ) -> tuple[int, str]:
        """Store a half message bound for `topic` / partition `queue`: (its offset in the half topic, its offset
        message id). StorageError when the store refuses it."""
        half_props = {
            **props,
            PROPERTY_REAL_TOPIC: topic,
            PROPERTY_REAL_QUEUE_ID: str(queue),
            PROPERTY_TRANSACTION_PREPARED: "true",
        }
        for internal in (HALF_TOPIC, OP_TOPIC):
            await self.ctx.ensure_topic(internal, ON_DEMAND_QUEUES)
        result = await self.ctx.store.append(
            HALF_TOPIC, 0, [message_to_batch(body, half_props, born, flag, 0, born_host)]
        )
        commit = result.physical_offset if result.physical_offset >= 0 else None
        if commit is None:
            msgs = await self.ctx.read_messages(HALF_TOPIC, 0, result.base_offset, 1)
            commit = msgs[0].commit_log_offset if msgs else 0
        return result.base_offset, encode_message_id(self.ctx.host[0], self.ctx.host[1], commit)

    async def end(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """END_TRANSACTION: `tranStateTableOffset` names the half message (its offset in the half topic)."""
        half_offset = cmd.get_int("tranStateTableOffset", required=True)
        decision = cmd.get_int("commitOrRollback", required=True)
        assert half_offset is not None
        if decision == UNKNOWN:
            return cmd.response(ResponseCode.SUCCESS)
        if decision not in (COMMIT, ROLLBACK):
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"commitOrRollback {decision} is not 0, 8 or 12")
        try:
            remark = await self.resolve(half_offset, decision == COMMIT)
        except MqkError as exc:
            return cmd.response(response_code_for(exc), str(exc))
        return cmd.response(ResponseCode.SUCCESS, remark)

    async def half_message(self, half_offset: int) -> MessageExt | None:
        """The half message at `half_offset` of the half topic, or None."""
        if self.ctx.store.topic(HALF_TOPIC) is None:
            return None
        msgs = await self.ctx.read_messages(HALF_TOPIC, 0, half_offset, 1)
        return msgs[0] if msgs and msgs[0].queue_offset == half_offset else None

    async def resolve(self, half_offset: int, commit: bool) -> str | None:
        """Commit or roll back the half message at `half_offset`: None, or a remark when it was resolved already.
        StorageError when there is no such half message or the commit cannot be written."""
        async with self._lock:
            if half_offset in self.resolved:
                return "already resolved"
            half = await self.half_message(half_offset)
            if half is None:
                raise StorageError(f"no half message at {half_offset}")
            if commit:
                error = await self._commit(half)
                if error is not None:
                    raise error
            await self._resolve(half_offset)
        return None

    async def _commit(self, half: MessageExt) -> MqkError | None:
        props = {
            k: v
            for k, v in half.properties.items()
            if k not in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TRANSACTION_PREPARED)
        }
        topic = half.properties.get(PROPERTY_REAL_TOPIC, "")
        try:
            queue = int(half.properties.get(PROPERTY_REAL_QUEUE_ID, "0"))
            await self.ctx.store.append(
                topic,
                queue,
                [message_to_batch(half.body, props, half.born_timestamp, half.flag, 0, half.born_host)],
                tags_code=tags_code_for(props),
                keys=keys_of(props),
                properties=props,
            )
        except (MqkError, ValueError) as exc:
            return exc if isinstance(exc, MqkError) else StorageError(str(exc))
        return None

    async def _resolve(self, half_offset: int) -> None:
        await self.ctx.store.append(OP_TOPIC, 0, [message_to_batch(str(half_offset).encode(), {}, self.ctx.now_ms())])
        self.resolved.add(half_offset)
        self._checks.pop(half_offset, None)

    # --- check-back ----------------------------------------------------------------------------------------------

    async def _check_loop(self) -> None:
        while True:
            await self.ctx.clock.sleep(self.check_interval_s)
            cluster = self.ctx.broker.cluster
            if cluster is not None and not cluster.node.leading:
                continue  # a replica neither asks producers nor rolls back: its master does
            try:
                await self.check_once()
            except (MqkError, OSError):
                log.exception("transaction check failed")

    async def check_once(self, older_than_ms: int | None = None) -> int:
        """Ask producers about half messages open longer than `older_than_ms` (the broker's transaction timeout by
        default); returns how many were asked."""
        if older_than_ms is None:
            older_than_ms = self.check_after_ms
        store = self.ctx.store
        if store.topic(HALF_TOPIC) is None:
            return 0
        end = store.end_offset(HALF_TOPIC, 0)
        offset = max(self._scan_from, store.log_start_offset(HALF_TOPIC, 0))
        while offset < end and offset in self.resolved:
            offset += 1
        self._scan_from = offset  # every half message below is resolved
        asked = 0
        deadline = self.ctx.now_ms() - older_than_ms
        while offset < end:
            msgs = await self.ctx.read_messages(HALF_TOPIC, 0, offset, 256)
            if not msgs:
                break
            for msg in msgs:
                if msg.queue_offset in self.resolved:
                    continue
                if msg.store_timestamp > deadline:
                    return asked  # younger ones follow
                asked += await self._ask(msg)
            offset = msgs[-1].queue_offset + 1
        return asked

    async def _ask(self, half: MessageExt) -> int:
        count = self._checks.get(half.queue_offset, 0) + 1
        if count > MAX_CHECKS:
            log.info("half message %s unresolved after %d checks: rolled back", half.queue_offset, MAX_CHECKS)
            async with self._lock:
                if half.queue_offset not in self.resolved:
                    await self._resolve(half.queue_offset)
            return 0
        self._checks[half.queue_offset] = count
        group = half.properties.get(PROPERTY_PRODUCER_GROUP, "")
        members = self.clients.producers.get(group) or {}
        live = [c for c, _ in members.values() if not c.closed]
        if not live:
            # a half message of another front door (RocketMQ 5's producers have no group): asked its way
            asked = [await ask(half) for ask in self.other_checks]
            return 1 if any(asked) else 0
        conn = live[count % len(live)]
        # the producer is asked about the message as it will be delivered: in its real topic and queue
        try:
            real_queue = int(half.properties.get(PROPERTY_REAL_QUEUE_ID, "0"))
        except ValueError:
            real_queue = half.queue_id
        shown = dataclasses.replace(
            half, topic=half.properties.get(PROPERTY_REAL_TOPIC, half.topic), queue_id=real_queue
        )
        ext: dict[str, Any] = {
            "tranStateTableOffset": str(half.queue_offset),
            "commitLogOffset": str(half.commit_log_offset),
            "msgId": half.msg_id,
            "transactionId": half.msg_id,
            "offsetMsgId": half.offset_msg_id,
        }
        await conn.send_oneway(RequestCode.CHECK_TRANSACTION_STATE, ext, encode_message_ext(shown))
        return 1
