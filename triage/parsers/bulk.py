"""Routine lines read in bulk: a run of lines that are all served requests (access lines of 1xx-3xx,
uvicorn's "200 OK"), logged prompts or SGLang batch stats becomes one `<kind>.totals` event per kind,
whose fields the rules read as totals (a count, a time range, counters of values, columns); every
other line (a 504, a 499, an error, a preemption) still reaches the rules one by one, with its file and
line.

Runs are found by one RE2 pass over a block's bytes (triage.parsers.runs: the routine forms, each a
whole line), so a line is either in a run or read as before; within a run each form's fields are taken by one `re.findall`
over the run's text, and counted in C (Counter, set). A form's extraction that does not find one row
per line (a field missing, twice in a line) gives the run back to the line-by-line reading: the bulk
path never guesses. A row's own event (evidence to quote) is made on demand by the per-line parser
itself, from the row's line."""

import re
from collections import Counter
from collections.abc import Callable
from itertools import repeat
from operator import and_, attrgetter, indexOf, itemgetter, not_

import orjson

from triage.model import Event
from triage.parsers.gateways import custom_access
from triage.parsers.runs import form_pattern, kinds_of
from triage.parsers.text_logs import vllm_stats
from triage.timeparse import clf_order_key, parse_clf, parse_iso, parse_md_hms

TOTALS = ".totals"
# Each form's fields, one match per line of the form: a "\n" put before the run anchors them at line
# starts (a literal first: the search skips to the next line at C speed)
_EXTRACT = {
    # (each line of a run matched its form whole already: single-character exclusions, which Python's re
    # skips over at memchr-like speed, where the form has "\S" or a class with "\n" too, and nothing past
    # the last field)
    "upstreaminfo": re.compile(
        r'\n([^ ]+) [^ ]+ [^ ]+ \[([^\]]+)\] "[^"]*" \d{3} (?:\d+|-)(?: "[^"]*" "[^"]*")? \d+ '
        r"(\d+\.?\d*|\.\d+) \[[^\]]*\] \[[^\]]*\] ([^ ]+) "),
    # forms read as columns, one findall a field, each field's pattern held once by each line of the form
    # (the first: a literal the line's own field starts with): the k-th match of each is the k-th line's
    # only when every column has as many matches as the first, and the run's lines are all accounted for
    # (a line of the form holds each at least once, so a count that adds up holds each exactly once)
    "nginx-kv": [re.compile(r" (?:rt|request_time)=(\S+)"), re.compile(r'\[([^\]]*)\] "')],
    # (the time: 14 characters after ") INFO ", once a line: its head's, which the run search read as one)
    "received": [re.compile(r" prompt: ([^\n]*)"), re.compile(r"\) INFO (.{14})")],
    # a form read from the lines that hold a literal (each once), each line by the per-line reading's own
    # field patterns: a few a run
    "vllm-stats": "Avg prompt throughput",
    # (the first 19 characters of its first bracket: each line of the form starts with its time there;
    # "] P" or "] D" after the bracket tells it from SGLang's uvicorn line, "] INFO:", and a line of another
    # form that matches adds a row: the run's count does not add up)
    "sglang-batch": re.compile(r"\n\[(.{19})[^\]\n]*\] [PD]"),
    # forms counted by literals each of their lines holds (a line of another form holding one too makes
    # more rows than lines: the run is read line by line)
    "uvicorn": ("INFO: ",),  # (once a line of the form; in SGLang's too: a run with both is read line by line)
    "sglang-uvicorn": ("] INFO: ",),
    "envoy-json": ('"response_code":',),
}
# Forms whose later columns are read outside the lines with a literal: lines of another form in the run
# that hold them too (vLLM's stats line has the time column of a logged prompt's line)
_OUTSIDE = {"received": "Avg prompt throughput"}
_ENVOY_KEYS = ("start_time", "duration", "upstream_host", "downstream_remote_address",
               "x_forwarded_for", "event", "logger", "ttft_s")
