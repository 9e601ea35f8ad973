"""llmtriage vs `grep -c -E` on generated logs of three folders, each with one incident inside.

- `json`: this project's engine JSON lines with an ingress-nginx (upstreaminfo) access log and an error
  log; an engine crash two thirds of the way through.
- `vllm-nginx`: vLLM's own text log (request logging on: `Received request ...` with the prompt, the
  uvicorn `"POST /v1/chat/completions HTTP/1.1" 200 OK` lines, the `Engine 000: Avg prompt throughput ...`
  stats line every 10 s) with an nginx access log in a custom `log_format` (`... rt=0.912 uct=0.000
  urt=0.911`) and its error log; gateway timeouts two thirds of the way through.
- `sglang-envoy`: SGLang's scheduler lines (`Prefill batch, ...` per request, `Decode batch, ...`) and
  its uvicorn lines, with an Envoy JSON access log (Istio's keys); KV cache retraction two thirds through.

For each folder it times `llmtriage diagnose DIR --format json` and `grep -c -E <the decisive words>`
over the same files, in the same run, in turn, each REPEAT times (five by default), and keeps the best CPU
time (user + system), which a shared machine disturbs far less than wall time (a single run of either side
moves by a sixth there). It prints one line per folder (ratio, MB per CPU
second, peak RSS of the llmtriage run, first finding) and last one JSON object with the same per folder;
the target is a ratio of 5 or less.

  python bench/triage_speed.py                  # 256 MB a folder
  python bench/triage_speed.py --quick          # 32 MB a folder
  python bench/triage_speed.py --folder vllm-nginx --data /tmp/logs   # generate once into /tmp/logs, reuse
"""

import argparse
import compileall
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECISIVE = (r'upstream timed out|connect\(\) failed|prematurely closed|out of memory|OutOfMemoryError|'
            r'"fatal":true|EngineDeadError| 499 | 504 |request\.preempted|queue_full|KV cache is needed')
DECISIVE_TEXT = (r'upstream timed out|connect\(\) failed|prematurely closed|out of memory|OutOfMemoryError|'
                 r'EngineDeadError| 499 | 504 |Preemptions: [1-9]|Retract requests|"UT"|"DC"|KV cache is needed')
T0 = datetime(2026, 11, 29, 19, 0, 0, tzinfo=UTC)


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _engine_lines(rng: random.Random, i: int, t: datetime) -> list[str]:
    rid = f"chatcmpl-{i:09d}"
    fp = ",".join(f'"{rng.getrandbits(32):08x}"' for _ in range(4))
    head = f'{{"ts":"{_iso(t)}","level":"info","logger":"llmserve","model":"builtin","request_id":"{rid}",'
    return [
        head + '"event":"request.received","prompt_tokens":64,"max_tokens":32,"stream":true,"endpoint":"/v1/chat/completions"}',
        head + '"event":"request.scheduled","queue_s":0.002,"cached_tokens":0}',
        head + f'"event":"request.first_token","ttft_s":0.0{rng.randint(20, 60)}}}',
        head + '"event":"request.finished","finish_reason":"stop","prompt_tokens":64,"cached_tokens":0,'
               f'"completion_tokens":32,"queue_s":0.002,"ttft_s":0.04,"tpot_s":0.02,"e2e_s":0.9,'
               f'"prefix_fingerprint":[{fp}]}}',
        head + '"event":"http.access","method":"POST","path":"/v1/chat/completions","status":200,'
               '"duration_s":0.9,"client":"127.0.0.1:50312"}',
    ]


def _access_line(rng: random.Random, t: datetime) -> str:
    rt = 0.8 + rng.random() * 0.4
    return (f'127.0.0.1 - - [{t.strftime("%d/%b/%Y:%H:%M:%S +0000")}] "POST /v1/chat/completions HTTP/1.1" 200 '
            f'2048 "-" "python-requests/2.32.3" 412 {rt:.3f} [llm-engine] [] 127.0.0.1:8000 2048 '
            f'{rt - 0.001:.3f} 200 {rng.getrandbits(128):032x}')


