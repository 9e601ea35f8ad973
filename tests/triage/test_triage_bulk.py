"""Routine lines read in bulk (triage.parsers.bulk) give the diagnosis that reading them line by line
gives: the same findings, evidence, counts and time span, on logs of every bulk form with rare lines
(504s, 499s, 429s, preemption, an OOM, a deep queue, prompts with times in them) among them."""

import json
import random
from datetime import UTC, datetime, timedelta

import pytest

import triage.diagnose as diagnose_module
from triage.diagnose import DiagnoseOptions, Dispatcher, diagnose
from triage.parsers import bulk, finished, words
from triage.report import render_json
from triage.rules import all_rules
from triage.rules.cache import Recent

T0 = datetime(2026, 11, 29, 19, 0, 0, tzinfo=UTC)
LINES = 6000  # a few blocks of 256 KB
BULK_KINDS = diagnose_module.BULK_KINDS


def _clf(t):
    return t.strftime("%d/%b/%Y:%H:%M:%S +0000")


def _iso(t):
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _upstreaminfo(rng, i, t):
    status = 504 if i % 997 == 500 else 499 if i % 1231 == 7 else 429 if i % 1500 == 3 else 200
    rt = 60.0 if status == 504 else 0.5 + rng.random()
    addr = f"10.0.3.{1 + (i // 2000) % 3}:8000"
    return (f'10.0.0.{i % 5} - - [{_clf(t)}] "POST /v1/chat/completions HTTP/1.1" {status} 2048 "-" "ua/1" 412 '
            f"{rt:.3f} [llm-engine] [] {addr} 2048 {rt - 0.001:.3f} {status} {rng.getrandbits(64):016x}")


def _nginx_kv(rng, i, t):
    status = 504 if 3000 <= i < 3020 else 200
    rt = 60.001 if status == 504 else 0.8 + rng.random() * 0.4
    return (f'10.0.0.7 - - [{_clf(t)}] "POST /v1/chat/completions HTTP/1.1" {status} 900 "-" "OpenAI/Python 1.51.0" '
            f"rt={rt:.3f} uct=0.000 urt={rt - 0.001:.3f}")


def _vllm(rng, i, t):
    head = f"(APIServer pid=1) INFO {t.strftime('%m-%d %H:%M:%S')} [logger.py:43]"
    if i % 3 == 0:
        when = f"Today is {t.strftime('%Y-%m-%d %H:%M:%S')}. " if i > 4000 else ""
        prompt = f"{when}You are a support assistant. Question {i % 7}: where is my order?"
        if i == 2501:
            prompt = "Loading weights of my thoughts"  # a phase word in a prompt: the prompt's
        if i == 5997:  # a stats line's words in a prompt: the per-line reading's own way
            prompt = "Why is #running-req: 3 below Avg prompt throughput: 9?"
        return (f"{head} Received request chatcmpl-{i:08x}: prompt: '{prompt}', params: SamplingParams(n=1, "
                f"temperature=0.7), prompt_token_ids: None, lora_request: None.")
    if i % 3 == 1:
        status = "503 Service Unavailable" if i % 1000 == 1 else "200 OK"
        return f'(APIServer pid=1) INFO:     127.0.0.1:{40000 + i} - "POST /v1/chat/completions HTTP/1.1" {status}'
    if i % 200 == 2:
        return (f"{head.replace('logger.py:43', 'loggers.py:123')} Engine 000: Avg prompt throughput: 900.0 tokens/s, "
                f"Avg generation throughput: 400.0 tokens/s, Running: 8 reqs, Waiting: {12 if i > 5000 else 0} reqs, "
                f"GPU KV cache usage: {95.0 if i > 5000 else 30.0}%, Prefix cache hit rate: 50.0%")
    if i == 5555:
        return f"(EngineCore_0 pid=2) ERROR {t.strftime('%m-%d %H:%M:%S')} [core.py:700] torch.OutOfMemoryError: CUDA out of memory."
    return f'(APIServer pid=1) INFO:     127.0.0.1:{40000 + i} - "GET /metrics HTTP/1.1" 200 OK'


def _vllm_keywords(rng, i, t):
    """Catalog keywords in logged prompts (their reading never looks for one: the runs stay in bulk) and in
    two stats lines (their reading makes an event of it: those runs are read line by line)."""
    line = _vllm(rng, i, t)
    if i % 3 == 0 and i % 7 == 3:
        return line.replace("where is my order?", "my job printed CUDA error: out of memory, why?")
    if i in (3602, 4802):  # (stats lines)
        return line + (", CUDA error: out of memory" if i == 3602 else ", Decode out of memory")
    return line


