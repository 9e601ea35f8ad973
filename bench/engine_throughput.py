"""Engine throughput: batched vs one-at-a-time vs the bare forward loop, and the cost of stats.

Built-in model, 32 requests x 128 output tokens (ignore_eos), measured three ways in one run:
all 32 batched through the engine; one at a time through the same engine; the bare model
forward loop at batch 32 with the same context lengths and no engine around it (the floor the
engine can approach); then two engines, stats on and off, over the same work; then two engines
where every request of one has penalties, a logit_bias and logprobs and the other's none. Paired runs go
in lockstep (one step each in turn) so that on a shared machine a load spike hits both alike.
Prints one JSON object as its last line.

    python bench/engine_throughput.py --quick
"""

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.config import EngineConfig  # noqa: E402
from engine.core.engine import LLMEngine  # noqa: E402
from engine.core.runner import allocate_kv_caches  # noqa: E402
from engine.core.sampling import SamplingParams  # noqa: E402
from engine.model.attention import AttentionMetadata  # noqa: E402
from engine.model.loader import load_model  # noqa: E402


def make_prompts(num: int, length: int) -> list[list[int]]:
    """Distinct byte prompts (distinct first tokens: no prefix cache hits between them)."""
    return [[(i * 37 + j * 11) % 256 for j in range(length)] for i in range(num)]


def run_batched(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, tag: str) -> float:
    """Seconds to run every prompt to completion at once."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", prompt, params)
    start = clock()
    while engine.has_unfinished_requests():
        engine.step()
    return clock() - start


class BareForward:
    """Prefill + decode at batch B through the model alone: static block tables, greedy argmax."""

    def __init__(self, loaded, prompts: list[list[int]], num_tokens: int, block_size: int, device):
        self.model = loaded.model
        self.prompts = prompts
        self.num_seqs, self.prompt_len = len(prompts), len(prompts[0])
        self.block_size = block_size
        self.device = device
        blocks_per_seq = -(-(self.prompt_len + num_tokens) // block_size)
        dtype = next(self.model.parameters()).dtype
        self.kv_caches = allocate_kv_caches(
            loaded.model_config, self.num_seqs * blocks_per_seq, block_size, dtype, device
        )
        self.tables = torch.arange(self.num_seqs * blocks_per_seq, device=device).view(self.num_seqs, -1)  # [B, nb]
        self.base = self.tables[:, 0] * block_size  # [B]: each sequence's blocks are contiguous here
        self.tokens: torch.Tensor | None = None
        self.position = 0

    def prefill(self) -> None:
        b, p, device = self.num_seqs, self.prompt_len, self.device
        attn = AttentionMetadata(
            slot_mapping=(self.base[:, None] + torch.arange(p, device=device)[None, :]).reshape(-1),
            query_start_loc=[i * p for i in range(b + 1)],
            context_lens=torch.full((b,), p, device=device),
            block_tables=self.tables, block_size=self.block_size, is_decode_only=False,
        )
        ids = torch.tensor([t for prompt in self.prompts for t in prompt], device=device)  # [B * P]
        positions = torch.arange(p, device=device).repeat(b)  # [B * P]
        self.tokens = self.model(ids, positions, self.kv_caches, attn).argmax(-1)  # [B]
        self.tokens.tolist()  # the engine needs the tokens on the host each step; so does the floor
        self.position = p

    def decode(self) -> None:
        b, device = self.num_seqs, self.device
        attn = AttentionMetadata(
            slot_mapping=self.base + self.position, query_start_loc=list(range(b + 1)),
            context_lens=torch.full((b,), self.position + 1, device=device),
            block_tables=self.tables, block_size=self.block_size, is_decode_only=True,
        )
        positions = torch.full((b,), self.position, device=device)
        self.tokens = self.model(self.tokens, positions, self.kv_caches, attn).argmax(-1)  # [B]
        self.tokens.tolist()
        self.position += 1


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


def timed(fn) -> float:
    start = clock()
    fn()
    return clock() - start


def engine_vs_forward(engine, loaded, prompts, params, device) -> tuple[float, float]:
    """Engine and bare forward in lockstep, one step each in turn, so load spikes hit both alike."""
    bare = BareForward(loaded, prompts, params.max_tokens, engine.config.block_size, device)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"lockstep-{i}", prompt, params)
    engine_s = timed(engine.step)  # prefills all 32 prompts (they fit in max_num_batched_tokens)
    forward_s = timed(bare.prefill)
    step = 0
    while engine.has_unfinished_requests():
        if step % 2 == 0:  # alternate who goes first: the second may find caches the first warmed
            engine_s += timed(engine.step)
            forward_s += timed(bare.decode)
        else:
            forward_s += timed(bare.decode)
            engine_s += timed(engine.step)
        step += 1
    return engine_s, forward_s


def paired_step_ratio(first: LLMEngine, second: LLMEngine) -> float:
    """Median over step pairs of first's step time / second's: two engines over the same work, stepped
    in turn (order alternating), so each pair shares the machine's momentary load."""
    ratios = []
    while first.has_unfinished_requests():
        if len(ratios) % 2 == 0:
            first_s, second_s = timed(first.step), timed(second.step)
        else:
            second_s, first_s = timed(second.step), timed(first.step)
        ratios.append(first_s / second_s)
    return statistics.median(ratios)


