"""Prefix cache: requests sharing a 1,024-token system prompt, caching on vs off.

Each request is the shared system prompt plus its own user turn, sent one at a time after the
previous one finished; TTFT comes from the engine's own RequestStats. The hit rate is compared
with the best possible given block boundaries (only full blocks are cached and the last prompt
token is always computed). Prints one JSON object as its last line.

    python bench/prefix_cache.py --quick
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.config import EngineConfig  # noqa: E402
from engine.core.engine import LLMEngine  # noqa: E402
from engine.core.sampling import SamplingParams  # noqa: E402
from engine.model.loader import load_model  # noqa: E402

SYSTEM_LINE = "You are a careful site reliability assistant. Answer with the runbook step and the metric to check. "


def system_prompt(tokenizer, num_tokens: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < num_tokens:
        ids += tokenizer.encode(SYSTEM_LINE)
    return ids[:num_tokens]


def user_turn(tokenizer, i: int) -> list[int]:
    return tokenizer.encode(f"User {i}: why is p99 time to first token high on replica {i * 7 % 13}? Explain.")


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[tuple[float, int, int]]:
    """(ttft_s, queried tokens, hit tokens) per request, one request at a time."""
    results = []
    for i, prompt in enumerate(prompts):
        engine.add_request(f"p{i}", prompt, params)
        queried = hits = 0
        ttft = None
        while engine.has_unfinished_requests():
            step = engine.step()
            queried += step.stats.prefix_queried_tokens
            hits += step.stats.prefix_hit_tokens
            for out in step.outputs:
                if out.finished:
                    ttft = out.metrics.ttft_s
        results.append((ttft, queried, hits))
    return results


def best_hits(prompts: list[list[int]], shared_len: int, block_size: int) -> int:
    """Hit tokens if every full block of the shared prefix were reused after the first request."""
    total = 0
    for prompt in prompts[1:]:
        reusable = min(shared_len, len(prompt) - 1)  # the last token is always computed
        total += reusable // block_size * block_size
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (< 1 min)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--num-requests", type=int, default=12)
    parser.add_argument("--system-tokens", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: on a busy machine OpenMP threads spin-wait)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default=None,
                        help="the engine clock for TTFT: cpu = process CPU time, immune to other processes' load "
                             "(default on CPU); wall = time.monotonic (default on CUDA)")
    args = parser.parse_args(argv)
    clock_name = args.clock or ("wall" if args.device.startswith("cuda") else "cpu")
    clock = time.process_time if clock_name == "cpu" else time.monotonic
    if args.threads:
        torch.set_num_threads(args.threads)
    num_requests = 5 if args.quick else args.num_requests
    base = EngineConfig(device=args.device, dtype=args.dtype)
    loaded = load_model(base)
    system = system_prompt(loaded.tokenizer, args.system_tokens)
    prompts = [system + user_turn(loaded.tokenizer, i) for i in range(num_requests)]
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)

    cached = run(LLMEngine(base, clock, loaded=loaded), prompts, params)
    nocache_config = EngineConfig(device=args.device, dtype=args.dtype, enable_prefix_caching=False)
    uncached_engine = LLMEngine(nocache_config, clock, loaded=loaded)
    uncached = run(uncached_engine, prompts, params)

    # The first request fills the cache; TTFT is compared over the ones that can hit.
    ttft_cache = statistics.median(r[0] for r in cached[1:])
    ttft_nocache = statistics.median(r[0] for r in uncached[1:])
    queried = sum(r[1] for r in cached)
    hits = sum(r[2] for r in cached)
    max_hits = best_hits(prompts, len(system), base.block_size)
    result = {
        "bench": "prefix_cache",
        "device": str(next(loaded.model.parameters()).device),
        "clock": clock_name,
        "num_requests": num_requests,
        "system_tokens": len(system),
        "block_size": base.block_size,
        "ttft_cache_s": round(ttft_cache, 4),
        "ttft_nocache_s": round(ttft_nocache, 4),
        "ttft_ratio_nocache_vs_cache": round(ttft_nocache / ttft_cache, 2),
        "hit_rate": round(hits / queried, 4),
        "hit_rate_max": round(max_hits / queried, 4),
        "hit_rate_gap_blocks": round((max_hits - hits) / base.block_size / (num_requests - 1), 3),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
