"""Schemathesis against /openapi.json for both completion endpoints: no 5xx, every error in OpenAI's shape."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from openai_schemas import check
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from server_harness import start_server


@pytest.fixture(scope="module")
def small_server():
    # A short max_model_len bounds how long any valid generated request can run.
    harness = start_server(engine_kw={"max_model_len": 48, "num_kv_blocks": 64})
    yield harness
    harness.stop()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_no_server_errors_and_openai_error_shape(small_server, path, mode):
    operation = schemathesis.openapi.from_url(small_server.url + "/openapi.json")[path]["POST"]
    statuses = []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=10, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case):
        if mode is GenerationMode.POSITIVE and isinstance(case.body, dict):
            case.body["model"] = "builtin"  # otherwise nearly every valid body is a 404 unknown model
        response = case.call(timeout=60)
        case.validate_response(response, checks=[not_a_server_error])
        if response.status_code >= 400:
            check("ErrorResponse", response.json())
        statuses.append(response.status_code)

    run()
    assert statuses and all(s < 500 for s in statuses)
    if mode is GenerationMode.NEGATIVE:
        assert all(s >= 400 for s in statuses), statuses
