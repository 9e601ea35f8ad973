"""Findings straight from the catalog: entries of kind `signature` name their finding themselves (the
user's --signatures entries, and built-in messages no other rule reads), and error lines no entry
explains become a low-confidence `unrecognised-error` finding that quotes them."""

from triage import signatures
from triage.model import Confidence, Event, Finding
from triage.rules import Candidate, Facts, Rule, needs_of

MAX_UNRECOGNISED = 20  # distinct error lines quoted
TITLES = {
    "driver-mismatch": "CUDA driver and runtime do not match",
    "oom-weights": "Out of memory while loading the model weights",
    "oom-kv-capacity": "Not enough memory for the KV cache at start-up",
    "oom-runtime": "Out of memory at run time, under load",
    "engine-crash": "The engine crashed or stopped answering",
    "context-overflow": "Requests longer than the context window",
    "kv-preemption": "KV cache exhausted: requests preempted and recomputed",
    "queue-backlog": "Requests queued beyond capacity",
    "stream-cut-gateway-timeout": "Streams cut by a gateway timeout",
    "stream-cut-client-disconnect": "Clients disconnected before their answers finished",
    "stream-cut-proxy-buffering": "Tokens held back by a buffering proxy",
    "cache-miss": "Prefix cache misses",
    "unrecognised-error": "Error lines that no known signature explains",
}
CACHE_TITLES = {  # as the cache rule words them
    "disabled": "Prefix cache misses: prefix caching is disabled",
    "dynamic-prefix": "Prefix cache misses: the start of the prompt changes every request",
    "eviction": "Prefix cache misses: cached prefixes are evicted under memory pressure",
    "routing": "Prefix cache misses: one client's prompts are spread over several replicas",
    "short-prompts": "Prefix cache misses: prompts shorter than one KV block",
}
_RANK = {"high": 0, "medium": 1, "low": 2}


class SignatureRule(Rule):
    needs = needs_of(("signature", "log.error"))

    def __init__(self):
        self.cands: dict[tuple[str, str | None], Candidate] = {}
        self.best: dict[tuple[str, str | None], str] = {}  # the strongest confidence seen per finding
        self.entries: dict[tuple[str, str | None], list[str]] = {}  # signature ids, first seen first
        self.unrecognised = Candidate("unrecognised-error")

    def handlers(self):
        return {"signature": self._signature, "log.error": self._error}

    def _error(self, ev: Event) -> None:
        if len(self.unrecognised.evidence.groups) < MAX_UNRECOGNISED or self.unrecognised.num_corroborating:
            self.unrecognised.add(ev, "log.error", False)

    def _signature(self, ev: Event) -> None:
        f = ev.fields
        key = (f["finding"], f.get("cause"))
        cand = self.cands.get(key)
        if cand is None:
            cand = self.cands[key] = Candidate(*key)
        confidence = f.get("confidence", "high")
        cand.add(ev, f"signature.{f.get('signature')}", confidence == "high")
        best = self.best.get(key)
        if best is None or _RANK[confidence] < _RANK[best]:
            self.best[key] = confidence
        ids = self.entries.setdefault(key, [])
        if f.get("signature") not in ids:
            ids.append(f.get("signature"))

    def findings(self, facts: Facts) -> list[Finding]:
        by_id = {s.id: s for s in signatures.SIGNATURES}
        out = []
        for key, cand in self.cands.items():
            entries = [by_id[i] for i in self.entries[key] if i in by_id]
            meaning = " ".join(dict.fromkeys(e.meaning for e in entries))
            steps = list(dict.fromkeys(e.next for e in entries if e.next))
            title = CACHE_TITLES.get(key[1], TITLES["cache-miss"]) if key[0] == "cache-miss" else TITLES[key[0]]
            out.append(cand.finding(title, meaning, steps, Confidence(self.best[key])))
        if self.unrecognised:
            u = self.unrecognised
            u.counter.append("no known signature matches these lines: the cause is a guess until one does")
            out.append(u.finding(
                TITLES["unrecognised-error"],
                f"{u.num_corroborating} error line(s) or exception(s) match no entry of the signature catalog. "
                "They may be the incident's cause or harmless noise; read them with the lines around them.",
                ["read the quoted lines in context (the traceback above an exception names where it came from)",
                 "if a line names a known cause, add it to a catalog file and pass it with --signatures FILE",
                 "llmtriage signatures: the messages llmtriage knows"], Confidence.LOW))
        return out
