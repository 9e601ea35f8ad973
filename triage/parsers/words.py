"""Whether a block's bytes hold some words, and where: Hyperscan's literal matcher, at a few times RE2's
speed (RE2 without it)."""

import re
from itertools import repeat
from operator import add, sub

import re2

try:
    import hyperscan
except ImportError:  # (a platform without its wheel: RE2 finds the same words, at about a quarter of the speed)
    hyperscan = None


class Words:
    """Where some literals (counted) start in raw[start:end] (bytes), or None where any of others (words)
    occurs. Hyperscan's literal matcher runs at about 1.9 GB/s over the bench's logs where RE2's DFA runs at
    about 0.5; without Hyperscan, RE2 (and bytes.find for the counted)."""

    def __init__(self, words: list[str], counted: tuple[str, ...] = ()):
        self.words = sorted(set(words))
        self.counted = sorted(set(counted) - set(self.words) - {""})
        self.always = "" in self.words  # (an empty word is in every text, as RE2's empty alternative matches)
        self.db = self.re = None
        self.compiled = not (self.words or self.counted) or self.always

    def _compile(self) -> None:
        """At the first search (a catalog's few hundred words take Hyperscan about 15 ms)."""
        self.compiled = True
        words, counted = self.words, self.counted
        if hyperscan is not None:
            self.terminated = hyperscan.ScanTerminated
            self.db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            every = words + counted  # (a stop word's id below len(words): its first match ends the scan)
            flags = [hyperscan.HS_FLAG_SINGLEMATCH] * len(words) + [0] * len(counted)
            self.db.compile(expressions=[w.encode() for w in every], ids=list(range(len(every))),
                            elements=len(every), flags=flags, literal=True)
            self.lengths = [len(w) for w in every]
        elif words:
            options = re2.Options()
            options.max_mem = 64 << 20
            self.re = re2.compile("|".join(map(re.escape, words)).encode(), options)

    def search(self, raw: bytes, start: int, end: int) -> list[int] | None:
        if not self.compiled:
            self._compile()
        if self.always:
            return None
        if self.db is not None:
            found = [len(self.words)]  # (the first counted id, then each counted match: id, end)
            try:
                self.db.scan(memoryview(raw)[start:end], match_event_handler=_on_word, context=found)
            except self.terminated:
                return None
            # (each match's start: its end less its word's length, by C-level passes)
            starts = map(sub, found[2::2], map(self.lengths.__getitem__, found[1::2]))
            return sorted(map(add, starts, repeat(start))) if start else sorted(starts)
        if self.re is not None and self.re.search(raw, start, end) is not None:
            return None
        out = []
        for word in self.counted:
            word = word.encode()
            at = raw.find(word, start, end)
            while at >= 0:
                out.append(at)
                at = raw.find(word, at + len(word), end)
        return sorted(out)


def _on_word(word: int, _start, end: int, _flags, found: list) -> bool:
    if word < found[0]:
        return True  # a stop word ends the scan (Hyperscan raises ScanTerminated)
    found.append(word)
    found.append(end)
    return False


class NoMatch:
    """Whether bytes certainly hold no match of any of some patterns (literals, and regexes in RE2's syntax
    as a (?m) search reads them): one Hyperscan scan, about twice RE2's speed over this engine's JSON lines.
    False where one may match, or where Hyperscan is missing or a regex does not translate (search with
    RE2 then)."""

    def __init__(self, literals: list[str], regexes: list[str]):
        self.literals, self.regexes = sorted(set(literals)), sorted(set(regexes))
        self.db = None
        self.compiled = False

    def _compile(self) -> None:
        """At the first call (a catalog's keywords take Hyperscan about 25 ms)."""
        self.compiled = True
        translated = [_hyperscan_syntax(r) for r in self.regexes]
        if hyperscan is None or "" in self.literals or None in translated:
            return
        patterns = [*(re.escape(w) for w in self.literals), *translated]
        if not patterns:
            return
        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        try:
            db.compile(expressions=[p.encode() for p in patterns], ids=list(range(len(patterns))),
                       elements=len(patterns), flags=[hyperscan.HS_FLAG_SINGLEMATCH | hyperscan.HS_FLAG_MULTILINE
                                                      | hyperscan.HS_FLAG_ALLOWEMPTY] * len(patterns))
        except hyperscan.error:
            return
        self.db, self.terminated = db, hyperscan.ScanTerminated

    def __call__(self, raw: bytes) -> bool:
        if not self.compiled:
            self._compile()
        if self.db is None:
            return False
        try:
            self.db.scan(raw, match_event_handler=_on_any)
        except self.terminated:
            return False
        return True


def _on_any(*_) -> bool:
    return True  # (the first match ends the scan)


_SPACE = r"\t\n\f\r "  # RE2's \s (PCRE's, which Hyperscan follows, has \v too)
_PCRE_ONLY = frozenset("vVhHRNKXC")  # escapes read otherwise by the two (RE2: \v is one character, \C any byte)


def _hyperscan_syntax(pattern: str) -> str | None:
    """An RE2 regex as Hyperscan reads the same language: \\s spelt out; None for \\S or a POSIX class in a
    class, an escape the two read otherwise, or an unfinished escape or class."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            pair = pattern[i:i + 2]
            if len(pair) < 2:
                return None
            if pair == r"\s":
                out.append(_SPACE if in_class else f"[{_SPACE}]")
            elif pair == r"\S":
                if in_class:
                    return None
                out.append(f"[^{_SPACE}]")
            elif pair[1] in _PCRE_ONLY:
                return None
            else:
                out.append(pair)
            i += 2
            continue
        out.append(c)
        i += 1
        if in_class:
            if c == "[" and pattern.startswith(":", i):
                return None  # (a POSIX class: where it ends is not read here)
            in_class = c != "]"
        elif c == "[":
            in_class = True
            for head in ("^", "]"):  # ("[^]...]", "[]...]": a first "]" is a member)
                if pattern.startswith(head, i):
                    out.append(head)
                    i += 1
    return None if in_class else "".join(out)
