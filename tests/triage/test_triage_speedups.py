"""triage._speedups (C) against the Python paths it shortcuts: where it answers, the same answer."""

import json
import os
import random
import string
import subprocess
import sys
from unittest import mock

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.triage.test_triage_bulk_paths import access_line, write_logs
from tests.triage.test_triage_fast_paths import HEAD, PIECES
from triage.parsers import _engine_split
from triage.parsers import batch as batch_module
from triage.parsers.batch import SPEEDUPS, FinishedShape, access_rows


def test_the_extension_is_built():
    """`make setup` builds it (pip install -e .); without it llmtriage runs the Python paths alone."""
    assert SPEEDUPS is not None, "triage/_speedups.c was not built: run `make setup` (needs a C compiler)"


# ---- engine_block: the common case of parsers._engine_split ----------------------------------------
DROPPED = [HEAD + '"event":"request.received","prompt_tokens":64,"max_tokens":32}',
           HEAD + '"event":"request.scheduled","queue_s":0.002,"cached_tokens":0}',
           HEAD + '"event":"request.first_token","ttft_s":0.04}',
           HEAD + '"event":"http.access","method":"POST","status":200}']
FINISHED = HEAD + '"event":"request.finished","finish_reason":"stop","prompt_tokens":64,"ttft_s":0.04}'
QUEUES = ["0", "-0", "0.", "0.5", "-0.25", "0.5e3", "0.5E1", "1", "00.1", "0.1.2", "0.1-", "0.1+", "0.\u0663", "0x"]


@st.composite
def engine_block_line(draw):
    line = draw(st.sampled_from([*DROPPED, FINISHED]))
    if draw(st.booleans()):
        line = line.replace('"queue_s":0.002', '"queue_s":' + draw(st.sampled_from(QUEUES)))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        at = draw(st.integers(0, len(line)))
        junk = draw(st.sampled_from(PIECES) | st.text(alphabet=string.printable.replace("\n", ""), max_size=3))
        line = line[:at] + junk + line[at + draw(st.integers(0, 2)):]
    return line.replace("\n", "")


def python_engine_split(lines):
    return _engine_split("\n".join(lines) + "\n", lines)


def whole(lines):
    return "".join(line + "\n" for line in lines)


@settings(max_examples=500, deadline=None)
@given(st.lists(engine_block_line(), min_size=1, max_size=10))
@example([DROPPED[1].replace("0.002", "0.5e3")])
@example([DROPPED[1].replace('"queue_s":0.002', '"queue_s":0.1,"queue_s":3')])
@example([DROPPED[1].replace('{"ts"', '{"queue_s":3,"ts"')])
@example([FINISHED.replace("finished", "finishedX")])
def test_engine_block_answers_as_python(lines):
    found = SPEEDUPS.engine_block(whole(lines))
    if found is not None:
        assert python_engine_split(lines) == (found[0], [])
        assert found[1] == [lines[i] for i in found[0]]
    assert SPEEDUPS.engine_block(whole(lines)[:-1]) is None  # the last line not whole: the Python split reads it


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(["\n", "a", "\r", "\u00e9", "\u0663", "\U0001f600", " "]), max_size=80))
def test_count_lines_is_str_count(text):
    assert SPEEDUPS.count_lines(text) == text.count("\n")


def test_engine_block_takes_the_engine_layout():
    rng = random.Random(3)
    lines = [rng.choice([*DROPPED, FINISHED]) for _ in range(500)]
    expected = [i for i, line in enumerate(lines) if line == FINISHED]
    block = whole(lines)
    assert SPEEDUPS.engine_block(block) == (expected, [FINISHED] * len(expected))
    assert python_engine_split(lines) == (expected, [])
    for q in ("0", "-0.25", "0.", "0.000"):
        assert SPEEDUPS.engine_block(whole([DROPPED[1].replace("0.002", q)])) == ([], [])
    assert SPEEDUPS.engine_block(block[:-1]) is None  # not whole lines
    for odd in (DROPPED[1].replace("0.002", "1.5"), DROPPED[1].replace("0.002", "0.5e3"), '{"event":"x"}',
                DROPPED[0].replace("prompt_tokens", "prompt"), " " + DROPPED[0], "", "[]", DROPPED[0] + "\u00e9"):
        assert SPEEDUPS.engine_block(block + odd + "\n") is None, odd  # read line by line in Python


