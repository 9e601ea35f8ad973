"""From a validated request body to what the engine takes: prompt ids, SamplingParams per choice."""

import dataclasses

from engine.core.sampling import SamplingParams
from engine.server import protocol as p
from engine.server.errors import BadRequest

# As vLLM: a temperature under this is greedy (dividing logits by it overflows float32).
GREEDY_EPS = 1e-5
# The smallest nucleus mass float32 sampling tells apart from 0 (the top token is always kept).
MIN_TOP_P = 1e-6


def check_supported(body: p.SamplingFields) -> None:
    """400 naming the first OpenAI parameter in use that llmserve does not do (tools, response_format, ...)."""
    found = p.unsupported(body)
    if found is not None:
        name, message = found
        code = "unsupported_value" if name in ("response_format", "modalities", "store", "best_of") \
            else "unsupported_parameter"
        raise BadRequest(message, name, code)


def prompt_ids(tokenizer, body) -> tuple[list[int], str | None]:
    """The prompt's token ids, and its text (None for a prompt given as token ids)."""
    if isinstance(body, p.ChatCompletionRequest):
        text = tokenizer.apply_chat_template([{"role": m.role, "content": m.text()} for m in body.messages])
        return tokenizer.encode(text), text
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return list(prompt), None
    text = prompt[0] if isinstance(prompt, list) else prompt
    return tokenizer.encode(text), text


def sampling(body: p.SamplingFields, default_max: int, vocab_size: int) -> SamplingParams:
    """The request's SamplingParams (of its first choice); InvalidRequestError/BadRequest naming a bad field."""
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    temperature = 1.0 if body.temperature is None else body.temperature
    params = SamplingParams(
        max_tokens=body.max_tokens or default_max,
        temperature=0.0 if temperature < GREEDY_EPS else temperature,
        top_p=1.0 if body.top_p is None else max(body.top_p, MIN_TOP_P),
        top_k=body.top_k if body.top_k and body.top_k > 0 else None,
        seed=body.seed, stop=stop, ignore_eos=bool(body.ignore_eos),
        stop_token_ids=list(body.stop_token_ids or []),
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        min_tokens=body.min_tokens or 0,
        logit_bias=_logit_bias(body.logit_bias),
        logprobs=_logprobs(body),
    )
    params.validate(vocab_size)
    return params


def per_choice(params: SamplingParams, n: int) -> list[SamplingParams]:
    """n choices of one request; a seeded one gets seed, seed + 1, ... so that its choices differ."""
    if params.seed is None:
        return [params] * n
    return [params] + [dataclasses.replace(params, seed=params.seed + i) for i in range(1, n)]


def echo_text(tokenizer, body, ids: list[int], text: str | None) -> str | None:
    """The prompt text a completions request with `echo` gets before its answer (else None)."""
    if not isinstance(body, p.CompletionRequest) or not body.echo:
        return None
    if body.logprobs is not None:
        raise BadRequest("echo with logprobs is not supported: llmserve returns no prompt logprobs", "echo",
                         "unsupported_value")
    return text if text is not None else tokenizer.decode(ids)


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's JSON keys are token ids written as strings."""
    out = {}
    for key, value in (bias or {}).items():
        try:
            out[int(key)] = value
        except ValueError:
            raise BadRequest(f"logit_bias: {key!r} is not a token id (keys are token ids, as strings)",
                             "logit_bias") from None
    return out


def _logprobs(body: p.SamplingFields) -> int | None:
    """Alternatives per token (0: the chosen token's own logprob only), or None for no logprobs."""
    if isinstance(body, p.ChatCompletionRequest):
        if body.top_logprobs is not None and not body.logprobs:
            raise BadRequest("top_logprobs: logprobs must be true when top_logprobs is given", "top_logprobs")
        return (body.top_logprobs or 0) if body.logprobs else None
    return body.logprobs
