"""Fixtures for the alerts, runbooks and dashboards tests."""

from __future__ import annotations

import shutil

import pytest
from alerts_support import load_render


@pytest.fixture(scope="session")
def render():
    return load_render()


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install Debian's prometheus package (make system-deps)")
    return path
