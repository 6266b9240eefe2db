"""How `mqk serve` writes its log: one line per event on stderr, as text for people or JSON for machines.

- `text` (default): `2025-01-31 12:00:00,123 INFO mqk.kafka: message`;
- `json`: one object per line with stable keys: `ts` (ISO 8601, UTC, milliseconds), `level`, `logger`, `msg` (the
  formatted message), `exc` (the traceback, when the event has one) and any `extra={...}` fields the call passed
  (never overriding those keys). A traceback stays inside its event's line (as a JSON string), so a log shipper
  sees one event per line.

Stdlib logging only: a Formatter, installed by `configure_logging`. `LogThrottle` keeps a flood of one peer's
refused requests from flooding the log: one line per peer per interval, and the next line says how many it held back.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Hashable
from datetime import UTC, datetime

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: what every LogRecord has; anything else on a record came from `extra=` and is written as a field of its own
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            event["exc"] = record.exc_text
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and key not in event:
                event[key] = value
        return json.dumps(event, default=str, ensure_ascii=False)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """The root logger writes to stderr at `level`, as `fmt` (`text` or `json`) says."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, str(level).upper(), logging.INFO))


class LogThrottle:
    """At most one log line per key (a peer's address) per `interval_s`. The lines held back are counted, and the
    key's next line says how many. Bounded: past `max_keys` keys the oldest half is forgotten, so a flood from many
    addresses costs at most that much memory (a forgotten key's next line simply goes out)."""

    def __init__(
        self, interval_s: float = 10.0, max_keys: int = 4096, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._now = now
        #: key -> (when its last line went out, lines held back since)
        self._keys: dict[Hashable, tuple[float, int]] = {}

    def allow(self, key: Hashable) -> int | None:
        """None: hold this line back. Else write it, with the number of `key`'s lines held back since its last."""
        now = self._now()
        last = self._keys.get(key)
        if last is not None and now - last[0] < self.interval_s:
            self._keys[key] = (last[0], last[1] + 1)
            return None
        if last is None and len(self._keys) >= self.max_keys:
            for old in list(self._keys)[: self.max_keys // 2]:  # the oldest first: a dict keeps insertion order
                del self._keys[old]
        self._keys.pop(key, None)  # (re)inserted: the order stays oldest line first
        self._keys[key] = (now, 0)
        return 0 if last is None else last[1]


__all__ = ["TEXT_FORMAT", "JsonFormatter", "LogThrottle", "configure_logging"]