def _vllm_family(rng, i, t):
    """Once a block was one run of vLLM's forms alone, the file's runs are of those forms alone and its
    access lines are the lines the others leave: logged prompts that hold an access line's words, a
    prompt with a stats line's words, and later lines of another program's form (an nginx access line)."""
    line = _vllm(rng, i, t)
    if i > 2000 and i % 3 == 0 and i % 11 == 5:
        return line.replace("where is my order?", 'INFO:     127.0.0.1:1 - "GET / HTTP/1.1" 200 OK')
    if i == 3003:
        return line.replace("where is my order?", "why does Engine 000: Avg prompt throughput: 900.0 tokens/s, Avg "
                            "generation throughput: 400.0 tokens/s, Running: 8 reqs, Waiting: 0 reqs, GPU KV cache "
                            "usage: 30.0%, Prefix cache hit rate: 50.0% mean?")
    if i > 4000 and i % 50 == 7:
        return _nginx_kv(rng, i, t)
    if i == 4802:  # a stats line the per-line reading takes for an access line (a request line and status in it)
        return line + ', last: "GET /metrics HTTP/1.1" 200'
    if i in (2202, 2402):  # stats lines with a start-up phase word, a CUDA build tag: their reading makes an event of each
        return line + (", Capturing CUDA graph" if i == 2202 else ", torch 2.7.0+cu126")
    return line


def _vllm_v0(rng, i, t):
    """vLLM 0.6's stats line (metrics.py, Swapped and Pending, no hit rate), a deep queue and a swap later."""
    if i % 40 == 2:
        head = f"(APIServer pid=1) INFO {t.strftime('%m-%d %H:%M:%S')} [metrics.py:540]"
        return (f"{head} Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 72.7 tokens/s, Running: 32 "
                f"reqs, Swapped: {3 if 5200 < i < 5300 else 0} reqs, Pending: {40 if i > 4000 else 0} reqs, GPU KV "
                f"cache usage: {99.1 if i > 4000 else 38.5}%, CPU KV cache usage: 0.0%.")
    return _vllm(rng, i, t) if i % 40 != 22 else _vllm(rng, i - 20, t)


def _vllm_stats_only(rng, i, t):
    """vLLM V1 without request logging: its stats lines alone tell the cache hit rate, which falls while
    the KV cache has room."""
    if i % 20 == 1:
        rate = 61.5 if i < 3000 else 4.0 if i > 3600 else 30.0
        if i == 1101:
            rate = 72.5  # the peak
        return (f"(APIServer pid=1) INFO {t.strftime('%m-%d %H:%M:%S')} [loggers.py:123] Engine 000: Avg prompt "
                f"throughput: 900.0 tokens/s, Avg generation throughput: 400.0 tokens/s, Running: 8 reqs, Waiting: 0 "
                f"reqs, GPU KV cache usage: 40.0%, Prefix cache hit rate: {rate}%")
    return f'(APIServer pid=1) INFO:     127.0.0.1:{40000 + i} - "POST /v1/chat/completions HTTP/1.1" 200 OK'


def _sglang(rng, i, t):
    stamp = f"[{t.strftime('%Y-%m-%d %H:%M:%S')}]"
    queue = 40 if 4000 <= i < 4100 else 0
    usage = 0.95 if i > 4500 else 0.3
    if i % 3 == 0:
        return (f"{stamp} Prefill batch, #new-seq: 1, #new-token: {rng.randint(20, 400)}, #cached-token: 10, "
                f"token usage: {usage:.2f}, #running-req: 8, #queue-req: {queue}, ")
    if i % 3 == 1:
        return f'{stamp} INFO:     127.0.0.1:{40000 + i} - "POST /v1/chat/completions HTTP/1.1" 200 OK'
    if i == 4502:
        return f"{stamp} KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.5000 -> 0.8000"
    if i == 3335:  # a batch line without "#running-req": no stats line to the per-line reading
        return f"{stamp} Decode batch, #token: 4000, token usage: {usage:.2f}, cuda graph: True, #queue-req: 50, "
    return (f"{stamp} Decode batch, #running-req: 8, #token: 4000, token usage: {usage:.2f}, cuda graph: True, "
            f"gen throughput (token/s): 450.00, #queue-req: {queue}, ")


def _envoy(rng, i, t, mixed=True):
    flags, code = ("UT", 504) if i % 800 == 400 else ("DC", 0) if i % 1300 == 9 else ("-", 200)
    row = {"start_time": _iso(t), "method": "POST", "path": "/v1/chat/completions", "protocol": "HTTP/1.1",
           "response_code": code, "response_flags": flags, "bytes_received": 400, "bytes_sent": 2000,
           "duration": 60000 if flags == "UT" else rng.randint(800, 1200), "x_forwarded_for": f"10.0.0.{i % 4}",
           "request_id": f"{rng.getrandbits(64):016x}", "upstream_host": f"10.0.3.{1 + (i // 2500)}:30000"}
    if mixed and i % 2:
        row = dict(reversed(list(row.items())))  # the flags before the code
    line = json.dumps(row, separators=(",", ":"))
    if mixed and i == 4402:  # a served request's code, then a 504 under the same key: JSON takes the last
        return line.replace('"bytes_sent":2000', '"bytes_sent":2000,"response_code":504')
    if i == 2222:  # a value of another type than the first line's (a string where it has a number)
        return line.replace('"duration":', '"duration":"').replace(',"x_forwarded_for"', '","x_forwarded_for"', 1)
    return line


