"""Helpers for the alerts, runbooks and dashboards tests: the repo root on sys.path, rule loading."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # alerts/ and dashboards/ are not installed packages


def load_render():
    """alerts/render.py, a script, loaded as a module."""
    spec = importlib.util.spec_from_file_location("llmsre_alerts_render", ROOT / "alerts" / "render.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def rules_in(path: Path) -> list[dict]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]
