"""Pydantic request models of the OpenAI API subset we serve, and the response bodies we build."""

import re
import time
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# JSON types as OpenAI's schema gives them: "16" is not an integer, true is not a number, "yes" is
# not a boolean (strict: pydantic's default lax mode would coerce each). Fields OpenAI does not
# define are ignored, as OpenAI does; those it defines and llmserve does not do are refused
# (UNSUPPORTED below), so the request models keep every field to look at (extra="allow").
STRICT = ConfigDict(extra="ignore", strict=True)
STRICT_KEEP = ConfigDict(extra="allow", strict=True)
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
MAX_N = 8  # choices per request: each is a sequence in the batch


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool | None = False


class SamplingFields(BaseModel):
    """Fields shared by both endpoints; vLLM's extras (top_k, ignore_eos, repetition_penalty,
    min_tokens, stop_token_ids) included."""

    model_config = STRICT_KEEP
    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None  # vLLM: -1 or 0 disables
    seed: Annotated[int, Field(ge=-(2**63), le=2**63 - 1)] | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] | None = 1
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Field(ge=0.01, le=100.0)] | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    ignore_eos: bool | None = False
    user: str | None = None


class ContentPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | Annotated[
        list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    echo: bool | None = False
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None


def _given(value, body) -> bool:
    return value is not None


# OpenAI parameters llmserve does not do: name -> whether this request's value asks for it
# (value, body). Each gets a 400 naming it rather than an answer that silently ignores it.
UNSUPPORTED = {
    ChatCompletionRequest: {
        "tools": _given, "tool_choice": _given, "parallel_tool_calls": _given,
        "functions": _given, "function_call": _given,
        "response_format": lambda v, b: v is not None and not (isinstance(v, dict) and v.get("type") == "text"),
        "audio": _given, "modalities": lambda v, b: v is not None and v != ["text"],
        "prediction": _given, "web_search_options": _given, "reasoning_effort": _given, "verbosity": _given,
        "store": lambda v, b: v is True,
    },
    CompletionRequest: {
        "suffix": _given,
        "best_of": lambda v, b: v is not None and v != (b.n or 1),
    },
}
UNSUPPORTED_WHY = {
    "tools": "llmserve has no tool calling", "tool_choice": "llmserve has no tool calling",
    "parallel_tool_calls": "llmserve has no tool calling", "functions": "llmserve has no function calling",
    "function_call": "llmserve has no function calling",
    "response_format": "only {\"type\": \"text\"} is served (no JSON mode or structured outputs)",
    "audio": "llmserve serves text only", "modalities": "llmserve serves text only (modalities [\"text\"])",
    "prediction": "llmserve has no predicted outputs", "web_search_options": "llmserve has no web search",
    "reasoning_effort": "this model does not reason", "verbosity": "this model has no verbosity setting",
    "store": "llmserve stores no completions", "suffix": "llmserve has no insertion (suffix)",
    "best_of": "best_of must equal n (llmserve returns every choice it generates)",
}


def unsupported(body: SamplingFields) -> tuple[str, str] | None:
    """(parameter, message) for the first OpenAI parameter the request uses that llmserve does not do."""
    extra = body.model_extra or {}
    for name, asks in UNSUPPORTED.get(type(body), {}).items():
        if name in extra and asks(extra[name], body):
            return name, f"Unsupported parameter: '{name}' is not supported with this model: {UNSUPPORTED_WHY[name]}."
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_field(value, path: str = "") -> str | None:
    """The dotted path of the first string in a request holding a lone UTF-16 surrogate, else None.

    JSON can carry one (`"\\ud83d"` alone) but it is not Unicode text: no tokenizer can encode it.
    """
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    if isinstance(value, BaseModel):
        items = ((name, getattr(value, name)) for name in type(value).model_fields)
    elif isinstance(value, list):
        if all(type(item) is int for item in value):  # token ids: nothing to look into
            return None
        items = enumerate(value)
    elif isinstance(value, dict):
        items = value.items()
    else:
        return None
    for key, item in items:
        found = lone_surrogate_field(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def usage(num_prompt: int, num_completion: int, num_cached: int) -> dict:
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
        "prompt_tokens_details": {"cached_tokens": num_cached},
    }


def now_s() -> int:
    return int(time.time())


def chat_choice(index: int, text: str, finish: str, logprobs: dict | None = None) -> dict:
    return {"index": index, "message": {"role": "assistant", "content": text, "refusal": None},
            "logprobs": logprobs, "finish_reason": finish}


def completion_choice(index: int, text: str, finish: str | None, logprobs: dict | None = None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def chat_response(rid: str, model: str, created: int, choices: list[dict], usage_body: dict) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": choices,
            "usage": usage_body}


def completion_body(rid: str, model: str, created: int, choices: list[dict], usage_body: dict | None) -> dict:
    body = {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices}
    if usage_body is not None:
        body["usage"] = usage_body
    return body


def chat_chunk(rid: str, model: str, created: int, delta: dict | None, finish: str | None,
               usage_body: dict | None = None, index: int = 0, logprobs: dict | None = None) -> dict:
    choices = [] if delta is None else [
        {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
    body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": choices}
    if usage_body is not None:
        body["usage"] = usage_body
    return body


def completion_response(rid: str, model: str, created: int, text: str, finish: str | None,
                        usage_body: dict | None, with_choice: bool = True, index: int = 0,
                        logprobs: dict | None = None) -> dict:
    """A streamed completion chunk (a null finish_reason mid-stream), or the usage chunk without a choice."""
    choices = [completion_choice(index, text, finish, logprobs)] if with_choice else []
    return completion_body(rid, model, created, choices, usage_body)


def model_list(model: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created,
                                        "owned_by": "llmsre"}]}


# Every field name of the request models: what an error location names (the rest are union member tags).
FIELD_NAMES = frozenset(name for model in (ChatCompletionRequest, CompletionRequest, ChatMessage, ContentPart,
                                           StreamOptions) for name in model.model_fields)
