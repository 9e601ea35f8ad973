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


MIXED = (b": keep-alive\r\n\r\n" + chat("", role=True).replace(b"\n", b"\r\n") + b"\n\n"
         + b"event: delta\nid: 3\nretry: 10\ndata:" + json.dumps({"choices": [{"delta": {"content": "A"}}]}).encode()
         + b"\n\n" + b'data: {"choices": [{"delta":\ndata:  {"content": "B"}}]}\r\n\r\n'
         + b":ping\n\n" + chat("C") + USAGE + event("[DONE]"))


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, len(MIXED)])
def test_any_split_of_the_bytes_gives_the_same_stream(size):
    parser = SSEParser()
    for i in range(0, len(MIXED), size):
        parser.feed(MIXED[i:i + size], float(i))
    parser.close(float(len(MIXED)))
    s = parser.state
    assert s.text == "ABC" and s.num_chunks == 3 and s.done and s.error is None
    assert (s.prompt_tokens, s.completion_tokens, s.cached_tokens) == (12, 3, 8)
    # Each event counts at the feed that brought its blank line: the last byte of "\n\n".
    ends = [MIXED.index(blank, MIXED.index(marker)) + len(blank) - 1
            for marker, blank in ((b'"A"', b"\n\n"), (b'"B"', b"\r\n\r\n"), (b'"C"', b"\n\n"))]
    stamps = [float(end - end % size) for end in ends]
    assert s.first_ts == stamps[0] and s.itl_s == pytest.approx([stamps[1] - stamps[0], stamps[2] - stamps[1]])


def test_a_cr_at_the_end_of_a_read_pairs_with_the_next_lf():
    parser = SSEParser()
    raw = chat("x").replace(b"\n", b"\r\n")
    assert parser.feed(raw[:-1], 1.0) == 0  # "...\r\n\r": the blank line is not complete yet
    assert parser.feed(raw[-1:], 2.0) == 1 and parser.state.first_ts == 2.0


def test_error_event_mid_stream_and_non_object_events():
    parser = SSEParser()
    parser.feed(chat("a") + event({"error": "overloaded"}) + event([1, 2]), 0.1)
    assert parser.state.error == "overloaded" and parser.state.num_chunks == 1
    parser = SSEParser()
    parser.feed(event([1, 2]), 0.1)
    assert parser.state.error.startswith("SSE event is not an object")


def test_invalid_utf8_is_replaced_not_fatal():
    parser = SSEParser()
    parser.feed(b'data: {"choices": [{"delta": {"content": "\xff!"}}]}\n\n', 0.1)
    assert parser.state.text == "\ufffd!" and parser.state.error is None


def test_stop_at_leaves_the_events_after_the_nth_content_chunk_unread():
    parser = SSEParser()
    assert parser.feed(chat("a") + chat("b") + chat("c") + USAGE, 0.1, stop_at=2) == 2
    assert parser.state.text == "ab" and parser.state.completion_tokens is None
