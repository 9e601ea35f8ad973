"""Per-file line dispatch: each line's format is recognised from its content, never the file name."""

import json
import re
from bisect import bisect_left
from collections.abc import Iterable
from itertools import compress, repeat
from operator import add, and_, getitem, not_

from triage.model import Event
from triage.parsers import batch as batch_module
from triage.parsers import client, engine_json, gateways, metrics_text, text_logs
from triage.parsers.batch import Batch, FinishedShape, access_batch, access_columns, finished_batch
from triage.signatures import scan
from triage.timeparse import parse_iso

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+, in (?P<func>[\w<>.]+)')
_EXC_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Exit|Interrupt)\b")
_CUDA_RUNTIME = re.compile(r"\+cu(?P<v>\d{3,4})\b|CUDA runtime version:? (?P<v2>\d+\.\d+)")
MAX_FRAMES = 60
_SCAN_ONCE = json.JSONDecoder().scan_once  # json's C scanner, without json.loads' three Python frames


def _loads_line(line: str):
    """json.loads for a line that starts with "{" (so no BOM); StopIteration or ValueError when invalid."""
    obj, end = _SCAN_ONCE(line, 0)
    if end != len(line) and line[end:].strip(" \t\n\r"):
        raise ValueError("extra data after the JSON value")
    return obj


