"""OpenAI API behaviour through the openai SDK, with every body validated against OpenAI's schemas."""

import json

import httpx
import openai
import pytest
from openai_schemas import check

CHAT = [{"role": "user", "content": "Say something about paged attention."}]


def sse_events(client: httpx.Client, path: str, body: dict) -> list:
    """POST a streaming request; every `data:` payload, parsed (the final [DONE] kept as a string)."""
    events = []
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                payload = line[len("data: "):]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_chat_non_streaming_matches_schema_and_usage(server, sdk):
    result = sdk.chat.completions.create(model="builtin", messages=CHAT, max_tokens=5, temperature=0,
                                         extra_body={"ignore_eos": True, "top_k": 5})
    assert result.choices[0].finish_reason == "length"
    assert result.usage.completion_tokens == 5
    assert result.usage.total_tokens == result.usage.prompt_tokens + 5
    assert result.usage.prompt_tokens_details.cached_tokens >= 0
    raw = server.client.post("/v1/chat/completions", json={"model": "builtin", "messages": CHAT,
                                                            "max_tokens": 5, "temperature": 0, "ignore_eos": True})
    assert raw.status_code == 200
    check("CreateChatCompletionResponse", raw.json())
    assert raw.json()["choices"][0]["message"]["content"] == result.choices[0].message.content


