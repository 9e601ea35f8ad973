"""Server state shared by the routes: the engine, the sinks, live requests, readiness and draining."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.obs.events import RequestEventSink
from engine.obs.logs import EventLogger
from engine.obs.metrics import PrometheusSink
from engine.obs.tracing import RequestTracer

if TYPE_CHECKING:
    from engine.core.async_engine import AsyncEngine
    from engine.server.logprobs import LogprobFormatter

MiB = 1 << 20


@dataclass(slots=True)
class ServerConfig:
    """Server-side settings (the engine has its own EngineConfig)."""

    served_model_name: str | None = None
    api_key: str | None = None
    max_queue_len: int | None = None
    request_timeout_s: float | None = None
    drain_timeout_s: float = 30.0
    max_body_bytes: int = 4 * MiB
    log_prompts: bool = False
    stats_interval_s: float = 10.0


class AbortReason:
    CLIENT_DISCONNECT = "client_disconnect"
    TIMEOUT = "timeout"
    DRAIN = "drain"  # the drain timeout ended it
    SHUTDOWN = "shutdown"  # a second signal during the drain stopped the server at once


@dataclass(slots=True)
class LiveRequest:
    request_id: str
    start_ts: float
    stream: bool
    tokens_sent: int = 0
    abort_reason: str | None = None
    engine_ids: list[str] = field(default_factory=list)  # its choices' engine requests (the id itself if one)


@dataclass(slots=True)
class ServerState:
    engine: "AsyncEngine"
    config: ServerConfig
    log: EventLogger
    metrics: PrometheusSink | None = None
    events: RequestEventSink | None = None
    tracer: RequestTracer | None = None
    model_name: str = "builtin"
    created: int = field(default_factory=lambda: int(time.time()))
    live: dict[str, LiveRequest] = field(default_factory=dict)
    draining: bool = False
    num_drain_live: int = 0  # requests live when the drain began
    num_drained: int = 0
    num_drain_aborted: int = 0
    fatal: bool = False
    logprob_formatter: "LogprobFormatter | None" = None  # token text for logprobs, set by build_state
    on_fatal: Callable[[], None] | None = None  # set by the runner; called (any thread) when the engine dies

    @property
    def llm(self):
        """The synchronous LLMEngine under the AsyncEngine (tokenizer, limits, counters)."""
        return self.engine.engine

    def is_ready(self) -> bool:
        return bool(self.engine.is_running) and not self.engine.is_dead and not self.draining

    def abort(self, request_id: str, reason: str) -> None:
        """Abort a live request in the engine (its blocks are freed at once) and log why."""
        live = self.live.get(request_id)
        if live is None or live.abort_reason is not None:
            return
        live.abort_reason = reason
        for engine_id in live.engine_ids or [request_id]:
            self.engine.abort(engine_id)
        self.log.emit("request.aborted", "warning", request_id, reason=reason,
                      tokens_sent=live.tokens_sent, elapsed_s=time.monotonic() - live.start_ts)