def stats_overhead(loaded, config, prompts, params) -> float:
    """Step time with stats on / off over the same work."""
    on = LLMEngine(config, loaded=loaded)
    off = LLMEngine(dataclasses.replace(config, log_stats=False), loaded=loaded)
    for engine in (on, off):
        for i, prompt in enumerate(prompts):
            engine.add_request(f"stats-{i}", prompt, params)
    return paired_step_ratio(on, off)


def processing_overhead(loaded, config, prompts, params) -> float:
    """Step time of a batch where every request has penalties, a logit_bias and logprobs / a plain batch.

    Greedy both, the penalised batch's bias pointing at no token so the two generate the same number
    of tokens; what differs is the sampler's work on the real logits.
    """
    processed = dataclasses.replace(params, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2,
                                    logit_bias={0: -1.0}, logprobs=5)
    heavy, plain = LLMEngine(config, loaded=loaded), LLMEngine(config, loaded=loaded)
    for i, prompt in enumerate(prompts):
        heavy.add_request(f"proc-{i}", prompt, processed)
        plain.add_request(f"plain-{i}", prompt, params)
    return paired_step_ratio(heavy, plain)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sequential requests and repeats (< 1 min)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: on a busy machine OpenMP threads spin-wait)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default=None,
                        help="cpu: process CPU time, immune to other processes' load (default on CPU); "
                             "wall: elapsed time (default on CUDA, where work is asynchronous)")
    args = parser.parse_args(argv)
    global clock
    clock_name = args.clock or ("wall" if args.device.startswith("cuda") else "cpu")
    clock = CLOCKS[clock_name]
    if args.threads:
        torch.set_num_threads(args.threads)
    num_blocks = 2 * args.num_requests * -(-(args.prompt_tokens + args.output_tokens) // 16)
    config = EngineConfig(device=args.device, dtype=args.dtype, max_num_seqs=max(64, args.num_requests),
                          num_kv_blocks=num_blocks)
    loaded = load_model(config)
    engine = LLMEngine(config, loaded=loaded)
    device = next(loaded.model.parameters()).device
    params = SamplingParams(max_tokens=args.output_tokens, temperature=0.0, ignore_eos=True)
    prompts = make_prompts(args.num_requests, args.prompt_tokens)
    num_tokens = args.num_requests * args.output_tokens
    warmup = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine_vs_forward(engine, loaded, prompts, warmup, device)

    batched_s, forward_s = engine_vs_forward(engine, loaded, prompts, params, device)
    num_sequential = 3 if args.quick else args.num_requests
    sequential_s = sum(
        run_batched(engine, [prompt], params, f"seq{i}") for i, prompt in enumerate(prompts[:num_sequential])
    )
    stats_params = SamplingParams(max_tokens=32 if args.quick else args.output_tokens, temperature=0.0, ignore_eos=True)
    ratio_stats = stats_overhead(loaded, config, prompts, stats_params)
    ratio_processing = processing_overhead(loaded, config, prompts, stats_params)

    batched_tok_s = num_tokens / batched_s
    sequential_tok_s = num_sequential * args.output_tokens / sequential_s
    forward_tok_s = num_tokens / forward_s
    result = {
        "bench": "engine_throughput",
        "device": str(device),
        "threads": torch.get_num_threads(),
        "clock": clock_name,
        "num_requests": args.num_requests,
        "output_tokens": args.output_tokens,
        "num_sequential_measured": num_sequential,
        "batched_tok_s": round(batched_tok_s, 1),
        "sequential_tok_s": round(sequential_tok_s, 1),
        "forward_tok_s": round(forward_tok_s, 1),
        "ratio_vs_sequential": round(batched_tok_s / sequential_tok_s, 2),
        "forward_efficiency": round(batched_tok_s / forward_tok_s, 3),
        "stats_overhead_ratio": round(ratio_stats, 3),
        "penalties_logprobs_overhead_ratio": round(ratio_processing, 3),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
