"""Pydantic request models of the OpenAI API subset we serve, and the response bodies we build."""

import re
import time
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# JSON types as OpenAI's schema gives them: "16" is not an integer, true is not a number, "yes" is
# not a boolean (strict: pydantic's default lax mode would coerce each). Fields OpenAI does not
# define are ignored, as OpenAI does.
STRICT = ConfigDict(extra="ignore", strict=True)
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool | None = False


class SamplingFields(BaseModel):
    """Fields shared by both endpoints; vLLM's extras ignore_eos and top_k included."""

    model_config = STRICT
    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None  # vLLM: -1 or 0 disables
    seed: Annotated[int, Field(ge=-(2**63), le=2**63 - 1)] | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=1)] | None = 1
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
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


class CompletionRequest(SamplingFields):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | Annotated[
        list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    echo: bool | None = False


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


def chat_response(rid: str, model: str, created: int, text: str, finish: str, usage_body: dict) -> dict:
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                     "logprobs": None, "finish_reason": finish}],
        "usage": usage_body,
    }


def chat_chunk(rid: str, model: str, created: int, delta: dict | None, finish: str | None,
               usage_body: dict | None = None) -> dict:
    choices = [] if delta is None else [
        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": choices}
    if usage_body is not None:
        body["usage"] = usage_body
    return body


def completion_response(rid: str, model: str, created: int, text: str, finish: str | None,
                        usage_body: dict | None, with_choice: bool = True) -> dict:
    """Streamed and non-streamed completions share this shape (a null finish_reason mid-stream)."""
    choices = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}] if with_choice else []
    body = {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices}
    if usage_body is not None:
        body["usage"] = usage_body
    return body


def model_list(model: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created,
                                        "owned_by": "llmsre"}]}


# Every field name of the request models: what an error location names (the rest are union member tags).
FIELD_NAMES = frozenset(name for model in (ChatCompletionRequest, CompletionRequest, ChatMessage, ContentPart,
                                           StreamOptions) for name in model.model_fields)
