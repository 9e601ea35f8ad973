"""OpenTelemetry sink: one span per request with queue / prefill / decode children (GenAI semconv)."""

import time
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import extract
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from engine.obs.stats import RequestStats

SERVICE_NAME = "llmserve"


def make_tracer_provider(endpoint: str | None = None, exporter: SpanExporter | None = None,
                         processor: SpanProcessor | None = None) -> TracerProvider | None:
    """A provider exporting over OTLP/HTTP to `endpoint`, or to a given exporter/processor (tests)."""
    if endpoint is None and exporter is None and processor is None:
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
    if processor is not None:
        provider.add_span_processor(processor)
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    if endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        if not endpoint.rstrip("/").endswith("/v1/traces"):
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


@dataclass(slots=True)
class SpanInfo:
    """What the server knows about a request besides its engine timestamps."""

    request_id: str
    operation: str  # "chat" or "text_completion"
    model: str
    max_tokens: int
    temperature: float
    top_p: float
    parent: Context | None


class RequestTracer:
    """Records each finished request as spans, back-dated from the engine's monotonic timestamps."""

    def __init__(self, provider: TracerProvider):
        self.provider = provider
        self.tracer = provider.get_tracer("llmserve")

    @staticmethod
    def extract_parent(headers) -> Context | None:
        """An incoming W3C traceparent becomes the request span's parent."""
        carrier = {k.lower(): v for k, v in headers.items()}
        return extract(carrier) if "traceparent" in carrier else None

    def record(self, info: SpanInfo, rs: RequestStats | None, finish_reason: str | None,
               error: str | None = None, end_ts: float | None = None) -> None:
        offset_ns = time.time_ns() - time.monotonic_ns()

        def wall(ts: float) -> int:
            return int(ts * 1e9) + offset_ns

        now = time.monotonic()
        start = rs.arrival_ts if rs is not None else now
        end = (rs.finished_ts if rs is not None and rs.finished_ts is not None else end_ts) or now
        attrs = {
            "gen_ai.operation.name": info.operation,
            "gen_ai.provider.name": "llmsre",
            "gen_ai.request.model": info.model,
            "gen_ai.response.model": info.model,
            "gen_ai.request.id": info.request_id,
            "gen_ai.request.max_tokens": info.max_tokens,
            "gen_ai.request.temperature": info.temperature,
            "gen_ai.request.top_p": info.top_p,
            "gen_ai.response.finish_reasons": [finish_reason or "error"],
        }
        if rs is not None:
            attrs["gen_ai.usage.input_tokens"] = rs.num_prompt_tokens
            attrs["gen_ai.usage.output_tokens"] = rs.num_output_tokens
            attrs["gen_ai.usage.cached_tokens"] = rs.num_cached_tokens
            for key, value in (("gen_ai.latency.time_to_first_token", rs.ttft_s),
                               ("gen_ai.latency.time_in_queue", rs.queue_s),
                               ("gen_ai.latency.e2e", rs.e2e_s)):
                if value is not None:
                    attrs[key] = value
        span = self.tracer.start_span(f"{info.operation} {info.model}", context=info.parent,
                                      kind=SpanKind.SERVER, start_time=wall(start), attributes=attrs)
        if finish_reason == "error" or error:
            span.set_status(Status(StatusCode.ERROR, error or "error"))
            span.set_attribute("error.type", "engine_error" if finish_reason == "error" else "_OTHER")
        if rs is not None:
            ctx = trace.set_span_in_context(span)
            for name, lo, hi in (("queue", rs.arrival_ts, rs.first_scheduled_ts),
                                 ("prefill", rs.first_scheduled_ts, rs.first_token_ts),
                                 ("decode", rs.first_token_ts, rs.token_ts[-1] if rs.token_ts else None)):
                if lo is not None and hi is not None:
                    child = self.tracer.start_span(name, context=ctx, start_time=wall(lo))
                    child.end(end_time=wall(max(hi, lo)))
        span.end(end_time=wall(max(end, start)))

    def shutdown(self) -> None:
        self.provider.shutdown()
