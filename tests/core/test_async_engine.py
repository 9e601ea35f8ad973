"""AsyncEngine: concurrent streams, cancellation aborts, step errors, a dead loop, queue limits."""

import asyncio

import pytest
import torch
from engine_rig import run_to_completion

from engine import errors
from engine.core.async_engine import AsyncEngine
from engine.core.faults import FaultConfig
from engine.core.outputs import FinishReason
from engine.core.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = [[(5 * i + j) % 200 for j in range(9)] for i in range(4)]


async def collect(engine: AsyncEngine, request_id: str, prompt: list[int], params=GREEDY):
    outputs = [out async for out in engine.generate(request_id, prompt, params)]
    return [t for o in outputs for t in o.new_token_ids], outputs[-1]


async def eventually(predicate, attempts: int = 500) -> bool:
    """Poll the step thread's progress; a hang guard, not a latency threshold."""
    for _ in range(attempts):
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return predicate()


@pytest.fixture
def make_async(make_engine):
    started = []

    def make(max_queue_len=None, start=True, **overrides) -> AsyncEngine:
        engine = AsyncEngine(make_engine(**overrides), max_queue_len=max_queue_len)
        if start:
            engine.start()
        started.append(engine)
        return engine

    yield make
    for engine in started:
        engine.shutdown()


def test_concurrent_streams_match_the_synchronous_engine(make_async, make_engine):
    sync = make_engine()
    for i, prompt in enumerate(PROMPTS):
        sync.add_request(f"r{i}", prompt, GREEDY)
    expected = {rid: entry[0] for rid, entry in run_to_completion(sync).items()}
    engine = make_async()
    seen_stats = []
    engine.add_step_listener(lambda stats, outputs: seen_stats.append(stats.batch_size))
    engine.add_step_listener(lambda stats, outputs: 1 / 0)  # a broken sink changes nothing

    async def main():
        return await asyncio.gather(*(collect(engine, f"r{i}", p) for i, p in enumerate(PROMPTS)))

    results = asyncio.run(main())
    assert {f"r{i}": tokens for i, (tokens, _) in enumerate(results)} == expected
    finals = [final for _, final in results]
    assert all(f.finished and f.finish_reason is FinishReason.LENGTH and f.metrics.ttft_s > 0 for f in finals)
    assert max(seen_stats) > 1 and engine.is_running


def test_cancelling_the_consumer_aborts_and_frees_blocks(make_async):
    engine = make_async()
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)

    async def main():
        got = asyncio.Event()

        async def consume():
            async for _ in engine.generate("a", PROMPTS[0], params):
                got.set()

        task = asyncio.create_task(consume())
        await got.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await eventually(lambda: not engine.engine.has_unfinished_requests())

    assert asyncio.run(main())
    assert engine.engine.kv.num_used_blocks == 0


def test_a_failing_step_finishes_its_requests_with_error_and_the_engine_lives(make_async):
    engine = make_async(faults=FaultConfig(oom_after_requests=1))
    errors_seen = []
    engine.add_error_listener(lambda exc, tb, ids: errors_seen.append((type(exc), "OutOfMemoryError" in tb, ids)))

    async def main():
        first = await collect(engine, "a", PROMPTS[0])
        second = await collect(engine, "b", PROMPTS[1])
        return first, second

    (_, ok), (tokens, failed) = asyncio.run(main())
    assert ok.finish_reason is FinishReason.LENGTH
    assert tokens == [] and failed.finish_reason is FinishReason.ERROR
    assert failed.error.startswith("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert errors_seen == [(torch.OutOfMemoryError, True, ["b"])]
    assert not engine.is_dead and engine.is_running
    assert engine.engine.kv.num_used_blocks == 0


def test_a_fatal_error_kills_the_loop_visibly(make_async):
    engine = make_async(faults=FaultConfig(crash_after_requests=1))
    fatal = []
    engine.add_error_listener(lambda exc, tb, ids: fatal.append((type(exc), ids)))
    long = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)

    async def main():
        results = await asyncio.gather(
            collect(engine, "short", PROMPTS[0], SamplingParams(max_tokens=2, temperature=0.0)),
            collect(engine, "long", PROMPTS[1], long),
        )
        with pytest.raises(errors.EngineDeadError, match="crash after 1 finished requests"):
            await collect(engine, "late", PROMPTS[2])
        return results

    (_, short), (_, long_final) = asyncio.run(main())
    assert short.finish_reason is FinishReason.LENGTH
    assert long_final.finish_reason is FinishReason.ERROR and "EngineDeadError" in long_final.error
    assert engine.is_dead and not engine.is_running
    assert isinstance(engine.dead_error, errors.FatalEngineError)
    assert fatal == [(errors.FatalEngineError, ["long"])]


