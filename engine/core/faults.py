"""Test-only fault injection (off by default): a crash, a CUDA out-of-memory, a slow step."""

import time
from dataclasses import dataclass

import torch

from engine import errors

# PyTorch >= 2.2 caching-allocator wording (reference: triage.md section 5.2).
OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which "
    "1.06 GiB is free. Including non-PyTorch memory, this process has 78.04 GiB memory in use. Of the "
    "allocated memory 75.32 GiB is allocated by PyTorch, and 1.21 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


@dataclass(slots=True)
class FaultConfig:
    crash_after_requests: int | None = None  # the loop dies after this many finished requests
    oom_after_requests: int | None = None  # from then on every forward raises a CUDA OOM
    step_delay_s: float = 0.0  # sleep inside every step: a slow GPU


class FaultInjector:
    """Holds the fault settings and the count of finished requests they trigger on."""

    def __init__(self, config: FaultConfig | None):
        self.config = config or FaultConfig()
        self.num_finished = 0

    @property
    def active(self) -> bool:
        c = self.config
        return c.crash_after_requests is not None or c.oom_after_requests is not None or c.step_delay_s > 0

    def on_step_start(self) -> None:
        if self.config.step_delay_s > 0:
            time.sleep(self.config.step_delay_s)

    def before_forward(self) -> None:
        n = self.config.oom_after_requests
        if n is not None and self.num_finished >= n:
            raise torch.OutOfMemoryError(OOM_MESSAGE)

    def crash_error(self) -> errors.FatalEngineError | None:
        """The fatal error to die with, once enough requests have finished."""
        n = self.config.crash_after_requests
        if n is not None and self.num_finished >= n:
            return errors.FatalEngineError(
                f"Injected fault: engine crash after {n} finished requests (--fault-crash-after-requests)"
            )
        return None
