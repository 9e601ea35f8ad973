"""Shared helpers for llmtriage tests: run the CLI in-process and capture its streams."""

import json
from pathlib import Path

import pytest

from triage.cli import main

CORPUS = Path(__file__).parent / "corpus"


@pytest.fixture
def run_cli(capsys):
    def run(*argv: str) -> tuple[int, str, str]:
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err
    return run


@pytest.fixture
def diagnose_json(run_cli):
    def run(*paths, extra=()) -> tuple[int, dict, str]:
        code, out, err = run_cli("diagnose", *paths, "--format", "json", *extra)
        return code, json.loads(out) if out.strip() else {}, err
    return run
