"""The gameday command in-process: list, usage errors, one-line messages and exit codes."""

import os
import subprocess
import sys

import pytest

from gameday.cli import main
from gameday.scenarios import SCENARIOS


def test_list_names_every_scenario_with_its_expectations(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for scenario in SCENARIOS:
        assert f"\n{scenario.name} " in "\n" + out
    assert "alert: LLMKVCacheNearlyFull + LLMPreemptionsHigh; first finding: kv-preemption" in out
    assert "first finding: cache-miss (dynamic-prefix)" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "nope"], "gameday: error: unknown scenario 'nope'; known: healthy, kv-pressure"),
    (["run"], "gameday: error: run needs scenario names or --all"),
    (["run", "--all", "healthy"], "gameday: error: give scenario names or --all/--ci, not both"),
])
def test_usage_errors_are_one_line_and_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert len(err.strip().splitlines()) == 1


def test_unwritable_report_dir_is_one_line(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["run", "healthy", "--report-dir", str(blocker / "reports")]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"gameday: error: Not a directory: {blocker / 'reports'}/")
    assert len(captured.err.splitlines()) == 1
    assert captured.out == ""


def test_list_into_a_closed_pipe_says_nothing():
    """`python -m gameday list | head -1`: the reader leaves early; no 'error: Broken pipe' line."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    proc = subprocess.run([sys.executable, "-m", "gameday", "list"], stdout=write_end, stderr=subprocess.PIPE,
                          text=True, timeout=60)
    os.close(write_end)
    assert (proc.returncode, proc.stderr) == (1, "")