class FileParser:
    """Parses one file's lines in order; keeps the little state a format needs (traceback, CSV header)."""

    def __init__(self, file: str, batches: bool = True):
        self.file = file
        self.frames: list[str] = []
        self.csv: client.CsvRecords | None = None
        self.exposition = False
        self.batches = batches  # False: every wanted line through parse() (the reference the bulk paths match)
        self.shape: FinishedShape | None = None

    def split_block(self, first: int, block: str, lines: list[str] | None = None) -> list:
        """A block of read_blocks as runs in line order: a Batch for lines the bulk paths read,
        (line number, line) for each line to parse(); lines no rule reads (wanted_lines') are left out.
        lines: the block's lines when split already (block.split("\n") less the empty last).

        Bulk lines change none of the parser's state, so parse() sees what it would have seen."""
        if not self.batches:
            return [(first + i + 1, line) for i, line in wanted_lines(block)]
        ascii = block.isascii()  # the C checks read ASCII lines only
        if lines is None and ascii and batch_module.SPEEDUPS is not None and (
                found := batch_module.SPEEDUPS.engine_block(block)):
            fin_idx, fin_lines = found  # the common case, checked in C before splitting the block
            slow, batches = self._finished(first, fin_idx, fin_lines, ascii)
            return _runs(batches, slow, dict(zip(fin_idx, fin_lines, strict=True)) if slow else {}, first)
        if lines is None:
            lines = block.split("\n")
            lines.pop()
        n = len(lines)
        fin_idx: list[int] = []
        if '"event":"' in block:
            fin_idx, other_idx = _engine_split(block, lines)
        else:
            other_idx = list(range(n))
        slow, batches = self._finished(first, fin_idx, list(map(lines.__getitem__, fin_idx)), ascii)
        if other_idx and '] "' in block and self._no_csv(first, lines):
            sub = lines if len(other_idx) == n else list(map(lines.__getitem__, other_idx))
            cols = access_columns(sub, ascii)  # client, time, status (set where the row matched), ...
            if first < 3 or "" in cols[2]:  # parse() reads lines 1-3 as a possible CSV header first
                hit = [k for k, status in enumerate(cols[2]) if status and other_idx[k] >= 3 - first]
            else:
                hit = None  # every line
            if hit is None or hit:
                if hit is not None and len(hit) < len(other_idx):
                    hit_set = set(hit)
                    slow += [i for k, i in enumerate(other_idx) if k not in hit_set]
                    other_idx = [other_idx[k] for k in hit]
                    cols = [[col[k] for k in hit] for col in cols]
                    sub = list(map(lines.__getitem__, other_idx))
                batches.append(access_batch(self.file, first + 1, other_idx, sub, cols))
                other_idx = []
        slow += other_idx
        return _runs(batches, slow, lines, first)

    def _finished(self, first: int, fin_idx: list[int], fin_lines: list[str], ascii: bool,
                  ) -> tuple[list[int], list[Batch]]:
        """request.finished candidates (block indices, lines) as (indices left to parse(), batches)."""
        if not fin_idx:
            return [], []
        shape = self.shape
        head = fin_lines[0]
        if shape is None or not shape.regex.fullmatch(head):
            shape = FinishedShape.learn(head) or shape
            self.shape = shape
        if shape is None:
            return list(fin_idx), []
        batch, misses = finished_batch(self.file, first + 1, fin_idx, fin_lines, shape, ascii)
        return [fin_idx[k] for k in misses], [] if batch is None else [batch]

    def _no_csv(self, first: int, lines: list[str]) -> bool:
        """Whether parse() will read no line after the first three as CSV (a header is one of them)."""
        if self.csv is not None:
            return False
        return first >= 3 or not any(client.CsvRecords.sniff(line) for line in lines[:3 - first])

    def parse(self, lineno: int, line: str) -> list[Event]:
        if not line or line.isspace():
            return []
        head = line[0]
        # The bulk of a large access log, straight to its parser: exactly what _structured would reach
        if (head.isdigit() or head == "[") and self.csv is None and lineno > 3 and (
                m := gateways.NGINX_UPSTREAMINFO.match(line)):
            return [gateways.upstreaminfo_access(m, self.file, lineno, line)]
        if head == "{":
            events = self._json(lineno, line)
            if events is not None:
                return events
        ev = self._structured(head, lineno, line)
        if ev is not None:
            return [ev] if isinstance(ev, Event) else []
        return self._text(lineno, line)

    def _json(self, lineno: int, line: str) -> list[Event] | None:
        if _uninteresting(line):
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
        if ev is not None:
            extra = self._signature_events(ev.ts, _message_of(obj), ev.source, lineno, line) if ev.kind in (
                "engine.error", "request.rejected") else []
            return [ev, *extra]
        inner = obj.get("log") or obj.get("msg") or obj.get("message") or _error_message(obj.get("error"))
        if isinstance(inner, str):  # docker / k8s JSON wrapping, structured app logs, API error bodies
            events = self._text(lineno, inner.rstrip("\n"))
            ts = obj.get("time") or obj.get("ts") or obj.get("timestamp")
            for e in events:
                e.text = line
                if e.ts is None and isinstance(ts, str):
                    e.ts = parse_iso(ts)
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
        if "INFO:" in line[:32] and (ev := gateways.parse_uvicorn(line, self.file, lineno)):
            return ev
        if head == "#" or self.exposition or ("{" in line and line[:1].isalpha() and "=\"" in line):
            ev = metrics_text.parse_sample(line, self.file, lineno)
            if ev is not None and (head == "#" or isinstance(ev, Event) or self.exposition):
                self.exposition = True
                return ev
        if head == "|" or "NVIDIA-SMI" in line:
            return metrics_text.parse_nvidia_smi(line, self.file, lineno)
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
                  for kind, fields in text_logs.engine_text_events(msg)]
        if events and events[0].kind == "request.received":
            return events  # a logged prompt is user text: "CUDA out of memory" in it is a question, not an error
        events.extend(self._signature_events(ts, msg, source, lineno, line))
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
        events = [Event(ts, source, kind, fields, self.file, lineno, line) for kind, fields in scan(msg, line)]
        if "cu" in msg and (m := _CUDA_RUNTIME.search(msg)):
            events.append(Event(ts, source, "cuda.runtime", {"version": _cuda_version(m)}, self.file, lineno, line))
        if self.frames and (events or _EXC_LINE.match(stripped)):
            for ev in events:
                ev.fields["frames"] = list(self.frames)
            self.frames = []
        return events


# Engine events no rule reads (unless they carry prompt text): skipped before decoding the JSON.
_SKIP_EVENTS = ('"event":"request.first_token"', '"event":"http.access"', '"event":"request.received"')
_FINISHED = '"event":"request.finished"'
_SCHEDULED = '"event":"request.scheduled"'
_SHORT_QUEUE = re.compile(r'"queue_s":-?0(?:\.\d*)?(?![\d.eE+\-])')  # a number _quick_number reads as < 1


