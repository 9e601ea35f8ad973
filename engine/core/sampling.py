"""Per-request sampling parameters and their validation."""

from dataclasses import dataclass, field

from engine import errors


@dataclass(slots=True)
class SamplingParams:
    """How one request samples and when it stops. temperature 0 means greedy."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0  # subtracted once from the logit of every token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in the generated tokens
    repetition_penalty: float = 1.0  # divides positive (multiplies negative) logits of prompt and output tokens
    min_tokens: int = 0  # no eos, stop token or stop string before this many tokens
    logit_bias: dict[int, float] = field(default_factory=dict)  # added to the logits of these token ids
    logprobs: int | None = None  # alternatives returned per token (0: the chosen token's only); None: none

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processes_logits(self) -> bool:
        """True when the sampler must change this request's logits before choosing (penalties, bias, min)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens)

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise errors.InvalidRequestError naming the first bad field."""
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise _bad("max_tokens", f"must be an integer of at least 1, got {self.max_tokens!r}")
        if not _is_number(self.temperature) or not 0.0 <= self.temperature <= 100.0:
            raise _bad("temperature", f"must be a number in [0, 100], got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise _bad("top_p", f"must be a number in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise _bad("top_k", f"must be a positive integer or None, got {self.top_k!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise _bad("seed", f"must be an integer, got {self.seed!r}")
        if not isinstance(self.stop, list) or any(not isinstance(s, str) or not s for s in self.stop):
            # The strings themselves stay out of the message: it is logged, and prompts are not.
            raise _bad("stop", "must be a list of non-empty strings")
        if not isinstance(self.stop_token_ids, list):
            raise _bad("stop_token_ids", f"must be a list of token ids, got {self.stop_token_ids!r}")
        for token_id in self.stop_token_ids:
            if not _is_token_id(token_id, vocab_size):
                raise _bad("stop_token_ids", f"holds {token_id!r}, not a token id of this model")
        self._validate_processing(vocab_size)

    def _validate_processing(self, vocab_size: int | None) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= value <= 2.0:
                raise _bad(name, f"must be a number in [-2, 2], got {value!r}")
        # Bounded below too: dividing logits by a denormal makes them infinite, and softmax NaN.
        if not _is_number(self.repetition_penalty) or not 0.01 <= self.repetition_penalty <= 100.0:
            raise _bad("repetition_penalty", f"must be a number in [0.01, 100], got {self.repetition_penalty!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise _bad("min_tokens", f"must be an integer in [0, max_tokens={self.max_tokens}], "
                                     f"got {self.min_tokens!r}")
        if not isinstance(self.logit_bias, dict):
            raise _bad("logit_bias", "must map token ids to numbers")
        for token_id, bias in self.logit_bias.items():
            if not _is_token_id(token_id, vocab_size):
                raise _bad("logit_bias", f"holds {token_id!r}, not a token id of this model")
            if not _is_number(bias) or not -100.0 <= bias <= 100.0:
                raise _bad("logit_bias", f"values must be numbers in [-100, 100], got {bias!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise _bad("logprobs", f"must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")


MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit


def _is_token_id(value, vocab_size: int | None) -> bool:
    return _is_int(value) and value >= 0 and (vocab_size is None or value < vocab_size)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value  # not NaN


def _bad(param: str, problem: str) -> errors.InvalidRequestError:
    return errors.InvalidRequestError(f"{param} {problem}", param=param)