_ENVOY_VALUES = {key: re.compile(rf'"{key}":("[^"\n]*"|[^,}}\n]*)') for key in _ENVOY_KEYS}
# A literal each line of the form holds: a run without it has none of its lines (no findall then)
_MARK = {"upstreaminfo": "] [", "nginx-kv": "] \"", "received": "Received request", "sglang-batch": " batch, ",
         "uvicorn": "INFO:", "sglang-uvicorn": "] INFO: ", "envoy-json": '"response_code":'}
_SGL_COLUMNS = (("waiting", re.compile(r"#queue-req: (\d+)"), int),
                ("kv_usage", re.compile(r"token usage: (\d+(?:\.\d+)?)"), float))


class RunText:
    """A run's lines where they lie in their block, block[lo:hi], read as if a "\n" stood before them
    (the extraction patterns start at a line's "\n"), without copying the run: its pieces are the block
    from the "\n" before the run, or, for a run that starts the block, its first line with a "\n" put
    before it, then the block from that line's end."""

    def __init__(self, block: str, lo: int, hi: int):
        self.block, self.lo, self.hi = block, lo, hi
        if lo:
            self.pieces = ((block, lo - 1, hi, 1),)  # (text, start, end, its offset to the block's)
        else:
            cut = block.find("\n", 0, hi)
            self.pieces = (("\n" + block[:cut + 1], 0, cut + 2, -1), (block, cut, hi, 1))
        # literals never span a line's end, so the first line's own "\n" is left to the block piece
        self.literal_pieces = self.pieces if lo else ((self.pieces[0][0], 0, cut + 1, -1), self.pieces[1])
        self.marks: dict[str, list[int]] = {}  # lines_with(), by literal

    def lines_with(self, literal: str) -> list[int]:
        """Where each line that holds literal starts in the block, in order, once for each time it holds it."""
        found = self.marks.get(literal)
        if found is None:
            block, hi = self.block, self.hi
            found = self.marks[literal] = []
            at = block.find(literal, self.lo, hi)
            while at >= 0:
                found.append(block.rfind("\n", 0, at) + 1)
                at = block.find(literal, at + 1, hi)
        return found

    def has(self, literal: str) -> bool:
        return any(text.find(literal, a, b) >= 0 for text, a, b, _ in self.literal_pieces)

    def count(self, literal: str) -> int:
        return sum(text.count(literal, a, b) for text, a, b, _ in self.literal_pieces)

    def findall(self, pattern: re.Pattern) -> list:
        if len(self.pieces) == 1:
            text, a, b, _ = self.pieces[0]
            return pattern.findall(text, a, b)
        (head, a, b, _), (block, c, d, _) = self.pieces
        found = pattern.findall(head, a, b)
        found.extend(pattern.findall(block, c, d))
        return found

    def findall_outside(self, pattern: re.Pattern, literal: str) -> list:
        """findall over the run's lines that do not hold literal (a pattern without "\n")."""
        block, pos, hi, out = self.block, self.lo, self.hi, []
        for start in self.lines_with(literal):
            if start >= pos:
                out.extend(pattern.findall(block, pos, start))
                pos = block.find("\n", start, hi) + 1
        out.extend(pattern.findall(block, pos, hi))
        return out

    def first_line(self) -> str:
        return self.block[self.lo:self.block.find("\n", self.lo)]

    def line_starts(self, extract) -> list[int]:
        """Where each row's line of a form starts in the block."""
        out: list[int] = []
        if type(extract) is str:
            return self.lines_with(extract)
        for text, a, b, shift in self.pieces:
            shift = shift if shift > 0 else 0  # (the first piece's "\n" put before stands at the block's -1)
            if type(extract) is list:  # (the first column's literal is in the line: the "\n" before it starts it)
                out.extend(text.rfind("\n", 0, m.start() + 1) + shift for m in extract[0].finditer(text, a, b))
            elif type(extract) is not tuple:
                out.extend(m.start() + shift for m in extract.finditer(text, a, b))
            else:
                for literal in extract:
                    at = text.find(literal, a, b)
                    while at >= 0:
                        out.append(text.rfind("\n", 0, at + 1) + shift)
                        at = text.find(literal, at + 1, b)
        return sorted(out) if type(extract) is tuple else out