def test_queue_full_and_prompt_too_long_are_raised_to_the_caller(make_async):
    engine = make_async(max_queue_len=1, start=False, max_num_seqs=1)

    async def main():
        first = engine.generate("a", PROMPTS[0], GREEDY)  # takes the one batch slot
        second = engine.generate("b", PROMPTS[1], GREEDY)  # the one request the queue may hold
        pending = [asyncio.create_task(first.__anext__()), asyncio.create_task(second.__anext__())]
        await asyncio.sleep(0)  # both are queued
        with pytest.raises(errors.QueueFullError, match="waiting queue is full"):
            await engine.generate("c", PROMPTS[2], GREEDY).__anext__()
        with pytest.raises(errors.PromptTooLongError):
            await engine.generate("d", [1] * 30, GREEDY).__anext__()
        engine.start()
        outs = await asyncio.gather(*pending)
        await first.aclose()
        await second.aclose()
        return outs

    assert [out.request_id for out in asyncio.run(main())] == ["a", "b"]


def test_queue_limit_counts_requests_beyond_the_free_batch_slots(make_async):
    """A burst onto an idle engine fills its free slots first: only what no slot can take is queued."""
    engine = make_async(max_queue_len=2, start=False, max_num_seqs=6, num_kv_blocks=128)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)

    async def main():
        streams = [engine.generate(f"r{i}", PROMPTS[i % 4], params) for i in range(9)]
        firsts = [asyncio.ensure_future(stream.__anext__()) for stream in streams]
        await asyncio.sleep(0)
        refused = [f for f in firsts if f.done() and isinstance(f.exception(), errors.QueueFullError)]
        engine.start()
        accepted = [await f for f in firsts if f not in refused]
        for stream in streams:
            await stream.aclose()
        return len(accepted), len(refused)

    assert asyncio.run(main()) == (8, 1)  # 6 slots + 2 queued; the ninth is refused


def test_shutdown_aborts_requests_in_flight(make_async):
    engine = make_async()
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)

    async def main():
        stream = engine.generate("a", PROMPTS[0], params)
        first = await stream.__anext__()
        await asyncio.to_thread(engine.shutdown)
        return first, [out async for out in stream]

    first, rest = asyncio.run(main())
    with pytest.raises(errors.EngineDeadError, match="shut down"):
        asyncio.run(collect(engine, "late", PROMPTS[1]))
    assert not first.finished
    assert rest[-1].finished and rest[-1].finish_reason is FinishReason.ABORT
    assert engine.engine.kv.num_used_blocks == 0 and not engine.is_running


def test_requests_queued_at_shutdown_are_told_the_engine_is_gone(make_async):
    engine = make_async(start=False)

    async def main():
        stream = engine.generate("a", PROMPTS[0], GREEDY)
        pending = asyncio.create_task(stream.__anext__())
        await asyncio.sleep(0)  # queued; no loop will ever apply it
        engine.shutdown()
        with pytest.raises(errors.EngineDeadError, match="shut down"):
            await pending

    asyncio.run(main())


def test_an_idle_engine_does_not_step(make_async):
    engine = make_async()
    steps = []
    engine.add_step_listener(lambda stats, outputs: steps.append(stats))

    async def main():
        await asyncio.sleep(0.1)
        idle_steps = len(steps)
        await collect(engine, "a", PROMPTS[0], SamplingParams(max_tokens=2, temperature=0.0))
        busy_steps = len(steps)
        await asyncio.sleep(0.1)
        return idle_steps, busy_steps, len(steps)

    assert asyncio.run(main()) == (0, 2, 2)
