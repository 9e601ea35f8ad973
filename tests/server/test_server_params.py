"""Every OpenAI parameter honoured or refused, through the openai SDK; bodies checked against OpenAI's schemas."""

import json
import threading

import openai
import pytest
from openai_schemas import check

CHAT = [{"role": "user", "content": "Tell me about paged attention."}]
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


def _joined(entries) -> str:
    """The text a run of logprob entries spells, from their bytes (a character may span tokens)."""
    return b"".join(bytes(e.bytes) for e in entries).decode("utf-8", errors="replace")


def test_chat_logprobs_match_the_returned_tokens(sdk):
    raw = sdk.chat.completions.with_raw_response.create(model="builtin", messages=CHAT, max_tokens=8,
                                                        logprobs=True, top_logprobs=3, **GREEDY)
    check("CreateChatCompletionResponse", json.loads(raw.text))
    response = raw.parse()
    choice = response.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == response.usage.completion_tokens == 8
    assert _joined(entries) == choice.message.content
    for entry in entries:  # greedy: the chosen token is the most likely, and listed first
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == entry.logprob <= 0
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
    plain = sdk.chat.completions.create(model="builtin", messages=CHAT, max_tokens=8, **GREEDY)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == choice.message.content


def test_chat_logprobs_stream_with_their_tokens(sdk):
    chunks = list(sdk.chat.completions.create(model="builtin", messages=CHAT, max_tokens=10, logprobs=True,
                                              stream=True, stream_options={"include_usage": True}, **GREEDY))
    for chunk in chunks:
        check("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(entries) == chunks[-1].usage.completion_tokens == 10
    assert _joined(entries) == text and all(e.top_logprobs == [] for e in entries)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_in_the_legacy_shape(server, sdk, stream):
    kw = {"model": "builtin", "prompt": "Paged attention", "max_tokens": 6, "logprobs": 2, **GREEDY}
    if stream:
        chunks = list(sdk.completions.create(stream=True, **kw))
        tokens = [t for c in chunks for t in (c.choices[0].logprobs.tokens if c.choices[0].logprobs else [])]
        offsets = [o for c in chunks for o in (c.choices[0].logprobs.text_offset if c.choices[0].logprobs else [])]
        text = "".join(c.choices[0].text for c in chunks)
    else:
        raw = server.client.post("/v1/completions", json={**{k: v for k, v in kw.items() if k != "extra_body"},
                                                          "ignore_eos": True})
        check("CreateCompletionResponse", raw.json())
        logprobs = sdk.completions.create(**kw).choices[0].logprobs
        assert raw.json()["choices"][0]["logprobs"] == logprobs.model_dump()
        tokens, offsets, text = logprobs.tokens, logprobs.text_offset, raw.json()["choices"][0]["text"]
        for token, value, top in zip(tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
            assert len(top) == 2 and top[token] == value == max(top.values())
    assert len(tokens) == 6 and offsets == [sum(len(t) for t in tokens[:i]) for i in range(6)]
    if all(not t.startswith("bytes:") for t in tokens):
        assert "".join(tokens) == text


def test_n_gives_n_choices_and_counts_their_tokens(server, sdk):
    response = sdk.chat.completions.create(model="builtin", messages=CHAT, max_tokens=5, n=3, seed=11,
                                           temperature=1.0, extra_body={"ignore_eos": True})
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert response.usage.completion_tokens == 15 and all(c.finish_reason == "length" for c in response.choices)
    assert len({c.message.content for c in response.choices}) > 1  # seed, seed + 1, seed + 2
    again = sdk.chat.completions.create(model="builtin", messages=CHAT, max_tokens=5, n=3, seed=11,
                                        temperature=1.0, extra_body={"ignore_eos": True})
    assert [c.message.content for c in again.choices] == [c.message.content for c in response.choices]
    chunks = list(sdk.completions.create(model="builtin", prompt="Two", max_tokens=4, n=2, stream=True,
                                         stream_options={"include_usage": True}, **GREEDY))
    by_index = {0: "", 1: ""}
    for chunk in chunks[:-1]:
        by_index[chunk.choices[0].index] += chunk.choices[0].text
    finals = [c.choices[0].index for c in chunks[:-1] if c.choices[0].finish_reason == "length"]
    assert sorted(finals) == [0, 1] and by_index[0] == by_index[1] and chunks[-1].usage.completion_tokens == 8
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(model="builtin", prompt="x", max_tokens=1, n=9)
    assert info.value.body["param"] == "n"


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
])
def test_what_llmserve_does_not_do_is_a_400_naming_it(server, sdk, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="builtin", messages=CHAT, max_tokens=1, extra_body=extra)
    body = info.value.response.json()
    check("ErrorResponse", body)
    assert body["error"]["param"] == param and f"{param}" in body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error"


