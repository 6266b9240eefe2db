"""mqk's native (RocketMQ remoting) Python client, asyncio: `Producer`, `PullConsumer`, `PushConsumer`, `PopConsumer`,
`Admin`."""

from __future__ import annotations

from mqk.client.admin import Admin
from mqk.client.base import MessageQueue
from mqk.client.consumer import (
    PopConsumer,
    PoppedMessage,
    PullConsumer,
    PullResult,
    PushConsumer,
    allocate_averagely,
)
from mqk.client.producer import (
    COMMIT_MESSAGE,
    ROLLBACK_MESSAGE,
    UNKNOWN,
    Message,
    Producer,
    SendResult,
    TransactionProducer,
)
from mqk.client.remoting import ClientError
from mqk.protocol.native.message import MessageExt

__all__ = [
    "COMMIT_MESSAGE",
    "ROLLBACK_MESSAGE",
    "UNKNOWN",
    "Admin",
    "ClientError",
    "Message",
    "MessageExt",
    "MessageQueue",
    "PopConsumer",
    "PoppedMessage",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "SendResult",
    "TransactionProducer",
    "allocate_averagely",
]
