"""Bulk paths for the lines that make up nearly all of a large log: the engine's request.finished JSON
lines and ingress-nginx upstreaminfo access lines.

A block's lines of these two kinds are matched by one regex findall each and handed to the rules as
column lists (a batch) instead of one Event per line. A line goes into a batch only when the regex proves
that the per-line path (FileParser.parse) would make exactly one event of that kind from it, with the
values the columns hold; anything else (invalid or unusual JSON, a number float() cannot read, an error
finish) stays on the per-line path. Batch.event(k) builds the per-line path's Event for one line, for
the few lines a rule keeps as evidence or samples.
"""

import json
import re
import sys
from itertools import compress, repeat
from operator import getitem, ne

from triage.model import Event
from triage.parsers import engine_json, gateways
from triage.speedups import C as SPEEDUPS  # the per-line checks in C, or None (tests set it None)
from triage.timeparse import parse_clf, parse_iso

_STR = r'"[^"\\\x00-\x1f]*"'  # a JSON string without escapes: its text is its value
# (An optional part is written (?:X|), not (?:X)?: the same greedy match, and sre runs a branch faster
# than a repeat.)
# A JSON number (json.loads refuses an int longer than sys.get_int_max_str_digits(): so does this)
_MAX_INT_DIGITS = sys.get_int_max_str_digits() or -1  # -1: no limit
_DIGITS = f"{{0,{_MAX_INT_DIGITS - 1}}}" if _MAX_INT_DIGITS > 0 else "*"
_NUM = rf'-?(?:0|[1-9][0-9]{_DIGITS})(?:\.[0-9]+|)(?:[eE][-+]?[0-9]+|)'
_INT = r'-?(?:0|[1-9][0-9]{0,17})'  # json.loads makes an int, int() the same one
# float() of the text equals float() of what json.loads makes ("-0" alone is the int 0, not -0.0)
_FLOAT = r'(?!-0(?![.eE]))-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]+|)(?:[eE][-+]?[0-9]+|)'
# Uncaptured values by the sample's type: numbers and nulls stand for each other (tpot_s is null for a
# one-token answer), other types must repeat.
_BY_TYPE = {str: _STR, int: f"(?:{_NUM}|null)", float: f"(?:{_NUM}|null)", type(None): f"(?:null|{_NUM})",
            bool: "(?:true|false)", list: rf'\[(?:{_STR}(?:,{_STR})*|)\]'}
_ISO_Z = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.([0-9]{1,9}))?Z")
# Values that change what the per-line path makes: a loadgen record, a finish rules count as an error.
_NOT = {"logger": "loadgen", "finish_reason": "error"}
FINISHED_COLUMNS = ("ts", "prompt_tokens", "cached_tokens", "ttft_s", "prefix_fingerprint")
# _speedups.shape_rows' value kinds: the patterns above, by number
K_NONE, K_TS, K_INT, K_FLOAT, K_NUM, K_BOOL, K_STR, K_STR_NOT, K_LIST = range(9)
_KIND_BY_TYPE = {str: K_STR, int: K_NUM, float: K_NUM, type(None): K_NUM, bool: K_BOOL, list: K_LIST}
MAX_SHAPES = 64


