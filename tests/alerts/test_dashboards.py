"""The Grafana dashboards: generated from dashboards/boards.py, importable and provisionable as committed."""

from __future__ import annotations

import json

import pytest
from alerts_support import ROOT

from dashboards.__main__ import run, stale_boards

BOARDS = sorted((ROOT / "dashboards").glob("*.json"))


def test_committed_json_matches_the_generator():
    assert [p.name for p in BOARDS] == ["llmsre-engine.json", "llmsre-gpu.json", "llmsre-slo.json"]
    assert stale_boards() == {}
    assert run(["--check"]) == 0


def test_check_reports_a_hand_edited_board(tmp_path):
    for path in BOARDS:
        (tmp_path / path.name).write_text(path.read_text())
    edited = tmp_path / "llmsre-gpu.json"
    edited.write_text(edited.read_text().replace("GPU utilization", "GPU usage"))
    assert list(stale_boards(tmp_path)) == [edited]


def _panels(doc: dict):
    for panel in doc["panels"]:
        yield panel
        yield from panel.get("panels", [])


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.name)
def test_board_is_modern_and_portable(path):
    doc = json.loads(path.read_text())
    assert doc["schemaVersion"] >= 39 and "__inputs" not in doc
    assert doc["uid"] == path.stem and len(doc["uid"]) <= 40
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    expected = {"datasource", "instance", "gpu"} if path.stem == "llmsre-gpu" else {"datasource", "instance", "model"}
    assert set(variables) == expected
    ids = [p["id"] for p in _panels(doc)]
    assert len(ids) == len(set(ids))
    for panel in _panels(doc):
        assert panel["type"] in {"row", "timeseries", "stat", "state-timeline"}, panel["type"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            if "instance" in target["expr"] and "up{" not in target["expr"]:
                assert 'instance=~"$instance"' in target["expr"]


def test_boards_cover_what_the_issue_names():
    titles = {p["title"] for path in BOARDS for p in _panels(json.loads(path.read_text()))}
    for title in ("Requests/s", "Time to first token", "Inter-token latency", "Time per output token",
                  "End-to-end latency", "Running and waiting", "KV cache usage", "Prefix cache hit rate",
                  "Preemptions/s", "Tokens/s", "Requests by finish reason", "Errors, aborts and rejections",
                  "GPU utilization", "Temperature", "Error budget left (30 days)", "Page: 1h / 5m (fires above 14.4x)"):
        assert title in titles