# ---- shape_rows: FinishedShape.lines.findall -------------------------------------------------------
SAMPLES = [
    '{"ts":"2026-11-29T19:00:01.000Z","level":"info","logger":"llmserve","model":"m","request_id":"r",'
    '"event":"request.finished","finish_reason":"stop","prompt_tokens":64,"cached_tokens":16,'
    '"completion_tokens":32,"queue_s":0.002,"ttft_s":0.04,"tpot_s":null,"e2e_s":0.9,'
    '"prefix_fingerprint":["a,b","c",""]}',
    '{"event":"request.finished","ts":"2026-11-29T19:00:01Z","ttft_s":3,"ok":true,"tags":["x"],'
    '"prefix_fingerprint":[],"prompt_tokens":-5,"cached_tokens":0}',
    '{"ts":"2026-11-29T19:00:01.123456Z","prefix_fingerprint":["ab"],"cached_tokens":1,"prompt_tokens":2,'
    '"ttft_s":1e-3,"event":"request.finished","logger":"x","finish_reason":"length","n":null,"f":false}',
]
NUMBER_PIECES = ["-0", "-", "0", "00", "1", "9" * 19, ".", ".5", "e", "E+", "e-7", "null", "true", "false",
                 '"', "\\", ",", "[", "]", '""', '","', "\t", "\u00e9", "loadgen", "error", "Z", "T", ":", " "]


@st.composite
def finished_lines(draw, sample):
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        line = sample
        for _ in range(draw(st.sampled_from([0, 1, 1, 2, 3]))):
            at = draw(st.integers(0, len(line)))
            junk = draw(st.sampled_from(NUMBER_PIECES) | st.text(alphabet="0123456789.-eE", max_size=3))
            line = line[:at] + junk + line[at + draw(st.integers(0, 3)):]
        lines.append(line.replace("\n", "") or "x")
    return lines


def regex_rows(shape, lines):
    """The shape regex's rows as shape_rows gives them: token counts int(text), ttft_s float(text)."""
    rows = shape.lines.findall("\n".join(lines))
    ts, prompt, cached, ttft, fps = ([row[c] for row in rows if row[shape.columns[0]]] for c in shape.columns)
    cols = [ts, list(map(int, prompt)), list(map(int, cached)), list(map(float, ttft)), fps]
    return cols, [k for k, row in enumerate(rows) if not row[shape.columns[0]]]


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_shape_rows_are_the_shape_regex_rows(data):
    sample = data.draw(st.sampled_from(SAMPLES))
    shape = FinishedShape.learn(sample)
    lines = data.draw(finished_lines(sample))
    cols, misses = SPEEDUPS.shape_rows(lines, shape.ops, batch_module._MAX_INT_DIGITS)
    ref_cols, ref_misses = regex_rows(shape, lines)
    not_ascii = {k for k, line in enumerate(lines) if not line.isascii()}  # left to the Python paths
    assert misses == sorted(set(ref_misses) | not_ascii)
    taken = [k for k in range(len(lines)) if k not in ref_misses]
    assert cols == [[col[j] for j, k in enumerate(taken) if k not in not_ascii] for col in ref_cols]


def test_shape_rows_on_crafted_lines():
    sample = SAMPLES[0]
    shape = FinishedShape.learn(sample)
    limit = batch_module._MAX_INT_DIGITS
    variants = [sample, sample.replace('"tpot_s":null', '"tpot_s":1' + "0" * (limit - 1)),
                sample.replace('"tpot_s":null', '"tpot_s":1' + "0" * limit),
                sample.replace('"ttft_s":0.04', '"ttft_s":-0'), sample.replace('"ttft_s":0.04', '"ttft_s":-0.0'),
                sample.replace('"ttft_s":0.04', '"ttft_s":-0e1'), sample.replace('"ttft_s":0.04', '"ttft_s":1' + "0" * 18),
                sample.replace('"ttft_s":0.04', '"ttft_s":1' + "0" * 17), sample.replace('"stop"', '"error"'),
                sample.replace('"stop"', '"errors"'), sample.replace('"llmserve"', '"loadgen"'),
                sample.replace('"r"', '"r\\"'), sample.replace('"m"', '"m\x7f"'), sample.replace('"m"', '"m\x1f"'),
                sample[:-1], sample + "}", sample.replace('["a,b","c",""]', "[]"),
                sample.replace('["a,b","c",""]', '["a",]'), sample.replace('["a,b","c",""]', "[1]")]
    cols, misses = SPEEDUPS.shape_rows(variants, shape.ops, limit)
    assert (cols, misses) == regex_rows(shape, variants)
    assert misses == [2, 3, 6, 8, 10, 11, 13, 14, 15, 17, 18]  # variant 5, -0e1, is the float -0.0 to both
    assert cols[0][0] == "2026-11-29T19:00:01.000Z" and cols[4][0] == '"a,b","c",""' and list(map(repr, cols[3][2:4])) == ["-0.0", "-0.0"]