def _engine(rng, i, t):
    head = f'{{"ts":"{_iso(t)}","level":"info","logger":"llmserve","model":"builtin","request_id":"chatcmpl-{i:06d}",'
    kind = i % 4
    if kind == 0:
        return head + '"event":"request.received","prompt_tokens":64,"max_tokens":32,"stream":true}'
    if kind == 1:
        return head + f'"event":"request.scheduled","queue_s":{2.5 if 3000 < i < 3400 else 0.002},"cached_tokens":0}}'
    if kind == 2:
        return head + f'"event":"request.first_token","ttft_s":0.0{rng.randint(20, 60)}}}'
    reason = "error" if i % 1001 == 3 else "stop"
    error = ',"error":"CUDA out of memory"' if reason == "error" else ""
    # the first block changes per request after request 2000, the later ones are shared: a dynamic prefix
    blocks = [f"{rng.getrandbits(32):08x}" if i > 2000 else "00000001", "00000002", "00000003", "00000004"]
    fp = ",".join(f'"{b}"' for b in blocks)
    prompt = 8 if i % 500 == 7 else 64
    return head + (f'"event":"request.finished","finish_reason":"{reason}"{error},"prompt_tokens":{prompt},'
                   f'"cached_tokens":{16 if i < 2000 else 0},"completion_tokens":32,"queue_s":0.002,'
                   f'"ttft_s":0.0{rng.randint(20, 60)},"e2e_s":0.9,"prefix_fingerprint":[{fp}]}}')


# request.finished lines the typed decoding (finished.FinishedRow) reads otherwise than the usual (a field
# absent or null, an integer TTFT, a key twice or escaped), and those it refuses (another type where it
# takes one, an integer past 64 bits: the run is decoded by orjson)
_ODD_TYPED = (
    ('"ttft_s":0.0', '"ttft_s":1'), ('"ttft_s":0.0', '"ttft_s":null,"x":0.0'), ('"ttft_s":0.0', '"x":0.0'),
    ('"ttft_s":0.0', '"\\u0074tft_s":0.0'), ('"prefix_fingerprint":[', '"prefix_fingerprint":null,"x":['),
    ('"prefix_fingerprint":[', '"x":['),
    ('"prompt_tokens":', '"prompt_tokens":300,"prompt_tokens":'), ('"logger":"llmserve"', '"logger":null'),
    ('"finish_reason":"stop"', '"finish_reason":null'),
)
_ODD_REFUSED = (
    ('"prompt_tokens":', '"prompt_tokens":123456789012345678901234567890,"x":'),  # (orjson: a float)
    ('"ttft_s":0.0', '"ttft_s":true,"x":0.0'), ('"prefix_fingerprint":["', '"prefix_fingerprint":[7,"'),
    ('"cached_tokens":', '"cached_tokens":true,"x":'), ('"cached_tokens":', '"cached_tokens":0.0,"x":'),
    ('"logger":"llmserve"', '"logger":7'), ('{"ts":', '{"x":'), ('"ts":"', '"ts":7,"x":"'),
    ('"finish_reason":"stop"', '"finish_reason":["error"]'),
)
# what the quick look at a line misses and its decoding does not: a failed request, the client's own log
_ODD_FAILED = (('"finish_reason":"stop"', '"finish_reason":"\\u0065rror"'),
               ('"logger":"llmserve"', '"logger":"\\u006coadgen"'))

# (request.finished lines, each in a run of its own, between which runs are decoded typed: the runs end
# at 256 KB blocks, a failed request and the slow scheduled lines)
_ODD_AT = {2603: _ODD_FAILED[0], 3603: _ODD_REFUSED[0], 4803: _ODD_FAILED[1]}


def _engine_odd(rng, i, t):
    line = _engine(rng, i, t)
    if '"request.finished"' not in line:
        return line
    if i < LINES // 4:
        odd = rng.choice(_ODD_TYPED + _ODD_REFUSED + _ODD_FAILED) if rng.random() < 0.1 else None
    elif i in _ODD_AT:  # (the later blocks decoded typed, but for a few runs)
        odd = _ODD_AT[i]
    else:
        odd = rng.choice(_ODD_TYPED) if rng.random() < 0.1 else None
    return line if odd is None else line.replace(*odd, 1)


