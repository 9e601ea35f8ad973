"""Scheduler: continuous batching, token and sequence budgets, chunked prefill, preemption and resume."""

from engine.core.block_manager import KVCacheManager
from engine.core.sampling import SamplingParams
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.sequence import Request, RequestStatus


def make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64, caching=True):
    kv = KVCacheManager(num_blocks, block_size, caching)
    return Scheduler(kv, max_num_seqs, max_num_batched_tokens)


def make_request(request_id: str, num_prompt: int, first_token: int = 0) -> Request:
    return Request(request_id, list(range(first_token, first_token + num_prompt)), SamplingParams(), 0.0)


def fake_execute(out: SchedulerOutput, token: int = 7) -> list[str]:
    """What the engine does after a forward: advance progress, append a token where one is sampled."""
    sampled = []
    for item in out.scheduled:
        item.request.num_computed_tokens += item.num_new_tokens
        if item.completes_prompt:
            item.request.append_token(token)
            sampled.append(item.request.request_id)
    return sampled


def summary(out: SchedulerOutput) -> list[tuple[str, int]]:
    return [(s.request.request_id, s.num_new_tokens) for s in out.scheduled]


def test_requests_join_and_leave_between_steps():
    sched = make_scheduler()
    sched.add(make_request("a", 5))
    sched.add(make_request("b", 3, first_token=100))
    out = sched.schedule()
    assert summary(out) == [("a", 5), ("b", 3)]
    assert out.new_request_ids == ["a", "b"]
    assert fake_execute(out) == ["a", "b"]
    sched.add(make_request("c", 6, first_token=200))
    out = sched.schedule()
    assert summary(out) == [("a", 1), ("b", 1), ("c", 6)]  # decodes first, then the newcomer
    assert out.new_request_ids == ["c"]
    fake_execute(out)
    a = sched.running[0]
    sched.remove(a)  # finished: leaves at once and frees its blocks
    assert sched.kv.block_ids("a") == []
    assert summary(sched.schedule()) == [("b", 1), ("c", 1)]


def test_long_prompt_is_prefilled_in_chunks_within_the_token_budget():
    sched = make_scheduler(max_num_batched_tokens=8)
    sched.add(make_request("long", 20))
    steps = []
    for _ in range(3):
        out = sched.schedule()
        steps.append((summary(out), fake_execute(out)))
    assert steps == [([("long", 8)], []), ([("long", 8)], []), ([("long", 4)], ["long"])]
    # A decode and a new prompt share the next budget: 1 + 7 tokens.
    sched.add(make_request("next", 10, first_token=50))
    out = sched.schedule()
    assert summary(out) == [("long", 1), ("next", 7)]
    assert out.num_batched_tokens == 8


def test_max_num_seqs_caps_the_batch():
    sched = make_scheduler(max_num_seqs=2)
    for i in range(3):
        sched.add(make_request(f"r{i}", 2, first_token=10 * i))
    out = sched.schedule()
    assert summary(out) == [("r0", 2), ("r1", 2)]
    assert sched.num_waiting == 1 and sched.num_running == 2


def test_newest_running_request_is_preempted_and_resumes_from_the_front():
    # 6 blocks of 4 tokens: two prompts of 8 tokens take 4 blocks; decoding fills the rest.
    sched = make_scheduler(num_blocks=6, block_size=4, caching=False)
    a, b = make_request("a", 8), make_request("b", 8, first_token=100)
    sched.add(a)
    sched.add(b)
    fake_execute(sched.schedule())  # prefill both: 4 blocks used, one token sampled each
    sched.add(make_request("c", 4, first_token=200))
    preempted_at = None
    for step in range(1, 10):
        out = sched.schedule()
        if out.preempted_request_ids:
            preempted_at = step
            break
        fake_execute(out)
    # Steps 1-4 give a and b their third block each (tokens 9..12); c never fits meanwhile.
    assert preempted_at == 5
    assert out.preempted_request_ids == ["b"]
    assert summary(out) == [("a", 1)]
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert sched.kv.block_ids("b") == []
    assert [r.request_id for r in sched.waiting] == ["b", "c"]
    assert out.new_request_ids == []  # no admission in a step that preempted
    fake_execute(out)
    sched.remove(a)  # a finishes: b comes back first and recomputes prompt + outputs
    out = sched.schedule()
    assert summary(out)[0] == ("b", 8 + 5)
    assert "b" not in out.new_request_ids  # a resume is not a first scheduling
    assert b.status is RequestStatus.RUNNING and b.num_preemptions == 1


def test_prefix_hits_are_counted_in_tokens_for_new_requests_only():
    sched = make_scheduler(block_size=4)
    sched.add(make_request("a", 10))
    out = sched.schedule()
    assert (out.prefix_queried_tokens, out.prefix_hit_tokens) == (10, 0)
    fake_execute(out)
    sched.add(make_request("b", 10))
    out = sched.schedule()
    assert (out.prefix_queried_tokens, out.prefix_hit_tokens) == (10, 8)
    assert summary(out) == [("a", 1), ("b", 2)]
