"""Completion handling: request → prompt ids and SamplingParams → engine → JSON body or SSE stream."""

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine import errors
from engine.core.outputs import FinishReason, RequestOutput
from engine.core.sampling import SamplingParams
from engine.obs.tracing import SpanInfo
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
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


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
    created: int = field(default_factory=p.now_s)
    text: list[str] = field(default_factory=list)
    final: RequestOutput | None = None
    error: BaseException | None = None
    span: SpanInfo | None = None
    gen: AsyncIterator[RequestOutput] | None = None
    first: asyncio.Future | None = None  # the first output, awaited by start() for admission errors


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


_TEXT_MARK = "\x00text\x00"


def text_event_template(operation: str, request_id: str, model: str, created: int) -> tuple[str, str]:
    """The SSE event of a mid-stream text chunk, split around its JSON-encoded text.

    Cut from the event the dict builders make, so `head + json.dumps(text) + tail` is that event
    byte for byte (a string encodes the same alone or inside a dict) for the cost of encoding
    one string per token, not a nested dict.
    """
    if operation == CHAT:
        body = p.chat_chunk(request_id, model, created, {"content": _TEXT_MARK}, None)
    else:
        body = p.completion_response(request_id, model, created, _TEXT_MARK, None, None)
    head, mark, tail = sse(body).partition(json.dumps(_TEXT_MARK))
    assert mark, "the text marker must appear in the chunk"
    return head, tail


# As vLLM: a temperature under this is greedy (dividing logits by it overflows float32).
GREEDY_EPS = 1e-5
# The smallest nucleus mass float32 sampling tells apart from 0 (the top token is always kept).
MIN_TOP_P = 1e-6


def _sampling(body: p.SamplingFields, default_max: int) -> SamplingParams:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    temperature = 1.0 if body.temperature is None else body.temperature
    params = SamplingParams(
        max_tokens=body.max_tokens or default_max,
        temperature=0.0 if temperature < GREEDY_EPS else temperature,
        top_p=1.0 if body.top_p is None else max(body.top_p, MIN_TOP_P),
        top_k=body.top_k if body.top_k and body.top_k > 0 else None,
        seed=body.seed, stop=stop, ignore_eos=bool(body.ignore_eos),
    )
    params.validate()
    return params


def _prompt_ids(state: ServerState, body) -> tuple[list[int], str | None]:
    tok = state.llm.tokenizer
    if isinstance(body, p.ChatCompletionRequest):
        text = tok.apply_chat_template([{"role": m.role, "content": m.text()} for m in body.messages])
        return tok.encode(text), text
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return list(prompt), None
    text = prompt[0] if isinstance(prompt, list) else prompt
    return tok.encode(text), text


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
    prompt_ids, prompt_text = _prompt_ids(state, body)
    max_len = state.llm.max_model_len
    requested = getattr(body, "max_completion_tokens", None) or body.max_tokens
    default_max = max(max_len - len(prompt_ids), 1) if operation == CHAT else 16
    params = _sampling(body, requested or default_max)
    extra = {"prompt": prompt_text} if state.config.log_prompts else {}
    state.log.emit("request.received", request_id=request_id, prompt_tokens=len(prompt_ids),
                   max_tokens=params.max_tokens, stream=bool(body.stream),
                   endpoint=request.url.path, **extra)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    job = Job(request_id, operation, prompt_ids, params, arrival_ts, bool(body.stream), include_usage)
    if state.tracer is not None:
        job.span = SpanInfo(request_id, operation, state.model_name, params.max_tokens, params.temperature,
                            params.top_p, state.tracer.extract_parent(request.headers))
    return job


def _not_ready_why(state: ServerState) -> str:
    if state.engine.is_dead:
        return "the engine is dead."
    return "it is draining for shutdown." if state.draining else "the engine loop is not running."


async def start(state: ServerState, job: Job) -> None:
    """Submit the job; the engine's admission errors (queue full, too long, dead) raise here, before
    any byte is sent, so they reach the client as an HTTP status rather than a stream event."""
    if state.events is not None:  # before the step thread can schedule it
        state.events.track(job.request_id, job.arrival_ts)
    job.gen = state.engine.generate(job.request_id, job.prompt_ids, job.params, arrival_ts=job.arrival_ts)
    job.first = asyncio.ensure_future(anext(job.gen))
    await asyncio.sleep(0)  # the task runs generate's synchronous admission checks first
    if job.first.done() and job.first.exception() is not None:
        if state.events is not None:
            state.events.forget(job.request_id)
        raise job.first.exception()
    state.live[job.request_id] = LiveRequest(job.request_id, job.arrival_ts, stream=job.stream)


