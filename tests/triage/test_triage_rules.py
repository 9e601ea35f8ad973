"""Rules on hand-made events: bounded memory, load-stop disconnects, backlog vs slow steps, ranking."""

import random
from collections import Counter
from datetime import datetime, timedelta

import pytest

from triage.diagnose import Dispatcher
from triage.model import Confidence, Event
from triage.rules import all_rules, cache, cache_text
from triage.rules.cache import CacheRule, Recent
from triage.rules.streams import StreamRule

MAX_KEYS = 300  # the bound under test, small so the test is quick

T0 = datetime(2026, 11, 29, 19, 40)


def event(kind: str, t: float = 0.0, source: str = "engine-json", **fields) -> Event:
    return Event(T0 + timedelta(seconds=t), source, kind, fields, "f.log", 1, kind)


def run(events: list[Event]) -> list:
    d = Dispatcher(all_rules(), None, None)
    for ev in events:
        d.feed(ev)
    findings = [f for rule in d.rules for f in rule.findings(d.facts)]
    return sorted(findings, key=lambda f: f.rank_key())


def test_cache_tables_stay_bounded(monkeypatch):
    monkeypatch.setattr(cache, "MAX_KEYS", MAX_KEYS)
    rule = CacheRule()
    for i in range(3 * MAX_KEYS):
        fp = [f"{i:08x}", f"{i + 1:08x}", f"{i + 2:08x}", f"{i + 3:08x}"]
        rule.observe(event("request.finished", prompt_tokens=64, cached_tokens=0, prefix_fingerprint=fp))
    assert len(rule.pairs) <= MAX_KEYS


def test_repeated_prefix_survives_pruning(monkeypatch):
    monkeypatch.setattr(cache, "MAX_KEYS", MAX_KEYS)
    rule = CacheRule()
    shared = ["bbbbbbbb", "cccccccc", "dddddddd"]
    for i in range(2 * MAX_KEYS):
        noise = [f"{i:08x}", f"{i + 7:08x}", f"{i + 9:08x}"]
        rule.observe(event("request.finished", prompt_tokens=64, cached_tokens=0, prefix_fingerprint=noise))
        if i % 60 == 0:
            fp = [f"{i:08x}a"] + shared
            rule.observe(event("request.finished", prompt_tokens=64, cached_tokens=0, prefix_fingerprint=fp))
    findings = rule.findings(None)
    assert [f.cause for f in findings] == ["dynamic-prefix"], [(f.cause, f.explanation) for f in findings]
    finding = findings[0]
    assert (finding.id, finding.cause, finding.confidence) == ("cache-miss", "dynamic-prefix", Confidence.HIGH)


def test_keys_with_one_first_block_are_kept_apart():
    """Prompts alike for one block, then not, make two keys under that block, each with its own requests;
    a block repeated within one prompt is no prompt shared with itself."""
    rule = CacheRule()
    for i in range(6):
        for second in ("aa", "bb"):
            fp = ["s", second, f"{second}{i}x", f"{second}{i}y"]
            rule.observe(event("request.finished", prompt_tokens=64, cached_tokens=0, prefix_fingerprint=fp))
    assert sorted((key, total) for key, _, total in cache_text._keys(rule)) == [((0, "s", "aa"), 6),
                                                                                ((0, "s", "bb"), 6)]
    assert cache_text._reuse(rule)
    alone = CacheRule()
    alone.observe(event("request.finished", prompt_tokens=64, cached_tokens=0, prefix_fingerprint=["r", "z", "r", "z"]))
    assert list(cache_text._keys(alone)) == [] and not alone.samples


