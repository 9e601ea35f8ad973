"""Server overhead: output tokens/s through HTTP (llmserve, SSE) vs the AsyncEngine called directly.

32 concurrent streams of the same prompts and lengths (ignore_eos, greedy) both ways, same model
and engine settings, torch's CPU threads included (`--threads`, default llmserve's own: the usable
cores minus one). The server runs as its own process (as in production) with JSON logs going
to a file; while the HTTP run is busy, /metrics is scraped once a second and its latency recorded.
Runs alternate (engine, HTTP) `--repeats` times and the medians are compared.
Prints one JSON object as its last line: `http_vs_engine_throughput_ratio` (target >= 0.8) and
`metrics_scrape_p50_s`; on Linux also CPU milliseconds per output token of the bench process in
the engine runs and of the server process in the HTTP runs (client excluded), whose ratio
`http_vs_engine_cpu_ratio` moves far less with the machine's load than wall-clock throughput.

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
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.core.async_engine import AsyncEngine  # noqa: E402
from engine.core.config import EngineConfig  # noqa: E402
from engine.core.engine import LLMEngine  # noqa: E402
from engine.core.sampling import SamplingParams  # noqa: E402
from engine.server.cli import torch_threads  # noqa: E402

MAX_MODEL_LEN = 1024
SCRAPE_INTERVAL_S = 1.0  # Prometheus scrapes every 15-60 s; once a second is already harsh


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


async def http_stream(host: str, port: int, prompt: list[int], max_tokens: int) -> int:
    """One SSE request over a bare asyncio connection; the completion tokens its usage chunk reports.

    A minimal HTTP/1.1 client on purpose: on a small machine httpx's pure-Python parsing would
    compete with the server for CPU and be counted as server overhead.
    """
    body = json.dumps({"model": "builtin", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, chunked = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"server_overhead: {head.splitlines()[0]!r}")
    payload = _dechunk(chunked)
    events = [line[6:] for line in payload.split(b"\n") if line.startswith(b"data: {")]
    return json.loads(events[-1])["usage"]["completion_tokens"]


def _dechunk(data: bytes) -> bytes:
    out, pos = [], 0
    while True:
        end = data.index(b"\r\n", pos)
        size = int(data[pos:end], 16)
        if size == 0:
            return b"".join(out)
        out.append(data[end + 2:end + 2 + size])
        pos = end + 2 + size + 2


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
                await asyncio.sleep(SCRAPE_INTERVAL_S)

        scraper = asyncio.create_task(scrape_loop())
        start = time.perf_counter()
        host, port = url.removeprefix("http://").split(":")
        counts = await asyncio.gather(*(http_stream(host, int(port), p, max_tokens) for p in prompts))
        elapsed = time.perf_counter() - start
        done.set()
        await scraper
    return sum(counts), elapsed, scrapes


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_ms_per_token(runs: list[tuple[int, float, float | None]]) -> float | None:
    if any(cpu_s is None for _, _, cpu_s in runs):
        return None
    return statistics.median(1000 * cpu_s / tokens for tokens, _, cpu_s in runs)


def start_server(log_path: str, threads: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "engine.server", "--port", str(port), "--max-model-len",
                             str(MAX_MODEL_LEN), "--log-file", log_path, "--torch-threads", str(threads)],
                            cwd=REPO)
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
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of each; medians reported")
    parser.add_argument("--threads", type=int, default=torch_threads(None, "cpu"),
                        help="torch CPU threads, both ways (default: llmserve's CPU default)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    max_tokens = 32 if args.quick else 128
    prompts = make_prompts(args.streams, args.prompt_tokens)

    engine = AsyncEngine(LLMEngine(EngineConfig(max_model_len=MAX_MODEL_LEN)))
    engine.start()
    engine_runs, http_runs, scrapes = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(os.path.join(tmp, "llmserve.log"), args.threads)
        try:
            asyncio.run(engine_run(prompts[:4], 4, "warm", engine))
            asyncio.run(http_run(url, prompts[:4], 4))
            # Interleaved repeats, medians: a shared machine's load drifts during the run.
            for r in range(args.repeats):
                cpu0 = time.process_time()
                tokens, seconds = asyncio.run(engine_run(prompts, max_tokens, f"run{r}", engine))
                engine_runs.append((tokens, seconds, time.process_time() - cpu0))
                cpu0 = process_cpu_s(proc.pid)
                tokens, seconds, run_scrapes = asyncio.run(http_run(url, prompts, max_tokens))
                cpu1 = process_cpu_s(proc.pid)
                http_runs.append((tokens, seconds, None if cpu0 is None or cpu1 is None else cpu1 - cpu0))
                scrapes += run_scrapes
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            engine.shutdown()
    engine_tokens, http_tokens = engine_runs[-1][0], http_runs[-1][0]
    engine_tps = statistics.median(t / s for t, s, _ in engine_runs)
    http_tps = statistics.median(t / s for t, s, _ in http_runs)
    engine_cpu, http_cpu = _cpu_ms_per_token(engine_runs), _cpu_ms_per_token(http_runs)
    result = {
        "streams": args.streams, "output_tokens_per_stream": max_tokens, "repeats": args.repeats,
        "torch_threads": args.threads,
        "engine_tokens": engine_tokens, "http_tokens": http_tokens,
        "engine_output_tokens_per_s": round(engine_tps, 1), "http_output_tokens_per_s": round(http_tps, 1),
        "http_vs_engine_throughput_ratio": round(http_tps / engine_tps, 3),
        "engine_cpu_ms_per_token": None if engine_cpu is None else round(engine_cpu, 3),
        "http_server_cpu_ms_per_token": None if http_cpu is None else round(http_cpu, 3),
        "http_vs_engine_cpu_ratio": None if engine_cpu is None or http_cpu is None else round(engine_cpu / http_cpu, 3),
        "metrics_scrape_p50_s": round(statistics.median(scrapes), 5) if scrapes else None,
        "metrics_scrapes": len(scrapes),
    }
    print(json.dumps(result))
    expected = args.streams * max_tokens
    return 0 if all(t == expected for t, _, _ in engine_runs + http_runs) else 1


if __name__ == "__main__":
    sys.exit(main())
