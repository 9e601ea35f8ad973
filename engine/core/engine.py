"""LLMEngine: the synchronous, step-based engine: admit requests, schedule, run the model, sample."""

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from engine import errors
from engine.core import capacity
from engine.core.block_manager import KVCacheManager
from engine.core.config import EngineConfig
from engine.core.detokenizer import check_stop, take_new_text
from engine.core.faults import FaultInjector
from engine.core.outputs import FinishReason, RequestOutput, TokenLogprob
from engine.core.runner import ModelRunner, allocate_kv_caches
from engine.core.sampler import Sampler
from engine.core.sampling import SamplingParams
from engine.core.scheduler import ScheduledRequest, Scheduler, SchedulerOutput
from engine.core.sequence import Request, RequestStatus
from engine.model.loader import LoadedModel, load_model
from engine.obs.stats import RequestStats, StepStats, prefix_fingerprint


@dataclass(slots=True)
class StepError:
    """A step whose forward failed: its requests finished with `error`, the engine lives on."""

    exc: BaseException
    traceback: str
    request_ids: list[str]


@dataclass(slots=True)
class StepResult:
    outputs: list[RequestOutput]
    stats: StepStats | None  # None when log_stats is off
    error: StepError | None = None


class LLMEngine:
    def __init__(
        self, config: EngineConfig, clock: Callable[[], float] = time.monotonic, *, loaded: LoadedModel | None = None
    ):
        """`loaded` reuses an already loaded model (tests, benchmarks); by default config.model is loaded."""
        _check_config(config)
        self.config = config
        self.clock = clock
        self.log_stats = config.log_stats
        loaded = load_model(config) if loaded is None else loaded
        self.tokenizer = loaded.tokenizer
        self.model_name = loaded.name
        self.model_digest = loaded.digest
        self.model_config = loaded.model_config
        self.max_model_len = _max_model_len(config, loaded.model_config.max_position_embeddings)
        device = next(loaded.model.parameters()).device
        dtype = next(loaded.model.parameters()).dtype
        self.capacity = capacity.plan(config, loaded, self.max_model_len, dtype, device)
        self.kv = KVCacheManager(self.capacity.num_blocks, config.block_size, config.enable_prefix_caching)
        kv_caches = allocate_kv_caches(loaded.model_config, self.capacity.num_blocks, config.block_size, dtype, device)
        self.runner = ModelRunner(loaded.model, kv_caches, self.kv, device)
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens)
        self.sampler = Sampler(device, config.seed, loaded.suppress_token_ids, self.tokenizer.eos_token_id)
        self.eos_token_id = self.tokenizer.eos_token_id
        self.vocab_size = loaded.model_config.vocab_size
        self.requests: dict[str, Request] = {}
        self._aborted: list[Request] = []
        self.faults = FaultInjector(config.faults)
        self.fatal_error: errors.FatalEngineError | None = None
        self._num_prompt_computed = 0  # counters of the current step, reset by _make_stats
        self._num_generated = 0

    # ---- requests -------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._aborted)

    def validate_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise InvalidRequestError / PromptTooLongError for a request the engine cannot take."""
        if not isinstance(params, SamplingParams):
            raise errors.InvalidRequestError(f"params must be SamplingParams, got {type(params).__name__}")
        if not prompt_token_ids:
            raise errors.InvalidRequestError("the prompt is empty", param="prompt")
        if any(not isinstance(t, int) or not 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise errors.InvalidRequestError(
                f"the prompt holds a token id outside this model's vocabulary (0..{self.vocab_size - 1})",
                param="prompt",
            )
        params.validate(self.vocab_size)
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise errors.PromptTooLongError(len(prompt_token_ids), params.max_tokens, self.max_model_len)

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival_ts: float | None = None
    ) -> None:
        self.validate_request(prompt_token_ids, params)
        if request_id in self.requests:
            raise errors.InvalidRequestError(f"request id {request_id!r} is already in use", param="request_id")
        arrival_ts = self.clock() if arrival_ts is None else arrival_ts
        request = Request(request_id, list(prompt_token_ids), params, arrival_ts)
        if self.log_stats:
            request.stats = RequestStats(arrival_ts=arrival_ts, num_prompt_tokens=len(prompt_token_ids))
        self.requests[request_id] = request
        self.scheduler.add(request)

    def abort_request(self, request_id: str) -> None:
        """Free the request's blocks now; the next step() reports it finished with ABORT."""
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return
        self._finish(request, FinishReason.ABORT)
        self._aborted.append(request)

    def fail_all(self, message: str) -> list[RequestOutput]:
        """Finish every live request with ERROR (the loop died); best effort on a broken engine."""
        outputs = [self._make_output(r, []) for r in self._aborted]
        self._aborted.clear()
        for request in list(self.requests.values()):
            try:
                self._finish(request, FinishReason.ERROR, message)
            except Exception:  # noqa: BLE001 - the state may be inconsistent; the request still fails
                request.status = RequestStatus.FINISHED
                request.finish_reason = FinishReason.ERROR
                request.error = message
                self.requests.pop(request.request_id, None)
            outputs.append(self._make_output(request, []))
        return outputs

    # ---- the step ---------------------------------------------------------------------------

    def step(self) -> StepResult:
        if self.fatal_error is not None:
            raise self.fatal_error
        step_start = self.clock() if self.log_stats else 0.0
        if self.faults.active:
            self.faults.on_step_start()
        outputs = [self._make_output(r, []) for r in self._aborted]
        self._aborted.clear()
        sched = self.scheduler.schedule()
        if self.log_stats:
            self._record_scheduling(sched, self.clock())
        error = None
        forward_s = 0.0
        if sched.scheduled:
            try:
                forward_s = self._execute(sched, outputs)
            except Exception as exc:  # noqa: BLE001 - a failed forward fails its batch, not the engine
                error = self._fail_batch(sched, exc, outputs)
        self.fatal_error = self.faults.crash_error()
        stats = None
        if self.log_stats:
            stats = self._make_stats(sched, step_start, forward_s, error is None)
        return StepResult(outputs, stats, error)

    def _execute(self, sched: SchedulerOutput, outputs: list[RequestOutput]) -> float:
        batch = sched.scheduled
        if self.faults.active:
            self.faults.before_forward()
        forward_start = self.clock()
        logits = self.runner.execute(batch)  # [len(batch), vocab]
        rows = [i for i, item in enumerate(batch) if item.completes_prompt]
        tokens: list[int] = []
        logprobs: list = []
        if rows:
            sampled_logits = logits if len(rows) == len(batch) else logits[rows]
            requests = [batch[i].request for i in rows]
            processed = self.sampler.process(sampled_logits, requests)
            tokens = self.sampler.choose(processed, requests)
            if any(r.params.logprobs is not None for r in requests):
                logprobs = self.sampler.logprobs(processed, requests, tokens)
        now = self.clock()  # after the tokens' host copy, so the forward has really finished
        for item in batch:
            item.request.num_computed_tokens += item.num_new_tokens
        if self.log_stats:
            self._num_generated = len(tokens)
            self._num_prompt_computed = _num_prompt_tokens(batch)
        for j, (i, token) in enumerate(zip(rows, tokens, strict=True)):
            outputs.append(self._append_token(batch[i].request, token, now, logprobs[j] if logprobs else None))
        return now - forward_start

    def _append_token(self, request: Request, token: int, now: float, logprob: TokenLogprob | None) -> RequestOutput:
        request.append_token(token)
        check_stop(self.tokenizer, request, None if request.params.ignore_eos else self.eos_token_id,
                   self.max_model_len)
        if request.stats is not None:
            if request.stats.first_token_ts is None:
                request.stats.first_token_ts = now
            request.stats.token_ts.append(now)
        if request.finish_reason is not None:
            self._finish(request, request.finish_reason)
        output = self._make_output(request, [token])
        if logprob is not None:
            output.logprobs = [logprob]
        return output

    def _finish(self, request: Request, reason: FinishReason, error: str | None = None) -> None:
        self.scheduler.remove(request)  # frees its blocks at once
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.error = error
        self.requests.pop(request.request_id, None)
        self.faults.num_finished += 1
        stats = request.stats
        if stats is not None:
            stats.finished_ts = self.clock()
            stats.finish_reason = reason.value
            stats.num_output_tokens = request.num_output_tokens
            stats.num_cached_tokens = request.num_cached_tokens or 0
            stats.prefix_fingerprint = prefix_fingerprint(request.prompt_token_ids, self.config.block_size)

    def _make_output(self, request: Request, new_token_ids: list[int]) -> RequestOutput:
        finished = request.is_finished
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=new_token_ids,
            new_text=take_new_text(request, finished),
            num_prompt_tokens=request.num_prompt_tokens,
            num_cached_tokens=request.num_cached_tokens or 0,
            num_output_tokens=request.num_output_tokens,
            finished=finished,
            finish_reason=request.finish_reason if finished else None,
            error=request.error,
            metrics=request.stats if finished else None,
        )

    def _fail_batch(self, sched: SchedulerOutput, exc: Exception, outputs: list[RequestOutput]) -> StepError:
        message = f"{type(exc).__name__}: {exc}"
        request_ids = []
        for item in sched.scheduled:
            request = item.request
            if not request.is_finished:
                self._finish(request, FinishReason.ERROR, message)
                outputs.append(self._make_output(request, []))
                request_ids.append(request.request_id)
        # Blocks hashed during this step's allocation may hold K/V that was never written.
        self.kv.reset_prefix_cache()
        return StepError(exc, traceback.format_exc(), request_ids)

    # ---- stats ----------------------------------------------------------------------------

    def _record_scheduling(self, sched: SchedulerOutput, now: float) -> None:
        for request_id in sched.new_request_ids:
            stats = self.requests[request_id].stats
            stats.first_scheduled_ts = now
        for request_id in sched.preempted_request_ids:
            self.requests[request_id].stats.preemption_ts.append(now)

    def _make_stats(self, sched: SchedulerOutput, step_start: float, forward_s: float, ok: bool) -> StepStats:
        num_prompt_computed, num_generated = (self._num_prompt_computed, self._num_generated) if ok else (0, 0)
        self._num_prompt_computed = self._num_generated = 0
        return StepStats(
            ts=self.clock(),
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            num_preemptions=len(sched.preempted_request_ids),
            num_blocks_used=self.kv.num_used_blocks,
            num_blocks_cached=self.kv.num_cached_free_blocks,
            num_blocks_total=self.kv.num_blocks,
            prefix_queried_tokens=sched.prefix_queried_tokens,
            prefix_hit_tokens=sched.prefix_hit_tokens,
            num_prompt_tokens_computed=num_prompt_computed,
            num_generation_tokens=num_generated,
            batch_size=len(sched.scheduled),
            step_duration_s=self.clock() - step_start,
            forward_duration_s=forward_s,
            preempted_request_ids=sched.preempted_request_ids,
            scheduled_request_ids=sched.new_request_ids,
        )


def _num_prompt_tokens(batch: list[ScheduledRequest]) -> int:
    """Prompt tokens computed in this batch (recomputed outputs of a resumed request excluded)."""
    total = 0
    for item in batch:
        num_prompt = item.request.num_prompt_tokens
        start = item.num_computed_tokens
        total += min(start + item.num_new_tokens, num_prompt) - min(start, num_prompt)
    return total


def _check_config(config: EngineConfig) -> None:
    for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise errors.ConfigError(f"{name} must be a positive integer, got {value!r}")
    for name in ("seed", "max_model_len", "num_kv_blocks", "kv_cache_memory"):
        value = getattr(config, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise errors.ConfigError(f"{name} must be an integer, got {value!r}")


def _max_model_len(config: EngineConfig, model_limit: int) -> int:
    if config.max_model_len is None:
        return model_limit
    if config.max_model_len < 1:
        raise errors.ConfigError(f"max_model_len must be at least 1, got {config.max_model_len}")
    if config.max_model_len > model_limit:
        raise errors.ConfigError(
            f"User-specified max_model_len ({config.max_model_len}) is greater than the derived "
            f"max_model_len (max_position_embeddings={model_limit} in model's config.json)."
        )
    return config.max_model_len
