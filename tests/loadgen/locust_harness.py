"""Runs `locust -f loadgen/chat.py --headless` as a subprocess for the end-to-end tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCUST = Path(sys.executable).parent / "locust"


def run_locust(args: list[str], cwd: Path, timeout_s: float = 90) -> subprocess.CompletedProcess:
    """`locust -f loadgen/chat.py --headless ...`; returns the finished process (output in .stdout)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [str(LOCUST), "-f", str(REPO / "loadgen" / "chat.py"), "--headless", "--only-summary",
           "--stop-timeout", "10", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)


def read_summary(report_dir: Path) -> dict:
    return json.loads((report_dir / "loadgen_summary.json").read_text())
