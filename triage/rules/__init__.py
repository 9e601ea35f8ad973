"""Rules, one per failure family: each consumes events and produces findings."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter

from triage.model import Confidence, Event, EvidenceSet, Finding, RequestIds

SEVERITY = {
    "driver-mismatch": "critical", "oom-weights": "critical", "oom-kv-capacity": "critical",
    "oom-runtime": "critical", "engine-crash": "critical", "context-overflow": "low", "kv-preemption": "high",
    "queue-backlog": "high", "stream-cut-gateway-timeout": "high", "stream-cut-client-disconnect": "medium",
    "stream-cut-proxy-buffering": "medium", "cache-miss": "medium", "unrecognised-error": "low",
}


class Candidate:
    """Evidence gathered for one finding id (and cause) before the rule decides to report it."""

    def __init__(self, fid: str, cause: str | None = None):
        self.id = fid
        self.cause = cause
        self.evidence = EvidenceSet()
        self.requests = RequestIds()
        self.first_ts: datetime | None = None
        self.last_ts: datetime | None = None
        self.num_decisive = 0
        self.num_corroborating = 0
        self.counter: list[str] = []
        self.signature_ids: list[str] = []  # catalog entries whose lines are evidence, first seen first

    def add(self, ev: Event, signal: str, decisive: bool, request_ids=()) -> None:
        if decisive and ev.fields.get("confidence") in ("medium", "low"):
            decisive = False  # a catalog entry that is only a strong hint alone corroborates, never decides
        sid = ev.fields.get("signature")
        if sid is not None and len(self.signature_ids) < 3 and sid not in self.signature_ids:
            self.signature_ids.append(sid)
        self.evidence.add(ev, signal, decisive)
        if decisive:
            self.num_decisive += 1
        else:
            self.num_corroborating += 1
        for rid in request_ids:
            self.requests.add(rid)
        if ev.ts is not None:
            if self.first_ts is None or ev.ts < self.first_ts:
                self.first_ts = ev.ts
            if self.last_ts is None or ev.ts > self.last_ts:
                self.last_ts = ev.ts

    def __bool__(self) -> bool:
        return bool(self.num_decisive or self.num_corroborating)

    def merge(self, other: "Candidate") -> None:
        """Takes in evidence gathered apart (as corroboration), e.g. engine aborts once their cause is known."""
        for group in other.evidence.groups.values():
            key = (group.file, group.signal, False, group.first.text)
            if key not in self.evidence.groups and len(self.evidence.groups) < self.evidence.max_groups:
                group.decisive = False
                self.evidence.groups[key] = group
        self.num_corroborating += other.num_decisive + other.num_corroborating
        for key, rid in other.requests.seen.items():
            self.requests.seen.setdefault(key, rid)
        self.requests.num_anonymous += other.requests.num_anonymous
        for ts in (other.first_ts, other.last_ts):
            if ts is not None:
                self.first_ts = ts if self.first_ts is None or ts < self.first_ts else self.first_ts
                self.last_ts = ts if self.last_ts is None or ts > self.last_ts else self.last_ts

    def finding(self, title: str, explanation: str, next_steps: list[str],
                confidence: Confidence | None = None, weight: float = 0.0) -> Finding:
        if confidence is None:
            confidence = Confidence.HIGH if self.num_decisive else Confidence.MEDIUM
        explanation += known_messages(self.signature_ids, explanation)
        return Finding(
            id=self.id, title=title, severity=SEVERITY[self.id], confidence=confidence,
            explanation=explanation, evidence=self.evidence, counter_evidence=list(self.counter),
            next_steps=next_steps, cause=self.cause, first_ts=self.first_ts, last_ts=self.last_ts,
            requests=self.requests, weight=weight or float(self.num_decisive + self.num_corroborating / 10))


class Facts:
    """What every rule may want to know about the whole input: time span and traffic volume."""

    def __init__(self):
        self.first_ts: datetime | None = None
        self.last_ts: datetime | None = None
        self.num_engine_requests = 0  # request.finished + request.aborted
        self.num_gateway_requests = 0  # access-log lines
        self.num_events = 0
        self.last_request_ts: datetime | None = None  # last request or access line (not start-up/shutdown)
        self.sources: dict[str, int] = {}  # format family -> events read from it (what a healthy report lists)
        self.num_error_lines = 0  # error-level lines and engine errors
        self.num_http_errors = 0  # access lines with a 5xx status

    def observe(self, ev: Event) -> None:
        kind = ev.kind
        if kind.endswith(".totals"):
            self._observe_totals(ev)
            return
        self.num_events += 1
        ts = ev.ts
        self.sources[ev.source] = self.sources.get(ev.source, 0) + 1
        if kind == "log.error" or kind == "engine.error":
            self.num_error_lines += 1
        if ts is not None:
            self._saw_ts(kind, ts)
        if kind == "http.access":
            if ev.source != "engine-json":
                self.num_gateway_requests += 1
            status = ev.fields.get("status")
            if isinstance(status, int) and status >= 500:
                self.num_http_errors += 1
        elif (kind == "request.finished" or kind == "request.aborted") and ev.source == "engine-json":
            self.num_engine_requests += 1

    def _saw_ts(self, kind: str, ts) -> None:
        """The time span read, and the last request's time."""
        if (kind.startswith("request.") or kind == "http.access") and (
                self.last_request_ts is None or ts > self.last_request_ts):
            self.last_request_ts = ts
        if self.first_ts is None or ts < self.first_ts:
            self.first_ts = ts
        if self.last_ts is None or ts > self.last_ts:
            self.last_ts = ts

    def _observe_totals(self, ev: Event) -> None:
        """A run of routine lines read in bulk (triage.parsers.bulk): as its lines would have been, one by
        one (served requests: no 5xx, no error)."""
        f = ev.fields
        count, kind = f["count"], ev.kind[:-len(".totals")]
        self.num_events += count
        self.sources[ev.source] = self.sources.get(ev.source, 0) + count
        for ts in (f["first_ts"], f["last_ts"]):
            if ts is not None:
                self._saw_ts(kind, ts)
        if kind == "http.access" and ev.source != "engine-json":
            self.num_gateway_requests += count
        elif kind in ("request.finished", "request.aborted") and ev.source == "engine-json":
            self.num_engine_requests += count

    @property
    def num_requests(self) -> int:
        return max(self.num_engine_requests, self.num_gateway_requests)


