"""Completion handling: request → prompt ids and SamplingParams → engine → outputs → JSON body."""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse

from engine.core.outputs import FinishReason, RequestOutput, TokenLogprob
from engine.core.sampling import SamplingParams
from engine.obs.tracing import SpanInfo
from engine.server import params as params_module
from engine.server import protocol as p
from engine.server.errors import (
    APIError,
    BadRequest,
    ModelNotFound,
    NotReady,
    RequestTimeout,
    Unavailable,
    map_exception,
)
from engine.server.state import AbortReason, LiveRequest, ServerState

CHAT, COMPLETION = "chat", "text_completion"


@dataclass(slots=True)
class Choice:
    """One of a request's n answers: its own engine request and stream of outputs."""

    index: int
    engine_id: str
    params: SamplingParams
    gen: AsyncIterator[RequestOutput] | None = None
    first: asyncio.Future | None = None  # the first output, awaited by start() for admission errors
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    final: RequestOutput | None = None
    num_tokens: int = 0
    text_offset: int = 0  # characters of this choice's text before its next token (completions logprobs)


@dataclass(slots=True)
class Job:
    """One admitted request, from admission to its last byte."""

    request_id: str
    operation: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival_ts: float
    stream: bool
    include_usage: bool
    choices: list[Choice] = field(default_factory=list)
    logprobs: bool = False  # the responses carry logprobs
    echo: str | None = None  # completions `echo`: the prompt text, before each choice's text
    created: int = field(default_factory=p.now_s)
    error: BaseException | None = None
    span: SpanInfo | None = None

    @property
    def final(self) -> RequestOutput | None:
        """The first choice's final output (its metrics stand for the request in traces)."""
        return self.choices[0].final if self.choices else None

    @property
    def is_finished(self) -> bool:
        return all(c.final is not None for c in self.choices)


def admit(state: ServerState, request: Request, body, operation: str) -> Job:
    """Check readiness, model, limits and queue; raise an APIError or return an admitted Job."""
    arrival_ts = time.monotonic()
    prefix = "chatcmpl-" if operation == CHAT else "cmpl-"
    request_id = prefix + uuid.uuid4().hex
    request.state.request_id = request_id
    bad_text = p.lone_surrogate_field(body)
    if bad_text is not None:
        raise BadRequest(f"{bad_text} holds a lone UTF-16 surrogate, which is not valid Unicode text: send whole "
                         "characters (the character itself, or both halves of its surrogate pair)", bad_text)
    if not state.is_ready():
        raise NotReady("The server is not ready: " + _not_ready_why(state), code="not_ready")
    if body.model != state.model_name:
        raise ModelNotFound(f"The model `{body.model}` does not exist.", "model", "model_not_found")
    params_module.check_supported(body)
    tokenizer = state.llm.tokenizer
    prompt_ids, prompt_text = params_module.prompt_ids(tokenizer, body)
    max_len = state.llm.max_model_len
    requested = getattr(body, "max_completion_tokens", None) or body.max_tokens
    default_max = max(max_len - len(prompt_ids), 1) if operation == CHAT else 16
    params = params_module.sampling(body, requested or default_max, state.llm.vocab_size)
    echo = params_module.echo_text(tokenizer, body, prompt_ids, prompt_text)
    extra = {"prompt": prompt_text} if state.config.log_prompts else {}
    n = body.n or 1
    state.log.emit("request.received", request_id=request_id, prompt_tokens=len(prompt_ids),
                   max_tokens=params.max_tokens, stream=bool(body.stream),
                   endpoint=request.url.path, **({"n": n} if n > 1 else {}), **extra)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    job = Job(request_id, operation, prompt_ids, params, arrival_ts, bool(body.stream), include_usage,
              logprobs=params.logprobs is not None, echo=echo)
    job.choices = [Choice(i, request_id if n == 1 else f"{request_id}-{i}", choice_params)
                   for i, choice_params in enumerate(params_module.per_choice(params, n))]
    if state.tracer is not None:
        job.span = SpanInfo(request_id, operation, state.model_name, params.max_tokens, params.temperature,
                            params.top_p, state.tracer.extract_parent(request.headers))
    return job