class FinishedShape:
    """A regex for request.finished lines with one sample's keys in the sample's order.

    A line it matches is a flat JSON object whose strings hold no escapes, so json.loads would give
    exactly these keys with these texts as values: `ts` an ISO time with the sample's number of
    fraction digits (the texts then sort as the times do), ints, a number, a list of strings, an
    event of request.finished, a logger other than loadgen and a finish_reason other than error."""

    def __init__(self, keys: tuple[str, ...], obj: dict):
        parts, columns, ops = [], [], []  # ops: the same pattern for _speedups.shape_rows
        for key in keys:
            value = obj[key]
            kind, arg = _KIND_BY_TYPE.get(type(value)), 0
            if key == "ts":
                m = _ISO_Z.fullmatch(value) if isinstance(value, str) else None
                if m is None:
                    raise ValueError("ts")
                digits = len(m.group(1) or "")
                frac = rf"\.[0-9]{{{digits}}}" if digits else ""
                pattern = rf'"([0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}T[0-9]{{2}}:[0-9]{{2}}:[0-9]{{2}}{frac}Z)"'
                kind, arg = K_TS, digits
            elif key in ("prompt_tokens", "cached_tokens"):
                if type(value) is not int:
                    raise ValueError(key)
                pattern, kind = f"({_INT})", K_INT
            elif key == "ttft_s":
                if type(value) not in (int, float):
                    raise ValueError(key)
                pattern, kind = f"({_FLOAT})", K_FLOAT
            elif key == "prefix_fingerprint":
                if not isinstance(value, list):
                    raise ValueError(key)
                pattern, kind = rf'\[((?:{_STR}(?:,{_STR})*|))\]', K_LIST
            elif key == "event":
                pattern, kind = r'"request\.finished"', K_NONE
            elif key in _NOT and type(value) is str:
                pattern, kind = rf'"(?!{_NOT[key]}")[^"\\\x00-\x1f]*"', K_STR_NOT
            elif type(value) in _BY_TYPE:
                pattern = _BY_TYPE[type(value)]
            else:
                raise ValueError(key)
            if key in FINISHED_COLUMNS:
                columns.append(key)
            parts.append('"' + re.escape(key) + '":' + pattern)
            literal = ("," if ops else "{") + '"' + key + '":' + ('"request.finished"' if key == "event" else "")
            ops.append((literal, kind, FINISHED_COLUMNS.index(key) if key in FINISHED_COLUMNS else -1, arg,
                        _NOT[key] if kind == K_STR_NOT else ""))
        if sorted(columns) != sorted(FINISHED_COLUMNS):
            raise ValueError("missing keys")
        self.ops = (*ops, ("}", K_NONE, -1, 0, ""))
        self.regex = re.compile(r"\{" + ",".join(parts) + r"\}")
        # findall over lines joined by "\n": one tuple a line, the shape's groups or the whole line last
        self.lines = re.compile(r"(?m)^(?:" + self.regex.pattern + r"|(.*))$")
        self.columns = tuple(columns.index(name) for name in FINISHED_COLUMNS)

    @staticmethod
    def learn(line: str) -> "FinishedShape | None":
        """The shape of a request.finished line, if the bulk path can read lines like it."""
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict) or obj.get("event") != "request.finished":
            return None
        ts = obj.get("ts")
        signature = (tuple(obj), tuple(map(type, obj.values())), len(ts) if isinstance(ts, str) else None)
        if signature in _SHAPES:
            shape = _SHAPES[signature]
        else:
            try:
                shape = FinishedShape(signature[0], obj)
            except ValueError:
                shape = None
            if len(_SHAPES) >= MAX_SHAPES:
                _SHAPES.clear()
            _SHAPES[signature] = shape
        # JSON with spaces, escapes or numbers out of range stays with the per-line path
        return shape if shape is not None and shape.regex.fullmatch(line) else None


_SHAPES: dict[tuple, FinishedShape | None] = {}


class Batch:
    """Lines of one kind from one block, in order, as columns; idx holds their indices in the block."""

    kind = ""
    columns: tuple[str, ...] = ("idx", "lines")

    def __init__(self, file: str, base: int, *columns: list):
        self.file, self.base = file, base  # base: the line number of the block's line 0
        for name, col in zip(self.columns, columns, strict=True):
            setattr(self, name, col)
        self._events: dict[int, Event] = {}
        self._times: list | None = None

    def __len__(self) -> int:
        return len(self.idx)  # type: ignore[attr-defined]

    def lineno(self, k: int) -> int:
        return self.base + self.idx[k]  # type: ignore[attr-defined]

    def event(self, k: int) -> Event:
        """The Event the per-line path makes of line k (one object per line, as there)."""
        ev = self._events.get(k)
        if ev is None:
            ev = self._events[k] = self._make_event(self.lines[k], self.lineno(k))  # type: ignore[attr-defined]
        return ev

    def _make_event(self, line: str, lineno: int) -> Event:
        raise NotImplementedError

    def _parse_times(self) -> list:
        raise NotImplementedError

    def times(self) -> list:
        """Each line's time (None where it does not parse)."""
        if self._times is None:
            self._times = self._parse_times()
        return self._times

    def time_range(self) -> tuple:
        """(earliest, latest) of the lines' times that parse; (None, None) when none does."""
        valid = [t for t in self.times() if t is not None]
        return (min(valid), max(valid)) if valid else (None, None)

    def _with(self, pick) -> "Batch":
        out = type(self)(self.file, self.base, *(pick(getattr(self, name)) for name in self.columns))
        if self._times is not None:
            out._times = pick(self._times)
        return out

    def slice(self, lo: int, hi: int) -> "Batch":
        return self._with(lambda col: col[lo:hi])

    def subset(self, keep: list[int]) -> "Batch":
        return self._with(lambda col: [col[k] for k in keep])


