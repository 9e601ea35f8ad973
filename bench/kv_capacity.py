"""KV capacity: sequences running at once with paged blocks vs a contiguous max_model_len reservation.

One KV budget (4 sequences of max_model_len if each reserved its maximum up front), a queue of
requests of mixed prompt and output lengths, the built-in model. The paged engine admits a
request when blocks for its current tokens are free; a contiguous allocator would hold
max_model_len slots per sequence. The key is the median number of running sequences over the
steps in which requests were still waiting (the cache, not the queue, was the limit), divided
by the contiguous count. Prints one JSON object as its last line.

    python bench/kv_capacity.py --quick
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.config import EngineConfig  # noqa: E402
from engine.core.engine import LLMEngine  # noqa: E402
from engine.core.sampling import SamplingParams  # noqa: E402

PROMPT_LENGTHS = (24, 64, 160, 40, 300, 96)
OUTPUT_LENGTHS = (16, 64, 32, 128, 48)


def mixed_requests(num: int) -> list[tuple[list[int], int]]:
    """Deterministic mix: prompt lengths 24-300, output lengths 16-128, distinct first tokens."""
    requests = []
    for i in range(num):
        length = PROMPT_LENGTHS[i % len(PROMPT_LENGTHS)]
        prompt = [(i * 53 + j * 7) % 256 for j in range(length)]
        requests.append((prompt, OUTPUT_LENGTHS[i % len(OUTPUT_LENGTHS)]))
    return requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer measured steps (< 1 min)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--contiguous-seqs", type=int, default=4, help="KV budget in max_model_len sequences")
    parser.add_argument("--num-requests", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: on a busy machine OpenMP threads spin-wait)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    block_size = 16
    num_blocks = args.contiguous_seqs * args.max_model_len // block_size
    config = EngineConfig(
        device=args.device, block_size=block_size, num_kv_blocks=num_blocks, max_model_len=args.max_model_len,
        max_num_seqs=256, max_num_batched_tokens=2048, enable_prefix_caching=False,
    )
    engine = LLMEngine(config)
    for i, (prompt, max_tokens) in enumerate(mixed_requests(args.num_requests)):
        engine.add_request(f"k{i}", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    max_steps = 30 if args.quick else 400
    saturated: list[int] = []
    num_preemptions = 0
    peak_blocks = 0
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        stats = engine.step().stats
        num_preemptions += stats.num_preemptions
        peak_blocks = max(peak_blocks, stats.num_blocks_used)
        if stats.num_waiting > 0:
            saturated.append(stats.num_running)
    contiguous = engine.capacity.num_cache_tokens // args.max_model_len
    paged = statistics.median(saturated) if saturated else float("nan")
    result = {
        "bench": "kv_capacity",
        "kv_cache_tokens": engine.capacity.num_cache_tokens,
        "max_model_len": args.max_model_len,
        "contiguous_concurrency": contiguous,
        "paged_concurrency_median": paged,
        "paged_concurrency_peak": max(saturated, default=0),
        "saturated_steps": len(saturated),
        "peak_kv_usage": round(peak_blocks / num_blocks, 3),
        "num_preemptions": num_preemptions,
        "paged_vs_contiguous_concurrency": round(paged / contiguous, 2),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