@dataclass(frozen=True, slots=True)
class Need:
    """What a rule reads: events of one kind. The reader skips the lines that no rule's Need takes, so a
    Need may narrow what it takes, by the rule's own numbers (one definition):

    fields: only events with every one of these fields (JSON keys); at_least: only those whose field is
    at least the bound (an event without the field, or with one that is no number, is taken: the rule
    decides); not_from: not events of these sources."""

    kind: str
    fields: tuple[str, ...] = ()
    at_least: tuple[tuple[str, float], ...] = ()
    not_from: tuple[str, ...] = ()

    def takes_source(self, source: str) -> bool:
        return source not in self.not_from


class Rule:
    """Base: `needs` declares what the rule reads; handlers() maps each needed kind to the method that
    takes its events (an explicit table: a kind without a handler is an error, not silently dropped);
    findings() runs once at the end."""

    needs: tuple[Need, ...] = ()

    def handlers(self) -> dict[str, Callable[[Event], None]]:
        raise NotImplementedError

    def observe(self, ev: Event) -> None:
        """One event through this rule's own table, as the Dispatcher hands it (a kind the rule does not
        need is not handed: nothing happens)."""
        table = self.__dict__.get("_table")
        if table is None:
            table = self.__dict__["_table"] = self.handlers()
        handler = table.get(ev.kind)
        if handler is not None:
            handler(ev)

    def findings(self, facts: Facts) -> list[Finding]:
        raise NotImplementedError


def column(rows: list, name: str, typed: bool = False) -> list:
    """row.get(name) of each of a totals event's rows: by C-level attribute reads where none is a dict (the
    parsers' typed rows: triage.parsers.finished.FinishedRow; typed: the event says they all are)."""
    if not typed and dict in set(map(type, rows)):
        return [row.get(name) for row in rows]
    return list(map(attrgetter(name), rows))


def totals_rows(ev: Event, rows) -> list[Event]:
    """The events of these rows of a totals event (each made by the line's own parser), those it makes."""
    make = ev.fields["event"]
    return [e for e in map(make, rows) if e is not None]


def needs_of(kinds: tuple[str, ...], **narrowed: Need) -> tuple[Need, ...]:
    """Needs for kinds, each a plain Need(kind) unless narrowed names it (by kind with "_" for ".")."""
    return tuple(narrowed.get(kind.replace(".", "_"), Need(kind)) for kind in kinds)


def dispatch_table(rules: list[Rule]) -> dict[str, list[Callable[[Event], None]]]:
    """kind -> the handlers of every rule that needs it, in rule order. A rule whose handlers and needs
    differ is refused here (ValueError), whatever the input: one kind without a handler would be lost."""
    table: dict[str, list[Callable[[Event], None]]] = {}
    for rule in rules:
        handlers = rule.handlers()
        kinds = {need.kind for need in rule.needs}
        if kinds != set(handlers):
            raise ValueError(f"{type(rule).__name__}: needs without a handler {sorted(kinds - set(handlers))}, "
                             f"handlers without a need {sorted(set(handlers) - kinds)}")
        for kind, handler in handlers.items():
            table.setdefault(kind, []).append(handler)
    return table


def known_messages(ids: list[str], explanation: str) -> str:
    """' Known message: <meaning>' for the catalog entries behind a finding (those not in its text yet)."""
    from triage import signatures  # (the catalog imports the model, as this module does)

    by_id = {s.id: s for s in signatures.SIGNATURES if s.id in ids}
    meanings = [by_id[i].meaning for i in ids if i in by_id and by_id[i].meaning not in explanation]
    meanings = list(dict.fromkeys(meanings))
    if not meanings:
        return ""
    return (" Known message: " if len(meanings) == 1 else " Known messages: ") + " ".join(meanings)


def request_ids_of(ev: Event) -> list[str]:
    f = ev.fields
    ids = f.get("request_ids")
    if isinstance(ids, list):
        return [str(i) for i in ids]
    rid = f.get("request_id")
    return [str(rid)] if rid else []


def all_rules() -> list[Rule]:
    from triage.rules.cache import CacheRule
    from triage.rules.catalog import SignatureRule
    from triage.rules.load import LoadRule
    from triage.rules.memory import MemoryRule
    from triage.rules.streams import StreamRule

    return [MemoryRule(), LoadRule(), StreamRule(), CacheRule(), SignatureRule()]