# Lines the reading of a block by where the finished event's literal lies (BlockReader._finished_block) must give back
# to the general reading: the literal twice in a line, another event key first, no JSON object, a failed
# request, the client's own log; each in a block of its own among blocks read whole
_FAST_ODD = {
    1403: ('"event":"request.finished",', '"event":"request.finished","of":{"event":"request.finished"},'),
    2603: ('"level":"info",', '"level":"info","event":"request.first_token","x":1,'),
    3803: ('{"ts":', 'I1129 {"ts":'),
    5003: ('"finish_reason":"stop"', '"finish_reason":"error","error":"CUDA out of memory"'),
    6203: ('"logger":"llmserve"', '"logger":"loadgen"'),
}


def _engine_blocks(rng, i, t):
    """Blocks of routine lines (a request.finished line of each request), the odd lines of _FAST_ODD among them."""
    line = _engine(rng, i, t).replace('"queue_s":2.5,', '"queue_s":0.002,')  # (_engine's rare lines made routine)
    line = line.replace('"finish_reason":"error","error":"CUDA out of memory"', '"finish_reason":"stop"')
    return line.replace(*_FAST_ODD[i], 1) if i in _FAST_ODD else line


FORMS = {"engine": (_engine, "engine-0.log"), "engine-odd": (_engine_odd, "engine-0.log"),
         "engine-blocks": (_engine_blocks, "engine-0.log"), "upstreaminfo": (_upstreaminfo, "access.log"), "nginx-kv": (_nginx_kv, "access.log"),
         "vllm": (_vllm, "vllm.log"), "vllm-keywords": (_vllm_keywords, "vllm.log"),
         "vllm-family": (_vllm_family, "vllm.log"), "vllm-v0": (_vllm_v0, "vllm.log"), "vllm-stats-only": (_vllm_stats_only, "vllm.log"),
         "sglang": (_sglang, "sglang.log"), "envoy": (_envoy, "envoy.log"),
         "envoy-one-order": (lambda rng, i, t: _envoy(rng, i, t, mixed=False), "envoy.log"),
         "envoy-offset": (lambda rng, i, t: _envoy(rng, i, t, mixed=False).replace('Z"', '+01:00"'), "envoy.log")}


def _write(folder, name):
    make, file = FORMS[name]
    rng = random.Random(7)
    lines = [make(rng, i, T0 + timedelta(milliseconds=50 * i)) for i in range(LINES if name != "engine-blocks" else 10_000)]
    while sum(map(len, lines)) < 600_000:
        lines += lines[-LINES:]
    (folder / file).write_text("\n".join(lines) + "\n")


row_types: set[str] = set()  # the kinds of request.finished rows read in bulk (finished.FinishedRow, dict)


def _run(folder, monkeypatch, bulk_on: bool):
    monkeypatch.setattr(diagnose_module, "BULK_KINDS", BULK_KINDS if bulk_on else frozenset())
    totals, dispatchers = [], []
    feed = Dispatcher.feed

    def counting(self, ev):
        dispatchers[:] = [self]
        if ev.kind.endswith(bulk.TOTALS):
            totals.append(ev.fields["count"])
            if ev.kind == "request.finished.totals":
                row_types.add(type(ev.fields["rows"][0]).__name__)
        feed(self, ev)

    monkeypatch.setattr(Dispatcher, "feed", counting)
    d = diagnose(DiagnoseOptions([str(folder)]))
    f = d.facts
    facts = (f.first_ts, f.last_ts, f.last_request_ts, f.num_events, f.sources, f.num_requests, f.num_http_errors,
             f.num_error_lines)
    states = [{k: v for k, v in map(_state, vars(rule).items()) if _plain(v)} for rule in dispatchers[0].rules]
    return json.loads(render_json(d.findings)), (facts, states), sum(totals)


def _state(item: tuple) -> tuple:
    """A rule's attribute as compared: a bounded table (cache.Recent) by its generations."""
    key, value = item
    return (key, vars(value)) if isinstance(value, Recent) else item


