"""The speed-ups drop or shortcut lines in bulk: they must never change what the rules receive."""

import string

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from triage.parsers import FileParser, _all_short_queues, _uninteresting, wanted_lines
from triage.reader import BLOCK_BYTES, Notes, read_lines

HEAD = '{"ts":"2026-11-29T19:00:00.000Z","level":"info","logger":"llmserve","request_id":"chatcmpl-1",'
ENGINE_SEEDS = [
    HEAD + '"event":"request.received","prompt_tokens":64,"max_tokens":32}',
    HEAD + '"event":"request.scheduled","queue_s":0.002,"cached_tokens":0}',
    HEAD + '"event":"request.scheduled","queue_s":2.5,"cached_tokens":0}',
    HEAD + '"event":"request.first_token","ttft_s":0.04}',
    HEAD + '"event":"request.finished","finish_reason":"stop","prompt_tokens":64,"ttft_s":0.04}',
    HEAD + '"event":"http.access","method":"POST","status":200}',
    '127.0.0.1 - - [29/Nov/2026:19:40:01 +0000] "POST /v1/chat/completions HTTP/1.1" 200 2048 "-" "ua" 412 '
    '0.912 [llm-engine] [] 127.0.0.1:8000 2048 0.911 200 0123abcd',
]
PIECES = ['"queue_s":1.5', '"queue_s":0.5e3', '"queue_s":-0.2', '"queue_s":0', '"queue_s":00.1', '"prompt":"a"',
          '"event":"request.finished"', '"event":"http.access"', '"event":"request.scheduled"', " ", "x", "{",
          '"event":"request.scheduled","queue_s":0.1', ',"queue_s":0.\u0663', '"queue_s":0\u0663', "\r", "\\"]


@st.composite
def engine_line(draw):
    line = draw(st.sampled_from(ENGINE_SEEDS))
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(line)))
        junk = draw(st.sampled_from(PIECES) | st.text(alphabet=string.printable.replace("\n", ""), max_size=5))
        line = line[:at] + junk + line[at:]
    return line.replace("\n", "").replace("\r", "")


@settings(max_examples=300, deadline=None)
@given(st.lists(engine_line(), min_size=1, max_size=12))
def test_wanted_lines_keeps_every_line_the_parser_reads(lines):
    block = "\n".join(lines) + "\n"
    kept = {i for i, _ in wanted_lines(block)}
    for i, line in enumerate(lines):
        if i not in kept:  # dropped in bulk: the per-line path would have skipped it too
            assert line.startswith("{") and _uninteresting(line), line
            assert FileParser("x.log").parse(i + 1, line) == []


def test_wanted_lines_drops_unread_engine_events():
    block = "\n".join(ENGINE_SEEDS) + "\n"
    assert [i for i, _ in wanted_lines(block)] == [2, 4, 6]  # slow schedule, finish, access line
    prompt = HEAD + '"event":"request.received","prompt":"2026-11-29 hello"}\n'
    assert [i for i, _ in wanted_lines(block + prompt)] == list(range(8))  # logged prompts: whole block kept


def test_fast_access_path_equals_the_general_parser():
    line = ENGINE_SEEDS[-1]
    fast = FileParser("a.log").parse(10, line)  # line 10: past the CSV sniffing, straight to the access regex
    general = FileParser("a.log")._structured(line[0], 10, line)
    assert len(fast) == 1 and fast[0].fields == general.fields and fast[0].ts == general.ts
    assert fast[0].fields["upstream_addr"] == "127.0.0.1:8000" and fast[0].fields["duration_s"] == 0.912


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


def _events(items: list, parser: FileParser) -> list[tuple]:
    """split_block's runs as the events they stand for: a batch line by line, the others parsed."""
    out = []
    for item in items:
        if type(item) is tuple:
            out += [(e.line, e.kind, e.ts, e.fields, e.text) for e in parser.parse(*item)]
        else:
            out += [(e.line, e.kind, e.ts, e.fields, e.text) for e in map(item.event, range(len(item)))]
    return out