class FinishedBatch(Batch):
    """request.finished events: finish_reason never "error", prompt and cached tokens ints, ttft_s a
    number (as float), prefix_fingerprint a list of strings, ts strings of one fixed ISO format."""

    kind = "request.finished"
    columns = ("idx", "lines", "ts", "prompt", "cached", "ttft", "raw_fps")  # raw_fps: the list's text

    @property
    def fps(self) -> list[list[str]]:
        """Each line's prefix_fingerprint (made once)."""
        fps = self.__dict__.get("_fps")
        if fps is None:
            raw = self.raw_fps  # type: ignore[attr-defined]
            fps = list(map(str.split, map(getitem, raw, repeat(slice(1, -1))), repeat('","')))
            if "" in raw:  # "[]": an empty list, not one empty string
                fps = [fp if text else [] for fp, text in zip(fps, raw, strict=True)]
            self._fps = fps
        return fps

    def fp_columns(self) -> list[list[str]] | None:
        """The fingerprints as columns (block 0 of every line, block 1, ...) when every line has the same
        number of blocks, one or more; else None."""
        raw = self.raw_fps  # type: ignore[attr-defined]
        if not raw or "" in raw:
            return None
        commas = set(map(str.count, raw, repeat('","')))  # blocks hold no quote: '","' parts them
        if len(commas) != 1:
            return None
        width = commas.pop() + 1
        flat = ",".join(raw)[1:-1].split('","')
        return [flat[j::width] for j in range(width)]

    def _make_event(self, line: str, lineno: int) -> Event:
        return engine_json.parse_json_object(json.loads(line), line, self.file, lineno)  # type: ignore[return-value]

    def _parse_times(self) -> list:
        return list(map(parse_iso, self.ts))  # type: ignore[attr-defined]

    def time_range(self) -> tuple:
        ts = self.ts  # type: ignore[attr-defined]
        if not ts:
            return None, None
        lo, hi = parse_iso(min(ts)), parse_iso(max(ts))  # one fixed format: text order is time order
        if lo is None or hi is None:  # an impossible date sorts first or last: parse them all
            return super().time_range()
        return lo, hi


class AccessBatch(Batch):
    """nginx (ingress upstreaminfo) http.access events: client, time string, int status, request time
    (as float) and upstream address ("-" for none)."""

    kind = "http.access"
    columns = ("idx", "lines", "client", "time", "status", "duration", "addr")

    def _make_event(self, line: str, lineno: int) -> Event:
        return gateways.upstreaminfo_access(gateways.NGINX_UPSTREAMINFO.match(line), self.file, lineno, line)

    def _parse_times(self) -> list:
        return list(map(parse_clf, self.time))  # type: ignore[attr-defined]

    def time_range(self) -> tuple:
        if self._times is not None:
            return super().time_range()
        valid = [t for t in map(parse_clf, set(self.time)) if t is not None]  # type: ignore[attr-defined]
        return (min(valid), max(valid)) if valid else (None, None)