def generate(folder: Path, target_bytes: int) -> int:
    """Writes the logs; returns the number of bytes written."""
    rng = random.Random(1)
    engine = open(folder / "engine-0.log", "w")  # noqa: SIM115
    access = open(folder / "access.log", "w")  # noqa: SIM115
    error = open(folder / "error.log", "w")  # noqa: SIM115
    written, i, crashed = 0, 0, False
    while written < target_bytes:
        t = T0 + timedelta(milliseconds=50 * i)
        chunk = "\n".join(_engine_lines(rng, i, t)) + "\n"
        line = _access_line(rng, t) + "\n"
        engine.write(chunk)
        access.write(line)
        written += len(chunk) + len(line)
        if not crashed and written > target_bytes * 2 // 3:
            crashed = True
            engine.write(f'{{"ts":"{_iso(t)}","level":"error","event":"engine.error","logger":"llmserve",'
                         '"model":"builtin","phase":"step","exc_type":"RuntimeError","message":"fault injection: '
                         'engine loop crashed","traceback":"","request_ids":[],"fatal":true}\n')
            for k in range(20):
                error.write(f"{(t + timedelta(seconds=k)).strftime('%Y/%m/%d %H:%M:%S')} [error] 41#41: *{k} "
                            "connect() failed (111: Connection refused) while connecting to upstream, client: "
                            "127.0.0.1, server: _, request: \"POST /v1/chat/completions HTTP/1.1\", upstream: "
                            "\"http://127.0.0.1:8000/v1/chat/completions\", host: \"127.0.0.1:8080\"\n")
        i += 1
    for f in (engine, access, error):
        f.close()
    return sum(p.stat().st_size for p in folder.iterdir())


PROMPTS = ("Where is my order?", "Can I return shoes?", "Summarise this ticket in two lines.",
           "Translate 'good morning' into French.", "What does error 504 mean?")
SYSTEM = "You are the support assistant for Acme. Answer briefly and cite the policy."


def _vllm_head(t: datetime, proc: str = "APIServer") -> str:
    return f"({proc} pid=1) INFO {t.strftime('%m-%d %H:%M:%S')}"


def generate_vllm_nginx(folder: Path, target_bytes: int) -> int:
    """vLLM's text log with request logging, and nginx with log_format `... rt= uct= urt=` (+ error log)."""
    rng = random.Random(2)
    vllm, access, error = (open(folder / name, "w") for name in ("vllm.log", "access.log", "error.log"))  # noqa: SIM115
    written, i, incident = 0, 0, False
    while written < target_bytes:
        t = T0 + timedelta(milliseconds=50 * i)
        rid = f"chatcmpl-{rng.getrandbits(64):016x}"
        prompt = f"<|im_start|>system\\n{SYSTEM}<|im_end|>\\n<|im_start|>user\\n{rng.choice(PROMPTS)}<|im_end|>\\n"
        chunk = (f"{_vllm_head(t)} [logger.py:43] Received request {rid}: prompt: '{prompt}', params: "
                 f"SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, temperature=0.7, top_p=1.0, "
                 f"max_tokens=256), prompt_token_ids: None, lora_request: None.\n"
                 f'(APIServer pid=1) INFO:     127.0.0.1:{40000 + i % 20000} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n')
        if i % 200 == 0:  # every 10 s at 20 requests a second
            chunk += (f"{_vllm_head(t)} [loggers.py:123] Engine 000: Avg prompt throughput: "
                      f"{rng.uniform(800, 1200):.1f} tokens/s, Avg generation throughput: {rng.uniform(300, 500):.1f} "
                      f"tokens/s, Running: {rng.randint(4, 12)} reqs, Waiting: 0 reqs, GPU KV cache usage: "
                      f"{rng.uniform(20, 40):.1f}%, Prefix cache hit rate: {rng.uniform(40, 60):.1f}%\n")
        status, rt = 200, 0.8 + rng.random() * 0.4
        if not incident and written > target_bytes * 2 // 3:
            incident = True
            for k in range(20):
                tk = t + timedelta(seconds=k)
                error.write(f"{tk.strftime('%Y/%m/%d %H:%M:%S')} [error] 41#41: *{k} upstream timed out (110: "
                            "Connection timed out) while reading response header from upstream, client: 10.0.0.7, "
                            'server: _, request: "POST /v1/chat/completions HTTP/1.1", upstream: '
                            '"http://10.0.3.7:8000/v1/chat/completions", host: "llm.example.com"\n')
                access.write(f'10.0.0.7 - - [{tk.strftime("%d/%b/%Y:%H:%M:%S +0000")}] "POST /v1/chat/completions '
                             f'HTTP/1.1" 504 160 "-" "OpenAI/Python 1.51.0" rt=60.001 uct=0.000 urt=60.000\n')
        line = (f'10.0.0.{7 + i % 4} - - [{t.strftime("%d/%b/%Y:%H:%M:%S +0000")}] "POST /v1/chat/completions '
                f'HTTP/1.1" {status} {rng.randint(900, 3000)} "-" "OpenAI/Python 1.51.0" rt={rt:.3f} uct=0.000 '
                f"urt={rt - 0.001:.3f}\n")
        vllm.write(chunk)
        access.write(line)
        written += len(chunk) + len(line)
        i += 1
    for f in (vllm, access, error):
        f.close()
    return sum(p.stat().st_size for p in folder.iterdir())


