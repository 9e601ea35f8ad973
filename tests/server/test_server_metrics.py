"""Metrics driven by real traffic: aborts free blocks, queue limits, preemptions, timeouts, promtool."""

import json
import shutil
import subprocess
import threading

import httpx
import pytest
from openai_schemas import check
from server_harness import start_server

LONG = {"model": "builtin", "prompt": "Tell me a very long story.", "max_tokens": 400, "ignore_eos": True,
        "stream": True}


@pytest.fixture(scope="module")
def plain():
    harness = start_server()
    yield harness
    harness.stop()


def _cut_stream(client: httpx.Client) -> None:
    """Open a stream, read its first event, hang up."""
    with client.stream("POST", "/v1/completions", json=LONG) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                return


def test_cut_streams_free_their_blocks_and_count_as_aborts(plain):
    aborts_before = plain.metric("llm_requests_finished_total", finish_reason="abort")
    threads = [threading.Thread(target=lambda: [_cut_stream(plain.client) for _ in range(10)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    plain.wait_for(lambda: plain.metric("llm_requests_finished_total", finish_reason="abort") - aborts_before == 40,
                   what="40 aborts counted")
    plain.wait_for(lambda: plain.metric("llm_kv_cache_blocks_used") == 0, what="blocks freed")
    assert plain.metric("llm_requests_running") == 0
    aborted = [e for e in plain.logs.events("request.aborted") if e["reason"] == "client_disconnect"]
    assert len(aborted) >= 40
    # Aborted requests are observed in the per-request histograms too, with their finish_reason.
    assert plain.metric("llm_e2e_request_latency_seconds_count", finish_reason="abort") >= 40


def test_non_streaming_disconnect_aborts(plain):
    aborts_before = plain.metric("llm_requests_finished_total", finish_reason="abort")
    body = {**LONG, "stream": False, "max_tokens": 450}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(plain.url + "/v1/completions", json=body, timeout=httpx.Timeout(10, read=0.5))
    plain.wait_for(lambda: plain.metric("llm_requests_finished_total", finish_reason="abort") == aborts_before + 1,
                   what="the abort")
    plain.wait_for(lambda: plain.metric("llm_kv_cache_blocks_used") == 0, what="blocks freed")


def test_metrics_move_with_traffic_and_pass_promtool(plain):
    before = {name: plain.metric(name) for name in ("llm_generation_tokens_total", "llm_prompt_tokens_total")}
    stops_before = plain.metric("llm_requests_finished_total", finish_reason="length")
    for _ in range(3):
        plain.client.post("/v1/completions", json={**LONG, "stream": False, "max_tokens": 3})
    assert plain.metric("llm_generation_tokens_total") - before["llm_generation_tokens_total"] == 9
    assert plain.metric("llm_prompt_tokens_total") > before["llm_prompt_tokens_total"]
    assert plain.metric("llm_requests_finished_total", finish_reason="length") - stops_before == 3
    assert plain.metric("llm_time_to_first_token_seconds_count", finish_reason="length") >= 3
    assert plain.metric("llm_kv_cache_blocks_capacity") == 256
    assert "llm_kv_cache_blocks_total" not in plain.scrape()  # one gauge for the pool size, no untyped copy
    assert plain.metric("llm_engine_ready") == 1
    info = plain.metric("llm_engine_info", model="builtin", block_size="16", prefix_caching="true",
                        max_model_len="512", dtype="float32", device="cpu", max_num_seqs="64",
                        max_num_batched_tokens="2048")
    assert info == 1
    assert plain.metric("llm_http_requests_total", route="/v1/completions", status="200") >= 3
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (make system-deps)")
    result = subprocess.run([promtool, "check", "metrics"], input=plain.scrape(), capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0 and result.stdout.strip() == "" and result.stderr.strip() == "", result


def test_tiny_kv_budget_preempts_and_still_answers():
    harness = start_server(engine_kw={"max_model_len": 128, "num_kv_blocks": 10, "max_num_seqs": 8})
    try:
        body = {"model": "builtin", "prompt": "Preempt me, please, with a longish prompt.", "max_tokens": 30,
                "ignore_eos": True}
        results = []
        threads = [threading.Thread(target=lambda: results.append(
            harness.client.post("/v1/completions", json=body).json())) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [r["usage"]["completion_tokens"] for r in results] == [30] * 4
        assert harness.metric("llm_preemptions_total") > 0
        assert harness.logs.events("request.preempted")
        harness.wait_for(lambda: harness.metric("llm_kv_cache_blocks_used") == 0, what="blocks freed")
    finally:
        harness.stop()


def test_full_queue_answers_429_with_retry_after():
    harness = start_server(engine_kw={"max_num_seqs": 1}, server_kw={"max_queue_len": 1})
    try:
        with harness.client.stream("POST", "/v1/completions", json=LONG) as running:
            assert running.status_code == 200
            lines = running.iter_lines()  # kept: a collected iterator closes the response
            next(lines)
            with harness.client.stream("POST", "/v1/completions", json=LONG) as waiting:
                assert waiting.status_code == 200
                harness.wait_for(lambda: harness.state.llm.num_waiting == 1, what="one waiting")
                refused = harness.client.post("/v1/completions", json={**LONG, "stream": True})
                assert refused.status_code == 429
                assert refused.headers["retry-after"] == "1"
                check("ErrorResponse", refused.json())
                assert refused.json()["error"]["code"] == "queue_full"
        assert harness.metric("llm_requests_rejected_total", reason="queue_full") == 1
        assert harness.logs.events("request.rejected")[-1]["reason"] == "queue_full"
    finally:
        harness.stop()


def test_queue_limit_lets_a_burst_onto_free_batch_slots():
    """--max-queue-len counts requests no batch slot can take: an idle server takes a burst of 12 with 8."""
    harness = start_server(server_kw={"max_queue_len": 8})
    try:
        statuses = []
        go = threading.Barrier(12)

        def one():
            with httpx.Client(base_url=harness.url, timeout=60) as client:
                go.wait()
                body = {"model": "builtin", "prompt": "burst", "max_tokens": 4, "ignore_eos": True}
                statuses.append(client.post("/v1/completions", json=body).status_code)

        threads = [threading.Thread(target=one) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert statuses == [200] * 12
        assert not harness.logs.events("request.rejected")
    finally:
        harness.stop()


def test_request_timeout_ends_stream_with_error_event_and_504():
    harness = start_server(server_kw={"request_timeout_s": 0.5})
    try:
        events = []
        with harness.client.stream("POST", "/v1/completions", json={**LONG, "max_tokens": 450}) as response:
            events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])
        check("ErrorResponse", error)
        assert error["error"]["code"] == "request_timeout"
        slow = harness.client.post("/v1/completions", json={**LONG, "stream": False, "max_tokens": 450})
        assert slow.status_code == 504 and slow.json()["error"]["code"] == "request_timeout"
        reasons = [e["reason"] for e in harness.logs.events("request.aborted")]
        assert reasons == ["timeout", "timeout"]
        harness.wait_for(lambda: harness.metric("llm_kv_cache_blocks_used") == 0, what="blocks freed")
    finally:
        harness.stop()
