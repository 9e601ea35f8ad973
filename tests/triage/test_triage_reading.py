"""Reading less: the keyword scan finds every line a rule reads, dispatch hands every needed kind to a
handler, and the reader's blocks keep line numbers and endings."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.triage.conftest import CORPUS
from triage.diagnose import Dispatcher
from triage.parsers import FileParser, Wanted
from triage.reader import BLOCK_BYTES, Notes, read_blocks, read_lines
from triage.rules import Need, Rule, all_rules, dispatch_table

HEAD = '{"ts":"2026-11-29T19:00:00.000Z","level":"info","logger":"llmserve","request_id":"chatcmpl-1",'
ACCESS = ('127.0.0.1 - - [29/Nov/2026:19:40:01 +0000] "POST /v1/chat/completions HTTP/1.1" 200 2048 "-" "ua" 412 '
          '0.912 [llm-engine] [] 127.0.0.1:8000 2048 0.911 200 0123abcd')


def _wanted() -> Wanted:
    return Dispatcher(all_rules(), None, None).wanted


def _events(parser: FileParser, items) -> list[tuple]:
    wanted = parser.wanted
    return [(e.line, e.kind, e.ts, e.fields, e.text) for lineno, line in items for e in parser.parse(lineno, line)
            if wanted.takes(e.kind, e.source)]


CORPUS_FILES = sorted(p for p in CORPUS.rglob("*") if p.is_file() and p.name != "expected.json")


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[str(p.relative_to(CORPUS)) for p in CORPUS_FILES])
def test_the_scan_finds_every_line_a_rule_reads(path):
    """Every event of a needed kind that parse() makes of any line of the corpus comes from a line the
    scan hands over: the keywords the formats and the catalog declare are complete on real wordings."""
    wanted = _wanted()
    every, scanned = FileParser(str(path), wanted), FileParser(str(path), wanted)
    from_all, from_found = [], []
    for first, block in read_blocks(path, Notes()):  # block by block, as diagnose reads: state carries over
        from_all += _events(every, enumerate(block.split("\n")[:-1], first + 1))
        from_found += _events(scanned, scanned.candidates(first, block))
    assert from_all == from_found


def test_the_scan_skips_routine_engine_lines():
    lines = [HEAD + '"event":"request.received","prompt_tokens":64,"max_tokens":32}',
             HEAD + '"event":"request.scheduled","queue_s":0.002,"cached_tokens":0}',
             HEAD + '"event":"request.first_token","ttft_s":0.04}',
             HEAD + '"event":"request.finished","finish_reason":"stop","prompt_tokens":64,"ttft_s":0.04}',
             '{"ts":"2026-11-29T19:00:01Z","level":"info","event":"engine.stats","running":2,"waiting":0}',
             "plain words of no interest", ACCESS,
             HEAD + '"event":"request.scheduled","queue_s":2.5,"cached_tokens":0}',  # slow: the load rule's
             HEAD + '"event":"request.received","prompt":"Today is 2026-11-29. Hi"}']  # a prompt: the cache rule's
    parser = FileParser("x.log", _wanted())
    got = parser.candidates(10, "\n".join(lines) + "\n")
    assert [n for n, _ in got] == [14, 15, 17, 18, 19]  # routine engine lines and the plain one never handed over
    assert [e.kind for n, line in got for e in parser.parse(n, line)] == [
        "request.finished", "engine.stats", "http.access", "request.scheduled", "request.received"]


def test_needs_decide_what_json_lines_are_decoded():
    wanted = Wanted([Need("request.scheduled", at_least=(("queue_s", 1.0),)), Need("request.received", ("prompt",))])
    parser = FileParser("x.log", wanted)
    slow = HEAD + '"event":"request.scheduled","queue_s":2.5}'
    assert [e.fields["queue_s"] for e in parser.parse(1, slow)] == [2.5]
    assert parser.parse(2, slow.replace("2.5", "0.5")) == []
    assert parser.parse(3, slow.replace("2.5", '"soon"'))[0].fields["queue_s"] == "soon"  # unreadable: decoded
    assert parser.parse(4, HEAD + '"event":"request.received","prompt_tokens":3}') == []
    assert len(parser.parse(5, HEAD + '"event":"request.received","prompt":"hi"}')) == 1


def test_scan_keeps_line_numbers_across_the_first_lines_and_csv():
    parser = FileParser("x.log", _wanted())
    block = "a\nb\nc\nd\nEngine 000: Avg prompt throughput: 1.0 tokens/s\ne\n"
    assert parser.candidates(0, block) == [(1, "a"), (2, "b"), (3, "c"), (5, block.split("\n")[4])]
    assert parser.candidates(100, block) == [(105, block.split("\n")[4])]
    csv = FileParser("c.csv", _wanted())
    rows = "request_id,ttft_ms,e2e_ms\nr1,20,900\nr2,30,950\nr3,25,800\n"
    assert [n for n, _ in csv.candidates(0, rows)] == [1, 2, 3, 4]  # a CSV's rows hold no keyword


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["x", "", "Traceback (most recent call last):", ACCESS, "RuntimeError: boom",
                                 HEAD + '"event":"request.finished","prompt_tokens":1}', "OOMKilled"]),
                min_size=1, max_size=12), st.integers(0, 6))
def test_scan_line_numbers_are_the_lines(lines, first):
    block = "\n".join(lines) + "\n"
    got = FileParser("x.log", _wanted()).candidates(first, block)
    assert all(lines[n - first - 1] == line for n, line in got)
    assert [n for n, _ in got] == sorted({n for n, _ in got})


def test_every_needed_kind_has_a_handler():
    """Each rule's table names a handler for every kind it needs, and needs every kind it handles."""
    table = dispatch_table(all_rules())
    for rule in all_rules():
        handlers = rule.handlers()
        assert {need.kind for need in rule.needs} == set(handlers), type(rule).__name__
        assert all(callable(h) for h in handlers.values())
    assert "request.first_token" not in table  # no rule reads it: the scan never looks for it


