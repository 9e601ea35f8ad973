"""What the engine hands back each step: per-request deltas and finish reasons."""

from dataclasses import dataclass, field
from enum import StrEnum


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(slots=True)
class TokenLogprob:
    """One sampled token's log-probability and the most likely alternatives (id, logprob), best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(slots=True)
class RequestOutput:
    """One request's progress in one step (or its final state when `finished`)."""

    request_id: str
    new_token_ids: list[int]
    new_text: str  # incremental detokenized text for new_token_ids (stop strings already cut)
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache (first scheduling)
    num_output_tokens: int  # total generated so far
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None  # message when finish_reason is ERROR
    metrics: "object | None" = field(default=None)  # engine.obs.stats.RequestStats when finished
    logprobs: list[TokenLogprob] | None = None  # one per new_token_ids, when the request asked for logprobs
