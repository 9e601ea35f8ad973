"""Continuous-batching scheduler: waiting and running queues, token budgets, chunked prefill, preemption.

Each step hands out a budget of `max_num_batched_tokens` tokens over at most `max_num_seqs`
sequences. Running requests go first (one token each in decode, the next chunk of a prompt
in prefill); waiting requests then join in arrival order while blocks and budget last. A prompt
longer than the budget is prefilled in chunks across steps. When a running request cannot get
a block, the newest running request is preempted by recompute: it gives up its blocks and goes
back to the front of the waiting queue.
"""

from collections import deque
from dataclasses import dataclass, field

from engine.core.block_manager import KVCacheManager
from engine.core.sequence import Request, RequestStatus


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # tokens computed for it in this step
    num_computed_tokens: int  # tokens already in its cache before this step

    @property
    def completes_prompt(self) -> bool:
        """True when, after this step, every known token is computed so one is sampled."""
        return self.num_computed_tokens + self.num_new_tokens == self.request.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_request_ids: list[str] = field(default_factory=list)
    new_request_ids: list[str] = field(default_factory=list)  # first scheduling ever, this step
    num_batched_tokens: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0


class Scheduler:
    def __init__(self, kv_manager: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.kv = kv_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Take a finished or aborted request out of its queue and free its blocks at once."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        if not out.preempted_request_ids:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            scheduled = True
            while not self.kv.can_allocate(request, num_new):
                victim = self.running.pop()  # the newest running request
                self._preempt(victim, out)
                if victim is request:
                    scheduled = False
                    break
            if not scheduled:
                break
            self.kv.allocate(request, num_new)
            out.scheduled.append(ScheduledRequest(request, num_new, request.num_computed_tokens))
            budget -= num_new
            i += 1
        out.num_batched_tokens += self.max_num_batched_tokens - budget
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        start_budget = budget
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            computed_blocks, num_hit = self.kv.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_hit, budget)
            if not self.kv.can_allocate(request, num_new, computed_blocks):
                break  # first come, first served: no overtaking the head of the queue
            self.waiting.popleft()
            self.kv.allocate(request, num_new, computed_blocks)
            if request.status is RequestStatus.WAITING:  # first scheduling (not a resume)
                request.num_cached_tokens = num_hit
                out.new_request_ids.append(request.request_id)
                if self.kv.enable_caching:  # counted in tokens, new requests only (as vLLM)
                    out.prefix_queried_tokens += request.num_tokens
                    out.prefix_hit_tokens += num_hit
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.scheduled.append(ScheduledRequest(request, num_new, num_hit))
            budget -= num_new
        out.num_batched_tokens += start_budget - budget

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)
        out.preempted_request_ids.append(request.request_id)
