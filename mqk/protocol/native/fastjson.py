"""JSON as RocketMQ's serializer (fastjson) writes it: maps whose keys are objects.

RocketMQ's admin bodies key some maps by a MessageQueue (TopicStatsTable and ConsumeStats' `offsetTable`), and
fastjson writes such a key as the object itself: `{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"t"}:
{"maxOffset":5,...}}}`. That is not JSON, but it is what mqadmin, the dashboard and every RocketMQ client read, so the
broker writes it (`dumps`, keys in fastjson's sorted field order, no spaces) and mqk's client reads it back
(`loads`: a map with object keys becomes a list of (key, value) pairs; everything else as `json.loads` gives it).

Values only, no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?")
_WS = re.compile(r"[ \t\n\r]*")


class ObjectKeyed(list):  # type: ignore[type-arg]  # a list of (key, value) pairs
    """A map with object keys, written as fastjson writes it: `{{key}:value,...}`."""


def dumps(obj: Any) -> str:
    """`obj` as fastjson writes it: dict keys sorted, no spaces; an ObjectKeyed list as a map keyed by objects."""
    if isinstance(obj, ObjectKeyed):
        return "{" + ",".join(f"{dumps(k)}:{dumps(v)}" for k, v in obj) + "}"
    if isinstance(obj, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dumps(v)}" for k, v in sorted(obj.items())) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(dumps(v) for v in obj) + "]"
    return json.dumps(obj)


def object_keyed(pairs: Iterable[tuple[Any, Any]]) -> ObjectKeyed:
    return ObjectKeyed(pairs)


def loads(text: str | bytes) -> Any:
    """Parse fastjson output (see the module docstring). ValueError for anything else."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    value, pos = _value(text, _skip(text, 0))
    if _skip(text, pos) != len(text):
        raise ValueError(f"trailing data at {pos}")
    return value


def _skip(text: str, pos: int) -> int:
    m = _WS.match(text, pos)
    return m.end() if m else pos


def _value(text: str, pos: int) -> tuple[Any, int]:
    if pos >= len(text):
        raise ValueError("unexpected end")
    ch = text[pos]
    if ch == "{":
        return _object(text, pos + 1)
    if ch == "[":
        items: list[Any] = []
        pos = _skip(text, pos + 1)
        if text.startswith("]", pos):
            return items, pos + 1
        while True:
            item, pos = _value(text, _skip(text, pos))
            items.append(item)
            pos = _skip(text, pos)
            if text.startswith(",", pos):
                pos += 1
                continue
            if text.startswith("]", pos):
                return items, pos + 1
            raise ValueError(f"expected , or ] at {pos}")
    if ch == '"':
        # json's own string scanner (not in its stubs)
        scanned: tuple[Any, int] = json.decoder.scanstring(text, pos + 1)  # type: ignore[attr-defined]
        return scanned
    for literal, value in (("true", True), ("false", False), ("null", None)):
        if text.startswith(literal, pos):
            return value, pos + len(literal)
    m = _NUMBER.match(text, pos)
    if m is None:
        raise ValueError(f"unexpected {ch!r} at {pos}")
    number = m.group()
    return (float(number) if m.group(1) or m.group(2) else int(number)), m.end()


def _object(text: str, pos: int) -> tuple[Any, int]:
    pairs: list[tuple[Any, Any]] = []
    pos = _skip(text, pos)
    if text.startswith("}", pos):
        return {}, pos + 1
    while True:
        key, pos = _value(text, _skip(text, pos))
        pos = _skip(text, pos)
        if not text.startswith(":", pos):
            raise ValueError(f"expected : at {pos}")
        value, pos = _value(text, _skip(text, pos + 1))
        pairs.append((key, value))
        pos = _skip(text, pos)
        if text.startswith(",", pos):
            pos += 1
            continue
        if text.startswith("}", pos):
            pos += 1
            break
        raise ValueError(f"expected , or }} at {pos}")
    if all(isinstance(k, str) for k, _v in pairs):
        return dict(pairs), pos
    return ObjectKeyed(pairs), pos


__all__ = ["ObjectKeyed", "dumps", "loads", "object_keyed"]