def test_chat_streaming_chunks_match_schema_and_non_streaming_text(server, sdk):
    body = {"model": "builtin", "messages": CHAT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    whole = server.client.post("/v1/chat/completions", json=body).json()
    events = sse_events(server.client, "/v1/chat/completions",
                        {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    for chunk in chunks:
        check("CreateChatCompletionStreamResponse", chunk)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert len({c["id"] for c in chunks}) == 1
    # The SDK reads the same stream.
    sdk_chunks = list(sdk.chat.completions.create(
        model="builtin", messages=CHAT, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert sdk_chunks[-1].usage.completion_tokens == 6
    assert "".join(c.choices[0].delta.content or "" for c in sdk_chunks if c.choices) == text


def test_completions_streaming_and_not(server, sdk):
    body = {"model": "builtin", "prompt": "The KV cache", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    whole = server.client.post("/v1/completions", json=body).json()
    check("CreateCompletionResponse", whole)
    assert whole["usage"]["completion_tokens"] == 4 and whole["choices"][0]["finish_reason"] == "length"
    events = sse_events(server.client, "/v1/completions",
                        {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    for chunk in events[:-1]:
        check("CreateCompletionResponse", chunk, stream_completion=True)
    assert "".join(c["choices"][0]["text"] for c in events[:-1] if c["choices"]) == whole["choices"][0]["text"]
    assert events[-2]["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    sdk_result = sdk.completions.create(model="builtin", prompt="The KV cache", max_tokens=4, temperature=0,
                                        extra_body={"ignore_eos": True})
    assert sdk_result.choices[0].text == whole["choices"][0]["text"]


def test_completions_accept_token_ids(server):
    body = {"model": "builtin", "prompt": [72, 101, 108, 108, 111], "max_tokens": 3, "ignore_eos": True}
    result = server.client.post("/v1/completions", json=body).json()
    check("CreateCompletionResponse", result)
    assert result["usage"]["prompt_tokens"] == 5 and result["usage"]["completion_tokens"] == 3


def test_repeated_prompt_reports_cached_tokens(server):
    prompt = "A long shared system prompt about serving large language models. " * 3
    body = {"model": "builtin", "prompt": prompt, "max_tokens": 2, "ignore_eos": True}
    hits_before = server.metric("llm_prefix_cache_hit_tokens_total")
    first = server.client.post("/v1/completions", json=body).json()["usage"]
    second = server.client.post("/v1/completions", json=body).json()["usage"]
    num_prompt = first["prompt_tokens"]
    # Every full block but the one holding the last prompt token (always recomputed) is reused.
    expected = (num_prompt - 1) // 16 * 16
    assert expected > 0
    assert second["prompt_tokens_details"]["cached_tokens"] == expected
    assert server.metric("llm_prefix_cache_hit_tokens_total") - hits_before >= expected


def test_models_lists_the_served_model(server, sdk):
    raw = server.client.get("/v1/models").json()
    check("ListModelsResponse", raw)
    assert [m.id for m in sdk.models.list().data] == ["builtin"]


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    check("ErrorResponse", body)
    return body["error"]


@pytest.mark.parametrize("content, fragment", [
    (b'{"model": "builtin", "messages": [', "not valid JSON"),
    (json.dumps({"model": "builtin", "messages": "hi"}).encode(), "messages"),
    (json.dumps({"model": "builtin", "messages": CHAT, "max_tokens": 0}).encode(), "max_tokens"),
    (json.dumps({"model": "builtin", "messages": CHAT, "max_tokens": -3}).encode(), "max_tokens"),
    (json.dumps({"model": "builtin", "messages": CHAT, "temperature": "hot"}).encode(), "temperature"),
    (json.dumps({"model": "builtin", "messages": []}).encode(), "messages"),
])
def test_bad_requests_answer_400(server, content, fragment):
    error = _error(server.client.post("/v1/chat/completions", content=content,
                                      headers={"content-type": "application/json"}), 400)
    assert fragment in error["message"] and error["type"] == "invalid_request_error"


def test_prompt_too_long_names_both_numbers(server, sdk):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(model="builtin", prompt="x" * 600, max_tokens=10)
    error = _error(info.value.response, 400)
    assert "maximum context length is 512 tokens" in error["message"]
    assert "610 tokens" in error["message"] and error["code"] == "context_length_exceeded"


def test_api_key_guards_v1_only(server):
    anonymous = httpx.Client(base_url=server.url, timeout=10)
    body = {"model": "builtin", "prompt": "hi", "max_tokens": 1}
    assert _error(anonymous.post("/v1/completions", json=body), 401)["code"] == "invalid_api_key"
    wrong = anonymous.post("/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
    _error(wrong, 401)
    _error(anonymous.get("/v1/models"), 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).models.list()
    for path in ("/health", "/ready", "/metrics", "/openapi.json"):
        assert anonymous.get(path).status_code == 200, path
    anonymous.close()


def test_unknown_model_is_404(server, sdk):
    with pytest.raises(openai.NotFoundError) as info:
        sdk.chat.completions.create(model="gpt-9", messages=CHAT, max_tokens=1)
    assert _error(info.value.response, 404)["code"] == "model_not_found"


def test_body_over_limit_is_413(server):
    body = {"model": "builtin", "prompt": "y" * (70 * 1024), "max_tokens": 1}
    error = _error(server.client.post("/v1/completions", json=body), 413)
    assert "65536 bytes" in error["message"]
    rejected = [e for e in server.logs.events("request.rejected") if "65536" in e["message"]]
    assert rejected and rejected[-1]["reason"] == "invalid"


def test_unknown_route_is_404_in_openai_shape(server):
    _error(server.client.get("/v1/nothing-here"), 404)


def test_health_ready_and_openapi(server):
    assert server.client.get("/health").status_code == 200
    assert server.client.get("/ready").text == "ready\n"
    paths = server.client.get("/openapi.json").json()["paths"]
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models"} <= set(paths)


@pytest.mark.parametrize("extra, status", [
    ({"temperature": 1e-300}, 200),  # greedy, as vLLM treats temperatures under 1e-5
    ({"top_p": 1e-323}, 200),  # the top token is always kept
    ({"seed": 2**70}, 400),  # beyond int64
    ({"top_k": -1, "seed": 7}, 200),  # vLLM's "top_k disabled"
])
def test_sampling_edge_values_never_fail_the_engine(server, extra, status):
    body = {"model": "builtin", "prompt": "edge", "max_tokens": 2, **extra}
    response = server.client.post("/v1/completions", json=body)
    assert response.status_code == status, response.text
    if status == 200:
        assert response.json()["choices"][0]["finish_reason"] in ("length", "stop")


def _post_raw(server, path: str, body: dict) -> httpx.Response:
    """json.dumps escapes a lone surrogate as \\udXXX (httpx's own encoder cannot encode one at all)."""
    return server.client.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize("path, extra, param", [
    ("/v1/completions", {"prompt": "bad \ud83d text"}, "prompt"),
    ("/v1/completions", {"prompt": ["bad \udc00"]}, "prompt.0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "ok"},
                                           {"role": "user", "content": "x\ud83d"}]}, "messages.1.content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
     "messages.0.content.0.text"),
    ("/v1/completions", {"prompt": "fine", "stop": ["ok", "\udfff"]}, "stop.1"),
])
def test_lone_surrogate_is_400_naming_the_field(server, path, extra, param):
    before = len(server.logs.events("engine.error"))
    error = _error(_post_raw(server, path, {"model": "builtin", "max_tokens": 2, **extra}), 400)
    assert error["param"] == param and error["message"].startswith(f"{param} holds a lone UTF-16 surrogate")
    assert len(server.logs.events("engine.error")) == before  # refused, not failed


@pytest.mark.parametrize("extra, param, fragment", [
    ({"max_tokens": "16"}, "max_tokens", "valid integer"),
    ({"max_tokens": True}, "max_tokens", "valid integer"),
    ({"max_tokens": 16.5}, "max_tokens", "valid integer"),
    ({"stream": "yes"}, "stream", "valid boolean"),
    ({"temperature": "0.5"}, "temperature", "valid number"),
    ({"temperature": float("nan")}, "temperature", "NaN is not a number"),
    ({"top_p": float("inf")}, "top_p", "inf is not a finite number"),
    ({"presence_penalty": 5}, "presence_penalty", "less than or equal to 2"),
    ({"frequency_penalty": -2.5}, "frequency_penalty", "greater than or equal to -2"),
    ({"stop": ["a", 3]}, "stop.1", "valid string"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "text": "x"}]}]},
     "messages.0.content.0.type", "'text'"),
])
def test_json_types_are_strict_as_openai_schema(server, extra, param, fragment):
    body = {"model": "builtin", "messages": CHAT, "max_tokens": 2, **extra}
    error = _error(_post_raw(server, "/v1/chat/completions", body), 400)
    assert error["param"] == param and error["message"].startswith(f"{param}: ")
    assert fragment in error["message"], error["message"]


def test_integral_numbers_stay_numbers(server):
    """An integer where OpenAI's schema says number is a number (temperature 1 is 1.0)."""
    body = {"model": "builtin", "prompt": "x", "max_tokens": 1, "temperature": 1, "top_p": 1, "presence_penalty": 0}
    assert _post_raw(server, "/v1/completions", body).status_code == 200


def test_stop_strings_stay_out_of_the_logs(server):
    body = {"model": "builtin", "prompt": "x", "max_tokens": 2, "stop": ["SECRET-STOP-STRING", ""]}
    error = _error(_post_raw(server, "/v1/completions", body), 400)
    assert error["param"] == "stop" and "SECRET" not in error["message"]
    assert server.logs.events("request.rejected")[-1]["reason"] == "invalid"
    assert not [line for line in server.logs.lines if "SECRET-STOP-STRING" in line]