def wanted_lines(block: str) -> Iterable[tuple[int, str]]:
    """(index, line) of a block's lines that may hold events (read_blocks' blocks end in "\\n").

    The engine events _uninteresting skips are dropped here, most by C-level maps before any per-line
    Python: four lines in five of an engine log. A line that logs a prompt is user text, so such blocks
    are left whole."""
    lines = block.split("\n")
    lines.pop()
    if '"event":"' not in block or '"prompt":' in block:
        return enumerate(lines)
    # str.find gives -1 without the key, and startswith(key, -1) then looks at the last character only
    at_event = list(map(str.find, lines, repeat('"event":"')))
    skipped = map(and_, map(str.startswith, lines, repeat("{")), map(str.startswith, lines, repeat(_SKIP_EVENTS),
                                                                   at_event))
    out = []
    for i in compress(range(len(lines)), map(not_, skipped)):
        line = lines[i]
        at = at_event[i]
        if at > 0 and line.startswith(_SCHEDULED, at) and line[0] == "{" and _SHORT_QUEUE.match(
                line, line.find('"queue_s":')):  # the first "queue_s", as _quick_number reads it
            continue
        out.append((i, line))
    return out


# The engine events this file reads, by the character 19 after the start of the event key (unique to each)
_ENGINE_KEYS = (*_SKIP_EVENTS, _FINISHED, _SCHEDULED)  # the commonest first
_AT_19 = {"n": _FINISHED, "h": _SCHEDULED, "r": _SKIP_EVENTS[0], "s": _SKIP_EVENTS[1], "c": _SKIP_EVENTS[2]}
assert all(key[19] == code for code, key in _AT_19.items())
_IS_FINISHED = bytes(int(c == ord("n")) for c in range(256))
_IS_SCHEDULED = bytes(int(c == ord("h")) for c in range(256))
_IS_SKIPPED = bytes(int(c in b"rsc") for c in range(256))
_CODES = "".join(_AT_19).encode()
_SCHEDULED_SHORT = re.compile(re.escape(_SCHEDULED) + "," + _SHORT_QUEUE.pattern)


def _engine_split(block: str, lines: list[str]) -> tuple[list[int], list[int]]:
    """(request.finished candidates, the other lines wanted_lines keeps): indices into lines, in order.

    The common case, an engine log and nothing else, is settled by C-level maps and counts over the
    block's lines: each line's code (the character 19 after its first event key) names the key it
    claims, and only the claims that decide a drop are checked (the bulk path checks a candidate's).
    (_speedups.engine_block checks the same common case in C before a block is split.)"""
    at = list(map(str.find, lines, repeat('"event":"')))
    try:
        codes = _codes(lines, at)
    except IndexError:  # a line too short for a code: no engine line
        return _engine_split_known(block, lines, at)
    if codes.translate(None, _CODES) or not _droppable(block, lines):  # a code no key has
        return _engine_split_known(block, lines, at)
    is_skip, is_sched = codes.translate(_IS_SKIPPED), codes.translate(_IS_SCHEDULED)
    if all(map(str.startswith, compress(lines, is_skip), repeat(_SKIP_EVENTS), compress(at, is_skip))) and (
            _all_short_queues(list(compress(lines, is_sched)), compress(at, is_sched))):
        return list(compress(range(len(lines)), codes.translate(_IS_FINISHED))), []  # every other line dropped
    return _engine_split_known(block, lines, at)


