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
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise errors.InvalidRequestError(
                f"max_tokens must be at least 1, got {self.max_tokens!r}", param="max_tokens"
            )
        if not 0.0 <= float(self.temperature) <= 100.0:
            raise errors.InvalidRequestError(
                f"temperature must be in [0, 100], got {self.temperature!r}", param="temperature"
            )
        if not 0.0 < float(self.top_p) <= 1.0:
            raise errors.InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}", param="top_p")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise errors.InvalidRequestError(
                f"top_k must be a positive integer or None, got {self.top_k!r}", param="top_k"
            )
        if self.seed is not None and not isinstance(self.seed, int):
            raise errors.InvalidRequestError(f"seed must be an integer, got {self.seed!r}", param="seed")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise errors.InvalidRequestError("stop must be a list of non-empty strings", param="stop")
        for token_id in self.stop_token_ids:
            if not isinstance(token_id, int) or token_id < 0 or (
                vocab_size is not None and token_id >= vocab_size
            ):
                raise errors.InvalidRequestError(
                    f"stop_token_ids holds {token_id!r}, not a token id of this model", param="stop_token_ids"
                )
