"""Traces: a span per request with queue/prefill/decode children, GenAI attributes, traceparent honoured."""

from opentelemetry.trace import SpanKind

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def test_request_span_has_children_and_genai_attributes(server):
    server.spans.clear()
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    body = {"model": "builtin", "messages": [{"role": "user", "content": "trace me"}], "max_tokens": 4,
            "ignore_eos": True, "temperature": 0}
    assert server.client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
    spans = {span.name: span for span in server.spans.get_finished_spans()}
    root = spans["chat builtin"]
    assert root.kind is SpanKind.SERVER
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert format(root.parent.span_id, "016x") == PARENT_ID
    attrs = root.attributes
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == "builtin"
    assert attrs["gen_ai.usage.output_tokens"] == 4 and attrs["gen_ai.usage.input_tokens"] > 0
    assert tuple(attrs["gen_ai.response.finish_reasons"]) == ("length",)
    assert attrs["gen_ai.latency.time_to_first_token"] > 0
    for name in ("queue", "prefill", "decode"):
        child = spans[name]
        assert child.parent.span_id == root.context.span_id
        assert root.start_time <= child.start_time <= child.end_time <= root.end_time
    assert spans["queue"].end_time <= spans["prefill"].start_time + 1000
    assert spans["prefill"].end_time <= spans["decode"].start_time + 1000


def test_stream_without_traceparent_starts_a_new_trace(server):
    server.spans.clear()
    body = {"model": "builtin", "prompt": "hello", "max_tokens": 2, "stream": True}
    with server.client.stream("POST", "/v1/completions", json=body) as response:
        assert [line for line in response.iter_lines() if line.startswith("data: ")][-1] == "data: [DONE]"
    (root,) = [s for s in server.spans.get_finished_spans() if s.name == "text_completion builtin"]
    assert root.parent is None and root.attributes["gen_ai.operation.name"] == "text_completion"


def test_cut_stream_is_traced_as_abort(server):
    server.spans.clear()
    body = {"model": "builtin", "prompt": "cut me", "max_tokens": 300, "ignore_eos": True, "stream": True}
    with server.client.stream("POST", "/v1/completions", json=body) as response:
        next(line for line in response.iter_lines() if line.startswith("data: "))

    def root_spans():
        return [s for s in server.spans.get_finished_spans() if s.name == "text_completion builtin"]

    server.wait_for(root_spans, what="the aborted request's span")
    assert tuple(root_spans()[0].attributes["gen_ai.response.finish_reasons"]) == ("abort",)