class Run:
    """One run of routine lines in a file: its text (block[lo:hi]), where it starts, and each row's line
    on demand."""

    def __init__(self, file: str, first: int, text: RunText, event_of: Callable[[int, str], Event | None]):
        self.file, self.first, self.text = file, first, text  # first: the line number before the run
        self.event_of = event_of  # (line number, line) -> the per-line parser's event of that line
        self.starts: dict[str, list[int]] = {}
        self.found: list[str] = []  # the forms of its lines (summarise)
        self.rest: str | None = None  # the form whose lines are those the others leave (summarise's family)

    def line(self, form: str, row: int) -> tuple[int, str]:
        """(line number, text) of the form's row-th line in the run."""
        starts = self.starts.get(form)
        if starts is None:
            starts = self.starts[form] = self._rest_starts() if form == self.rest else self.text.line_starts(_EXTRACT[form])
        at = starts[row]  # the offset of the line in the block
        block, lo = self.text.block, self.text.lo
        end = block.find("\n", at)
        return self.first + 1 + block.count("\n", lo, at), block[at:end]

    def event(self, form: str, row: int) -> Event | None:
        return self.event_of(*self.line(form, row))

    def _rest_starts(self) -> list[int]:
        """Where each line of the rest form starts: the run's lines that no other form of it has."""
        block, at, hi = self.text.block, self.text.lo, self.text.hi
        others: set[int] = set()
        for form in self.found:
            if form != self.rest:
                others.update(self.starts.get(form) or self.text.line_starts(_EXTRACT[form]))
        out = []
        while at < hi:
            if at not in others:
                out.append(at)
            at = block.find("\n", at, hi) + 1
        return out


def _rows(name: str, text: RunText) -> list | tuple | int | None:
    """The form's rows in text: a list of matches, a tuple of columns (a form read one findall a field),
    a count (a form counted by literals); None when its columns disagree."""
    extract = _EXTRACT[name]
    if type(extract) is str:
        return len(text.lines_with(extract))
    if type(extract) is tuple:
        return sum(map(text.count, extract))
    if type(extract) is not list:
        return text.findall(extract)
    first = text.findall(extract[0])
    if not first:
        return first
    outside = _OUTSIDE.get(name)
    columns = [first, *(text.findall_outside(pattern, outside) if outside and text.has(outside) else text.findall(pattern)
                        for pattern in extract[1:])]
    if any(len(column) != len(first) for column in columns):
        return None
    return tuple(columns)


def _time_range(stamps: list[str], parse) -> tuple:
    """(first, last) time of these stamps (each distinct one parsed once)."""
    times = [t for t in map(parse, set(stamps)) if t is not None]
    return (min(times), max(times)) if times else (None, None)


def _clf_range(stamps) -> tuple:
    """_time_range of CLF times: where every distinct one has one shape and one offset, only the first and
    the last in time order are parsed (most runs: a few dozen distinct seconds)."""
    distinct = set(stamps)
    if distinct and len(set(map(len, distinct))) == 1 and len({s[20:] for s in distinct}) == 1:
        keys = dict(zip(map(clf_order_key, distinct), distinct, strict=True))
        if None not in keys and len(keys) == len(distinct):
            first, last = parse_clf(keys[min(keys)]), parse_clf(keys[max(keys)])
            if first is not None and last is not None:
                return first, last
    return _time_range(distinct, parse_clf)


def _sortable(stamps: list[str]) -> bool:
    """ISO times of one length, all in UTC ("Z"): they sort as they read (else each is parsed)."""
    return len(set(map(len, stamps))) == 1 and all(map(str.endswith, stamps, repeat("Z")))


def _md_hms(stamp: str):
    return parse_md_hms(stamp[:5], stamp[6:])


