"""Shared fixtures: one real server (builtin model) per module that asks for it."""

import openai
import pytest
from server_harness import start_server

API_KEY = "test-key"


@pytest.fixture(scope="module")
def server():
    harness = start_server(server_kw={"api_key": API_KEY, "max_body_bytes": 64 * 1024}, traces=True)
    harness.client.headers["Authorization"] = f"Bearer {API_KEY}"
    yield harness
    harness.stop()


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30)
