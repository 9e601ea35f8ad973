"""What the rules read, as the parsers use it (Wanted): the event kinds and fields the rules' Needs take,
the keywords each format declares for the kinds it makes (MAKES), and from those the one scan over a block
that finds the lines that may hold such events, the catalog's scanners, and the routine forms read in bulk."""

import json
import re
from collections.abc import Iterable

import re2

from triage import signatures
from triage.parsers import bulk, client, engine_json, gateways, metrics_text, runs, text_logs
from triage.parsers.words import NoMatch, Words

# Lines that change a file's parsing state whatever rules need: a traceback's frames (named in the OOM
# that ends it) and the exception line that closes it.
STATE_KEYWORDS = ("Traceback (most recent call last)", 'File "', "Error", "Exception", "Exit", "Interrupt")
# (kind, source or None for any, literal keywords, regexes): each line a format makes an event of that
# kind from holds one of them. Signature kinds come with their catalog keyword; the engine's own events
# with engine_json.scan_patterns (narrowed by the Needs).
MAKES: tuple[tuple[str, str | None, tuple[str, ...], tuple[str, ...]], ...] = (
    *text_logs.MAKES, *gateways.MAKES, *client.MAKES, *metrics_text.MAKES,
    ("cuda.runtime", None, ("+cu", "CUDA runtime version"), ()),
)


class Wanted:
    """What the rules read, as the parsers use it: their Needs by kind, and the keyword scan that finds
    the lines that may hold such events. Wanted() alone takes every kind (a parser on its own)."""

    def __init__(self, needs: Iterable | None = None, catalog: Iterable | None = None,
                 bulk_kinds: Iterable[str] = ()):
        self.everything = needs is None
        self.known: dict[tuple[str, str | None], bool] = {}  # takes(), by (kind, source): asked per event
        self.by_kind: dict[str, list] = {}
        for need in needs or ():
            self.by_kind.setdefault(need.kind, []).append(need)
        # (kind, source) that some Need takes whole: no field of the line to look at
        self.plain = {(n.kind, engine_json.SOURCE) for n in needs or () if not n.fields and not n.at_least
                      and n.takes_source(engine_json.SOURCE)}
        literals: set[str] = set(STATE_KEYWORDS)
        regexes: set[str] = set()
        for kind, source, words, patterns in MAKES:
            if self.takes(kind, source):
                literals.update(words)
                regexes.update(patterns)
        for kind in engine_json.ENGINE_EVENTS:
            if self.takes(kind, engine_json.SOURCE):
                needs = [n for n in self.by_kind.get(kind, ()) if n.takes_source(engine_json.SOURCE)]
                words, patterns = engine_json.scan_patterns(kind, needs)
                literals.update(words)
                regexes.update(patterns)
        for entry in signatures.SIGNATURES if catalog is None else catalog:
            if self.takes(entry.kind, None):
                literals.add(entry.keyword)
        literals |= in_json_strings(literals)
        self.literals, self.regexes = sorted(literals), sorted(regexes)
        # the catalog's keywords alone: a line with none of them holds no signature (scan() is not called)
        keywords = {e.keyword for e in (signatures.SIGNATURES if catalog is None else catalog)}
        self.signature_scanner = re2.compile("|".join(map(re.escape, sorted(keywords, key=len, reverse=True)))
                                             or "$^")  # (over a line's own text, out of any envelope)
        # (over a block's raw lines: a line in a JSON envelope holds them escaped)
        catalog_words = sorted(keywords | in_json_strings(keywords), key=len, reverse=True)
        pattern = "|".join([*(re.escape(w) for w in sorted(literals, key=len, reverse=True)), *regexes])
        options = re2.Options()
        options.max_mem = 64 << 20  # the DFA of a few hundred keywords
        self.scanner = re2.compile("(?m)" + pattern, options)  # one pass over a block, however many keywords
        self.scanner_bytes = re2.compile(("(?m)" + pattern).encode(), options)
        self.no_keyword = NoMatch(self.literals, self.regexes)  # (bytes the scan would find nothing in)
        # over a whole block: the lines with a catalog keyword, and those with a start-up phase word
        self.block_scanners = tuple(re2.compile(("(?m)" + ("|".join(map(re.escape, words)) or "$^")).encode(), options)
                                    for words in (catalog_words, text_logs.PHASE_WORDS))
        # routine lines read in bulk (triage.parsers.bulk): the forms of the kinds that every rule reading
        # them reads as totals too (bulk_kinds), from a source they take
        bulk_kinds = set(bulk_kinds)
        self.bulk_forms = [name for name in runs.FORM_NAMES if bulk_kinds and (
            not runs.kinds_of(name)[0] or runs.kinds_of(name)[0] in bulk_kinds and self.takes(*runs.kinds_of(name)))]
        self.bulk_runs = runs.run_finder(tuple(self.bulk_forms))
        # this engine's request.finished lines among the lines the scan finds, read in bulk too
        self.bulk_finished = "request.finished" in bulk_kinds and self.takes("request.finished", engine_json.SOURCE)
        # every line with this engine's request.finished event is one the scan finds: _scan takes those
        # lines by a literal search and scans only the others (an RE2 hit costs microseconds in Python)
        self.finished_literal = self.bulk_finished and '"request.finished"' in literals
        # a run with one of these anywhere is read line by line: catalog keywords, phase words, and what makes
        # the per-line reading take a routine-looking line for something else; each counts vLLM's stats words
        # (a line with them is read as a stats line: as many as the run has stats lines)
        counted = (bulk.STATS_WORDS,)
        self.bulk_stop = Words([*keywords, *text_logs.PHASE_WORDS, *runs.stop_words()], counted)  # (no envelope)
        # vLLM's logged prompts and stats lines: a logged prompt's reading looks for no keyword, no phase word
        # (the stats lines are read for those one by one: FileParser._pieces)
        self.bulk_stop_vllm = Words(runs.stop_words(vllm=True), counted)

    def takes(self, kind: str, source: str | None) -> bool:
        """Whether any rule reads events of kind from source (None: some source)."""
        if self.everything:
            return True
        key = (kind, source)
        known = self.known.get(key)
        if known is None:
            needs = self.by_kind.get(kind)
            known = bool(needs) and (source is None or any(n.takes_source(source) for n in needs))
            if len(self.known) < 1024:  # (sources named in the logs themselves: a bounded memo)
                self.known[key] = known
        return known

    def takes_json(self, kind: str, source: str, line: str) -> bool:
        """Whether a rule reads the event of this undecoded JSON line (kind and source known): a Need
        takes it when the line has every field it names, and every number it bounds is not below."""
        if self.everything or (kind, source) in self.plain:
            return True
        for need in self.by_kind.get(kind, ()):
            if not need.takes_source(source) or not all(f'"{f}":' in line for f in need.fields):
                continue
            if all(_quick_number(line, f'"{key}":') >= bound for key, bound in need.at_least):
                return True
        return False


def in_json_strings(words: Iterable[str]) -> set[str]:
    """The words as they read inside a JSON string where that differs (a quote, a backslash): a line in a
    collector's JSON envelope (docker's {"log": "..."}, Loki's "line", Google Cloud's "textPayload") holds
    its keywords so. Go's encoder (docker, Loki) also writes <, > and & as \\u003c, \\u003e and \\u0026."""
    out = set()
    for word in words:
        plain = json.dumps(word, ensure_ascii=False)[1:-1]
        out.add(plain)
        out.add(plain.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))
    return out - set(words)


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