def summarise(run: Run, names: list[str], nlines: int, family: tuple[str, ...] | None = None) -> list[Event] | None:
    """The totals events of a run; None when its rows cannot all be told apart (read it line by line).
    names: the forms to try, those a file had before first (once they account for every line of the
    run, no other form can have one). family: the forms the run's lines are all of (its search looked
    for those alone, runs.FAMILIES), whose last form has the lines the others leave."""
    text = run.text
    out: list[Event] = []
    accounted = 0
    found = []
    rest = family[-1] if family else None
    for name in names:
        if accounted == nlines:
            break
        if family is not None and (name == rest or name not in family):
            continue
        mark = _MARK.get(name)  # (a form read from the lines with a literal: none)
        if mark is not None and not text.has(mark):
            continue
        rows = _rows(name, text)
        if rows is None:
            return None
        if not rows:
            continue
        accounted += rows if type(rows) is int else len(rows[0]) if type(rows) is tuple else len(rows)
        if accounted > nlines:
            return None
        made = _SUMMARISE[name](run, name, rows, text)
        if made is None:
            return None
        if made is not False:
            out.append(made)
        found.append(name)
    if rest is not None and accounted < nlines:
        made = _SUMMARISE[rest](run, rest, nlines - accounted, text)
        if made is None:
            return None
        if made is not False:
            out.append(made)
        found.append(rest)
        run.rest = rest
        accounted = nlines
    if accounted != nlines:
        return None
    if names[:len(found)] != found:  # the forms found go first for the file's next runs
        names[:] = found + [n for n in names if n not in found]
    run.found = found
    return out


def rows_of(totals: list[Event], form: str) -> int:
    """The lines of a form among a run's totals events."""
    return sum(ev.fields["count"] for ev in totals if ev.fields["form"] == form)


def _totals(run: Run, form: str, count: int, first_ts, last_ts, fields: dict) -> Event:
    kind, source = kinds_of(form)
    fields.update(count=count, first_ts=first_ts, last_ts=last_ts, form=form,
                  event=lambda row, run=run, form=form: run.event(form, row))
    return Event(first_ts, source, kind + TOTALS, fields, run.file, None, "")


def _upstreaminfo(run: Run, form: str, rows: list, text: RunText) -> Event | None:
    clients, stamps, times, addrs = zip(*rows, strict=True)
    durations = _seconds(Counter(times))
    if durations is None:
        return None
    routes = {pair: row for pair, row in _first_rows(list(zip(clients, addrs, strict=True))).items() if pair[1] != "-"}
    first, last = _clf_range(stamps)
    return _totals(run, form, len(rows), first, last, {"durations": durations, "routes": routes})


def _nginx_kv(run: Run, form: str, rows: tuple, text: RunText) -> Event | None:
    times, stamps = rows
    durations = _seconds(Counter(times))
    if durations is None:
        return None  # a time that is no number: line by line
    first, last = _clf_range(stamps)
    return _totals(run, form, len(times), first, last, {"durations": durations, "routes": {}})


def _received(run: Run, form: str, rows: tuple, text: RunText) -> Event | None:
    # (a prompt with a stats line's words, which the per-line reading would take for one, is found by the
    # stop words: FileParser._pieces)
    rests, stamps = rows
    prompts: dict[str, int] = {}
    for rest, row in _first_rows(rests).items():
        end = rest.find(rest[0] + ", params", 1)
        if end < 0:
            return None  # no end of prompt where the line parser looks: it reads such a line itself
        prompts.setdefault(rest[1:end], row)
    first, last = min(stamps), max(stamps)  # "MM-DD HH:MM:SS" sorts as it reads
    return _totals(run, form, len(rests), _md_hms(first), _md_hms(last),
                   {"prompts": prompts})  # (first seen first)


def _sglang(run: Run, form: str, rows: list, text: RunText) -> Event | None:
    # ("Avg prompt throughput" in a line of the run: the stop-word scan counts it, FileParser._pieces)
    columns = {}
    for key, pattern, conv in _SGL_COLUMNS:
        values = text.findall(pattern)
        if len(values) != len(rows):
            return None  # a field missing from a line, or in one twice: line by line
        converted = {value: conv(value) for value in set(values)}  # (a few distinct values, read once each)
        columns[key] = list(map(converted.__getitem__, values))
    first, last = min(rows), max(rows)  # "YYYY-MM-DD HH:MM:SS" sorts as it reads
    return _totals(run, form, len(rows), parse_iso(first), parse_iso(last), {"columns": columns})