def _engine_split_known(block: str, lines: list[str], at: list[int]) -> tuple[list[int], list[int]]:
    """_engine_split when its common case does not hold: the lines with an engine key first, then the
    candidates among them; a block of them all starting with "{" may still drop every other line."""
    n = len(lines)
    known = list(map(str.startswith, lines, repeat(_ENGINE_KEYS), at))
    if sum(known) == n:
        known_idx, known_lines, known_at = range(n), lines, at
    else:
        known_idx = list(compress(range(n), known))
        known_lines = list(map(lines.__getitem__, known_idx))
        known_at = list(map(at.__getitem__, known_idx))
    codes = _codes(known_lines, known_at)
    fin_idx = list(compress(known_idx, codes.translate(_IS_FINISHED)))
    if len(known_idx) == n and _droppable(block, lines):  # every other known line is dropped...
        sched = list(compress(lines, codes.translate(_IS_SCHEDULED)))
        if None not in map(_SHORT_QUEUE.match, sched, map(str.find, sched, repeat('"queue_s":'))):
            return fin_idx, []  # ...and so is every request.scheduled line here
    fin_set = set(fin_idx)
    return fin_idx, [i for i, _ in wanted_lines(block) if i not in fin_set]


def _codes(lines: list[str], at: Iterable[int]) -> bytes:
    """Each line's code: its character 19 after at (its first event key); IndexError for a short line."""
    return "".join(map(getitem, lines, map(add, at, repeat(19)))).encode()


def _droppable(block: str, lines: list[str]) -> bool:
    """Whether wanted_lines may drop the block's lines by their event keys: no logged prompt, and every
    line starts with "{" (the smallest line is at least "{", the largest below "|")."""
    return '"prompt":' not in block and min(lines, default="{") >= "{" and max(lines, default="{") < "|"


def _all_short_queues(lines: list[str], at: Iterable[int]) -> bool:
    """Whether every line holds at at (its first event key) the request.scheduled key followed by a
    "queue_s" whose number _quick_number reads as < 1, and that "queue_s" is its first: one there in
    each line and as many in all the lines as there are lines means it is each line's only one."""
    return "\n".join(lines).count('"queue_s":') == len(lines) and None not in map(
        _SCHEDULED_SHORT.match, lines, at)


def _runs(batches: list[Batch], slow: list[int], lines, first: int) -> list:
    """Batches and slow lines (indices, any order; lines[i] their text) in line order."""
    slow.sort()
    if not batches:
        return [(first + i + 1, lines[i]) for i in slow]
    return _in_order(batches, slow, lines, first)


def _in_order(batches: list[Batch], slow: list[int], lines, first: int) -> list:
    """Batches and slow lines (sorted indices) merged into line order, batches cut where needed."""
    if len(batches) == 1:
        batch, out, lo = batches[0], [], 0
        for i in slow:
            cut = bisect_left(batch.idx, i)
            if cut > lo:
                out.append(batch.slice(lo, cut))
                lo = cut
            out.append((first + i + 1, lines[i]))
        if lo < len(batch):
            out.append(batch.slice(lo, len(batch)) if lo else batch)
        return out
    # both kinds in one block (interleaved logs): tag every line, then cut runs
    tagged = sorted([(i, -1, 0) for i in slow] + [(i, b, k) for b, batch in enumerate(batches)
                                                   for k, i in enumerate(batch.idx)])
    out, start = [], 0
    for j, (i, b, k) in enumerate(tagged):
        if b < 0:
            out.append((first + i + 1, lines[i]))
            start = j + 1
        elif j + 1 == len(tagged) or tagged[j + 1][1] != b:
            out.append(batches[b].slice(tagged[start][2], k + 1))
            start = j + 1
    return out


def _uninteresting(line: str) -> bool:
    start = line.find('"event":"')
    if start < 0:
        return False
    key = line[start:line.find('"', start + 9) + 1]
    if key == '"event":"request.scheduled"':
        return _quick_number(line, '"queue_s":') < 1.0  # only slow first schedules matter
    return key in _SKIP_EVENTS and '"prompt":' not in line


def _quick_number(line: str, key: str) -> float:
    """The number after key without decoding the JSON; infinity when absent or unreadable (decode it)."""
    at = line.find(key)
    if at < 0:
        return float("inf")
    start = at + len(key)
    end = start
    while end < len(line) and line[end] in "0123456789.eE+-":
        end += 1
    try:
        return float(line[start:end])
    except ValueError:
        return float("inf")


def head_nginx_error(line: str) -> bool:
    return line[:1].isdigit() and line[4:5] == "/" and line[7:8] == "/"


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
