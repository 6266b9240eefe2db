"""Recalling a delayed message before it is due (RocketMQ 5.3's RecallMessage), for both RocketMQ doors.

A send of one delayed message (a delay level or a timer property, not a batch, not a retry, not a half message) is
answered with a recall handle: RocketMQ's format, the URL-safe base64 of `v1 <topic> <broker name> <due ms>
<unique key>`, where the unique key is the message's `UNIQ_KEY` (the id RocketMQ clients give a message). A send
without a unique key gets no handle: there would be nothing to name the message by.

A recall (remoting RECALL_MESSAGE, code 370, with `topic`, `recallHandle` and an optional `producerGroup`; or gRPC
RecallMessage) is checked as RocketMQ's broker checks it: the topic exists (TOPIC_NOT_EXIST), the handle decodes
and names this topic and this broker (ILLEGAL_OPERATION), and its due time is still ahead and within the timer's
range (ILLEGAL_OPERATION, "timestamp invalid"). Then the timer keeps a recall record (mqk.timer.service: `recall`)
and the answer carries the message id. Like RocketMQ's, a recall is a blind marker: a message already delivered, or
a handle naming no message, still gets SUCCESS. The RocketMQ ACL asks WRITE on the topic (mqk.server.native.acl).
"""

from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mqk.broker.internal import RETRY_PREFIX
from mqk.errors import MqkError, StorageError
from mqk.protocol.native.codes import PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.server.native.context import BrokerContext
from mqk.server.native.remoting import Connection
from mqk.timer.delay import DELAY_PROPERTY_NAMES, due_time

if TYPE_CHECKING:
    from mqk.timer import TimerService

log = logging.getLogger("mqk.native.recall")

_VERSION = "v1"


@dataclass(frozen=True, slots=True)
class RecallHandle:
    topic: str
    broker_name: str
    due_ms: int
    unique_key: str

    def encode(self) -> str:
        raw = " ".join((_VERSION, self.topic, self.broker_name, str(self.due_ms), self.unique_key))
        return base64.urlsafe_b64encode(raw.encode()).decode("ascii")

    @classmethod
    def decode(cls, text: str) -> RecallHandle:
        """ValueError when `text` is not a v1 handle (padding may be left out, as URL-safe encoders often do)."""
        if not text:
            raise ValueError("recall handle is invalid")
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise ValueError("recall handle is invalid") from None
        items = raw.split(" ")
        if len(items) < 5 or items[0] != _VERSION or not items[3].lstrip("-").isdigit():
            raise ValueError("recall handle is invalid")
        return cls(items[1], items[2], int(items[3]), items[4])


class RecallRefused(MqkError):
    """A recall refused before anything was written: `code` is RocketMQ's response code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Recalls:
    """Recall handles for sends, and recalls for both doors (`timer` is set by the runtime; without one, sends get
    no handle and recalls SERVICE_NOT_AVAILABLE)."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self.timer: TimerService | None = None

    def handle_for(self, topic: str, props: dict[str, str]) -> str:
        """The recall handle of a message of `topic` with `props` just stored, "" when it is not a delayed message
        that can be recalled. Asked after the append, so a relative delay gives a due time no earlier than the one
        the timer took."""
        # (every send asks: most carry no delay property, which one set operation tells)
        if self.timer is None or props.keys().isdisjoint(DELAY_PROPERTY_NAMES) or topic.startswith(RETRY_PREFIX):
            return ""
        key = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if not key or " " in key:
            return ""
        now = self.ctx.now_ms()
        due = due_time(props, now)
        if due is None or due <= now:
            return ""
        return RecallHandle(topic, self.ctx.config.group_name, due, key).encode()

    async def recall(self, topic: str, handle_text: str) -> str:
        """Recall the message `handle_text` names; its unique key. RecallRefused when refused."""
        if self.timer is None:
            raise RecallRefused(ResponseCode.SERVICE_NOT_AVAILABLE, "recall failed, delayed delivery is not running")
        if self.ctx.queue_count(topic) == 0 and self.ctx.topics.queue_count(topic) == 0:
            raise RecallRefused(ResponseCode.TOPIC_NOT_EXIST, f"recall failed, the topic[{topic}] not exist")
        try:
            handle = RecallHandle.decode(handle_text)
        except ValueError as exc:
            raise RecallRefused(ResponseCode.ILLEGAL_OPERATION, str(exc)) from None
        if handle.topic != topic:
            raise RecallRefused(ResponseCode.ILLEGAL_OPERATION, "recall failed, topic not match")
        if handle.broker_name != self.ctx.config.group_name:
            raise RecallRefused(ResponseCode.ILLEGAL_OPERATION, "recall failed, broker service not available")
        left = handle.due_ms - self.ctx.now_ms()
        if left <= 0 or left >= self.timer.max_delay_ms:
            raise RecallRefused(ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid")
        try:
            await self.timer.recall(topic, handle.unique_key, handle.due_ms)
        except StorageError as exc:
            log.warning("recall of %s in %s failed: %s", handle.unique_key, topic, exc)
            raise RecallRefused(ResponseCode.SYSTEM_ERROR, "recall failed, execute error") from None
        return handle.unique_key

    async def process(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """RECALL_MESSAGE over remoting."""
        topic = cmd.get_str("topic", required=True) or ""
        try:
            message_id = await self.recall(topic, cmd.get_str("recallHandle") or "")
        except RecallRefused as exc:
            return cmd.response(exc.code, str(exc))
        return cmd.response(ResponseCode.SUCCESS, ext={"msgId": message_id})


__all__ = ["RecallHandle", "RecallRefused", "Recalls"]
