"""Step listener that turns StepStats and outputs into request.* log events and periodic engine.stats."""

import threading
import time
from dataclasses import dataclass

from engine.core.outputs import FinishReason, RequestOutput
from engine.obs.logs import EventLogger
from engine.obs.stats import RequestStats, StepStats

STATS_INTERVAL_S = 10.0


@dataclass(slots=True)
class _Tracked:
    arrival_ts: float
    num_output_tokens: int = 0
    first_token_logged: bool = False


@dataclass(slots=True)
class _Interval:
    """Counters summed over one engine.stats interval."""

    num_steps: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_preemptions: int = 0


class RequestEventSink:
    """Emits request.scheduled / preempted / first_token / finished and engine.stats."""

    def __init__(self, log: EventLogger, clock=time.monotonic, stats_interval_s: float = STATS_INTERVAL_S):
        self.log = log
        self.clock = clock
        self.stats_interval_s = stats_interval_s
        self._lock = threading.Lock()
        self._tracked: dict[str, _Tracked] = {}
        self._interval = _Interval()
        self._last: StepStats | None = None
        self._interval_start = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def track(self, request_id: str, arrival_ts: float) -> None:
        with self._lock:
            self._tracked[request_id] = _Tracked(arrival_ts)

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._tracked.pop(request_id, None)

    def on_step(self, stats: StepStats | None, outputs: list[RequestOutput]) -> None:
        now = stats.ts if stats is not None else self.clock()
        # Scheduling happens at the start of the step; its end (stats.ts) is when tokens exist.
        sched_ts = now - stats.step_duration_s if stats is not None else now
        by_id = {o.request_id: o for o in outputs}
        with self._lock:
            if stats is not None:
                self._accumulate(stats)
                for rid in stats.scheduled_request_ids:
                    self._scheduled(rid, sched_ts, by_id.get(rid))
                for rid in stats.preempted_request_ids:
                    tracked = self._tracked.get(rid)
                    self.log.emit("request.preempted", "warning", rid,
                                  num_output_tokens=tracked.num_output_tokens if tracked else None)
            for output in outputs:
                self._output(output, now)

    def _scheduled(self, rid: str, now: float, output: RequestOutput | None) -> None:
        tracked = self._tracked.get(rid)
        queue_s = now - tracked.arrival_ts if tracked else None
        cached = output.num_cached_tokens if output is not None else None
        self.log.emit("request.scheduled", request_id=rid, queue_s=queue_s, cached_tokens=cached)

    def _output(self, output: RequestOutput, now: float) -> None:
        rid = output.request_id
        tracked = self._tracked.get(rid)
        if tracked is not None:
            tracked.num_output_tokens = output.num_output_tokens
            if output.num_output_tokens > 0 and not tracked.first_token_logged:
                tracked.first_token_logged = True
                rs: RequestStats | None = output.metrics  # type: ignore[assignment]
                ttft = rs.ttft_s if rs is not None and rs.ttft_s is not None else now - tracked.arrival_ts
                self.log.emit("request.first_token", request_id=rid, ttft_s=ttft)
        if output.finished:
            self._tracked.pop(rid, None)
            self._finished(output)

    def _finished(self, output: RequestOutput) -> None:
        rs: RequestStats | None = output.metrics  # type: ignore[assignment]
        reason = output.finish_reason.value if output.finish_reason else FinishReason.ERROR.value
        fields = dict(
            finish_reason=reason,
            prompt_tokens=output.num_prompt_tokens,
            cached_tokens=output.num_cached_tokens,
            completion_tokens=output.num_output_tokens,
            queue_s=rs.queue_s if rs else None,
            ttft_s=rs.ttft_s if rs else None,
            tpot_s=rs.tpot_s if rs else None,
            e2e_s=rs.e2e_s if rs else None,
            prefix_fingerprint=list(rs.prefix_fingerprint) if rs else [],
        )
        if output.finish_reason is FinishReason.ERROR:
            fields["error"] = output.error
        level = "error" if output.finish_reason is FinishReason.ERROR else "info"
        self.log.emit("request.finished", level, output.request_id, **fields)

    def _accumulate(self, s: StepStats) -> None:
        iv = self._interval
        iv.num_steps += 1 if (s.batch_size or s.num_running or s.num_waiting) else 0
        iv.prefix_queried_tokens += s.prefix_queried_tokens
        iv.prefix_hit_tokens += s.prefix_hit_tokens
        iv.num_prompt_tokens += s.num_prompt_tokens_computed
        iv.num_generation_tokens += s.num_generation_tokens
        iv.num_preemptions += s.num_preemptions
        self._last = s

    def flush_stats(self, force: bool = False) -> bool:
        """Emit engine.stats for the interval so far if the engine was busy in it; True if emitted."""
        with self._lock:
            now = self.clock()
            iv, last, elapsed = self._interval, self._last, max(now - self._interval_start, 1e-9)
            self._interval, self._interval_start = _Interval(), now
        if iv.num_steps == 0 and not force:
            return False
        queried = iv.prefix_queried_tokens
        self.log.emit(
            "engine.stats",
            running=last.num_running if last else 0,
            waiting=last.num_waiting if last else 0,
            kv_usage=last.kv_usage if last else 0.0,
            kv_blocks_used=last.num_blocks_used if last else 0,
            kv_blocks_total=last.num_blocks_total if last else 0,
            prefix_hit_rate=iv.prefix_hit_tokens / queried if queried else None,
            prefix_queried_tokens=queried,
            prefix_hit_tokens=iv.prefix_hit_tokens,
            prompt_tokens_per_s=iv.num_prompt_tokens / elapsed,
            generation_tokens_per_s=iv.num_generation_tokens / elapsed,
            preemptions=iv.num_preemptions,
        )
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="engine-stats-log", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.stats_interval_s):
            self.flush_stats()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
