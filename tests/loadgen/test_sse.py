"""SSE framing and token timing: exact TTFT, ITL and usage from bytes fed at known times."""

import json

import pytest

from loadgen.sse import SSEParser


def event(payload) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def chat(content: str | None, finish: str | None = None, role: bool = False) -> bytes:
    delta = {} if content is None else {"content": content}
    if role:
        delta["role"] = "assistant"
    return event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


USAGE = event({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3,
                                        "prompt_tokens_details": {"cached_tokens": 8}}})


def test_ttft_skips_role_and_empty_chunks_and_itl_is_every_content_gap():
    parser = SSEParser()
    parser.feed(chat("", role=True), 0.010)
    parser.feed(chat(None), 0.050)
    assert parser.feed(chat("Hel"), 0.200) == 1
    parser.feed(chat("lo"), 0.250)
    parser.feed(chat("!"), 0.330)
    parser.feed(chat(None, finish="length") + USAGE, 0.331)
    parser.feed(event("[DONE]"), 0.332)
    s = parser.state
    assert s.first_ts == 0.200
    assert s.last_ts == 0.330
    assert s.itl_s == pytest.approx([0.050, 0.080])
    assert s.num_chunks == 3
    assert (s.prompt_tokens, s.completion_tokens, s.cached_tokens) == (12, 3, 8)
    assert s.finish_reason == "length"
    assert s.done and s.error is None
    assert s.text == "Hello!"


def test_events_split_across_reads_and_crlf_are_framed_once():
    parser = SSEParser()
    raw = chat("a") + chat("b")
    parser.feed(raw[:7], 1.0)
    parser.feed(raw[7:30].replace(b"\n", b"\r\n"), 1.1)
    parser.feed(raw[30:], 1.2)
    assert parser.state.num_chunks == 2
    assert parser.state.first_ts in (1.1, 1.2)
    assert parser.state.text == "ab"


def test_completions_text_and_comments():
    parser = SSEParser()
    parser.feed(b": keep-alive\n\n", 0.1)
    parser.feed(event({"choices": [{"index": 0, "text": " x", "finish_reason": None}]}), 0.3)
    parser.feed(event({"choices": [{"index": 0, "text": " y", "finish_reason": "stop"}]}), 0.4)
    assert parser.state.first_ts == 0.3
    assert parser.state.itl_s == pytest.approx([0.1])
    assert parser.state.finish_reason == "stop"
    assert not parser.state.done


def test_error_event_is_recorded_with_its_message():
    parser = SSEParser()
    parser.feed(chat("a"), 0.1)
    parser.feed(event({"error": {"message": "CUDA out of memory", "type": "internal_error"}}), 0.2)
    parser.feed(event("[DONE]"), 0.3)
    assert parser.state.error == "CUDA out of memory"
    assert parser.state.done


def test_unreadable_event_and_last_event_without_blank_line():
    parser = SSEParser()
    parser.feed(b"data: {not json\n\n", 0.1)
    assert parser.state.error.startswith("unreadable SSE event")
    parser = SSEParser()
    parser.feed(b"data: [DONE]", 0.2)
    assert not parser.state.done
    parser.close(0.3)
    assert parser.state.done


def test_reasoning_content_counts_as_first_token():
    parser = SSEParser()
    parser.feed(event({"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]}), 0.4)
    assert parser.state.first_ts == 0.4