def test_recent_add_new_refuses_a_known_key_or_two_alike_and_changes_nothing():
    """add_new puts keys all new and unlike in one step; where one is in either generation, or two are alike
    (two rows with one block, or one block twice in a fingerprint), it puts nothing and leaves every value as
    it was, so that the keys are then put one by one."""
    table = Recent(8)
    there = ["old"]
    assert table.add_new(["k1", "k2"], [there, there])
    table._turn()  # (k1, k2 now old)
    young_fp = ["young"]
    assert table.add_new(["y1"], [young_fp])
    before = (dict(table.young), dict(table.old))
    new = ["new"]
    for keys in (["n1", "y1", "n2"], ["n1", "k2"], ["n1", "n1"], ["n1", "n2", "n1"]):
        assert not table.add_new(keys, [new] * len(keys)), keys
        assert (table.young, table.old) == before and table.young["y1"] is young_fp, keys
    two = [["a"], ["b"]]
    assert not table.add_new(["n1", "n1"], two)  # (two requests' keys alike: each its own value)
    assert (table.young, table.old) == before
    assert table.add_new(["n1", "n2"], [new, new]) and list(table.young) == ["y1", "n1", "n2"]


def test_llama_server_prompts_alike_with_a_short_prefix_kept_twice_are_a_dynamic_prefix():
    """A slot's new prompt nearly alike to its cache (lcs similarity) that keeps only a short common prefix
    is a changed early part once it repeats; nothing kept (cache_prompt off, or a new start), a kept prefix
    without a selection of that slot before it, or one such prompt alone (an early message edited) is not."""
    def selected(slot: int, lcs: int = 3000, similarity: float = 0.97) -> Event:
        return event("cache.slot_selected", source="text", slot=slot, lcs_len=lcs, similarity=similarity)

    def kept(slot: int, n: int) -> Event:
        return event("cache.slot_kept", source="text", slot=slot, kept=n)

    rule = CacheRule()
    for ev in (selected(0), kept(0, 0), selected(0), kept(0, 0), selected(1), kept(0, 20), selected(0, 3000, 0.5),
               kept(0, 30), selected(0, 100), kept(0, 40), selected(0), kept(0, 25)):
        rule.observe(ev)
    assert rule.findings(None) == []
    rule.observe(selected(0))
    rule.observe(kept(0, 26))
    [finding] = rule.findings(None)
    assert (finding.cause, finding.confidence) == ("dynamic-prefix", Confidence.HIGH)
    assert "kept only its first 25 tokens" in finding.explanation and "2 prompts did so" in finding.explanation


@pytest.mark.parametrize("queues, step_s, backlog", [
    ([0, 9, 14, 12, 8, 5, 2, 0], 2.0, False),  # a burst absorbed within seconds
    ([0, 9, 14, 12, 8, 5, 6], 2.0, True),  # still queued at the last line
    ([0, 9, 14, 12, 8, 5, 2, 0], 15.0, True),  # queued for over a minute before it drained
    ([0, 9, 40, 12, 0], 2.0, True),  # a deep queue
])
def test_a_queue_that_drains_within_a_minute_is_a_burst_not_a_backlog(queues, step_s, backlog):
    events = [event("engine.stats", t=i * step_s, source="sglang", waiting=q, running=64, kv_usage=0.5)
              for i, q in enumerate(queues)]
    found = [(f.id, f.confidence) for f in run(events)]
    assert found == ([("queue-backlog", Confidence.MEDIUM)] if backlog else [])


@pytest.mark.parametrize("head", [
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\nCurrent time: {ts}Z | session={sid}\\n",
    "<bos><start_of_turn>user\\nrequest_uuid: {uuid}\\nsent_at: {ts}\\n\\n",
    "<|im_start|>system\\n[trace_id={sid} ts=17410164{n}.{ms} tenant=acme]\\n",
])
def test_a_changing_start_behind_a_chat_template_is_a_dynamic_prefix(head):
    """A logged prompt's chat-template markup (special tokens, role names, line ends) is the same for every
    request: the id or time right after it, not the first 64 characters of markup, is the prompt's start."""
    rule = CacheRule()
    for n in range(4):
        prompt = head.format(ts=f"2024-11-19T10:02:0{n}.48{n}", sid=f"6972{n}2e42bf2", n=f"{n:02d}", ms=f"9{n}1",
                             uuid=f"95794242-9bda-4e4f-b839-599d6eca2b7{n}") + "You are Atlas, the support assistant."
        rule.observe(event("request.received", source="vllm", request_id=f"r{n}", prompt=prompt))
    assert [f.cause for f in rule.findings(None)] == ["dynamic-prefix"]


