"""Grafana dashboard model and JSON rendering: classic JSON, datasource as a template variable."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

SCHEMA_VERSION = 41  # Grafana 12
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24


@dataclass(slots=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(slots=True)
class Panel:
    title: str
    queries: list[Query]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat | state-timeline
    width: int = 12
    height: int = 8
    description: str = ""
    thresholds: list[tuple[float, str]] = field(default_factory=list)  # (from value, colour)
    max_value: float | None = None
    base_color: str = "green"  # colour below the first threshold


@dataclass(slots=True)
class Variable:
    name: str
    label: str
    query: str  # label_values(...)


@dataclass(slots=True)
class Board:
    uid: str
    title: str
    description: str
    variables: list[Variable]
    rows: list[tuple[str, list[Panel]]]  # (row title, panels)
    tags: list[str] = field(default_factory=lambda: ["llmsre"])


def _target(query: Query, ref: str, instant: bool) -> dict:
    return {"datasource": DATASOURCE, "expr": query.expr, "legendFormat": query.legend or "__auto",
            "refId": ref, "range": not instant, "instant": instant}


def _thresholds(panel: Panel) -> dict:
    steps = [{"color": panel.base_color, "value": None}]
    steps += [{"color": colour, "value": value} for value, colour in panel.thresholds]
    return {"mode": "absolute", "steps": steps}


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict:
    instant = panel.kind == "stat"
    defaults: dict = {"unit": panel.unit, "thresholds": _thresholds(panel)}
    if panel.max_value is not None:
        defaults["max"] = panel.max_value
        defaults["min"] = 0
    if panel.kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                              "spanNulls": False}
        if panel.thresholds:
            defaults["custom"]["thresholdsStyle"] = {"mode": "dashed"}
    options: dict = {"tooltip": {"mode": "multi", "sort": "desc"},
                     "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}}
    if panel.kind == "stat":
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "colorMode": "value", "graphMode": "area", "textMode": "auto", "justifyMode": "auto"}
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": panel.width, "h": panel.height},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [_target(q, chr(ord("A") + i), instant) for i, q in enumerate(panel.queries)],
    }


def _layout(board: Board) -> list[dict]:
    """Rows of panels packed left to right on Grafana's 24-column grid."""
    panels: list[dict] = []
    panel_id, y = 1, 0
    for row_title, row_panels in board.rows:
        panels.append({"id": panel_id, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"x": 0, "y": y, "w": GRID_WIDTH, "h": 1}, "panels": []})
        panel_id, y, x, row_height = panel_id + 1, y + 1, 0, 0
        for panel in row_panels:
            if x + panel.width > GRID_WIDTH:
                x, y, row_height = 0, y + row_height, 0
            panels.append(_panel_json(panel, panel_id, x, y))
            panel_id, x, row_height = panel_id + 1, x + panel.width, max(row_height, panel.height)
        y += row_height
    return panels


def _variable_json(var: Variable) -> dict:
    return {
        "name": var.name, "label": var.label, "type": "query", "datasource": DATASOURCE,
        "query": {"query": var.query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "definition": var.query, "refresh": 2, "multi": True, "includeAll": True, "allValue": ".+",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "sort": 1, "regex": "",
        "hide": 0, "options": [],
    }


def board_json(board: Board) -> dict:
    datasource = {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
                  "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []}
    return {
        "uid": board.uid,
        "title": board.title,
        "description": board.description,
        "tags": board.tags,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": [datasource] + [_variable_json(v) for v in board.variables]},
        "panels": _layout(board),
    }


def render_text(board: Board) -> str:
    return json.dumps(board_json(board), indent=2) + "\n"