_VLLM_STAMP = ") INFO "
_STATS_LINE = re.compile(form_pattern("vllm-stats"), re.ASCII)  # (a stats line whole, as the run search reads it)


def _vllm_stats(run: Run, form: str, rows: int, text: RunText) -> Event | None:
    """vLLM's stats lines (a few a run): each read by the per-line reading's own field patterns, as columns
    (a line with fields another lacks: line by line). A line with the words that is no stats line as the per-line
    reading reads it (a logged prompt with them) sends the run back to that reading."""
    block = text.block
    starts = run.starts[form] = text.lines_with(_EXTRACT[form])
    if len(set(starts)) != rows:
        return None  # the words twice in a line
    lines = [block[at:block.find("\n", at)] for at in starts]
    if not all(map(_STATS_LINE.fullmatch, lines)) or any(map(custom_access, lines)):
        return None  # the words in a line of another form (a logged prompt), or a line read as an access line
    fields = list(map(vllm_stats, lines))
    keys = fields[0].keys()
    if any(f.keys() != keys for f in fields):
        return None
    stamps = []
    for line in lines:
        at = line.find(_VLLM_STAMP) + len(_VLLM_STAMP)
        stamps.append(line[at:at + 14])
    columns = {key: [f[key] for f in fields] for key in keys}
    first, last = min(stamps), max(stamps)  # "MM-DD HH:MM:SS" sorts as it reads
    return _totals(run, form, rows, _md_hms(first), _md_hms(last), {"columns": columns})


def _uvicorn(run: Run, form: str, rows: int, text: RunText) -> Event:
    return _totals(run, form, rows, None, None, {"durations": Counter(), "routes": {}})


def _nothing(run: Run, form: str, rows: int, text: RunText) -> bool:
    return False  # lines the per-line reading makes no event of


# A value of a line the run search has read as a flat object (its strings hold no quote, no other value a
# comma or a brace): a string to its closing quote, anything else to the next comma (one excluded
# character, which Python's re skips at memchr-like speed; the line's last value then gives back what it
# took past its brace: the pattern ends in the brace before the line's end)
_KEYED: dict[tuple, re.Pattern | None] = {}  # (keys and value types, utc) -> the regex of a line of exactly those
_UTC_TIME = r'"[^"]*Z"'  # (a start_time in UTC, "...Z": ISO times of one length then sort as they read)
_KEYS = re.compile(r'"([\w.-]+)":(")?')  # (a key, and a quote where its value is a string)


def _keyed(fields: tuple, utc: bool) -> re.Pattern | None:
    """One findall for every Envoy line with exactly these keys in this order, each value a string where
    the first line's is (fields: (key, '"' or '') pairs): the values the bulk reading takes as groups (None
    for a key order with a key twice or one another reading takes); utc: its start_time a string that ends
    in "Z" (else the line is not matched). (A value of one type a key: no alternation to try a value.)"""
    if (fields, utc) in _KEYED:
        return _KEYED[fields, utc]
    pattern = None
    keys = [k for k, _ in fields]
    if len(set(keys)) == len(keys) and not {"event", "logger", "ttft_s"} & set(keys):
        parts = []
        for key, quote in fields:
            value = (_UTC_TIME if utc and key == "start_time" else '"[^"]*"') if quote else "[^,]*"
            parts.append(f'"{re.escape(key)}":' + (f"({value})" if key in _ENVOY_KEYS else value))
        pattern = re.compile(r"\n\{" + ",".join(parts) + r"\}(?=\n)")
    if len(_KEYED) < 64:
        _KEYED[fields, utc] = pattern
    return pattern


