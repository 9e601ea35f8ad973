"""The bulk paths (batches of request.finished and access lines) against the per-line path: the same
findings, evidence, counts and rule state on logs where the lines that matter hide among boring ones."""

import gzip
import json
import random
import re
import string
from datetime import datetime, timedelta

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from triage import diagnose as diagnose_module
from triage.diagnose import DiagnoseOptions, diagnose
from triage.parsers import FileParser, gateways
from triage.parsers import batch as batch_module
from triage.parsers.batch import UPSTREAMINFO_BULK, FinishedShape, access_rows, finished_batch
from triage.reader import BLOCK_BYTES, Notes, read_blocks
from triage.report import render_json, render_text
from triage.rules import Facts, cache
from triage.timeparse import parse_user_time

T0 = datetime(2026, 11, 29, 19, 0, 0)
ODD = [  # lines the bulk paths must leave to the per-line parser, or that matter on their own
    '{"ts":"2026-11-29T19:00:01.000Z","level":"error","event":"engine.error","logger":"llmserve","model":"m",'
    '"phase":"step","exc_type":"OutOfMemoryError","message":"CUDA out of memory. Tried to allocate 2.00 GiB",'
    '"traceback":"","request_ids":["r1"],"fatal":true}',
    '{"ts":"2026-11-29T19:00:01.000Z","level":"error","event":"request.finished","logger":"llmserve","model":"m",'
    '"request_id":"x","finish_reason":"error","prompt_tokens":5,"cached_tokens":0,"completion_tokens":0,'
    '"queue_s":0.1,"ttft_s":null,"tpot_s":null,"e2e_s":0.1,"prefix_fingerprint":["a","b"],'
    '"error":"OutOfMemoryError: CUDA out of memory"}',
    '{"ts":"2026-11-29T19:00:01.000Z","level":"info","event":"request.finished","logger":"loadgen","request_id":"x",'
    '"finish_reason":"stop","prompt_tokens":5,"cached_tokens":0,"ttft_s":0.5,"prefix_fingerprint":["a","b"]}',
    '{"ts":"2026-11-29T19:00:01.000Z","level":"info","event":"request.finished","request_id":"x","finish_reason":"stop",'
    '"prompt_tokens":5,"cached_tokens":0,"ttft_s":-0,"prefix_fingerprint":[]}',
    '{"ts":"2026-11-29T19:00:01.000Z","level":"info","event":"request.finished","request_id":"x\\"y","finish_reason":'
    '"stop","prompt_tokens":5,"cached_tokens":0,"ttft_s":0.1,"prefix_fingerprint":["a","b","c"]}',
    '{"ts": "2026-11-29T19:00:01.000Z", "level": "info", "event": "request.finished", "prompt_tokens": 5, '
    '"cached_tokens": 0, "ttft_s": 0.1, "prefix_fingerprint": ["a","b","c"]}',
    '{"ts":"2026-11-29T19:00:01.000Z","level":"info","event":"request.finished","prompt_tokens":5,"cached_tokens":0,'
    '"ttft_s":0.1,"prefix_fingerprint":["a","b","c"]} CUDA out of memory',
    '{"ts":"2026-13-29T19:00:01.000Z","level":"info","event":"request.finished","prompt_tokens":5,"cached_tokens":0,'
    '"ttft_s":0.1,"prefix_fingerprint":["a","b","c"]}',
    '{"ts":"2026-11-29T19:00:01.000Z","level":"info","event":"request.finished","prompt_tokens":5,"cached_tokens":0,'
    '"ttft_s":0.1,"prefix_fingerprint":["a","b","c"],"ts":"2026-11-29T23:00:00.000Z"}',
    '{"ts":"2026-11-29T19:00:01.000Z","level":"info","event":"request.scheduled","request_id":"slow","queue_s":2.5}',
    '{"ts":"2026-11-29T19:00:01.000Z","level":"warning","event":"request.preempted","request_id":"p1"}',
    '{"ts":"2026-11-29T19:00:01.000Z","level":"info","event":"request.received","request_id":"q",'
    '"prompt":"2026-11-29 12:00:00 user 1234567 says hi"}',
    '{"ts":"2026-11-29T19:00:01.000Z","level":"info","event":"engine.startup","block_size":128,"prefix_caching":false}',
    '{"ts":"2026-11-29T19:00:01.000Z","level":"info","event":"engine.stats","kv_usage":0.95,"prefix_hit_rate":0.1,'
    '"waiting":40,"running":2,"preemptions":3}',
    "Traceback (most recent call last):",
    '  File "/x/worker.py", line 10, in load_weights',
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB",
    '2026/11/29 19:40:01 [error] 41#41: *1 upstream timed out (110: Connection timed out) while reading response '
    'header from upstream, client: 127.0.0.1, server: _, request: "POST / HTTP/1.1", upstream: "http://127.0.0.1:8000/"',
    '127.0.0.1 - - [29/Nov/2026:19:40:01 +0000] "POST /v1 HTTP/1.1" 200 0 "-" "ua" 412 1.2.3 [e] [] 127.0.0.1:8000 0 1 200 x',
    '::1 - - [29/Nov/2026:19:40:01 +0000] "POST /v1 HTTP/1.1" 200 0 "-" "ua" 412 1.5 [e] [] 127.0.0.1:8000 0 1.5 200 y',
    '10.0.0.9 - - [31/Nov/2026:19:40:01 +0000] "GET / HTTP/1.1" 200 0 "-" "ua" 412 0.5 [e] [] - 0 - - -',
    "", "   ", "torch 2.5.1+cu126", "NVIDIA-SMI 550.54   Driver Version: 550.54   CUDA Version: 12.4",
]


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _engine_line(rng: random.Random, i: int, t: datetime, event_first: bool, widths=(4, 4, 4, 2, 5, 1)) -> str:
    fp = [f"{rng.getrandbits(32):08x}" for _ in range(rng.choice(widths))]
    if rng.random() < 0.3:
        fp = ["shared01", "shared02", *fp[2:]]
    elif rng.random() < 0.3:
        fp = fp[:1] + ["tmpl0001", "tmpl0002", "tmpl0003"][:max(1, len(fp) - 1)]
    event = rng.choice(("request.received", "request.scheduled", "request.first_token", "request.finished",
                        "request.finished", "http.access"))
    fields = {
        "request.finished": {"finish_reason": rng.choice(("stop", "length")), "prompt_tokens": rng.choice((64, 8)),
                             "cached_tokens": rng.choice((0, 16)), "completion_tokens": 32, "queue_s": 0.002,
                             "ttft_s": rng.choice((0.04, 0.5, 2, 0.0)), "tpot_s": rng.choice((0.02, None)),
                             "e2e_s": 0.9, "prefix_fingerprint": fp},
        "request.scheduled": {"queue_s": rng.choice((0.002, 0.002, 1.5, 0.9)), "cached_tokens": 0},
        "request.first_token": {"ttft_s": 0.04},
        "http.access": {"method": "POST", "status": 200},
        "request.received": {"prompt_tokens": 64},
    }[event]
    head = {"ts": _iso(t), "level": "info"}
    rest = {"logger": "llmserve", "model": "m", "request_id": f"chatcmpl-{i}"}
    record = {**head, "event": event, **rest} if event_first else {**head, **rest, "event": event}
    return json.dumps({**record, **fields}, separators=(",", ":"))


