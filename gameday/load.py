"""Load for a game day: loadgen/chat.py under headless Locust, one subprocess per phase."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gameday.procs import Proc, ProcSpec, Supervisor
from gameday.scenarios import LoadPhase
from gameday.stack import REPO_ROOT, child_env

LOCUSTFILE = REPO_ROOT / "loadgen" / "chat.py"


def locust_argv(phase: LoadPhase, host: str, client_log: Path, report_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "-u", str(phase.users), "-r", str(phase.spawn_rate), "-t", f"{phase.run_time_s}s",
        "--stop-timeout", "30", "--host", host, "--only-summary", "--loglevel", "WARNING",
        "--profile", phase.profile, "--client-log", str(client_log), "--report-dir", str(report_dir),
        *phase.extra_args,
    ]


def start_phase(sup: Supervisor, phase: LoadPhase, index: int, host: str, report_dir: Path,
                cpus: frozenset[int] | None = None, nice: int | None = None) -> Proc:
    """Start one phase (on `cpus` alone and at `nice` when given); the client log goes with the
    other logs (triage reads it)."""
    client_log = report_dir / "logs" / f"client-{index}-{phase.profile}.log"
    load_dir = report_dir / "load" / f"{index}-{phase.profile}"
    load_dir.mkdir(parents=True, exist_ok=True)
    argv = locust_argv(phase, host, client_log, load_dir)
    return sup.start(ProcSpec(name=f"locust-{index}", argv=argv, env=child_env(), cwd=REPO_ROOT,
                              log_path=report_dir / "procs" / f"locust-{index}.log", cpus=cpus, nice=nice))


def read_summary(load_dir: Path) -> dict | None:
    """The loadgen summary JSON of one phase (file name containing `summary`), if written."""
    for path in sorted(load_dir.glob("*summary*.json")):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None
    return None