def _not_ready_why(state: ServerState) -> str:
    if state.engine.is_dead:
        return "the engine is dead."
    return "it is draining for shutdown." if state.draining else "the engine loop is not running."


async def start(state: ServerState, job: Job) -> None:
    """Submit the job's choices; the engine's admission errors (queue full, too long, dead) raise here,
    before any byte is sent, so they reach the client as an HTTP status rather than a stream event."""
    for choice in job.choices:
        if state.events is not None:  # before the step thread can schedule it
            state.events.track(choice.engine_id, job.arrival_ts)
        choice.gen = state.engine.generate(choice.engine_id, job.prompt_ids, choice.params,
                                           arrival_ts=job.arrival_ts)
        choice.first = asyncio.ensure_future(anext(choice.gen))
    await asyncio.sleep(0)  # the tasks run generate's synchronous admission checks first
    refused = next((c.first.exception() for c in job.choices if c.first.done() and c.first.exception()), None)
    if refused is not None:
        for choice in job.choices:
            if not choice.first.done():
                choice.first.cancel()  # its generator aborts what was queued
            elif choice.first.exception() is None:
                state.engine.abort(choice.engine_id)
            if state.events is not None:
                state.events.forget(choice.engine_id)
        raise refused
    state.live[job.request_id] = LiveRequest(job.request_id, job.arrival_ts, stream=job.stream,
                                             engine_ids=[c.engine_id for c in job.choices])


async def _outputs(state: ServerState, job: Job, choice: Choice) -> AsyncIterator[RequestOutput]:
    """The engine's outputs for a started choice, ended by --request-timeout (raises RequestTimeout)."""
    timeout = state.config.request_timeout_s
    # The loop's clock may differ from time.monotonic (uvloop), so the deadline moves over to it as
    # the time remaining.
    remaining_s = None if timeout is None else max(job.arrival_ts + timeout - time.monotonic(), 0.0)
    deadline = None if remaining_s is None else asyncio.get_running_loop().time() + remaining_s
    try:
        while True:
            step = choice.first if choice.first is not None else anext(choice.gen)
            choice.first = None
            try:
                if deadline is None:
                    output = await step
                else:
                    async with asyncio.timeout_at(deadline):  # a timer handle, not a task
                        output = await step
            except StopAsyncIteration:
                return
            except TimeoutError:
                state.abort(job.request_id, AbortReason.TIMEOUT)
                raise RequestTimeout(f"The request ran longer than --request-timeout ({timeout:g} s).",
                                     code="request_timeout") from None
            yield output
            if output.finished:
                return
    finally:
        await choice.gen.aclose()


async def all_outputs(state: ServerState, job: Job) -> AsyncIterator[tuple[Choice, RequestOutput]]:
    """Every choice's outputs as they come; the first failure of any choice raises (the rest are closed)."""
    if len(job.choices) == 1:
        choice = job.choices[0]
        async with aclosing(_outputs(state, job, choice)) as outputs:
            async for output in outputs:
                yield choice, output
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(choice: Choice) -> None:
        try:
            async for output in _outputs(state, job, choice):
                queue.put_nowait((choice, output, None))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            queue.put_nowait((choice, None, exc))
        else:
            queue.put_nowait((choice, None, None))

    tasks = [asyncio.ensure_future(pump(choice)) for choice in job.choices]
    try:
        num_running = len(tasks)
        while num_running:
            choice, output, exc = await queue.get()
            if output is not None:
                yield choice, output
                continue
            num_running -= 1
            if exc is not None:
                raise exc
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def finish_error(state: ServerState, job: Job, output: RequestOutput) -> APIError | None:
    """An exception for a request the engine finished with abort or error, else None."""
    if output.finish_reason is FinishReason.ERROR:
        return APIError("The engine failed while processing this request.", code="engine_error")
    if output.finish_reason is FinishReason.ABORT:
        live = state.live.get(job.request_id)
        if live is not None and live.abort_reason == AbortReason.DRAIN:
            return Unavailable("The server is shutting down; the request was aborted.", code="draining")
        if live is not None and live.abort_reason == AbortReason.SHUTDOWN:
            return Unavailable("The server was told to stop at once; the request was aborted.", code="shutdown")
        if state.engine.is_dead:
            return Unavailable("The engine is dead.", code="engine_dead")
        return APIError("The request was aborted.", code="aborted")
    return None