# NGINX_UPSTREAMINFO's lines where upstreaminfo_access cannot fail (every number reads), for lines whose
# first character is a digit or "[" (FileParser.parse's fast path); the groups are what rules aggregate.
# The fields are space-separated tokens, so a line both match is split into the same groups by both.
# Digits are ASCII ([0-9], where NGINX_UPSTREAMINFO's \d takes any Unicode digit): a narrower match that
# sre checks with about a tenth fewer instructions a line; a line with another digit stays per-line.
UPSTREAMINFO_BULK = re.compile(
    r'(?m)^(?:(?=[0-9\[])(\S+) \S+ \S+ \[([^\]]+)\] "[^"]*" ([0-9]{3}) (?:[0-9]{1,18}|-)(?: "[^"]*" "[^"]*"|) '
    r'[0-9]+ ([0-9]+\.?[0-9]*|\.[0-9]+) \[[^\]]*\] \[[^\]]*\] (\S+) \S+ (?:[0-9]+\.?[0-9]*|\.[0-9]+|-) '
    r'\S+(?: \S+|)|(.*))$')


def converted(convert, texts: list[str]) -> list:
    """list(map(convert, texts)), each distinct text converted once when texts repeat (token counts,
    statuses and request times do: a conversion costs several dict lookups)."""
    distinct = set(texts)
    if 2 * len(distinct) > len(texts):
        return list(map(convert, texts))
    return list(map({text: convert(text) for text in distinct}.__getitem__, texts))


def finished_batch(file: str, base: int, idx: list[int], lines: list[str], shape: FinishedShape,
                   ascii: bool = False) -> tuple[FinishedBatch | None, list[int]]:
    """The lines shape matches as one batch, and the positions (in idx) of those it does not; ascii:
    every line is ASCII (the C path reads only such lines: on others the regex runs)."""
    if ascii and SPEEDUPS is not None:  # the matching lines' columns, token counts and ttft_s made in C
        cols, misses = SPEEDUPS.shape_rows(lines, shape.ops, _MAX_INT_DIGITS)
        if misses:
            missed = set(misses)
            keep = [k for k in range(len(lines)) if k not in missed]
    else:
        rows = shape.lines.findall("\n".join(lines))  # one row a line: no line is empty
        cols = list(zip(*rows, strict=True))
        ts = cols[shape.columns[0]]
        misses = [k for k, text in enumerate(ts) if not text] if "" in ts else []
        keep = [k for k, text in enumerate(ts) if text] if misses else range(len(lines))
        ts, prompt, cached, ttft, raw_fps = ([col[k] for k in keep] if misses else col
                                             for col in (cols[c] for c in shape.columns))
        cols = [ts, converted(int, prompt), converted(int, cached), converted(float, ttft), raw_fps]
    if misses:
        if not keep:
            return None, misses
        idx, lines = [idx[k] for k in keep], [lines[k] for k in keep]
    return FinishedBatch(file, base, idx, lines, *cols), misses


def access_columns(lines: list[str], ascii: bool = False) -> list:
    """UPSTREAMINFO_BULK's columns (client, time, status, duration, addr, ...) over lines, "" in each
    where a line does not match; ascii: every line is ASCII (the C path reads only such lines)."""
    if ascii and SPEEDUPS is not None:
        return SPEEDUPS.access_columns(lines)
    return list(zip(*access_rows("\n".join(lines) + "\n"), strict=True))


def access_rows(text: str) -> list[tuple]:
    """UPSTREAMINFO_BULK's row for each line of text: its groups, or the line alone last when it does
    not match (a row's status, [2], is set only when it does)."""
    rows = UPSTREAMINFO_BULK.findall(text)
    if text.endswith("\n"):
        rows.pop()  # the empty "line" after the last "\n"
    return rows


def access_batch(file: str, base: int, idx: list[int], lines: list[str], cols: list) -> AccessBatch:
    """A batch of lines whose rows matched, from the rows' columns."""
    client, time, status, duration, addr = cols[:5]
    return AccessBatch(file, base, idx, lines, client, time, converted(int, status), converted(float, duration),
                       addr)


def has_upstream(addrs: list[str]) -> list[int]:
    """Positions of lines with an upstream address (upstreaminfo_access's upstream_addr is not None)."""
    return list(compress(range(len(addrs)), map(ne, addrs, repeat("-"))))
