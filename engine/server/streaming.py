"""SSE streaming of a started job: role and echo chunks, text chunks from a template, logprobs, usage, [DONE]."""

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi.responses import StreamingResponse

from engine import errors
from engine.core.outputs import RequestOutput
from engine.server import protocol as p
from engine.server.errors import APIError, map_exception
from engine.server.serving import (
    CHAT,
    Choice,
    Job,
    all_outputs,
    finish_error,
    record_trace,
    start,
    track_output,
    usage_of,
)
from engine.server.state import AbortReason, ServerState

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


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


async def stream(state: ServerState, job: Job) -> StreamingResponse:
    await start(state, job)
    return StreamingResponse(_events(state, job), media_type="text/event-stream", headers=SSE_HEADERS)


async def _events(state: ServerState, job: Job) -> AsyncIterator[str]:
    """SSE events; any failure after the first byte becomes an error event, then [DONE]."""
    model = state.model_name
    # One plain choice: text chunks from a template (one string encoded per token, not a dict).
    plain = len(job.choices) == 1 and not job.logprobs
    head, tail = text_event_template(job.operation, job.request_id, model, job.created)
    for choice in job.choices:
        if job.operation == CHAT:
            yield sse(p.chat_chunk(job.request_id, model, job.created, {"role": "assistant", "content": ""}, None,
                                   index=choice.index))
        elif job.echo:
            yield sse(p.completion_response(job.request_id, model, job.created, job.echo, None, None,
                                            index=choice.index))
            choice.text_offset = len(job.echo)
    try:
        async with aclosing(all_outputs(state, job)) as outputs:
            async for choice, out in outputs:
                track_output(state, job, choice, out)
                if out.finished:
                    failure = finish_error(state, job, out)
                    if failure is not None:
                        raise failure
                finish = out.finish_reason.value if out.finished and out.finish_reason else None
                if plain and finish is None:
                    if out.new_text:
                        yield head + json.dumps(out.new_text) + tail
                    continue
                logprobs = _chunk_logprobs(state, job, choice, out)
                if finish is not None or out.new_text or logprobs is not None:
                    yield sse(_chunk(job, model, choice, out.new_text, finish, logprobs))
        if job.include_usage:
            yield sse(_usage_chunk(job, model))
    except (asyncio.CancelledError, GeneratorExit):
        if not job.is_finished:
            state.abort(job.request_id, AbortReason.CLIENT_DISCONNECT)
        raise
    except Exception as exc:  # noqa: BLE001 - every failure must end the stream cleanly
        job.error = exc
        if not isinstance(exc, APIError | errors.EngineError):
            state.log.emit("engine.error", "error", job.request_id, phase="stream", exc_type=type(exc).__name__,
                           message=str(exc), traceback=None, request_ids=[job.request_id], fatal=False)
        yield sse(map_exception(exc).body)
    finally:
        record_trace(state, job)
        state.live.pop(job.request_id, None)
    yield sse("[DONE]")


def _chunk_logprobs(state: ServerState, job: Job, choice: Choice, out: RequestOutput) -> dict | None:
    if not job.logprobs or not out.logprobs:
        return None
    if job.operation == CHAT:
        return state.logprob_formatter.chat(out.logprobs)
    body, choice.text_offset = state.logprob_formatter.completion(out.logprobs, choice.text_offset)
    return body


def _chunk(job: Job, model: str, choice: Choice, text: str, finish: str | None, logprobs: dict | None) -> dict:
    if job.operation == CHAT:
        return p.chat_chunk(job.request_id, model, job.created, {"content": text}, finish, index=choice.index,
                            logprobs=logprobs)
    return p.completion_response(job.request_id, model, job.created, text, finish, None, index=choice.index,
                                 logprobs=logprobs)


def _usage_chunk(job: Job, model: str) -> dict:
    if job.operation == CHAT:
        return p.chat_chunk(job.request_id, model, job.created, None, None, usage_of(job))
    return p.completion_response(job.request_id, model, job.created, "", None, usage_of(job), with_choice=False)
