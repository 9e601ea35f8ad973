"""Units at the edges: the one exception mapping, the OTLP/HTTP exporter, the docs' metric reference,
the SSE text-event template."""

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from engine import errors
from engine.obs.metrics import SPECS
from engine.obs.stats import RequestStats
from engine.obs.tracing import RequestTracer, SpanInfo, make_tracer_provider
from engine.server import protocol as p
from engine.server.cli import torch_threads
from engine.server.errors import APIError, BodyTooLarge, NotReady, RequestTimeout, map_exception
from engine.server.serving import CHAT, COMPLETION
from engine.server.streaming import sse, text_event_template

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("exc, status, reason", [
    (errors.PromptTooLongError(500, 20, 512), 400, "prompt_too_long"),
    (errors.InvalidRequestError("bad top_p", param="top_p"), 400, "invalid"),
    (errors.QueueFullError("full"), 429, "queue_full"),
    (errors.EngineDeadError("dead"), 503, "not_ready"),
    (NotReady("draining"), 503, "not_ready"),
    (BodyTooLarge("big"), 413, "invalid"),
    (RequestTimeout("slow"), 504, None),
    (APIError("engine failed"), 500, None),
    (KeyError("secret detail"), 500, None),
])
def test_one_mapping_from_exception_to_status(exc, status, reason):
    mapped = map_exception(exc)
    assert (mapped.status, mapped.reject_reason) == (status, reason)
    assert set(mapped.body["error"]) == {"message", "type", "param", "code"}
    if status == 429:
        assert mapped.headers == {"Retry-After": "1"}
    if isinstance(exc, KeyError):
        assert "secret" not in mapped.body["error"]["message"]  # details only in the log


class _Collector(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Collector.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_otlp_http_exporter_posts_the_request_span():
    collector = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    try:
        provider = make_tracer_provider(f"http://127.0.0.1:{collector.server_port}")
        tracer = RequestTracer(provider)
        now = time.monotonic()
        stats = RequestStats(arrival_ts=now - 0.5, first_scheduled_ts=now - 0.4, first_token_ts=now - 0.3,
                             token_ts=[now - 0.3, now - 0.1], finished_ts=now, num_prompt_tokens=7,
                             num_output_tokens=2, finish_reason="length")
        tracer.record(SpanInfo("cmpl-1", "text_completion", "builtin", 2, 1.0, 1.0, None), stats, "length")
        provider.force_flush()
    finally:
        collector.shutdown()
    (path, content_type, body) = _Collector.received[-1]
    assert path == "/v1/traces" and content_type == "application/x-protobuf"
    request = ExportTraceServiceRequest.FromString(body)
    spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert sorted(s.name for s in spans) == ["decode", "prefill", "queue", "text_completion builtin"]


def test_docs_reference_every_metric():
    text = (REPO / "docs" / "serving.md").read_text()
    missing = [spec.name for spec in SPECS if f"`{spec.name}" not in text]
    assert missing == []


@pytest.mark.parametrize("operation", [CHAT, COMPLETION])
@pytest.mark.parametrize("text", ["a", " the", "", 'say "hi"\\n', "line\nbreak\ttab\x00\x1f", "é中文🙂", "\ud800"])
def test_text_event_template_is_byte_identical_to_the_dict_event(operation, text):
    rid, model, created = "cmpl-0123abcd", 'my "model"\\', 1764450000
    head, tail = text_event_template(operation, rid, model, created)
    if operation == CHAT:
        expected = sse(p.chat_chunk(rid, model, created, {"content": text}, None))
    else:
        expected = sse(p.completion_response(rid, model, created, text, None, None))
    assert head + json.dumps(text) + tail == expected


def test_torch_threads_leave_a_core_to_the_event_loop_on_cpu_only():
    assert torch_threads(None, "cpu") == max(1, len(os.sched_getaffinity(0)) - 1)
    assert torch_threads(3, "cpu") == 3
    assert torch_threads(None, "cuda") is None and torch_threads(None, "cuda:1") is None
    assert torch_threads(2, "cuda") == 2