def test_completions_refuse_suffix_and_echo_with_logprobs(sdk):
    for extra, param in (({"suffix": "end"}, "suffix"), ({"best_of": 3}, "best_of"),
                         ({"echo": True, "logprobs": 1}, "echo")):
        with pytest.raises(openai.BadRequestError) as info:
            sdk.completions.create(model="builtin", prompt="x", max_tokens=1, extra_body=extra)
        assert info.value.body["param"] == param


def test_harmless_and_unknown_fields_are_accepted(sdk):
    response = sdk.chat.completions.create(
        model="builtin", messages=CHAT, max_tokens=2, response_format={"type": "text"}, modalities=["text"],
        store=False, metadata={"team": "sre"}, user="u1", extra_body={"not_an_openai_field": {"x": 1}})
    assert response.choices[0].finish_reason in ("length", "stop")


def test_echo_puts_the_prompt_before_the_answer(sdk):
    plain = sdk.completions.create(model="builtin", prompt="Echo me", max_tokens=4, **GREEDY).choices[0].text
    echoed = sdk.completions.create(model="builtin", prompt="Echo me", max_tokens=4, echo=True, **GREEDY)
    assert echoed.choices[0].text == "Echo me" + plain
    chunks = list(sdk.completions.create(model="builtin", prompt="Echo me", max_tokens=4, echo=True, stream=True,
                                         **GREEDY))
    assert chunks[0].choices[0].text == "Echo me" and "".join(c.choices[0].text for c in chunks) == "Echo me" + plain


def test_logit_bias_min_tokens_and_stop_token_ids(server, sdk):
    eos = server.state.llm.eos_token_id
    forced = sdk.chat.completions.create(model="builtin", messages=CHAT, max_tokens=6, temperature=0,
                                         logit_bias={"65": 100}, extra_body={"ignore_eos": True})
    assert forced.choices[0].message.content == "AAAAAA"
    early = sdk.completions.create(model="builtin", prompt="x", max_tokens=20, temperature=0,
                                   logit_bias={str(eos): 100}, extra_body={"min_tokens": 5})
    assert early.usage.completion_tokens == 6 and early.choices[0].finish_reason == "stop"
    assert len(early.choices[0].text.encode("utf-8", errors="replace")) >= 5
    stopped = sdk.completions.create(model="builtin", prompt="x", max_tokens=20, temperature=0,
                                     logit_bias={"66": 100}, extra_body={"stop_token_ids": [66], "ignore_eos": True})
    assert (stopped.choices[0].text, stopped.choices[0].finish_reason, stopped.usage.completion_tokens) == \
        ("", "stop", 1)


def test_penalties_change_the_answer(sdk):
    def answer(**extra):
        return sdk.completions.create(model="builtin", prompt="Repeat", max_tokens=24, temperature=0,
                                      extra_body={"ignore_eos": True, **extra.pop("extra_body", {})},
                                      **extra).choices[0].text

    plain = answer()
    assert len(set(plain)) < len(plain)  # greedy, the builtin model repeats itself
    assert answer(frequency_penalty=2.0) != plain
    assert answer(presence_penalty=2.0) != plain
    repetition = answer(extra_body={"repetition_penalty": 50.0})
    assert repetition != plain and len(set(repetition)) > len(set(plain))
    with pytest.raises(openai.BadRequestError) as info:
        answer(presence_penalty=2.5)
    assert info.value.body["param"] == "presence_penalty"


def test_a_batch_mixes_requests_with_different_parameters(server):
    """Concurrent requests, each biased to its own token: every one gets its own, none its neighbour's."""
    results = {}

    def one(token: int) -> None:
        body = {"model": "builtin", "prompt": "batch", "max_tokens": 16, "temperature": 0, "ignore_eos": True,
                "logit_bias": {str(token): 100}}
        with server.client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: {")]
        results[token] = "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines)

    tokens = [ord(c) for c in "WXYZ"]
    threads = [threading.Thread(target=one, args=(t,)) for t in tokens]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {t: chr(t) * 16 for t in tokens}
