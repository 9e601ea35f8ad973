"""Per-file line dispatch: each line's format is recognised from its content, never the file name.

The reader hands blocks of whole lines; FileParser.candidates() (triage.parsers.blocks) finds the lines
any rule may read the way grep does (one scan of every keyword over the block: the catalog's and those
each format declares for the event kinds it makes) and parse() turns those into events. What the rules need is declared
once, by the rules (triage.rules.Need): the keywords come from the kinds they need, and the engine's
JSON lines are checked against the Needs' fields before they are decoded."""

import json
import re
from datetime import datetime

import orjson

from triage.model import Event
from triage.parsers import client, engine_json, gateways, metrics_text, text_logs
from triage.parsers.blocks import BlockReader
from triage.parsers.wanted import Wanted
from triage.signatures import scan
from triage.timeparse import parse_iso

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+, in (?P<func>[\w<>.]+)')
_EXC_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Exit|Interrupt)\b")
_CUDA_RUNTIME = re.compile(r"\+cu(?P<v>\d{3,4})\b|CUDA runtime version:? (?P<v2>\d+\.\d+)")
MAX_FRAMES = 60
_SCAN_ONCE = json.JSONDecoder().scan_once  # json's C scanner, without json.loads' three Python frames


def _loads_line(line: str):
    """json.loads for a line that starts with "{" (so no BOM); StopIteration or ValueError when invalid.
    orjson decodes a few times faster; what it refuses and json takes (NaN, integers beyond 64 bits, lone
    surrogates, nesting past 1024) goes to json, so the result is json's."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        pass
    obj, end = _SCAN_ONCE(line, 0)
    if end != len(line) and line[end:].strip(" \t\n\r"):
        raise ValueError("extra data after the JSON value")
    return obj


# A member of pretty-printed JSON whose key holds a log line (the collectors' and exports' keys, Splunk's _raw)
_MEMBER = re.compile(r'^\s*"(?:message|log|msg|MESSAGE|textPayload|line|@message|_raw)"\s*:\s*(?P<value>"(?:[^"\\]|\\.)*")'
                     r'\s*,?\s*$')
_EVERYTHING: list[Wanted] = []  # Wanted() for parsers made alone, built at the first one (not at import)


class FileParser(BlockReader):
    """Parses one file's lines in order; keeps the little state a format needs (traceback, CSV header)."""

    def __init__(self, file: str, wanted: Wanted | None = None):
        if wanted is None:
            if not _EVERYTHING:
                _EVERYTHING.append(Wanted())
            wanted = _EVERYTHING[0]
        super().__init__(file, wanted)
        self.frames: list[str] = []
        self.container_times: dict[str, tuple[int, datetime]] = {}  # a container's start or finish, unpaired


    def parse(self, lineno: int, line: str) -> list[Event]:
        if not line or line.isspace():
            return []
        self.line = line
        head = line[0]
        if head in ' \t"' and '": "' in line[:48] and (m := _MEMBER.match(line)):
            # a log line as one member of pretty-printed JSON (a Kibana or CloudWatch export, docker inspect):
            # the string decoded and read as a line, quoted whole
            try:
                inner = json.loads(m.group("value"))
            except ValueError:
                inner = None
            if isinstance(inner, str) and "\n" not in inner:
                return self._unwrapped(lineno, line, None, inner)
        # The bulk of a large access log, straight to its parser: exactly what _structured would reach (a
        # line in a collector's envelope never matches: its stamp or head is no address followed by two fields
        # and a bracket)
        if (head.isdigit() or head == "[") and self.csv is None and lineno > 3 and (
                m := gateways.NGINX_UPSTREAMINFO.match(line)):
            return [gateways.upstreaminfo_access(m, self.file, lineno, line)]
        if (head.isalnum() or head in "\x1b \t><" or line.startswith(("[rank", "[pod/")) or (
                head == "[" and "] |" in line[:64])) and (wrapped := text_logs.unwrap(line)) is not None:
            return self._unwrapped(lineno, line, *wrapped)
        if head == "{":
            events = self._json(lineno, line)
            if events is not None:
                return events
        ev = self._structured(head, lineno, line)
        if ev is not None:
            if not isinstance(ev, Event):
                return []
            if ev.kind == "http.access" and ev.fields.get("status") == 503:
                # a refusal: the gateway's own flags may say why (HAProxy sQ, Envoy UO: the catalog's
                # whole-line entries)
                return [ev, *(e for e in self._signature_events(ev.ts, "", ev.source, lineno, line)
                              if e.kind == "queue.full")]
            if ev.source == "loadgen" and ev.fields.get("error"):
                return [ev, *self._client_error_events(ev, lineno, line)]
            if ev.source == "ollama" and ev.fields["status"] >= 500:  # (the catalog reads a 500's latency)
                return [ev, *self._signature_events(ev.ts, line, ev.source, lineno, line)]
            return [ev]
        return self._text(lineno, line)

    def _unwrapped(self, lineno: int, line: str, ts, inner: str) -> list[Event]:
        """The events of the line inside a collector's envelope, quoted whole, at the envelope's time
        where the inner line has none."""
        events = self.parse(lineno, inner)
        for ev in events:
            ev.text = line
            if ev.ts is None:
                ev.ts = ts
        self.line = line
        return events

    def _json(self, lineno: int, line: str) -> list[Event] | None:
        at = line.find('"event":"')
        if at >= 0:  # the engine's own events: those no rule reads are not decoded
            name = line[at + 9:line.find('"', at + 9)]
            if name in engine_json.ENGINE_EVENTS and not self.wanted.takes_json(name, engine_json.SOURCE, line):
                return []
        try:
            obj = _loads_line(line)
        except (ValueError, RecursionError, StopIteration):  # RecursionError: pathologically nested input
            return None
        if not isinstance(obj, dict):
            return None
        ev = engine_json.parse_json_object(obj, line, self.file, lineno) if obj.get("logger") != "loadgen" else None
        if ev is None:
            ev = client.parse_loadgen_json(obj, line, self.file, lineno)
        if ev is None and "response_code" in obj:
            ev = gateways.parse_envoy_json(obj, self.file, lineno, line)
        if ev is None and "status" in obj:
            ev = gateways.parse_nginx_json(obj, self.file, lineno, line)
        if ev is None and "EdgeResponseStatus" in obj:
            ev = gateways.parse_cloudflare_json(obj, self.file, lineno, line)
        if ev is None and "DownstreamStatus" in obj:
            ev = gateways.parse_traefik_json(obj, self.file, lineno, line)
        if ev is None and obj.get("msg") == "handled request":
            ev = gateways.parse_caddy_json(obj, self.file, lineno, line)
        if ev is None and "latencies" in obj:
            ev = gateways.parse_kong_json(obj, self.file, lineno, line)
        if ev is not None:
            if ev.source == "loadgen" and ev.fields.get("error"):
                return [ev, *self._client_error_events(ev, lineno, line)]
            extra = self._signature_events(ev.ts, _message_of(obj), ev.source, lineno, line) if ev.kind in (
                "engine.error", "request.rejected") else []
            return [ev, *extra]
        inner = _envelope_text(obj)
        error = obj.get("error")
        if not isinstance(error, str):  # (pino's "err": a string, or the error object with its message)
            error = _error_message(obj.get("err"))
        if isinstance(error, str) and isinstance(inner, str) and error not in inner and not obj.get("log"):
            # a structured logger's message and its error field (zap, zerolog, slog: Caddy's "aborting with
            # incomplete response" and "reading: context canceled", Traefik's "499 Client Closed Request";
            # pino's err)
            inner = f'{inner} error="{error}"'
        if isinstance(inner, str):  # a collector's JSON envelope, structured app logs, API error bodies
            # the line inside is read as any line (an access line, another JSON line, a vLLM line), quoted whole
            events = self.parse(lineno, inner.rstrip("\n"))
            self.line = line
            ts = _envelope_time(obj)
            for e in events:
                e.text = line
                if e.ts is None:
                    e.ts = ts
            return events
        return []

    def _structured(self, head: str, lineno: int, line: str):
        """An Event, True (recognised, nothing to report) or None (not a structured format)."""
        if self.csv is not None:
            ev = self.csv.parse(line, self.file, lineno)
            if ev is not None:
                return ev
        if lineno <= 3 and (found := client.CsvRecords.sniff(line)):
            self.csv = found
            return True
        if head.isdigit() or head == "[":
            if '] "' in line:
                ev = gateways.parse_nginx_access(line, self.file, lineno) or gateways.parse_envoy(
                    line, self.file, lineno)
                if ev is not None:
                    return ev
            if head.isdigit() and gateways.CADDY_CONSOLE_ACCESS in line:
                ev = gateways.parse_caddy_console(line, self.file, lineno)
                if ev is not None:
                    return ev
            if head.isdigit() and " loadgen request_id=" in line:
                return client.parse_loadgen_text(line, self.file, lineno)
            if head.isdigit() and line[23:24] == "Z":
                ev = engine_json.parse_text(line, self.file, lineno)
                if ev is not None:
                    return ev
        elif head in "hgw" and (ev := gateways.parse_alb(line, self.file, lineno)):
            return ev
        if "haproxy[" in line and (ev := gateways.parse_haproxy(line, self.file, lineno)):
            return ev
        if head == "[" and line.startswith(gateways.GIN_START) and (ev := gateways.parse_gin(line, self.file, lineno)):
            return ev
        if "INFO:" in line[:32] and (ev := gateways.parse_uvicorn(line, self.file, lineno)):
            return ev
        if head == "#" or self.exposition or ("{" in line and line[:1].isalpha() and "=\"" in line):
            ev = metrics_text.parse_sample(line, self.file, lineno)
            if ev is not None and (head == "#" or isinstance(ev, Event) or self.exposition):
                self.exposition = True
                return ev
        if head == "|" or "NVIDIA-SMI" in line:
            return metrics_text.parse_nvidia_smi(line, self.file, lineno)
        if gateways.custom_access(line):  # an access line in a format of its own (a custom log_format)
            return gateways.parse_access_any(line, self.file, lineno)
        return None

    def _text(self, lineno: int, line: str) -> list[Event]:
        if head_nginx_error(line):
            parsed = gateways.parse_nginx_error(line)
            if parsed is not None:
                ts, msg, extra = parsed
                events = self._signature_events(ts, msg, "nginx-error", lineno, line)
                for ev in events:
                    ev.fields.update(extra)
                return events
        ts, msg, source = text_logs.split_envelope(line)
        events = [Event(ts, source, kind, fields, self.file, lineno, line)
                  for kind, fields in text_logs.engine_text_events(
                      msg, "\x1b" in line or self._marked(1, lineno, line) is not False)]  # (ANSI codes: msg has none)
        if events and events[0].kind == "request.received":
            return events  # a logged prompt is user text: "CUDA out of memory" in it is a question, not an error
        events.extend(self._signature_events(ts, msg, source, lineno, line))
        if ("ted" in msg or "hed" in msg) and (ran := self._container_ran(lineno, msg)) is not None:
            events.append(Event(ran["finished"], source, "container.ran", ran, self.file, lineno, line))
        return events

    def _container_ran(self, lineno: int, msg: str) -> dict | None:
        """A container's last run (started, finished, seconds) once a line gives its start or finish and one
        of the three lines before gave the other (kubectl describe prints Started then Finished, kubectl's
        yaml finishedAt then startedAt, docker inspect StartedAt then FinishedAt)."""
        found = text_logs.container_time(msg)
        if found is None:
            return None
        which, at = found
        other = self.container_times.pop("finished" if which == "started" else "started", None)
        if other is None or lineno - other[0] > 3:
            self.container_times[which] = (lineno, at)
            return None
        started, finished = (at, other[1]) if which == "started" else (other[1], at)
        if finished < started:
            return None
        return {"started": started, "finished": finished, "seconds": (finished - started).total_seconds()}

    def _client_error_events(self, ev: Event, lineno: int, line: str) -> list[Event]:
        """The catalog's events in a client failure's error text: the server's own message comes back in
        the response body a client logs (vLLM's 400 "maximum context length", its 503 "engine is currently
        busy"), and is read as if the server had logged it. The events carry the client's request id. The
        client's own kind of failure (cut, timeout, cancel) is the loadgen event's: the catalog's client.*
        entries would only repeat it."""
        events = [e for e in self._signature_events(ev.ts, ev.fields["error"], ev.source, lineno, ev.fields["error"])
                  if not e.kind.startswith("client.")]
        for e in events:
            e.text = line
            e.fields.setdefault("request_id", ev.fields.get("request_id"))
        return events

    def _signature_events(self, ts, msg: str, source: str, lineno: int, line: str) -> list[Event]:
        stripped = msg.lstrip()
        if stripped.startswith("Traceback (most recent call last)"):
            self.frames = []
            return []
        if stripped.startswith("File ") and (m := _FRAME.match(stripped)):
            if len(self.frames) < MAX_FRAMES:
                self.frames.append(m.group("func"))
            return []
        events = [Event(ts, source, kind, fields, self.file, lineno, line) for kind, fields in scan(msg, line)
                  ] if self._has_keyword(lineno, line) else []
        if "cu" in msg and (m := _CUDA_RUNTIME.search(msg)):
            events.append(Event(ts, source, "cuda.runtime", {"version": _cuda_version(m)}, self.file, lineno, line))
        if self.frames and (events or _EXC_LINE.match(stripped)):
            for ev in events:
                ev.fields["frames"] = list(self.frames)
            self.frames = []
        return events


