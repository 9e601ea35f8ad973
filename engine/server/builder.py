"""Wires an engine to the sinks: Prometheus, request/engine log events, traces, the error listener."""

import traceback
from importlib.metadata import PackageNotFoundError, version
from typing import TextIO

import torch
from opentelemetry.sdk.trace import TracerProvider

from engine import errors
from engine.core.async_engine import AsyncEngine
from engine.core.config import EngineConfig
from engine.core.engine import LLMEngine
from engine.obs.events import RequestEventSink
from engine.obs.logs import EventLogger, LogFormat
from engine.obs.metrics import PrometheusSink
from engine.obs.tracing import RequestTracer
from engine.server.logprobs import LogprobFormatter
from engine.server.state import ServerConfig, ServerState


class StartupError(Exception):
    """The engine refused to start (capacity, memory, checkpoint); already logged as engine.error."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def package_version() -> str:
    try:
        return version("llmsre")
    except PackageNotFoundError:
        return "0.0.0"


def load_engine(engine_config: EngineConfig, log: EventLogger) -> LLMEngine:
    """Build the LLMEngine; a refusal is logged as engine.error and raised as StartupError."""
    try:
        return LLMEngine(engine_config)
    except (errors.CapacityError, errors.OutOfMemoryError, errors.ModelLoadError, errors.ConfigError) as exc:
        phase = "load" if isinstance(exc, errors.ModelLoadError) else "startup"
        log.emit("engine.error", "error", phase=phase, exc_type=type(exc).__name__, message=str(exc),
                 traceback=traceback.format_exc(), request_ids=[], fatal=True)
        raise StartupError(str(exc), 2 if isinstance(exc, errors.ConfigError) else 1) from exc


def build_state(llm: LLMEngine, config: ServerConfig, log: EventLogger,
                tracer_provider: TracerProvider | None = None) -> ServerState:
    """Wrap `llm` in an AsyncEngine with every sink attached; the loop is started by start_state."""
    model = config.served_model_name or llm.model_name
    log.model = model
    engine = AsyncEngine(llm, max_queue_len=config.max_queue_len)
    state = ServerState(engine=engine, config=config, log=log, model_name=model,
                        logprob_formatter=LogprobFormatter(llm.tokenizer))
    cap = llm.capacity
    info = {"model_digest": llm.model_digest, "block_size": str(cap.block_size),
            "prefix_caching": str(llm.config.enable_prefix_caching).lower(),
            "max_model_len": str(llm.max_model_len), "dtype": str(cap.dtype), "device": str(cap.device),
            "version": package_version(), "max_num_seqs": str(llm.config.max_num_seqs),
            "max_num_batched_tokens": str(llm.config.max_num_batched_tokens)}
    state.metrics = PrometheusSink(model, info, state.is_ready)
    state.metrics.set_blocks_capacity(cap.num_blocks)
    state.events = RequestEventSink(log, stats_interval_s=config.stats_interval_s)
    if tracer_provider is not None:
        state.tracer = RequestTracer(tracer_provider)
    engine.add_step_listener(state.metrics.on_step)
    engine.add_step_listener(state.events.on_step)
    engine.add_error_listener(lambda exc, tb, ids: _on_engine_error(state, exc, tb, ids))
    return state


def _on_engine_error(state: ServerState, exc: BaseException, tb: str, request_ids: list[str]) -> None:
    fatal = isinstance(exc, errors.FatalEngineError) or bool(state.engine.is_dead)
    state.log.emit("engine.error", "error", phase="step", exc_type=type(exc).__name__, message=str(exc),
                   traceback=tb, request_ids=list(request_ids), fatal=fatal)
    if fatal and state.on_fatal is not None:
        state.on_fatal()


def start_state(state: ServerState) -> None:
    llm = state.llm
    cap = llm.capacity
    state.log.emit(
        "engine.startup", model_digest=llm.model_digest, dtype=str(cap.dtype), device=str(cap.device),
        block_size=cap.block_size, num_blocks=cap.num_blocks, kv_bytes_per_token=cap.kv_bytes_per_token,
        kv_cache_bytes=cap.kv_cache_bytes, cache_tokens=cap.num_cache_tokens, max_model_len=llm.max_model_len,
        max_concurrency=cap.max_concurrency, prefix_caching=bool(llm.config.enable_prefix_caching),
        max_num_seqs=llm.config.max_num_seqs, max_num_batched_tokens=llm.config.max_num_batched_tokens,
        weights_bytes=cap.weights_bytes, torch_threads=torch.get_num_threads(),
    )
    state.engine.start()
    if state.events is not None:
        state.events.start()


def stop_state(state: ServerState, reason: str) -> None:
    """Stop the loop and the sinks; log engine.shutdown with what the drain achieved."""
    try:
        state.engine.shutdown()
    finally:
        if state.events is not None:
            state.events.stop()
            state.events.flush_stats()
        state.log.emit("engine.shutdown", "error" if reason == "fatal" else "info", reason=reason,
                       drained=state.num_drained, aborted=state.num_drain_aborted)
        if state.tracer is not None:
            state.tracer.shutdown()


def make_logger(fmt: str = "json", stream: TextIO | None = None) -> EventLogger:
    return EventLogger("builtin", stream, LogFormat(fmt))
