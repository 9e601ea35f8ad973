"""Load shapes (users over time) per profile, and the open-loop Poisson arrival schedule.

Each shape is a LoadTestShape marked abstract, so Locust never picks one on its own; the locustfile's
single ProfileShape delegates `tick()` to the one `--profile` names. -u is the peak user count.
"""

import math
import random
import time
from collections.abc import Callable

from locust import LoadTestShape


class ProfileShapeBase(LoadTestShape):
    """users(t) for a peak of `num_users`; subclasses define `users_at`."""

    abstract = True

    def __init__(self, num_users: int = 1, spawn_rate: float = 1.0, stage_s: float = 10.0, num_steps: int = 4):
        super().__init__()
        self.num_users = num_users
        self.spawn_rate = spawn_rate
        self.stage_s = stage_s
        self.num_steps = num_steps

    def users_at(self, t: float) -> tuple[int, float]:
        raise NotImplementedError

    def tick(self) -> tuple[int, float] | None:
        return self.users_at(self.get_run_time())


class SteadyShape(ProfileShapeBase):
    """-u users from the start (spawned at -r per second)."""

    abstract = True

    def users_at(self, t: float) -> tuple[int, float]:
        return self.num_users, self.spawn_rate


class RampShape(ProfileShapeBase):
    """Linear from 1 user to -u over three stages, then hold."""

    abstract = True

    def users_at(self, t: float) -> tuple[int, float]:
        ramp_s = 3 * self.stage_s
        users = 1 + math.floor((self.num_users - 1) * min(1.0, t / ramp_s))
        return users, float(self.num_users)


class SpikeShape(ProfileShapeBase):
    """A quarter of -u for a stage, all -u at once for a stage, back down; repeats."""

    abstract = True

    def users_at(self, t: float) -> tuple[int, float]:
        base = max(1, self.num_users // 4)
        in_spike = math.floor(t / self.stage_s) % 3 == 1
        return (self.num_users if in_spike else base), float(self.num_users)


class StepShape(ProfileShapeBase):
    """-u / num_steps more users every stage until -u, then hold."""

    abstract = True

    def users_at(self, t: float) -> tuple[int, float]:
        step = min(self.num_steps, 1 + math.floor(t / self.stage_s))
        users = max(1, round(self.num_users * step / self.num_steps))
        return users, float(self.num_users)


class ConcurrencyShape(ProfileShapeBase):
    """poisson: the user count is the concurrency ceiling, all spawned at once; arrivals set the load."""

    abstract = True

    def users_at(self, t: float) -> tuple[int, float]:
        return self.num_users, float(self.num_users)


SHAPES: dict[str, type[ProfileShapeBase]] = {
    "ramp": RampShape, "spike": SpikeShape, "step": StepShape, "poisson": ConcurrencyShape,
}


def shape_for(profile: str) -> type[ProfileShapeBase]:
    """Profiles that are about prompts, not load (abort, shared-prefix, ...) run a steady shape."""
    return SHAPES.get(profile, SteadyShape)


class ArrivalSchedule:
    """Open-loop send times: exponential gaps at `rate` per second, shared by all users of a process.

    A user takes the next slot, sleeps until it, and measures latency from the slot, so a client
    that is late (all users busy) shows up as client queue time instead of hiding server queueing.
    """

    def __init__(self, rate: float, rng: random.Random, clock: Callable[[], float] = time.perf_counter,
                 share: Callable[[], float] = lambda: 1.0):
        self.rate = rate
        self.rng = rng
        self.clock = clock
        self.share = share  # this process's part of the rate (workers split it)
        self._next_ts: float | None = None

    def next_slot(self) -> float:
        if self._next_ts is None:
            self._next_ts = self.clock()
        slot = self._next_ts
        self._next_ts += self.rng.expovariate(self.rate * max(self.share(), 1e-9))
        return slot
