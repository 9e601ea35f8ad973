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

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

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
            if not _is_int(token_id) or token_id < 0 or (vocab_size is not None and token_id >= vocab_size):
                raise _bad("stop_token_ids", f"holds {token_id!r}, not a token id of this model")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value  # not NaN


def _bad(param: str, problem: str) -> errors.InvalidRequestError:
    return errors.InvalidRequestError(f"{param} {problem}", param=param)
