"""How `mqk serve` writes its log: one line per event on stderr, as text for people or JSON for machines.

- `text` (default): `2025-01-31 12:00:00,123 INFO mqk.kafka: message`;
- `json`: one object per line with stable keys: `ts` (ISO 8601, UTC, milliseconds), `level`, `logger`, `msg` (the
  formatted message), `exc` (the traceback, when the event has one) and any `extra={...}` fields the call passed
  (never overriding those keys). A traceback stays inside its event's line (as a JSON string), so a log shipper
  sees one event per line.

Stdlib logging only: a Formatter, installed by `configure_logging`.
"""

from __future__ import annotations

import json
import logging
import sys
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


__all__ = ["TEXT_FORMAT", "JsonFormatter", "configure_logging"]
