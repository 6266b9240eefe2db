"""The one place store (and other) errors become RocketMQ response codes, as `kafka_code_for` does for Kafka."""

from __future__ import annotations

from mqk.errors import (
    InvalidRecord,
    MessageTooLarge,
    NotMaster,
    NotSupported,
    OffsetOutOfRange,
    PutRejected,
    StorageFull,
    UnknownShard,
)
from mqk.protocol.native.codes import ResponseCode


def response_code_for(exc: BaseException) -> ResponseCode:
    if isinstance(exc, UnknownShard):
        return ResponseCode.TOPIC_NOT_EXIST
    if isinstance(exc, (MessageTooLarge, InvalidRecord, PutRejected)):
        return ResponseCode.MESSAGE_ILLEGAL
    if isinstance(exc, (StorageFull, NotMaster)):
        return ResponseCode.SERVICE_NOT_AVAILABLE  # (RocketMQ's answer to a put on a slave too)
    if isinstance(exc, OffsetOutOfRange):
        return ResponseCode.PULL_OFFSET_MOVED
    if isinstance(exc, NotSupported):
        return ResponseCode.SYSTEM_ERROR
    return ResponseCode.SYSTEM_ERROR