def usage_of(job: Job) -> dict:
    """Prompt tokens once (the choices share the prompt), completion tokens of every choice."""
    first = job.final
    if first is None:
        return p.usage(0, 0, 0)
    num_completion = sum(c.final.num_output_tokens for c in job.choices if c.final is not None)
    return p.usage(first.num_prompt_tokens, num_completion, first.num_cached_tokens)


def track_output(state: ServerState, job: Job, choice: Choice, output: RequestOutput) -> None:
    choice.num_tokens = output.num_output_tokens
    live = state.live.get(job.request_id)
    if live is not None:
        live.tokens_sent = sum(c.num_tokens for c in job.choices)
    if output.finished:
        choice.final = output


async def complete(state: ServerState, request: Request, job: Job) -> JSONResponse:
    """Non-streaming: collect the whole answer; a client gone meanwhile aborts the request."""
    await start(state, job)
    collect = asyncio.ensure_future(_collect(state, job))
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({collect, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not collect.done():
            state.abort(job.request_id, AbortReason.CLIENT_DISCONNECT)
            await asyncio.wait({collect}, timeout=5)
            if not collect.done():
                collect.cancel()
            elif not collect.cancelled():
                collect.exception()  # the abort's own error, expected: retrieved so asyncio does not report it
            return JSONResponse(map_exception(APIError("client disconnected")).body, status_code=499)
        collect.result()
    finally:
        watcher.cancel()
        record_trace(state, job)
        state.live.pop(job.request_id, None)
    return JSONResponse(_response(state, job))


async def _collect(state: ServerState, job: Job) -> None:
    async with aclosing(all_outputs(state, job)) as outputs:
        async for choice, output in outputs:
            choice.text.append(output.new_text)
            if output.logprobs:
                choice.logprobs.extend(output.logprobs)
            track_output(state, job, choice, output)
    for choice in job.choices:
        if choice.final is None:
            raise APIError("The engine ended the request without a final output.")
        failure = finish_error(state, job, choice.final)
        if failure is not None:
            job.error = failure
            raise failure


def _response(state: ServerState, job: Job) -> dict:
    formatter, echo = state.logprob_formatter, job.echo or ""
    choices = []
    for choice in job.choices:
        finish = choice.final.finish_reason.value if choice.final.finish_reason else "stop"
        text = "".join(choice.text)
        if job.operation == CHAT:
            logprobs = formatter.chat(choice.logprobs) if job.logprobs else None
            choices.append(p.chat_choice(choice.index, text, finish, logprobs))
        else:
            logprobs = formatter.completion(choice.logprobs, len(echo))[0] if job.logprobs else None
            choices.append(p.completion_choice(choice.index, echo + text, finish, logprobs))
    if job.operation == CHAT:
        return p.chat_response(job.request_id, state.model_name, job.created, choices, usage_of(job))
    return p.completion_body(job.request_id, state.model_name, job.created, choices, usage_of(job))


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def record_trace(state: ServerState, job: Job) -> None:
    if state.tracer is None or job.span is None:
        return
    out = job.final
    reason = out.finish_reason.value if out is not None and out.finish_reason else None
    live = state.live.get(job.request_id)
    if reason is None and live is not None and live.abort_reason is not None:
        reason = "abort"  # ended by a disconnect, a timeout or the drain before the engine's last output
    elif reason is None and job.error is not None:
        reason = "error"
    error = str(job.error) if job.error is not None else None
    state.tracer.record(job.span, out.metrics if out is not None else None, reason, error)
