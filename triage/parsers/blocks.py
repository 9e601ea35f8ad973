"""A file's blocks as the parser reads them: the lines of each that may hold an event a rule reads, found
the way grep does (one scan of every keyword over the block), and the runs of routine lines in it read in
bulk (triage.parsers.bulk) instead of line by line. FileParser (triage.parsers) parses what it hands over."""

from itertools import compress, repeat
from operator import add, getitem, lt, not_

from triage.model import Event
from triage.parsers import bulk, client
from triage.parsers.runs import SCANNED, family_of, run_finder
from triage.parsers.wanted import Wanted
from triage.parsers.words import Words

# A block where this share of lines has a keyword is followed by DENSE_BLOCKS blocks taken whole, then
# scanned again: a scan that finds every line costs more than it saves. (Lines without a keyword make
# no event a rule reads: test_triage_reading checks it on every file of the corpus.)
DENSE, DENSE_BLOCKS = 0.9, 15
_FINISHED = '"event":"request.finished"'  # (what bulk.routine_finished looks for: the line's own event)
_FINISHED_AT = Words([], (_FINISHED,))  # where it is in a block's bytes
_VLLM_FORMS = frozenset({"received", "vllm-stats"})  # scanned forms of vLLM's own log (Wanted.bulk_stop_vllm)
MIN_RUN = 16  # routine lines in a row read in bulk (fewer: line by line, as cheap)
# After RUNLESS_BLOCKS blocks in a row with no run read in bulk (this engine's JSON log: no line of a
# routine form), the next RUNLESS_SKIP blocks are not searched for runs, then searched again: the search
# finds nothing there at about 400 MB/s. (Lines read one by one give the same report.)
RUNLESS_BLOCKS, RUNLESS_SKIP = 2, 15


def _newlines(raw: bytes, start: int, end: int) -> int:
    """raw.count(b"\n", start, end) in about 0.6 of its time on log lines: bytes.replace finds each line end
    with memchr, where count looks at each byte in turn."""
    piece = raw[start:end]
    return len(piece) - len(piece.replace(b"\n", b""))