@settings(max_examples=400, deadline=None)
@given(st.lists(engine_line(), min_size=1, max_size=12), st.integers(0, 5))
def test_split_block_gives_the_per_line_events(lines, first):
    """Bulk and per-line split of one block (engine lines among odd ones) make the same events in order."""
    block = "\n".join(lines) + "\n"
    lines = block.split("\n")[:-1]  # a "\r" junk piece stays inside its line, as the reader leaves none
    bulk, per_line, unsplit = FileParser("x.log"), FileParser("x.log", batches=False), FileParser("x.log")
    expected = _events(per_line.split_block(first, block, lines), per_line)
    assert _events(bulk.split_block(first, block, lines), bulk) == expected
    assert _events(unsplit.split_block(first, block), unsplit) == expected  # as _read_file calls it


SCHEDULED = HEAD + '"event":"request.scheduled","queue_s":0.002,"cached_tokens":0}'


@settings(max_examples=400, deadline=None)
@given(st.lists(engine_line(), min_size=1, max_size=8))
@example([SCHEDULED, SCHEDULED.replace('"cached', '"queue_s":1.5,"cached')])
@example([SCHEDULED.replace("0}", '0,"queue_s":0.1}'), SCHEDULED.replace(',"queue_s":0.002', "")])
def test_short_queue_counts_take_only_lines_the_parser_drops(lines):
    """_all_short_queues gets lines that start with "{"; when it says yes, the per-line path drops every
    one (two queue_s in one line and none in another must not cancel out)."""
    lines = [line.replace("\r", "") for line in lines if line[:1] == "{"]
    if lines and _all_short_queues(lines, [line.find('"event":"') for line in lines]):
        for line in lines:
            assert _uninteresting(line), line
            assert FileParser("x.log").parse(9, line) == []


def test_short_queue_counts_on_the_engine_layout():
    def short(*lines):
        return _all_short_queues(list(lines), [line.find('"event":"') for line in lines])

    assert short(SCHEDULED, SCHEDULED, SCHEDULED)
    assert not short(SCHEDULED, SCHEDULED.replace("0.002", "2.5"))
    assert not short(SCHEDULED.replace("{", '{"queue_s":3,'))  # an earlier queue_s is the one read
    assert not short(SCHEDULED.replace("0}", '0,"queue_s":3}'), SCHEDULED.replace('"queue_s":0.002,', ""))


ENGINE_BLOCK = [line for line in ENGINE_SEEDS if line.startswith("{") and "2.5" not in line] * 3


@pytest.mark.parametrize(("odd", "num_events"), [
    (None, 3),  # the common case: every line's claim checked in bulk
    (HEAD + '"event":"engine.error","fatal":true,"event":"request.finished"}', 4),  # a code no drop key has
    (HEAD + '"event":"request.finishes","prompt_tokens":1}', 3),  # a finished code, not the key
    (HEAD + '"event":"request.receivedx","prompt_tokens":1}', 3),  # a skipped code, not the key
    (HEAD + '"event":"request.first_token","event":"request.finished","ttft_s":0.1}', 3),  # the first key counts
    ('{"queue_s":2,' + SCHEDULED[1:], 4),  # an earlier queue_s is the one read
    ('{"event":"x"}', 3),  # too short for a code
    (" " + HEAD + '"event":"http.access","status":504}', 3),  # not JSON to the parser: no event either
])
def test_split_block_on_engine_blocks_with_one_odd_line(odd, num_events):
    lines = ENGINE_BLOCK[:4] + ([odd] if odd else []) + ENGINE_BLOCK[4:]
    block = "\n".join(lines) + "\n"
    bulk, per_line, unsplit = FileParser("x.log"), FileParser("x.log", batches=False), FileParser("x.log")
    expected = _events(per_line.split_block(7, block, lines), per_line)
    assert _events(bulk.split_block(7, block, lines), bulk) == expected
    assert _events(unsplit.split_block(7, block), unsplit) == expected
    assert len(expected) == num_events


@pytest.mark.parametrize("urt", [".0.911", "1.2.3", "."])
def test_upstreaminfo_line_with_an_unreadable_upstream_time(urt):
    """float() cannot read it: still the access event (no upstream time), never a skipped line."""
    line = ENGINE_SEEDS[-1].replace(" 0.911 ", f" {urt} ")
    events = FileParser("a.log").parse(10, line)
    assert [(e.kind, e.fields["status"], e.fields["duration_s"], e.fields.get("upstream_s")) for e in events] == [
        ("http.access", 200, 0.912, None)]
