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
# A JSON number read as below 1 by the parser's quick look (-?0, -?0.ddd with no exponent) is all that
# this leaves out, in the RE2 syntax of the keyword scan (no look-ahead)
_NOT_BELOW_1 = r"(?:-?[1-9]|-?0[0-9.]*[eE]|-?0[0-9]|[^-0-9\s]|-[^0-9])"


def scan_patterns(kind: str, needs: list) -> tuple[list[str], list[str]]:
    """(literals, regexes in RE2 syntax) that find every line of this kind that a Need takes: the text
    form by its event name after a space, the JSON form by its quoted name and, where every Need narrows
    the kind by one field or one bound of at least 1, by that instead: a field by its key on either side
    of the name, a bound by its key and number alone (a number that high is rare in any line, and the
    name beside it would cost the scan a pass to the line's end at each key). Routine lines no rule reads
    are then never handed over. The parser checks exactly (FileParser._json)."""
    name = re.escape(kind)
    text_form, quoted = f" {kind}", f'"{kind}"'
    conds = []
    for need in needs:
        parts = [rf'"{re.escape(f)}":' for f in need.fields]
        parts += [rf'"{re.escape(key)}":\s*{_NOT_BELOW_1}' for key, bound in need.at_least if bound >= 1]
        if len(parts) != 1 or len(need.at_least) > 1 or any(bound < 1 for _, bound in need.at_least):
            return [quoted, text_form], []  # no narrowing to one condition: every line of the kind
        conds.append((parts[0], bool(need.at_least)))
    return [text_form], [p for c, bound in conds
                         for p in ((c,) if bound else (rf'"{name}"[^\n]*{c}', rf'{c}[^\n]*"{name}"'))]


# Fields of the engine's stats and start-up events that are numbers (what every reader of engine.stats
# makes them): one of another type (a string, a list, true) is left out, as if the line had not had it.
# (The request events' fields are checked by the rules as they read them: there are millions.)
_NUMBERS = {
    "engine.stats": ("running", "waiting", "kv_usage", "kv_blocks_used", "kv_blocks_total", "prefix_hit_rate",
                     "prefix_queried_tokens", "prefix_hit_tokens", "prompt_tokens_per_s",
                     "generation_tokens_per_s", "preemptions"),
    "engine.startup": ("block_size", "num_blocks", "kv_bytes_per_token", "kv_cache_bytes", "cache_tokens",
                       "max_model_len", "max_concurrency", "max_num_seqs", "max_num_batched_tokens",
                       "weights_bytes"),
}


def _numbers_only(name: str, fields: dict) -> dict:
    keys = _NUMBERS.get(name)
    if keys is None:
        return fields
    odd = [k for k in keys if k in fields and (type(fields[k]) not in (int, float) or fields[k] != fields[k])]
    return {k: v for k, v in fields.items() if k not in odd} if odd else fields


def parse_json_object(obj: dict, line: str, file: str, lineno: int) -> Event | None:
    """An engine event from a decoded JSON object, or None when it is not one."""
    name = obj.get("event")
    if name not in ENGINE_EVENTS:
        return None
    ts_raw = obj.get("ts")
    ts = parse_iso(ts_raw) if isinstance(ts_raw, str) else None
    return Event(ts, SOURCE, name, _numbers_only(name, obj), file, lineno, line)


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
    return Event(parse_iso(m.group(1)), SOURCE, m.group(3), _numbers_only(m.group(3), fields), file, lineno, line)
