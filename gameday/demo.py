"""`python -m gameday demo`: the newcomer's tour, one incident from fault to diagnosis in minutes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from gameday.checks import runbook_file
from gameday.drill import DRILL_FACTOR
from gameday.runner import run_scenario
from gameday.scenarios import get_scenario
from gameday.stack import REPO_ROOT

DEMO_SCENARIO = "kv-pressure"

_INTRO = f"""\
llmsre demo: one incident, end to end, on this machine.
  1. llmserve (the built-in model) starts with a KV cache far too small for its load;
  2. nginx fronts it, Prometheus scrapes it every second with the shipped alert rules
     (drill copies: every duration divided by {DRILL_FACTOR}, so 5m of evidence takes 5s);
  3. Locust streams chat requests through nginx; the engine starts preempting;
  4. the alerts fire; llmtriage reads the logs and Prometheus and names the cause.
Everything runs on 127.0.0.1 and is stopped at the end, whatever happens.
"""


def _print_alerts(report_dir: Path) -> None:
    alerts = json.loads((report_dir / "alerts.json").read_text())
    firing = [a for a in alerts if a["first_firing_s"] is not None]
    if not firing:
        print("\nNo alert fired (see the failures above).")
        return
    print("\nAlerts that fired:")
    for alert in firing:
        url = alert["annotations"].get("runbook_url", "")
        local = runbook_file(url) if url else None
        where = local.relative_to(REPO_ROOT) if local else "no matching file in runbooks/"
        print(f"  {alert['name']} ({alert['labels'].get('severity', '?')}) on {alert['instance']}, "
              f"firing {alert['first_firing_s']}s into the run")
        print(f"    {alert['annotations'].get('summary', '')}")
        print(f"    runbook: {url or 'none'}  ->  {where}")


def _print_triage(report_dir: Path) -> None:
    text = report_dir / "triage.txt"
    print("\nllmtriage diagnose (logs + Prometheus):\n")
    if text.exists() and text.read_text().strip():
        print(text.read_text().rstrip())
    else:
        print("  (no triage report; see triage.stderr.txt in the report folder)")


def run_demo(report_root: Path) -> int:
    print(_INTRO, flush=True)
    scenario = get_scenario(DEMO_SCENARIO)
    root = report_root / ("demo-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
    result = run_scenario(scenario, root, echo=True)
    report_dir = Path(result.report_dir)
    _print_alerts(report_dir)
    _print_triage(report_dir)
    print(f"\nEverything was stopped. The logs, alerts and reports are in {report_dir}")
    if result.passed:
        print(f"The demo reproduced the incident in {result.duration_s:.0f}s: the alerts fired and triage "
              f"named {result.first_finding}.")
        return 0
    print("The demo did not go as expected:")
    for failure in result.failures:
        print(f"  - {failure}")
    return 1