def test_finished_batch_takes_the_c_path_for_ascii_lines_only():
    shape = FinishedShape.learn(SAMPLES[0])
    lines = [SAMPLES[0], SAMPLES[0].replace("64", "65"), "x"]

    class Counted:  # the extension, counting its calls
        calls = 0

        def shape_rows(self, *args):
            self.calls += 1
            return SPEEDUPS.shape_rows(*args)

    counted = Counted()
    with mock.patch.object(batch_module, "SPEEDUPS", counted):
        fast, fast_misses = batch_module.finished_batch("f", 1, [0, 1, 2], lines, shape, ascii=True)
        assert counted.calls == 1
        slow, slow_misses = batch_module.finished_batch("f", 1, [0, 1, 2], lines, shape)  # not known ASCII
        assert counted.calls == 1
    assert fast_misses == slow_misses == [2] and fast.idx == slow.idx == [0, 1]
    assert (fast.ts, fast.prompt, fast.cached, fast.ttft, fast.raw_fps) == (
        slow.ts, slow.prompt, slow.cached, slow.ttft, slow.raw_fps)
    assert fast.prompt == [64, 65] and fast.raw_fps == ['"a,b","c",""'] * 2


# ---- access_columns: UPSTREAMINFO_BULK.findall -----------------------------------------------------
@settings(max_examples=500, deadline=None)
@given(st.lists(access_line(), min_size=1, max_size=6))
@example(["127.0.0.1 - - [x] \"\" 200 - \"a\" \"b\" 1 .5 [] [] a b - c d"])
@example(["[::1] - - [x] \"\" 200 1234567890123456789 1 1. [] [] a b 1 c"])
@example(["1 - - [x] \"\" 200 1 1 1 [] [] a b 1 c d e"])
@example(["1 - - [x] \"\" 200 1 1 1 [] [] a b 1 c\x1c"])
def test_access_columns_are_the_regex_columns(lines):
    reference = list(zip(*access_rows("\n".join(lines) + "\n"), strict=True))[:5]
    columns = SPEEDUPS.access_columns(lines)
    for k, line in enumerate(lines):
        expected = [col[k] for col in reference] if line.isascii() else [""] * 5  # not ASCII: Python's
        assert [col[k] for col in columns] == expected, line


def test_pure_python_switch_gives_the_same_report(tmp_path):
    """LLMTRIAGE_PURE_PYTHON=1 turns the C checks off (to rule them out); the report does not change."""
    write_logs(tmp_path, 3000, 8, 0.01)
    argv = [sys.executable, "-m", "triage.cli", "diagnose", str(tmp_path), "--format", "json"]
    env = {k: v for k, v in os.environ.items() if k != "LLMTRIAGE_PURE_PYTHON"}
    probe = [sys.executable, "-c", "from triage.parsers.batch import SPEEDUPS; print(SPEEDUPS is None)"]
    runs = {}
    for pure in ("", "1"):
        run_env = dict(env, LLMTRIAGE_PURE_PYTHON=pure) if pure else env
        runs[pure] = subprocess.run(argv, capture_output=True, text=True, env=run_env, timeout=120)
        assert subprocess.run(probe, capture_output=True, text=True, env=run_env).stdout.strip() == str(bool(pure))
    assert runs[""].returncode == runs["1"].returncode == 1
    assert runs[""].stdout == runs["1"].stdout and json.loads(runs[""].stdout)["findings"]