def head_nginx_error(line: str) -> bool:
    return line[:1].isdigit() and line[4:5] == "/" and line[7:8] == "/"


# Where a collector's JSON envelope holds the line: docker's json-file and Fluent Bit ("log"), structured
# logs and CloudWatch exports ("msg", "message"), journalctl -o json ("MESSAGE"), Google Cloud Logging
# ("textPayload", or "jsonPayload": {"message": ...}), Loki's logcli --output=jsonl ("line"), CloudWatch
# Logs Insights ("@message")
_ENVELOPE_KEYS = ("log", "msg", "message", "MESSAGE", "textPayload", "line", "@message")
_ENVELOPE_TIMES = ("time", "ts", "timestamp", "@timestamp", "__REALTIME_TIMESTAMP")


def _envelope_text(obj: dict) -> str | None:
    """The text a JSON object wraps (the first of its envelope keys that holds a string), or an API error
    body's message; None when it wraps none."""
    for key in _ENVELOPE_KEYS:
        inner = obj.get(key)
        if isinstance(inner, str):
            return inner
    payload = obj.get("jsonPayload")
    if isinstance(payload, dict):
        inner = payload.get("message", payload.get("msg"))
        if isinstance(inner, str):
            return inner
    return _error_message(obj.get("error"))


def _envelope_time(obj: dict):
    """The envelope's time: ISO-8601, or epoch seconds (zap's), milliseconds (CloudWatch's), microseconds
    (journald's __REALTIME_TIMESTAMP, a string) or nanoseconds; None for anything else."""
    for key in _ENVELOPE_TIMES:
        value = obj.get(key)
        if isinstance(value, str):
            return gateways.epoch_time(value) if value.isdigit() and len(value) >= 10 else parse_iso(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return gateways.epoch_time(value) if value >= 1e9 else None
    return None


def _error_message(error) -> str | None:
    """The text of an API error body's "error": OpenAI's and llama.cpp's {"message": ...}, TGI's plain string."""
    if isinstance(error, dict):
        error = error.get("message")
    return error if isinstance(error, str) else None


def _message_of(obj: dict) -> str:
    parts = [str(obj.get(k, "")) for k in ("exc_type", "message", "error") if obj.get(k)]
    return " ".join(parts)


def _cuda_version(m: re.Match) -> str:
    if m.group("v2"):
        return m.group("v2")
    digits = m.group("v")
    return f"{digits[:-1]}.{digits[-1]}"
