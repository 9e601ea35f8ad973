"""Server overhead: output tokens/s through HTTP (llmserve, SSE) vs the AsyncEngine called directly.

32 concurrent streams of the same prompts and lengths (ignore_eos, greedy) both ways, same model
and engine settings. The server runs as its own process (as in production) with JSON logs going
to a file; while the HTTP run is busy, /metrics is scraped in a loop and its latency recorded.
Prints one JSON object as its last line: `http_vs_engine_throughput_ratio` (target >= 0.8) and
`metrics_scrape_p50_s`.

    python bench/server_overhead.py --quick
"""

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.core.async_engine import AsyncEngine  # noqa: E402
from engine.core.config import EngineConfig  # noqa: E402
from engine.core.engine import LLMEngine  # noqa: E402
from engine.core.sampling import SamplingParams  # noqa: E402

MAX_MODEL_LEN = 1024


def make_prompts(num: int, length: int) -> list[list[int]]:
    """Distinct byte prompts (no prefix cache hits between them), as token ids for both paths."""
    return [[(i * 37 + j * 11) % 256 for j in range(length)] for i in range(num)]


async def engine_run(prompts: list[list[int]], max_tokens: int, tag: str, engine: AsyncEngine) -> tuple[int, float]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    async def one(i: int, prompt: list[int]) -> int:
        last = 0
        async for out in engine.generate(f"{tag}-{i}", prompt, params):
            last = out.num_output_tokens
        return last

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return sum(counts), time.perf_counter() - start


async def http_stream(client: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> int:
    body = {"model": "builtin", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    tokens = usage["completion_tokens"]
    return tokens


async def http_run(url: str, prompts, max_tokens: int) -> tuple[int, float, list[float]]:
    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        scrapes: list[float] = []
        done = asyncio.Event()

        async def scrape_loop():
            while not done.is_set():
                t0 = time.perf_counter()
                (await client.get("/metrics")).raise_for_status()
                scrapes.append(time.perf_counter() - t0)
                await asyncio.sleep(0.1)

        scraper = asyncio.create_task(scrape_loop())
        start = time.perf_counter()
        counts = await asyncio.gather(*(http_stream(client, p, max_tokens) for p in prompts))
        elapsed = time.perf_counter() - start
        done.set()
        await scraper
    return sum(counts), elapsed, scrapes


def start_server(log_path: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "engine.server", "--port", str(port), "--max-model-len",
                             str(MAX_MODEL_LEN), "--log-file", log_path], cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("server_overhead: llmserve did not become ready")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 tokens per stream instead of 128")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    max_tokens = 32 if args.quick else 128
    prompts = make_prompts(args.streams, args.prompt_tokens)

    engine = AsyncEngine(LLMEngine(EngineConfig(max_model_len=MAX_MODEL_LEN)))
    engine.start()
    asyncio.run(engine_run(prompts[:4], 4, "warm", engine))
    engine_tokens, engine_s = asyncio.run(engine_run(prompts, max_tokens, "run", engine))
    engine.shutdown()
    del engine

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(os.path.join(tmp, "llmserve.log"))
        try:
            asyncio.run(http_run(url, prompts[:4], 4))
            http_tokens, http_s, scrapes = asyncio.run(http_run(url, prompts, max_tokens))
        finally:
            proc.terminate()
            proc.wait(timeout=60)

    engine_tps, http_tps = engine_tokens / engine_s, http_tokens / http_s
    result = {
        "streams": args.streams, "output_tokens_per_stream": max_tokens,
        "engine_tokens": engine_tokens, "http_tokens": http_tokens,
        "engine_output_tokens_per_s": round(engine_tps, 1), "http_output_tokens_per_s": round(http_tps, 1),
        "http_vs_engine_throughput_ratio": round(http_tps / engine_tps, 3),
        "metrics_scrape_p50_s": round(statistics.median(scrapes), 5) if scrapes else None,
        "metrics_scrapes": len(scrapes),
    }
    print(json.dumps(result))
    return 0 if http_tokens == engine_tokens == args.streams * max_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