async def _outputs(state: ServerState, job: Job) -> AsyncIterator[RequestOutput]:
    """The engine's outputs for a started job, ended by --request-timeout (raises RequestTimeout)."""
    timeout = state.config.request_timeout_s
    # The loop's clock may differ from time.monotonic (uvloop), so the deadline moves over to it as
    # the time remaining.
    remaining_s = None if timeout is None else max(job.arrival_ts + timeout - time.monotonic(), 0.0)
    deadline = None if remaining_s is None else asyncio.get_running_loop().time() + remaining_s
    try:
        while True:
            step = job.first if job.first is not None else anext(job.gen)
            job.first = None
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
        await job.gen.aclose()


def _finish_error(state: ServerState, job: Job, output: RequestOutput) -> APIError | None:
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


def _usage(output: RequestOutput | None) -> dict:
    if output is None:
        return p.usage(0, 0, 0)
    return p.usage(output.num_prompt_tokens, output.num_output_tokens, output.num_cached_tokens)


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
        _trace(state, job)
        state.live.pop(job.request_id, None)
    out = job.final
    assert out is not None
    finish = out.finish_reason.value if out.finish_reason else "stop"
    text = "".join(job.text)
    if job.operation == CHAT:
        body = p.chat_response(job.request_id, state.model_name, job.created, text, finish, _usage(out))
    else:
        body = p.completion_response(job.request_id, state.model_name, job.created, text, finish, _usage(out))
    return JSONResponse(body)


async def _collect(state: ServerState, job: Job) -> None:
    async for output in _outputs(state, job):
        job.text.append(output.new_text)
        state.live[job.request_id].tokens_sent = output.num_output_tokens
        if output.finished:
            job.final = output
    if job.final is None:
        raise APIError("The engine ended the request without a final output.")
    failure = _finish_error(state, job, job.final)
    if failure is not None:
        job.error = failure
        raise failure


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def stream(state: ServerState, job: Job) -> StreamingResponse:
    await start(state, job)
    return StreamingResponse(_events(state, job), media_type="text/event-stream", headers=SSE_HEADERS)


async def _events(state: ServerState, job: Job) -> AsyncIterator[str]:
    """SSE events; any failure after the first byte becomes an error event, then [DONE]."""
    model, live = state.model_name, state.live[job.request_id]
    head, tail = text_event_template(job.operation, job.request_id, model, job.created)
    if job.operation == CHAT:
        yield sse(p.chat_chunk(job.request_id, model, job.created, {"role": "assistant", "content": ""}, None))
    finished = False
    try:
        async for out in _outputs(state, job):
            live.tokens_sent = out.num_output_tokens
            if out.finished:
                finished, job.final = True, out
                failure = _finish_error(state, job, out)
                if failure is not None:
                    raise failure
            finish = out.finish_reason.value if out.finished and out.finish_reason else None
            if finish is not None:
                yield sse(_chunk(job, model, out.new_text, finish))
            elif out.new_text:
                yield head + json.dumps(out.new_text) + tail
        if job.include_usage:
            yield sse(_usage_chunk(job, model))
    except (asyncio.CancelledError, GeneratorExit):
        if not finished:
            state.abort(job.request_id, AbortReason.CLIENT_DISCONNECT)
        raise
    except Exception as exc:  # noqa: BLE001 - every failure must end the stream cleanly
        job.error = exc
        if not isinstance(exc, APIError | errors.EngineError):
            state.log.emit("engine.error", "error", job.request_id, phase="stream", exc_type=type(exc).__name__,
                           message=str(exc), traceback=None, request_ids=[job.request_id], fatal=False)
        yield sse(map_exception(exc).body)
    finally:
        _trace(state, job)
        state.live.pop(job.request_id, None)
    yield sse("[DONE]")


def _chunk(job: Job, model: str, text: str, finish: str | None) -> dict:
    if job.operation == CHAT:
        return p.chat_chunk(job.request_id, model, job.created, {"content": text}, finish)
    return p.completion_response(job.request_id, model, job.created, text, finish, None)


def _usage_chunk(job: Job, model: str) -> dict:
    if job.operation == CHAT:
        return p.chat_chunk(job.request_id, model, job.created, None, None, _usage(job.final))
    return p.completion_response(job.request_id, model, job.created, "", None, _usage(job.final),
                                 with_choice=False)


def _trace(state: ServerState, job: Job) -> None:
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