def generate_sglang_envoy(folder: Path, target_bytes: int) -> int:
    """SGLang's scheduler and uvicorn lines, and an Envoy JSON access log (Istio's keys)."""
    rng = random.Random(3)
    sglang, access = (open(folder / name, "w") for name in ("sglang.log", "envoy-access.log"))  # noqa: SIM115
    written, i, incident = 0, 0, False
    while written < target_bytes:
        t = T0 + timedelta(milliseconds=50 * i)
        stamp = f"[{t.strftime('%Y-%m-%d %H:%M:%S')}]"
        running = rng.randint(4, 12)
        new, cached = rng.randint(20, 400), rng.randint(0, 300)
        chunk = (f"{stamp} Prefill batch, #new-seq: 1, #new-token: {new}, #cached-token: {cached}, token usage: "
                 f"{rng.uniform(0.1, 0.4):.2f}, #running-req: {running}, #queue-req: 0, \n"
                 f'{stamp} INFO:     127.0.0.1:{40000 + i % 20000} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n')
        if i % 4 == 0:
            chunk += (f"{stamp} Decode batch, #running-req: {running}, #token: {rng.randint(2000, 9000)}, token usage: "
                      f"{rng.uniform(0.1, 0.4):.2f}, cuda graph: True, gen throughput (token/s): "
                      f"{rng.uniform(300, 600):.2f}, #queue-req: 0, \n")
        if not incident and written > target_bytes * 2 // 3:
            incident = True
            for k in range(5):
                chunk += (f"[{(t + timedelta(seconds=k)).strftime('%Y-%m-%d %H:%M:%S')}] KV cache pool is full. "
                          f"Retract requests. #retracted_reqs: {k + 1}, #new_token_ratio: 0.5000 -> 0.8000\n")
        duration = rng.randint(800, 1200)
        line = json.dumps({
            "start_time": _iso(t), "method": "POST", "path": "/v1/chat/completions", "protocol": "HTTP/1.1",
            "response_code": 200, "response_flags": "-", "bytes_received": rng.randint(300, 900),
            "bytes_sent": rng.randint(900, 3000), "duration": duration, "upstream_service_time": str(duration - 2),
            "x_forwarded_for": f"10.0.0.{7 + i % 4}", "user_agent": "OpenAI/Python 1.51.0",
            "request_id": f"{rng.getrandbits(128):032x}", "authority": "llm.internal",
            "upstream_host": "10.0.3.7:30000"}, separators=(",", ":")) + "\n"
        sglang.write(chunk)
        access.write(line)
        written += len(chunk) + len(line)
        i += 1
    for f in (sglang, access):
        f.close()
    return sum(p.stat().st_size for p in folder.iterdir())


