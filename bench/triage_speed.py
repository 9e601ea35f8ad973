"""llmtriage vs `grep -c -E` on generated mixed engine and nginx logs with one incident inside.

Writes SIZE of engine JSON lines, nginx access (upstreaminfo) and error logs into a temp dir, with an
engine crash two thirds of the way through, then times `llmtriage diagnose DIR --format json` and
`grep -c -E <decisive words>` over the same files. Last line: JSON with `triage_vs_grep_time_ratio`
(CPU seconds, user + system, which a shared machine disturbs far less than wall time; target <= 5),
the wall-clock ratio too, throughput, llmtriage's peak RSS and its first finding.

  python bench/triage_speed.py            # 256 MB
  python bench/triage_speed.py --quick    # 32 MB
  python bench/triage_speed.py --data /tmp/logs   # generate into /tmp/logs once, reuse it after
"""

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECISIVE = (r'upstream timed out|connect\(\) failed|prematurely closed|out of memory|OutOfMemoryError|'
            r'"fatal":true|EngineDeadError| 499 | 504 |request\.preempted|queue_full|KV cache is needed')
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


def _child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], env: dict | None = None) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds and CPU seconds (user + system) of one child; CPU time resists a shared machine's noise."""
    cpu0, start = _child_cpu_s(), time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    return time.perf_counter() - start, _child_cpu_s() - cpu0, proc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="32 MB instead of 256 MB")
    parser.add_argument("--size-mb", type=int, help="generate this many MB instead")
    parser.add_argument("--data", metavar="DIR", help="keep the logs in DIR: generated there when it is empty, "
                        "reused as they are (whatever their size) when it is not")
    args = parser.parse_args()
    size_mb = args.size_mb or (32 if args.quick else 256)
    with tempfile.TemporaryDirectory(prefix="triage-bench-") as tmp:
        folder = Path(args.data or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if any(folder.iterdir()):
            nbytes = sum(p.stat().st_size for p in folder.iterdir())
        else:
            nbytes = generate(folder, size_mb * 1_000_000)
        files = sorted(str(p) for p in folder.iterdir())
        grep_s, grep_cpu_s, _ = timed(["grep", "-c", "-E", DECISIVE, *files])
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        argv = [sys.executable, "-m", "triage.cli", "diagnose", str(folder), "--format", "json"]
        triage_s, triage_cpu_s, tri = timed(argv, env)
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        if tri.returncode not in (0, 1):
            print(tri.stderr, file=sys.stderr)
            return 1
        findings = json.loads(tri.stdout)["findings"]
    print(f"{nbytes / 1e6:.0f} MB: llmtriage {triage_s:.2f} s wall / {triage_cpu_s:.2f} s CPU "
          f"({nbytes / 1e6 / triage_cpu_s:.1f} MB per CPU second), grep -c -E {grep_s:.2f} s wall / "
          f"{grep_cpu_s:.2f} s CPU, peak RSS {peak_mb:.0f} MB", file=sys.stderr)
    print(json.dumps({"bytes": nbytes, "triage_s": round(triage_s, 3), "grep_s": round(grep_s, 3),
                      "triage_cpu_s": round(triage_cpu_s, 3), "grep_cpu_s": round(grep_cpu_s, 3),
                      "triage_vs_grep_time_ratio": round(triage_cpu_s / max(grep_cpu_s, 1e-3), 2),
                      "triage_vs_grep_wall_ratio": round(triage_s / max(grep_s, 1e-6), 2),
                      "triage_mb_per_cpu_s": round(nbytes / 1e6 / max(triage_cpu_s, 1e-3), 2),
                      "peak_rss_mb": round(peak_mb, 1), "first_finding": findings[0]["id"] if findings else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
