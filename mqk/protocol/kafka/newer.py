"""Codecs of the Kafka APIs newer than the spec set the generated package is made from (kafka-python's, which stops
before them): the KIP-848 consumer group protocol (ConsumerGroupHeartbeat, ConsumerGroupDescribe) and KIP-932's
share groups (ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch, ShareAcknowledge, and the admin's
Describe-, Alter- and DeleteShareGroupOffsets).

They are read and written with kio, whose message classes are generated from Kafka's own JSON message specs (one
frozen dataclass per message and version, the fields in wire order with their Kafka types, tags and defaults). Its
modules load the first time one of these messages passes: a broker that never meets a KIP-848 client never imports
it. Handlers see the same plain dicts as every other API's, with Kafka's snake_case names (a duration field such as
`RebalanceTimeoutMs` is `rebalance_timeout_ms`, in milliseconds); this module converts at the boundary.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib
import io
import types
import typing
import uuid
from typing import Any

from mqk.protocol.kafka.errors import MalformedMessage

#: api key -> (name, lowest version, highest version, first flexible version), as the generated MESSAGES table
NEWER: dict[int, tuple[str, int, int, int]] = {
    68: ("ConsumerGroupHeartbeat", 0, 1, 0),
    69: ("ConsumerGroupDescribe", 0, 1, 0),
    76: ("ShareGroupHeartbeat", 1, 1, 0),
    77: ("ShareGroupDescribe", 1, 1, 0),
    78: ("ShareFetch", 1, 2, 0),
    79: ("ShareAcknowledge", 1, 2, 0),
    90: ("DescribeShareGroupOffsets", 0, 1, 0),
    91: ("AlterShareGroupOffsets", 0, 0, 0),
    92: ("DeleteShareGroupOffsets", 0, 0, 0),
}
_MODULES = {
    68: "consumer_group_heartbeat",
    69: "consumer_group_describe",
    76: "share_group_heartbeat",
    77: "share_group_describe",
    78: "share_fetch",
    79: "share_acknowledge",
    90: "describe_share_group_offsets",
    91: "alter_share_group_offsets",
    92: "delete_share_group_offsets",
}
_DURATIONS = ("timedelta_i32", "timedelta_i64")


@functools.cache
def _classes(api_key: int, version: int) -> tuple[type, type]:
    """(request class, response class) of one API version."""
    base = f"kio.schema.{_MODULES[api_key]}.v{version}"
    request = importlib.import_module(f"{base}.request")
    response = importlib.import_module(f"{base}.response")
    name = NEWER[api_key][0]
    return getattr(request, f"{name}Request"), getattr(response, f"{name}Response")


@functools.cache
def _fields(cls: type) -> list[tuple[str, str, Any, str | None]]:
    """(field name, dict key, type, Kafka type) of each field of a kio message class."""
    hints = typing.get_type_hints(cls)
    out = []
    for field in dataclasses.fields(cls):
        kafka_type = field.metadata.get("kafka_type")
        key = f"{field.name}_ms" if kafka_type in _DURATIONS else field.name
        out.append((field.name, key, hints[field.name], kafka_type))
    return out


def _to_plain(value: Any, kafka_type: str | None) -> Any:
    if value is None:
        return None
    if dataclasses.is_dataclass(value):
        return to_dict(value)
    if isinstance(value, tuple):
        return [_to_plain(v, kafka_type) for v in value]
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    if kafka_type == "error_code":
        return int(value.value)
    return value


def to_dict(entity: Any) -> dict[str, Any]:
    """A kio message as the dict a handler sees."""
    cls: type = type(entity)
    return {key: _to_plain(getattr(entity, name), kt) for name, key, _tp, kt in _fields(cls)}


def _unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _from_plain(tp: Any, kafka_type: str | None, value: Any) -> Any:
    if value is None:
        return None
    tp = _unwrap_optional(tp)
    if typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0]
        return tuple(_from_plain(item, kafka_type, v) for v in value)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value)  # type: ignore[arg-type]  # (a dataclass type, not an instance)
    if kafka_type in _DURATIONS:
        return datetime.timedelta(milliseconds=value)
    if kafka_type == "error_code":
        from kio.schema.errors import ErrorCode

        return ErrorCode(value)
    return value


def _zero(tp: Any, kafka_type: str | None) -> Any:
    """What a field the dict leaves out and the spec gives no default is written as: null where it may be, else
    the type's zero (as the generated encoders default every field a body leaves out)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp):
        return None
    if typing.get_origin(tp) is tuple:
        return ()
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, {})  # type: ignore[arg-type]  # (a dataclass type, not an instance)
    return _from_plain(tp, kafka_type, _ZERO.get(kafka_type, 0))


_ZERO: dict[str | None, Any] = {"string": "", "bool": False, "uuid": uuid.UUID(int=0), "bytes": b""}


@functools.cache
def _required(cls: type) -> frozenset[str]:
    """The fields of `cls` without a default."""
    return frozenset(
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )


def from_dict(cls: type, doc: dict[str, Any]) -> Any:
    """A kio message of class `cls` from a handler's dict (fields it leaves out take their defaults)."""
    required = _required(cls)
    kwargs = {}
    for name, key, tp, kt in _fields(cls):
        if key in doc:
            kwargs[name] = _from_plain(tp, kt, doc[key])
        elif name in required:
            kwargs[name] = _zero(tp, kt)
    return cls(**kwargs)


def _read(cls: type, buf: memoryview) -> dict[str, Any]:
    from kio.serial import entity_reader

    try:
        entity: Any
        entity, end = entity_reader(cls)(bytes(buf), 0)  # (kio reads read-only buffers)
    except Exception as exc:  # noqa: BLE001 - whatever kio cannot read is a malformed message
        raise MalformedMessage(f"cannot read {cls.__name__}: {exc}") from None
    if end != len(buf):
        raise MalformedMessage(f"{len(buf) - end} bytes after the end of {cls.__name__}")
    return to_dict(entity)


def _write(cls: type, body: dict[str, Any], head: bytearray) -> list[Any]:
    from kio.serial import entity_writer

    out = io.BytesIO()
    entity_writer(cls)(out, from_dict(cls, body))
    return [head, out.getvalue()]


def decode_request(api_key: int, version: int, buf: memoryview) -> dict[str, Any]:
    return _read(_classes(api_key, version)[0], buf)


def encode_response(api_key: int, version: int, body: dict[str, Any], head: bytearray) -> list[Any]:
    return _write(_classes(api_key, version)[1], body, head)


def encode_request(api_key: int, version: int, body: dict[str, Any], head: bytearray) -> list[Any]:
    return _write(_classes(api_key, version)[0], body, head)


def decode_response(api_key: int, version: int, buf: memoryview) -> dict[str, Any]:
    return _read(_classes(api_key, version)[1], buf)


__all__ = ["NEWER", "decode_request", "decode_response", "encode_request", "encode_response", "from_dict", "to_dict"]
