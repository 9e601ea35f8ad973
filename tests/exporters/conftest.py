"""Fixtures for the GPU exporter tests (helpers live in gpu_rig.py, a module name no other test dir uses)."""

from __future__ import annotations

import pytest
from gpu_rig import Rig


@pytest.fixture
def rig() -> Rig:
    return Rig()