class BlockReader:
    """The block-level reading of one file: what candidates() and pieces() hand over, and the marks of the
    block's lines that parse() asks for. parse() is the subclass's (FileParser)."""

    def __init__(self, file: str, wanted: Wanted):
        self.file = file
        self.wanted = wanted
        self.csv: client.CsvRecords | None = None  # (set by parse(): a CSV's lines are all taken)
        self.exposition = False  # (set by parse(): a Prometheus exposition is read line by line)
        self.dense = 0  # blocks left to take whole: the last scan found a keyword in nearly every line
        self.num_runless = 0  # blocks in a row where no run was read in bulk
        self.skip_runs = 0  # blocks left not to search for runs
        # the last block candidates() gave: its line numbers, and those of its lines with a catalog keyword
        # and with a phase word (one scan of the block each, instead of one search per line parsed)
        self.span = (0, 0)
        self.marked: tuple[set[int], ...] = ()  # () until a line of the block asks
        self.block = ""
        self.line = ""  # the line parse() is at (its own text, not a message inside it)
        self.forms = list(self.wanted.bulk_forms)  # bulk forms, those this file had first
        self.counted: tuple[str | None, int] = (None, 0)  # the last block pieces() counted whole, its lines
        # the forms of one program's log (runs.FAMILIES) once the runs of a block of this file were all of
        # them, and the search for runs of those forms alone then
        self.family: tuple[str, ...] | None = None
        self.finder = wanted.bulk_runs

    def candidates(self, first: int, block: str) -> list[tuple[int, str]]:
        """(line number, line) of the block's lines that may hold events, in order: those with a keyword,
        lines 1-3 (parse() reads them as a possible CSV header), and every line of a CSV (its rows have
        no keyword). first: the number of lines before the block; the block ends in "\n"."""
        self._mark(first, block)
        if first >= 3 and self.csv is None:
            if self.dense:  # nearly every line had a keyword (an access log): every line, without a scan
                self.dense -= 1
                lines = block.split("\n")
                lines.pop()
                self.span = (first + 1, first + len(lines))  # (the block's lines, counted by the split)
                return list(enumerate(lines, first + 1))
            found = self._scan(first, block, 0)
            if len(found) >= DENSE * (self._last_line() - first):
                self.dense = DENSE_BLOCKS
            return found
        lines = block.split("\n")
        lines.pop()
        head = lines[:max(0, 3 - first)]
        if self.csv is not None or any(client.CsvRecords.sniff(line) for line in head):
            return list(enumerate(lines, first + 1))
        start = sum(map(len, head)) + len(head)  # the offset after them
        return list(enumerate(head, first + 1)) + self._scan(first + len(head), block, start)

    def pieces(self, first: int, block: str) -> list:
        """candidates(), with each run of routine lines (triage.parsers.bulk) as its totals events instead
        of its lines, in the block's order: (line number, line) pairs and Events."""
        runs = self.wanted.bulk_runs
        if runs is None or first < 3 or self.csv is not None or self.exposition:
            return self.candidates(first, block)
        raw = block.encode()
        if len(raw) != len(block):  # not ASCII
            return self.candidates(first, block)
        if self.wanted.bulk_finished and b'"event":"request.finished"' in raw:
            if self.wanted.finished_literal and not self.dense:
                whole = self._finished_block(first, block, raw)
                if whole is not None:
                    return whole
            return self._finished_runs(self._pieces(first, block, raw, self.finder))
        return self._pieces(first, block, raw, self.finder)

    def _finished_block(self, first: int, block: str, raw: bytes) -> list | None:
        """The pieces of an ASCII block of this engine's JSON log whose request.finished lines are all of
        requests that did not fail and whose other lines hold no keyword (most blocks of such a log): one
        request.finished.totals event. Its lines are found by where the event's literal is (one Hyperscan
        pass), decoded where they lie in the block's bytes, and the other lines, joined, are scanned for
        keywords: nothing is split into lines. None for any other block (read as _pieces reads it)."""
        at = _FINISHED_AT.search(raw, 0, len(raw))
        if at is None or len(at) <= MIN_RUN:
            return None
        find, rfind = raw.find, raw.rfind
        starts = list(map(add, map(rfind, repeat(b"\n"), repeat(0), at), repeat(1)))
        ends = list(map(find, repeat(b"\n"), at))  # (a block ends in "\n": each line has its end)
        if not all(map(lt, ends[:-1], at[1:])):
            return None  # (a line with the literal twice)
        if bytes(map(raw.__getitem__, starts)) != b"{" * len(starts) or set(
                map(find, repeat(b'"event":"'), starts, at)) != {-1}:
            return None  # (the line is no JSON object, or its first event key is another)
        # the other lines: before the first finished line, between each two, after the last
        other = b"".join(map(getitem, repeat(raw), map(slice, [0, *map((1).__add__, ends)], [*starts, len(raw)])))
        if other and not self.wanted.no_keyword(other):
            return None
        view = memoryview(raw)
        lines = list(map(getitem, repeat(view), map(slice, starts, ends)))

        def event_of(row: int) -> Event | None:
            return self._row_event(first + block.count("\n", 0, starts[row]) + 1, block[starts[row]:ends[row]])

        totals = bulk.finished_lines_totals(self.file, lines, event_of)
        if totals is None:
            return None
        self._mark(first, block)
        self.counted = (block, _newlines(other, 0, len(other)) + len(at))  # (each finished line ends in one)
        return [totals]

    def _finished_runs(self, items: list) -> list:
        """Runs of MIN_RUN or more lines in a row of items that are this engine's request.finished events
        of requests that did not fail, each as one request.finished.totals event (decoded in one go);
        the other items as they are."""
        flags = bulk.routine_finished([item[1] if type(item) is tuple else "" for item in items])
        if all(flags) and len(items) >= MIN_RUN:  # (most blocks: their candidates are one run)
            totals = bulk.finished_totals(self.file, items, self._row_event)
            return items if totals is None else [totals]
        out: list = []
        run: list = []
        for item, routine in zip([*items, None], [*flags, False], strict=True):
            if routine:
                run.append(item)
                continue
            if run:
                totals = bulk.finished_totals(self.file, run, self._row_event) if len(run) >= MIN_RUN else None
                if totals is None:
                    out.extend(run)
                else:
                    out.append(totals)
                run = []
            if item is not None:
                out.append(item)
        return out

    def _pieces(self, first: int, block: str, raw: bytes, runs) -> list:
        if self.skip_runs:
            self.skip_runs -= 1
            return self.candidates(first, block)
        out: list = []
        search, count, newlines = runs.search, raw.count, _newlines
        wanted = self.wanted
        stop, stop_vllm = wanted.bulk_stop.search, wanted.bulk_stop_vllm.search
        pos = gap = 0  # gap: where the lines not yet handed start
        found: set[str] = set()  # the forms of the runs read in bulk
        gap_line = first  # the line number before gap
        while (span := search(raw, pos)) is not None:
            start, end = span
            pos = end
            nlines = newlines(raw, start, end)
            if nlines < MIN_RUN:
                continue
            gap_lines = count(b"\n", gap, start)
            run = bulk.Run(self.file, gap_line + gap_lines, bulk.RunText(block, start, end), self._row_event)
            hits = None
            first_scan = self.forms[0] in _VLLM_FORMS  # (a vLLM log: scanned first, its stats lines found so)
            if first_scan:
                hits = stop_vllm(raw, start, end)
                if hits is None:
                    continue
                run.text.marks[bulk.STATS_WORDS] = [block.rfind("\n", 0, at) + 1 for at in hits]
            try:
                totals = bulk.summarise(run, self.forms, nlines, self.family)
            except (ValueError, IndexError, TypeError):  # a bug must cost the bulk path, never the diagnosis
                totals = None
            if totals is None:
                continue
            scanned = SCANNED.intersection(run.found)
            if scanned:
                vllm = scanned <= _VLLM_FORMS
                if not (first_scan and vllm):
                    hits = (stop_vllm if vllm else stop)(raw, start, end)
                # a line of it that may be read otherwise (line by line), or vLLM's stats words in another
                # line than a stats line
                if hits is None or len(hits) != bulk.rows_of(totals, "vllm-stats"):
                    continue
                if vllm and any(stop(raw, raw.rfind(b"\n", 0, at) + 1, raw.find(b"\n", at)) is None for at in hits):
                    continue  # (a stats line with a keyword, a phase word: its reading makes an event of it)
            found.update(run.found)
            if gap < start:
                out.extend(self.candidates(gap_line, block[gap:start]))
            out.extend(totals)
            gap, gap_line = end, gap_line + gap_lines + nlines
        if gap == 0:
            self.num_runless += 1
            if self.num_runless >= RUNLESS_BLOCKS:
                self.num_runless, self.skip_runs = 0, RUNLESS_SKIP
            return self.candidates(first, block)
        self.num_runless = 0
        if self.family is None and (family := family_of(found, wanted.bulk_forms)) is not None:
            self.family, self.finder = family, run_finder(family)  # (a block's runs all of one program's forms)
        if gap < len(block):
            tail = count(b"\n", gap)
            out.extend(self.candidates(gap_line, block[gap:]))
        else:
            tail = 0
        self.counted = (block, gap_line + tail - first)  # (each line counted once: the reader asks lines_in)
        return out

    def lines_in(self, block: str) -> int:
        """The number of lines in a block this parser has just read: counted as it was read where it was
        (the runs, the gaps between them, a scan's split), else now. (Counting a block's newlines costs
        about a quarter of a millisecond a 256 KB block: once is enough.)"""
        if self.counted[0] is block:
            return self.counted[1]
        first, last = self.span
        if self.block is block and first > 0 and last is not None:
            return last - first + 1
        return block.count("\n")

    def _row_event(self, lineno: int, line: str) -> Event | None:
        """The event the per-line reading makes of a routine line (a row of a bulk run, quoted as evidence)."""
        events = self.parse(lineno, line)
        return events[0] if events else None

    def _mark(self, first: int, block: str) -> None:
        """The block's marks are made when a line of it first asks (most blocks of a JSON or access log
        never do); its lines are counted when first needed (counting a block costs what decoding it does)."""
        self.span = (first + 1, None)
        self.marked = ()
        self.block = block

    def _last_line(self) -> int:
        """The number of the last line of the block _mark took (0 once its marks cannot be made)."""
        first, last = self.span
        if last is None:
            last = first - 1 + self.block.count("\n")
            self.span = (first, last)
        return last

    def _make_marks(self) -> tuple:
        block, first = self.block, self.span[0] - 1
        raw = block.encode()
        if len(raw) != len(block):  # not ASCII: each line is searched as parse() reaches it
            self.span = (0, 0)
            return ()
        return tuple(self._lines_with(scanner.search, raw, first, block.count)
                     for scanner in self.wanted.block_scanners)

    @staticmethod
    def _lines_with(search, raw: bytes, first: int, count) -> set[int]:
        out: set[int] = set()
        lineno, counted, pos, end = first, 0, 0, len(raw)
        find = raw.find
        while pos < end and (m := search(raw, pos)) is not None:
            at = m.start()
            lineno += count("\n", counted, at) + 1
            out.add(lineno)
            pos = counted = find(b"\n", at) + 1
            if not pos:
                break
        return out

    def _marked(self, which: int, lineno: int, line: str) -> bool | None:
        """Whether the line parse() is at holds a word of block_scanners[which]; None: not known."""
        if line is self.line and self.span[0] <= lineno <= self._last_line():
            if not self.marked:
                self.marked = self._make_marks()
                if not self.marked:
                    return None
            return lineno in self.marked[which]
        return None

    def _has_keyword(self, lineno: int, line: str) -> bool:
        known = self._marked(0, lineno, line)
        return bool(self.wanted.signature_scanner.search(line)) if known is None else known

    def _scan(self, first: int, block: str, start: int) -> list[tuple[int, str]]:
        out = []
        find, rfind, count = block.find, block.rfind, block.count
        raw = block.encode()
        if len(raw) == len(block):  # ASCII: byte offsets are character offsets, and bytes scan fastest
            if self.wanted.finished_literal and find(_FINISHED, start) >= 0:
                return self._scan_finished(first, block, raw, start)
            search, text = self.wanted.scanner_bytes.search, raw
        else:
            search, text = self.wanted.scanner.search, block
        lineno, counted = first, start  # lineno: the lines before offset counted
        pos, end = start, len(block)
        while pos < end and (m := search(text, pos)) is not None:
            at = m.start()
            begin = rfind("\n", 0, at) + 1
            lineno += count("\n", counted, begin) + 1
            pos = counted = find("\n", at) + 1  # the next search starts on the next line
            out.append((lineno, block[begin:pos - 1]))
        return out

    def _scan_finished(self, first: int, block: str, raw: bytes, start: int) -> list[tuple[int, str]]:
        """_scan of an ASCII block with this engine's request.finished lines (each one the scanner finds:
        Wanted.finished_literal): those lines are told by a substring test on the block's lines, the others
        are scanned alone (joined), and both are merged in the block's order. (No offsets are counted
        per line: counting a kilobyte's newlines costs microseconds.)"""
        lines = block[start:].split("\n")
        if lines[-1]:
            lines.append("")  # (a block ends in "\n")
        lines.pop()
        if self.block is block and self.span[1] is None:
            self.span = (self.span[0], first + len(lines))  # (the block's lines, counted by the split)
        flags = [_FINISHED in line for line in lines]
        taken = list(compress(range(len(lines)), flags))
        rest_at = list(compress(range(len(lines)), map(not_, flags)))  # each other line's index
        rest = ("\n".join(compress(lines, map(not_, flags))) + "\n").encode() if rest_at else b""
        if rest and not self.wanted.no_keyword(rest):  # (most blocks: no keyword in the other lines)
            search, count, find_rest = self.wanted.scanner_bytes.search, rest.count, rest.find
            others, pos, counted, k, end = [], 0, 0, 0, len(rest)
            while pos < end and (m := search(rest, pos)) is not None:
                at = m.start()
                k += count(b"\n", counted, at)  # the line of the hit, among the other lines
                others.append(rest_at[k])
                pos = counted = find_rest(b"\n", at) + 1
                k += 1
                if not pos:
                    break
            if others:
                taken = sorted(taken + others)
        number = first + 1
        return [(number + i, lines[i]) for i in taken]

    def parse(self, lineno: int, line: str) -> list[Event]:
        raise NotImplementedError