def _envoy_values(text: RunText, n: int) -> tuple[dict, bool] | None:
    """({key: its value in each row} for the keys the bulk reading takes, whether every start_time is a
    string in UTC): one findall when every row has the first row's keys in its order (and a start_time in
    UTC where the first has), else one findall a key."""
    first = text.first_line()
    utc = '"start_time":' in first and re.search(r'"start_time":"[^"]*Z"', first) is not None
    fields = tuple(_KEYS.findall(first))
    pattern = _keyed(fields, utc) if '"response_code":' in first else None
    if pattern is not None:
        rows = text.findall(pattern)
        if len(rows) == n:
            taken = [k for k, _ in fields if k in _ENVOY_KEYS]
            columns = list(zip(*rows, strict=True)) if len(taken) > 1 else [rows] if taken else []
            values = {key: [] for key in _ENVOY_KEYS}
            values.update(zip(taken, map(list, columns), strict=True))
            return values, utc
    if text.count('"response_flags":') != n or text.count('"response_code":') != n:
        return None  # a key twice in a line: line by line
    values = {}
    for key, pattern in _ENVOY_VALUES.items():
        found = text.findall(pattern) if text.has(f'"{key}":') else []
        if len(found) not in (0, n):
            return None  # a key in some lines only: line by line
        values[key] = found
    if values["event"] or values["logger"] or values["ttft_s"]:
        return None  # what the per-line reading would take for another format's JSON
    return values, False


def _envoy(run: Run, form: str, rows: int, text: RunText) -> Event | None:
    n = rows  # each Envoy line has its response_code once (the run's other forms cannot hold it)
    found = _envoy_values(text, n)
    if found is None:
        return None
    values, utc = found
    stamps = values["start_time"]
    if stamps and not utc and not all(map(str.startswith, stamps, repeat('"'))):
        return None  # a time that is no string: the per-line reading has none
    first = last = None
    if stamps:
        if len(set(map(len, stamps))) == 1 and (utc or all(map(str.endswith, stamps, repeat('Z"')))):  # (_sortable)
            first, last = parse_iso(min(stamps)[1:-1]), parse_iso(max(stamps)[1:-1])
        else:
            first, last = _time_range([s[1:-1] for s in stamps], parse_iso)
    durations = _seconds(Counter(values["duration"]), strip='"', scale=1000)
    if durations is None:
        return None
    routes: dict = {}
    hosts = values["upstream_host"]
    if hosts:
        clients = values["downstream_remote_address"] or values["x_forwarded_for"]
        if values["downstream_remote_address"] and values["x_forwarded_for"]:
            if any(c in ('""', "null") for c in set(values["downstream_remote_address"])):
                return None  # the per-line reading falls back to x_forwarded_for there
        pairs = list(zip(clients or ["null"] * n, hosts, strict=True))
        for (client, host), row in _first_rows(pairs).items():
            if host not in ('""', '"-"', "null"):
                routes.setdefault((_client(client), host.strip('"')), row)
    return _totals(run, form, n, first, last, {"durations": durations, "routes": routes})


def _first_rows(values: list) -> dict:
    """{value: the row it first appears in}, in that order: the distinct values by dict.fromkeys and each
    one's first row by operator.indexOf (both in C: a run has few distinct ones, all seen early), or, for
    many distinct values, one dict entry a row."""
    distinct = dict.fromkeys(values)
    if len(distinct) <= 64:
        return {value: indexOf(values, value) for value in distinct}
    first = dict(zip(reversed(values), range(len(values) - 1, -1, -1), strict=True))
    return dict(sorted(first.items(), key=itemgetter(1)))


_NO_NUMBER = frozenset({"", "-", "null"})


class _Durations(dict):
    """A duration as written -> its seconds (None: "-", "null" or nothing), each spelling read once a
    process (a log repeats a few hundred): ValueError for one that is no number."""

    def __init__(self, strip: str, scale: int):
        super().__init__()
        self.strip, self.scale = strip, scale

    def __missing__(self, raw: str) -> float | None:
        text = raw.strip(self.strip) if self.strip else raw
        value = None if text in _NO_NUMBER else float(text) / self.scale
        if len(self) < 65536:
            self[raw] = value
        return value


_DURATIONS: dict[tuple[str, int], _Durations] = {}


