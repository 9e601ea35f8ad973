"""Server metric definitions (names, help, buckets: the one source of truth) and the Prometheus sink."""

from dataclasses import dataclass
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily

from engine.core.outputs import FinishReason, RequestOutput
from engine.obs.stats import RequestStats, StepStats

# Buckets are finer than vLLM's at the low end (its 0.3 s latency floor is a known complaint)
# and a superset of vLLM's above, so its dashboards' quantiles re-aggregate.
TTFT_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                         0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0,
                           15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"
    INFO = "info"


@dataclass(slots=True, frozen=True)
class MetricSpec:
    name: str  # as exposed (counters with _total, info with _info)
    kind: Kind
    help: str
    labels: tuple[str, ...] = ("model",)
    buckets: tuple[float, ...] | None = None


_REQ = ("model", "finish_reason")
SPECS: tuple[MetricSpec, ...] = (
    MetricSpec("llm_requests_running", Kind.GAUGE, "Requests in the running batch."),
    MetricSpec("llm_requests_waiting", Kind.GAUGE, "Requests waiting to be scheduled."),
    MetricSpec("llm_kv_cache_blocks_capacity", Kind.GAUGE, "KV cache blocks in the pool."),
    MetricSpec("llm_kv_cache_blocks_used", Kind.GAUGE,
               "KV cache blocks held by live requests (0 when idle, even with a warm prefix cache)."),
    MetricSpec("llm_kv_cache_blocks_cached", Kind.GAUGE, "Free KV cache blocks holding a cached prefix."),
    MetricSpec("llm_kv_cache_usage_ratio", Kind.GAUGE, "Blocks used over blocks total, 0 to 1."),
    MetricSpec("llm_engine_ready", Kind.GAUGE,
               "1 when the model is loaded, the engine loop alive and the server not draining."),
    MetricSpec("llm_prefix_cache_queried_tokens_total", Kind.COUNTER,
               "Prompt tokens looked up in the prefix cache."),
    MetricSpec("llm_prefix_cache_hit_tokens_total", Kind.COUNTER, "Prompt tokens served from the prefix cache."),
    MetricSpec("llm_preemptions_total", Kind.COUNTER, "Requests preempted (KV blocks freed, recomputed later)."),
    MetricSpec("llm_prompt_tokens_total", Kind.COUNTER,
               "Prompt tokens computed (prefill work: cache hits excluded, recomputation included)."),
    MetricSpec("llm_generation_tokens_total", Kind.COUNTER, "Output tokens generated."),
    MetricSpec("llm_requests_finished_total", Kind.COUNTER,
               "Requests finished, by finish_reason (stop, length, abort, error).", _REQ),
    MetricSpec("llm_requests_rejected_total", Kind.COUNTER,
               "Requests refused before reaching the engine, by reason.", ("model", "reason")),
    MetricSpec("llm_http_requests_total", Kind.COUNTER, "HTTP responses by route and status code.",
               ("model", "route", "status")),
    MetricSpec("llm_time_to_first_token_seconds", Kind.HISTOGRAM,
               "Arrival to first output token (queue + prefill).", _REQ, TTFT_BUCKETS),
    MetricSpec("llm_inter_token_latency_seconds", Kind.HISTOGRAM,
               "Time between consecutive output tokens of a request.", _REQ, TOKEN_LATENCY_BUCKETS),
    MetricSpec("llm_time_per_output_token_seconds", Kind.HISTOGRAM,
               "Per request: decode time over output tokens after the first.", _REQ, TOKEN_LATENCY_BUCKETS),
    MetricSpec("llm_e2e_request_latency_seconds", Kind.HISTOGRAM,
               "Arrival to finish of a request.", _REQ, REQUEST_LATENCY_BUCKETS),
    MetricSpec("llm_request_queue_time_seconds", Kind.HISTOGRAM,
               "Arrival to first scheduling.", _REQ, REQUEST_LATENCY_BUCKETS),
    MetricSpec("llm_request_prefill_time_seconds", Kind.HISTOGRAM,
               "First scheduling to first token.", _REQ, REQUEST_LATENCY_BUCKETS),
    MetricSpec("llm_request_decode_time_seconds", Kind.HISTOGRAM,
               "First token to last token.", _REQ, REQUEST_LATENCY_BUCKETS),
    MetricSpec("llm_engine_step_duration_seconds", Kind.HISTOGRAM,
               "Wall time of one engine step.", ("model",), STEP_BUCKETS),
    MetricSpec("llm_batch_size", Kind.HISTOGRAM, "Sequences in one engine step.", ("model",), BATCH_BUCKETS),
    MetricSpec("llm_engine_info", Kind.INFO, "Static facts about the engine.",
               ("model", "model_digest", "block_size", "prefix_caching", "max_model_len", "dtype", "device",
                "version", "max_num_seqs", "max_num_batched_tokens")),
)
SPEC_BY_NAME = {spec.name: spec for spec in SPECS}
_STEP_SERIES = ("llm_requests_running", "llm_requests_waiting", "llm_kv_cache_blocks_capacity",
                 "llm_kv_cache_blocks_used", "llm_kv_cache_blocks_cached", "llm_kv_cache_usage_ratio",
                 "llm_prefix_cache_queried_tokens_total", "llm_prefix_cache_hit_tokens_total",
                 "llm_preemptions_total", "llm_prompt_tokens_total", "llm_generation_tokens_total",
                 "llm_engine_step_duration_seconds", "llm_batch_size")