@pytest.mark.parametrize("increase, lines, confidence", [
    (2, 0, Confidence.LOW),  # a counter that rose by two, no line: a brush with a full cache
    (40, 0, Confidence.HIGH),
    (2, 1, Confidence.HIGH),  # a preemption line states it
])
def test_a_few_preemptions_counted_by_a_metric_alone_are_a_hint(increase, lines, confidence):
    events = [event("metric", source="prometheus", metric="preemptions_total", increase=float(increase),
                    labels={}, max=float(increase))]
    events += [event("request.preempted", t=1.0 + k, request_id=f"p{k}") for k in range(lines)]
    [finding] = [f for f in run(events) if f.id == "kv-preemption"]
    assert finding.confidence == confidence


@pytest.mark.parametrize("served, cut, confidence", [
    (10, 1, Confidence.LOW),  # one user who left among ten served
    (20, 2, Confidence.LOW),
    (5, 1, Confidence.HIGH),  # an excerpt around the cut
    (30, 3, Confidence.HIGH),
])
def test_one_or_two_disconnects_among_many_served_requests_are_a_hint(served, cut, confidence):
    def access(i: int, status: int) -> Event:
        fields = {"status": status, "duration_s": 2.0 + i % 3, "request_id": None, "upstream_addr": "10.0.0.5:8000",
                  "client": f"10.1.0.{i}", "cut": "client" if status == 499 else None}
        return Event(T0 + timedelta(seconds=i * 3.0), "nginx-access", "http.access", fields, "access.log", i + 1,
                     f'10.1.0.{i} "POST /v1/chat/completions HTTP/1.1" {status}')
    events = [access(i, 499 if i % (served // cut) == 1 and i < cut * (served // cut) else 200)
              for i in range(served + cut)]  # (the cuts spread over the run)
    [finding] = [f for f in run(events) if f.id == "stream-cut-client-disconnect"]
    assert finding.confidence == confidence


@pytest.mark.parametrize("requests, phase", [
    ([("POST", "/api/chat", 200)], "oom-runtime"),  # a model answered: it was serving when the kernel killed it
    ([("HEAD", "/", 200), ("GET", "/api/tags", 200)], "oom-weights"),  # answered while no model ran: guessed
    ([("POST", "/api/chat", 500)], "oom-weights"),
])
def test_ollama_requests_answered_before_a_host_oom_kill_place_it(requests, phase):
    events = [event("http.access", t=float(k), source="ollama", status=status, method=method, path=path)
              for k, (method, path, status) in enumerate(requests)]
    events.append(event("oom.host", t=30.0, source="kernel", signature="kernel-memcg-oom"))
    assert [f.id for f in run(events) if f.id.startswith("oom")] == [phase]


def test_request_times_past_the_bound_count_alike_one_by_one_and_in_bulk():
    """At 10,000 distinct tenths of a second of request times, a time already counted still counts and a new
    one does not, whether access lines come one by one or as a run's totals."""
    times = [1.0 + k / 10 for k in range(10_000)] + [1.0, 5000.0]
    one_by_one, in_bulk = StreamRule(), StreamRule()
    for t in times:
        one_by_one.observe(event("http.access", source="nginx-access", status=200, duration_s=t))
    in_bulk.observe(event("http.access.totals", source="nginx-access", durations=Counter(times), routes={}))
    assert one_by_one.timeout_durations == in_bulk.timeout_durations
    assert one_by_one.timeout_durations[1.0] == 2 and 5000.0 not in one_by_one.timeout_durations


def test_a_shared_prefix_is_kept_after_its_requests_stop(monkeypatch):
    """Prompts with a changing start and shared later blocks, then many random prompts (the start fixed and
    the traffic on): the shared blocks outlive the keys seen once, and the incident is still named."""
    monkeypatch.setattr(cache, "MAX_KEYS", MAX_KEYS)
    rng = random.Random(3)
    rule = CacheRule()
    shared = ["t1", "t2", "t3"]
    fps = [[f"{rng.getrandbits(32):08x}", *shared] for _ in range(40)]
    fps += [[f"{rng.getrandbits(32):08x}" for _ in range(4)] for _ in range(3 * MAX_KEYS)]
    for fp in fps:
        rule.observe(event("request.finished", prompt_tokens=64, cached_tokens=0, prefix_fingerprint=fp))
    assert len(rule.pairs) <= MAX_KEYS
    assert [f.cause for f in rule.findings(None)] == ["dynamic-prefix"]


def _served(n: int) -> list[Event]:
    return [event("request.finished", t=i * 0.5, request_id=f"r{i}", finish_reason="stop", ttft_s=0.05)
            for i in range(n)]


def test_disconnects_when_the_load_stops_are_not_an_incident():
    stop = [event("request.aborted", t=10.0 + i * 0.01, request_id=f"x{i}", reason="client_disconnect")
            for i in range(4)]
    assert run(_served(20) + stop) == []
    spread = [event("request.aborted", t=1.0 + i * 2, request_id=f"x{i}", reason="client_disconnect")
              for i in range(4)]
    assert [f.id for f in run(_served(20) + spread)] == ["stream-cut-client-disconnect"]
    assert [f.id for f in run(stop[:1])] == ["stream-cut-client-disconnect"]  # an excerpt: one line is enough


def test_slow_first_schedule_without_a_queue_is_not_a_backlog():
    slow = [event("request.scheduled", t=i, request_id=f"r{i}", queue_s=4.0) for i in range(10)]
    assert run(slow) == []
    queued = slow + [event("engine.stats", t=10, running=4, waiting=12, kv_usage=0.3)]
    [finding] = run(queued)
    assert (finding.id, finding.confidence) == ("queue-backlog", Confidence.HIGH)


def test_gateway_timeout_claims_the_engine_aborts():
    timeout = event("gateway.upstream_timeout", t=5, source="nginx-error", phase="reading upstream")
    aborts = [event("request.aborted", t=5, request_id=f"r{i}", reason="client_disconnect") for i in range(3)]
    findings = run([timeout, *aborts])
    assert [f.id for f in findings] == ["stream-cut-gateway-timeout"]
    assert findings[0].requests.listed() == ["r0", "r1", "r2"]


def access(t: float, status: int, duration: float) -> Event:
    return event("http.access", t=t, source="nginx-access", status=status, duration_s=duration,
                 cut="timeout" if status == 504 else None)


def test_the_timeout_is_named_only_where_request_times_stop():
    """A gateway caps request times at its timeout: the commonest time is named as the timeout only when no
    request lasted longer; the engine is said to see its client go only when its aborts were seen."""
    busy = [access(i, 200, 3.2) for i in range(41)]
    [one] = run([*busy, access(50, 504, 60.0)])
    assert one.id == "stream-cut-gateway-timeout" and "configured timeout" not in one.explanation
    assert "saw its client go away" not in one.explanation
    cut = [access(i, 200, 60.0) for i in range(12)]
    [capped] = run([*busy, *cut, access(60, 504, 60.0)])
    assert capped.explanation.endswith(" 13 requests lasted 60.0 s at the gateway: the configured timeout.")
    timeout = event("gateway.upstream_timeout", t=5, source="nginx-error", phase="reading upstream")
    abort = event("request.aborted", t=5, request_id="r0", reason="client_disconnect")
    [claimed] = run([timeout, abort])
    assert "The engine saw its client go away." in claimed.explanation


def test_oom_before_crash_before_cut_streams():
    events = [
        event("engine.error", t=1, phase="step", exc_type="OutOfMemoryError", fatal=True, request_ids=["a"],
              message="CUDA out of memory. Tried to allocate 2.00 GiB.", traceback=""),
        event("gateway.connect_refused", t=2, source="nginx-error"),
        event("client.stream_cut", t=2, source="text"),
    ]
    assert [f.id for f in run(events)] == ["oom-runtime", "engine-crash"]


def test_rare_disconnects_in_a_busy_log_and_one_short_queue_are_not_incidents():
    busy = _served(300) + [event("http.access", t=30, source="nginx-access", status=499, cut="client",
                                 duration_s=3.2, request_id="x")]
    assert run(busy) == []
    one_snapshot = [event("engine.stats", t=0, running=8, waiting=9, kv_usage=0.3)]
    assert run(one_snapshot) == []
    deep = [event("engine.stats", t=0, running=64, waiting=500, kv_usage=0.3)]
    assert [(f.id, f.confidence) for f in run(deep)] == [("queue-backlog", Confidence.MEDIUM)]


def test_a_guessed_cause_still_precedes_its_symptom():
    from triage.diagnose import rank
    from triage.model import EvidenceSet, Finding

    def finding(fid, confidence):
        return Finding(fid, fid, "high", confidence, "", EvidenceSet())

    ordered = rank([finding("engine-crash", Confidence.HIGH), finding("stream-cut-gateway-timeout", Confidence.HIGH),
                    finding("oom-runtime", Confidence.MEDIUM), finding("cache-miss", Confidence.HIGH),
                    finding("driver-mismatch", Confidence.LOW)])
    assert [f.id for f in ordered] == ["oom-runtime", "engine-crash", "stream-cut-gateway-timeout", "cache-miss",
                                       "driver-mismatch"]
    # requests queued beyond capacity are why the gateway timed them out and the clients gave up
    ordered = rank([finding("stream-cut-gateway-timeout", Confidence.HIGH),
                    finding("stream-cut-client-disconnect", Confidence.HIGH), finding("queue-backlog", Confidence.MEDIUM)])
    assert [f.id for f in ordered] == ["queue-backlog", "stream-cut-gateway-timeout", "stream-cut-client-disconnect"]


def _cache_state(rule: CacheRule) -> tuple:
    return (rule.num_requests, rule.num_prompt_tokens, rule.num_cached_tokens, rule.num_short,
            [e.line for e in rule.short_samples], rule.num_multi_block, list(rule.pairs.items()),
            {key: [e.line for e in sample] for key, sample in rule.samples.items()})


def _finished_rows(rng, n: int, kind: str) -> list[dict]:
    rows = []
    width = rng.choice((2, 3))
    for _ in range(n):
        if kind == "unique":  # every key new: the table fills and is pruned
            fp = [f"{rng.getrandbits(32):08x}" for _ in range(4)]
        elif kind == "narrow":  # every key new, one width of two or three blocks a chunk
            fp = [f"{rng.getrandbits(32):08x}" for _ in range(width)]
        elif kind == "shared":  # later blocks shared after differing first ones
            fp = [f"{rng.randrange(40):x}", "s1", "s2", f"{rng.randrange(3)}"]
        else:  # lengths, types and token counts of every kind
            fp = rng.choice([[f"{rng.getrandbits(32):08x}" for _ in range(rng.choice((1, 2, 3, 5)))], None, "x",
                             [1, 2, 3], [[1], [2]]])
        rows.append({"prompt_tokens": rng.choice((8, 64, 300)) if kind != "mixed" else rng.choice((8, 64, "x", None)),
                     "cached_tokens": rng.choice((0, 16)), "prefix_fingerprint": fp})
    return rows


@pytest.mark.parametrize("kinds", [("unique",), ("narrow",), ("shared",), ("mixed",),
                                   ("unique", "shared", "narrow", "mixed", "unique")])
def test_cache_rule_reads_finished_rows_in_bulk_as_one_by_one(monkeypatch, kinds):
    """request.finished rows handed over in bulk leave the cache rule's tables, counts and samples exactly
    as the same rows one by one, across prunes (a small MAX_KEYS)."""
    monkeypatch.setattr(cache, "MAX_KEYS", MAX_KEYS)
    rng = random.Random(7)
    chunks = [_finished_rows(rng, rng.choice((16, 40, 150)), kind) for kind in kinds for _ in range(12)]
    one_by_one, in_bulk = CacheRule(), CacheRule()
    line = 0
    for rows in chunks:
        events = []
        for f in rows:
            line += 1
            events.append(Event(T0, "engine-json", "request.finished", f, "f.log", line, "{}"))
        for ev in events:
            one_by_one.observe(ev)
        in_bulk.observe(Event(T0, "engine-json", "request.finished.totals",
                              {"rows": rows, "count": len(rows), "event": events.__getitem__}, "f.log", None, ""))
    assert _cache_state(in_bulk) == _cache_state(one_by_one)
    assert len(one_by_one.pairs) <= MAX_KEYS and one_by_one.num_requests > 0
