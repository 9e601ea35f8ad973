"""Every log event of CONTRACTS section 5 appears with its fields, and every line parses."""

import io
import re
import threading

import httpx
from server_harness import start_server

from engine.obs.logs import EventLogger, LogFormat

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
FIELDS = {
    "engine.startup": {"model", "model_digest", "dtype", "device", "block_size", "num_blocks",
                       "kv_bytes_per_token", "kv_cache_bytes", "cache_tokens", "max_model_len",
                       "max_concurrency", "prefix_caching", "max_num_seqs", "max_num_batched_tokens",
                       "weights_bytes", "torch_threads"},
    "engine.stats": {"running", "waiting", "kv_usage", "kv_blocks_used", "kv_blocks_total", "prefix_hit_rate",
                     "prefix_queried_tokens", "prefix_hit_tokens", "prompt_tokens_per_s",
                     "generation_tokens_per_s", "preemptions"},
    "engine.shutdown": {"reason", "drained", "aborted"},
    "request.received": {"request_id", "prompt_tokens", "max_tokens", "stream", "endpoint", "prompt"},
    "request.rejected": {"reason", "message"},
    "request.scheduled": {"request_id", "queue_s", "cached_tokens"},
    "request.preempted": {"request_id", "num_output_tokens"},
    "request.first_token": {"request_id", "ttft_s"},
    "request.finished": {"request_id", "finish_reason", "prompt_tokens", "cached_tokens", "completion_tokens",
                         "queue_s", "ttft_s", "tpot_s", "e2e_s", "prefix_fingerprint"},
    "request.aborted": {"request_id", "reason", "tokens_sent", "elapsed_s"},
    "http.access": {"method", "path", "status", "duration_s", "client"},
}


def _traffic(harness) -> None:
    body = {"model": "builtin", "prompt": "A prompt long enough to span two blocks of sixteen tokens.",
            "max_tokens": 50, "ignore_eos": True}
    threads = [threading.Thread(target=harness.client.post, args=("/v1/completions",), kwargs={"json": body})
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    harness.client.post("/v1/completions", json={"model": "builtin", "prompt": "x", "max_tokens": 0})
    with harness.client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        next(line for line in response.iter_lines() if line.startswith("data: "))
    harness.wait_for(lambda: harness.logs.events("request.aborted"), what="request.aborted")


def test_every_event_appears_and_parses():
    harness = start_server(engine_kw={"max_model_len": 128, "num_kv_blocks": 10},
                           server_kw={"stats_interval_s": 0.2, "log_prompts": True})
    try:
        _traffic(harness)
        harness.wait_for(lambda: harness.logs.events("engine.stats"), what="engine.stats")
    finally:
        harness.stop()
    records = harness.logs.events()  # json.loads on every line
    for record in records:
        assert TS.match(record["ts"]) and record["level"] in ("info", "warning", "error"), record
        assert record["logger"] == "llmserve" and record["model"] == "builtin", record
    by_event = {}
    for record in records:
        by_event.setdefault(record["event"], []).append(record)
    assert set(FIELDS) <= set(by_event), set(FIELDS) - set(by_event)
    for event, fields in FIELDS.items():
        for record in by_event[event]:
            assert fields <= set(record), (event, fields - set(record))
    assert all(r["queue_s"] is not None and r["queue_s"] >= 0 for r in by_event["request.scheduled"])
    finished = by_event["request.finished"]
    assert {r["finish_reason"] for r in finished} == {"length", "abort"}
    fingerprint = next(r["prefix_fingerprint"] for r in finished if r["prompt_tokens"] >= 32)
    assert len(fingerprint) == 3 and all(re.fullmatch(r"[0-9a-f]{8}", h) for h in fingerprint)
    assert by_event["request.received"][0]["prompt"].startswith("A prompt long enough")
    assert by_event["request.rejected"][0]["reason"] == "invalid"
    assert by_event["request.aborted"][0]["reason"] == "client_disconnect"
    assert sum(r["preemptions"] for r in by_event["engine.stats"]) > 0
    assert by_event["engine.shutdown"][-1]["reason"] == "sigterm"


def test_prompts_are_not_logged_by_default(server):
    server.client.post("/v1/completions", json={"model": "builtin", "prompt": "secret words", "max_tokens": 1})
    received = server.logs.events("request.received")
    assert received and all("prompt" not in r for r in received)
    assert not any("secret words" in line for line in server.logs.lines)


def test_text_format_is_one_line_per_event():
    stream = io.StringIO()
    log = EventLogger("builtin", stream, LogFormat.TEXT)
    log.emit("engine.error", "error", "r1", message="boom here", traceback="line 1\nline 2", fatal=True)
    (line,) = stream.getvalue().splitlines()
    assert re.match(r"^\S+Z ERROR   engine.error model=builtin request_id=r1 ", line)
    assert 'message="boom here"' in line and 'traceback="line 1\\nline 2"' in line and "fatal=true" in line


def test_access_log_counts_http_status(server):
    anonymous = httpx.get(server.url + "/v1/models")
    assert anonymous.status_code == 401
    access = server.logs.events("http.access")[-1]
    assert access["path"] == "/v1/models" and access["status"] == 401 and access["method"] == "GET"
    assert server.metric("llm_http_requests_total", route="/v1/models", status="401") == 1
