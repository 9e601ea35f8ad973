"""Core data of a diagnosis: normalised events, grouped evidence and findings."""

import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

MAX_TEXT = 2000  # verbatim lines are cut here in reports; the full line stays in the file
MAX_IDS = 50  # request ids listed per finding; the count stays exact up to MAX_DISTINCT_IDS
MAX_DISTINCT_IDS = 100_000


class Confidence(StrEnum):
    HIGH = "high"  # a decisive signal was seen
    MEDIUM = "medium"  # only corroborating signals
    LOW = "low"


FINDING_IDS = (
    "driver-mismatch",
    "oom-weights",
    "oom-kv-capacity",
    "oom-runtime",
    "engine-crash",
    "context-overflow",
    "kv-preemption",
    "queue-backlog",
    "stream-cut-gateway-timeout",
    "stream-cut-client-disconnect",
    "stream-cut-proxy-buffering",
    "cache-miss",
    "unrecognised-error",  # an error line no signature explains: always low confidence, always last
)
# Causal precedence: a cause earlier here explains symptoms later here (a driver mismatch makes
# OOM-looking errors, an OOM kills the engine, a dead engine cuts streams and empties the cache).
CAUSAL_ORDER = {fid: i for i, fid in enumerate(FINDING_IDS)}
CACHE_MISS_CAUSES = ("dynamic-prefix", "disabled", "eviction", "routing", "short-prompts")


@dataclass(slots=True)
class Event:
    """One normalised observation from one line (or one metric sample)."""

    ts: datetime | None
    source: str  # format family, e.g. "engine-json", "vllm", "nginx-access"
    kind: str  # normalised meaning, e.g. "oom.cuda", "gateway.upstream_timeout"
    fields: dict
    file: str
    line: int | None
    text: str  # the verbatim line


def iso(ts: datetime | None) -> str | None:
    if ts is None:
        return None
    return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"


_MASK = re.compile(r"0x[0-9a-fA-F]+|[0-9a-fA-F]{8,}|\d+(?:\.\d+)?")


def template_of(text: str) -> str:
    """Masks numbers and ids so repeats of one message group together (a cheap Drain)."""
    return _MASK.sub("#", text[:300])


@dataclass(slots=True)
class Sighting:
    line: int | None
    ts: datetime | None
    text: str

    def to_json(self) -> dict:
        return {"line": self.line, "ts": iso(self.ts), "text": self.text[:MAX_TEXT]}


@dataclass(slots=True)
class EvidenceGroup:
    """Repeats of one message template in one file: count, first and last."""

    file: str
    signal: str
    decisive: bool
    first: Sighting
    last: Sighting
    count: int = 1

    def to_json(self) -> dict:
        out = {"file": self.file, **self.first.to_json(), "signal": self.signal,
               "decisive": self.decisive, "count": self.count}
        if self.count > 1:
            out["last"] = self.last.to_json()
        return out


class EvidenceSet:
    """Evidence grouped by (file, signal, template), in order of first sighting."""

    def __init__(self, max_groups: int = 200):
        self.groups: dict[tuple, EvidenceGroup] = {}
        self.max_groups = max_groups
        self.recent_lines: set[tuple] = set()  # one line read as two signals counts once

    def add(self, ev: Event, signal: str, decisive: bool) -> None:
        if ev.line is not None:
            where = (ev.file, ev.line)
            if where in self.recent_lines:
                return
            if len(self.recent_lines) > 10_000:
                self.recent_lines.clear()
            self.recent_lines.add(where)
        key = (ev.file, signal, decisive, template_of(ev.text))
        sighting = Sighting(ev.line, ev.ts, ev.text[:MAX_TEXT])
        group = self.groups.get(key)
        if group is not None:
            group.count += 1
            group.last = sighting
        elif len(self.groups) < self.max_groups:
            self.groups[key] = EvidenceGroup(ev.file, signal, decisive, sighting, sighting)

    def __bool__(self) -> bool:
        return bool(self.groups)

    @property
    def num_decisive(self) -> int:
        return sum(g.count for g in self.groups.values() if g.decisive)

    def to_json(self, limit: int = 20) -> list[dict]:
        ordered = sorted(self.groups.values(), key=lambda g: (not g.decisive, -g.count))
        return [g.to_json() for g in ordered[:limit]]


# One request under the names its hops give it: an OpenAI-compatible server answers the X-Request-Id a
# client sent as "chatcmpl-<id>" (vLLM: "chatcmpl-" + the header; "cmpl-" for completions), so the client's
# "<id>" and the engine's "chatcmpl-<id>" count once.
_API_ID_PREFIXES = ("chatcmpl-", "cmpl-")


def request_key(request_id: str) -> str:
    for prefix in _API_ID_PREFIXES:
        if request_id.startswith(prefix) and len(request_id) > len(prefix):
            return request_id[len(prefix):]
    return request_id


class RequestIds:
    """Affected requests: an exact count (bounded) and the first few ids (the first name each was seen under)."""

    def __init__(self):
        self.seen: dict[str, str] = {}  # request_key -> id as logged
        self.num_anonymous = 0

    def add(self, request_id: str | None) -> None:
        if not request_id:
            self.num_anonymous += 1
        elif len(self.seen) < MAX_DISTINCT_IDS:
            rid = str(request_id)
            self.seen.setdefault(request_key(rid), rid)

    @property
    def count(self) -> int:
        return len(self.seen) + self.num_anonymous

    def listed(self) -> list[str]:
        return sorted(self.seen.values())[:MAX_IDS]


@dataclass(slots=True)
class Finding:
    id: str
    title: str
    severity: str
    confidence: Confidence
    explanation: str
    evidence: EvidenceSet
    counter_evidence: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    cause: str | None = None
    first_ts: datetime | None = None
    last_ts: datetime | None = None
    requests: RequestIds = field(default_factory=RequestIds)
    weight: float = 0.0  # strength within the same confidence and causal rank

    def rank_key(self) -> tuple:
        tier = {Confidence.HIGH: 0, Confidence.MEDIUM: 1, Confidence.LOW: 2}[self.confidence]
        return (tier, CAUSAL_ORDER.get(self.id, len(CAUSAL_ORDER)), -self.weight)

    def to_json(self, runbook_base: str) -> dict:
        return {
            "id": self.id,
            "title": self.title,
            "severity": self.severity,
            "confidence": self.confidence.value,
            "cause": self.cause,
            "window": {"start": iso(self.first_ts), "end": iso(self.last_ts)},
            "affected_requests": {"count": self.requests.count, "ids": self.requests.listed()},
            "evidence": self.evidence.to_json(),
            "counter_evidence": list(self.counter_evidence),
            "explanation": self.explanation,
            "next_steps": list(self.next_steps),
            "runbook": f"{runbook_base}{self.id}.md",
        }