def _plain(value) -> bool:
    """Numbers, strings and containers of them (a rule's counts, samples and tables; not its events)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, dict):
        return all(map(_plain, value)) and all(map(_plain, value.values()))
    return isinstance(value, (list, tuple, set, frozenset)) and all(map(_plain, value))


@pytest.mark.parametrize("name", sorted(FORMS))
def test_bulk_reading_gives_the_line_by_line_diagnosis(tmp_path, monkeypatch, name):
    row_types.clear()
    _write(tmp_path, name)
    by_line, facts_by_line, none = _run(tmp_path, monkeypatch, False)
    in_bulk, facts_in_bulk, num_bulk = _run(tmp_path, monkeypatch, True)
    assert none == 0
    # nearly every line a rule reads was read in bulk
    assert num_bulk > {"engine": 0.8, "engine-odd": 0.2, "vllm-keywords": 0.4, "vllm-family": 0.6}.get(name, 0.9) * facts_in_bulk[0][3]
    assert in_bulk == by_line
    assert facts_in_bulk == facts_by_line
    assert by_line["findings"]  # the rare lines were found either way
    if name.startswith("engine"):  # runs with an odd line are decoded by orjson, the others typed
        assert row_types == ({"FinishedRow", "dict"} if name == "engine-odd" else {"FinishedRow"})


def test_blocks_of_routine_finished_lines_are_read_whole(tmp_path, monkeypatch):
    """A block whose request.finished lines are all routine and whose other lines hold no keyword is one
    totals event; a block with an odd line (_FAST_ODD) is read the general way (the diagnosis is the same:
    test_bulk_reading_gives_the_line_by_line_diagnosis)."""
    import triage.parsers.blocks as blocks_module
    whole = blocks_module.BlockReader._finished_block
    taken: dict[range, bool] = {}

    def recording(self, first, block, raw):
        out = whole(self, first, block, raw)
        taken[range(first + 1, first + block.count("\n") + 1)] = out is not None
        return out

    monkeypatch.setattr(blocks_module.BlockReader, "_finished_block", recording)
    _write(tmp_path, "engine-blocks")
    _run(tmp_path, monkeypatch, True)
    odd = {lines: any(i + 1 in lines for i in _FAST_ODD) for lines in taken}
    assert sum(odd.values()) == len(_FAST_ODD)  # (each in a block of its own)
    assert {lines: not is_odd for lines, is_odd in odd.items()} == taken
    assert sum(taken.values()) >= 3


def test_a_rule_without_totals_gets_every_line(tmp_path):
    """A kind is read in bulk only when every rule that reads it reads its totals too."""
    from triage.rules import Need, Rule

    class Lines(Rule):
        needs = (Need("http.access"),)

        def handlers(self):
            return {"http.access": lambda ev: None}

        def findings(self, facts):
            return []

    assert Dispatcher(all_rules(), None, None).wanted.bulk_forms
    assert "upstreaminfo" not in Dispatcher([*all_rules(), Lines()], None, None).wanted.bulk_forms
    assert not Dispatcher(all_rules(), T0.replace(tzinfo=None), None).wanted.bulk_forms  # --since: by line


def test_finished_lines_found_by_literal_are_the_lines_the_scanner_finds(monkeypatch):
    """_scan takes this engine's request.finished lines by a literal search and scans the rest: the same
    (line number, line) pairs, in the same order, as one scan of the whole block."""
    from triage.parsers import FileParser
    wanted = Dispatcher(all_rules(), None, None).wanted
    assert wanted.finished_literal
    rng = random.Random(3)
    lines = [_engine(rng, i, T0 + timedelta(milliseconds=50 * i)) for i in range(400)]
    lines[5] = "2026-11-29 19:00:01 ERROR torch.OutOfMemoryError: CUDA out of memory."  # a keyword line
    lines[6] = lines[7] = lines[3]  # finished lines in a row
    lines[40] = lines[40].replace('"event":"request.received"', '"event":"request.received","prompt":"hi"')
    lines[41] = '{"event":"request.finished","msg":"EngineDeadError"}'  # finished, with a catalog keyword
    block = "\n".join(lines) + "\n"
    scanned = {}
    for fast in (True, False):
        monkeypatch.setattr(wanted, "finished_literal", fast)
        parser = FileParser("engine-0.log", wanted)
        scanned[fast] = [parser.candidates(100, block), parser.candidates(100, block[block.find("\n") + 1:])]
    assert scanned[True] == scanned[False]
    numbers = [n for n, _ in scanned[True][0]]
    assert {106, 107, 108, 141, 142} <= set(numbers) and 101 not in numbers and numbers == sorted(numbers)


def test_blocks_without_runs_are_read_line_by_line_for_a_while(tmp_path, monkeypatch):
    """A file whose blocks have no routine lines (this engine's JSON log) is not searched for runs for a
    few blocks: routine lines that come then are read line by line, with the same diagnosis, and those
    after them in bulk again."""
    import triage.parsers.blocks as blocks_module
    # (blocks of request.finished lines that are all routine are one totals event, never searched for runs:
    # here they go the general way, as a block with a failed request or a keyword does)
    monkeypatch.setattr(blocks_module.BlockReader, "_finished_block", lambda *args: None)
    rng = random.Random(5)
    engine = [_engine(rng, i, T0 + timedelta(milliseconds=50 * i)) for i in range(4000)]  # 3 blocks or so
    access = [_upstreaminfo(rng, i, T0 + timedelta(milliseconds=50 * i)) for i in range(12000)]  # 8 or so
    (tmp_path / "mixed.log").write_text("\n".join(engine + access) + "\n")
    by_line, facts_by_line, _ = _run(tmp_path, monkeypatch, False)
    monkeypatch.setattr(blocks_module, "RUNLESS_SKIP", 3)
    in_bulk, facts_in_bulk, num_bulk = _run(tmp_path, monkeypatch, True)
    monkeypatch.setattr(blocks_module, "RUNLESS_BLOCKS", 1000)  # never skipped
    _, _, num_never_skipped = _run(tmp_path, monkeypatch, True)
    assert in_bulk == by_line
    assert facts_in_bulk == facts_by_line
    assert 0 < num_bulk < num_never_skipped  # some access lines read one by one, the later ones in bulk


def test_stop_words_found_alike_with_and_without_hyperscan(monkeypatch):
    """words.Words finds a stop word in raw[start:end] (None), else where the counted words start, by
    Hyperscan where it is installed, by RE2 and bytes.find otherwise: the same answer for words at the edges of the
    range, just outside it, for counted words before and after a stop word, and for no word at all."""
    stops, counted = ["Loading weights", "#running-req", "haproxy[", "\x1b"], ("Avg prompt throughput",)
    text = (b"xx Loading weights yy #running-req zz haproxy[ \x1b end Avg prompt throughput, Avg prompt "
            b"throughputAvg prompt throughput.")
    cut = text.index(b"end")
    ranges = [(0, len(text)), (3, 18), (4, 18), (3, 17), (19, 34), (23, 35), (37, 46), (47, 48), (46, 47), (0, 0),
              (48, 55), (cut, len(text)), (cut, len(text) - 2), (cut + 5, len(text)), (cut - 3, len(text))]
    with_hs = words.Words(stops, counted)
    with_hs.search(text, 0, 0)  # (compiled at the first search)
    monkeypatch.setattr(words, "hyperscan", None)
    without = words.Words(stops, counted)
    found = [[w.search(text, a, b) for a, b in ranges] for w in (with_hs, without)]
    assert with_hs.db is not None and without.re is not None and without.db is None
    word = counted[0].encode()
    starts = [k for k in range(len(text)) if text.startswith(word, k)]
    expected = [None if any(w.encode() in text[a:b] for w in stops) else [k for k in starts if a <= k <= b - len(word)]
                for a, b in ranges]
    assert found[0] == found[1] == expected
    assert expected.count(None) == 6 and list(map(len, expected[-4:-1])) == [3, 2, 2] and expected[-1] is None
    assert words.Words([]).search(text, 0, len(text)) == [] and words.Words(["", "q"]).search(text, 0, 1) is None
    assert words.Words([], counted).search(text, 0, len(text)) == starts


def test_bulk_reading_without_hyperscan_gives_the_line_by_line_diagnosis(tmp_path, monkeypatch):
    """Without Hyperscan (RE2 finds the stop words) the diagnosis is the same."""
    _write(tmp_path, "vllm")
    by_line = _run(tmp_path, monkeypatch, False)
    monkeypatch.setattr(words, "hyperscan", None)
    in_bulk = _run(tmp_path, monkeypatch, True)
    assert in_bulk[:2] == by_line[:2] and in_bulk[2] > 0


@pytest.mark.parametrize("name", sorted(FORMS))
def test_each_block_is_counted_once_and_right(tmp_path, monkeypatch, name):
    """The reader takes a block's number of lines from the parser that counted them as it read the block
    (FileParser.lines_in): the count newlines give, for every block of every bulk form, and counted
    there rather than again for most of them."""
    from triage.parsers import FileParser
    _write(tmp_path, name)
    lines_in = FileParser.lines_in
    seen = []

    def checked(self, block):
        known = self.counted[0] is block or (self.block is block and self.span[0] > 0 and self.span[1] is not None)
        seen.append((lines_in(self, block), block.count("\n"), known))
        return seen[-1][0]

    monkeypatch.setattr(FileParser, "lines_in", checked)
    monkeypatch.setattr("triage.reader.PASTE_BYTES", 0)  # (a file under it is read whole, its lines counted then)
    _run(tmp_path, monkeypatch, True)
    assert len(seen) > 2 and all(mine == right for mine, right, _ in seen)
    assert sum(known for _, _, known in seen) >= len(seen) - 1


def test_durations_are_read_once_per_distinct_value_and_added_up():
    """bulk._seconds: a Counter of durations as written -> seconds; two spellings of one number add up,
    "-", "null" and nothing count for none, and one that is no number gives None (read line by line)."""
    from collections import Counter
    assert bulk._seconds(Counter({"0.912": 3, "1.5": 1})) == Counter({0.912: 3, 1.5: 1})
    assert bulk._seconds(Counter({"1.0": 2, "1": 5, "-": 4})) == Counter({1.0: 7})
    assert bulk._seconds(Counter({'"900"': 2, "1200": 1, '"-"': 3, "null": 1, '""': 2}), strip='"', scale=1000) \
        == Counter({0.9: 2, 1.2: 1})
    assert bulk._seconds(Counter({"0.5": 1, "1.2.3": 1})) is None
    assert bulk._seconds(Counter()) == Counter()
    assert bulk._seconds(Counter({"-": 2, "0.5": 1})) == Counter({0.5: 1})  # (no None among the keys)
    assert bulk._seconds(Counter({"0.912": 1, "2": 1})) == Counter({0.912: 1, 2.0: 1})  # (read before: the same)


def test_first_rows_of_few_and_of_many_distinct_values():
    """bulk._first_rows: each distinct value's first row, in the order they first appear, whether a run
    has a few distinct values (found by operator.indexOf) or many (one dict entry a row)."""
    few = ["b", "a", "b", "c", "a", "c"]
    assert list(bulk._first_rows(few).items()) == [("b", 0), ("a", 1), ("c", 3)]
    many = [f"v{i % 100}" for i in range(1000)][::-1]
    expected = {}
    for row, value in enumerate(many):
        expected.setdefault(value, row)
    assert list(bulk._first_rows(many).items()) == list(expected.items())
    pairs = [("10.0.0.1", "10.0.3.7:8000"), ("10.0.0.2", "-"), ("10.0.0.1", "10.0.3.7:8000")]
    assert bulk._first_rows(pairs) == {pairs[0]: 0, pairs[1]: 1}


def test_freed_blocks_are_kept_where_glibc_allocates():
    """keep_freed_blocks() sets glibc's thresholds on Linux with glibc (this machine), and does nothing
    and says so elsewhere."""
    import platform
    import sys as system

    from triage.reader import keep_freed_blocks
    glibc = system.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert keep_freed_blocks() is glibc


def test_clf_time_range_parses_the_first_and_last_alone_where_it_may():
    """bulk._clf_range gives what parsing every distinct time gives: for times of one offset (only the
    earliest and latest parsed), of several offsets, of another shape, and with a date that is none."""
    from triage.timeparse import parse_clf
    cases = [
        ["29/Nov/2026:19:00:05 +0000", "29/Nov/2026:18:59:59 +0000", "01/Dec/2026:00:00:00 +0000",
         "30/Jan/2026:23:59:59 +0000"],
        ["29/Nov/2026:19:00:05 +0100", "29/Nov/2026:18:30:00 +0000"],  # two offsets
        ["29/Nov/2026:19:00:05 +0000", "31/Nov/2026:19:00:05 +0000"],  # a day November has not
        ["29/Nov/2026:19:00:05 +0000", "29/Foo/2026:19:00:05 +0000"],
        ["29/Nov/2026:19:00:05"],
    ]
    for stamps in cases:
        times = [t for t in map(parse_clf, set(stamps)) if t is not None]
        assert bulk._clf_range(stamps) == ((min(times), max(times)) if times else (None, None)), stamps
    assert bulk._clf_range(cases[0])[0].month == 1


def test_typed_rows_hold_the_numbers_orjson_reads():
    """finished.FinishedRow reads a line's numbers as orjson does (the per-line reading): every float to the
    same double, integers exact within 64 bits, and refuses those orjson reads as floats."""
    import msgspec
    import orjson

    rng = random.Random(11)
    floats = ["0.1", "1e-7", "5e-324", "1.7976931348623157e308", "0.30000000000000004", "2.2250738585072011e-308"]
    floats += [f"{rng.randint(0, 10 ** rng.randint(1, 19))}.{rng.randint(0, 10 ** rng.randint(1, 19))}e{rng.randint(-30, 30)}"
               for _ in range(3000)]
    floats += [repr(rng.uniform(0, 100)) for _ in range(1000)]
    ints = [0, -1, (1 << 63) - 1, -(1 << 63), *(rng.randint(-(1 << 63), (1 << 63) - 1) for _ in range(1000))]
    for ttft, prompt in zip(floats, ints * 5, strict=False):
        line = (f'{{"ts":"2026-11-29T19:00:00.000Z","event":"request.finished","prompt_tokens":{prompt},'
                f'"cached_tokens":0,"ttft_s":{ttft}}}')
        row, obj = msgspec.json.decode(line, type=finished.FinishedRow), orjson.loads(line)
        assert (row.ttft_s, row.prompt_tokens) == (float(obj["ttft_s"]), obj["prompt_tokens"]), line
    for past in (1 << 63, 1 << 64, -(1 << 63) - 1):
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(f'{{"ts":"t","event":"request.finished","prompt_tokens":{past},"cached_tokens":0}}',
                                type=finished.FinishedRow)


def test_no_match_answers_as_the_re2_scan_does(monkeypatch):
    """words.NoMatch (one Hyperscan scan) says a text holds no match exactly where RE2's (?m) search of the
    same literals and regexes finds none: the reader's own scan, and regexes with what the two engines
    spell differently (\\s, which in PCRE holds \\v; \\S; classes that start with "]"), over random texts of
    their pieces, vertical tabs and line ends among them."""
    import re

    import re2

    wanted = Dispatcher(all_rules(), None, None).wanted
    extra = [r'"queue_s":\s*(?:-?[1-9]|[^-0-9\s]|-[^0-9])', r"^up[{ ]", r"a\Sb", r"[]x]y", r"[^]\s]z$"]
    cases = [(wanted.literals, wanted.regexes), (["Traceback", "CUDA out of memory"], extra)]
    pieces = ['"queue_s":', "\v", "\n", " ", "\t", "up{", "up", "x", "y", "z", "a", "b", "]", "-", "0", "5", "e",
              "Trace", "back", "CUDA out of", " memory", '"request.scheduled"', '"prompt":', "http ", "h2 "]
    rng = random.Random(5)
    for literals, regexes in cases:
        no_match = words.NoMatch(literals, regexes)
        scan = re2.compile(("(?m)" + "|".join([*map(re.escape, literals), *regexes])).encode())
        answers = set()
        for _ in range(3000):
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))).encode()
            answers.add(no_match(text))
            assert no_match(text) == (scan.search(text) is None), text
        assert answers == {True, False}
    monkeypatch.setattr(words, "hyperscan", None)
    assert not words.NoMatch(["x"], [])(b"nothing here")  # (no Hyperscan: not known, RE2 searches)
    assert words._hyperscan_syntax(r"[\S]") is None and words._hyperscan_syntax("[[:alpha:]\\s]") is None
    assert words._hyperscan_syntax(r"a\vb") is None and words._hyperscan_syntax(r"\C") is None


def _routine_finished(line: str) -> bool:
    at = line.find('"event":"')
    return (at >= 0 and line.startswith('"event":"request.finished"', at) and line[:1] == "{"
            and '"finish_reason":"error"' not in line and '"logger":"loadgen"' not in line)


def test_routine_finished_tells_each_line():
    """bulk.routine_finished tells each line as a look at the line alone would: lines with the event first,
    second, twice or not at all, nested, failed, the client's own, not starting with "{", empty."""
    finished = '{"ts":"t","event":"request.finished","finish_reason":"stop","prompt_tokens":1}'
    lines = [finished, finished.replace("stop", "error"), finished.replace('"ts":"t"', '"logger":"loadgen"'),
             " " + finished, finished.replace('"ts":"t"', '"event":"request.received"'), "", "{", '"event":"',
             finished.replace('"ts":"t"', '"x":{"event":"request.received"}'), '{"event":"request.received"}',
             finished + '"event":"request.finished"', finished[:-1] + ',"x":"\\"event\\":\\"y\\""}', "x" * 40]
    rng = random.Random(2)
    for _ in range(200):
        some = rng.sample(lines, rng.randint(0, len(lines)))
        assert bulk.routine_finished(some) == list(map(_routine_finished, some))
    assert bulk.routine_finished(lines).count(True) == 3


def test_the_lines_a_family_run_leaves_are_its_access_lines():
    """In a run searched for one program's forms alone, the access lines are the lines its other forms leave:
    counted so, and each one's own line found so when a rule quotes it (a logged prompt that quotes an
    access line among them)."""
    rng = random.Random(3)
    lines = [_vllm(rng, i, T0 + timedelta(seconds=i)) for i in range(1, 400)]
    lines = [line for line in lines if "503" not in line and "ERROR" not in line]
    prompt = next(k for k, line in enumerate(lines) if "where is my order?" in line)
    lines[prompt] = lines[prompt].replace("where is my order?", 'INFO:     127.0.0.1:1 - "GET / HTTP/1.1" 200 OK')
    block = "\n".join(lines) + "\n"
    quoted = []
    run = bulk.Run("vllm.log", 0, bulk.RunText(block, 0, len(block)), lambda lineno, line: quoted.append((lineno, line)))
    family = ("received", "vllm-stats", "uvicorn")
    totals = bulk.summarise(run, list(family), len(lines), family)
    access = [(n, line) for n, line in enumerate(lines, 1) if "Received request" not in line and "Avg prompt" not in line]
    assert "Received request" in lines[prompt] and "INFO: " in lines[prompt] and totals is not None
    assert bulk.rows_of(totals, "uvicorn") == len(access) and run.rest == "uvicorn"
    for row in (0, 1, len(access) - 1):
        run.event("uvicorn", row)
    assert quoted == [access[0], access[1], access[-1]]