FINISH_REASONS = tuple(reason.value for reason in FinishReason)
REJECT_REASONS = ("queue_full", "prompt_too_long", "invalid", "unauthorized", "not_ready")


def _build(spec: MetricSpec, registry: CollectorRegistry):
    if spec.kind is Kind.GAUGE:
        return Gauge(spec.name, spec.help, spec.labels, registry=registry)
    if spec.kind is Kind.COUNTER:
        return Counter(spec.name.removesuffix("_total"), spec.help, spec.labels, registry=registry)
    if spec.kind is Kind.HISTOGRAM:
        return Histogram(spec.name, spec.help, spec.labels, buckets=spec.buckets, registry=registry)
    return Info(spec.name.removesuffix("_info"), spec.help, registry=registry)


class _ReadyCollector:
    """Reads readiness at scrape time, so a dead loop or a drain shows on the next scrape."""

    def __init__(self, model: str, is_ready):
        self.model = model
        self.is_ready = is_ready

    def collect(self):
        spec = SPEC_BY_NAME["llm_engine_ready"]
        family = GaugeMetricFamily(spec.name, spec.help, labels=["model"])
        family.add_metric([self.model], 1.0 if self.is_ready() else 0.0)
        yield family


class PrometheusSink:
    """Turns StepStats and finished RequestStats into the metrics of SPECS (a step listener)."""

    def __init__(self, model: str, info: dict[str, str], is_ready, registry: CollectorRegistry | None = None):
        self.model = model
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.m = {spec.name: _build(spec, self.registry) for spec in SPECS if spec.name != "llm_engine_ready"}
        self.registry.register(_ReadyCollector(model, is_ready))
        self.m["llm_engine_info"].info({"model": model, **info})
        for reason in FINISH_REASONS:
            self.m["llm_requests_finished_total"].labels(model, reason)
        for reason in REJECT_REASONS:
            self.m["llm_requests_rejected_total"].labels(model, reason)
        for name in ("llm_requests_running", "llm_requests_waiting", "llm_kv_cache_blocks_used",
                     "llm_kv_cache_blocks_cached", "llm_kv_cache_usage_ratio"):
            self.m[name].labels(model).set(0)
        # Per-step series resolved once: labels() validates and locks on every call, in the step thread.
        self._step_series = {name: self.m[name].labels(model) for name in _STEP_SERIES}

    def _one(self, name: str):
        return self.m[name].labels(self.model)

    def set_blocks_capacity(self, num_blocks: int) -> None:
        self._one("llm_kv_cache_blocks_capacity").set(num_blocks)

    def on_step(self, stats: StepStats | None, outputs: list[RequestOutput]) -> None:
        if stats is not None:
            self._observe_step(stats)
        for output in outputs:
            if output.finished:
                self.observe_finished(output)

    def _observe_step(self, s: StepStats) -> None:
        m = self._step_series
        m["llm_requests_running"].set(s.num_running)
        m["llm_requests_waiting"].set(s.num_waiting)
        m["llm_kv_cache_blocks_capacity"].set(s.num_blocks_total)
        m["llm_kv_cache_blocks_used"].set(s.num_blocks_used)
        m["llm_kv_cache_blocks_cached"].set(s.num_blocks_cached)
        m["llm_kv_cache_usage_ratio"].set(s.kv_usage)
        m["llm_prefix_cache_queried_tokens_total"].inc(s.prefix_queried_tokens)
        m["llm_prefix_cache_hit_tokens_total"].inc(s.prefix_hit_tokens)
        m["llm_preemptions_total"].inc(s.num_preemptions)
        m["llm_prompt_tokens_total"].inc(s.num_prompt_tokens_computed)
        m["llm_generation_tokens_total"].inc(s.num_generation_tokens)
        if s.batch_size:
            m["llm_engine_step_duration_seconds"].observe(s.step_duration_s)
            m["llm_batch_size"].observe(s.batch_size)

    def observe_finished(self, output: RequestOutput) -> None:
        """Every finished request is observed, aborted and failed ones too, labelled by reason."""
        reason = output.finish_reason.value if output.finish_reason else FinishReason.ERROR.value
        self.m["llm_requests_finished_total"].labels(self.model, reason).inc()
        rs: RequestStats | None = output.metrics  # type: ignore[assignment]
        if rs is None:
            return
        for name, value in (
            ("llm_time_to_first_token_seconds", rs.ttft_s),
            ("llm_time_per_output_token_seconds", rs.tpot_s),
            ("llm_e2e_request_latency_seconds", rs.e2e_s),
            ("llm_request_queue_time_seconds", rs.queue_s),
            ("llm_request_prefill_time_seconds", rs.prefill_s),
            ("llm_request_decode_time_seconds", rs.decode_s),
        ):
            if value is not None:
                self.m[name].labels(self.model, reason).observe(max(value, 0.0))
        itl = self.m["llm_inter_token_latency_seconds"].labels(self.model, reason)
        for gap in rs.itl_s:
            itl.observe(max(gap, 0.0))

    def reject(self, reason: str) -> None:
        self.m["llm_requests_rejected_total"].labels(self.model, reason).inc()

    def http_response(self, route: str, status: int) -> None:
        self.m["llm_http_requests_total"].labels(self.model, route, str(status)).inc()
