"""Dashboards proven: every panel query of every shipped Grafana dashboard, run against a game day's Prometheus."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from gameday.errors import GamedayError
from gameday.prom import PromClient

# Grafana's built-in variables, given values that suit a 1 s scrape and a minutes-long run.
_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m", "__range_s": "300",
             "__interval_ms": "15000", "__range_ms": "300000"}
_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")


@dataclass(slots=True)
class PanelQuery:
    dashboard: str
    panel: str
    expr: str  # as written in the dashboard

    def key(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.expr}"


def _panels(panels: list[dict]):
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])  # rows hold their collapsed panels


def panel_queries(dashboards_dir: Path) -> list[PanelQuery]:
    """Every Prometheus expression of every panel in dashboards/*.json."""
    queries = []
    for path in sorted(dashboards_dir.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise GamedayError(f"{path}: not a readable dashboard JSON: {exc}") from exc
        doc = doc.get("dashboard", doc)  # provisioning API wrapper or plain export
        for panel in _panels(doc.get("panels") or []):
            for target in panel.get("targets") or []:
                expr = target.get("expr")
                if expr and not target.get("hide"):
                    queries.append(PanelQuery(path.name, str(panel.get("title", "")), expr))
    return queries


def expand(expr: str) -> str:
    """Template variables to values that match everything: $instance -> .+ (used with =~)."""

    def _sub(match: re.Match) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        return _BUILTINS.get(name, ".+")

    return _VAR.sub(_sub, expr)


def probe(client: PromClient, queries: list[PanelQuery], start: float, end: float) -> dict[str, bool]:
    """query key -> whether the panel would draw anything over [start, end] (a range query at 1 s
    steps, as Grafana asks for a time-series panel)."""
    results = {}
    for query in queries:
        try:
            results[query.key()] = bool(client.query_range(expand(query.expr), start, end, step_s=1.0))
        except GamedayError:
            results[query.key()] = False
    return results