def _seconds(counted: Counter, strip: str = "", scale: int = 1) -> Counter | None:
    """{seconds: count} of a Counter of durations as written ("-", "null" or nothing: none; two spellings
    of one number add up); None when one is no number."""
    seconds = _DURATIONS.get((strip, scale))
    if seconds is None:
        seconds = _DURATIONS[(strip, scale)] = _Durations(strip, scale)
    try:
        values = list(map(seconds.__getitem__, counted))
    except ValueError:
        return None
    out = Counter(dict(zip(values, counted.values(), strict=True)))
    if len(out) != len(counted) or None in out:  # (two spellings of one number, or none: one by one)
        out = Counter()
        for value, num in zip(values, counted.values(), strict=True):
            if value is not None:
                out[value] += num
    return out


def _client(raw: str) -> str | None:
    if raw in ('""', "null", "false", "0"):
        return None
    return raw.strip('"').rsplit(":", 1)[0]


_SUMMARISE = {"upstreaminfo": _upstreaminfo, "nginx-kv": _nginx_kv, "received": _received, "vllm-stats": _vllm_stats,
              "sglang-batch": _sglang, "uvicorn": _uvicorn, "sglang-uvicorn": _nothing, "envoy-json": _envoy}


STATS_WORDS = "Avg prompt throughput"  # vLLM's stats line: counted by the stop-word scan, never a stop


_FINISHED_EVENT = '"event":"request.finished"'


def routine_finished(lines: list[str]) -> list[bool]:
    """Whether each line is one of this engine's JSON log whose event is request.finished (the first "event"
    key, as the per-line reading looks) of a request that did not fail: a quick look, checked once decoded.
    By C-level passes over all the lines."""
    flags = list(map(str.startswith, lines, repeat(_FINISHED_EVENT), map(str.find, lines, repeat('"event":"'))))
    if not any(flags):
        return flags  # (a find of -1 looks at the last character: no event there)
    flags = list(map(and_, flags, map(str.startswith, lines, repeat("{"))))
    joined = "\n".join(lines)  # (one search of all: most blocks have neither)
    for literal in ('"finish_reason":"error"', '"logger":"loadgen"'):
        if literal in joined:
            flags = list(map(and_, flags, map(not_, map(str.__contains__, lines, repeat(literal)))))
    return flags


def finished_totals(file: str, items: list, event_of: Callable[[int, str], Event | None]) -> Event | None:
    """One request.finished.totals event for these (line number, line) items, their decoded objects as
    rows; None when one of them is not what the per-line reading would read as such (read them so).
    Rows are typed (triage.parsers.finished.FinishedRow) where every line decodes so, else orjson's dicts."""
    return finished_lines_totals(file, list(map(itemgetter(1), items)), lambda row: event_of(*items[row]))


def finished_lines_totals(file: str, lines: list[str], event_of: Callable[[int], Event | None]) -> Event | None:
    """finished_totals of these lines; event_of(k): the event of the k-th (its line number found then)."""
    # (imported here: msgspec takes 10 ms to import, and most logs have no such line)
    from triage.parsers import finished

    try:
        rows = list(map(finished.decode, lines))
    except finished.NOT_TYPED:
        rows = None
    typed = rows is not None
    if typed:
        if "loadgen" in set(map(_LOGGER, rows)) or "error" in set(map(_REASON, rows)):
            return None
        stamps = list(map(_TS, rows))
    else:
        try:
            rows = list(map(orjson.loads, lines))
        except orjson.JSONDecodeError:
            return None
        for row in rows:
            if (type(row) is not dict or row.get("event") != "request.finished" or row.get("logger") == "loadgen"
                    or row.get("finish_reason") == "error"):
                return None
        stamps = [row.get("ts") for row in rows]
        stamps = [s for s in stamps if isinstance(s, str)]
    first = last = None
    if stamps:
        if _sortable(stamps):
            first, last = parse_iso(min(stamps)), parse_iso(max(stamps))
        else:
            first, last = _time_range(stamps, parse_iso)
    # typed: the rows are FinishedRows, each field of the type it declares (else orjson's dicts, of any)
    fields = {"rows": rows, "typed": typed, "count": len(rows), "first_ts": first, "last_ts": last,
              "form": "engine-finished", "event": event_of}
    return Event(first, "engine-json", "request.finished" + TOTALS, fields, file, None, "")


_LOGGER, _REASON, _TS = attrgetter("logger"), attrgetter("finish_reason"), attrgetter("ts")
