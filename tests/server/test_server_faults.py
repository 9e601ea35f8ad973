"""Engine failures seen through HTTP: a CUDA OOM mid-serve gives 500s and error events, not a dead server."""

import json

import pytest
from openai_schemas import check
from server_harness import start_server

from engine.core.faults import FaultConfig


@pytest.fixture(scope="module")
def oom():
    harness = start_server(faults=FaultConfig(oom_after_requests=1))
    yield harness
    harness.stop()


def test_oom_fails_requests_with_500_and_error_events(oom):
    body = {"model": "builtin", "prompt": "first one works", "max_tokens": 2}
    assert oom.client.post("/v1/completions", json=body).status_code == 200
    failed = oom.client.post("/v1/completions", json=body)
    assert failed.status_code == 500
    check("ErrorResponse", failed.json())
    assert "CUDA" not in failed.json()["error"]["message"]  # details only in the log
    with oom.client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    check("ErrorResponse", json.loads(events[-2]))
    errors = oom.logs.events("engine.error")
    assert len(errors) == 2 and {e["phase"] for e in errors} == {"step"}
    assert errors[0]["exc_type"] == "OutOfMemoryError" and errors[0]["fatal"] is False
    assert errors[0]["message"].startswith("CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert "Traceback" in errors[0]["traceback"] and len(errors[0]["request_ids"]) == 1
    assert oom.metric("llm_requests_finished_total", finish_reason="error") == 2
    assert oom.metric("llm_e2e_request_latency_seconds_count", finish_reason="error") == 2
    assert oom.client.get("/ready").status_code == 200  # the engine stays up
    finished = [e for e in oom.logs.events("request.finished") if e["finish_reason"] == "error"]
    assert len(finished) == 2 and all("CUDA out of memory" in e["error"] for e in finished)
