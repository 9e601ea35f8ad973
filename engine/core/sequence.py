"""One request's state inside the engine: tokens, progress, status, text and timestamps."""

from dataclasses import dataclass, field
from enum import Enum

from engine.core.outputs import FinishReason
from engine.core.sampling import SamplingParams
from engine.obs.stats import RequestStats


class RequestStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue, its KV blocks given up
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Request:
    """A prompt and everything generated for it so far.

    Invariant: `all_token_ids = prompt_token_ids + output_token_ids`, and the KV cache holds the
    first `num_computed_tokens` of them. The last sampled token is not yet in the cache: the next
    decode step feeds it to the model.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_ts: float
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int | None = None  # prefix-cache hit at first scheduling
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    error: str | None = None
    block_hashes: list[bytes] = field(default_factory=list)  # chained hashes of its full blocks
    num_preemptions: int = 0
    # Incremental detokenization (see engine.core.detokenizer).
    prefix_offset: int = 0
    read_offset: int = 0
    output_text: str = ""
    num_text_sent: int = 0  # characters of output_text already handed out
    stats: RequestStats | None = None
    generator: object | None = None  # torch.Generator of a seeded request, made at first sampling

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)
        # Start detokenizing a few prompt tokens back so the first output token gets its
        # leading space right with SentencePiece-style tokenizers.
        self.read_offset = len(self.prompt_token_ids)
        self.prefix_offset = max(0, self.read_offset - 5)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