def _access_line(rng: random.Random, t: datetime) -> str:
    rt = rng.choice((0.8, 1.04, 1.2, 3.3, 60.0))
    status = rng.choice((200,) * 30 + (499, 504, 429, 502))
    client = rng.choice(("127.0.0.1", "10.0.0.2", "[::1]"))
    upstream = rng.choice(("127.0.0.1:8000", "127.0.0.1:8001", "-"))
    return (f'{client} - - [{t.strftime("%d/%b/%Y:%H:%M:%S +0000")}] "POST /v1/chat/completions HTTP/1.1" '
            f'{status} 2048 "-" "python-requests/2.32.3" 412 {rt:.3f} [llm-engine] [] {upstream} 2048 {rt:.3f} '
            f'{status} {rng.getrandbits(64):016x}')


def write_logs(folder, num: int, seed: int, odd_rate: float, widths=(4, 4, 4, 2, 5, 1)) -> None:
    """Engine lines (two key orders), access lines, both mixed in one file, gzip with CRLF, and odd lines."""
    rng = random.Random(seed)
    engine, access = [], []
    for i in range(num):
        t = T0 + timedelta(milliseconds=37 * i)
        engine.append(_engine_line(rng, i, t, i > num * 0.7 and rng.random() < 0.5, widths))
        access.append(_access_line(rng, t))
        for lines in (engine, access):
            if rng.random() < odd_rate:
                lines.append(rng.choice(ODD))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "engine-0.log").write_text("\n".join(engine) + "\n")
    (folder / "access.log").write_text("\n".join(access) + "\n")
    (folder / "mixed.log").write_text("\n".join(x for pair in zip(engine, access, strict=False) for x in pair) + "\n")
    with gzip.open(folder / "engine-1.log.gz", "wt", newline="") as f:
        f.write("\r\n".join(engine[:num // 2]) + "\r\n")


def _state(value):
    """A rule's state as comparable text: candidates by their evidence and counts, sets sorted."""
    if hasattr(value, "evidence") and hasattr(value, "num_decisive"):
        return repr((value.evidence.to_json(200), value.num_decisive, value.num_corroborating,
                     sorted(value.requests.seen), value.requests.num_anonymous, value.first_ts, value.last_ts,
                     value.counter, value.cause))
    if isinstance(value, dict):
        return repr([(k, _state(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return repr([_state(v) for v in value])
    if isinstance(value, set):
        return repr(sorted(map(repr, value)))
    return repr(value)


def run_both(monkeypatch, paths: list[str], since: str | None = None, until: str | None = None) -> tuple:
    """(bulk, per-line) results: report JSON and text, facts, notes and every rule's state."""
    dispatchers = []
    original = diagnose_module.Dispatcher.__init__

    def keep(self, *args):
        original(self, *args)
        dispatchers.append(self)

    monkeypatch.setattr(diagnose_module.Dispatcher, "__init__", keep)
    out = []
    for batches in (True, False):
        opts = DiagnoseOptions(paths, parse_user_time(since) if since else None,
                               parse_user_time(until) if until else None, batches=batches)
        result = diagnose(opts)
        f = result.facts
        rules = {type(r).__name__: {k: _state(v) for k, v in vars(r).items() if k != "handlers"}
                 for r in dispatchers[-1].rules}
        out.append((render_json(result.findings, "r/"), render_text(
            result.findings, "r/", result.notes.num_files_read, result.notes.num_lines_read),
            (f.first_ts, f.last_ts, f.last_request_ts, f.num_events, f.num_engine_requests, f.num_gateway_requests),
            result.notes.lines, rules))
    return out[0], out[1]


def assert_same(bulk, per_line) -> None:
    assert bulk[0] == per_line[0]
    assert bulk[1:4] == per_line[1:4]
    for rule, state in per_line[4].items():
        for key, value in state.items():
            assert bulk[4][rule][key] == value, (rule, key)


@pytest.mark.parametrize("speedups", [True, False], ids=["with-c", "python-only"])
@pytest.mark.parametrize(("num", "seed", "odd_rate"), [(9000, 1, 0.01), (4000, 2, 0.05), (12000, 3, 0.0005)])
def test_bulk_equals_per_line_on_mixed_logs(tmp_path, monkeypatch, num, seed, odd_rate, speedups):
    if not speedups:  # the bulk paths' Python checks, as where triage/_speedups.c is not built
        monkeypatch.setattr(batch_module, "SPEEDUPS", None)
    write_logs(tmp_path, num, seed, odd_rate)
    assert (tmp_path / "engine-0.log").stat().st_size > 2 * BLOCK_BYTES  # lines across block edges
    bulk, per_line = run_both(monkeypatch, [str(tmp_path)])
    assert json.loads(bulk[0])["findings"]
    assert_same(bulk, per_line)


def test_bulk_equals_per_line_in_a_time_window(tmp_path, monkeypatch):
    write_logs(tmp_path, 6000, 4, 0.01)
    assert_same(*run_both(monkeypatch, [str(tmp_path)], "2026-11-29T19:01:10Z", "2026-11-29T19:02:30Z"))


@pytest.mark.parametrize("widths", [(4,), (3,), (6,), (4, 4, 4, 2, 5, 1)])
def test_bulk_equals_per_line_when_cache_tables_prune(tmp_path, monkeypatch, widths):
    monkeypatch.setattr(cache, "MAX_KEYS", 300)  # prunes every few blocks, shared keys among them
    write_logs(tmp_path, 8000, 5, 0.001, widths)
    assert_same(*run_both(monkeypatch, [str(tmp_path / "engine-0.log")]))


@pytest.mark.parametrize("max_keys", [1000, 301, 20_000])
def test_bulk_equals_per_line_with_unique_prompts(tmp_path, monkeypatch, max_keys):
    """Every fingerprint new (the tables fill with keys seen once and prune), as in the speed bench."""
    rng = random.Random(7)
    lines = []
    for i in range(6000):
        fp = ",".join(f'"{rng.getrandbits(32):08x}"' for _ in range(4))
        lines.append(f'{{"ts":"{_iso(T0 + timedelta(milliseconds=50 * i))}","level":"info","event":"request.finished",'
                     f'"request_id":"r{i}","finish_reason":"stop","prompt_tokens":64,"cached_tokens":0,'
                     f'"ttft_s":0.04,"prefix_fingerprint":[{fp}]}}')
    (tmp_path / "engine.log").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(cache, "MAX_KEYS", max_keys)
    assert_same(*run_both(monkeypatch, [str(tmp_path)]))


def test_the_decisive_line_at_a_block_edge(tmp_path, monkeypatch):
    """One crash line among megabytes of plain requests, at the first line of a block and inside one."""
    rng = random.Random(6)
    lines = [_engine_line(rng, i, T0 + timedelta(milliseconds=50 * i), False) for i in range(7000)]
    path = tmp_path / "engine.log"
    path.write_text("\n".join(lines) + "\n")
    firsts = [first for first, _ in read_blocks(path, Notes())]
    assert len(firsts) >= 3
    lines.insert(firsts[2], ODD[0].replace("r1", "r2"))  # inside: the first line of the third block
    lines.insert(firsts[1] - 1, ODD[0])  # the last line of the first block
    path.write_text("\n".join(lines) + "\n")
    bulk, per_line = run_both(monkeypatch, [str(tmp_path / "engine.log")])
    assert_same(bulk, per_line)
    assert json.loads(bulk[0])["findings"][0]["id"] == "oom-runtime"


def test_finished_shape_takes_only_lines_json_reads_the_same():
    good = ('{"ts":"2026-11-29T19:00:01.000Z","level":"info","event":"request.finished","logger":"llmserve",'
            '"model":"m","request_id":"r","finish_reason":"stop","prompt_tokens":64,"cached_tokens":16,'
            '"completion_tokens":32,"queue_s":0.002,"ttft_s":0.04,"tpot_s":null,"e2e_s":0.9,'
            '"prefix_fingerprint":["a,b","c",""]}')
    shape = FinishedShape.learn(good)
    assert shape is not None
    variants = [good, good.replace('"tpot_s":null', '"tpot_s":0.1'), good.replace('"ttft_s":0.04', '"ttft_s":3'),
                good.replace('"ttft_s":0.04', '"ttft_s":-0'), good.replace('"ttft_s":0.04', '"ttft_s":-0.0'),
                good.replace('"stop"', '"error"'), good.replace('"llmserve"', '"loadgen"'),
                good.replace('"r"', '"r\\u0041"'), good.replace('["a,b","c",""]', "[]"),
                good.replace('"prompt_tokens":64', '"prompt_tokens":064'), good.replace(":64,", ": 64,"),
                good.replace('"m"', '"m\t"'), good.replace("19:00:01", "25:00:01"), good + " ",
                good.replace('"cached_tokens":16', '"cached_tokens":1' + "0" * 30)]
    batch, misses = finished_batch("f", 1, list(range(len(variants))), variants, shape)
    taken = [k for k in range(len(variants)) if k not in misses]
    assert taken == [0, 1, 2, 4, 8, 12]  # an impossible hour is still text JSON reads: its time is None
    for k, line in zip(taken, batch.lines, strict=True):
        obj = json.loads(line)
        j = taken.index(k)
        assert (batch.ts[j], batch.prompt[j], batch.cached[j], batch.fps[j]) == (
            obj["ts"], obj["prompt_tokens"], obj["cached_tokens"], obj["prefix_fingerprint"])
        assert batch.ttft[j] == float(obj["ttft_s"]) and str(batch.ttft[j]) == str(float(obj["ttft_s"]))
        assert batch.event(j).fields == obj
    hour_25 = datetime(2026, 11, 29, 19, 0, 1)  # sorts last but does not parse: the range skips it
    assert batch.time_range() == (hour_25, hour_25) and batch.times()[-1] is None


ACCESS_SEED = ('127.0.0.1 - - [29/Nov/2026:19:40:01 +0000] "POST /v1/chat/completions HTTP/1.1" 200 2048 "-" '
               '"python-requests/2.32.3" 412 0.912 [llm-engine] [] 127.0.0.1:8000 2048 0.911 200 0123abcd')


@st.composite
def access_line(draw):
    line = ACCESS_SEED
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(line)))
        junk = draw(st.sampled_from([" ", "-", ".", "..", "1", '"', "[", "]", "\t", "é", "٣", "x y"])
                    | st.text(alphabet=string.printable.replace("\n", ""), max_size=4))
        line = line[:at] + junk + line[at + draw(st.integers(0, 3)):]
    return line.replace("\n", "")


@settings(max_examples=400, deadline=None)
@given(st.lists(access_line(), min_size=1, max_size=6))
def test_access_bulk_rows_are_the_fast_paths_events(lines):
    rows = access_rows("\n".join(lines) + "\n")
    assert len(rows) == len(lines)
    for line, row in zip(lines, rows, strict=True):
        if not row[2]:
            continue
        events = FileParser("a.log").parse(10, line)  # past the first lines: the upstreaminfo fast path
        assert len(events) == 1 and events[0].kind == "http.access", line
        f = events[0].fields
        m = gateways.NGINX_UPSTREAMINFO.match(line)
        assert (m["client"], m["time"], int(row[2]), float(row[3]), m["addr"]) == (
            row[0], row[1], f["status"], f["duration_s"], row[4])
        assert UPSTREAMINFO_BULK.pattern.count("(") - UPSTREAMINFO_BULK.pattern.count("(?") == 6


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="-+.0123456789eEnul", max_size=12))
def test_number_patterns_match_what_optional_groups_matched(text):
    """_NUM and _FLOAT write an optional part as (?:X|): they accept and split exactly as (?:X)? did."""
    from triage.parsers import batch as batch_module
    for pattern in (batch_module._NUM, batch_module._FLOAT):
        reference = pattern.replace("|)", ")?")
        for rx in (pattern, f"({pattern})(.*)"):
            ref = rx.replace(pattern, reference)
            a, b = re.fullmatch(rx, text), re.fullmatch(ref, text)
            assert (a and a.groups()) == (b and b.groups()), (pattern, text)
        assert [m.span() for m in re.finditer(pattern, text)] == [m.span() for m in re.finditer(reference, text)]


@settings(max_examples=200, deadline=None)
@given(st.integers(8, 61), st.integers(1, 5), st.lists(st.integers(1, 40), min_size=1, max_size=12),
       st.sampled_from([4, 64, 10_000]), st.randoms(use_true_random=False))
@example(20, 1, [3] * 12, 10_000, random.Random(0))  # the first prune keeps part of the pending keys
@example(31, 2, [2, 5, 1, 7, 3, 3, 9, 2], 10_000, random.Random(1))
@example(40, 3, [40] * 6, 64, random.Random(2))
def test_cache_rule_batches_equal_events_across_prunes(max_keys, width, sizes, alphabet, rng):
    """CacheRule fed FinishedBatches (pending keys, one-step prunes) ends in the state events give it."""
    from triage.parsers.batch import FinishedBatch
    from triage.rules.cache import CacheRule
    original = cache.MAX_KEYS
    cache.MAX_KEYS = max_keys
    try:
        bulk, per_line = CacheRule(), CacheRule()
        lineno = 0
        for size in sizes:
            lines = []
            for _ in range(size):
                fp = [f"{rng.randrange(alphabet):x}" for _ in range(width + 1)]
                lines.append(json.dumps({"ts": "2026-11-29T19:00:01.000Z", "event": "request.finished",
                                         "prompt_tokens": 64, "cached_tokens": 0, "ttft_s": 0.1,
                                         "prefix_fingerprint": fp}, separators=(",", ":")))
            raw = [line[line.index("[") + 1:line.index("]")] for line in lines]
            batch = FinishedBatch("f", lineno + 1, list(range(size)), lines, ["2026-11-29T19:00:01.000Z"] * size,
                                  [64] * size, [0] * size, [0.1] * size, raw)
            bulk.observe_batch(batch)
            for k in range(size):
                per_line.observe(batch.event(k))
            lineno += size
        findings = render_json(bulk.findings(Facts()), "r/")  # the findings settle the pending keys
        assert findings == render_json(per_line.findings(Facts()), "r/")
        for key, value in vars(per_line).items():
            assert _state(getattr(bulk, key)) == _state(value), key
    finally:
        cache.MAX_KEYS = original


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["0", "64", "1024", "-3", "0.5", "1e3", "2.50"]), max_size=40))
def test_converted_is_map(texts):
    from triage.parsers.batch import converted
    assert converted(float, texts) == list(map(float, texts))
    ints = [t for t in texts if t.lstrip("-").isdigit()]
    assert converted(int, ints) == list(map(int, ints))
    assert [type(v) for v in converted(int, ints)] == [int] * len(ints)