def test_a_need_without_a_handler_is_refused():
    class Broken(Rule):
        needs = (Need("request.finished"), Need("request.first_token"))

        def handlers(self):
            return {"request.finished": print}

    with pytest.raises(ValueError, match=r"needs without a handler \['request.first_token'\]"):
        dispatch_table([Broken()])


def test_line_endings_and_block_edges(tmp_path):
    path = tmp_path / "mixed.log"
    path.write_bytes(b"a\r\nb\rc\n\nd\r")
    assert list(read_lines(path, Notes())) == [(1, "a"), (2, "b"), (3, "c"), (4, ""), (5, "d")]
    long_lines = [("x" * 1000 + str(i)) for i in range(3 * BLOCK_BYTES // 1000)]  # lines across block edges
    path.write_text("\r\n".join(long_lines))
    assert [text for _, text in read_lines(path, Notes())] == long_lines
    path.write_bytes(("é" * BLOCK_BYTES + "\n").encode())  # a two-byte character split by a block edge
    notes = Notes()
    assert list(read_lines(path, notes)) == [(1, "é" * BLOCK_BYTES)] and notes.lines == []


def _blocks_two_ways(path, monkeypatch):
    """(text, line count, notes) of read_blocks as it reads, and of the incremental reading from the start."""
    from triage import reader
    out = []
    for one_buffer in (True, False):
        if not one_buffer:
            monkeypatch.setattr(reader, "_read_utf8", lambda handle, path, notes, lines_in: reader._read_utf8_lines(
                handle, path, notes, lines_in, 0, b"", False))
        notes = Notes()
        blocks = list(read_blocks(path, notes))
        assert all(block.endswith("\n") for _, block in blocks)
        assert [first for first, _ in blocks] == [sum(b.count("\n") for _, b in blocks[:k]) for k in range(len(blocks))]
        out.append(("".join(block for _, block in blocks), notes.num_lines_read, notes.lines))
    return out


@pytest.mark.parametrize("case", ["crlf-at-edges", "lone-cr", "bad-utf8", "long-line", "huge-line", "no-end", "gzip-cut"])
def test_one_buffer_reading_gives_the_incremental_reading(tmp_path, monkeypatch, case):
    """Blocks read into one buffer and decoded at their last line end give the text, line numbers and notes
    of the incremental decoder: "\r\n" and "\r" at block edges, bytes that are no UTF-8 (some split by a
    block edge), a line longer than a block, one past the cut, a last line with no end, a gzip cut short."""
    import gzip
    import random
    rng = random.Random(case)
    path = tmp_path / "x.log"
    if case == "crlf-at-edges":
        data = b"".join(b"y" * rng.randint(0, 300) + rng.choice([b"\r\n", b"\n", b"\r"]) for _ in range(8000))
    elif case == "lone-cr":
        data = b"\r".join(b"z" * rng.randint(1, 200) for _ in range(9000))
    elif case == "bad-utf8":
        data = b"".join(rng.choice([b"ok ", "é".encode(), "日本".encode(), b"\xff", b"\xe6\x97", b"\n"]) for _ in range(400000))
    elif case == "long-line":
        data = b"a\n" * 100 + b"b" * (BLOCK_BYTES + 12345) + b"\nc\n" * 100
    elif case == "huge-line":
        data = b"a\n" * 10 + "é".encode() * (1 << 20) + b"\nc\n"
    elif case == "no-end":
        data = b"line\n" * 70000 + b"last"
    else:
        data = gzip.compress(b"".join(b"%d %s\n" % (i, b"w" * (i % 97)) for i in range(60000)))[:-2000]
    path.write_bytes(data)
    one_buffer, incremental = _blocks_two_ways(path, monkeypatch)
    assert one_buffer == incremental and one_buffer[1] > 2


@pytest.mark.parametrize("urt", [".0.911", "1.2.3", "."])
def test_upstreaminfo_line_with_an_unreadable_upstream_time(urt):
    """float() cannot read it: still the access event (no upstream time), never a skipped line."""
    line = ACCESS.replace(" 0.911 ", f" {urt} ")
    events = FileParser("a.log").parse(10, line)
    assert [(e.kind, e.fields["status"], e.fields["duration_s"], e.fields.get("upstream_s")) for e in events] == [
        ("http.access", 200, 0.912, None)]


def test_a_block_of_keyword_lines_makes_the_next_ones_whole():
    """After a block where nearly every line had a keyword (an access log), the next blocks are taken
    whole without a scan, then scanned again."""
    from triage.parsers.blocks import DENSE_BLOCKS

    parser = FileParser("access.log", _wanted())
    access = "\n".join([ACCESS] * 100) + "\n"
    assert len(parser.candidates(10, access)) == 100 and parser.dense == DENSE_BLOCKS
    plain = "x\n" * 100
    assert len(parser.candidates(110, plain)) == 100  # taken whole
    parser.dense = 0
    assert parser.candidates(210, plain) == [] and parser.dense == 0  # scanned again: nothing
