"""This project's engine log (CONTRACTS section 5), JSON lines and the --log-format text form."""

import json
import re

from triage.model import Event
from triage.timeparse import parse_iso

SOURCE = "engine-json"
ENGINE_EVENTS = frozenset({
    "engine.startup", "engine.error", "engine.stats", "engine.shutdown", "request.received",
    "request.rejected", "request.scheduled", "request.preempted", "request.first_token",
    "request.finished", "request.aborted", "http.access",
})
_TEXT_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT[\d:.]+Z) (INFO|WARNING|ERROR|DEBUG)\s+([a-z_]+\.[a-z_.]+)(?: (.*))?$")
_KV = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\[[^\]]*\]|\{[^}]*\}|\S+)')


def parse_json_object(obj: dict, line: str, file: str, lineno: int) -> Event | None:
    """An engine event from a decoded JSON object, or None when it is not one."""
    name = obj.get("event")
    if name not in ENGINE_EVENTS:
        return None
    ts_raw = obj.get("ts")
    ts = parse_iso(ts_raw) if isinstance(ts_raw, str) else None
    return Event(ts, SOURCE, name, obj, file, lineno, line)


def parse_text(line: str, file: str, lineno: int) -> Event | None:
    """The --log-format text form: `<ts> LEVEL   event key=value ...`."""
    m = _TEXT_LINE.match(line)
    if m is None or m.group(3) not in ENGINE_EVENTS:
        return None
    fields: dict = {"ts": m.group(1), "level": m.group(2).lower(), "event": m.group(3)}
    for key, raw in _KV.findall(m.group(4) or ""):
        try:
            fields[key] = json.loads(raw)
        except ValueError:
            fields[key] = raw
    return Event(parse_iso(m.group(1)), SOURCE, m.group(3), fields, file, lineno, line)
