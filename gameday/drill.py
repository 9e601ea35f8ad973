"""Drill rules: copies of the shipped rule files with every duration divided by one factor.

A game day cannot wait an hour for a 1 h burn-rate window, so it loads drill copies of the shipped
rules in which every duration is divided by DRILL_FACTOR (60: 5m -> 5s, 1h -> 1m):
`for`, `keep_firing_for`, a group's `interval`, PromQL range windows (`[5m]`), subquery ranges
and steps (`[1h:5m]`) and `offset`s. Two floors keep the maths sound at a 1 s scrape interval:
range windows are at least MIN_RANGE_MS (4 s: four scrapes, so rate() always has two or more
samples), and `for`, `keep_firing_for`, `interval` and subquery steps are at least MIN_STEP_MS
(1 s: one evaluation). An alert that reads `up` (a target down) keeps a `for` of at least
MIN_DOWN_FOR_MS (10 s: ten scrapes in a row, each failing after the 1 s scrape timeout): one
scrape that a busy machine answers too late sets `up` to 0 for one second, and a 1 s `for` would
page on it. Plain numbers inside expressions (`time() - x > 300`) are not durations to PromQL and
are left alone. The copies are generated, never edited by hand.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from gameday.errors import DrillRuleError, ToolMissingError

DRILL_FACTOR = 60
MIN_RANGE_MS = 4_000
MIN_STEP_MS = 1_000
MIN_DOWN_FOR_MS = 10_000

_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
            "w": 604_800_000, "y": 31_536_000_000}
_DUR = r"(?:\d+(?:ms|[smhdwy]))+"
_PART = re.compile(r"(\d+)(ms|[smhdwy])")
_RANGE = re.compile(rf"\[\s*({_DUR})\s*(?::\s*({_DUR})?\s*)?\]")
_OFFSET = re.compile(rf"\boffset(\s+)(-?)({_DUR})\b")
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_UP = re.compile(r"(?<![\w:.])up(?![\w:])")


def parse_duration_ms(text: str) -> int:
    """'1h30m' -> 5_400_000; raises DrillRuleError for anything PromQL would not accept."""
    text = text.strip()
    if not re.fullmatch(_DUR, text):
        raise DrillRuleError(f"not a Prometheus duration: {text!r}")
    return sum(int(num) * _UNIT_MS[unit] for num, unit in _PART.findall(text))


def format_duration_ms(ms: int) -> str:
    """5_400_000 -> '1h30m'; 1_500 -> '1s500ms'; 0 -> '0s'."""
    if ms == 0:
        return "0s"
    parts = []
    for unit in ("h", "m", "s", "ms"):
        num, ms = divmod(ms, _UNIT_MS[unit])
        if num:
            parts.append(f"{num}{unit}")
    return "".join(parts)


def scale_ms(ms: int, factor: int, floor_ms: int) -> int:
    """Divide by factor, round to whole milliseconds, never below floor_ms (zero stays zero)."""
    if ms == 0:
        return 0
    return max(floor_ms, round(ms / factor))


def scale_duration(text: str, factor: int, floor_ms: int) -> str:
    return format_duration_ms(scale_ms(parse_duration_ms(text), factor, floor_ms))


def rewrite_expr(expr: str, factor: int = DRILL_FACTOR) -> str:
    """Scale every range window, subquery and offset in one PromQL expression."""

    def _range(match: re.Match) -> str:
        window = scale_duration(match.group(1), factor, MIN_RANGE_MS)
        if ":" not in match.group(0):
            return f"[{window}]"
        step = match.group(2)
        return f"[{window}:{scale_duration(step, factor, MIN_STEP_MS) if step else ''}]"

    def _offset(match: re.Match) -> str:
        scaled = format_duration_ms(scale_ms(parse_duration_ms(match.group(3)), factor, 1))
        return f"offset{match.group(1)}{match.group(2)}{scaled}"

    return _OFFSET.sub(_offset, _RANGE.sub(_range, expr))


def reads_up(expr: str) -> bool:
    """Whether a PromQL expression reads the `up` series (label values and strings left out)."""
    return _UP.search(_QUOTED.sub('""', expr)) is not None


def rewrite_rule(rule: dict, factor: int = DRILL_FACTOR) -> dict:
    out = dict(rule)
    if "expr" in out:
        out["expr"] = rewrite_expr(str(out["expr"]), factor)
    if "for" in out:
        floor = MIN_DOWN_FOR_MS if "alert" in out and reads_up(str(rule.get("expr", ""))) else MIN_STEP_MS
        out["for"] = scale_duration(str(out["for"]), factor, floor)
    if "keep_firing_for" in out:
        out["keep_firing_for"] = scale_duration(str(out["keep_firing_for"]), factor, MIN_STEP_MS)
    return out


def rewrite_rules(doc: dict, factor: int = DRILL_FACTOR) -> dict:
    """A whole rule file (the `groups:` document) with every duration scaled."""
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
        raise DrillRuleError("not a Prometheus rule file: no top-level 'groups' list")
    groups = []
    for group in doc["groups"]:
        new = dict(group)
        if "interval" in new:
            new["interval"] = scale_duration(str(new["interval"]), factor, MIN_STEP_MS)
        new["rules"] = [rewrite_rule(rule, factor) for rule in group.get("rules") or []]
        groups.append(new)
    return {**doc, "groups": groups}


class _BlockDumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_BlockDumper.add_representer(str, _str_presenter)


def shipped_rule_files(root: Path) -> list[Path]:
    """alerts/*.rules.yml then alerts/adapters/*.rules.yml, sorted."""
    return sorted((root / "alerts").glob("*.rules.yml")) + sorted((root / "alerts" / "adapters").glob("*.rules.yml"))


def target_down_alerts(sources: list[Path]) -> set[str]:
    """Names of the alerts in these rule files that read `up` (they get the MIN_DOWN_FOR_MS floor)."""
    names = set()
    for src in sources:
        try:
            doc = yaml.safe_load(src.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise DrillRuleError(f"{src}: cannot read rule file: {exc}") from exc
        for group in doc.get("groups") or []:
            names |= {r["alert"] for r in group.get("rules") or [] if "alert" in r and reads_up(str(r.get("expr", "")))}
    return names


def write_drill_copies(sources: list[Path], out_dir: Path, factor: int = DRILL_FACTOR) -> list[Path]:
    """Write one drill copy per source file into out_dir; names keep the source's relative form."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for src in sources:
        try:
            doc = yaml.safe_load(src.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise DrillRuleError(f"{src}: cannot read rule file: {exc}") from exc
        drill = rewrite_rules(doc, factor)
        name = src.name if src.parent.name != "adapters" else f"adapter-{src.name}"
        dest = out_dir / name
        header = f"# drill copy of {src.name}: every duration divided by {factor} (gameday.drill); generated\n"
        dest.write_text(header + yaml.dump(drill, Dumper=_BlockDumper, sort_keys=False, width=1000))
        written.append(dest)
    return written


def promtool_check(paths: list[Path]) -> str:
    """Run `promtool check rules`; raise DrillRuleError with its output when it fails."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise ToolMissingError("promtool not found: install the Debian prometheus package")
    result = subprocess.run([promtool, "check", "rules", *map(str, paths)],
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise DrillRuleError(f"promtool check rules failed:\n{result.stdout}{result.stderr}")
    return result.stdout
