"""Structured log sink: JSON lines (or text) events of CONTRACTS section 5, one stream for everything."""

import json
import math
import sys
import threading
import time
from datetime import UTC, datetime
from enum import Enum, StrEnum
from typing import TextIO

LOGGER_NAME = "llmserve"


class LogFormat(StrEnum):
    JSON = "json"
    TEXT = "text"


def iso_now(wall: float | None = None) -> str:
    """ISO-8601 UTC with milliseconds, e.g. 2026-11-29T19:40:01.123Z."""
    dt = datetime.fromtimestamp(time.time() if wall is None else wall, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _clean(value):
    """JSON has no NaN or infinity; floats are rounded to microseconds for readability."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else round(value, 6)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


class EventLogger:
    """Writes one event a line; thread-safe (the step thread and the event loop both write)."""

    def __init__(self, model: str, stream: TextIO | None = None, fmt: LogFormat = LogFormat.JSON):
        self.model = model
        self.stream = stream or sys.stdout
        self.fmt = fmt
        self._lock = threading.Lock()

    def emit(self, event: str, level: str = "info", request_id: str | None = None, **fields) -> None:
        record = {"ts": iso_now(), "level": level, "event": event, "logger": LOGGER_NAME, "model": self.model}
        if request_id is not None:
            record["request_id"] = request_id
        for key, value in fields.items():
            record[key] = _clean(value)
        line = json.dumps(record, separators=(",", ":")) if self.fmt is LogFormat.JSON else _text(record)
        with self._lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # a closed log stream must never take a request down

    def close(self) -> None:
        if self.stream not in (sys.stdout, sys.stderr):
            with self._lock:
                self.stream.close()


def _text(record: dict) -> str:
    head = f"{record['ts']} {record['level'].upper():<7} {record['event']}"
    rest = []
    for key, value in record.items():
        if key in ("ts", "level", "event", "logger"):
            continue
        if isinstance(value, str) and (" " in value or not value):
            value = json.dumps(value)
        elif isinstance(value, list | dict | bool) or value is None:
            value = json.dumps(value)
        rest.append(f"{key}={value}")
    return head + " " + " ".join(rest)
