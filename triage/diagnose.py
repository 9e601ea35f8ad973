"""The diagnosis pipeline: files -> parsers -> events -> rules -> ranked findings."""

import gc
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from triage.model import Event, Finding
from triage.parsers import FileParser, Wanted
from triage.parsers.bulk import TOTALS
from triage.parsers.runs import FORM_NAMES, kinds_of
from triage.reader import Notes, iter_files, read_blocks
from triage.rules import Facts, Rule, all_rules, dispatch_table

PROM_MARGIN = timedelta(minutes=2)
BULK_KINDS = frozenset({*(kinds_of(name)[0] for name in FORM_NAMES), "request.finished"} - {""})
DEFAULT_PROM_WINDOW = timedelta(hours=1)


@dataclass(slots=True)
class DiagnoseOptions:
    paths: list[str]
    since: datetime | None = None
    until: datetime | None = None
    prometheus: str | None = None


@dataclass(slots=True)
class Diagnosis:
    findings: list[Finding]
    facts: Facts
    notes: Notes
    num_metric_events: int = 0
    readable: bool = True
    errors: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # every file walked, in order


class Dispatcher:
    """Hands each event to the handlers of the rules that need its kind (rules.dispatch_table), inside
    the --since/--until window; what they need (rules' Needs) tells the parsers which lines to read."""

    def __init__(self, rules: list[Rule], since: datetime | None, until: datetime | None):
        self.rules = rules
        self.table = dispatch_table(rules)
        # a kind is read in bulk when every rule that reads it reads its totals too; --since/--until cut
        # by each line's time, so they read line by line
        bulk_kinds = () if since or until else {kind for kind in BULK_KINDS if all(
            kind + TOTALS in {n.kind for n in rule.needs} for rule in rules if kind in {n.kind for n in rule.needs})}
        self.wanted = Wanted([need for rule in rules for need in rule.needs], bulk_kinds=bulk_kinds)
        self.facts = Facts()
        self.since, self.until = since, until

    def feed(self, ev: Event) -> None:
        if (self.since or self.until) and ev.ts is not None and (
                (self.since and ev.ts < self.since) or (self.until and ev.ts > self.until)):
            return
        self.facts.observe(ev)
        for handler in self.table.get(ev.kind, ()):
            handler(ev)


# cause -> the findings it explains: a cause seen with at least medium confidence goes before them,
# whatever their own confidence (a phase-guessed OOM still precedes the crash it caused).
EXPLAINS = {
    "driver-mismatch": ("oom-weights", "oom-kv-capacity", "oom-runtime", "engine-crash"),
    "oom-weights": ("engine-crash", "stream-cut-gateway-timeout", "stream-cut-client-disconnect"),
    "oom-kv-capacity": ("engine-crash", "stream-cut-gateway-timeout", "stream-cut-client-disconnect"),
    "oom-runtime": ("engine-crash", "stream-cut-gateway-timeout", "stream-cut-client-disconnect"),
    "engine-crash": ("stream-cut-gateway-timeout", "stream-cut-client-disconnect"),
    # requests that waited in a queue beyond capacity outlast the gateway's timeout or the client's patience
    "queue-backlog": ("stream-cut-gateway-timeout", "stream-cut-client-disconnect"),
}


def merge(findings: list[Finding]) -> list[Finding]:
    """One finding per (id, cause): a catalog entry's finding joins the one a rule made for the same cause
    (its lines as corroboration); error lines nothing explains are kept only when no finding of medium or
    high confidence names the incident."""
    out: list[Finding] = []
    by_key: dict = {}
    for f in sorted(findings, key=lambda f: f.rank_key()):
        key = (f.id, f.cause)
        kept = by_key.get(key)
        if kept is None:
            by_key[key] = f
            out.append(f)
            continue
        for group in f.evidence.groups.values():
            gkey = (group.file, group.signal, False, group.first.text)
            if gkey not in kept.evidence.groups and len(kept.evidence.groups) < kept.evidence.max_groups:
                group.decisive = False
                kept.evidence.groups[gkey] = group
    if any(f.confidence.value != "low" and f.id != "unrecognised-error" for f in out):
        out = [f for f in out if f.id != "unrecognised-error"]
    return out


def rank(findings: list[Finding]) -> list[Finding]:
    """Confidence tier, then causal order; then every cause is moved ahead of the symptoms it explains."""
    ordered = sorted(merge(findings), key=lambda f: f.rank_key())
    changed = True
    while changed:
        changed = False
        for j, cause in enumerate(ordered):
            if cause.confidence.value == "low":
                continue
            for i in range(j):
                if ordered[i].id in EXPLAINS.get(cause.id, ()):
                    ordered.insert(i, ordered.pop(j))
                    changed = True
                    break
            if changed:
                break
    return ordered


def _read_file(path, notes: Notes, dispatcher: Dispatcher) -> None:
    parser = FileParser(str(path), dispatcher.wanted)
    parse, feed, pieces, takes = parser.parse, dispatcher.feed, parser.pieces, dispatcher.wanted.takes
    for first, block in read_blocks(path, notes, parser.lines_in):
        for piece in pieces(first, block):
            if type(piece) is not tuple:  # the totals of a run of routine lines
                feed(piece)
                continue
            lineno, line = piece
            try:
                events = parse(lineno, line)
            except Exception as exc:  # a parser bug must cost one line, never the diagnosis
                notes.add(f"{path}:{lineno}: line skipped ({type(exc).__name__})")
                continue
            for ev in events:
                if takes(ev.kind, ev.source):  # what no rule reads is not counted either
                    feed(ev)


def diagnose(opts: DiagnoseOptions) -> Diagnosis:
    """Reads everything, queries Prometheus if asked, and returns findings most likely root cause first."""
    notes = Notes()
    dispatcher = Dispatcher(all_rules(), opts.since, opts.until)
    # Reading makes millions of short-lived tuples and lists and no reference cycles: reference counting
    # frees them all, and the cycle collector's passes over them would cost a tenth of the time.
    collecting = gc.isenabled()
    gc.disable()
    files: list[str] = []
    try:
        for path in iter_files(opts.paths, notes):
            files.append(str(path))
            _read_file(path, notes, dispatcher)
    finally:
        if collecting:
            gc.enable()
    facts = dispatcher.facts
    num_metric_events = 0
    if opts.prometheus:
        start = opts.since or (facts.first_ts - PROM_MARGIN if facts.first_ts else None)
        end = opts.until or (facts.last_ts + PROM_MARGIN if facts.last_ts else None)
        if end is None:
            end = datetime.now(UTC).replace(tzinfo=None)
        if start is None:
            start = end - DEFAULT_PROM_WINDOW
        from triage import promapi  # urllib and http.client cost a tenth of a second to import

        events, prom_notes = promapi.fetch_events(opts.prometheus, start, end)
        for note in prom_notes:
            notes.add(note)
        for ev in events:
            dispatcher.feed(ev)
        num_metric_events = len(events)
    findings = rank([f for rule in dispatcher.rules for f in rule.findings(facts)])
    readable = notes.num_lines_read > 0 or num_metric_events > 0  # empty or unreadable files alone: nothing
    return Diagnosis(findings, facts, notes, num_metric_events, readable, files=files)
