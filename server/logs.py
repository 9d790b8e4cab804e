"""How `convsync serve` writes its log: text lines, or one JSON object per line.

Both forms carry the same fields: the time (UTC, milliseconds), the level, the logger's name
and the message, plus the traceback when there is one. Nothing else of a log record goes out
(no `extra` attributes, no arguments apart from the message they make), so the JSON form can
say no more than the text form: what the hub's messages never hold (tokens, secrets, message
text; `docs/security.md`) neither form holds. The JSON form escapes every character outside
ASCII, so no field can split its line (U+2028 and U+0085 included).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Literal

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "JsonFormatter", "TextFormatter", "configure_logging"]

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")


def _timestamp(record: logging.LogRecord) -> str:
    """`2026-12-02T01:40:00.123Z`: the record's time in UTC."""
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    """`TIME LEVEL LOGGER: MESSAGE`, then the traceback, if any, on the lines after."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "message"}` (and `"exception"`, `"stack"` when the record
    has them) as one line of JSON."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry)  # ASCII only: no character of a field can end the line


def configure_logging(
    form: LogFormat = "text", level: str = "info", stream: IO[str] | None = None
) -> logging.Handler:
    """Send every log record at `level` or above to `stream` (stderr) in `form`: a handler
    on the root logger, whose level becomes `level`. Returns the handler (to remove it).

    The handler filters by `level` too: a logger pinned at a level of its own (the
    websockets library's, at INFO) hands its records to the root's handlers whatever the
    root's level."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setLevel(level.upper())
    handler.setFormatter(JsonFormatter() if form == "json" else TextFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