FOLDERS = {"json": (generate, DECISIVE), "vllm-nginx": (generate_vllm_nginx, DECISIVE_TEXT),
           "sglang-envoy": (generate_sglang_envoy, DECISIVE_TEXT)}


def run_once(argv: list[str], env: dict | None = None) -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds: user + system, peak RSS in MB, stdout) of one child, its own rusage."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    out = proc.stdout.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{argv[0]} exited {proc.returncode}")
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out.decode()


def bench_folder(name: str, folder: Path, size_mb: int, repeat: int) -> dict:
    make, words = FOLDERS[name]
    folder.mkdir(parents=True, exist_ok=True)
    if not any(folder.iterdir()):
        make(folder, size_mb * 1_000_000)
    nbytes = sum(p.stat().st_size for p in folder.iterdir())
    files = sorted(str(p) for p in folder.iterdir())
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "triage.cli", "diagnose", str(folder), "--format", "json"]
    grep, tri = [], []
    for _ in range(repeat):  # both sides in turn, so a busy spell hits both
        grep.append(run_once(["grep", "-c", "-E", words, *files]))
        tri.append(run_once(argv, env))
    grep_cpu, triage_cpu = min(g[1] for g in grep), min(t[1] for t in tri)
    findings = json.loads(tri[0][3])["findings"]
    return {"bytes": nbytes, "triage_cpu_s": round(triage_cpu, 3), "grep_cpu_s": round(grep_cpu, 3),
            "triage_vs_grep_time_ratio": round(triage_cpu / max(grep_cpu, 1e-3), 2),
            "triage_vs_grep_wall_ratio": round(min(t[0] for t in tri) / max(min(g[0] for g in grep), 1e-6), 2),
            "triage_mb_per_cpu_s": round(nbytes / 1e6 / max(triage_cpu, 1e-3), 1),
            "peak_rss_mb": round(max(t[2] for t in tri), 1), "first_finding": findings[0]["id"] if findings else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="32 MB a folder instead of 256 MB, three runs each")
    parser.add_argument("--size-mb", type=int, help="generate this many MB a folder instead")
    parser.add_argument("--folder", choices=sorted(FOLDERS), action="append", help="only this folder (repeatable)")
    parser.add_argument("--repeat", type=int, help="runs of each side, the best kept (default 5, --quick 3)")
    parser.add_argument("--data", metavar="DIR", help="keep the logs in DIR/<folder>: generated there when it is "
                        "empty, reused as they are (whatever their size) when it is not")
    args = parser.parse_args()
    size_mb = args.size_mb or (32 if args.quick else 256)
    repeat = args.repeat or (3 if args.quick else 5)
    # Bytecode for every module first, as an installed llmtriage has it: where Python may not write it
    # (PYTHONDONTWRITEBYTECODE, a read-only tree), a module edited since would be compiled again in each
    # run (about 0.1 s for triage's modules), which is no part of reading logs.
    compileall.compile_dir(str(ROOT / "triage"), quiet=1)
    results = {}
    with tempfile.TemporaryDirectory(prefix="triage-bench-") as tmp:
        for name in args.folder or list(FOLDERS):
            r = results[name] = bench_folder(name, Path(args.data or tmp) / name, size_mb, repeat)
            print(f"{name}: {r['bytes'] / 1e6:.0f} MB, llmtriage {r['triage_cpu_s']:.2f} s CPU "
                  f"({r['triage_mb_per_cpu_s']:.0f} MB per CPU second), grep -c -E {r['grep_cpu_s']:.2f} s: ratio "
                  f"{r['triage_vs_grep_time_ratio']:.2f}; peak RSS {r['peak_rss_mb']:.0f} MB; first finding "
                  f"{r['first_finding']}", file=sys.stderr)
    print(json.dumps({"folders": results,
                      "max_ratio": max(r["triage_vs_grep_time_ratio"] for r in results.values())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
