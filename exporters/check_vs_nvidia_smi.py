"""Cross-check llm-gpu-exporter against nvidia-smi on a GPU machine; exit 0 when every figure agrees.

Starts the exporter on a free loopback port (or reads --url), then for each round scrapes it, runs
`nvidia-smi --query-gpu=... --format=csv,nounits` (and --query-compute-apps), scrapes again, and
checks that each nvidia-smi value lies between the two scrapes' values, within the tolerances of
exporters/smi_compare.py. A field nvidia-smi reports as [N/A] or [Not Supported] must be absent
from the exporter. Exit 0 all agree, 1 something differs, 2 usage or environment error.

example:
  python -m exporters.check_vs_nvidia_smi --rounds 3 --json gpu-check.json
  python -m exporters.check_vs_nvidia_smi --url http://127.0.0.1:9400/metrics
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from exporters.cli import OneLineArgumentParser, UsageError
from exporters.smi_compare import (
    CORE_FIELDS,
    OPTIONAL_GROUPS,
    Scrape,
    SmiParseError,
    Verdict,
    compare,
    compare_processes,
    format_report,
    parse_apps_csv,
    parse_scrape,
    parse_smi_csv,
)

PROG = "check_vs_nvidia_smi"
REPO = Path(__file__).resolve().parents[1]


class CheckError(Exception):
    """An environment or input problem: reported in one line, exit 2."""


@dataclass(slots=True)
class CheckConfig:
    url: str | None = None
    nvidia_smi: str = "nvidia-smi"
    smi_csv: Path | None = None  # a saved --query-gpu output instead of running nvidia-smi
    apps_csv: Path | None = None  # a saved --query-compute-apps output
    rounds: int = 1
    json_path: Path | None = None


def _fetch(url: str, wait_s: float = 0.0) -> str:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.read().decode()
        except (urllib.error.URLError, ConnectionError) as exc:
            if time.monotonic() >= deadline:
                raise CheckError(f"cannot scrape {url}: {exc}") from None
            time.sleep(0.2)


def _run_smi(config: CheckConfig, args: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([config.nvidia_smi, *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise CheckError(f"{config.nvidia_smi} not found; pass --nvidia-smi PATH or --smi-csv FILE") from None
    except subprocess.TimeoutExpired:
        raise CheckError(f"{config.nvidia_smi} did not answer within 60 s (a wedged driver?)") from None


def query_gpus(config: CheckConfig) -> dict[str, dict[str, str]]:
    """Core fields in one query, each optional group in its own (an unknown field fails only its group)."""
    if config.smi_csv is not None:
        return parse_smi_csv(_read(config.smi_csv))
    proc = _run_smi(config, [f"--query-gpu={','.join(CORE_FIELDS)}", "--format=csv,nounits"])
    if proc.returncode != 0:
        raise CheckError(f"nvidia-smi --query-gpu failed: {(proc.stdout + proc.stderr).strip()[:200]}")
    gpus = parse_smi_csv(proc.stdout)
    for group in OPTIONAL_GROUPS:
        proc = _run_smi(config, [f"--query-gpu=uuid,{','.join(group)}", "--format=csv,nounits"])
        if proc.returncode != 0:
            print(f"skipped {','.join(group)}: {(proc.stdout + proc.stderr).strip()[:120]}", file=sys.stderr)
            continue
        for uuid, values in parse_smi_csv(proc.stdout).items():
            gpus.setdefault(uuid, {}).update(values)
    return gpus


def query_apps(config: CheckConfig) -> list[tuple[str, str, float | None]]:
    if config.apps_csv is not None:
        return parse_apps_csv(_read(config.apps_csv))
    if config.smi_csv is not None:
        return []
    proc = _run_smi(config, ["--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,nounits"])
    if proc.returncode != 0:
        print(f"skipped compute apps: {(proc.stdout + proc.stderr).strip()[:120]}", file=sys.stderr)
        return []
    return parse_apps_csv(proc.stdout)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise CheckError(f"cannot read {path}: {exc.strerror}") from None


def start_exporter() -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporters.cli", "--port", str(port), "--log-level", "warning"],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, f"http://127.0.0.1:{port}/metrics"


def stop_exporter(proc: subprocess.Popen) -> Verdict:
    """SIGTERM must shut NVML down and exit 0."""
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    if err.strip():
        print(err.strip(), file=sys.stderr)
    code = proc.returncode
    return Verdict(
        "-", "exporter exit code on SIGTERM", 0.0, (float(code),), "ok" if code == 0 else "differs"
    )


def _gpu_up(smi: dict[str, dict[str, str]], scrapes: list[Scrape]) -> list[Verdict]:
    verdicts = []
    for uuid in sorted(smi):
        seen = tuple(s[("llm_gpu_up", uuid, ())] for s in scrapes if ("llm_gpu_up", uuid, ()) in s)
        verdicts.append(
            Verdict(uuid, "llm_gpu_up", 1.0, seen, "ok" if seen and min(seen) == 1.0 else "differs")
        )
    return verdicts


def run(config: CheckConfig) -> int:
    exporter = None
    url = config.url
    if url is None:
        exporter, url = start_exporter()
    verdicts: list[Verdict] = []
    try:
        first = parse_scrape(
            _fetch(url, wait_s=30.0 if exporter is not None else 0.0)
        )  # ours may still start
        if first.get(("llm_gpu_nvml_up", "", ())) != 1.0:
            print(f"{url} reports llm_gpu_nvml_up 0: the exporter cannot use NVML on this machine")
            return 1
        for _ in range(config.rounds):
            before = parse_scrape(_fetch(url))
            gpus, apps = query_gpus(config), query_apps(config)
            after = parse_scrape(_fetch(url))
            verdicts += _gpu_up(gpus, [before, after]) + compare(gpus, [before, after])
            verdicts += compare_processes(apps, [before, after])
    finally:
        if exporter is not None:
            verdicts.append(stop_exporter(exporter))
    print(format_report(verdicts))
    if config.json_path is not None:
        try:
            config.json_path.write_text(json.dumps([asdict(v) for v in verdicts], indent=2) + "\n")
        except OSError as exc:
            raise CheckError(f"cannot write {config.json_path}: {exc.strerror}") from None
    return 0 if all(v.status == "ok" for v in verdicts) else 1


def parse_args(argv: list[str] | None) -> CheckConfig:
    parser = OneLineArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="scrape this running exporter instead of starting one")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="nvidia-smi binary (default: from PATH)")
    parser.add_argument(
        "--smi-csv", type=Path, help="a saved `nvidia-smi --query-gpu=uuid,... --format=csv,nounits`"
    )
    parser.add_argument(
        "--apps-csv", type=Path, help="a saved `nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory`"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="scrape / nvidia-smi / scrape rounds (default 1)"
    )
    parser.add_argument("--json", dest="json_path", type=Path, help="also write the verdicts as JSON here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    return CheckConfig(
        url=args.url,
        nvidia_smi=args.nvidia_smi,
        smi_csv=args.smi_csv,
        apps_csv=args.apps_csv,
        rounds=args.rounds,
        json_path=args.json_path,
    )


def main(argv: list[str] | None = None) -> int:
    try:
        return run(parse_args(argv))
    except (UsageError, CheckError, SmiParseError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
