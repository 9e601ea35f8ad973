"""Per-step and per-request stats: slotted dataclasses filled with plain arithmetic in the step."""

import hashlib
from dataclasses import dataclass, field

FINGERPRINT_BLOCKS = 8


@dataclass(slots=True)
class StepStats:
    """One engine step, snapshotted from the engine's counters (which are then reset)."""

    ts: float
    num_running: int
    num_waiting: int
    num_preemptions: int
    num_blocks_used: int  # held by live requests
    num_blocks_cached: int  # free, but holding a cached prefix (reusable until evicted)
    num_blocks_total: int
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    num_prompt_tokens_computed: int
    num_generation_tokens: int
    batch_size: int
    step_duration_s: float
    forward_duration_s: float
    preempted_request_ids: list[str] = field(default_factory=list)
    scheduled_request_ids: list[str] = field(default_factory=list)  # first scheduling this step

    @property
    def kv_usage(self) -> float:
        return self.num_blocks_used / self.num_blocks_total if self.num_blocks_total else 0.0


@dataclass(slots=True)
class RequestStats:
    """Timestamps of one request's life, on the engine's clock (time.monotonic by default)."""

    arrival_ts: float
    first_scheduled_ts: float | None = None
    first_token_ts: float | None = None
    token_ts: list[float] = field(default_factory=list)
    preemption_ts: list[float] = field(default_factory=list)
    finished_ts: float | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    finish_reason: str | None = None
    prefix_fingerprint: list[str] = field(default_factory=list)

    @property
    def queue_s(self) -> float | None:
        """Arrival to first scheduling (later preemptions are ignored, as in vLLM)."""
        return _diff(self.first_scheduled_ts, self.arrival_ts)

    @property
    def ttft_s(self) -> float | None:
        return _diff(self.first_token_ts, self.arrival_ts)

    @property
    def prefill_s(self) -> float | None:
        return _diff(self.first_token_ts, self.first_scheduled_ts)

    @property
    def decode_s(self) -> float | None:
        if not self.token_ts:
            return None
        return _diff(self.token_ts[-1], self.first_token_ts)

    @property
    def e2e_s(self) -> float | None:
        return _diff(self.finished_ts, self.arrival_ts)

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first: decode_s / (num_output_tokens - 1)."""
        decode_s = self.decode_s
        if decode_s is None or len(self.token_ts) < 2:
            return None
        return decode_s / (len(self.token_ts) - 1)

    @property
    def itl_s(self) -> list[float]:
        ts = self.token_ts
        return [ts[i] - ts[i - 1] for i in range(1, len(ts))]


def _diff(end: float | None, start: float | None) -> float | None:
    if end is None or start is None:
        return None
    return end - start


def prefix_fingerprint(token_ids: list[int], block_size: int) -> list[str]:
    """8-hex hashes of the first full blocks, each hashed on its own (not chained).

    Unchained hashes let a log reader see *which* block of two prompts differs, where the
    cache's chained hashes would differ from the first difference onwards.
    """
    hashes = []
    num_blocks = min(len(token_ids) // block_size, FINGERPRINT_BLOCKS)
    for i in range(num_blocks):
        chunk = token_ids[i * block_size : (i + 1) * block_size]
        data = b"".join(t.to_bytes(4, "little", signed=True) for t in chunk)
        hashes.append(hashlib.sha256(data).hexdigest()[:8])
    return hashes
